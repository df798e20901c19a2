// Declarations of the torch-free CUDA launchers of include/decodekit/*.cuh, for the host
// (g++) translation units csrc/cuda/*_launch.cpp. The .cuh files hold __global__ code that
// only nvcc compiles; csrc/cuda/<family>.cu includes its .cuh and this header and
// explicitly instantiates every launcher below for DK_CUDA_LAUNCH_TYPES (float, __half,
// __nv_bfloat16), so the torch headers are parsed by g++ only, never by nvcc.
// Keep each signature identical to its definition in the .cuh (and to the instantiation in
// the .cu): a mismatch declares a second template that nothing defines. nvcc rejects a .cu
// instantiation of it ("no template definition was supplied"); if only this header is
// stale, the build links and the extension fails to load (undefined symbol).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "decodekit/attention/common.h"  // PagedLayout, KVScales (torch-free, host-compatible)
#include "decodekit/common/fp8.h"        // fp8_e4m3_t (the fp8 KV-cache storage type)
#include "decodekit/gemm/mma_plan.h"  // int4_mma_splits, fp8_mma_splits (host-only)

// X(T) for every storage type the CUDA launchers are instantiated for.
#define DK_CUDA_LAUNCH_TYPES(X) X(float) X(__half) X(__nv_bfloat16)
// X(T) for the 16-bit types of the CUTLASS sm90 GEMMs (gemm/sm90_gemm.cuh).
#define DK_CUDA_SM90_TYPES(X) X(__half) X(__nv_bfloat16)

