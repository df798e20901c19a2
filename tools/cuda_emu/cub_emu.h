// Host stand-in for cub::DeviceRadixSort::SortPairs (CUB cannot run in the emulator): prepare.py puts
// `#include "cub_emu.h"` where a header includes <cub/device/device_radix_sort.cuh>. The same contract as
// CUB's (cub/device/device_radix_sort.cuh, SortPairs with separate input and output arrays):
//  - d_temp_storage == nullptr: only writes the temporary storage size to temp_storage_bytes;
//  - otherwise sorts num_items (key, value) pairs by the key bits [begin_bit, end_bit) ascending, stably (equal
//    bits keep their input order; bits outside the range are ignored, as by CUB's radix passes), into
//    d_keys_out / d_values_out; the inputs are left as they were.
// Stricter than a run on the GPU, so that misuse shows: the temporary storage is filled with 0x7f bytes
// (whatever the caller kept there is clobbered, as CUB's passes would), and a temp_storage_bytes below the
// size asked for, overlapping in / out / temporary ranges, or a bit range outside the key type abort the run.
// The launches around it are synchronous in the emulator, so "on the stream" is "now".
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

namespace cub {
namespace emu_detail {
inline bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na != 0 && nb != 0 && pa < pb + nb && pb < pa + na;
}
[[noreturn]] inline void fail(const char* what) {
  fprintf(stderr, "emulator: cub::DeviceRadixSort::SortPairs: %s\n", what);
  abort();
}
}  // namespace emu_detail

struct DeviceRadixSort {
  // The temporary storage the stand-in asks for: a few bytes per item and a fixed part (the real size
  // differs; callers must use whatever the sizing call returns).
  static size_t TempBytes(int num_items) { return 1024 + size_t(num_items > 0 ? num_items : 0) * 4; }

  template <class K, class V>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const K* d_keys_in, K* d_keys_out,
                               const V* d_values_in, V* d_values_out, int num_items, int begin_bit = 0,
                               int end_bit = int(sizeof(K) * 8), cudaStream_t = 0) {
    static_assert(std::is_unsigned_v<K>, "the stand-in sorts unsigned keys (decodekit's only use)");
    using namespace emu_detail;
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = TempBytes(num_items);
      return cudaSuccess;
    }
    if (num_items < 0) fail("negative num_items");
    if (temp_storage_bytes < TempBytes(num_items)) fail("temp_storage_bytes below the size the sizing call returned");
    if (begin_bit < 0 || end_bit > int(sizeof(K) * 8) || begin_bit > end_bit) fail("bit range outside the key");
    const size_t n = size_t(num_items), kb = n * sizeof(K), vb = n * sizeof(V);
    const void* ranges[4] = {d_keys_in, d_keys_out, d_values_in, d_values_out};
    const size_t sizes[4] = {kb, kb, vb, vb};
    for (int i = 0; i < 4; ++i) {
      if (overlap(ranges[i], sizes[i], d_temp_storage, temp_storage_bytes)) fail("an array overlaps the temporary storage");
      for (int j = i + 1; j < 4; ++j)
        if (overlap(ranges[i], sizes[i], ranges[j], sizes[j])) fail("input / output arrays overlap");
    }
    const int bits = end_bit - begin_bit;
    const K mask = bits >= int(sizeof(K) * 8) ? K(~K(0)) : K((K(1) << bits) - 1);
    std::vector<K> key(n);
    for (size_t i = 0; i < n; ++i) key[i] = K(d_keys_in[i] >> begin_bit) & mask;
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return key[a] < key[b]; });
    memset(d_temp_storage, 0x7f, temp_storage_bytes);
    for (size_t i = 0; i < n; ++i) {
      d_keys_out[i] = d_keys_in[order[i]];
      d_values_out[i] = d_values_in[order[i]];
    }
    ++sorts;
    return cudaSuccess;
  }
  static inline long sorts = 0;  // calls that sorted (the test checks that the CUDA path went through here)
};
}  // namespace cub
