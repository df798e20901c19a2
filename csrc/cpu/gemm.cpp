// CPU launcher for dense_gemm (kernel in include/decodekit/gemm/dense_cpu.h).
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <torch/library.h>

#include "../op_args_marlin.h"
#include "dispatch.h"
#include "decodekit/gemm/dense_cpu.h"
#include "decodekit/gemm/fp8_gemm.h"
#include "decodekit/gemm/int4.h"
#include "decodekit/gemm/int4_marlin_pack.h"

// decode_rows' blocks stay on the row-invariant kernels of every route (include/decodekit/gemm/dense_cpu.h)
namespace dkc = dk::cpu;
static_assert(dkc::kDecodeRowBlock < dkc::kTiledQuantGemmMinM && dkc::kDecodeRowBlock < dkc::kFp8TiledMinM &&
              dkc::kDecodeRowBlock <= dkc::kBf16DotDenseMaxM && dkc::kDecodeRowBlock <= dkc::kDenseRouteMaxM &&
              dkc::kPrefillRowsMin >= dkc::kTiledQuantGemmMinM && dkc::kPrefillRowsMin >= dkc::kFp8TiledMinM &&
              dkc::kPrefillRowsMin > dkc::kAmxRowsDispatchM && dkc::kPrefillRowsMin >= dkc::kTiledVectorMinM);

namespace {

void dense_gemm_cpu(at::Tensor& out,                       // [M, N]
                    const at::Tensor& a,                   // [M, K]
                    const at::Tensor& weight,              // [N, K]
                    const std::optional<at::Tensor>& bias) {  // [N]
  const dk::GemmArgs g = dk::dense_gemm_args(out, a, weight, bias, dk::cpu::kDenseGemvMaxM);
  if (g.M == 0 || g.N == 0) return;
  DK_CPU_DISPATCH_FLOATING(a.scalar_type(), "decodekit::dense_gemm", [&] {
    dk::cpu::dense_gemm<scalar_t>(dk_ptr<scalar_t>(out), dk_ptr<scalar_t>(a), g.a_stride, dk_ptr<scalar_t>(weight),
                                  bias.has_value() ? dk_ptr<scalar_t>(*bias) : nullptr, g.M, g.N, g.K);
  });
}

std::vector<int64_t> dense_route(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, "decodekit::dense_route: "
              "'dtype' must be float32, bfloat16 or float16, got ", dtype);
  const dk::cpu::DenseRoute r = dk::cpu::dense_route(dk::dense_dtype(dtype));
  return {r.dense_min_m, r.dense_max_m, r.upcast_min_m};
}

void int4_gemm_cpu(at::Tensor& out,                        // [M, N]
                   const at::Tensor& a,                    // [M, K]
                   const at::Tensor& qweight,              // [N, K / 2] uint8
                   const at::Tensor& scales,               // [N, K / G] float16
                   const at::Tensor& mins,                 // [N, K / G] float16
                   int64_t group_size,
                   const std::optional<at::Tensor>& bias,     // [N]
                   const std::optional<at::Tensor>& packed,  // int4_amx_rows_pack's copy (the CUDA one: unused)
                   int64_t decode_rows) {                    // batch invariance: Int4GemmParams::decode_rows
  const char* op = "decodekit::int4_gemm";
  const bool copy_only = dk::quant_copy_only(op, qweight, a.dim() == 2 ? a.size(1) : 0, packed);
  const dk::GemmArgs g = dk::quant_gemm_args(op, out, a, qweight, scales, &mins, group_size, bias, copy_only);
  const bool amx_rows = packed.has_value() && dk::int4_gemm_packed_check(op, *packed, a, g, group_size);
  dk::check_range<int64_t>(op, "decode_rows", decode_rows, -1, g.M);
  if (g.M == 0 || g.N == 0) return;
  const dk::cpu::Int4GemmParams P{g.M, g.N, g.K, int(group_size), g.a_stride,
                                  amx_rows ? packed->data_ptr<uint8_t>() : nullptr, decode_rows};
  DK_CPU_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    dk::cpu::int4_gemm<scalar_t>(dk_ptr<scalar_t>(out), dk_ptr<scalar_t>(a),
                                 copy_only ? nullptr : qweight.data_ptr<uint8_t>(),
                                 copy_only ? nullptr : dk_ptr<dk::half_t>(scales),
                                 copy_only ? nullptr : dk_ptr<dk::half_t>(mins),
                                 bias.has_value() ? dk_ptr<scalar_t>(*bias) : nullptr, P);
  });
}

