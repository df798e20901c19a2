// Torch launcher for silu_and_mul (CUDA dispatch key). Host code, compiled by g++ in the
// CUDA build only; the kernels and their dk::cuda launchers are instantiated in activation.cu
// (include/decodekit/activation.cuh), which nvcc compiles without any torch header.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "launchers.h"

namespace {

void silu_and_mul_cuda(at::Tensor& out,           // [..., d]
                       const at::Tensor& input) { // [..., 2 * d]
  const char* op = "decodekit::silu_and_mul";
  const dk::ActArgs a = dk::silu_and_mul_args(out, input);
  dk::check_cuda(op, "input", input);
  dk::check_cuda(op, "out", out);
  if (a.rows == 0 || a.d == 0) return;
  c10::cuda::OptionalCUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  DK_CUDA_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::silu_and_mul<scalar_t>(dk::cuda_ptr<scalar_t>(out), dk::cuda_ptr<scalar_t>(input),
                                                          a.in_stride, a.rows, a.d, stream));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CUDA, m) { m.impl("silu_and_mul", &silu_and_mul_cuda); }
