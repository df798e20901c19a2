// Emulator test of the per-layer CUDA kernels, run through their launchers (the dk::cuda:: functions of the
// .cuh files, which pick the variant and launch configuration as on the GPU) against the CPU kernels that
// csrc/cpu/ calls (their portable scalar paths: this file is built without -march) and float64 references:
//  - norm.cuh: rms_norm / fused_add_rms_norm, every variant plan() picks (16-byte vector accesses with 1, 2, 4
//    accesses a thread in registers or two passes; scalar; a lane group, a warp or a CTA per row), hidden sizes
//    odd and off the vector width (1 .. 16392), strided and misaligned rows, in place, grid-stride rows;
//  - rope.cuh: rotary_embedding, NeoX and GPT-J, vector and scalar, partial rotary dims, token / head strides,
//    GQA head counts, no key, positions past 2^31 / rot_dim (the cos_sin_cache mapped, not filled);
//  - activation.cuh: silu_and_mul, vector and scalar, d odd, strided / misaligned input, specials (+-inf, NaN,
//    -0, exp overflow), both grid-stride loops (rows in x, column chunks in y);
//  - gemm/splitk.cuh: splitk_reduce with and without row x column scales and bias, 1..16 splits.
// Outputs start as 0x7f bytes (an element never written fails); padding, guards before / after each buffer and
// head elements past rot_dim must keep their bits. Every variant must have run at least once (checked at the end).
// Sort (sampling/sort_desc.cuh): test_sort.cpp.
//   test_layers [--reverse|--random|--greedy] [--only norm|rope|silu|splitk] [--workers N]
#include "shim.h"
#include "emu_types.h"
#include "decodekit/activation.cuh"
#include "decodekit/gemm/splitk.cuh"
#include "decodekit/norm.cuh"
#include "decodekit/rope.cuh"

#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>

static std::mt19937 rng(20261206);
static int fails = 0, checks = 0;
static std::set<std::string> variants;           // kernel variants that ran
static std::map<std::string, double> max_units;  // worst error per (check, dtype) in units of the tolerance scale

// 64-byte aligned storage (so that an element offset decides a pointer's 16-byte alignment, in copies too).
template <class T> struct A64 {
  using value_type = T;
  A64() = default;
  template <class U> A64(const A64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const A64&) const { return true; }
};
template <class T> using Buf = std::vector<T, A64<T>>;
constexpr int G = 64;  // guard elements before and after every buffer's data

template <class T> uint32_t bits(const T& x) {
  if constexpr (sizeof(T) == 2) { uint16_t b; memcpy(&b, &x, 2); return b; }
  else { uint32_t b; memcpy(&b, &x, 4); return b; }
}
template <class T> T poison() { T x; memset(&x, 0x7f, sizeof x); return x; }
template <class T> T st(float f) { return dk::Conv<T>::store(f); }
template <class T> using C_ = typename Cpu<T>::type;
template <class T> C_<T>* cpu_ptr(Buf<T>& b, size_t off) { return reinterpret_cast<C_<T>*>(b.data() + off); }
// The spacing of T's values at |x| (one unit in the last place; subnormal spacing below the normal range).
template <class T> double spacing(double x) {
  const int mant = sizeof(T) == 4 ? 23 : std::is_same_v<T, __half> ? 10 : 7;
  const int emin = std::is_same_v<T, __half> ? -14 : -126;
  int e = 0;
  std::frexp(std::fabs(x), &e);
  return std::ldexp(1.0, std::max(e - 1, emin) - mant);
}
static bool want_run(const std::string& filter, const char* name) { return filter.empty() || filter == name; }

