// Emulator test of include/decodekit/sampling/sort_desc.cuh (dk::cuda::sort_desc_stable: sort_desc_keys_kernel,
// cub::DeviceRadixSort::SortPairs on (row << 32 | key) 64-bit keys, sort_desc_gather_kernel) against the CPU
// LSD radix sort of sampling/sort_desc.h (dk::cpu::sort_desc_stable, as csrc/cpu/sampling.cpp calls it) and an
// independent std::stable_sort by torch.sort's rule (descending, stable; every NaN first and equal to the
// others, -0.0 == +0.0): values bit for bit (NaN payloads too) and int64 indices, exactly. CUB runs as the
// host stand-in cub_emu.h (prepare.py puts it in place of the CUB include), which sorts only the key bits
// [begin_bit, end_bit) the launcher passes (too few row bits would mix rows) and clobbers its temporary storage.
// Rows: 1 .. 1025 of 1 .. 524300 values, strided (stride 0 too: an expanded row) with NaN padding, grid-stride
// loops (the launcher's 4096-CTA cap and a forced small grid); specials, ties, all-NaN and all-equal rows; the
// workspace's guard bytes untouched; a workspace one byte short refused before anything runs.
//   test_sort [--reverse|--random|--greedy] [--workers N]
#include "shim.h"
#include "decodekit/sampling/sort_desc.cuh"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

static std::mt19937 rng(7);
static int fails = 0, checks = 0;

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
// torch.sort(descending=True, stable=True)'s order, written independently of sort_desc_key: a before b
static bool before(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && !std::isnan(b);
  return a > b;  // -0.0 > +0.0 is false both ways: equal, token order kept
}

enum Kind { kNormal, kLevels, kSpecial, kAllNaN, kZeros, kAllNegInf };
static float draw(Kind k, std::normal_distribution<float>& nd) {
  switch (k) {
    case kNormal: return nd(rng);
    case kLevels: return float(int(rng() % 5)) - 2.f;  // many ties (-0 never: 0.f)
    case kAllNaN: return from_bits((rng() % 2 ? 0xffc00000u : 0x7fc00000u) | (rng() & 0x3fffffu));
    case kZeros: return rng() % 2 ? 0.f : -0.f;
    case kAllNegInf: return -INFINITY;
    case kSpecial:
    default: {
      static const float sp[] = {NAN, -NAN, INFINITY, -INFINITY, 0.f, -0.f, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN,
                                 1e-45f, -1e-45f, 1.f, -1.f, 1.f, 0.5f};
      const uint32_t r = rng() % 24;
      if (r < 16) return sp[r];
      if (r == 16) return from_bits(0x7f800001u + (rng() & 0x3fffffu));  // NaNs with payloads (signalling too)
      if (r == 17) return from_bits(0xff800001u + (rng() & 0x3fffffu));
      return nd(rng);
    }
  }
}

