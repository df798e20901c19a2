// include/decodekit/gemm/quant_amx_rows.h: the INT4 / INT8 repacks (every code, scale and min where the layout
// says, zeros past N) and, on CPUs with the AMX int8 tile unit, the 1..16-row (INT8: 1..8) kernels against
// quant_amx_exact.h's kernel called with the same rows: bit for bit (the promise that lets a decoding row
// and a verification row agree), on awkward shapes: N below / not a multiple of 16 or 32, K an odd
// number of blocks, G 32 / 64 / 128, bias, strided rows of a, fp32 and fp16 activations, zero blocks,
// NaN / inf elements, magnitudes from 2^-60 to 2^60. Outputs are poisoned before each run. Also a loose
// float64 check (|out - sum a w| <= 1e-5 sum |a w|) so that both kernels being wrong alike still fails.
// Also: the inverse converters, quant_amx_exact.h's kernels reading the copy's strips (13+ rows) bit for bit
// those on int4.h's layout, and every int4_gemm / int8_gemm / int8_dequantize_rows route with the weight held
// only as its copy (qweight null) bit for bit the same call with the weight.
#include <cmath>
#include <cstring>
#include <cstdint>
#include <random>
#include <vector>

#include "check.h"
#include "decodekit/gemm/int4.h"
#include "decodekit/gemm/quant_amx_rows.h"

