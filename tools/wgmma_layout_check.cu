// Host-only check (no GPU) that the wgmma operands of the prefill kernel are laid out and described the way the
// hardware reads them, by CUTLASS CuTe's account (the encoding CUTLASS's own sm90 kernels run with):
//  1. the K / V tile layout of include/decodekit/attention/prefill.cuh (TcShape<D, W, true>::off) equals CuTe's
//     tile_to_shape(GMMA::Layout_K_SW128_Atom) for K (N = keys, K-major) and tile_to_shape(Layout_MN_SW128_Atom,
//     keys first) for V (N = head dim, MN-major), element by element, swizzle included;
//  2. the kernel's descriptors (wgmma_desc_sw128 with its LBO / SBO / start of each k-step) have the fields
//     cute::GMMA::make_gmma_desc gives the same k-step slices;
//  3. the emulator's decoding of a descriptor (tools/cuda_emu/wgmma_desc.h) maps every (k, n) of each k-step to
//     the address CuTe's layout gives -- so the emulator tests the kernel against the hardware's semantics.
// Build and run (tools/cuda_check.py does, in CI):
//   nvcc -std=c++17 -I include -I <cutlass>/include -I tools/cuda_emu tools/wgmma_layout_check.cu -o /tmp/wlc && /tmp/wlc
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cstdio>

#include "decodekit/attention/prefill.cuh"
#include "wgmma_desc.h"

using namespace cute;

static int failures = 0;
#define CHECK(cond, ...)                 \
  do {                                   \
    if (!(cond)) {                       \
      if (failures++ < 20) {             \
        printf("FAIL: " __VA_ARGS__);    \
        printf("\n");                    \
      }                                  \
    }                                    \
  } while (0)

// The fields of a descriptor (start, LBO, SBO in bytes; layout type).
struct Fields {
  uint32_t start, lbo, sbo, mode;
};
static Fields fields(uint64_t desc) {
  return {uint32_t(desc & 0x3FFF) << 4, uint32_t((desc >> 16) & 0x3FFF) << 4, uint32_t((desc >> 32) & 0x3FFF) << 4,
          uint32_t(desc >> 62)};
}