void int4_dequantize_cpu(at::Tensor& out,            // [N, K]
                         const at::Tensor& qweight,  // [N, K / 2] uint8
                         const at::Tensor& scales,   // [N, K / G] float16
                         const at::Tensor& mins,     // [N, K / G] float16
                         int64_t group_size) {
  const char* op = "decodekit::int4_dequantize";
  const dk::GemmArgs g = dk::quant_dequantize_args(op, out, qweight, scales, &mins, group_size, nullptr);
  DK_CPU_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    dk::cpu::int4_dequantize<scalar_t>(dk_ptr<scalar_t>(out), qweight.data_ptr<uint8_t>(), dk_ptr<dk::half_t>(scales),
                                       dk_ptr<dk::half_t>(mins), g.N, g.K, int(group_size));
  });
}

// The INT8 one (the LM head's).
void int8_amx_rows_pack_cpu(at::Tensor& out,            // [amx_rows_int8_packed_bytes(N, K, G)] uint8
                            const at::Tensor& qweight,  // [N, K] int8
                            const at::Tensor& scales,   // [N, K / G] float16
                            int64_t group_size) {
  const dk::GemmArgs g = dk::int8_amx_rows_pack_args(out, qweight, scales, group_size);
  dk::cpu::amx_rows_pack_int8(out.data_ptr<uint8_t>(), qweight.data_ptr<int8_t>(), dk_ptr<dk::half_t>(scales), g.N,
                              g.K, int(group_size));
}

// The repacked copy the CPU's few-row AMX INT4 kernels read (include/decodekit/gemm/amx_rows_layout.h).
void int4_amx_rows_pack_cpu(at::Tensor& out,            // [amx_rows_packed_bytes(N, K, G)] uint8
                            const at::Tensor& qweight,  // [N, K / 2] uint8
                            const at::Tensor& scales,   // [N, K / G] float16
                            const at::Tensor& mins,     // [N, K / G] float16
                            int64_t group_size) {
  const dk::GemmArgs g = dk::int4_amx_rows_pack_args(out, qweight, scales, mins, group_size);
  dk::cpu::amx_rows_pack_int4(out.data_ptr<uint8_t>(), qweight.data_ptr<uint8_t>(), dk_ptr<dk::half_t>(scales),
                              dk_ptr<dk::half_t>(mins), g.N, g.K, int(group_size));
}

// The packed layout of the CUDA Marlin-style kernel (include/decodekit/gemm/int4_marlin_pack.h), word by word.
void int4_marlin_pack_cpu(at::Tensor& out,            // [int4_marlin_packed_bytes / 2] float16 / bfloat16
                          const at::Tensor& qweight,  // [N, K / 2] uint8
                          const at::Tensor& scales,   // [N, K / G] float16
                          const at::Tensor& mins,     // [N, K / G] float16
                          int64_t group_size) {
  const dk::GemmArgs g = dk::int4_marlin_pack_args(out, qweight, scales, mins, group_size);
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  const int64_t words = out.numel() / 2;
  uint32_t* o = static_cast<uint32_t*>(out.data_ptr());
  const uint8_t* q = qweight.data_ptr<uint8_t>();
  const uint16_t* s = static_cast<const uint16_t*>(scales.data_ptr());
  const uint16_t* m = static_cast<const uint16_t*>(mins.data_ptr());
  DK_OMP_PARALLEL_FOR_IF(words > (1 << 16))
  for (int64_t w = 0; w < words; ++w) o[w] = dk::int4_marlin_packed_word(q, s, m, g.N, g.K, int(group_size), bf16, w);
}

// Rows [row0, row0 + R) of a weight held in the Marlin layout as T's bits [R, K], each rounded as the CUDA kernel
// rounds it (int4_marlin_weights8: the CUDA op's bits).
void marlin_decode_rows(uint16_t* o, const at::Tensor& packed, int64_t K, int G, int64_t row0, int64_t R) {
  const bool bf16 = packed.scalar_type() == at::kBFloat16;
  const uint8_t* p = static_cast<const uint8_t*>(packed.data_ptr());
  DK_OMP_PARALLEL_FOR_IF(R * K > (1 << 16))
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < K; c += 8) dk::int4_marlin_weights8(p, K, G, bf16, row0 + r, c, o + r * K + c);
}