namespace {

using dk::half_t;

struct Int4 {
  int64_t N, K;
  int G;
  std::vector<uint8_t> q;  // [N, K / 2] int4.h layout
  std::vector<half_t> s, m;
  uint8_t code(int64_t n, int64_t k) const {
    const int64_t g = k / G, c = k % G, half = G / 2;
    const uint8_t b = q[size_t(n * (K / 2) + g * half + c % half)];
    return c < half ? uint8_t(b & 15) : uint8_t(b >> 4);
  }
  double w(int64_t n, int64_t k) const {  // d q + min, as the kernels' semantics (not rounded)
    const int64_t i = n * (K / G) + k / G;
    return double(dk::half_to_float(s[size_t(i)].bits)) * code(n, k) + double(dk::half_to_float(m[size_t(i)].bits));
  }
};

Int4 random_int4(std::mt19937& rng, int64_t N, int64_t K, int G) {
  Int4 w{N, K, G, std::vector<uint8_t>(size_t(N * K / 2)), std::vector<half_t>(size_t(N * K / G)), {}};
  for (auto& x : w.q) x = uint8_t(rng());
  w.m.resize(w.s.size());
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (size_t i = 0; i < w.s.size(); ++i) {
    w.s[i] = dk::from_float<half_t>(0.02f * u(rng));
    w.m[i] = dk::from_float<half_t>(0.1f * u(rng));
  }
  return w;
}

using dk::cpu::amx_rows_codes_bytes;
using dk::cpu::amx_rows_int8_codes_bytes;
using dk::cpu::amx_rows_scales_bytes;

// Byte i of the INT4 copy (int4.h layout: qweight [N, K / 2] group-split nibbles, scales / mins [N, K / G] fp16),
// i < amx_rows_packed_bytes(N, K, G): amx_rows_layout.h's definition, byte by byte (the packers' oracle).
uint8_t amx_rows_packed_byte(const uint8_t* qweight, const half_t* scales, const half_t* mins, int64_t N,
                                    int64_t K, int G, int64_t i) {
  const int64_t nb = K / 32, ng = K / G, half = G / 2;
  auto code = [&](int64_t n, int64_t k) -> int {  // q[n][k] (0 past N)
    if (n >= N) return 0;
    const int64_t c = k % G;
    const uint8_t byte = qweight[n * (K / 2) + (k / G) * half + (c % half)];
    return c < half ? byte & 15 : byte >> 4;
  };
  const int64_t cb = amx_rows_codes_bytes(N, K), sb = amx_rows_scales_bytes(N, K, G);
  if (i < cb) {  // strip s, block b, byte p: B-tile bytes p (low nibble) and 256 + p (high)
    const int64_t s = i / (nb * 256), b = i / 256 % nb;
    const int p = int(i % 256), t = p + 256;
    return uint8_t(code(16 * s + p % 64 / 4, 32 * b + 4 * (p / 64) + p % 4) |
                   code(16 * s + t % 64 / 4, 32 * b + 4 * (t / 64) + t % 4) << 4);
  }
  const half_t* src = i < cb + sb ? scales : mins;
  const int64_t j = (i - cb) % sb / 2;  // the fp16 value: strip s, group g, row n
  const int64_t s = j / (ng * 16), g = j / 16 % ng, row = 16 * s + j % 16;
  const uint16_t bits = row < N ? src[row * ng + g].bits : 0;
  return uint8_t((i - cb) % 2 ? bits >> 8 : bits & 0xff);
}

// Byte i < amx_rows_int8_packed_bytes(N, K, G) of the INT8 copy (qweight [N, K] int8, scales [N, K / G] fp16).
uint8_t amx_rows_int8_packed_byte(const int8_t* qweight, const half_t* scales, int64_t N, int64_t K, int G,
                                         int64_t i) {
  const int64_t nb = K / 32, ng = K / G, cb = amx_rows_int8_codes_bytes(N, K);
  if (i < cb) {
    const int64_t s = i / (nb * 512), b = i / 512 % nb;
    const int t = int(i % 512), n = t % 64 / 4;
    return 16 * s + n < N ? uint8_t(qweight[(16 * s + n) * K + 32 * b + 4 * (t / 64) + t % 4]) : uint8_t(0);
  }
  const int64_t j = (i - cb) / 2;
  const int64_t s = j / (ng * 16), g = j / 16 % ng, row = 16 * s + j % 16;
  const uint16_t bits = row < N ? scales[row * ng + g].bits : 0;
  return uint8_t((i - cb) % 2 ? bits >> 8 : bits & 0xff);
}

std::vector<uint8_t> pack(const Int4& w) {
  std::vector<uint8_t> p(size_t(dk::cpu::amx_rows_packed_bytes(w.N, w.K, w.G)), 0xee);
  dk::cpu::amx_rows_pack_int4(p.data(), w.q.data(), w.s.data(), w.m.data(), w.N, w.K, w.G);
  return p;
}

// The layout, read back independently of the kernel: B-tile byte 64 j + 4 n + i of (strip s, block b) is
// q[16 s + n][32 b + 4 j + i]; tile bytes 0..255 in the low nibbles, 256..511 in the high ones.
void test_pack(std::mt19937& rng) {
  for (int t = 0; t < 24; ++t) {
    const int G = 32 << (t % 3);
    const int64_t N = 1 + int64_t(rng() % 90), K = G * (1 + int64_t(rng() % 5));
    const Int4 w = random_int4(rng, N, K, G);
    const std::vector<uint8_t> packed = pack(w);
    const dk::cpu::AmxRowsWeight p(packed.data(), N, K, G);
    const int64_t S = dk::cpu::amx_rows_strips(N), nb = K / 32, ng = K / G;
    CHECK(int64_t(packed.size()) == (S * nb * 256 + 2 * S * ng * 32)) << "bytes" << packed.size();
    long long defn = 0;  // the fast packer against the layout's byte-by-byte definition
    for (int64_t i = 0; i < int64_t(packed.size()); ++i)
      defn += packed[size_t(i)] != amx_rows_packed_byte(w.q.data(), w.s.data(), w.m.data(), N, K, G, i);
    CHECK(defn == 0) << defn << "bytes differ from amx_rows_packed_byte";
    CHECK(S % 2 == 0 && S * 16 >= N && (S - 2) * 16 < N) << "strips" << S << "N" << N;
    long long bad = 0;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < nb; ++b)
        for (int t2 = 0; t2 < 512; ++t2) {
          const uint8_t byte = p.codes[(s * nb + b) * 256 + t2 % 256];
          const int got = t2 < 256 ? byte & 15 : byte >> 4;
          const int64_t n = 16 * s + t2 % 64 / 4, k = 32 * b + 4 * (t2 / 64) + t2 % 4;
          bad += got != (n < N ? w.code(n, k) : 0);
        }
    CHECK(bad == 0) << bad << "codes misplaced, N" << N << "K" << K << "G" << G;
    bad = 0;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t g = 0; g < ng; ++g)
        for (int n = 0; n < 16; ++n) {
          const int64_t row = 16 * s + n;
          const int64_t i = (s * ng + g) * 16 + n;
          const uint16_t ws = row < N ? w.s[size_t(row * ng + g)].bits : 0, wm = row < N ? w.m[size_t(row * ng + g)].bits : 0;
          bad += p.scales[i].bits != ws || p.mins[i].bits != wm;
        }
    CHECK(bad == 0) << bad << "scales / mins misplaced, N" << N << "K" << K << "G" << G;
  }
}