// Checks a buffer after a run. Output elements (out(i)): not the poison, and cmp(i) == "" (else the reason);
// every other element bit for bit as before (orig).
template <class T, class Out, class Cmp>
void check(const std::string& tag, const char* name, const Buf<T>& emu, const Buf<T>& orig, Out out, Cmp cmp) {
  ++checks;
  for (size_t i = 0; i < emu.size(); ++i) {
    std::string why;
    if (out(i)) why = bits(emu[i]) == bits(poison<T>()) ? "never written" : cmp(i);
    else if (bits(emu[i]) != bits(orig[i]))
      why = "written outside the outputs (was " + std::to_string(ld(orig[i])) + ", now " + std::to_string(ld(emu[i])) + ")";
    if (!why.empty()) {
      printf("FAIL %s: %s[%zu] %s\n", tag.c_str(), name, i, why.c_str());
      ++fails;
      return;
    }
  }
}
// "" when got is within tol units (spacing of T at want, plus abs) of want; NaN / inf must match exactly.
template <class T> std::string close(const char* what, float got, double want, double tol, double abs = 0) {
  char b[160];
  if (!std::isfinite(want) || !std::isfinite(got)) {
    if ((std::isnan(want) && std::isnan(got)) || double(got) == want) return "";
    snprintf(b, sizeof b, "= %.9g, %s %.9g", double(got), what, want);
    return b;
  }
  const double units = std::fabs(double(got) - want) / (spacing<T>(want) + abs);
  double& m = max_units[std::string(what) + " " + tname<T>()];
  m = std::max(m, units);
  if (units <= tol) return "";
  snprintf(b, sizeof b, "= %.9g, %s %.9g (%.2f units, tolerance %.2f)", double(got), what, want, units, tol);
  return b;
}
// "" when got and want are the same value bit for bit (any NaN equals any NaN: payloads differ across conversions)
template <class T> std::string same(float got, float want, const char* what = "cpu") {
  if ((std::isnan(got) && std::isnan(want)) || bits(got) == bits(want)) return "";
  char b[96];
  snprintf(b, sizeof b, "= %.9g, %s %.9g", double(got), what, double(want));
  return b;
}

// ---------------------------------------------------------------- rms_norm / fused_add_rms_norm
// rows of `hidden` elements, x rows x_pad (residual rows r_pad) elements apart beyond hidden; mis: the data of
// x (rms_norm: the input) starts that many elements past a 16-byte boundary; inplace: rms_norm's out == in.
template <class T>
void run_norm(bool fused, int64_t rows, int hidden, int x_pad = 0, int r_pad = 0, int mis = 0, bool inplace = false,
              unsigned cap = 0) {
  constexpr int V = dk::kVec16<T>;
  const int64_t xs = hidden + x_pad, rs = hidden + r_pad;
  const float eps = 1e-6f;
  const bool vec = hidden % V == 0 && xs % V == 0 && mis == 0 && (!fused || rs % V == 0);
  const auto plan = dk::cuda::norm_detail::plan(rows, vec ? hidden / V : hidden, vec);
  char tag[240];
  snprintf(tag, sizeof tag, "%s %s rows=%ld hidden=%d x_stride=%ld%s mis=%d%s cap=%u [%s nv=%d block %ux%u]",
           fused ? "fused_add_rms_norm" : "rms_norm", tname<T>(), long(rows), hidden, long(xs),
           fused ? (" r_stride=" + std::to_string(rs)).c_str() : "", mis, inplace ? " in-place" : "", cap,
           vec ? "vec" : "scalar", plan.nv, plan.block.x, plan.block.y);
  variants.insert(std::string(fused ? "fused " : "rms ") + (vec ? "vec" : "scalar") + " nv=" + std::to_string(plan.nv) +
                  (plan.block.x < 32 ? " lanes" : plan.block.x == 32 ? " warp" : " cta"));
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t xo = G + mis, ro = G;
  Buf<T> x(xo + rows * xs + G, st<T>(NAN)), r(fused ? ro + rows * rs + G : 0, st<T>(NAN));  // NaN padding: a read shows
  Buf<T> w(G + hidden + G, st<T>(NAN)), out(inplace || fused ? 0 : G + rows * hidden + G, poison<T>());
  for (int i = 0; i < hidden; ++i) w[G + i] = st<T>(i == hidden - 1 ? -1.5f : 1.f + 0.5f * nd(rng));
  for (int64_t row = 0; row < rows; ++row)
    for (int i = 0; i < hidden; ++i) {
      // row 0: a spike at the last element (the vector tail / last access), row 1 at the first, row 2 zero,
      // row 3 large (fp16: squares past its range, the sums fp32), later rows a spike somewhere
      float v = nd(rng);
      if (row == 2) v = 0.f;
      if (row == 3) v *= 250.f;
      if ((row == 0 && i == hidden - 1) || (row == 1 && i == 0) || (row > 3 && i == int((row * 7919) % hidden)))
        v = row == 1 ? -40.f : 40.f;
      x[xo + row * xs + i] = st<T>(v);
      if (fused) r[ro + row * rs + i] = st<T>(row == 2 ? 0.f : nd(rng));
    }
  // float64 reference (fused: z = x + residual)
  std::vector<double> want(size_t(rows * hidden)), zsum(fused ? size_t(rows * hidden) : 0);
  for (int64_t row = 0; row < rows; ++row) {
    double ss = 0;
    for (int i = 0; i < hidden; ++i) {
      double z = ld(x[xo + row * xs + i]);
      if (fused) z += ld(r[ro + row * rs + i]), zsum[size_t(row * hidden + i)] = z;
      want[size_t(row * hidden + i)] = z;
      ss += z * z;
    }
    const double inv = 1.0 / std::sqrt(ss / hidden + double(eps));
    for (int i = 0; i < hidden; ++i) want[size_t(row * hidden + i)] *= inv * double(ld(w[G + i]));
  }
  const Buf<T> x0 = x, r0 = r, w0 = w, out0 = out;
  Buf<T> xc = x, rc = r, outc = out;
  cudaError_t e;
  if (cap) dk_emu::grid_cap_x = cap;
  if (fused) {
    e = dk::cuda::fused_add_rms_norm<T>(x.data() + xo, xs, r.data() + ro, rs, w.data() + G, rows, hidden, eps, nullptr);
    dk::cpu::fused_add_rms_norm(cpu_ptr(xc, xo), xs, cpu_ptr(rc, ro), rs, cpu_ptr(w, G), rows, hidden, eps);
  } else {
    T* o = inplace ? x.data() + xo : out.data() + G;
    e = dk::cuda::rms_norm<T>(o, x.data() + xo, xs, w.data() + G, rows, hidden, eps, nullptr);
    auto* oc = inplace ? cpu_ptr(xc, xo) : cpu_ptr(outc, G);
    dk::cpu::rms_norm(oc, inplace ? oc : cpu_ptr(xc, xo), xs, cpu_ptr(w, G), rows, hidden, eps);
  }
  dk_emu::grid_cap_x = 1u << 30;
  ++checks;
  if (e != cudaSuccess) { printf("FAIL %s: launcher returned %d\n", tag, int(e)); ++fails; }
  // 16-bit: within one unit of T of the float64 value and of the CPU kernel (whose fp32 sums run in another
  // order); fp32: a few units of the float64 value (the GPU's sums are split over threads, and accurate), and
  // the CPU kernel's sequential sum of squares drifts with hidden (19 units at 8192)
  const double tol = sizeof(T) == 4 ? 6.0 : 1.0, tol_cpu = sizeof(T) == 4 ? 8.0 + hidden / 256.0 : 1.0;
  auto row_of = [](size_t i, size_t off, int64_t stride, int h, int64_t n, int64_t& rr, int& c) {
    if (i < off) return false;
    rr = int64_t(i - off) / stride;
    c = int(int64_t(i - off) % stride);
    return rr < n && c < h;
  };
  auto normed = [&](const Buf<T>* emu, const Buf<T>* cpu, size_t off, int64_t stride) {
    return [&, emu, cpu, off, stride](size_t i) {
      int64_t rr; int c;
      row_of(i, off, stride, hidden, rows, rr, c);
      std::string s = close<T>("float64", ld((*emu)[i]), want[size_t(rr * hidden + c)], tol);
      return s.empty() ? close<T>("cpu", ld((*emu)[i]), ld((*cpu)[i]), tol_cpu) : s;
    };
  };
  auto in_rows = [&](size_t off, int64_t stride) {
    return [&, off, stride](size_t i) { int64_t rr; int c; return row_of(i, off, stride, hidden, rows, rr, c); };
  };
  check(tag, "weight", w, w0, [](size_t) { return false; }, [](size_t) { return std::string(); });
  if (fused) {
    check(tag, "x", x, x0, in_rows(xo, xs), normed(&x, &xc, xo, xs));
    check(tag, "residual", r, r0, in_rows(ro, rs), [&](size_t i) {  // round(x + residual): exact
      int64_t rr; int c;
      row_of(i, ro, rs, hidden, rows, rr, c);
      std::string s = same<T>(ld(r[i]), ld(rc[i]));
      return s.empty() ? close<T>("float64", ld(r[i]), zsum[size_t(rr * hidden + c)], 0.5) : s;
    });
  } else if (inplace) {
    check(tag, "x", x, x0, in_rows(xo, xs), normed(&x, &xc, xo, xs));
  } else {
    check(tag, "in", x, x0, [](size_t) { return false; }, [](size_t) { return std::string(); });
    check(tag, "out", out, out0, in_rows(G, hidden), normed(&out, &outc, G, hidden));
  }
}