// int4_gemm_marlin on the CPU (tests: the layout and the kernel's weight values): the weights decoded as the CUDA
// kernel rounds them, then an fp32 GEMM.
void int4_gemm_marlin_cpu(at::Tensor& out,                        // [M, N]
                          const at::Tensor& a,                    // [M, K]
                          const at::Tensor& packed,               // [int4_marlin_packed_bytes / 2]
                          int64_t n, int64_t k, int64_t group_size,
                          const std::optional<at::Tensor>& bias) {  // [N]
  const dk::GemmArgs g = dk::int4_gemm_marlin_args(out, a, packed, n, k, group_size, bias);
  if (g.M == 0) return;
  at::Tensor w = at::empty({g.N, g.K}, packed.options());
  marlin_decode_rows(static_cast<uint16_t*>(w.data_ptr()), packed, g.K, int(group_size), 0, g.N);
  at::Tensor res = at::matmul(a.to(at::kFloat), w.to(at::kFloat).t());
  if (bias.has_value()) res.add_(bias->to(at::kFloat));
  out.copy_(res);
}

void int4_marlin_dequantize_cpu(at::Tensor& out,           // [R, K] float16 / bfloat16 (packed's dtype)
                                const at::Tensor& packed,  // [int4_marlin_packed_bytes / 2]
                                int64_t n, int64_t k, int64_t group_size, int64_t row0) {
  const dk::GemmArgs g = dk::int4_marlin_dequantize_args(out, packed, n, k, group_size, row0);
  marlin_decode_rows(static_cast<uint16_t*>(out.data_ptr()), packed, g.K, int(group_size), row0, g.M);
}

void int8_gemm_cpu(at::Tensor& out,                        // [M, N]
                   const at::Tensor& a,                    // [M, K]
                   const at::Tensor& qweight,              // [N, K] int8
                   const at::Tensor& scales,               // [N, K / G] float16
                   int64_t group_size,
                   const std::optional<at::Tensor>& bias,     // [N]
                   const std::optional<at::Tensor>& packed,  // int8_amx_rows_pack's copy
                   int64_t decode_rows) {                    // as int4_gemm's
  const char* op = "decodekit::int8_gemm";
  const bool copy_only = dk::quant_copy_only(op, qweight, a.dim() == 2 ? a.size(1) : 0, packed);
  const dk::GemmArgs g = dk::quant_gemm_args(op, out, a, qweight, scales, nullptr, group_size, bias, copy_only);
  if (packed.has_value()) dk::int8_gemm_packed_check(op, *packed, a, g, group_size);
  dk::check_range<int64_t>(op, "decode_rows", decode_rows, -1, g.M);
  if (g.M == 0 || g.N == 0) return;
  const dk::cpu::Int4GemmParams P{g.M, g.N, g.K, int(group_size), g.a_stride,
                                  packed.has_value() ? packed->data_ptr<uint8_t>() : nullptr, decode_rows};
  DK_CPU_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    dk::cpu::int8_gemm<scalar_t>(dk_ptr<scalar_t>(out), dk_ptr<scalar_t>(a),
                                 copy_only ? nullptr : qweight.data_ptr<int8_t>(),
                                 copy_only ? nullptr : dk_ptr<dk::half_t>(scales),
                                 bias.has_value() ? dk_ptr<scalar_t>(*bias) : nullptr, P);
  });
}

