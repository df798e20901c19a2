// CPU launcher for silu_and_mul (kernel in include/decodekit/activation.h).
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "decodekit/activation.h"

namespace {

void silu_and_mul_cpu(at::Tensor& out,           // [..., d]
                      const at::Tensor& input) { // [..., 2 * d]
  const dk::ActArgs a = dk::silu_and_mul_args(out, input);
  DK_CPU_DISPATCH_FLOATING(input.scalar_type(), "decodekit::silu_and_mul", [&] {
    dk::cpu::silu_and_mul<scalar_t>(dk_ptr<scalar_t>(out), dk_ptr<scalar_t>(input), a.in_stride, a.rows, a.d);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) { m.impl("silu_and_mul", &silu_and_mul_cpu); }