template <class T> void norm_cases() {
  constexpr int V = dk::kVec16<T>;
  // the sizes of the brief, then each plan branch: a lane group (nvec <= 32: 1 access), a warp (2, 4 accesses),
  // a CTA with 1 / 2 / 4 accesses a thread, 4 with > 256 threads, two passes (vector: nvec > 2048; scalar: any
  // hidden off the vector width, a lane group to 512 threads)
  for (int h : {1, 7, 64, 100, 129, 576, 769, 4095, 8192, 12289, 3 * V, 32 * V, 40 * V, 100 * V, 200 * V, 400 * V,
                1000 * V, 1600 * V, 2048 * V, 2049 * V}) {
    const int64_t rows = h <= 128 ? 37 : h <= 4096 ? 5 : 3;
    for (bool fused : {false, true}) {
      run_norm<T>(fused, rows, h);                               // contiguous
      run_norm<T>(fused, rows, h, 2 * V, fused ? 5 * V : 0);     // strided rows (vector path kept)
      if (h % V == 0) run_norm<T>(fused, 2, h, 3, 1);            // strides off the vector width: scalar
      if (h % V == 0 && h <= 4096) run_norm<T>(fused, 2, h, 0, 0, 1);  // misaligned rows: scalar
    }
  }
  run_norm<T>(false, 6, 64 * V, 0, 0, 0, true);        // in place, vector
  run_norm<T>(false, 3, 2049 * V, 0, 0, 0, true);      // in place, two passes
  run_norm<T>(false, 40, 5, 0, 0, 0, true);            // in place, scalar lane groups
  // grid-stride over rows (more row groups than CTAs), partial last row group
  run_norm<T>(false, 301, 8 * V, V, 0, 0, false, 2);   // 16 rows a CTA (8 lanes each)
  run_norm<T>(true, 77, 64 * V, 0, V, 0, false, 3);    // a warp a row, 4 rows a CTA
  run_norm<T>(true, 9, 300 * V, 0, 0, 0, false, 2);    // a CTA a row
  run_norm<T>(false, 7, 2049 * V, 0, 0, 0, false, 3);  // two passes
  run_norm<T>(true, 70, 33, 2, 1, 0, false, 1);        // scalar, one CTA for everything
}

// ---------------------------------------------------------------- rotary_embedding
struct RopeCase {
  bool neox;
  int64_t tokens;
  int hq, hk;  // hk < 0: key == nullptr
  int head, rot;
  int q_tok_pad = 0, q_head_pad = 0, k_tok_pad = 0, k_head_pad = 0, mis = 0;
  int64_t max_pos = 4096, big_pos = 0;  // big_pos > 0: this position (and its neighbours) in the batch
  unsigned cap = 0;
};