// The INT8 copy against its definition: B-tile byte 64 j + 4 n + i of (strip s, block b) = q[16 s + n][32 b + 4 j + i].
void test_pack_int8(std::mt19937& rng) {
  for (int t = 0; t < 12; ++t) {
    const int G = 32 << (t % 3);
    const int64_t N = 1 + int64_t(rng() % 70), K = G * (1 + int64_t(rng() % 4));
    std::vector<int8_t> q(size_t(N * K));
    for (auto& x : q) x = int8_t(rng());
    std::vector<half_t> sc(size_t(N * K / G));
    for (auto& x : sc) x.bits = uint16_t(rng());
    std::vector<uint8_t> p(size_t(dk::cpu::amx_rows_int8_packed_bytes(N, K, G)), 0xee);
    dk::cpu::amx_rows_pack_int8(p.data(), q.data(), sc.data(), N, K, G);
    const int64_t S = dk::cpu::amx_rows_strips(N), nb = K / 32, ng = K / G;
    long long bad = 0;
    for (int64_t i = 0; i < int64_t(p.size()); ++i)
      bad += p[size_t(i)] != amx_rows_int8_packed_byte(q.data(), sc.data(), N, K, G, i);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < nb; ++b)
        for (int j = 0; j < 8; ++j)
          for (int n = 0; n < 16; ++n)
            for (int i = 0; i < 4; ++i) {
              const int8_t got = int8_t(p[size_t((s * nb + b) * 512 + 64 * j + 4 * n + i)]);
              bad += got != (16 * s + n < N ? q[size_t((16 * s + n) * K + 32 * b + 4 * j + i)] : 0);
            }
    const half_t* ps = reinterpret_cast<const half_t*>(p.data() + S * nb * 512);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t g = 0; g < ng; ++g)
        for (int n = 0; n < 16; ++n)
          bad += ps[(s * ng + g) * 16 + n].bits != (16 * s + n < N ? sc[size_t((16 * s + n) * ng + g)].bits : 0);
    CHECK(bad == 0) << bad << "INT8 bytes misplaced, N" << N << "K" << K << "G" << G;
  }
}

// A random INT8 weight (codes, fp16 scales ~N(0, 0.01^2)) and its AMX copy.
struct Int8Copy {
  std::vector<int8_t> q;
  std::vector<half_t> s;
  std::vector<uint8_t> p;
};

Int8Copy random_int8_copy(std::mt19937& rng, int64_t N, int64_t K, int G) {
  std::normal_distribution<float> nd;
  Int8Copy c{std::vector<int8_t>(size_t(N * K)), std::vector<half_t>(size_t(N * K / G)),
             std::vector<uint8_t>(size_t(dk::cpu::amx_rows_int8_packed_bytes(N, K, G)))};
  for (auto& x : c.q) x = int8_t(rng());
  for (auto& x : c.s) x = dk::from_float<half_t>(0.01f * nd(rng));
  dk::cpu::amx_rows_pack_int8(c.p.data(), c.q.data(), c.s.data(), N, K, G);
  return c;
}

