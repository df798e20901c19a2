// The launch plan of the CUDA INT4 tensor-core GEMM (gemm/int4_mma.cuh), host-only and torch-free so
// that the torch launcher (csrc/cuda/gemm_launch.cpp, g++) and the kernel's own launcher agree.
#pragma once
#include <algorithm>
#include <cstdint>

namespace dk::cuda {

inline constexpr int kInt4MmaFeatures = 64;  // output features per CTA (4 warps x 2 n8 tiles)

// Rows of a per CTA: 16 * MT with MT = 1, 2 or 4 by M.
inline int int4_mma_block_rows(int64_t M) { return M <= 16 ? 16 : M <= 32 ? 32 : 64; }

// Split-K ways. The grid is ceil(N / 64) x ceil(M / block rows) CTAs of 4 warps, and the kernel hides
// its weight loads only with the warps in flight: at decode-sized M and N of a few thousand (Llama-3-8B:
// 64-96 CTAs) most SMs would hold one CTA or none. Splitting K over blockIdx.z multiplies the CTAs
// (aim: ~4 per SM); each split writes M x N fp32 partial sums that a second kernel reads back and sums
// in split order (deterministic), so the splits stop where those 8 M N bytes per split reach a quarter
// of the N K / 2 weight bytes (S <= K / (64 M)), at 16, and at the number of groups. Provisional: from
// the arithmetic above, until bench_quant_cuda's int4_gemm rows measure it.
inline int int4_mma_splits(int64_t M, int64_t N, int64_t K, int G, int num_sms) {
  if (M <= 0 || N <= 0 || K <= 0 || G <= 0 || num_sms <= 0) return 1;
  const int64_t ctas = (N + kInt4MmaFeatures - 1) / kInt4MmaFeatures *
                       ((M + int4_mma_block_rows(M) - 1) / int4_mma_block_rows(M));
  const int64_t want = (4 * int64_t(num_sms) + ctas - 1) / ctas;
  const int64_t by_traffic = K / (64 * M);
  return int(std::max<int64_t>(1, std::min({want, by_traffic, int64_t(16), K / G})));
}

}  // namespace dk::cuda