template <class T> void run_rope(const RopeCase& c) {
  constexpr int V = dk::kVec16<T>;
  const int half = c.rot / 2;
  const bool has_k = c.hk >= 0;
  const int hk = has_k ? c.hk : 0;
  const int64_t qhs = c.head + c.q_head_pad, qts = c.hq * qhs + c.q_tok_pad;
  const int64_t khs = c.head + c.k_head_pad, kts = hk * khs + c.k_tok_pad;
  bool vec = (c.neox ? half % V == 0 : c.rot % V == 0) && c.mis == 0 && qts % V == 0 && qhs % V == 0;
  if (has_k) vec = vec && kts % V == 0 && khs % V == 0;
  char tag[260];
  snprintf(tag, sizeof tag, "rope %s %s T=%ld hq=%d hk=%d head=%d rot=%d q strides %ld/%ld k strides %ld/%ld mis=%d "
           "max_pos=%ld big=%ld cap=%u [%s]", c.neox ? "neox" : "gptj", tname<T>(), long(c.tokens), c.hq, c.hk, c.head,
           c.rot, long(qts), long(qhs), long(kts), long(khs), c.mis, long(c.max_pos), long(c.big_pos), c.cap,
           vec ? "vec" : "scalar");
  variants.insert(std::string("rope ") + (c.neox ? "neox " : "gptj ") + (vec ? "vec" : "scalar"));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<int64_t> pos(size_t(c.tokens));
  for (auto& p : pos) p = int64_t(rng() % uint64_t(c.max_pos));
  pos[0] = 0;
  if (c.tokens > 1) pos[size_t(c.tokens - 1)] = c.max_pos - 1;
  if (c.tokens > 3) pos[2] = pos[1];  // a repeated position
  if (c.big_pos) for (int64_t t = 1; t < c.tokens; t += 2) pos[size_t(t)] = c.big_pos + (t % 5) - 2;
  // cos_sin_cache [max_pos, rot]: only the rows of the batch's positions are written (NaN elsewhere, or never
  // touched zero pages when mapped); past 1 GiB it is mapped, not allocated (positions past 2^31 / rot_dim)
  const size_t cache_bytes = size_t(c.max_pos) * c.rot * sizeof(float);
  float* cache = nullptr;
  std::vector<float> cache_vec;
  const bool mapped = cache_bytes > (size_t(1) << 30);
  if (mapped) {
    void* m = mmap(nullptr, cache_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) { printf("note: %s skipped (no %zu-byte mapping)\n", tag, cache_bytes); return; }
    cache = static_cast<float*>(m);
  } else {
    cache_vec.assign(size_t(c.max_pos) * c.rot, NAN);
    cache = cache_vec.data();
  }
  for (int64_t p : pos)
    for (int j = 0; j < half; ++j) {
      const double a = double(p) * std::pow(10000.0, -2.0 * j / c.rot);
      cache[size_t(p) * c.rot + j] = float(std::cos(a));
      cache[size_t(p) * c.rot + half + j] = float(std::sin(a));
    }
  const size_t qo = G + c.mis, ko = G;
  Buf<T> q(qo + c.tokens * qts + G, st<T>(NAN)), k(has_k ? ko + c.tokens * kts + G : 0, st<T>(NAN));
  auto fill = [&](Buf<T>& b, size_t off, int heads, int64_t ts, int64_t hs) {
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < c.head; ++i) b[off + t * ts + h * hs + i] = st<T>(nd(rng));
  };
  fill(q, qo, c.hq, qts, qhs);
  if (has_k) fill(k, ko, hk, kts, khs);
  const Buf<T> q0 = q, k0 = k;
  Buf<T> qc = q, kc = k;
  if (c.cap) dk_emu::grid_cap_x = c.cap;
  // key == nullptr: num_kv_heads is passed anyway (the launcher must ignore it)
  const cudaError_t e = dk::cuda::rotary_embedding<T>(pos.data(), q.data() + qo, qts, qhs, c.hq,
                                                      has_k ? k.data() + ko : nullptr, kts, khs, has_k ? hk : 3, cache,
                                                      c.rot, c.head, c.neox, c.tokens, nullptr);
  dk_emu::grid_cap_x = 1u << 30;
  dk::cpu::rotary_embedding(pos.data(), cpu_ptr(qc, qo), qts, qhs, c.hq, has_k ? cpu_ptr(kc, ko) : nullptr, kts, khs,
                            hk, cache, c.rot, c.neox, c.tokens);
  ++checks;
  if (e != cudaSuccess) { printf("FAIL %s: launcher returned %d\n", tag, int(e)); ++fails; }
  auto verify = [&](const char* name, const Buf<T>& emu, const Buf<T>& cpu, const Buf<T>& orig, size_t off, int heads,
                    int64_t ts, int64_t hs) {
    // element i of the buffer -> (token, head, index in head); outputs: index < rot
    auto where = [=](size_t i, int64_t& t, int& h, int& d) {
      if (i < off) return false;
      t = int64_t(i - off) / ts;
      const int64_t in_tok = int64_t(i - off) % ts;
      h = int(in_tok / hs);
      d = int(in_tok % hs);
      return t < c.tokens && h < heads && d < c.rot;
    };
    check(tag, name, emu, orig, [&](size_t i) { int64_t t; int h, d; return where(i, t, h, d); }, [&](size_t i) {
      int64_t t; int h, d;
      where(i, t, h, d);
      std::string s = same<T>(ld(emu[i]), ld(cpu[i]));  // the same fp32 arithmetic as the CPU kernel
      if (!s.empty()) return s;
      const int j = c.neox ? d % half : d / 2;
      const bool second = c.neox ? d >= half : d % 2 == 1;
      const size_t base = off + t * ts + h * hs;
      const double xv = ld(orig[base + (c.neox ? j : 2 * j)]), yv = ld(orig[base + (c.neox ? j + half : 2 * j + 1)]);
      const float* cs = cache + size_t(pos[size_t(t)]) * c.rot;
      const double want = second ? yv * cs[j] + xv * cs[half + j] : xv * cs[j] - yv * cs[half + j];
      return close<T>("float64", ld(emu[i]), want, 1.0, std::ldexp(std::fabs(xv) + std::fabs(yv), -22));
    });
  };
  verify("query", q, qc, q0, qo, c.hq, qts, qhs);
  if (has_k) verify("key", k, kc, k0, ko, hk, kts, khs);
  if (mapped) munmap(cache, cache_bytes);
}

