// Emulator test of include/decodekit/comm/allreduce.cuh's gemm_allreduce kernels
// (dk::cuda::gemm_all_reduce / _int4 / _fp8: the dense, INT4 and fp8 mainloops, the tile pushes
// into every rank's slots, the flag protocol and the rank-order reduction) and the one-/two-shot
// custom_all_reduce, with world sizes 1-4: each rank is a launch on its own OS thread, the ranks'
// buffers and Signal blocks plain host memory (the emulator's atomics stand in for the system-scope
// acquire/release). Checked: every rank's output bitwise identical, nothing left poisoned, and the
// result within a bound of a float64 model of the kernel's numerics (weights rounded to T as the
// mainloops do, each rank's partial product rounded to T, the fp32 rank-order sum rounded to T):
//   |out - ref| <= u_T (|ref| + sum_r |P_r|) + (K + 4) 2^-24 sum_r |a_r| @ |w_r|^T
// (u_T: 2^-24 / 2^-11 / 2^-8 for fp32 / fp16 / bf16; K + 4: fp32 accumulation over K plus the
// split-K warp sums, bias and fp8 scalings), x1.5.
#include "shim.h"
#include "emu_types.h"
#include "decodekit/comm/allreduce.cuh"
#include "decodekit/comm/allreduce.h"
#include "decodekit/common/fp8.h"
#include "decodekit/gemm/int4_common.h"

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>

using namespace dk;
static std::mt19937 rng(11);
static int fails = 0, checks = 0;

template <class T> double unit() { return sizeof(T) == 4 ? 0x1p-24 : std::is_same_v<T, __half> ? 0x1p-11 : 0x1p-8; }
template <class T> double rt(double x) { return ld(Conv<T>::store(float(x))); }  // x rounded to T (via fp32)

// World: ws ranks' buffers and Signal blocks in host memory.
struct World {
  int ws;
  int64_t buffer_bytes;
  std::vector<std::vector<char>> bufs, sigs;
  comm::Peers peers(int r) {
    comm::Peers P;
    P.rank = r;
    P.world_size = ws;
    P.buffer_bytes = buffer_bytes;
    for (int q = 0; q < ws; ++q) {
      P.buf[q] = align(bufs[size_t(q)].data(), 256);
      P.sig[q] = reinterpret_cast<comm::Signal*>(align(sigs[size_t(q)].data(), 128));
    }
    return P;
  }
  static void* align(char* p, uintptr_t a) { return p + (a - reinterpret_cast<uintptr_t>(p) % a) % a; }
  World(int ws_, int64_t bytes) : ws(ws_), buffer_bytes(bytes) {
    for (int q = 0; q < ws; ++q) {
      bufs.emplace_back(size_t(bytes + 256), char(0x7f));  // garbage, never zeros
      sigs.emplace_back(sizeof(comm::Signal) + 128, char(0));
    }
    for (int q = 0; q < ws; ++q) cpu::init_signal(peers(q).sig[q], ws, uint64_t(20e9), uint64_t(0) - 3);  // wraps
  }
  template <class F> void run(F&& f) {  // f(rank) on one OS thread per rank, all at once
    std::vector<std::thread> th;
    for (int r = 0; r < ws; ++r) th.emplace_back([&, r] { f(r); });
    for (auto& t : th) t.join();
  }
};

enum Kind { kDense, kInt4, kFp8 };
const char* kname(Kind k) { return k == kDense ? "dense" : k == kInt4 ? "int4" : "fp8"; }

