// CUTLASS 3.x sm90 GEMMs (TMA loads, wgmma, warp-specialized persistent CTAs) for the large-M regime
// (prefill, big batches) of int4_gemm and fp8_gemm. Torch-free; instantiated in csrc/cuda/gemm_sm90_int4.cu and _fp8.cu,
// dispatched by csrc/cuda/gemm_launch.cpp (the heuristic table there).
//
// INT4 W4A16 (the mixed-input collective, CUTLASS example 55's recipe, written for our layout):
//  - the narrow operand must go through registers, so the product is computed transposed:
//    out^T [N, M] = W [N, K] (operand A: our qweight bytes read as plain packed cutlass::uint4b_t,
//    K-major) x X^T (operand B: the activations [M, K], K-major), stored column-major = out [M, N].
//  - our nibble order is "group-split" (gemm/int4.h); read as plain packed 4-bit elements a group's
//    logical element j is our element int4_interleaved_source(j, G) (gemm/int4_common.h), so the
//    activations are first interleaved the same way (int4_sm90_interleave_kernel: exact, a copy).
//  - scales and mins: the collective wants them MN-major ([K / G, N]) and dequantizes
//    w = float(q) * scale + min in the scale type; we give it fp32 copies (int4_sm90_scales_kernel:
//    fp16 -> fp32 exact, transposed), so each weight is scale * q + min in fp32 rounded once to T --
//    exactly int4_weight() then the rounding the GEMV / mma.sync kernels do (same numerics as theirs).
//  - epilogue: out^T = acc + bias[n] (a column broadcast in the transposed problem; no bias = 0).
//  - K tile 64: the collective wants G to be a multiple of the K tile and at least 4 k16 steps per
//    tile, so G = 32 (GGUF Q4_0 / Q4_1) cannot take this path; it stays on the mma.sync kernel.
// fp8 W8A8 (e4m3 x e4m3 -> fp32 on wgmma, QGMMA in SASS): out [M, N] = a_scale[m] * (w_scale[n] * acc)
// + bias[n], an epilogue visitor tree over the accumulators (per-token x per-channel scales).
//
// Tile schedule (Sm90Schedule, gemm/mma_plan.h), per call: CUTLASS's persistent data-parallel scheduler or its
// stream-K scheduler (deterministic reduction); both kernels of each GEMM are instantiated. The SM count the
// schedules plan for is the caller's (the launcher reads the device's), so the workspace size and the launch agree.
//
// Workspace: one device buffer per call, sized by *_sm90_workspace_bytes (interleaved activations,
// fp32 scales/mins, CUTLASS's own workspace: stream-K's partial tiles and flags), carved here; a call that
// cannot be implemented returns cudaErrorNotSupported before launching anything (the launcher then takes the
// mma.sync kernels).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "decodekit/common/vec.cuh"  // aligned16: TMA and the epilogue loads want 16-byte aligned bases
#include "decodekit/gemm/mma_plan.h"   // Sm90Schedule
#include "decodekit/gemm/sm90_prepare.cuh"