template <class T> void rope_cases() {
  constexpr int V = dk::kVec16<T>;
  for (bool neox : {true, false}) {
    run_rope<T>({neox, 9, 8, 2, 128, 128});                                // GQA 4:1, [T, H * D]
    run_rope<T>({neox, 5, 4, 4, 128, 128, 0, V, 3 * V, 2 * V});            // [T, H, D] head strides, vector
    run_rope<T>({neox, 7, 5, 1, 80, 32});                                  // partial rotary (Phi-2 style)
    run_rope<T>({neox, 6, 3, 1, 64, 24});                                  // half = 12: bf16 / fp16 scalar, fp32 vec
    run_rope<T>({neox, 4, 2, 2, 16, 12});                                  // rot 12: GPT-J bf16 / fp16 scalar
    run_rope<T>({neox, 4, 3, -1, 64, 64});                                 // no key
    run_rope<T>({neox, 4, 3, -1, 72, 40, 0, 8});                           // no key, partial, head stride
    run_rope<T>({neox, 6, 4, 2, 64, 64, 3, 0, 1, 0});                      // token strides off the vector width
    run_rope<T>({neox, 5, 2, 2, 64, 64, 0, 1, 0, 2});                      // head strides off the vector width
    run_rope<T>({neox, 5, 4, 2, 128, 128, 0, 0, 0, 0, 1});                 // misaligned query: scalar
    run_rope<T>({neox, 3, 32, 8, 256, 256});                               // items > 512 threads
    run_rope<T>({neox, 3, 3, 1, 2, 2});                                    // the smallest head
    run_rope<T>({neox, 3, 1, 1, 10, 2, 1, 0, 0, 3});                       // rot 2 of 10, odd strides
    run_rope<T>({neox, 50, 4, 1, 64, 64, 0, 0, 0, 0, 0, 4096, 0, 3});      // grid-stride over tokens
    run_rope<T>({neox, 40, 2, 2, 32, 18, 2, 0, 0, 0, 0, 4096, 0, 1});      // one CTA for every token, scalar
    // positions with pos * rot_dim past 2^31 and 2^32 (a 32-bit offset would read another, unfilled row)
    run_rope<T>({neox, 6, 2, 1, 128, 128, 0, 0, 0, 0, 0, (int64_t(1) << 25) + 16, (int64_t(1) << 25) + 8});
  }
}

// ---------------------------------------------------------------- silu_and_mul
template <class T> void run_silu(int64_t rows, int64_t d, int64_t pad = 0, int mis = 0, unsigned capx = 0, unsigned capy = 0) {
  constexpr int V = dk::kVec16<T>;
  const int64_t is = 2 * d + pad;
  const bool vec = d % V == 0 && is % V == 0 && mis == 0;
  int threads = dk::cuda::act_detail::kThreads;  // the launcher's choice, for the tag and the tally
  const int64_t nvec = vec ? d / V : d;
  while (threads > 64 && rows * dk::cuda::ceil_div(nvec, threads) < 2 * 132) threads /= 2;
  char tag[200];
  snprintf(tag, sizeof tag, "silu_and_mul %s rows=%ld d=%ld in_stride=%ld mis=%d cap=%u/%u [%s %d threads, %ld chunks]",
           tname<T>(), long(rows), long(d), long(is), mis, capx, capy, vec ? "vec" : "scalar", threads,
           long(dk::cuda::ceil_div(nvec, threads)));
  variants.insert(std::string("silu ") + (vec ? "vec " : "scalar ") + std::to_string(threads));
  std::normal_distribution<float> nd(0.f, 3.f);
  const size_t io = G + mis;
  Buf<T> in(io + rows * is + G, st<T>(NAN)), out(G + rows * d + G, poison<T>());
  const float specials[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, -100.f, 100.f, -20.f, 1e-4f, -88.5f};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < 2 * d; ++i) {
      float v = nd(rng);
      if (r == 1 && i < d) v = specials[i % 10];       // gates: the specials
      if (r == 2 && i >= d) v = specials[(i - d) % 10];  // ups: the specials
      in[io + r * is + i] = st<T>(v);
    }
  const Buf<T> in0 = in, out0 = out;
  Buf<T> outc = out;
  dk_emu::grid_cap_x = capx ? capx : 1u << 30;
  dk_emu::grid_cap_y = capy ? capy : 1u << 30;
  const cudaError_t e = dk::cuda::silu_and_mul<T>(out.data() + G, in.data() + io, is, rows, d, nullptr);
  dk_emu::grid_cap_x = dk_emu::grid_cap_y = 1u << 30;
  dk::cpu::silu_and_mul(cpu_ptr(outc, G), cpu_ptr(in, io), is, rows, d);
  ++checks;
  if (e != cudaSuccess) { printf("FAIL %s: launcher returned %d\n", tag, int(e)); ++fails; }
  check(tag, "in", in, in0, [](size_t) { return false; }, [](size_t) { return std::string(); });
  check(tag, "out", out, out0, [&](size_t i) { return i >= G && i < G + size_t(rows * d); }, [&](size_t i) {
    std::string s = same<T>(ld(out[i]), ld(outc[i]));
    if (!s.empty()) return s;
    const int64_t r = int64_t(i - G) / d, c = int64_t(i - G) % d;
    const double g = ld(in[io + r * is + c]), u = ld(in[io + r * is + d + c]);
    return close<T>("float64", ld(out[i]), g / (1.0 + std::exp(-g)) * u, sizeof(T) == 4 ? 4.0 : 1.0, 0x1p-126);
  });
}

