// Torch launchers for int4_gemm, int8_gemm and int4_dequantize (CUDA dispatch key); the kernels are
// instantiated in gemm.cu (include/decodekit/gemm/int4.cuh). Host code, g++, CUDA build only.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "launchers.h"

namespace {

void int4_gemm_cuda(at::Tensor& out,                        // [M, N]
                    const at::Tensor& a,                    // [M, K]
                    const at::Tensor& qweight,              // [N, K / 2] uint8
                    const at::Tensor& scales,               // [N, K / G] float16
                    const at::Tensor& mins,                 // [N, K / G] float16
                    int64_t group_size,
                    const std::optional<at::Tensor>& bias) {  // [N]
  const char* op = "decodekit::int4_gemm";
  const dk::GemmArgs g = dk::quant_gemm_args(op, out, a, qweight, scales, &mins, group_size, bias);
  dk::check_cuda(op, "a", a);
  // M <= 8: the GEMV kernels (any dtype); more rows: the tensor-core GEMM (fp16 / bf16)
  if (a.scalar_type() == at::kFloat)
    dk::check_range<int64_t>(op, "a.size(0) (M) on CUDA with float32 activations (larger M: fp16/bf16)", g.M, 0,
                             dk::cuda::kQuantGemvMaxM);
  if (g.M == 0 || g.N == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  if (g.M > dk::cuda::kQuantGemvMaxM) {
    DK_CUDA_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
      dk::check_launch(op, dk::cuda::int4_gemm_mma<scalar_t>(
                               dk::cuda_ptr<scalar_t>(out), dk::cuda_ptr<scalar_t>(a), g.a_stride,
                               qweight.data_ptr<uint8_t>(), dk::cuda_ptr<__half>(scales), dk::cuda_ptr<__half>(mins),
                               bias.has_value() ? dk::cuda_ptr<scalar_t>(*bias) : nullptr, g.M, g.N, g.K,
                               int(group_size), c10::cuda::getCurrentCUDAStream()));
    });
    return;
  }
  DK_CUDA_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::quant_gemv<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), dk::cuda_ptr<scalar_t>(a), g.a_stride,
                             qweight.data_ptr<uint8_t>(), dk::cuda_ptr<__half>(scales), dk::cuda_ptr<__half>(mins),
                             bias.has_value() ? dk::cuda_ptr<scalar_t>(*bias) : nullptr, int(g.M), g.N, g.K,
                             int(group_size), true, c10::cuda::getCurrentCUDAStream()));
  });
}

void int8_gemm_cuda(at::Tensor& out,                        // [M, N]
                    const at::Tensor& a,                    // [M, K]
                    const at::Tensor& qweight,              // [N, K] int8
                    const at::Tensor& scales,               // [N, K / G] float16
                    int64_t group_size,
                    const std::optional<at::Tensor>& bias) {  // [N]
  const char* op = "decodekit::int8_gemm";
  const dk::GemmArgs g = dk::quant_gemm_args(op, out, a, qweight, scales, nullptr, group_size, bias);
  dk::check_cuda(op, "a", a);
  dk::check_range<int64_t>(op, "a.size(0) (M) on CUDA", g.M, 0, dk::cuda::kQuantGemvMaxM);
  if (g.M == 0 || g.N == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  DK_CUDA_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::quant_gemv<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), dk::cuda_ptr<scalar_t>(a), g.a_stride,
                             reinterpret_cast<const uint8_t*>(qweight.data_ptr<int8_t>()),
                             dk::cuda_ptr<__half>(scales), nullptr,
                             bias.has_value() ? dk::cuda_ptr<scalar_t>(*bias) : nullptr, int(g.M), g.N, g.K,
                             int(group_size), false, c10::cuda::getCurrentCUDAStream()));
  });
}