namespace dk::cuda {
namespace sm90 {

template <class T>
struct CutlassType;
template <>
struct CutlassType<__half> {
  using type = cutlass::half_t;
};
template <>
struct CutlassType<__nv_bfloat16> {
  using type = cutlass::bfloat16_t;
};

constexpr size_t kAlign = 256;  // every carved workspace piece starts 256-byte aligned (TMA wants 16)
inline size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// The tile scheduler tag of a schedule.
template <Sm90Schedule S>
using SchedulerTag = std::conditional_t<S == Sm90Schedule::kStreamK, cutlass::gemm::StreamKScheduler,
                                        cutlass::gemm::PersistentScheduler>;

// The warp-specialized cooperative kernel both GEMMs use: the epilogue (no C operand; D written by TMA,
// Fusion over the fp32 accumulators) built first, its shared memory carved out of the mainloop's stages.
template <class TileShape, class ElementA, class LayoutA, int AlignA, class ElementB, class LayoutB, int AlignB,
          class Out, class LayoutD, class Fusion, Sm90Schedule S>
struct CooperativeGemm {
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<Out>::value;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, Out, LayoutD, kAlignD,
      cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, AlignA, ElementB, LayoutB, AlignB, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, SchedulerTag<S>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// A schedule's run-time arguments: the SM count the grid and stream-K's split plan for (the same in the
// workspace query and the launch); stream-K reduces partial tiles in a fixed order (deterministic).
template <Sm90Schedule S, class Args>
void set_schedule(Args& args, int sm_count) {
  args.hw_info.sm_count = sm_count;
  if constexpr (S == Sm90Schedule::kStreamK)
    args.scheduler.reduction_mode = decltype(args.scheduler.reduction_mode)::Deterministic;
}

// ---------------------------------------------------------------------------------------- INT4

constexpr int kInt4KTile = 64;

template <class T, Sm90Schedule S>
struct Int4Config {
  using Act = typename CutlassType<T>::type;  // activations, output, bias
  using Quant = cutlass::uint4b_t;
  using Scale = float;
  // (weight rows N, tokens M, K) of the transposed problem
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::Int<kInt4KTile>>;
  using LayoutW = cutlass::layout::RowMajor;     // W [N, K], K contiguous
  using LayoutX = cutlass::layout::ColumnMajor;  // X^T as operand B: X [M, K], K contiguous
  using LayoutD = cutlass::layout::ColumnMajor;  // out^T [N, M] column-major = out [M, N] row-major
  using Bias = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, Act, float>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, Act, float, cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90AccFetch, Bias>;
  using Base = CooperativeGemm<TileShape, cute::tuple<Quant, Scale, Scale>, LayoutW,
                               128 / cutlass::sizeof_bits<Quant>::value, Act, LayoutX,
                               128 / cutlass::sizeof_bits<Act>::value, Act, LayoutD, Fusion, S>;
  using Mainloop = typename Base::Mainloop;
  using Kernel = typename Base::Kernel;
  using Gemm = typename Base::Gemm;
};

template <class T, Sm90Schedule S>
typename Int4Config<T, S>::Gemm::Arguments int4_arguments(T* out, const T* x, const uint8_t* qweight,
                                                          const float* s_t, const float* z_t, const T* bias,
                                                          int64_t M, int64_t N, int64_t K, int G, int sm_count) {
  using C = Int4Config<T, S>;
  using Kernel = typename C::Kernel;
  using StrideW = typename Kernel::StrideA;
  using StrideX = typename Kernel::StrideB;
  using StrideD = typename Kernel::StrideD;
  using StrideS = typename C::Mainloop::StrideScale;
  const StrideW dW = cute::make_stride(K, cute::Int<1>{}, N * K);
  const StrideX dX = cute::make_stride(K, cute::Int<1>{}, M * K);
  const StrideD dD = cute::make_stride(cute::Int<1>{}, N, M * N);
  const StrideS dS = cute::make_stride(cute::Int<1>{}, N, N * (K / G));
  typename C::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {int(N), int(M), int(K), 1},
      {reinterpret_cast<const typename C::Quant*>(qweight), dW, reinterpret_cast<const typename C::Act*>(x), dX,
       s_t, dS, G, z_t},
      {{}, nullptr, dD, reinterpret_cast<typename C::Act*>(out), dD}};
  // thread args of the tree: {AccFetch, Bias, plus}
  args.epilogue.thread = {{}, {reinterpret_cast<const typename C::Act*>(bias)}, {}};
  set_schedule<S>(args, sm_count);
  return args;
}

}  // namespace sm90

// The shapes this path takes: G in {64, 128} (a multiple of the K tile), N a multiple of 8 (16-byte
// rows of out^T and of the fp32 scales), M, N and K within int.
inline bool int4_gemm_sm90_shape_ok(int64_t M, int64_t N, int64_t K, int G) {
  return (G == 64 || G == 128) && K % G == 0 && N % 8 == 0 && M > 0 && N > 0 &&
         M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX;
}

namespace sm90 {

template <class T, Sm90Schedule S>
size_t int4_workspace_bytes(int64_t M, int64_t N, int64_t K, int G, int sm_count) {
  const size_t x_bytes = align_up(size_t(M) * size_t(K) * sizeof(T));
  const size_t s_bytes = align_up(size_t(N) * size_t(K / G) * sizeof(float));
  auto args = int4_arguments<T, S>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, M, N, K, G, sm_count);
  const size_t cutlass_bytes = Int4Config<T, S>::Gemm::get_workspace_size(args);
  return x_bytes + 2 * s_bytes + align_up(cutlass_bytes) + kAlign;
}

template <class T, Sm90Schedule S>
cudaError_t int4_gemm(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                      const __half* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G, int sm_count,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const size_t need = int4_workspace_bytes<T, S>(M, N, K, G, sm_count);
  if (workspace_bytes < need || !aligned16(out) || !aligned16(qweight) || !aligned16(bias))
    return cudaErrorNotSupported;
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign);
  T* x = reinterpret_cast<T*>(base);
  base += align_up(size_t(M) * size_t(K) * sizeof(T));
  const int64_t KG = K / G;
  float* s_t = reinterpret_cast<float*>(base);
  base += align_up(size_t(N) * size_t(KG) * sizeof(float));
  float* z_t = reinterpret_cast<float*>(base);
  base += align_up(size_t(N) * size_t(KG) * sizeof(float));
  void* cutlass_ws = base;

