// Launch plans of the CUDA mma.sync GEMMs for weights (gemm/int4_mma.cuh, gemm/fp8_gemm.cuh,
// gemm/int4_marlin.cuh), host-only
// and torch-free so that the torch launcher (csrc/cuda/gemm_launch.cpp, g++) and the kernels' own
// launchers agree.
#pragma once
#include <algorithm>
#include <cstdint>

#include "decodekit/gemm/int4_marlin_pack.h"  // the unit shape

namespace dk::cuda {

inline constexpr int kMmaGemmFeatures = 64;  // output features per CTA of both kernels (4 warps x 2 n8 tiles)

// Rows of a per CTA: 16 * MT with MT = 1, 2 or 4 by M (both kernels).
inline int mma_gemm_block_rows(int64_t M) { return M <= 16 ? 16 : M <= 32 ? 32 : 64; }

// Split-K ways. The grid is ceil(N / 64) x ceil(M / block rows) CTAs of 4 warps, and the kernels hide
// their weight loads only with the warps in flight: at decode-sized M and N of a few thousand (Llama-3-8B:
// 64-96 CTAs) most SMs would hold one CTA or none. Splitting K over blockIdx.z multiplies the CTAs (aim:
// ~4 per SM); each split writes M x N fp32 partial sums that splitk_reduce (gemm/splitk.cuh) reads back and
// sums in split order (deterministic), so the splits stop where those 8 M N bytes per split reach a quarter
// of the weight bytes (N K weight_bits / 8), at 16, and at the number of K chunks (`chunk` elements: the
// INT4 group, the fp8 kernel's 64-byte step). Provisional: from this arithmetic, until bench_quant_cuda's
// rows ("int4_gemm" vs "int4_gemm S=1", "fp8_gemm" vs "fp8_gemm S=1") measure it.
inline int mma_gemm_splits(int64_t M, int64_t N, int64_t K, int64_t chunk, int weight_bits, int num_sms) {
  if (M <= 0 || N <= 0 || K <= 0 || chunk <= 0 || num_sms <= 0) return 1;
  const int64_t rows = mma_gemm_block_rows(M);
  const int64_t ctas = (N + kMmaGemmFeatures - 1) / kMmaGemmFeatures * ((M + rows - 1) / rows);
  const int64_t want = (4 * int64_t(num_sms) + ctas - 1) / ctas;
  const int64_t by_traffic = K * weight_bits / (256 * M);  // 8 M N S <= N K bits / 32
  return int(std::max<int64_t>(1, std::min({want, by_traffic, int64_t(16), (K + chunk - 1) / chunk})));
}

inline int int4_mma_splits(int64_t M, int64_t N, int64_t K, int G, int num_sms) {
  return mma_gemm_splits(M, N, K, G, 4, num_sms);
}
inline int fp8_mma_splits(int64_t M, int64_t N, int64_t K, int num_sms) {
  return mma_gemm_splits(M, N, K, 64, 8, num_sms);
}

// The Marlin-style INT4 kernel for decode-sized M (gemm/int4_marlin.cuh): units of 128 output x 128 input
// features, 4-stage cp.async pipeline; CTA b of P takes units [b U / P, (b + 1) U / P) (k-fastest within a
// 128-feature column), split columns reduced in-kernel through a workspace of fp32 slots and per-column
// counters.
inline constexpr int kMarlinFeatures = kMarlinUnitN, kMarlinK = kMarlinUnitK, kMarlinStages = 4, kMarlinMaxM = 64;
inline constexpr int64_t kMarlinMaxColumns = 65536;  // counters a launcher keeps (N <= 8M)

inline int int4_marlin_rows(int64_t M) { return M <= 16 ? 16 : M <= 32 ? 32 : 64; }
inline size_t int4_marlin_smem_bytes(int rows) {
  return size_t(kMarlinStages) * (kMarlinFeatures * kMarlinK / 2 + size_t(rows) * kMarlinK * 2 + 4 * kMarlinFeatures * 4);
}
inline int64_t int4_marlin_columns(int64_t N) { return (N + kMarlinFeatures - 1) / kMarlinFeatures; }
inline int64_t int4_marlin_units(int64_t N, int64_t K) {
  return int4_marlin_columns(N) * int4_marlin_k_tiles(K);
}
// Shapes the kernel takes: 1 <= M <= 64, G in {32, 64, 128}, K a positive multiple of G, a's row stride a
// multiple of 16 bytes, at most kMarlinMaxColumns columns and 2^30 units (32-bit unit indices).
inline bool int4_marlin_supported(int64_t M, int64_t N, int64_t K, int G, int64_t a_stride_bytes) {
  return M >= 1 && M <= kMarlinMaxM && N >= 1 && (G == 32 || G == 64 || G == 128) && K > 0 && K % G == 0 &&
         a_stride_bytes % 16 == 0 && int4_marlin_columns(N) <= kMarlinMaxColumns &&
         int4_marlin_units(N, K) <= (int64_t(1) << 30);
}
// CTAs: every SM busy, at most 2 CTAs an SM (more would only split columns into more segments, each a
// workspace round trip), never more than the units. Provisional, until bench_quant_cuda's "int4_gemm_marlin"
// rows measure it.
inline int int4_marlin_ctas(int64_t N, int64_t K, int num_sms, int ctas_per_sm) {
  const int64_t per_sm = std::max(1, std::min(ctas_per_sm, 2));
  return int(std::max<int64_t>(1, std::min(int4_marlin_units(N, K), int64_t(std::max(num_sms, 1)) * per_sm)));
}
// Workspace: fp32 slots [ctas + columns, M, 128] and one counter per column (zero, left zero by the kernel).
inline size_t int4_marlin_partial_floats(int64_t M, int64_t N, int ctas) {
  return size_t(ctas + int4_marlin_columns(N)) * size_t(M) * kMarlinFeatures;
}

// Tile schedules of the CUTLASS sm90 GEMMs (gemm/sm90_gemm.cuh; both instantiated, chosen per call):
//  - kPersistent: CUTLASS's persistent data-parallel scheduler, each 128 x 128 output tile on one CTA over the
//    whole of K (the kernel measured on the H200, 2026-12-04). Below one wave of tiles most SMs idle: N = 4096
//    at M <= 128 is 32 tiles for 132 SMs, which is why fp8_gemm_sm90 took a flat ~43 us for 8b.down (N 4096,
//    K 14336) from M = 16 to 512, a third of the copy rate.
//  - kStreamK: CUTLASS's stream-K scheduler (heuristic decomposition: data-parallel where the tiles fill the
//    SMs, else K ranges of the tiles spread over all SMs; deterministic reduction of the partial tiles in a
//    fixed order, so a call's result does not depend on timing).
enum class Sm90Schedule : int { kPersistent = 0, kStreamK = 1 };

}  // namespace dk::cuda
