// wgmma shared-memory matrix descriptors, decoded on the host: the CUDA emulator's reading of a descriptor
// (shim.h) and tools/wgmma_layout_check.cu, which checks this decoding against CUTLASS CuTe's layouts and
// make_gmma_desc (the encoding CUTLASS's own sm90 kernels run with), share it.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace dk_emu {
// Byte offset of element (k, n) of a 16 x N B operand of 2-byte elements described by desc: the canonical
// layouts of the PTX ISA's matrix descriptors, as CUTLASS CuTe's make_gmma_desc encodes them
// (cute/atom/mma_traits_sm90_gmma.hpp; units of 16 bytes, T = 8 elements):
//   K-major   INTERLEAVE ((8,n),2):((1,SBO),LBO)   swizzled ((8,n),2):((W,SBO),1)
//   MN-major  INTERLEAVE ((1,n),(8,k)):((-,SBO),(1,LBO))   swizzled ((W,n),(8,k)):((1,LBO),(W,SBO))
// W = 8 / 4 / 2 16-byte chunks a row for the 128 / 64 / 32-byte swizzles, which XOR the chunk index
// (address bits [4, 4 + log2 W)) with bits [7, 7 + log2 W) of the address.
inline uint32_t wgmma_b_offset(uint64_t desc, bool mn_major, int k, int n) {
  const uint32_t start = uint32_t(desc & 0x3FFF) << 4, lbo = uint32_t((desc >> 16) & 0x3FFF) << 4,
                 sbo = uint32_t((desc >> 32) & 0x3FFF) << 4;
  const int mode = int(desc >> 62), base_offset = int((desc >> 49) & 7);
  if (base_offset != 0) {
    fprintf(stderr, "emulator: wgmma descriptor base_offset %d (not emulated)\n", base_offset);
    abort();
  }
  const int W = mode == 0 ? 1 : mode == 1 ? 8 : mode == 2 ? 4 : 2;
  uint32_t a;
  if (!mn_major) {
    a = start + uint32_t(n % 8) * W * 16 + uint32_t(n / 8) * sbo + uint32_t(k / 8) * (mode == 0 ? lbo : 16) +
        uint32_t(k % 8) * 2;
  } else if (mode == 0) {
    a = start + uint32_t(n / 8) * sbo + uint32_t(k % 8) * 16 + uint32_t(k / 8) * lbo + uint32_t(n % 8) * 2;
  } else {
    const uint32_t c = uint32_t(n / 8);
    a = start + (c % W) * 16 + (c / W) * lbo + uint32_t(k % 8) * W * 16 + uint32_t(k / 8) * sbo + uint32_t(n % 8) * 2;
  }
  return a ^ (((a >> 7) & uint32_t(W - 1)) << 4);
}
}  // namespace dk_emu