template <int D>
void check_head_dim() {
  using T = cutlass::half_t;
  using S = dk::cuda::attn_detail::TcShape<D, 8, true>;
  constexpr int BN = S::BN;
  alignas(1024) static T smem[BN * D];
  const auto base = reinterpret_cast<const char*>(smem);

  // K: (N = BN keys, K = D), K-major, swizzle atoms tiled keys first (CuTe's default order)
  auto sK = make_tensor(make_smem_ptr(smem), tile_to_shape(SM90::GMMA::Layout_K_SW128_Atom<T>{},
                                                           make_shape(Int<BN>{}, Int<D>{})));
  // V: (N = D, K = BN keys), MN-major, atoms tiled keys first (so a 64-column slab of all keys is contiguous)
  auto sV = make_tensor(make_smem_ptr(smem), tile_to_shape(SM90::GMMA::Layout_MN_SW128_Atom<T>{},
                                                           make_shape(Int<D>{}, Int<BN>{}), Step<_2, _1>{}));
  for (int key = 0; key < BN; ++key)
    for (int d = 0; d < D; ++d) {
      const long ours = S::off(key, d & ~7) + (d & 7);
      const long k_off = reinterpret_cast<const T*>(&sK(key, d)) - smem;
      const long v_off = reinterpret_cast<const T*>(&sV(d, key)) - smem;
      CHECK(ours == k_off, "d%d K tile: key %d col %d at %ld, CuTe %ld", D, key, d, ours, k_off);
      CHECK(ours == v_off, "d%d V tile: key %d col %d at %ld, CuTe %ld", D, key, d, ours, v_off);
    }

  // S = Q K^T, k-step kk: B = K[:, 16 kk .. 16 kk + 15] (k = head-dim column, n = key)
  for (int kk = 0; kk < D / 16; ++kk) {
    auto slice = local_tile(sK, make_shape(Int<BN>{}, Int<16>{}), make_coord(0, kk));
    const auto cute_desc = SM90::GMMA::make_gmma_desc<SM90::GMMA::Major::K>(slice);
    const uint64_t ours = dk::cuda::wgmma_desc_sw128_at(uint32_t(S::k_step_k(kk) * 2), S::K_LBO, S::K_SBO);
    const Fields f = fields(ours);
    const long cute_start = reinterpret_cast<const char*>(&slice(0, 0)) - base;
    CHECK(f.start == cute_start, "d%d K k-step %d: start %u, CuTe %ld", D, kk, f.start, cute_start);
    CHECK(f.mode == uint32_t(cute_desc.bitfield.layout_type_), "d%d K layout type %u, CuTe %u", D, f.mode,
          unsigned(cute_desc.bitfield.layout_type_));
    CHECK(f.lbo >> 4 == cute_desc.bitfield.leading_byte_offset_, "d%d K LBO %u, CuTe %u", D, f.lbo >> 4,
          unsigned(cute_desc.bitfield.leading_byte_offset_));
    CHECK(f.sbo >> 4 == cute_desc.bitfield.stride_byte_offset_, "d%d K SBO %u, CuTe %u", D, f.sbo >> 4,
          unsigned(cute_desc.bitfield.stride_byte_offset_));
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < BN; ++n) {
        const long emu = dk_emu::wgmma_b_offset(ours, false, k, n);
        const long want = reinterpret_cast<const char*>(&slice(n, k)) - base;
        CHECK(emu == want, "d%d K k-step %d: emulator reads (k %d, n %d) at byte %ld, CuTe %ld", D, kk, k, n, emu, want);
      }
  }
  // O += P V, k-step kk: B = V[16 kk .. 16 kk + 15, :] (k = key, n = head-dim column), transposed (MN-major)
  for (int kk = 0; kk < BN / 16; ++kk) {
    auto slice = local_tile(sV, make_shape(Int<D>{}, Int<16>{}), make_coord(0, kk));
    const auto cute_desc = SM90::GMMA::make_gmma_desc<SM90::GMMA::Major::MN>(slice);
    const uint64_t ours = dk::cuda::wgmma_desc_sw128_at(uint32_t(S::k_step_v(kk) * 2), S::V_LBO, S::V_SBO);
    const Fields f = fields(ours);
    const long cute_start = reinterpret_cast<const char*>(&slice(0, 0)) - base;
    CHECK(f.start == cute_start, "d%d V k-step %d: start %u, CuTe %ld", D, kk, f.start, cute_start);
    CHECK(f.mode == uint32_t(cute_desc.bitfield.layout_type_), "d%d V layout type", D);
    // (one 64-column slab at head_dim 64: the slab stride is never used, whatever CuTe writes there)
    CHECK(D == 64 || f.lbo >> 4 == cute_desc.bitfield.leading_byte_offset_, "d%d V LBO %u, CuTe %u", D, f.lbo >> 4,
          unsigned(cute_desc.bitfield.leading_byte_offset_));
    CHECK(f.sbo >> 4 == cute_desc.bitfield.stride_byte_offset_, "d%d V SBO %u, CuTe %u", D, f.sbo >> 4,
          unsigned(cute_desc.bitfield.stride_byte_offset_));
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < D; ++n) {
        const long emu = dk_emu::wgmma_b_offset(ours, true, k, n);
        const long want = reinterpret_cast<const char*>(&slice(n, k)) - base;
        CHECK(emu == want, "d%d V k-step %d: emulator reads (k %d, n %d) at byte %ld, CuTe %ld", D, kk, k, n, emu, want);
      }
  }
}

int main() {
  check_head_dim<64>();
  check_head_dim<128>();
  printf("wgmma layout check (prefill K/V tiles, descriptors, emulator decoding vs CuTe): %s, %d failures\n",
         failures ? "FAIL" : "OK", failures);
  return failures != 0;
}