// The inverse converters (a weight held only as its copy): unpack(pack(w)) == w, INT4 and INT8.
void test_unpack(std::mt19937& rng) {
  for (int t = 0; t < 12; ++t) {
    const int G = 32 << (t % 3);
    const int64_t N = 1 + int64_t(rng() % 90), K = G * (1 + int64_t(rng() % 5));
    const Int4 w = random_int4(rng, N, K, G);
    const std::vector<uint8_t> p = pack(w);
    std::vector<uint8_t> q(w.q.size(), 0x5a);
    std::vector<half_t> s(w.s.size(), half_t{0x7e00}), m(w.m.size(), half_t{0x7e00});
    dk::cpu::amx_rows_unpack_int4(q.data(), s.data(), m.data(), p.data(), N, K, G);
    long long bad = 0;
    for (size_t i = 0; i < q.size(); ++i) bad += q[i] != w.q[i];
    for (size_t i = 0; i < s.size(); ++i) bad += s[i].bits != w.s[i].bits || m[i].bits != w.m[i].bits;
    CHECK(bad == 0) << bad << "INT4 unpack differs, N" << N << "K" << K << "G" << G;
    std::vector<int8_t> q8(size_t(N * K)), u8(q8.size(), 99);
    for (auto& x : q8) x = int8_t(rng());
    std::vector<half_t> s8(size_t(N * K / G)), v8(s8.size(), half_t{0x7e00});
    for (auto& x : s8) x.bits = uint16_t(rng());
    std::vector<uint8_t> p8(size_t(dk::cpu::amx_rows_int8_packed_bytes(N, K, G)));
    dk::cpu::amx_rows_pack_int8(p8.data(), q8.data(), s8.data(), N, K, G);
    dk::cpu::amx_rows_unpack_int8(u8.data(), v8.data(), p8.data(), N, K, G);
    bad = 0;
    for (size_t i = 0; i < q8.size(); ++i) bad += q8[i] != u8[i];
    for (size_t i = 0; i < s8.size(); ++i) bad += s8[i].bits != v8[i].bits;
    CHECK(bad == 0) << bad << "INT8 unpack differs, N" << N << "K" << K << "G" << G;
  }
}

// int4_gemm / int8_gemm / int8_dequantize_rows with the weight held only as its copy (qweight null) against the
// same calls with the weight too: bit for bit, every route (1..12 rows, 13+ from the copy's strips, bf16's and
// a CPU without the tile unit: the copy unpacked first), T = float / half / bf16.
template <class T>
void test_copy_only(std::mt19937& rng) {
  std::normal_distribution<float> nd;
  const int64_t Ms[] = {1, 3, 8, 12, 13, 17, 40};
  for (int t = 0; t < 14; ++t) {
    const int G = 32 << (t % 3);
    const int64_t N = 1 + int64_t(rng() % 100), K = G * (1 + int64_t(rng() % (512 / G))), M = Ms[t % 7];
    const Int4 w = random_int4(rng, N, K, G);
    const std::vector<uint8_t> p = pack(w);
    const Int8Copy c8 = random_int8_copy(rng, N, K, G);
    const std::vector<int8_t>& q8 = c8.q;
    const std::vector<half_t>& s8 = c8.s;
    const std::vector<uint8_t>& p8 = c8.p;
    std::vector<T> a(size_t(M * K)), bias(static_cast<size_t>(N));
    for (auto& x : a) x = dk::from_float<T>(nd(rng));
    for (auto& x : bias) x = dk::from_float<T>(nd(rng));
    const T* bp = t % 2 ? bias.data() : nullptr;
    long long diff = 0;
    for (int int8 = 0; int8 < 2; ++int8) {
      std::vector<T> want(size_t(M * N), dk::from_float<T>(-77.f)), got(size_t(M * N), dk::from_float<T>(-99.f));
      const dk::cpu::Int4GemmParams P{M, N, K, G, K, int8 ? p8.data() : p.data()};
      if (int8) {
        dk::cpu::int8_gemm<T>(want.data(), a.data(), q8.data(), s8.data(), bp, P);
        dk::cpu::int8_gemm<T>(got.data(), a.data(), nullptr, nullptr, bp, P);
      } else {
        dk::cpu::int4_gemm<T>(want.data(), a.data(), w.q.data(), w.s.data(), w.m.data(), bp, P);
        dk::cpu::int4_gemm<T>(got.data(), a.data(), nullptr, nullptr, nullptr, bp, P);
      }
      for (size_t i = 0; i < want.size(); ++i) diff += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    }
    const int64_t ids[] = {N - 1, 0, N / 2, N - 1};
    std::vector<T> want(size_t(4 * K), dk::from_float<T>(-77.f)), got(size_t(4 * K), dk::from_float<T>(-99.f));
    dk::cpu::int8_dequantize_rows<T>(want.data(), q8.data(), s8.data(), ids, 4, K, G);
    dk::cpu::int8_dequantize_rows<T>(got.data(), nullptr, nullptr, ids, 4, K, G, p8.data(), N);
    for (size_t i = 0; i < want.size(); ++i) diff += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    CHECK(diff == 0) << diff << "copy-only outputs differ: M" << M << "N" << N << "K" << K << "G" << G;
  }
}

