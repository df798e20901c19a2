// Launch plans of the CUDA mma.sync GEMMs for weights (gemm/int4_mma.cuh, gemm/fp8_gemm.cuh), host-only
// and torch-free so that the torch launcher (csrc/cuda/gemm_launch.cpp, g++) and the kernels' own
// launchers agree.
#pragma once
#include <algorithm>
#include <cstdint>

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

}  // namespace dk::cuda
