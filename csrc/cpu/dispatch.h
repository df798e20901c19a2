// Maps a torch dtype to the torch-free storage type used by the CPU kernels in include/.
#pragma once
#include <ATen/core/Tensor.h>
#include "decodekit/common/dtype.h"

#define DK_CPU_DISPATCH_FLOATING(STYPE, OP, ...)                                  \
  [&] {                                                                           \
    switch (STYPE) {                                                              \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }          \
      case at::kHalf: { using scalar_t = dk::half_t; return __VA_ARGS__(); }      \
      case at::kBFloat16: { using scalar_t = dk::bf16_t; return __VA_ARGS__(); }  \
      default: TORCH_CHECK(false, OP, ": unsupported dtype ", STYPE);             \
    }                                                                             \
  }()

template <class T>
inline T* dk_ptr(const at::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }
