// Emulator test of include/decodekit/sampling/rejection.cuh (dk::cuda::rejection_sample) against the
// CPU rule (dk::spec_verify of sampling/rejection.h, as csrc/cpu/sampling.cpp calls it): identical
// tokens and counts for random requests (with and without draft probabilities, greedy, ragged
// draft counts incl. 0, vocabularies smaller and larger than the CTA, out-of-vocabulary drafts,
// exact-tie rows), and num_draft outside [0, k] clamped. Also sampling/gumbel_max.cuh
// (dk::cuda::gumbel_argmax) against the CPU row (dk::gumbel_argmax_row): the same token on flat,
// peaked, masked, duplicated and special (NaN / +inf / all -inf) rows, strided rows, vocabularies
// around the CTA and the Philox block. And sampling/argmax.cuh (dk::cuda::argmax_rows) against the CPU
// scalar rule (dk::argmax_row_scalar): ties, NaNs (the first wins), +-0, +-inf, all -inf, strided rows.
#include "shim.h"
#include "decodekit/sampling/argmax.cuh"
#include "decodekit/sampling/gumbel_max.cuh"
#include "decodekit/sampling/rejection.cuh"

#include <cmath>
#include <random>
#include <string>
#include <vector>

static std::mt19937 rng(11);
static int fails = 0, checks = 0;

// nans: NaNs in the target rows (1 to 3 a row, in most rows; greedy takes the first one, torch.argmax's rule)
static void run(int B, int k, int64_t V, bool with_q, bool greedy, bool ties, bool nans = false) {
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::uniform_int_distribution<int64_t> tok(0, V - 1);
  std::vector<float> p(size_t(B) * (k + 1) * V), q(with_q ? size_t(B) * k * V : 0);
  auto fill = [&](float* row) {
    float s = 0;
    for (int64_t v = 0; v < V; ++v) {
      row[v] = ties ? float(1 + (v % 3 == 0)) : std::exp(4.f * u(rng));
      s += row[v];
    }
    for (int64_t v = 0; v < V; ++v) row[v] /= s;
  };
  for (int64_t r = 0; r < int64_t(B) * (k + 1); ++r) fill(&p[size_t(r * V)]);
  for (int64_t r = 0; nans && r < int64_t(B) * (k + 1); ++r)
    for (int j = int(rng() % 4); j > 0; --j) p[size_t(r * V + int64_t(rng() % uint32_t(V)))] = NAN;
  for (int64_t r = 0; greedy && r < int64_t(B) * (k + 1); ++r) {  // the CPU rule is torch.argmax's
    const float* row = &p[size_t(r * V)];
    ++checks;
    if (dk::spec_argmax([&](int64_t v) { return row[v]; }, V) != dk::argmax_row_scalar(row, V)) {
      printf("FAIL spec_argmax != argmax_row_scalar (V=%ld nans=%d)\n", long(V), nans);
      ++fails;
    }
  }
  for (int64_t r = 0; with_q && r < int64_t(B) * k; ++r) fill(&q[size_t(r * V)]);
  std::vector<int64_t> draft(size_t(B) * k), seeds(B), pos(B);
  std::vector<int32_t> nd(B);
  for (int b = 0; b < B; ++b) {
    nd[b] = int32_t(rng() % (k + 1));
    seeds[b] = int64_t(rng()) << 20 | int64_t(rng() & 0xfffff);
    pos[b] = int64_t(rng() % 100000);
    for (int i = 0; i < k; ++i) {
      // half the drafts the target's argmax (long greedy runs), a few outside the vocabulary
      const float* pi = &p[size_t((int64_t(b) * (k + 1) + i) * V)];
      int64_t am = 0;
      for (int64_t v = 1; v < V; ++v) am = pi[v] > pi[am] ? v : am;
      draft[size_t(b * k + i)] = (rng() % 2) ? am : (rng() % 17 == 0 ? V + 3 : tok(rng));
    }
  }
  nd[0] = k;
  std::vector<int64_t> want(size_t(B) * (k + 1), -1);
  std::vector<int32_t> nwant(B);
  for (int b = 0; b < B; ++b) {
    const float* pb = &p[size_t(int64_t(b) * (k + 1) * V)];
    const float* qb = with_q ? &q[size_t(int64_t(b) * k * V)] : nullptr;
    nwant[b] = dk::spec_verify(&draft[size_t(b * k)], nd[b], [&](int i, int64_t v) { return pb[i * V + v]; },
                               [&](int i, int64_t v) { return qb[i * V + v]; }, with_q, V, uint64_t(seeds[b]),
                               uint64_t(pos[b]), greedy, &want[size_t(b * (k + 1))]);
  }
  // the vocabulary split over 1 CTA, the plan's count, and forced 2 / 5 / 64 slices (of 4 tokens and up, the
  // last one shorter), each against the CPU rule's sequential scan
  for (int64_t splits : {int64_t(1), dk::cuda::vocab_splits(B, V, 132), int64_t(2), int64_t(5),
                         int64_t(64)}) {
    std::vector<int64_t> out(size_t(B) * (k + 1), 77);
    std::vector<int32_t> n(B, -5);
    const size_t bytes = dk::cuda::rejection_sample_workspace_bytes(B, k, splits, greedy);
    std::vector<unsigned char> ws(bytes + 8, 0xA5);  // poisoned: a partial read before it is written fails
    void* wp = ws.data() + (8 - reinterpret_cast<uintptr_t>(ws.data()) % 8) % 8;
    const cudaError_t e = dk::cuda::rejection_sample(out.data(), n.data(), draft.data(), nd.data(),
                                                     with_q ? q.data() : nullptr, p.data(), seeds.data(), pos.data(),
                                                     B, k, V, greedy, splits, wp, bytes, nullptr, true);
    ++checks;
    if (e != cudaSuccess || out != want || n != nwant) {
      for (int b = 0; b < B; ++b)
        if (n[b] != nwant[b]) {
          printf("FAIL B=%d k=%d V=%ld q=%d greedy=%d ties=%d splits=%ld: request %d emitted %d, want %d\n", B, k,
                 long(V), with_q, greedy, ties, long(splits), b, n[b], nwant[b]);
          break;
        }
      if (n == nwant)
        printf("FAIL B=%d k=%d V=%ld q=%d greedy=%d splits=%ld: tokens differ (err %d)\n", B, k, long(V), with_q,
               greedy, long(splits), int(e));
      ++fails;
    }
  }
}

