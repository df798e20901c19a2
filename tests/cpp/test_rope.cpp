// CPU rotary_embedding (include/decodekit/rope.h) vs. a double-precision reference:
// NeoX and GPT-J pairing, full and partial rotary, q-only, and three layouts (contiguous,
// a q/k slice of a fused [tokens, (Hq + 2 Hk) * D] qkv buffer, padded head stride).
//
// Tolerance: the kernel computes x' = x c - y s (and y' = y c + x s) in fp32 from the fp32
// cache values c, s, then rounds once to T. With or without FMA contraction, the fp32
// error is <= 2u (|x c| + |y s|) + u |x'| <= 3u (|x c| + |y s|)  (u = 2^-24); the scale is
// |x c| + |y s| rather than |x'| because the subtraction can cancel. Then one rounding to
// T: |got - want| <= eps_T |want| + tiny_T + 3u (|x c| + |y s|)  (store_tol in check.h).
// Elements outside the rotated part (past rot_dim, the v part, padding) must be bitwise
// unchanged.
#include <map>
#include <vector>

#include "check.h"
#include "decodekit/rope.h"

using namespace dk_test;

namespace {

constexpr int kMaxPos = 4096;

struct Config {
  int hq, hk, head, rot;
  bool neox;
  bool with_key;
};

// cos/sin table [kMaxPos, rot]: cos of the rot/2 frequencies, then sin (base 10000).
// Built once per rot.
const std::vector<float>& make_cache(int rot) {
  static std::map<int, std::vector<float>> tables;
  std::vector<float>& c = tables[rot];
  if (!c.empty()) return c;
  c.resize(size_t(kMaxPos) * rot);
  for (int p = 0; p < kMaxPos; ++p)
    for (int i = 0; i < rot / 2; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / rot);
      c[size_t(p) * rot + i] = float(std::cos(a));
      c[size_t(p) * rot + rot / 2 + i] = float(std::sin(a));
    }
  return c;
}

enum Layout { kContiguous, kFusedQkv, kPaddedHeads };
const char* layout_name(Layout l) {
  return l == kContiguous ? "contiguous" : l == kFusedQkv ? "fused-qkv" : "padded-heads";
}

double g_worst = 0;

template <class T>
void test_rope(Rng& rng, const Config& c, int64_t tokens, Layout layout) {
  const char* tn = TypeInfo<T>::name;
  // Layout: one buffer holds q then k per token; strides in elements.
  const int64_t head_stride = layout == kPaddedHeads ? c.head + 8 : c.head;
  const int64_t q_size = c.hq * head_stride, k_size = c.hk * head_stride;
  const int64_t v_size = layout == kFusedQkv ? c.hk * head_stride : 0;  // never touched
  const int64_t token_stride = q_size + k_size + v_size + (layout == kPaddedHeads ? 5 : 0);
  std::vector<T> buf(size_t(tokens * token_stride) + 16, poison<T>());
  // Fill every head element (incl. past rot_dim) with data; padding stays NaN.
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < c.hq + c.hk + (layout == kFusedQkv ? c.hk : 0); ++h)
      for (int d = 0; d < c.head; ++d) {
        const int64_t at = t * token_stride + h * head_stride + d;
        buf[at] = from_d<T>(2.0 * rng.normal());
      }
  std::vector<int64_t> pos(tokens);
  for (int64_t t = 0; t < tokens; ++t) pos[t] = t == 0 ? kMaxPos - 1 : t == 1 ? 0 : int64_t(rng.u32() % kMaxPos);
  const std::vector<float>& cache = make_cache(c.rot);
  const std::vector<T> before = buf;

  T* q = buf.data();
  T* k = c.with_key ? buf.data() + q_size : nullptr;
  dk::cpu::rotary_embedding<T>(pos.data(), q, token_stride, head_stride, c.hq, k, token_stride, head_stride, c.hk,
                               cache.data(), c.rot, c.neox, tokens);

  // Which elements rotate: the first rot elements of every q head (and k head with key).
  std::vector<char> rotated(buf.size(), 0);
  const int half = c.rot / 2;
  const double rel32 = 3 * 0x1.0p-24;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* cs = cache.data() + pos[t] * c.rot;
    const int nheads = c.hq + (c.with_key ? c.hk : 0);
    for (int h = 0; h < nheads; ++h) {
      const int64_t base = t * token_stride + h * head_stride;  // k heads follow q heads
      for (int i = 0; i < half; ++i) {
        const int64_t ix = base + (c.neox ? i : 2 * i), iy = base + (c.neox ? i + half : 2 * i + 1);
        rotated[ix] = rotated[iy] = 1;
        const double x = to_d(before[ix]), y = to_d(before[iy]), co = cs[i], si = cs[half + i];
        const double want_x = x * co - y * si, want_y = y * co + x * si;
        const double tol_x = store_tol<T>(want_x, rel32, std::fabs(x * co) + std::fabs(y * si));
        const double tol_y = store_tol<T>(want_y, rel32, std::fabs(y * co) + std::fabs(x * si));
        const double got_x = to_d(buf[ix]), got_y = to_d(buf[iy]);
        g_worst = std::max({g_worst, std::fabs(got_x - want_x) / tol_x, std::fabs(got_y - want_y) / tol_y});
        CHECK_NEAR(got_x, want_x, tol_x) << "rope" << tn << (c.neox ? "neox" : "gptj") << layout_name(layout)
                                         << "tokens" << tokens << "heads" << c.hq << c.hk << "head" << c.head << "rot"
                                         << c.rot << "token" << t << "head" << h << "pair" << i << "pos" << pos[t];
        CHECK_NEAR(got_y, want_y, tol_y) << "rope" << tn << (c.neox ? "neox" : "gptj") << layout_name(layout)
                                         << "tokens" << tokens << "token" << t << "head" << h << "pair" << i;
      }
    }
  }
  long long bad = 0;
  for (size_t j = 0; j < buf.size(); ++j)
    if (!rotated[j]) bad += !same_bits(buf[j], before[j]);
  CHECK(bad == 0) << "rope" << tn << layout_name(layout) << "head" << c.head << "rot" << c.rot << ":" << bad
                  << "elements outside the rotary part changed";
}