// B rows of V values, rows `stride` apart (stride 0: one row shared by all); cap: at most that many CTAs.
static void run(int64_t B, int64_t V, int64_t stride, Kind kind, unsigned cap = 0) {
  char tag[160];
  snprintf(tag, sizeof tag, "sort_desc_stable B=%ld V=%ld stride=%ld kind=%d cap=%u", long(B), long(V), long(stride),
           int(kind), cap);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t n = B * V, G = 16;
  const int64_t xn = stride == 0 ? V : B * stride;
  std::vector<float> x(size_t(G + xn + G), from_bits(0x7fbadbadu));  // padding: a NaN with a payload of its own
  for (int64_t b = 0; b < (stride == 0 ? 1 : B); ++b)
    for (int64_t v = 0; v < V; ++v) x[size_t(G + b * stride + v)] = draw(kind, nd);
  if (kind == kNormal && V > 8)  // exact ties (equal values far apart) and +-0 in a normal row
    for (int64_t b = 0; b < (stride == 0 ? 1 : B); ++b) {
      float* r = &x[size_t(G + b * stride)];
      r[V - 1] = r[0];
      r[V / 2] = r[1];
      r[V / 3] = 0.f;
      r[V - 2] = -0.f;
    }
  const float* xp = x.data() + G;
  const std::vector<float> x0 = x;
  // CPU kernel and the independent reference
  std::vector<float> cv(static_cast<size_t>(n));
  std::vector<int64_t> ci(static_cast<size_t>(n));
  dk::cpu::sort_desc_stable(cv.data(), ci.data(), xp, stride, B, V);
  std::vector<int64_t> ref(static_cast<size_t>(V));
  // emulated: poisoned outputs with guards, a poisoned workspace with a guard
  const float vpoison = from_bits(0x7f7f7f7fu);
  std::vector<float> vals(size_t(G + n + G), vpoison);
  std::vector<int64_t> idx(size_t(G + n + G), int64_t(0x7f7f7f7f7f7f7f7f));
  const size_t bytes = dk::cuda::sort_desc_stable_workspace_bytes(B, V);
  std::vector<uint64_t> ws(bytes / 8 + 1 + 64, 0xA5A5A5A5A5A5A5A5ull);  // 8-byte words (the arrays' alignment)
  // one byte short: refused, nothing launched or written
  const long launches0 = dk_emu::launches.load(), sorts0 = cub::DeviceRadixSort::sorts;
  cudaError_t e = dk::cuda::sort_desc_stable(vals.data() + G, idx.data() + G, xp, stride, B, V, ws.data(), bytes - 1,
                                             nullptr);
  ++checks;
  if (e != cudaErrorInvalidValue || dk_emu::launches.load() != launches0 || vals[size_t(G)] != vals[size_t(G)] ||
      fbits(vals[size_t(G)]) != fbits(vpoison)) {
    printf("FAIL %s: a short workspace was not refused cleanly (err %d)\n", tag, int(e));
    ++fails;
  }
  if (cap) dk_emu::grid_cap_x = cap;
  e = dk::cuda::sort_desc_stable(vals.data() + G, idx.data() + G, xp, stride, B, V, ws.data(), bytes, nullptr);
  dk_emu::grid_cap_x = 1u << 30;
  ++checks;
  if (e != cudaSuccess || cub::DeviceRadixSort::sorts != sorts0 + 1 || dk_emu::launches.load() != launches0 + 2) {
    printf("FAIL %s: err %d, %ld sorts, %ld launches (want 1 sort between 2 launches)\n", tag, int(e),
           cub::DeviceRadixSort::sorts - sorts0, dk_emu::launches.load() - launches0);
    ++fails;
  }
  ++checks;
  const unsigned char* wb = reinterpret_cast<const unsigned char*>(ws.data());
  for (size_t i = bytes; i < ws.size() * 8; ++i)
    if (wb[i] != 0xA5) { printf("FAIL %s: workspace byte %zu written (past the %zu asked for)\n", tag, i, bytes); ++fails; break; }
  ++checks;
  if (memcmp(x.data(), x0.data(), x.size() * 4) != 0) { printf("FAIL %s: x written\n", tag); ++fails; }
  ++checks;
  for (int64_t i = 0; i < G; ++i)
    if (fbits(vals[size_t(i)]) != fbits(vpoison) || fbits(vals[size_t(G + n + i)]) != fbits(vpoison) ||
        idx[size_t(i)] != int64_t(0x7f7f7f7f7f7f7f7f) || idx[size_t(G + n + i)] != int64_t(0x7f7f7f7f7f7f7f7f)) {
      printf("FAIL %s: written outside values / indices\n", tag);
      ++fails;
      break;
    }
  for (int64_t b = 0; b < B; ++b) {
    const float* row = xp + b * stride;
    std::iota(ref.begin(), ref.end(), int64_t(0));
    std::stable_sort(ref.begin(), ref.end(), [&](int64_t p, int64_t q) { return before(row[p], row[q]); });
    ++checks;
    for (int64_t r = 0; r < V; ++r) {
      const size_t o = size_t(b * V + r);
      const float got = vals[size_t(G) + o];
      const int64_t gi = idx[size_t(G) + o];
      const char* why = gi != ci[o] ? "index != cpu" : fbits(got) != fbits(cv[o]) ? "value bits != cpu"
                        : gi != ref[size_t(r)] ? "index != std::stable_sort reference"
                        : fbits(got) != fbits(row[ref[size_t(r)]]) ? "value != x[index]" : nullptr;
      if (why) {
        printf("FAIL %s: row %ld rank %ld: %s (got index %ld value %g (0x%08x); cpu %ld %g; reference %ld)\n", tag,
               long(b), long(r), why, long(gi), double(got), fbits(got), long(ci[o]), double(cv[o]),
               long(ref[size_t(r)]));
        ++fails;
        break;
      }
    }
  }
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!dk_emu::parse_common_arg(argc, argv, i)) { fprintf(stderr, "usage: test_sort [--reverse|--random|--greedy] [--workers N]\n"); return 2; }
  }
  // row counts on both sides of each power of two (the key's row bits: 0 .. 11)
  for (int64_t B : {1, 2, 3, 4, 5, 8, 9})
    for (int64_t V : {1, 2, 7, 255, 256, 257, 1000})
      for (Kind k : {kNormal, kLevels, kSpecial}) run(B, V, V + (V % 3), k);
  for (Kind k : {kAllNaN, kZeros, kAllNegInf}) run(3, 300, 301, k);
  run(1, 49157, 49157, kSpecial);
  run(3, 32000, 32000, kNormal);
  run(2, 4099, 4100, kLevels, 3);                  // grid-stride (3 CTAs)
  run(5, 77, 0, kSpecial);                          // stride 0: one row for all (x.expand(B, -1))
  run(1025, 3, 5, kSpecial);                        // 11 row bits
  run(513, 8, 8, kLevels, 2);
  run(2, 524300, 524300, kNormal);                  // > 4096 CTAs of 256: the launcher's cap, then grid-stride
  printf("test_sort: %d checks, %d failures, %ld launches, %ld sorts\n", checks, fails, dk_emu::launches.load(),
         cub::DeviceRadixSort::sorts);
  return fails != 0;
}