static void run_gumbel(int B, int64_t V, float scale, float masked, bool dup, int64_t pad) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const int64_t stride = V + pad;
  std::vector<float> x(size_t(B * stride), NAN);  // NaN padding: a read past a row is drawn
  for (int b = 0; b < B; ++b) {
    float* r = &x[size_t(b * stride)];
    for (int64_t v = 0; v < V; ++v) r[v] = (dup && v % 2) ? r[v - 1] : scale * nd(rng);
    for (int64_t v = 0; v < V; ++v)
      if (u(rng) < masked) r[v] = -INFINITY;
  }
  if (B > 3) {  // special rows
    float* r = &x[0];
    r[V / 2] = NAN;
    r[V - 1 - V / 4] = NAN;  // two NaNs (in different slices when split): the first one wins
    r = &x[size_t(stride)];
    r[V - 1] = INFINITY;
    r = &x[size_t(2 * stride)];
    for (int64_t v = 0; v < V; ++v) r[v] = -INFINITY;
  }
  std::vector<int64_t> seeds(B), pos(B), out(B, -7), want(B);
  for (int b = 0; b < B; ++b) {
    seeds[b] = int64_t(rng()) << 31 | int64_t(rng());
    pos[b] = int64_t(rng() % 1000000);
  }
  const uint32_t stream = uint32_t(rng() % 4);
  for (int b = 0; b < B; ++b)
    want[b] = dk::gumbel_argmax_row(&x[size_t(b * stride)], V, uint64_t(seeds[b]), uint64_t(pos[b]), stream);
  // the row split over 1 CTA, the plan's count, and forced 3 / 64 slices (special values in any slice)
  for (int64_t splits : {int64_t(1), dk::cuda::vocab_splits(B, V, 132), int64_t(3), int64_t(64)}) {
    std::fill(out.begin(), out.end(), -7);
    const size_t bytes = dk::cuda::gumbel_argmax_workspace_bytes(B, splits);
    std::vector<int64_t> ws(bytes / 8 + 1, int64_t(0x5A5A5A5A5A5A5A5A));  // poisoned
    const cudaError_t e = dk::cuda::gumbel_argmax(out.data(), x.data(), stride, seeds.data(), pos.data(), B, V, stream,
                                                  splits, ws.data(), ws.size() * 8, nullptr, true);
    ++checks;
    if (e != cudaSuccess || out != want) {
      for (int b = 0; b < B; ++b)
        if (out[b] != want[b]) {
          printf("FAIL gumbel B=%d V=%ld scale=%g masked=%g dup=%d splits=%ld: row %d token %ld, want %ld\n", B,
                 long(V), double(scale), double(masked), dup, long(splits), b, long(out[b]), long(want[b]));
          break;
        }
      ++fails;
    }
  }
}

