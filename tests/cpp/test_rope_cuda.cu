// CUDA rotary_embedding (include/decodekit/rope.cuh) vs. the CPU kernel (rope.h, verified
// against double precision by test_rope). Exits 77 (skipped) without an sm_90 GPU.
// NeoX and GPT-J, full and partial rotary, q only, layouts: contiguous, q/k slices of a
// fused qkv buffer, padded head strides (16-byte multiple: vector accesses; odd: scalar),
// misaligned pointers; decode-sized and many tokens.
#include <map>

#include "cuda_util.h"
#include "decodekit/rope.cuh"
#include "decodekit/rope.h"

using namespace dk_test;

namespace {

constexpr int kMaxPos = 4096;

struct Config {
  int hq, hk, head, rot;
  bool neox, with_key;
};

enum Layout { kContiguous, kFusedQkv, kPadHeads16, kPadHeadsOdd };

CompareStats g_stats;

template <class T>
void test_rope(Rng& rng, const Config& c, int64_t tokens, Layout layout, size_t misalign) {
  const int64_t head_stride = c.head + (layout == kPadHeads16 ? 16 : layout == kPadHeadsOdd ? 3 : 0);
  const int64_t q_size = c.hq * head_stride, k_size = c.hk * head_stride;
  const int64_t v_size = layout == kFusedQkv ? k_size : 0;
  const int64_t token_stride = q_size + k_size + v_size + (layout == kPadHeadsOdd ? 5 : 0);
  std::vector<T> buf(size_t(tokens * token_stride) + 16, poison<T>());
  const int nfill = c.hq + c.hk + (layout == kFusedQkv ? c.hk : 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < nfill; ++h)
      for (int d = 0; d < c.head; ++d) buf[t * token_stride + h * head_stride + d] = from_d<T>(2.0 * rng.normal());
  std::vector<int64_t> pos(tokens);
  for (int64_t t = 0; t < tokens; ++t) pos[t] = t == 0 ? kMaxPos - 1 : int64_t(rng.u32() % kMaxPos);
  static std::map<int, std::vector<float>> tables;  // cos/sin table per rot, built once
  std::vector<float>& cache = tables[c.rot];
  if (cache.empty()) {
    cache.resize(size_t(kMaxPos) * c.rot);
    for (int p = 0; p < kMaxPos; ++p)
      for (int i = 0; i < c.rot / 2; ++i) {
        const double a = p * std::pow(10000.0, -2.0 * i / c.rot);
        cache[size_t(p) * c.rot + i] = float(std::cos(a));
        cache[size_t(p) * c.rot + c.rot / 2 + i] = float(std::sin(a));
      }
  }
  // Per-element tolerance scale |x| + |y| of the element's pair (>= |x c| + |y s|); -1: untouched.
  std::vector<double> scale(buf.size(), -1.0);
  const int half = c.rot / 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < c.hq + (c.with_key ? c.hk : 0); ++h)
      for (int i = 0; i < half; ++i) {
        const int64_t base = t * token_stride + h * head_stride;
        const int64_t ix = base + (c.neox ? i : 2 * i), iy = base + (c.neox ? i + half : 2 * i + 1);
        scale[ix] = scale[iy] = std::fabs(to_d(buf[ix])) + std::fabs(to_d(buf[iy]));
      }

  DeviceBuffer<T> d_buf(buf, misalign);
  DeviceBuffer<int64_t> d_pos(pos);
  DeviceBuffer<float> d_cache(cache);
  dk::cpu::rotary_embedding<T>(pos.data(), buf.data(), token_stride, head_stride, c.hq,
                               c.with_key ? buf.data() + q_size : nullptr, token_stride, head_stride, c.hk,
                               cache.data(), c.rot, c.neox, tokens);
  CUDA_OK(dk::cuda::rotary_embedding<cuda_t<T>>(d_pos.ptr(), d_buf.dev(), token_stride, head_stride, c.hq,
                                               c.with_key ? d_buf.dev() + q_size : nullptr, token_stride, head_stride,
                                               c.hk, d_cache.ptr(), c.rot, c.head, c.neox, tokens, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const std::string what = std::string("rope ") + TypeInfo<T>::name + (c.neox ? " neox" : " gptj") + " heads " +
                           std::to_string(c.hq) + "/" + std::to_string(c.hk) + " head " + std::to_string(c.head) +
                           " rot " + std::to_string(c.rot) + " tokens " + std::to_string(tokens) + " layout " +
                           std::to_string(int(layout)) + " misalign " + std::to_string(misalign);
  // 3u (|x c| + |y s|) per kernel, see test_rope.cpp
  auto tol = [&](size_t j, double c) {
    return scale[j] < 0 ? -1.0 : 2 * store_tol<T>(c, 3 * 0x1.0p-24, scale[j]);
  };
  const CompareStats s = compare_buffers(d_buf.download(), buf, tol, what);
  g_stats.exact += s.exact;
  g_stats.near += s.near;
}

template <class T>
void run_type(Rng& rng) {
  g_stats = {};
  const Config configs[] = {
      {32, 8, 128, 128, true, true},  {32, 8, 128, 128, false, true}, {9, 3, 64, 64, true, true},
      {9, 3, 64, 64, false, true},    {4, 2, 128, 64, true, true},    {5, 1, 96, 32, false, true},
      {6, 2, 80, 48, true, true},     {3, 1, 64, 2, false, true},     {7, 0, 64, 64, true, false},
      {2, 2, 256, 256, true, true},   {2, 1, 256, 64, false, true},
  };
  for (const Config& c : configs)
    for (int64_t tokens : {1, 7, 83})
      for (Layout l : {kContiguous, kFusedQkv, kPadHeads16, kPadHeadsOdd}) test_rope<T>(rng, c, tokens, l, 0);
  for (const Config& c : {configs[0], configs[3]}) {
    test_rope<T>(rng, c, 7, kContiguous, 1);     // misaligned: scalar
    test_rope<T>(rng, c, 2000, kFusedQkv, 0);    // many tokens
  }
  test_rope<T>(rng, configs[0], 0, kContiguous, 0);  // no-op
  std::printf("%s: elements bitwise equal to CPU (incl. untouched): %lld, within tolerance: %lld\n",
              TypeInfo<T>::name, g_stats.exact, g_stats.near);
}

}  // namespace

int main() {
  require_gpu_or_skip("test_rope_cuda");
  Rng rng(11);
  run_type<float>(rng);
  run_type<dk::half_t>(rng);
  run_type<dk::bf16_t>(rng);
  return finish("test_rope_cuda");
}