void int4_dequantize_cuda(at::Tensor& out,            // [N, K]
                          const at::Tensor& qweight,  // [N, K / 2] uint8
                          const at::Tensor& scales,   // [N, K / G] float16
                          const at::Tensor& mins,     // [N, K / G] float16
                          int64_t group_size) {
  const char* op = "decodekit::int4_dequantize";
  const dk::GemmArgs g = dk::quant_dequantize_args(op, out, qweight, scales, &mins, group_size, nullptr);
  dk::check_cuda(op, "qweight", qweight);
  c10::cuda::OptionalCUDAGuard guard(out.device());
  DK_CUDA_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::int4_dequantize<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), qweight.data_ptr<uint8_t>(), dk::cuda_ptr<__half>(scales),
                             dk::cuda_ptr<__half>(mins), g.N, g.K, int(group_size),
                             c10::cuda::getCurrentCUDAStream()));
  });
}

void int8_dequantize_rows_cuda(at::Tensor& out,            // [R, K]
                               const at::Tensor& qweight,  // [N, K] int8
                               const at::Tensor& scales,   // [N, K / G] float16
                               int64_t group_size,
                               const at::Tensor& ids) {    // [R] int64 (outside [0, N): NaN rows, no host check)
  const char* op = "decodekit::int8_dequantize_rows";
  const dk::GemmArgs g = dk::quant_dequantize_args(op, out, qweight, scales, nullptr, group_size, &ids);
  dk::check_cuda(op, "qweight", qweight);
  c10::cuda::OptionalCUDAGuard guard(out.device());
  DK_CUDA_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::int8_dequantize_rows<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), qweight.data_ptr<int8_t>(), dk::cuda_ptr<__half>(scales),
                             ids.data_ptr<int64_t>(), ids.size(0), g.N, g.K, int(group_size),
                             c10::cuda::getCurrentCUDAStream()));
  });
}

void quantize_fp8_cuda(at::Tensor& out,            // [M, K] Float8_e4m3fn
                       at::Tensor& scale,          // [M] float32
                       const at::Tensor& input) {  // [M, K]
  const char* op = "decodekit::quantize_fp8";
  const dk::Fp8Args f = dk::quantize_fp8_args(out, scale, input);
  dk::check_cuda(op, "input", input);
  if (f.M == 0) return;
  c10::cuda::OptionalCUDAGuard guard(input.device());
  DK_CUDA_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::quantize_fp8<scalar_t>(reinterpret_cast<uint8_t*>(out.data_ptr()),
                                                          scale.data_ptr<float>(), dk::cuda_ptr<scalar_t>(input), f.M,
                                                          f.K, f.x_stride, c10::cuda::getCurrentCUDAStream()));
  });
}

void fp8_gemm_cuda(at::Tensor& out,                        // [M, N]
                   const at::Tensor& a,                    // [M, K] Float8_e4m3fn
                   const at::Tensor& a_scale,              // [M] float32
                   const at::Tensor& weight,               // [N, K] Float8_e4m3fn
                   const at::Tensor& w_scale,              // [N] float32
                   const std::optional<at::Tensor>& bias) {  // [N]
  const char* op = "decodekit::fp8_gemm";
  const dk::Fp8Args f = dk::fp8_gemm_args(out, a, a_scale, weight, w_scale, bias);
  dk::check_cuda(op, "a", a);
  if (f.M == 0 || f.N == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  DK_CUDA_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::fp8_gemm<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), reinterpret_cast<const uint8_t*>(a.data_ptr()),
                             a_scale.data_ptr<float>(), reinterpret_cast<const uint8_t*>(weight.data_ptr()),
                             w_scale.data_ptr<float>(), bias.has_value() ? dk::cuda_ptr<scalar_t>(*bias) : nullptr,
                             f.M, f.N, f.K, c10::cuda::getCurrentCUDAStream()));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CUDA, m) {
  m.impl("int8_dequantize_rows", &int8_dequantize_rows_cuda);
  m.impl("int4_gemm", &int4_gemm_cuda);
  m.impl("int8_gemm", &int8_gemm_cuda);
  m.impl("int4_dequantize", &int4_dequantize_cuda);
  m.impl("quantize_fp8", &quantize_fp8_cuda);
  m.impl("fp8_gemm", &fp8_gemm_cuda);
}
