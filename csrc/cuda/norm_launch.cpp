// Torch launchers for rms_norm and fused_add_rms_norm (CUDA dispatch key). Host code, compiled by g++ in the
// CUDA build only; the kernels and their dk::cuda launchers are instantiated in norm.cu
// (include/decodekit/norm.cuh), which nvcc compiles without any torch header.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "launchers.h"

namespace {

void rms_norm_cuda(at::Tensor& out,           // [..., hidden]
                   const at::Tensor& input,   // [..., hidden]
                   const at::Tensor& weight,  // [hidden]
                   double epsilon) {
  const char* op = "decodekit::rms_norm";
  const dk::NormArgs a = dk::rms_norm_args(out, input, weight, epsilon);
  dk::check_cuda(op, "input", input);
  dk::check_cuda(op, "out", out);
  dk::check_cuda(op, "weight", weight);
  if (a.rows == 0) return;
  c10::cuda::OptionalCUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  DK_CUDA_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::rms_norm<scalar_t>(dk::cuda_ptr<scalar_t>(out), dk::cuda_ptr<scalar_t>(input),
                                                      a.x_stride, dk::cuda_ptr<scalar_t>(weight), a.rows,
                                                      int(a.hidden), float(epsilon), stream));
  });
}

void fused_add_rms_norm_cuda(at::Tensor& input,         // [..., hidden]
                             at::Tensor& residual,      // [..., hidden]
                             const at::Tensor& weight,  // [hidden]
                             double epsilon) {
  const char* op = "decodekit::fused_add_rms_norm";
  const dk::NormArgs a = dk::fused_add_rms_norm_args(input, residual, weight, epsilon);
  dk::check_cuda(op, "input", input);
  dk::check_cuda(op, "residual", residual);
  dk::check_cuda(op, "weight", weight);
  if (a.rows == 0) return;
  c10::cuda::OptionalCUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  DK_CUDA_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::fused_add_rms_norm<scalar_t>(
                             dk::cuda_ptr<scalar_t>(input), a.x_stride, dk::cuda_ptr<scalar_t>(residual), a.r_stride,
                             dk::cuda_ptr<scalar_t>(weight), a.rows, int(a.hidden), float(epsilon), stream));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm_cuda);
}