static void run_argmax(int B, int64_t V, int levels) {
  const int64_t stride = V + 5;
  std::vector<float> x(size_t(B * stride), NAN);  // NaN padding past each row: must not be read
  for (int b = 0; b < B; ++b)
    for (int64_t v = 0; v < V; ++v) x[size_t(b * stride + v)] = levels ? float(int(rng() % levels)) : float(rng() % 100000) / 7.f;
  if (B > 4) {
    x[size_t(V / 2)] = NAN;                                   // row 0: two NaNs, the first wins
    x[size_t(V - 1)] = NAN;
    x[size_t(stride + V - 1)] = INFINITY;                      // row 1: +inf last
    for (int64_t v = 0; v < V; ++v) x[size_t(2 * stride + v)] = -INFINITY;  // row 2: all -inf
    for (int64_t v = 0; v < V; ++v) x[size_t(3 * stride + v)] = v % 2 ? 0.f : -0.f;  // row 3: +-0 ties
  }
  std::vector<int64_t> out(static_cast<size_t>(B), -7), want(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) want[size_t(b)] = dk::argmax_row_scalar(&x[size_t(b * stride)], V);
  const cudaError_t e = dk::cuda::argmax_rows(out.data(), x.data(), stride, B, V, nullptr);
  ++checks;
  if (e != cudaSuccess || out != want) {
    for (int b = 0; b < B; ++b)
      if (out[size_t(b)] != want[size_t(b)]) {
        printf("FAIL argmax B=%d V=%ld levels=%d: row %d token %ld, want %ld\n", B, long(V), levels, b,
               long(out[size_t(b)]), long(want[size_t(b)]));
        break;
      }
    ++fails;
  }
}

int main() {
  for (int64_t V : {1, 2, 31, 32, 33, 255, 256, 257, 4097, 49157})
    for (int levels : {0, 2, 5}) run_argmax(6, V, levels);
  for (int64_t V : {1, 3, 4, 5, 255, 1024, 1025, 4099, 50000})
    for (float scale : {0.f, 0.3f, 3.f, 30.f}) run_gumbel(6, V, scale, 0.f, false, V % 7);
  run_gumbel(5, 3000, 2.f, 0.98f, false, 0);
  run_gumbel(5, 3000, 2.f, 0.3f, true, 1);
  for (int64_t V : {7, 256, 1000})
    for (bool q : {true, false})
      for (bool g : {false, true}) run(9, 4, V, q, g, false);
  run(5, 3, 300, true, true, true);   // exact ties: the lowest token, as the CPU scan
  run(6, 3, 9000, false, true, false, true);  // greedy over rows with NaNs: the first NaN, in whichever slice
  run(6, 2, 300, true, true, true, true);
  run(5, 3, 300, false, false, true);
  run(3, 1, 40000, true, false, false);
  run(2, 4, 9000, false, false, false);  // the plan: 3 slices of 3000 (kMinSlice 4096)
  run(4, 2, 9000, true, true, false);
  run(1, 3, 5, true, false, false);      // fewer tokens than forced CTAs
  {  // a residual zero everywhere (q == p): the finish kernel samples p itself, as the CPU rule
    const int k = 2;
    const int64_t V = 300;
    std::vector<float> p(size_t(k + 1) * V), q(size_t(k) * V);
    for (int64_t v = 0; v < V; ++v) p[size_t(v)] = p[size_t(V + v)] = p[size_t(2 * V + v)] = float(1 + v % 5) / 900.f;
    for (int64_t v = 0; v < V; ++v) q[size_t(v)] = q[size_t(V + v)] = p[size_t(v)];
    std::vector<int64_t> d = {7, 8}, s = {123}, po = {40};
    std::vector<int32_t> nd = {2};
    // the draws accept x_0 with probability 1 (p == q); force a rejection with a draft outside the vocabulary
    d[0] = V + 1;
    std::vector<int64_t> want(k + 1, -1);
    const int nwant = dk::spec_verify(d.data(), 2, [&](int i, int64_t v) { return p[size_t(i * V + v)]; },
                                      [&](int i, int64_t v) { return q[size_t(i * V + v)]; }, true, V, 123, 40,
                                      false, want.data());
    for (int64_t splits : {1, 3}) {
      std::vector<int64_t> o(k + 1, 9);
      std::vector<int32_t> n(1);
      std::vector<int64_t> ws(64);
      dk::cuda::rejection_sample(o.data(), n.data(), d.data(), nd.data(), q.data(), p.data(), s.data(), po.data(), 1, k,
                                 V, false, splits, ws.data(), ws.size() * 8, nullptr, true);
      ++checks;
      if (o != want || n[0] != nwant) { printf("FAIL zero residual splits=%ld\n", long(splits)); ++fails; }
    }
  }
  // num_draft outside [0, k]: clamped (the CPU launcher rejects it)
  {
    std::vector<float> p(2 * 3 * 5, 0.2f);
    std::vector<int64_t> d = {1, 2, 3, 4}, s = {1, 2}, po = {0, 0}, o(6, 9), ws(64);
    std::vector<int32_t> nd = {-3, 7}, n(2);
    dk::cuda::rejection_sample(o.data(), n.data(), d.data(), nd.data(), nullptr, p.data(), s.data(), po.data(), 2, 2, 5,
                               true, 1, ws.data(), ws.size() * 8, nullptr);
    ++checks;
    if (n[0] != 1 || n[1] < 1 || n[1] > 3) { printf("FAIL clamp: %d %d\n", n[0], n[1]); ++fails; }
  }
  printf("test_spec: %d checks, %d failures, %ld launches\n", checks, fails, dk_emu::launches.load());
  return fails != 0;
}
