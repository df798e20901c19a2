// Driver of tools/ab_quant_gemm.sh: times two builds of the CPU INT4 / INT8 GEMM (side "a": a git
// revision's headers, side "b": the working tree's) in ONE process, alternating call by call, so that the
// machine's drift (+-30% on a shared VM) hits both sides alike. Workloads, M rows of fp32 activations:
//   layers   SmolLM2-135M's 30 layers of Q4_1 projections (qkv 960x576, o 576x576, gate_up 3072x576,
//            down 576x1536), every layer its own weights (66 MB: from DRAM, as in decoding);
//   hot_*    one projection called again and again (cache-resident: the kernel's compute);
//   lm_head  the tied Q8_0 LM head 49152x576.
// Prints best and mean time per side and b's speedup, and checks that both sides agree to 1e-3.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

extern "C" void dk_ab_a(int, float*, const float*, const uint8_t*, const void*, const void*, int64_t, int64_t, int64_t);
extern "C" void dk_ab_b(int, float*, const float*, const uint8_t*, const void*, const void*, int64_t, int64_t, int64_t);

namespace {
using Fn = void (*)(int, float*, const float*, const uint8_t*, const void*, const void*, int64_t, int64_t, int64_t);

struct Weight {
  int int8;
  int64_t N, K;
  std::vector<uint8_t> q;
  std::vector<uint16_t> s, m;
  Weight(std::mt19937& rng, int int8_, int64_t N_, int64_t K_) : int8(int8_), N(N_), K(K_) {
    q.resize(size_t(int8 ? N * K : N * K / 2));
    for (auto& x : q) x = uint8_t(rng());
    s.resize(size_t(N * K / 32));
    m.resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      s[i] = uint16_t(0x2000 + (rng() & 0xff));  // ~0.008: a Q4_1 scale
      m[i] = uint16_t(0xa000 + (rng() & 0xff));   // ~-0.008
    }
  }
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void run(const char* name, const std::vector<const Weight*>& ws, int64_t M, int rounds) {
  int64_t maxN = 0, maxK = 0;
  double bytes = 0;
  for (const Weight* w : ws) {
    maxN = std::max(maxN, w->N);
    maxK = std::max(maxK, w->K);
    bytes += double(w->q.size() + 2 * w->s.size() + (w->int8 ? 0 : 2 * w->m.size()));
  }
  std::mt19937 rng(7);
  std::vector<float> a(size_t(M * maxK)), oa(size_t(M * maxN)), ob(size_t(M * maxN));
  for (auto& x : a) x = float(rng() % 2001) / 1000.f - 1.f;
  const Fn fn[2] = {dk_ab_a, dk_ab_b};
  double best[2] = {1e30, 1e30}, sum[2] = {0, 0}, maxdiff = 0;
  for (int r = 0; r < rounds + 3; ++r)
    for (int side = 0; side < 2; ++side) {
      std::vector<float>& o = side ? ob : oa;
      const double t0 = now_ms();
      for (const Weight* w : ws) fn[side](w->int8, o.data(), a.data(), w->q.data(), w->s.data(), w->m.data(), M, w->N, w->K);
      const double dt = now_ms() - t0;
      if (r < 3) continue;  // warm-up
      best[side] = std::min(best[side], dt);
      sum[side] += dt;
    }
  for (size_t i = 0; i < oa.size(); ++i)
    maxdiff = std::max(maxdiff, double(std::fabs(oa[i] - ob[i])) / (1e-2 + std::fabs(oa[i])));
  std::printf("%-14s M=%-3lld a: best %8.3f ms mean %8.3f | b: best %8.3f ms mean %8.3f | b speedup best %.3fx mean "
              "%.3fx | b %.1f GB/s | max rel diff %.1e%s\n",
              name, (long long)M, best[0], sum[0] / rounds, best[1], sum[1] / rounds, best[0] / best[1],
              sum[0] / sum[1], bytes / best[1] / 1e6, maxdiff, maxdiff > 1e-3 ? "  MISMATCH" : "");
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> Ms;
  for (int i = 1; i < argc; ++i) Ms.push_back(std::atoll(argv[i]));
  if (Ms.empty()) Ms = {1, 4};
  std::mt19937 rng(1);
  const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  std::vector<Weight> layers;
  layers.reserve(120);
  for (int l = 0; l < 30; ++l)
    for (const auto& sh : shapes) layers.emplace_back(rng, 0, sh[0], sh[1]);
  Weight lm(rng, 1, 49152, 576);
  std::vector<const Weight*> all;
  for (const Weight& w : layers) all.push_back(&w);
  for (int64_t M : Ms) {
    run("layers", all, M, 40);
    run("hot_3072x576", {&layers[2]}, M, 400);
    run("hot_576x1536", {&layers[3]}, M, 400);
    run("lm_head", {&lm}, M, 20);
  }
  return 0;
}
