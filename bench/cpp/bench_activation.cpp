// silu_and_mul microbenchmarks: in [tokens, 2d] -> out [tokens, d], d = intermediate size
// of SmolLM2-135M (1536), Llama-3-8B (14336), Llama-3-70B (28672). Built twice: as C++
// (bench_activation, CPU kernel from include/decodekit/activation.h) and, through
// bench_activation.cu, by nvcc (bench_activation_cuda, CUDA launcher from
// activation.cuh). Method: see bench_common.h.
#include "bench_common.h"
#include "decodekit/activation.h"
#if defined(__CUDACC__)
#include "decodekit/activation.cuh"
#endif

namespace {

template <class T>
void add_cases(std::vector<dkb::Case>& cases, bool quick) {
  for (int64_t tokens : dkb::bench_tokens(quick))
    for (int64_t d : {int64_t(1536), int64_t(14336), int64_t(28672)}) {
      auto carve = [=](char* s, T*& in, T*& out) {
        dkb::Carver c{s};
        in = c.take<T>(tokens * 2 * d);
        out = c.take<T>(tokens * d);
        return c.used;
      };
      dkb::Case c;
      c.big = tokens >= 4096;  // seconds per call on a 2-core CPU
      c.bench = "silu_and_mul";
      c.shape = "tokens=" + std::to_string(tokens) + " d=" + std::to_string(d);
      c.dtype = dkb::DtypeName<T>::value;
      c.bytes = 3.0 * tokens * d * sizeof(T);  // read 2d, write d per token
      T *in, *out;
      c.slot_bytes = carve(nullptr, in, out);
      c.cpu = [=](char* s) {
        T *in, *out;
        carve(s, in, out);
        dk::cpu::silu_and_mul<T>(out, in, 2 * d, tokens, d);
      };
#if defined(__CUDACC__)
      c.gpu = [=](char* s, cudaStream_t st) {
        using D = dkb::cuda_t<T>;
        T *in, *out;
        carve(s, in, out);
        return dk::cuda::silu_and_mul<D>(reinterpret_cast<D*>(out), reinterpret_cast<const D*>(in), 2 * d, tokens, d,
                                         st);
      };
#endif
      cases.push_back(std::move(c));
    }
}

}  // namespace

DKB_BENCH_MAIN("bench_activation", add_cases)