template <class T>
void run_type(Rng& rng) {
  const Config configs[] = {
      {32, 8, 128, 128, true, true},   // Llama-3 8B
      {32, 8, 128, 128, false, true},
      {9, 3, 64, 64, true, true},      // SmolLM2-135M
      {9, 3, 64, 64, false, true},
      {4, 2, 128, 64, true, true},     // partial rotary (rot = head / 2)
      {5, 1, 96, 32, false, true},     // partial GPT-J style
      {6, 2, 80, 48, true, true},      // rot/2 = 24, head not a power of two
      {3, 1, 64, 2, false, true},      // a single pair per head
      {7, 0, 64, 64, true, false},     // query only (key = nullptr)
  };
  for (const Config& c : configs)
    for (int64_t tokens : {1, 7, 83})
      for (Layout l : {kContiguous, kFusedQkv, kPaddedHeads}) test_rope<T>(rng, c, tokens, l);
  // num_tokens = 0 is a no-op
  test_rope<T>(rng, configs[0], 0, kContiguous);
  std::printf("%s: max |err|/tol %.3f\n", TypeInfo<T>::name, g_worst);
  g_worst = 0;
}

// The shared per-pair helpers (used by the CUDA kernels): rope_pair visits every element
// of [0, rot) exactly once, in the documented pairing; rope_rotate is the rotation.
void test_helpers() {
  for (int rot : {2, 32, 48, 64, 128})
    for (bool neox : {true, false}) {
      std::vector<int> seen(rot, 0);
      for (int i = 0; i < rot / 2; ++i) {
        int ix = -1, iy = -1;
        dk::rope_pair(i, rot, neox, ix, iy);
        CHECK(ix == (neox ? i : 2 * i) && iy == (neox ? i + rot / 2 : 2 * i + 1)) << "rope_pair" << rot << neox << i;
        if (ix >= 0 && ix < rot) ++seen[ix];
        if (iy >= 0 && iy < rot) ++seen[iy];
      }
      for (int j = 0; j < rot; ++j) CHECK(seen[j] == 1) << "rope_pair coverage" << rot << neox << j;
    }
  float x = 3.0f, y = -2.0f;
  dk::rope_rotate(x, y, 0.0f, 1.0f);  // +90 degrees: (x, y) -> (-y, x)
  CHECK(x == 2.0f && y == 3.0f) << x << y;
  dk::rope_rotate(x, y, 0.6f, 0.8f);
  CHECK_NEAR(x, 2.0 * 0.6f - 3.0 * 0.8f, 1e-6);
  CHECK_NEAR(y, 3.0 * 0.6f + 2.0 * 0.8f, 1e-6);
}

}  // namespace

int main() {
  test_helpers();
  Rng rng(99);
  run_type<float>(rng);
  run_type<dk::half_t>(rng);
  run_type<dk::bf16_t>(rng);
  return finish("test_rope");
}