template <class T> void silu_cases() {
  constexpr int V = dk::kVec16<T>;
  for (int64_t d : {int64_t(1), int64_t(7), int64_t(V), int64_t(64), int64_t(4095), int64_t(11008)}) {
    run_silu<T>(3, d);
    run_silu<T>(2, d, 2 * V);  // strided rows, vector kept when d is a multiple of V
    run_silu<T>(2, d, 1);      // odd row stride: scalar
  }
  run_silu<T>(2, 14336, 0, 1);        // misaligned input: scalar
  run_silu<T>(300, 24);               // many rows: 256 threads
  run_silu<T>(300, 7);                // the same, scalar
  run_silu<T>(200, 200 * V);          // 2 chunks of 128 a row: 128 threads
  run_silu<T>(17, 40 * V, V, 0, 4);   // grid-stride over rows
  run_silu<T>(3, 4096, 0, 0, 2, 3);   // grid-stride over rows and column chunks
  run_silu<T>(2, 4097, 6, 0, 0, 2);   // scalar, column chunks strided
}

// ---------------------------------------------------------------- splitk_reduce
template <class T> void run_splitk(int64_t M, int64_t N, int splits, bool scales, bool with_bias, unsigned cap = 0) {
  char tag[160];
  snprintf(tag, sizeof tag, "splitk_reduce %s M=%ld N=%ld splits=%d scales=%d bias=%d cap=%u", tname<T>(), long(M),
           long(N), splits, scales, with_bias, cap);
  variants.insert(std::string("splitk") + (scales ? " scales" : "") + (with_bias ? " bias" : ""));
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t MN = size_t(M * N);
  std::vector<float> partial(size_t(splits) * MN + 16, NAN), rs(size_t(M) + 4, NAN), cs(size_t(N) + 4, NAN);
  for (size_t i = 0; i < size_t(splits) * MN; ++i) partial[i] = 8.f * nd(rng);
  for (int64_t m = 0; m < M; ++m) rs[size_t(m)] = std::ldexp(1.f + nd(rng) * 0.1f, int(m % 7) - 3);
  for (int64_t n = 0; n < N; ++n) cs[size_t(n)] = 0.01f * (1.f + 0.3f * nd(rng));
  Buf<T> bias(size_t(N) + G, st<T>(NAN)), out(G + MN + G, poison<T>());
  for (int64_t n = 0; n < N; ++n) bias[size_t(n)] = st<T>(nd(rng));
  const Buf<T> out0 = out;
  const std::vector<float> partial0 = partial;
  if (cap) dk_emu::grid_cap_x = cap;
  const cudaError_t e = dk::cuda::splitk_reduce<T>(out.data() + G, partial.data(), scales ? rs.data() : nullptr,
                                                   scales ? cs.data() : nullptr, with_bias ? bias.data() : nullptr, M,
                                                   N, splits, nullptr);
  dk_emu::grid_cap_x = 1u << 30;
  ++checks;
  if (e != cudaSuccess || memcmp(partial.data(), partial0.data(), partial.size() * 4) != 0) {
    printf("FAIL %s: launcher returned %d or partial changed\n", tag, int(e));
    ++fails;
  }
  check(tag, "out", out, out0, [&](size_t i) { return i >= G && i < G + MN; }, [&](size_t i) {
    const size_t j = i - G;
    const int64_t m = int64_t(j) / N, n = int64_t(j) % N;
    // the rule (fp8_gemm.h's epilogue, int4's without scales): fp32 sums in split order, * a_scale * w_scale,
    // + bias, one rounding; float64: the same without rounding
    float v = partial[j];
    double d = partial[j], mag = std::fabs(partial[j]);
    for (int s = 1; s < splits; ++s) v += partial[size_t(s) * MN + j], d += partial[size_t(s) * MN + j],
                                     mag += std::fabs(partial[size_t(s) * MN + j]);
    if (scales) v = v * rs[size_t(m)] * cs[size_t(n)], d *= double(rs[size_t(m)]) * cs[size_t(n)],
                mag *= std::fabs(double(rs[size_t(m)]) * cs[size_t(n)]);
    if (with_bias) v += ld(bias[size_t(n)]), d += ld(bias[size_t(n)]), mag += std::fabs(ld(bias[size_t(n)]));
    std::string s = same<T>(ld(out[i]), ld(st<T>(v)), "rule");
    return s.empty() ? close<T>("float64", ld(out[i]), d, 1.0, std::ldexp(mag, -23) * (splits + 3)) : s;
  });
}

