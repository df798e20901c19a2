// rotary_embedding microbenchmarks (NeoX style, full rotary, separate contiguous q and k).
// Built twice: as C++ (bench_rope, CPU kernel from include/decodekit/rope.h) and, through
// bench_rope.cu, by nvcc (bench_rope_cuda, CUDA launcher from rope.cuh). Method: see
// bench_common.h. q and k rotate through the arena; positions and the cos/sin cache are
// shared by all calls (as they are by all layers of a model), so they are cache-warm.
#include <memory>

#include "bench_common.h"
#include "decodekit/rope.h"
#if defined(__CUDACC__)
#include "decodekit/rope.cuh"
#endif

namespace {

constexpr int kMaxPos = 8192;

struct HeadConfig { int hq, hk, head; const char* model; };
const HeadConfig kConfigs[] = {{32, 8, 128, "llama3-8b"}, {9, 3, 64, "smollm2-135m"}};

// Shared inputs for one (tokens, rot) pair: positions (distinct, spread out) and the table.
struct Shared {
  std::vector<int64_t> pos;
  std::vector<float> cache;
  const int64_t* dpos = nullptr;  // device copies (CUDA build)
  const float* dcache = nullptr;
};

std::shared_ptr<Shared> make_shared_inputs(int64_t tokens, int rot) {
  auto s = std::make_shared<Shared>();
  s->pos.resize(tokens);
  for (int64_t t = 0; t < tokens; ++t) s->pos[t] = (t * 997 + 13) % kMaxPos;
  s->cache.resize(size_t(kMaxPos) * rot);
  for (int p = 0; p < kMaxPos; ++p)
    for (int i = 0; i < rot / 2; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / rot);
      s->cache[size_t(p) * rot + i] = float(std::cos(a));
      s->cache[size_t(p) * rot + rot / 2 + i] = float(std::sin(a));
    }
#if defined(__CUDACC__)
  int64_t* dp;
  float* dc;
  DKB_CUDA_CHECK(cudaMalloc(&dp, tokens * sizeof(int64_t)));
  DKB_CUDA_CHECK(cudaMalloc(&dc, s->cache.size() * sizeof(float)));
  DKB_CUDA_CHECK(cudaMemcpy(dp, s->pos.data(), tokens * sizeof(int64_t), cudaMemcpyHostToDevice));
  DKB_CUDA_CHECK(cudaMemcpy(dc, s->cache.data(), s->cache.size() * sizeof(float), cudaMemcpyHostToDevice));
  s->dpos = dp;  // freed at exit
  s->dcache = dc;
#endif
  return s;
}

template <class T>
void add_cases(std::vector<dkb::Case>& cases, bool quick) {
  for (int64_t tokens : dkb::bench_tokens(quick))
    for (const HeadConfig& hc : kConfigs) {
      const int hq = hc.hq, hk = hc.hk, head = hc.head, rot = hc.head;
      const std::shared_ptr<Shared> sh = make_shared_inputs(tokens, rot);
      auto carve = [=](char* s, T*& q, T*& k) {
        dkb::Carver c{s};
        q = c.take<T>(tokens * hq * head);
        k = c.take<T>(tokens * hk * head);
        return c.used;
      };
      dkb::Case c;
      c.big = tokens >= 4096 && !std::is_same<T, dk::bf16_t>::value;
      c.bench = "rotary_embedding";
      c.shape = "tokens=" + std::to_string(tokens) + " heads=" + std::to_string(hq) + "/" + std::to_string(hk) +
                " d=" + std::to_string(head);
      c.dtype = dkb::DtypeName<T>::value;
      // q, k read + written; positions and one cos/sin row per token read
      c.bytes = 2.0 * tokens * (hq + hk) * head * sizeof(T) + tokens * (8.0 + rot * 4.0);
      T *q, *k;
      c.slot_bytes = carve(nullptr, q, k);
      c.cpu = [=](char* s) {
        T *q, *k;
        carve(s, q, k);
        dk::cpu::rotary_embedding<T>(sh->pos.data(), q, hq * head, head, hq, k, hk * head, head, hk, sh->cache.data(),
                                     rot, true, tokens);
      };
#if defined(__CUDACC__)
      c.gpu = [=](char* s, cudaStream_t st) {
        using D = dkb::cuda_t<T>;
        T *q, *k;
        carve(s, q, k);
        return dk::cuda::rotary_embedding<D>(sh->dpos, reinterpret_cast<D*>(q), hq * head, head, hq,
                                             reinterpret_cast<D*>(k), hk * head, head, hk, sh->dcache, rot, head, true,
                                             tokens, st);
      };
#endif
      cases.push_back(std::move(c));
    }
}

}  // namespace

DKB_BENCH_MAIN("bench_rope", add_cases)
