// Maps a torch dtype to the CUDA storage type used by the kernels in include/decodekit/*.cuh,
// plus the small checks every CUDA launcher shares (device type, launch status).
// Host-only (no __global__ code): included by the g++-compiled csrc/cuda/*_launch.cpp.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#define DK_CUDA_DISPATCH_FLOATING(STYPE, OP, ...)                                   \
  [&] {                                                                             \
    switch (STYPE) {                                                                \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }            \
      case at::kHalf: { using scalar_t = __half; return __VA_ARGS__(); }            \
      case at::kBFloat16: { using scalar_t = __nv_bfloat16; return __VA_ARGS__(); } \
      default: TORCH_CHECK(false, OP, ": unsupported dtype ", STYPE);               \
    }                                                                               \
  }()

namespace dk {

template <class T>
inline T* cuda_ptr(const at::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }

inline void check_cuda(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), op, ": '", name, "' must be a CUDA tensor, got one on ", t.device());
}

inline void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err));
}

}  // namespace dk