template <class T> void splitk_cases() {
  run_splitk<T>(1, 1, 1, false, false);
  run_splitk<T>(1, 1, 2, true, true);
  run_splitk<T>(3, 577, 3, true, true);
  run_splitk<T>(17, 4099, 16, false, true);
  run_splitk<T>(5, 64, 4, true, false);
  run_splitk<T>(9, 1001, 7, false, false);
  run_splitk<T>(2, 3000, 5, true, true, 7);  // grid-stride
  run_splitk<T>(64, 256, 2, false, true, 1);  // one CTA for everything
}

template <class T> void all(const std::string& only) {
  if (want_run(only, "norm")) norm_cases<T>();
  if (want_run(only, "rope")) rope_cases<T>();
  if (want_run(only, "silu")) silu_cases<T>();
  if (want_run(only, "splitk")) splitk_cases<T>();
}

int main(int argc, char** argv) {
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (dk_emu::parse_common_arg(argc, argv, i)) continue;
    if (a == "--only" && i + 1 < argc) only = argv[++i];
    else { fprintf(stderr, "usage: test_layers [--reverse|--random|--greedy] [--only norm|rope|silu|splitk] [--workers N]\n"); return 2; }
  }
  all<float>(only);
  all<__half>(only);
  all<__nv_bfloat16>(only);
  // every variant the launchers can pick ran at least once (the case lists above must keep reaching them)
  std::vector<std::string> need;
  if (want_run(only, "norm"))
    for (const char* k : {"rms ", "fused "})
      for (const char* v : {"vec nv=1 lanes", "vec nv=1 warp", "vec nv=2 warp", "vec nv=4 warp", "vec nv=1 cta",
                            "vec nv=2 cta", "vec nv=4 cta", "vec nv=0 cta", "scalar nv=0 lanes", "scalar nv=0 warp",
                            "scalar nv=0 cta"})
        need.push_back(std::string(k) + v);
  if (want_run(only, "rope"))
    for (const char* v : {"rope neox vec", "rope neox scalar", "rope gptj vec", "rope gptj scalar"}) need.push_back(v);
  if (want_run(only, "silu"))
    for (const char* v : {"silu vec 64", "silu vec 128", "silu vec 256", "silu scalar 64", "silu scalar 256"})
      need.push_back(v);
  if (want_run(only, "splitk"))
    for (const char* v : {"splitk", "splitk scales", "splitk bias", "splitk scales bias"}) need.push_back(v);
  for (const std::string& v : need) {
    ++checks;
    if (!variants.count(v)) { printf("FAIL variant never ran: %s\n", v.c_str()); ++fails; }
  }
  for (const auto& [k, v] : max_units) printf("  max error %-14s %.3f units\n", k.c_str(), v);
  printf("test_layers: %d checks, %d failures, %ld launches, %zu variants\n", checks, fails, dk_emu::launches.load(),
         variants.size());
  return fails != 0;
}