  typename Int4Config<T, S>::Gemm gemm;
  auto args = int4_arguments<T, S>(out, x, qweight, s_t, z_t, bias, M, N, K, G, sm_count);
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorNotSupported;
  if (cudaError_t e = int4_sm90_prepare<T>(x, s_t, z_t, a, a_stride, scales, mins, M, N, K, G, stream);
      e != cudaSuccess)
    return e;
  if (gemm.initialize(args, cutlass_ws, stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  if (gemm.run(stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  return cudaGetLastError();
}

}  // namespace sm90

// Bytes of workspace int4_gemm_sm90 needs with schedule `sched` on `sm_count` SMs, or 0 when the shape cannot
// take this path.
template <class T>
size_t int4_gemm_sm90_workspace_bytes(int64_t M, int64_t N, int64_t K, int G, Sm90Schedule sched, int sm_count) {
  if (!int4_gemm_sm90_shape_ok(M, N, K, G) || sm_count <= 0) return 0;
  return sched == Sm90Schedule::kStreamK ? sm90::int4_workspace_bytes<T, Sm90Schedule::kStreamK>(M, N, K, G, sm_count)
                                         : sm90::int4_workspace_bytes<T, Sm90Schedule::kPersistent>(M, N, K, G, sm_count);
}

// out [M, N] = a [M, K] (row stride a_stride) @ dequant(qweight [N, K/2], scales / mins [N, K/G])^T (+ bias [N])
// through the CUTLASS mixed-input kernel, tiles scheduled by `sched` over `sm_count` SMs; workspace:
// int4_gemm_sm90_workspace_bytes(M, N, K, G, sched, sm_count) bytes.
template <class T>
cudaError_t int4_gemm_sm90(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                           const __half* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G,
                           Sm90Schedule sched, int sm_count, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (!int4_gemm_sm90_shape_ok(M, N, K, G) || sm_count <= 0) return cudaErrorNotSupported;
  return sched == Sm90Schedule::kStreamK
             ? sm90::int4_gemm<T, Sm90Schedule::kStreamK>(out, a, a_stride, qweight, scales, mins, bias, M, N, K, G,
                                                          sm_count, workspace, workspace_bytes, stream)
             : sm90::int4_gemm<T, Sm90Schedule::kPersistent>(out, a, a_stride, qweight, scales, mins, bias, M, N, K,
                                                             G, sm_count, workspace, workspace_bytes, stream);
}

// ---------------------------------------------------------------------------------------- fp8

namespace sm90 {

template <class T, Sm90Schedule S>
struct Fp8Config {
  using Out = typename CutlassType<T>::type;
  using E4M3 = cutlass::float_e4m3_t;
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using WScale = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float>;
  using AScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float>;
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, Out, float>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      WScale, cutlass::epilogue::fusion::Sm90AccFetch>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Out, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      AScale, Scaled, Bias>;
  // a [M, K] row-major, weight [N, K] (column-major B), out [M, N] row-major; 16-byte (16-code) alignment
  using Base = CooperativeGemm<TileShape, E4M3, cutlass::layout::RowMajor, 16, E4M3, cutlass::layout::ColumnMajor, 16,
                               Out, cutlass::layout::RowMajor, Fusion, S>;
  using Kernel = typename Base::Kernel;
  using Gemm = typename Base::Gemm;
};

template <class T, Sm90Schedule S>
typename Fp8Config<T, S>::Gemm::Arguments fp8_arguments(T* out, const uint8_t* a, const float* a_scale,
                                                        const uint8_t* w, const float* w_scale, const T* bias,
                                                        int64_t M, int64_t N, int64_t K, int sm_count) {
  using C = Fp8Config<T, S>;
  using Kernel = typename C::Kernel;
  const typename Kernel::StrideA dA = cute::make_stride(K, cute::Int<1>{}, M * K);
  const typename Kernel::StrideB dB = cute::make_stride(K, cute::Int<1>{}, N * K);
  const typename Kernel::StrideD dD = cute::make_stride(N, cute::Int<1>{}, M * N);
  typename C::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {int(M), int(N), int(K), 1},
      {reinterpret_cast<const typename C::E4M3*>(a), dA, reinterpret_cast<const typename C::E4M3*>(w), dB},
      {{}, nullptr, dD, reinterpret_cast<typename C::Out*>(out), dD}};
  // thread args of the tree: {AScale, {WScale, AccFetch, multiplies}, Bias, multiply_add}
  args.epilogue.thread = {{a_scale}, {{w_scale}, {}, {}}, {reinterpret_cast<const typename C::Out*>(bias)}, {}};
  set_schedule<S>(args, sm_count);
  return args;
}

template <class T, Sm90Schedule S>
size_t fp8_workspace_bytes(int64_t M, int64_t N, int64_t K, int sm_count) {
  auto args = fp8_arguments<T, S>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, M, N, K, sm_count);
  return align_up(Fp8Config<T, S>::Gemm::get_workspace_size(args)) + kAlign;
}

template <class T, Sm90Schedule S>
cudaError_t fp8_gemm(T* out, const uint8_t* a, const float* a_scale, const uint8_t* w, const float* w_scale,
                     const T* bias, int64_t M, int64_t N, int64_t K, int sm_count, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream) {
  if (workspace_bytes < fp8_workspace_bytes<T, S>(M, N, K, sm_count) || !aligned16(out) || !aligned16(a) ||
      !aligned16(w) || !aligned16(a_scale) || !aligned16(w_scale) || !aligned16(bias))
    return cudaErrorNotSupported;
  void* ws = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign);
  typename Fp8Config<T, S>::Gemm gemm;
  auto args = fp8_arguments<T, S>(out, a, a_scale, w, w_scale, bias, M, N, K, sm_count);
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorNotSupported;
  if (gemm.initialize(args, ws, stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  if (gemm.run(stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  return cudaGetLastError();
}

}  // namespace sm90

// The shapes this path takes: K and N multiples of 16 (16-byte TMA rows of a / weight and of out), within int.
inline bool fp8_gemm_sm90_shape_ok(int64_t M, int64_t N, int64_t K) {
  return K % 16 == 0 && N % 16 == 0 && M > 0 && N > 0 && K > 0 && M <= INT32_MAX && N <= INT32_MAX &&
         K <= INT32_MAX;
}

// Bytes of workspace fp8_gemm_sm90 needs with schedule `sched` on `sm_count` SMs, or 0 when the shape cannot
// take this path.
template <class T>
size_t fp8_gemm_sm90_workspace_bytes(int64_t M, int64_t N, int64_t K, Sm90Schedule sched, int sm_count) {
  if (!fp8_gemm_sm90_shape_ok(M, N, K) || sm_count <= 0) return 0;
  return sched == Sm90Schedule::kStreamK ? sm90::fp8_workspace_bytes<T, Sm90Schedule::kStreamK>(M, N, K, sm_count)
                                         : sm90::fp8_workspace_bytes<T, Sm90Schedule::kPersistent>(M, N, K, sm_count);
}

// out [M, N] = a_scale[m] * w_scale[n] * (a [M, K] @ w [N, K]^T) (+ bias [N]), e4m3 inputs, fp32 accumulation,
// tiles scheduled by `sched` over `sm_count` SMs; workspace: fp8_gemm_sm90_workspace_bytes(M, N, K, sched,
// sm_count) bytes.
template <class T>
cudaError_t fp8_gemm_sm90(T* out, const uint8_t* a, const float* a_scale, const uint8_t* w, const float* w_scale,
                          const T* bias, int64_t M, int64_t N, int64_t K, Sm90Schedule sched, int sm_count,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!fp8_gemm_sm90_shape_ok(M, N, K) || sm_count <= 0) return cudaErrorNotSupported;
  return sched == Sm90Schedule::kStreamK
             ? sm90::fp8_gemm<T, Sm90Schedule::kStreamK>(out, a, a_scale, w, w_scale, bias, M, N, K, sm_count,
                                                         workspace, workspace_bytes, stream)
             : sm90::fp8_gemm<T, Sm90Schedule::kPersistent>(out, a, a_scale, w, w_scale, bias, M, N, K, sm_count,
                                                            workspace, workspace_bytes, stream);
}

}  // namespace dk::cuda