#if defined(DK_AMX_EXACT_GEMM)
// INT8 rows 1..8 against quant_amx_exact.h's kernel, bit for bit (its own float64 emulation is in
// tests/ops/test_quant_amx_exact.py).
void test_kernel_int8(std::mt19937& rng, int cases) {
  std::normal_distribution<float> nd;
  for (int t = 0; t < cases; ++t) {
    const int G = 32 << (rng() % 3);
    const int64_t N = 1 + int64_t(rng() % 150), K = G * (1 + int64_t(rng() % (640 / G))), M = 1 + t % 8;
    const int64_t a_stride = K + (t % 3 == 1 ? 3 : 0);
    std::vector<int8_t> q(size_t(N * K));
    for (auto& x : q) x = int8_t(rng());
    std::vector<half_t> sc(size_t(N * K / G));
    for (auto& x : sc) x = dk::from_float<half_t>(0.01f * nd(rng));
    std::vector<uint8_t> p(size_t(dk::cpu::amx_rows_int8_packed_bytes(N, K, G)));
    dk::cpu::amx_rows_pack_int8(p.data(), q.data(), sc.data(), N, K, G);
    std::vector<float> a(size_t(M * a_stride), NAN), bias(static_cast<size_t>(N));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t k = 0; k < K; ++k) a[size_t(r * a_stride + k)] = std::ldexp(nd(rng), int(rng() % 41) - 20);
    if (t % 5 == 2) for (int k = 0; k < 32; ++k) a[size_t(k)] = 0.f;
    if (t % 7 == 3) a[size_t((M - 1) * a_stride + K / 3)] = INFINITY;
    for (auto& x : bias) x = nd(rng);
    const float* bp = t % 2 ? bias.data() : nullptr;
    std::vector<float> want(size_t(M * N), -77.f), got(size_t(M * N), -99.f);
    const bool ok1 = dk::cpu::int8_gemm_amx_exact<float>(want.data(), a.data(), a_stride, q.data(), sc.data(), bp, M, N, K, G);
    const bool ok2 = dk::cpu::amx_rows_int8<float>(got.data(), a.data(), a_stride, p.data(), bp, M, N, K, G);
    CHECK(ok1 && ok2) << "kernels ran" << ok1 << ok2;
    long long diff = 0;
    for (size_t i = 0; i < want.size(); ++i)
      diff += std::memcmp(&got[i], &want[i], 4) != 0 && !(std::isnan(got[i]) && std::isnan(want[i]));
    CHECK(diff == 0) << diff << "INT8 outputs differ from int8_gemm_amx_exact: M" << M << "N" << N << "K" << K << "G" << G;
  }
}

