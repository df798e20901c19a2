// CPU launchers for rms_norm and fused_add_rms_norm (kernels in include/decodekit/norm.h).
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "decodekit/norm.h"

namespace {

void rms_norm_cpu(at::Tensor& out,           // [..., hidden]
                  const at::Tensor& input,   // [..., hidden]
                  const at::Tensor& weight,  // [hidden]
                  double epsilon) {
  const dk::NormArgs a = dk::rms_norm_args(out, input, weight, epsilon);
  DK_CPU_DISPATCH_FLOATING(input.scalar_type(), "decodekit::rms_norm", [&] {
    dk::cpu::rms_norm<scalar_t>(dk_ptr<scalar_t>(out), dk_ptr<scalar_t>(input), a.x_stride, dk_ptr<scalar_t>(weight),
                                a.rows, int(a.hidden), float(epsilon));
  });
}

void fused_add_rms_norm_cpu(at::Tensor& input,         // [..., hidden]
                            at::Tensor& residual,      // [..., hidden]
                            const at::Tensor& weight,  // [hidden]
                            double epsilon) {
  const dk::NormArgs a = dk::fused_add_rms_norm_args(input, residual, weight, epsilon);
  DK_CPU_DISPATCH_FLOATING(input.scalar_type(), "decodekit::fused_add_rms_norm", [&] {
    dk::cpu::fused_add_rms_norm<scalar_t>(dk_ptr<scalar_t>(input), a.x_stride, dk_ptr<scalar_t>(residual), a.r_stride,
                                          dk_ptr<scalar_t>(weight), a.rows, int(a.hidden), float(epsilon));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm_cpu);
}
