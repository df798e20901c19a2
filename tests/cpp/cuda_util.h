// Helpers for the CUDA kernel tests (tests/cpp/test_*_cuda.cu): skip without a usable
// GPU, device buffers, storage-type mapping, and a GPU-vs-CPU buffer comparison.
//
// The CUDA tests run each launcher and the (separately verified) CPU kernel on identical
// buffers, poisoned with NaN outside the inputs, then compare the whole buffers:
//  - elements the CPU kernel leaves alone (padding, guards, unrotated parts) must be
//    bitwise unchanged on the GPU too;
//  - written elements must agree within 2x the single-kernel error bound of the CPU test
//    (both kernels are within that bound of the exact result), and NaN never matches.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdlib>

#include "check.h"

#define CUDA_OK(expr)                                                                                   \
  do {                                                                                                  \
    const cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

namespace dk_test {

// Exit code 77 (ctest SKIP_RETURN_CODE) unless a GPU that runs sm_90a code is present.
inline void require_gpu_or_skip(const char* name) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("%s: SKIP: no CUDA device (%s)\n", name, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    std::exit(77);
  }
  cudaDeviceProp p;
  CUDA_OK(cudaGetDeviceProperties(&p, 0));
  if (p.major != 9 || p.minor != 0) {
    std::printf("%s: SKIP: built for sm_90a, device %s is sm_%d%d\n", name, p.name, p.major, p.minor);
    std::exit(77);
  }
  std::printf("%s: device %s\n", name, p.name);
}

template <class T> struct DevType { using type = T; };
template <> struct DevType<dk::half_t> { using type = __half; };
template <> struct DevType<dk::bf16_t> { using type = __nv_bfloat16; };
template <class T> using cuda_t = typename DevType<T>::type;

// A device copy of a host vector; `offset` elements into the allocation (to test
// misaligned pointers), freed on destruction.
template <class T>
struct DeviceBuffer {
  char* base = nullptr;
  size_t n = 0, offset = 0;
  DeviceBuffer(const std::vector<T>& h, size_t offset_elems = 0) : n(h.size()), offset(offset_elems) {
    CUDA_OK(cudaMalloc(&base, (n + offset) * sizeof(T) + 16));
    CUDA_OK(cudaMemcpy(ptr(), h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(base); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* ptr() const { return reinterpret_cast<T*>(base) + offset; }
  cuda_t<T>* dev() const { return reinterpret_cast<cuda_t<T>*>(ptr()); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CUDA_OK(cudaMemcpy(h.data(), ptr(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

struct CompareStats {
  long long exact = 0, near = 0;
};

// gpu vs cpu, element by element. tol(j, cpu_value) gives the allowed |difference| for
// element j; tol < 0 demands bitwise equality.
template <class T, class Tol>
CompareStats compare_buffers(const std::vector<T>& gpu, const std::vector<T>& cpu, Tol tol, const std::string& what) {
  CompareStats s;
  long long bad = 0;
  size_t first_bad = 0;
  for (size_t j = 0; j < cpu.size(); ++j) {
    if (same_bits(gpu[j], cpu[j])) { ++s.exact; continue; }
    const double g = to_d(gpu[j]), c = to_d(cpu[j]), t = tol(j, c);
    if (t >= 0 && std::fabs(g - c) <= t) { ++s.near; continue; }  // NaN fails here
    if (bad++ == 0) first_bad = j;
  }
  n_checks() += int64_t(cpu.size()) - 1;
  if (bad) {
    CHECK(bad == 0) << what << ":" << bad << "of" << cpu.size() << "elements differ; first at" << first_bad << "gpu"
                    << to_d(gpu[first_bad]) << "cpu" << to_d(cpu[first_bad]);
  } else {
    CHECK(true);
  }
  return s;
}

}  // namespace dk_test