template <class T>
void test_kernel(std::mt19937& rng, int cases) {
  std::normal_distribution<float> nd;
  for (int t = 0; t < cases; ++t) {
    const int G = 32 << (rng() % 3);
    const int64_t N = 1 + int64_t(rng() % 200), K = G * (1 + int64_t(rng() % (768 / G))), M = 1 + t % 16;
    const int64_t a_stride = K + (t % 3 == 1 ? 5 : 0);
    const Int4 w = random_int4(rng, N, K, G);
    const std::vector<uint8_t> p = pack(w);
    std::vector<T> a(size_t(M * a_stride), dk::from_float<T>(NAN));
    std::vector<T> bias(static_cast<size_t>(N));
    for (int64_t r = 0; r < M; ++r) {
      const int scale = std::is_same_v<T, float> ? int(rng() % 121) - 60 : int(rng() % 21) - 10;
      for (int64_t k = 0; k < K; ++k) a[size_t(r * a_stride + k)] = dk::from_float<T>(std::ldexp(nd(rng), scale));
    }
    if (t % 5 == 2) for (int k = 0; k < 32; ++k) a[size_t(k)] = dk::from_float<T>(0.f);  // an all-zero block
    const bool special = t % 9 == 4;  // a NaN or an infinity in the last row
    if (special) a[size_t((M - 1) * a_stride + K / 2)] = dk::from_float<T>(t % 2 ? NAN : INFINITY);
    for (auto& x : bias) x = dk::from_float<T>(nd(rng));
    const T* bp = t % 2 ? bias.data() : nullptr;
    std::vector<T> want(size_t(M * N), dk::from_float<T>(-77.f)), got(size_t(M * N), dk::from_float<T>(-99.f));
    const bool ok1 = dk::cpu::int4_gemm_amx_exact<T>(want.data(), a.data(), a_stride, w.q.data(), w.s.data(),
                                                     w.m.data(), bp, M, N, K, G);
    const bool ok2 = dk::cpu::amx_rows_int4<T>(got.data(), a.data(), a_stride, p.data(), bp, M, N, K, G);
    CHECK(ok1 && ok2) << "kernels ran" << ok1 << ok2;
    long long diff = 0, far = 0;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = 0; n < N; ++n) {
        const double x = dk_test::to_d(got[size_t(r * N + n)]), y = dk_test::to_d(want[size_t(r * N + n)]);
        const bool both_nan = std::isnan(x) && std::isnan(y);
        diff += !both_nan && std::memcmp(&got[size_t(r * N + n)], &want[size_t(r * N + n)], sizeof(T)) != 0;
        if (special && r == M - 1) {
          far += !std::isnan(x);  // a non-finite element makes its row NaN
          continue;
        }
        // bound: the fixed point's rounding (<= 2^-22 max |a| of a block per element) plus fp32 sums
        double exact = bp ? dk_test::to_d(bias[size_t(n)]) : 0.0, mag = std::fabs(exact), fix = 0.0;
        for (int64_t b = 0; b < K / 32; ++b) {
          double amax = 0.0, wsum = 0.0;
          for (int64_t k = 32 * b; k < 32 * b + 32; ++k) {
            const double av = dk_test::to_d(a[size_t(r * a_stride + k)]), wv = w.w(n, k);
            exact += av * wv;
            mag += std::fabs(av * wv);
            amax = std::max(amax, std::fabs(av));
            wsum += std::fabs(wv);
          }
          fix += std::ldexp(amax, -22) * wsum;
        }
        const double tol = 1e-5 * (mag + fix) + 1.01 * fix +
                           (std::is_same_v<T, float> ? 0.0 : std::ldexp(std::fabs(exact), -10) + std::ldexp(1.0, -24)) + 1e-300;  // fp16: an ulp, subnormals too
        far += !(std::fabs(x - exact) <= tol);
      }
    CHECK(diff == 0) << diff << "outputs differ from int4_gemm_amx_exact: M" << M << "N" << N << "K" << K << "G" << G;
    CHECK(far == 0) << far << "outputs far from float64: M" << M << "N" << N << "K" << K << "G" << G;
  }
}
// quant_amx_exact.h's kernels reading the copy's strips (amx_rows_exact_int4 / _int8, 13+ rows with a copy) against
// the same kernels on int4.h's layout: bit for bit, any M.
template <class T>
void test_copy_exact(std::mt19937& rng) {
  std::normal_distribution<float> nd;
  const int64_t Ms[] = {9, 13, 16, 17, 33, 100, 129};
  for (int t = 0; t < 21; ++t) {
    const int G = 32 << (t % 3);
    const int64_t N = 1 + int64_t(rng() % 150), K = G * (1 + int64_t(rng() % (640 / G))), M = Ms[t % 7];
    const int64_t a_stride = K + (t % 2 ? 3 : 0);
    const Int4 w = random_int4(rng, N, K, G);
    const std::vector<uint8_t> p = pack(w);
    const Int8Copy c8 = random_int8_copy(rng, N, K, G);
    const std::vector<int8_t>& q8 = c8.q;
    const std::vector<half_t>& s8 = c8.s;
    const std::vector<uint8_t>& p8 = c8.p;
    std::vector<T> a(size_t(M * a_stride), dk::from_float<T>(NAN)), bias(static_cast<size_t>(N));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t k = 0; k < K; ++k) a[size_t(r * a_stride + k)] = dk::from_float<T>(nd(rng));
    for (auto& x : bias) x = dk::from_float<T>(nd(rng));
    const T* bp = t % 2 ? bias.data() : nullptr;
    std::vector<T> want(size_t(M * N)), got(size_t(M * N));
    long long diff = 0;
    bool ok = dk::cpu::int4_gemm_amx_exact<T>(want.data(), a.data(), a_stride, w.q.data(), w.s.data(), w.m.data(), bp,
                                              M, N, K, G);
    ok = ok && dk::cpu::amx_rows_exact_int4<T>(got.data(), a.data(), a_stride, p.data(), bp, M, N, K, G);
    for (size_t i = 0; i < want.size(); ++i) diff += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    ok = ok && dk::cpu::int8_gemm_amx_exact<T>(want.data(), a.data(), a_stride, q8.data(), s8.data(), bp, M, N, K, G);
    ok = ok && dk::cpu::amx_rows_exact_int8<T>(got.data(), a.data(), a_stride, p8.data(), bp, M, N, K, G);
    for (size_t i = 0; i < want.size(); ++i) diff += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    CHECK(ok && diff == 0) << diff << "outputs from the copy's strips differ: M" << M << "N" << N << "K" << K << "G" << G;
  }
}
#endif

