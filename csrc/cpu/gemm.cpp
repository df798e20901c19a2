// CPU launcher for dense_gemm (kernel in include/decodekit/gemm/dense_cpu.h).
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "decodekit/gemm/dense_cpu.h"

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

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) { m.impl("dense_gemm", &dense_gemm_cpu); }
