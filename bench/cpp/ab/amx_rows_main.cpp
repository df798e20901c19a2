// In-process A/B of the CPU's INT4 GEMM for M rows of fp32 activations: int4_gemm without the repacked
// copy (side a: the fp32 GEMV / small-M kernels up to 8 rows, quant_amx_exact.h's transposed AMX kernel from 9)
// against int4_gemm with it (side b: quant_amx_rows.h up to 12 rows (INT8: 8), then the transposed kernel
// decoding its strips from the copy instead of int4.h's layout), timed call by call alternately so that a shared VM's
// drift (+-30%) hits both alike. Workloads, M rows:
//   layers   SmolLM2-135M's 30 layers of Q4_1 projections (qkv 960x576, o 576x576, gate_up 3072x576,
//            down 576x1536), every layer its own weights (66 MB: from memory, as in decoding);
//   hot      gate_up 3072x576 called again and again (cache-resident: the kernels' compute);
//   lm_head  the tied Q8_0 LM head 49152x576 (int8_gemm without / with its copy).
// Prints best / median time per side and b's speedup (median of the per-round ratios), checks that the sides
// agree to 1e-3 (they are different arithmetics up to 8 rows, the same bits from 9). Build and run:
// tools/ab_amx_rows.sh [M ...]. Needs a CPU with AMX-INT8 (else side b falls back to side a's kernels).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "decodekit/gemm/int4.h"

namespace {

struct Weight {
  int int8 = 0;
  int64_t N, K;
  std::vector<uint8_t> q, packed;
  std::vector<dk::half_t> s, m;
  Weight(std::mt19937& rng, int64_t N_, int64_t K_) : N(N_), K(K_) {
    q.resize(size_t(N * K / 2));
    for (auto& x : q) x = uint8_t(rng());
    s.resize(size_t(N * K / 32));
    m.resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      s[i].bits = uint16_t(0x2000 + (rng() & 0xff));  // ~0.008: a Q4_1 scale
      m[i].bits = uint16_t(0xa000 + (rng() & 0xff));  // ~-0.008
    }
    packed.resize(size_t(dk::cpu::amx_rows_packed_bytes(N, K, 32)));
    dk::cpu::amx_rows_pack_int4(packed.data(), q.data(), s.data(), m.data(), N, K, 32);
  }
  Weight(std::mt19937& rng, int64_t N_, int64_t K_, int) : int8(1), N(N_), K(K_) {  // INT8 (Q8_0)
    q.resize(size_t(N * K));
    for (auto& x : q) x = uint8_t(rng());
    s.resize(size_t(N * K / 32));
    for (auto& x : s) x.bits = uint16_t(0x2000 + (rng() & 0xff));
    packed.resize(size_t(dk::cpu::amx_rows_int8_packed_bytes(N, K, 32)));
    dk::cpu::amx_rows_pack_int8(packed.data(), reinterpret_cast<const int8_t*>(q.data()), s.data(), N, K, 32);
  }
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void run(const char* name, const std::vector<const Weight*>& ws, int64_t M, int rounds) {
  int64_t maxN = 0, maxK = 0;
  for (const Weight* w : ws) maxN = std::max(maxN, w->N), maxK = std::max(maxK, w->K);
  std::mt19937 rng(7);
  std::vector<float> a(size_t(M * maxK)), o[2] = {std::vector<float>(size_t(M * maxN)), std::vector<float>(size_t(M * maxN))};
  for (auto& x : a) x = float(rng() % 2001) / 1000.f - 1.f;
  std::vector<double> t[2], ratio;
  for (int r = 0; r < rounds + 3; ++r) {
    double dt[2];
    for (int side = 0; side < 2; ++side) {
      const double t0 = now_ms();
      for (const Weight* w : ws) {
        dk::cpu::Int4GemmParams P{M, w->N, w->K, 32, w->K, side ? w->packed.data() : nullptr};
        if (w->int8)
          dk::cpu::int8_gemm<float>(o[side].data(), a.data(), reinterpret_cast<const int8_t*>(w->q.data()),
                                    w->s.data(), nullptr, P);
        else
          dk::cpu::int4_gemm<float>(o[side].data(), a.data(), w->q.data(), w->s.data(), w->m.data(), nullptr, P);
      }
      dt[side] = now_ms() - t0;
    }
    if (r < 3) continue;  // warm-up
    t[0].push_back(dt[0]), t[1].push_back(dt[1]), ratio.push_back(dt[0] / dt[1]);
  }
  double maxdiff = 0;
  for (size_t i = 0; i < o[0].size(); ++i)
    maxdiff = std::max(maxdiff, double(std::fabs(o[0][i] - o[1][i])) / (1e-2 + std::fabs(o[0][i])));
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  std::printf("%-7s M=%-3lld a: best %8.3f ms median %8.3f | b (amx_rows): best %8.3f ms median %8.3f | b speedup "
              "median %.2fx (best/best %.2fx) | max rel diff %.1e%s\n",
              name, (long long)M, *std::min_element(t[0].begin(), t[0].end()), med(t[0]),
              *std::min_element(t[1].begin(), t[1].end()), med(t[1]), med(ratio),
              *std::min_element(t[0].begin(), t[0].end()) / *std::min_element(t[1].begin(), t[1].end()), maxdiff,
              maxdiff > 1e-3 ? "  MISMATCH" : "");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> Ms;
  for (int i = 1; i < argc; ++i) Ms.push_back(std::atoll(argv[i]));
  if (Ms.empty()) Ms = {1, 2, 4, 7, 8, 16};
  std::mt19937 rng(1);
  const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  std::vector<Weight> layers;
  layers.reserve(120);
  for (int l = 0; l < 30; ++l)
    for (const auto& sh : shapes) layers.emplace_back(rng, sh[0], sh[1]);
  std::vector<const Weight*> all;
  for (const Weight& w : layers) all.push_back(&w);
  const Weight lm(rng, 49152, 576, 8);
  for (int64_t M : Ms) {
    run("layers", all, M, 30);
    run("hot", {&layers[2]}, M, 1000);
    run("lm_head", {&lm}, M, M <= 16 ? 30 : 10);
  }
  return 0;
}