#if defined(DK_AMX_EXACT_GEMM) && defined(DK_AMX_QUANT_GEMM)
// quant_amx_rows_bf16.h: the bf16 strips decoded from the copy bit for bit quant_amx.h's amx_decode_int4 / _int8
// on int4.h's layout (plain AVX-512: runs without the tile unit too), rows past N zeros; with the tile unit,
// bf16 activations on a weight with its copy: 1..12 rows (INT8: 1..8) the fp32 rows' exact bits rounded once to
// bf16, more rows int4_gemm_amx / int8_gemm_amx on int4.h's layout bit for bit.
void test_bf16(std::mt19937& rng) {
  std::normal_distribution<float> nd;
  for (int t = 0; t < 18; ++t) {
    const int G = 32 << (t % 3);
    const int64_t N = 1 + int64_t(rng() % 150), K = G * (1 + int64_t(rng() % (640 / G)));
    const Int4 w = random_int4(rng, N, K, G);
    const std::vector<uint8_t> p = pack(w);
    const Int8Copy c8 = random_int8_copy(rng, N, K, G);
    long long diff = 0;
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      std::vector<uint16_t> want(size_t(32 * K), 0x7fc1), got(size_t(32 * K), 0x7fc2);
      dk::cpu::amx_decode_int4(want.data(), w.q.data(), w.s.data(), w.m.data(), N, K, G, n0);
      dk::cpu::amx_rows_decode_bf16_int4(got.data(), p.data(), N, K, G, n0);
      diff += std::memcmp(want.data(), got.data(), want.size() * 2) != 0;
      std::fill(want.begin(), want.end(), 0x7fc1);
      std::fill(got.begin(), got.end(), 0x7fc2);
      dk::cpu::amx_decode_int8(want.data(), c8.q.data(), c8.s.data(), N, K, G, n0);
      dk::cpu::amx_rows_decode_bf16_int8(got.data(), c8.p.data(), N, K, G, n0);
      diff += std::memcmp(want.data(), got.data(), want.size() * 2) != 0;
    }
    CHECK(diff == 0) << diff << "bf16 strips decoded from the copy differ: N" << N << "K" << K << "G" << G;
    if (!dk::cpu::amx_enabled()) continue;
    for (const int64_t M : {int64_t(1 + t % 12), int64_t(13 + 7 * t)}) {
      std::vector<dk::bf16_t> a(size_t(M * K)), bias(static_cast<size_t>(N));
      std::vector<float> af(a.size()), bf(bias.size());
      for (size_t i = 0; i < a.size(); ++i) af[i] = dk::to_float(a[i] = dk::from_float<dk::bf16_t>(nd(rng)));
      for (size_t i = 0; i < bias.size(); ++i) bf[i] = dk::to_float(bias[i] = dk::from_float<dk::bf16_t>(nd(rng)));
      const bool b = t % 2;
      for (int int8 = 0; int8 < 2; ++int8) {
        const dk::cpu::Int4GemmParams P{M, N, K, G, K, int8 ? c8.p.data() : p.data()}, Q{M, N, K, G, K, nullptr};
        std::vector<dk::bf16_t> got(size_t(M * N), dk::from_float<dk::bf16_t>(-99.f)), want(got.size());
        std::vector<float> wf(got.size());
        const bool few = M <= (int8 ? dk::cpu::kAmxRowsInt8MaxM : dk::cpu::kAmxRowsDispatchM);
        if (int8) {
          dk::cpu::int8_gemm<dk::bf16_t>(got.data(), a.data(), nullptr, nullptr, b ? bias.data() : nullptr, P);
          if (few) dk::cpu::int8_gemm<float>(wf.data(), af.data(), nullptr, nullptr, b ? bf.data() : nullptr, P);
          else dk::cpu::int8_gemm<dk::bf16_t>(want.data(), a.data(), c8.q.data(), c8.s.data(), b ? bias.data() : nullptr, Q);
        } else {
          dk::cpu::int4_gemm<dk::bf16_t>(got.data(), a.data(), nullptr, nullptr, nullptr, b ? bias.data() : nullptr, P);
          if (few) dk::cpu::int4_gemm<float>(wf.data(), af.data(), nullptr, nullptr, nullptr, b ? bf.data() : nullptr, P);
          else dk::cpu::int4_gemm<dk::bf16_t>(want.data(), a.data(), w.q.data(), w.s.data(), w.m.data(),
                                              b ? bias.data() : nullptr, Q);
        }
        if (few) for (size_t i = 0; i < wf.size(); ++i) want[i] = dk::from_float<dk::bf16_t>(wf[i]);
        for (size_t i = 0; i < got.size(); ++i) diff += std::memcmp(&got[i], &want[i], 2) != 0;
        CHECK(diff == 0) << diff << "bf16 rows on the copy differ: int8" << int8 << "M" << M << "N" << N << "K" << K;
      }
    }
  }
}
#endif

}  // namespace

int main() {
  std::mt19937 rng(20261206);
  test_pack(rng);
  test_pack_int8(rng);
  test_unpack(rng);
  test_copy_only<float>(rng);
  test_copy_only<half_t>(rng);
  test_copy_only<dk::bf16_t>(rng);
#if defined(DK_AMX_EXACT_GEMM) && defined(DK_AMX_QUANT_GEMM)
  test_bf16(rng);
#endif
#if defined(DK_AMX_EXACT_GEMM)
  if (dk::cpu::amx_enabled()) {
    test_kernel<float>(rng, 96);
    test_kernel<half_t>(rng, 48);
    test_kernel_int8(rng, 64);
    test_copy_exact<float>(rng);
    test_copy_exact<half_t>(rng);
  } else {
    std::printf("test_amx_rows_cpu: no AMX tile unit: kernel cases skipped (the repack tested)\n");
  }
#else
  std::printf("test_amx_rows_cpu: built without AMX int8: kernel cases skipped (the repack tested)\n");
#endif
  return dk_test::finish("test_amx_rows_cpu");
}