template <class T>
void run_gemm(Kind kind, int ws, int M, int64_t N, int64_t K, int G, int calls) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> byte(0, 255);
  const std::string what = std::string(kname(kind)) + " " + tname<T>() + " ws=" + std::to_string(ws) + " M=" +
                           std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                           (kind == kInt4 ? " G=" + std::to_string(G) : "");
  World W(ws, int64_t(4) << 20);
  // per rank: activations (T, or fp8 codes + per-row scale), weights (T, INT4, or fp8 + per-column scale)
  std::vector<std::vector<T>> a(ws), wd(ws);
  std::vector<std::vector<uint8_t>> a8(ws), q(ws);
  std::vector<std::vector<__half>> sc(ws), mn(ws);
  std::vector<std::vector<float>> as(ws), wsc(ws);
  std::vector<std::vector<double>> wref(ws), aref(ws);  // the values the kernel multiplies, as double
  std::vector<T> bias(static_cast<size_t>(N));
  for (auto& x : bias) x = Conv<T>::store(nd(rng));
  const int64_t ng = kind == kInt4 ? K / G : 0;
  for (int r = 0; r < ws; ++r) {
    aref[r].resize(size_t(M * K));
    wref[r].resize(size_t(N * K));
    if (kind == kFp8) {
      a8[r].resize(size_t(M * K));
      as[r].resize(size_t(M));
      q[r].resize(size_t(N * K));
      wsc[r].resize(size_t(N));
      for (auto& x : a8[r]) x = uint8_t(byte(rng) & 0x7e ^ (byte(rng) & 0x80));  // finite codes (no 0x7f / 0xff)
      for (auto& x : q[r]) x = uint8_t(byte(rng) & 0x7e ^ (byte(rng) & 0x80));
      for (auto& x : as[r]) x = 0.001f + 0.01f * std::fabs(nd(rng));
      for (auto& x : wsc[r]) x = 0.001f + 0.01f * std::fabs(nd(rng));
      for (int64_t i = 0; i < M * K; ++i) aref[r][size_t(i)] = fp8_e4m3_to_float(a8[r][size_t(i)]);
      for (int64_t i = 0; i < N * K; ++i) wref[r][size_t(i)] = fp8_e4m3_to_float(q[r][size_t(i)]);
    } else {
      a[r].resize(size_t(M * K));
      for (int64_t i = 0; i < M * K; ++i) {
        a[r][size_t(i)] = Conv<T>::store(nd(rng));
        aref[r][size_t(i)] = ld(a[r][size_t(i)]);
      }
      if (kind == kDense) {
        wd[r].resize(size_t(N * K));
        for (int64_t i = 0; i < N * K; ++i) {
          wd[r][size_t(i)] = Conv<T>::store(0.2f * nd(rng));
          wref[r][size_t(i)] = ld(wd[r][size_t(i)]);
        }
      } else {
        q[r].resize(size_t(N * K / 2));
        for (auto& x : q[r]) x = uint8_t(byte(rng));
        sc[r].resize(size_t(N * ng));
        mn[r].resize(size_t(N * ng));
        for (auto& x : sc[r]) x = __float2half(0.002f + 0.02f * std::fabs(nd(rng)));
        for (auto& x : mn[r]) x = __float2half(-0.1f * std::fabs(nd(rng)));
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) {
            const int c = int4_code(q[r].data() + n * K / 2, G, k);
            const float w = int4_weight(c, __half2float(sc[r][size_t(n * ng + k / G)]),
                                        __half2float(mn[r][size_t(n * ng + k / G)]));
            wref[r][size_t(n * K + k)] = rt<T>(w);  // rounded once to T, as the mainloop does
          }
      }
    }
  }
  // float64 model: P_r = a_r @ w_r^T (* scales) (+ bias on rank 0), rounded to T; then the fp32 sum
  std::vector<double> ref(size_t(M * N), 0.0), pabs(size_t(M * N), 0.0), aw(size_t(M * N), 0.0);
  for (int r = 0; r < ws; ++r)
    for (int m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0, sa = 0;
        for (int64_t k = 0; k < K; ++k) {
          s += aref[r][size_t(m * K + k)] * wref[r][size_t(n * K + k)];
          sa += std::fabs(aref[r][size_t(m * K + k)] * wref[r][size_t(n * K + k)]);
        }
        if (kind == kFp8) {
          s *= double(as[r][size_t(m)]) * double(wsc[r][size_t(n)]);
          sa *= double(as[r][size_t(m)]) * double(wsc[r][size_t(n)]);
        }
        if (r == 0) {
          s += ld(bias[size_t(n)]);
          sa += std::fabs(ld(bias[size_t(n)]));
        }
        ref[size_t(m * N + n)] += s;
        pabs[size_t(m * N + n)] += std::fabs(s);
        aw[size_t(m * N + n)] += sa;
      }
  for (int call = 0; call < calls; ++call) {
    std::vector<std::vector<T>> outs(ws, std::vector<T>(size_t(M * N), Conv<T>::store(NAN)));
    std::vector<cudaError_t> errs(ws, cudaSuccess);
    W.run([&](int r) {
      const comm::Peers P = W.peers(r);
      T* o = outs[r].data();
      if (kind == kDense)
        errs[r] = cuda::gemm_all_reduce<T>(o, a[r].data(), K, wd[r].data(), bias.data(), M, N, K, P, nullptr);
      else if (kind == kInt4)
        errs[r] = cuda::gemm_all_reduce_int4<T>(o, a[r].data(), K, q[r].data(), sc[r].data(), mn[r].data(), G,
                                                bias.data(), M, N, K, P, nullptr);
      else
        errs[r] = cuda::gemm_all_reduce_fp8<T>(o, a8[r].data(), K, as[r].data(), q[r].data(), wsc[r].data(),
                                               bias.data(), M, N, K, P, nullptr);
    });
    ++checks;
    bool ok = true;
    for (int r = 0; r < ws && ok; ++r)
      if (errs[r] != cudaSuccess) {
        printf("FAIL %s: rank %d returned %d\n", what.c_str(), r, int(errs[r]));
        ok = false;
      }
    for (int r = 1; r < ws && ok; ++r)
      if (std::memcmp(outs[r].data(), outs[0].data(), outs[0].size() * sizeof(T)) != 0) {
        printf("FAIL %s call %d: rank %d differs from rank 0\n", what.c_str(), call, r);
        ok = false;
      }
    double worst = 0;
    for (int64_t i = 0; i < M * N && ok; ++i) {
      const double o = ld(outs[0][size_t(i)]);
      const double b = 1.5 * (unit<T>() * (std::fabs(ref[size_t(i)]) + pabs[size_t(i)]) +
                              double(K + 4) * 0x1p-24 * aw[size_t(i)]) + 1e-30;
      if (!(std::fabs(o - ref[size_t(i)]) <= b)) {
        printf("FAIL %s call %d: out[%lld, %lld] = %.8g, reference %.8g, bound %.3g%s\n", what.c_str(), call,
               (long long)(i / N), (long long)(i % N), o, ref[size_t(i)], b, std::isnan(o) ? " (poison left)" : "");
        ok = false;
      }
      worst = std::max(worst, std::fabs(o - ref[size_t(i)]) / b);
    }
    if (!ok) ++fails;
    else if (call == 0) printf("ok   %s (worst error %.2f of the bound)\n", what.c_str(), worst);
  }
  // the epoch advanced once per call on every rank
  for (int r = 0; r < ws; ++r) {
    const uint64_t e = W.peers(r).sig[r]->h.epoch;
    ++checks;
    if (ws > 1 && e != uint64_t(0) - 3 + uint64_t(calls)) {
      printf("FAIL %s: rank %d epoch %llu after %d calls\n", what.c_str(), r, (unsigned long long)e, calls);
      ++fails;
    }
  }
}