namespace dk::cuda {

// include/decodekit/norm.cuh
template <class T>
cudaError_t rms_norm(T* out, const T* in, int64_t in_stride, const T* weight, int64_t rows, int hidden, float eps,
                     cudaStream_t stream);

template <class T>
cudaError_t fused_add_rms_norm(T* x, int64_t x_stride, T* residual, int64_t r_stride, const T* weight, int64_t rows,
                               int hidden, float eps, cudaStream_t stream);

// include/decodekit/rope.cuh
template <class T>
cudaError_t rotary_embedding(const int64_t* positions, T* query, int64_t q_token_stride, int64_t q_head_stride,
                             int num_q_heads, T* key, int64_t k_token_stride, int64_t k_head_stride, int num_kv_heads,
                             const float* cos_sin_cache, int rot_dim, int head_size, bool is_neox, int64_t num_tokens,
                             cudaStream_t stream);

// include/decodekit/activation.cuh
template <class T>
cudaError_t silu_and_mul(T* out, const T* in, int64_t in_stride, int64_t rows, int64_t d, cudaStream_t stream);

// include/decodekit/attention/paged.cuh: C is the cache storage type, T or fp8_e4m3_t.
template <class T, class C>
cudaError_t reshape_and_cache(const T* key, const T* value, int64_t k_stride, int64_t v_stride, C* key_cache,
                              C* value_cache, const int64_t* slot_mapping, int64_t num_tokens, int64_t num_slots,
                              PagedLayout L, KVScales sc, cudaStream_t stream);

template <class T, class C>
cudaError_t paged_attention(T* out, float* lse, const T* query, int64_t q_stride, const C* key_cache,
                            const C* value_cache, const int32_t* block_tables, int max_blocks, const int32_t* seq_lens,
                            const int32_t* query_start_loc, int num_seqs, int64_t num_tokens, int num_q_heads,
                            int64_t num_blocks, PagedLayout L, float scale, KVScales sc, int window, int num_splits,
                            float* workspace, cudaStream_t stream, bool tensor_core_decode, bool wgmma_prefill);

cudaError_t copy_blocks(void* key_cache, void* value_cache, int64_t block_bytes, const int64_t* mapping,
                        int64_t num_pairs, int64_t num_blocks, cudaStream_t stream);

// include/decodekit/gemm/int4.cuh (scales / mins are __half)
template <class T>
cudaError_t quant_gemv(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                       const __half* mins, const T* bias, int M, int64_t N, int64_t K, int G, bool int4,
                       cudaStream_t stream);
template <class T>
cudaError_t int4_dequantize(T* w, const uint8_t* qweight, const __half* scales, const __half* mins, int64_t N,
                            int64_t K, int G, cudaStream_t stream);
template <class T>
cudaError_t int8_dequantize_rows(T* w, const int8_t* qweight, const __half* scales, const int64_t* ids, int64_t R,
                                 int64_t N, int64_t K, int G, cudaStream_t stream);
inline constexpr int kQuantGemvMaxM = 8;  // = int4.cuh's
// include/decodekit/gemm/int4_mma.cuh: INT4 GEMM on tensor cores for any M (half / bf16 only); split-K
// ways from int4_mma_splits (gemm/mma_plan.h), partial: splits * M * N floats when splits > 1
template <class T>
cudaError_t int4_gemm_mma(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                          const __half* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G, int splits,
                          float* partial, cudaStream_t stream);

// include/decodekit/gemm/int4_marlin.cuh: Marlin-style INT4 GEMM for 1 <= M <= 64 (half / bf16 only): plan
// and workspace sizes in gemm/mma_plan.h (int4_marlin_*); int4_marlin_prepare: the shared-memory opt-in,
// once per device and row count; int4_marlin_ctas_per_sm: the occupancy after it
// (kPacked: the kernel on int4_marlin_pack.h's layout, int4_gemm_marlin_packed; int4_marlin_pack makes it)
template <class T, bool kPacked>
cudaError_t int4_marlin_prepare(int64_t M);
template <class T, bool kPacked>
int int4_marlin_ctas_per_sm(int64_t M);
template <class T>
cudaError_t int4_gemm_marlin(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                             const __half* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G, int ctas,
                             float* partial, unsigned* counters, cudaStream_t stream);
template <class T>
cudaError_t int4_gemm_marlin_packed(T* out, const T* a, int64_t a_stride, const T* packed, const T* bias, int64_t M,
                                    int64_t N, int64_t K, int G, int ctas, float* partial, unsigned* counters,
                                    cudaStream_t stream);
template <class T>
cudaError_t int4_marlin_pack(T* out, const uint8_t* qweight, const __half* scales, const __half* mins, int64_t N,
                             int64_t K, int G, cudaStream_t stream);
// rows [row0, row0 + R) of a packed weight decoded to out [R, K] (16-byte aligned), as the kernel rounds them
template <class T>
cudaError_t int4_marlin_dequantize(T* out, const T* packed, int64_t N, int64_t K, int G, int64_t row0, int64_t R,
                                   cudaStream_t stream);

// include/decodekit/gemm/fp8_gemm.cuh: fp8 e4m3 W8A8
template <class T>
cudaError_t quantize_fp8(uint8_t* q, float* scale, const T* x, int64_t M, int64_t K, int64_t x_stride,
                         cudaStream_t stream);
template <class T>
cudaError_t fp8_gemm(T* out, const uint8_t* a, const float* a_scale, const uint8_t* w, const float* w_scale,
                     const T* bias, int64_t M, int64_t N, int64_t K, int splits, float* partial,
                     cudaStream_t stream);

// include/decodekit/gemm/sm90_gemm.cuh: CUTLASS sm90 (TMA + wgmma) GEMMs for large M, fp16 / bf16 only
// (gemm_sm90_int4.cu, gemm_sm90_fp8.cu), tiles scheduled by `sched` (Sm90Schedule, mma_plan.h) over
// `sm_count` SMs. *_workspace_bytes: the device workspace a call needs (same schedule and SM count), 0 when
// the shape cannot take the path; the GEMMs return cudaErrorNotSupported, having launched nothing, when
// CUTLASS cannot implement the call.
template <class T>
size_t int4_gemm_sm90_workspace_bytes(int64_t M, int64_t N, int64_t K, int G, Sm90Schedule sched, int sm_count);
template <class T>
cudaError_t int4_gemm_sm90(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                           const __half* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G,
                           Sm90Schedule sched, int sm_count, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);
template <class T>
size_t fp8_gemm_sm90_workspace_bytes(int64_t M, int64_t N, int64_t K, Sm90Schedule sched, int sm_count);
template <class T>
cudaError_t fp8_gemm_sm90(T* out, const uint8_t* a, const float* a_scale, const uint8_t* w, const float* w_scale,
                          const T* bias, int64_t M, int64_t N, int64_t K, Sm90Schedule sched, int sm_count,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream);

// include/decodekit/sampling/rejection.cuh (defined in sampling.cu)
int64_t sampling_vocab_splits(int64_t B, int64_t V, int num_sms);
size_t rejection_sample_workspace(int64_t B, int64_t k, int64_t splits, bool greedy);
cudaError_t rejection_sample_launch(int64_t* out, int32_t* num_emitted, const int64_t* draft, const int32_t* num_draft,
                                    const float* q, const float* p, const int64_t* seeds, const int64_t* positions,
                                    int64_t B, int64_t k, int64_t V, bool greedy, int64_t splits, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream);

// include/decodekit/sampling/gumbel_max.cuh (defined in sampling.cu; splits: sampling_vocab_splits)
size_t gumbel_argmax_workspace(int64_t B, int64_t splits);
cudaError_t gumbel_argmax_launch(int64_t* out, const float* x, int64_t row_stride, const int64_t* seeds,
                                 const int64_t* positions, int64_t B, int64_t V, uint32_t stream, int64_t splits,
                                 void* workspace, size_t workspace_bytes, cudaStream_t cuda_stream);

// include/decodekit/sampling/argmax.cuh (defined in sampling.cu)
cudaError_t argmax_rows_launch(int64_t* out, const float* x, int64_t row_stride, int64_t B, int64_t V,
                               cudaStream_t stream);

// include/decodekit/sampling/sort_desc.cuh (defined in sampling.cu)
size_t sort_desc_stable_workspace(int64_t B, int64_t V);
cudaError_t sort_desc_stable_launch(float* values, int64_t* indices, const float* x, int64_t row_stride, int64_t B,
                                    int64_t V, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Head dims paged_attention has kernels for (paged_attention_head_dim_ok in paged.cuh).
inline constexpr int kPagedAttentionHeadDims[] = {64, 128, 256};

}  // namespace dk::cuda
