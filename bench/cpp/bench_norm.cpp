// rms_norm and fused_add_rms_norm microbenchmarks. Built twice: as C++ (bench_norm, CPU
// kernels from include/decodekit/norm.h) and, through bench_norm.cu, by nvcc
// (bench_norm_cuda, CUDA launchers from norm.cuh). Method: see bench_common.h.
#include "bench_common.h"
#include "decodekit/norm.h"
#if defined(__CUDACC__)
#include "decodekit/norm.cuh"
#endif

namespace {

constexpr float kEps = 1e-6f;

template <class T>
void add_cases(std::vector<dkb::Case>& cases, bool quick) {
  for (int64_t tokens : dkb::bench_tokens(quick))
    for (int hidden : dkb::bench_hidden()) {
      const std::string shape = "tokens=" + std::to_string(tokens) + " hidden=" + std::to_string(hidden);
      const double row_bytes = double(tokens) * hidden * sizeof(T), w_bytes = double(hidden) * sizeof(T);
      {  // out = rms_norm(in) * w: read in + w, write out
        auto carve = [=](char* s, T*& in, T*& w, T*& out) {
          dkb::Carver c{s};
          in = c.take<T>(tokens * hidden);
          w = c.take<T>(hidden);
          out = c.take<T>(tokens * hidden);
          return c.used;
        };
        dkb::Case c;
        c.big = tokens >= 4096 && !std::is_same<T, dk::bf16_t>::value;
        c.bench = "rms_norm";
        c.shape = shape;
        c.dtype = dkb::DtypeName<T>::value;
        c.bytes = 2 * row_bytes + w_bytes;
        T *in, *w, *out;
        c.slot_bytes = carve(nullptr, in, w, out);
        c.cpu = [=](char* s) {
          T *in, *w, *out;
          carve(s, in, w, out);
          dk::cpu::rms_norm<T>(out, in, hidden, w, tokens, hidden, kEps);
        };
#if defined(__CUDACC__)
        c.gpu = [=](char* s, cudaStream_t st) {
          using D = dkb::cuda_t<T>;
          T *in, *w, *out;
          carve(s, in, w, out);
          return dk::cuda::rms_norm<D>(reinterpret_cast<D*>(out), reinterpret_cast<const D*>(in), hidden,
                                       reinterpret_cast<const D*>(w), tokens, hidden, kEps, st);
        };
#endif
        cases.push_back(std::move(c));
      }
      {  // residual += x; x = rms_norm(residual) * w: read x, residual, w; write x, residual
        auto carve = [=](char* s, T*& x, T*& res, T*& w) {
          dkb::Carver c{s};
          x = c.take<T>(tokens * hidden);
          res = c.take<T>(tokens * hidden);
          w = c.take<T>(hidden);
          return c.used;
        };
        dkb::Case c;
        c.big = tokens >= 4096 && !std::is_same<T, dk::bf16_t>::value;
        c.bench = "fused_add_rms_norm";
        c.shape = shape;
        c.dtype = dkb::DtypeName<T>::value;
        c.bytes = 4 * row_bytes + w_bytes;
        T *x, *res, *w;
        c.slot_bytes = carve(nullptr, x, res, w);
        c.cpu = [=](char* s) {
          T *x, *res, *w;
          carve(s, x, res, w);
          dk::cpu::fused_add_rms_norm<T>(x, hidden, res, hidden, w, tokens, hidden, kEps);
        };
#if defined(__CUDACC__)
        c.gpu = [=](char* s, cudaStream_t st) {
          using D = dkb::cuda_t<T>;
          T *x, *res, *w;
          carve(s, x, res, w);
          return dk::cuda::fused_add_rms_norm<D>(reinterpret_cast<D*>(x), hidden, reinterpret_cast<D*>(res), hidden,
                                                 reinterpret_cast<const D*>(w), tokens, hidden, kEps, st);
        };
#endif
        cases.push_back(std::move(c));
      }
    }
}

}  // namespace

DKB_BENCH_MAIN("bench_norm", add_cases)