void int8_dequantize_rows_cpu(at::Tensor& out,            // [R, K]
                              const at::Tensor& qweight,  // [N, K] int8
                              const at::Tensor& scales,   // [N, K / G] float16
                              int64_t group_size,
                              const at::Tensor& ids,      // [R] int64
                              const std::optional<at::Tensor>& packed) {  // int8_amx_rows_pack's copy
  const char* op = "decodekit::int8_dequantize_rows";
  const bool copy_only = dk::quant_copy_only(op, qweight, out.dim() == 2 ? out.size(1) : 0, packed);
  const dk::GemmArgs g = dk::quant_dequantize_args(op, out, qweight, scales, nullptr, group_size, &ids, copy_only);
  if (packed.has_value())
    dk::amx_rows_packed_check(op, *packed, out, dk::cpu::amx_rows_int8_packed_bytes(g.N, g.K, int(group_size)),
                              "amx_rows_int8_packed_bytes(N, K, group_size) (int8_amx_rows_pack)");
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < ids.size(0); ++r)
    TORCH_CHECK(id[r] >= 0 && id[r] < g.N, op, ": 'ids'[", r, "] = ", id[r], " is outside [0, ", g.N, ")");
  DK_CPU_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    dk::cpu::int8_dequantize_rows<scalar_t>(dk_ptr<scalar_t>(out), copy_only ? nullptr : qweight.data_ptr<int8_t>(),
                                            copy_only ? nullptr : dk_ptr<dk::half_t>(scales), id, ids.size(0), g.K,
                                            int(group_size), copy_only ? packed->data_ptr<uint8_t>() : nullptr, g.N);
  });
}

void quantize_fp8_cpu(at::Tensor& out,            // [M, K] Float8_e4m3fn
                      at::Tensor& scale,          // [M] float32
                      const at::Tensor& input) {  // [M, K]
  const dk::Fp8Args f = dk::quantize_fp8_args(out, scale, input);
  if (f.M == 0) return;
  DK_CPU_DISPATCH_FLOATING(input.scalar_type(), "decodekit::quantize_fp8", [&] {
    dk::cpu::quantize_fp8<scalar_t>(dk_ptr<uint8_t>(out), scale.data_ptr<float>(), dk_ptr<scalar_t>(input), f.M, f.K,
                                    f.x_stride);
  });
}

void fp8_gemm_cpu(at::Tensor& out,                        // [M, N]
                  const at::Tensor& a,                    // [M, K] Float8_e4m3fn
                  const at::Tensor& a_scale,              // [M] float32
                  const at::Tensor& weight,               // [N, K] Float8_e4m3fn
                  const at::Tensor& w_scale,              // [N] float32
                  const std::optional<at::Tensor>& bias) {  // [N]
  const dk::Fp8Args f = dk::fp8_gemm_args(out, a, a_scale, weight, w_scale, bias);
  if (f.M == 0 || f.N == 0) return;
  DK_CPU_DISPATCH_FLOATING(out.scalar_type(), "decodekit::fp8_gemm", [&] {
    dk::cpu::fp8_gemm<scalar_t>(dk_ptr<scalar_t>(out), dk_ptr<uint8_t>(a), a_scale.data_ptr<float>(),
                                dk_ptr<uint8_t>(weight), w_scale.data_ptr<float>(),
                                bias.has_value() ? dk_ptr<scalar_t>(*bias) : nullptr, f.M, f.N, f.K);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) {
  m.impl("int8_gemm", &int8_gemm_cpu);
  m.impl("int8_dequantize_rows", &int8_dequantize_rows_cpu);
  m.impl("dense_gemm", &dense_gemm_cpu);
  m.impl("int4_gemm", &int4_gemm_cpu);
  m.impl("int4_dequantize", &int4_dequantize_cpu);
  m.impl("int4_marlin_pack", &int4_marlin_pack_cpu);
  m.impl("int4_amx_rows_pack", &int4_amx_rows_pack_cpu);
  m.impl("int8_amx_rows_pack", &int8_amx_rows_pack_cpu);
  m.impl("int4_gemm_marlin", &int4_gemm_marlin_cpu);
  m.impl("int4_marlin_dequantize", &int4_marlin_dequantize_cpu);
  m.impl("quantize_fp8", &quantize_fp8_cpu);
  m.impl("fp8_gemm", &fp8_gemm_cpu);
}

bool int4_amx_rows_available() {
#if defined(DK_AMX_EXACT_GEMM)
  return dk::cpu::amx_enabled();
#else
  return false;
#endif
}

// No tensor arguments.
TORCH_LIBRARY_IMPL(decodekit, CompositeExplicitAutograd, m) {
  m.impl("dense_route", &dense_route);
  m.impl("int4_amx_rows_available", &int4_amx_rows_available);
}