template <class T>
void run_all() {
  if constexpr (!cuda::kIsMmaType<T>) {
    // fp32 is not taken by the tensor-core kernels: the launcher falls back (cuBLAS + all-reduce)
    std::vector<T> o(64), a(64), w(64 * 8);
    World W(1, 1 << 20);
    ++checks;
    if (cuda::gemm_all_reduce_int4<T>(o.data(), a.data(), 64, nullptr, nullptr, nullptr, 32, nullptr, 1, 8, 64,
                                      W.peers(0), nullptr) != cudaErrorNotSupported) {
      printf("FAIL fp32 int4 accepted\n");
      ++fails;
    }
  } else {
    for (int ws : {1, 2, 3, 4})
      for (Kind kind : {kDense, kInt4, kFp8}) {
        // M: one row (M16 off), 5, 9 (M16 on, rows past M), 16; N: one tile, partial tiles, many tiles
        run_gemm<T>(kind, ws, 1, 520, 256, 128, 2);
        run_gemm<T>(kind, ws, 9, 136, kind == kInt4 ? 192 : 96, 64, 3);
        if (ws <= 2) {
          run_gemm<T>(kind, ws, 5, 64, kind == kFp8 ? 48 : 64, 32, 1);
          run_gemm<T>(kind, ws, 16, 200, 128, 32, 1);
        }
      }
    // invalid for the INT4 kernel: G = 48, K not a multiple of G, M = 17
    World W(1, 1 << 20);
    std::vector<T> o(17 * 64), a(17 * 64);
    std::vector<uint8_t> qq(64 * 32);
    std::vector<__half> s(64 * 2);
    for (auto [M, K, G] : {std::tuple{1, 64, 48}, std::tuple{1, 96, 64}, std::tuple{17, 64, 32}}) {
      ++checks;
      if (cuda::gemm_all_reduce_int4<T>(o.data(), a.data(), K, qq.data(), s.data(), s.data(), G, nullptr, M, 64, K,
                                        W.peers(0), nullptr) != cudaErrorNotSupported) {
        printf("FAIL int4 M=%d K=%d G=%d accepted\n", M, K, G);
        ++fails;
      }
    }
  }
}

int main() {
  run_all<float>();
  run_all<__half>();
  run_all<__nv_bfloat16>();
  printf("test_allreduce: %d checks, %d failures, %ld launches\n", checks, fails, dk_emu::launches.load());
  return fails != 0;
}
