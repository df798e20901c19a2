// Weight-quantized GEMM microbenchmarks: INT4 (group-split nibbles + fp16 scale/min) and fp8 W8A8.
// Built twice: as C++ (bench_quant: CPU kernels of gemm/int4.h, gemm/fp8_gemm.h) and, through
// bench_quant.cu, by nvcc (bench_quant_cuda: quant_gemv for M <= 8, the tensor-core int4_gemm_mma
// beyond (rows "int4_gemm"), the Marlin-style int4_gemm_marlin for M <= 64 (rows "int4_gemm_marlin": the
// table's default there, to set against "int4_gemm"); fp8_gemm; with CUTLASS headers (DECODEKIT_CUTLASS) also the sm90 kernels of gemm/sm90_gemm.cuh,
// rows "int4_gemm_sm90" / "fp8_gemm_sm90", bf16 from M = 16: set against the rows above at the same M they
// give the crossovers of the table in csrc/cuda/gemm_launch.cpp; "... stream-k" rows: the same kernels under
// CUTLASS's stream-K scheduler, Sm90Schedule::kStreamK, against the default persistent one). Method: see bench_common.h (rotating
// slots, L2 flushed on the GPU, medians).
//
// Bytes per call = the packed weight (+ scales) + activations + output: at small M the weight
// dominates and the GB/s against the copy ceiling is the figure of merit (decode reads every weight
// once per step); flops = 2 M N K (TFLOP/s for the large-M cases). Compare with bf16 at 2 bytes per
// weight: an INT4 kernel at the same fraction of the copy bandwidth is ~3.6x faster than a
// bandwidth-bound bf16 GEMV.
// Shapes: GPU: Llama-3-8B projections (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336;
// INT4 groups of 128) at M = 1, 4, 16, 32, 64, 128, 512, 4096 (fp16: up to 64), Llama-3-70B (qkv 10240x8192,
// gate_up 57344x8192, down 8192x28672) at M = 1, 16, 64; CPU: SmolLM2-135M (576x576, 1536x576, 576x1536; groups
// of 32) at M = 1, 8, 32 and the 8B down projection at M = 1, and one SmolLM2 layer's four projections back to back at
// M = 1 ("smol.layer", add_int4_layer). --quick: fewer shapes.
#include <string>
#include <type_traits>

#include "bench_common.h"
#include "decodekit/gemm/fp8_gemm.h"
#include "decodekit/gemm/int4.h"
#include "decodekit/gemm/int4_marlin_pack.h"
#include "decodekit/gemm/mma_plan.h"  // Sm90Schedule
#if defined(__CUDACC__)
#include "decodekit/gemm/fp8_gemm.cuh"
#include "decodekit/gemm/int4.cuh"
#include "decodekit/gemm/int4_mma.cuh"
#include "decodekit/gemm/int4_marlin.cuh"
#if defined(DECODEKIT_CUTLASS)
#include "decodekit/gemm/sm90_gemm.cuh"
#endif
#endif

namespace {

struct Shape { int64_t N, K; int G; const char* name; };

std::vector<Shape> shapes(bool quick) {
#if defined(__CUDACC__)
  if (quick) return {{6144, 4096, 128, "8b.qkv"}, {4096, 14336, 128, "8b.down"}};
  return {{6144, 4096, 128, "8b.qkv"},   {4096, 4096, 128, "8b.o"},       {28672, 4096, 128, "8b.gate_up"},
          {4096, 14336, 128, "8b.down"}, {10240, 8192, 128, "70b.qkv"},   {57344, 8192, 128, "70b.gate_up"},
          {8192, 28672, 128, "70b.down"}};
#else
  if (quick) return {{1536, 576, 32, "smol.gate_up"}};
  return {{576, 576, 32, "smol.q"}, {1536, 576, 32, "smol.gate_up"}, {576, 1536, 32, "smol.down"},
          {4096, 14336, 128, "8b.down"}};
#endif
}

template <class T>
std::vector<int64_t> batch(bool quick, const Shape& s) {
#if defined(__CUDACC__)
  if (quick) return {1, 64};
  if (s.name[0] == '7') return {1, 16, 64};  // 70B projections: the decode rows (the binary's time cap)
  if (sizeof(T) == 2 && !std::is_same_v<T, dk::bf16_t>) return {1, 4, 16, 32, 64};
  return {1, 4, 16, 32, 64, 128, 512, 4096};
#else
  if (s.K == 14336) return {1};
  return quick ? std::vector<int64_t>{1, 32} : std::vector<int64_t>{1, 8, 32};
#endif
}

// sm90: the CUTLASS kernel (its workspace carved from the slot too); else the table's CUDA kernel, for
// M > 8 int4_gemm_mma with the split-K plan of gemm/mma_plan.h, or with `splits` ways when > 0
// (the "int4_gemm S=1" rows: the unsplit kernel, to measure the plan against); marlin: int4_gemm_marlin
// with the plan of gemm/mma_plan.h (its column counters zeroed once, left zero by every call); packed: the
// same kernel on int4_marlin_pack.h's layout (rows "int4_gemm_marlin packed": the slot's weight region is the
// packed buffer, scale pairs inside); per_sm > 0: that many CTAs an SM instead of the plan's (at most 2; rows
// "... packed N/SM", to tune the plan); stream_k: the sm90 kernel under the stream-K schedule.
template <class T>
void add_int4(std::vector<dkb::Case>& cases, const Shape& sh, int64_t M, bool sm90 = false, int splits = 0,
              bool marlin = false, bool packed = false, int per_sm_override = 0, bool stream_k = false) {
  const int64_t N = sh.N, K = sh.K, ng = K / sh.G;
  const int G = sh.G;
  size_t ws_bytes = 0;
  [[maybe_unused]] int sm90_sms = 0;  // (CUTLASS builds only)
  [[maybe_unused]] const dk::cuda::Sm90Schedule sched =
      stream_k ? dk::cuda::Sm90Schedule::kStreamK : dk::cuda::Sm90Schedule::kPersistent;
  [[maybe_unused]] int ctas = 0;  // (CUDA builds only)
  [[maybe_unused]] unsigned* counters = nullptr;
#if defined(__CUDACC__)
  if constexpr (sizeof(T) == 2) {
    if (marlin) {
      using D = dkb::cuda_t<T>;
      int sms = 0;
      if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) sms = 1;
      const cudaError_t e = packed ? dk::cuda::int4_marlin_prepare<D, true>(M) : dk::cuda::int4_marlin_prepare<D, false>(M);
      if (e != cudaSuccess) return;
      const int per_sm = packed ? dk::cuda::int4_marlin_ctas_per_sm<D, true>(M) : dk::cuda::int4_marlin_ctas_per_sm<D, false>(M);
      ctas = dk::cuda::int4_marlin_ctas(N, K, sms, per_sm);
      if (per_sm_override > 0)
        ctas = int(std::min<int64_t>(dk::cuda::int4_marlin_units(N, K), int64_t(sms) * std::min(per_sm, per_sm_override)));
      ws_bytes = dk::cuda::int4_marlin_partial_floats(M, N, ctas) * sizeof(float);
      const size_t cbytes = size_t(dk::cuda::int4_marlin_columns(N)) * sizeof(unsigned);
      if (cudaMalloc(&counters, cbytes) != cudaSuccess || cudaMemset(counters, 0, cbytes) != cudaSuccess) return;
    }
  }
  if (!sm90 && !marlin && M > dk::cuda::kQuantGemvRows) {
    int sms = 0;
    if (splits <= 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) sms = 0;
    if (splits <= 0) splits = dk::cuda::int4_mma_splits(M, N, K, G, sms);
    if (splits > 1) ws_bytes = size_t(splits) * size_t(M * N) * sizeof(float);
  }
#endif
#if defined(__CUDACC__) && defined(DECODEKIT_CUTLASS)
  if constexpr (sizeof(T) == 2)
    if (sm90) {
      if (cudaDeviceGetAttribute(&sm90_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return;
      ws_bytes = dk::cuda::int4_gemm_sm90_workspace_bytes<dkb::cuda_t<T>>(M, N, K, G, sched, sm90_sms);
    }
#endif
  auto carve = [=](char* s, uint8_t*& q, dk::half_t*& sc, dk::half_t*& mn, T*& a, T*& out, char*& ws) {
    dkb::Carver c{s};
    q = c.take<uint8_t>(packed ? dk::int4_marlin_packed_bytes(N, K, G) : N * K / 2);  // [N, K/2] or packed
    sc = c.take<dk::half_t>(N * ng);    // [N, K/G]
    mn = c.take<dk::half_t>(N * ng);    // [N, K/G]
    a = c.take<T>(M * K);               // [M, K]
    out = c.take<T>(M * N);             // [M, N]
    ws = c.take<char>(int64_t(ws_bytes));
    return c.used;
  };
  dkb::Case c;
  c.bench = sm90 ? (stream_k ? "int4_gemm_sm90 stream-k" : "int4_gemm_sm90")
          : marlin ? (packed ? (per_sm_override > 0 ? "int4_gemm_marlin packed " + std::to_string(per_sm_override) + "/SM"
                                                    : std::string("int4_gemm_marlin packed"))
                             : std::string("int4_gemm_marlin"))
          : splits == 1 && M > 8 ? "int4_gemm S=1" : "int4_gemm";
  c.shape = std::string(sh.name) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " G=" + std::to_string(G) +
            " M=" + std::to_string(M);
  c.dtype = dkb::DtypeName<T>::value;
  c.bytes = double(N) * K / 2 + 4.0 * N * ng + double(M) * (K + N) * sizeof(T);
  c.flops = 2.0 * M * N * K;
  uint8_t* q; dk::half_t *sc, *mn; T *a, *out; char* ws;
  c.slot_bytes = carve(nullptr, q, sc, mn, a, out, ws);
  c.big = M * N * K > (int64_t(1) << 33);
  c.cpu = [=](char* s) {
    uint8_t* q; dk::half_t *sc, *mn; T *a, *out; char* ws;
    carve(s, q, sc, mn, a, out, ws);
    dk::cpu::int4_gemm<T>(out, a, q, sc, mn, nullptr, dk::cpu::Int4GemmParams{M, N, K, G, K});
  };
#if defined(__CUDACC__)
  c.gpu = [=](char* s, cudaStream_t st) {
    using D = dkb::cuda_t<T>;
    uint8_t* q; dk::half_t *sc, *mn; T *a, *out; char* ws;
    carve(s, q, sc, mn, a, out, ws);
    const __half* hs = reinterpret_cast<const __half*>(sc);
    const __half* hm = reinterpret_cast<const __half*>(mn);
#if defined(DECODEKIT_CUTLASS)
    if constexpr (sizeof(T) == 2)
      if (sm90)
        return dk::cuda::int4_gemm_sm90<D>(reinterpret_cast<D*>(out), reinterpret_cast<const D*>(a), K, q, hs, hm,
                                           nullptr, M, N, K, G, sched, sm90_sms, ws, ws_bytes, st);
#endif
    if (marlin && packed)
      return dk::cuda::int4_gemm_marlin_packed<D>(reinterpret_cast<D*>(out), reinterpret_cast<const D*>(a), K,
                                                  reinterpret_cast<const D*>(q), nullptr, M, N, K, G, ctas,
                                                  reinterpret_cast<float*>(ws), counters, st);
    if (marlin)
      return dk::cuda::int4_gemm_marlin<D>(reinterpret_cast<D*>(out), reinterpret_cast<const D*>(a), K, q, hs, hm,
                                           nullptr, M, N, K, G, ctas, reinterpret_cast<float*>(ws), counters, st);
    if (M <= dk::cuda::kQuantGemvRows)
      return dk::cuda::quant_gemv<D>(reinterpret_cast<D*>(out), reinterpret_cast<const D*>(a), K, q, hs, hm, nullptr,
                                     int(M), N, K, G, true, st);
    return dk::cuda::int4_gemm_mma<D>(reinterpret_cast<D*>(out), reinterpret_cast<const D*>(a), K, q, hs, hm, nullptr,
                                      M, N, K, G, splits, splits > 1 ? reinterpret_cast<float*>(ws) : nullptr, st);
  };
#endif
  cases.push_back(std::move(c));
}

// sm90: the CUTLASS kernel (stream_k: under the stream-K schedule); else the mma.sync kernel with the split-K
// plan, or `splits` ways when > 0.
template <class T>
void add_fp8(std::vector<dkb::Case>& cases, const Shape& sh, int64_t M, bool sm90 = false, int splits = 0,
             bool stream_k = false) {
  const int64_t N = sh.N, K = sh.K;
  size_t wk_bytes = 0;
  [[maybe_unused]] int sm90_sms = 0;  // (CUTLASS builds only)
  [[maybe_unused]] const dk::cuda::Sm90Schedule sched =
      stream_k ? dk::cuda::Sm90Schedule::kStreamK : dk::cuda::Sm90Schedule::kPersistent;
#if defined(__CUDACC__)
  if (!sm90) {
    int sms = 0;
    if (splits <= 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) sms = 0;
    if (splits <= 0) splits = dk::cuda::fp8_mma_splits(M, N, K, sms);
    if (splits > 1) wk_bytes = size_t(splits) * size_t(M * N) * sizeof(float);
  }
#endif
#if defined(__CUDACC__) && defined(DECODEKIT_CUTLASS)
  if constexpr (sizeof(T) == 2)
    if (sm90) {
      if (cudaDeviceGetAttribute(&sm90_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return;
      wk_bytes = dk::cuda::fp8_gemm_sm90_workspace_bytes<dkb::cuda_t<T>>(M, N, K, sched, sm90_sms);
    }
#endif
  auto carve = [=](char* s, uint8_t*& a, float*& as, uint8_t*& w, float*& ws, T*& out, char*& wk) {
    dkb::Carver c{s};
    a = c.take<uint8_t>(M * K);   // [M, K] e4m3
    as = c.take<float>(M);        // [M]
    w = c.take<uint8_t>(N * K);   // [N, K] e4m3
    ws = c.take<float>(N);        // [N]
    out = c.take<T>(M * N);       // [M, N]
    wk = c.take<char>(int64_t(wk_bytes));
    return c.used;
  };
  dkb::Case c;
  c.bench = sm90 ? (stream_k ? "fp8_gemm_sm90 stream-k" : "fp8_gemm_sm90") : splits == 1 ? "fp8_gemm S=1" : "fp8_gemm";
  c.shape = std::string(sh.name) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " M=" + std::to_string(M);
  c.dtype = dkb::DtypeName<T>::value;
  c.bytes = double(N) * K + 4.0 * (N + M) + double(M) * K + double(M) * N * sizeof(T);
  c.flops = 2.0 * M * N * K;
  uint8_t *a, *w; float *as, *ws; T* out; char* wk;
  c.slot_bytes = carve(nullptr, a, as, w, ws, out, wk);
  c.big = M * N * K > (int64_t(1) << 33);
  c.cpu = [=](char* s) {
    uint8_t *a, *w; float *as, *ws; T* out; char* wk;
    carve(s, a, as, w, ws, out, wk);
    dk::cpu::fp8_gemm<T>(out, a, as, w, ws, nullptr, M, N, K);
  };
#if defined(__CUDACC__)
  c.gpu = [=](char* s, cudaStream_t st) {
    using D = dkb::cuda_t<T>;
    uint8_t *a, *w; float *as, *ws; T* out; char* wk;
    carve(s, a, as, w, ws, out, wk);
#if defined(DECODEKIT_CUTLASS)
    if constexpr (sizeof(T) == 2)
      if (sm90)
        return dk::cuda::fp8_gemm_sm90<D>(reinterpret_cast<D*>(out), a, as, w, ws, nullptr, M, N, K, sched, sm90_sms,
                                          wk, wk_bytes, st);
#endif
    return dk::cuda::fp8_gemm<D>(reinterpret_cast<D*>(out), a, as, w, ws, nullptr, M, N, K, splits,
                                 splits > 1 ? reinterpret_cast<float*>(wk) : nullptr, st);
  };
#endif
  cases.push_back(std::move(c));
}

#if !defined(__CUDACC__)
// One SmolLM2 decoder layer's INT4 projections at M = 1 as the model runs them: qkv, o, gate_up, down (four shapes
// back to back, each from memory: the slot is the layer's four weights), bytes = the four weights. The single-shape
// cases above repeat one shape; this chain is what a decode step does 30 times (the GEMV's per-call start-up and
// its tail weigh more here).
template <class T>
void add_int4_layer(std::vector<dkb::Case>& cases) {
  constexpr int G = 32;
  const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};  // {N, K}
  auto carve = [=](char* s, uint8_t* (&q)[4], dk::half_t* (&sc)[4], dk::half_t* (&mn)[4], T*& a, T*& out) {
    dkb::Carver c{s};
    for (int i = 0; i < 4; ++i) {
      const int64_t N = shapes[i][0], K = shapes[i][1];
      q[i] = c.take<uint8_t>(N * K / 2);     // [N, K/2]
      sc[i] = c.take<dk::half_t>(N * K / G);  // [N, K/G]
      mn[i] = c.take<dk::half_t>(N * K / G);  // [N, K/G]
    }
    a = c.take<T>(1536);    // [1, K] (the largest K)
    out = c.take<T>(3072);  // [1, N] (the largest N)
    return c.used;
  };
  dkb::Case c;
  c.bench = "int4_gemm";
  c.shape = "smol.layer qkv+o+gate_up+down G=32 M=1";
  c.dtype = dkb::DtypeName<T>::value;
  c.bytes = 0;
  c.flops = 0;
  for (const auto& sh : shapes) {
    c.bytes += double(sh[0]) * sh[1] / 2 + 4.0 * sh[0] * sh[1] / G;
    c.flops += 2.0 * sh[0] * sh[1];
  }
  uint8_t* q[4]; dk::half_t *sc[4], *mn[4]; T *a, *out;
  c.slot_bytes = carve(nullptr, q, sc, mn, a, out);
  c.cpu = [=](char* s) {
    uint8_t* q[4]; dk::half_t *sc[4], *mn[4]; T *a, *out;
    carve(s, q, sc, mn, a, out);
    for (int i = 0; i < 4; ++i)
      dk::cpu::int4_gemm<T>(out, a, q[i], sc[i], mn[i], nullptr,
                            dk::cpu::Int4GemmParams{1, shapes[i][0], shapes[i][1], G, shapes[i][1]});
  };
  cases.push_back(std::move(c));
}
#endif

template <class T>
void add_cases(std::vector<dkb::Case>& cases, bool quick) {
  if constexpr (sizeof(T) == 4) {
#if defined(__CUDACC__)
    return;  // the tensor-core paths take fp16 / bf16
#endif
  }
#if !defined(__CUDACC__)
  add_int4_layer<T>(cases);
#endif
  for (const Shape& sh : shapes(quick))
    for (int64_t M : batch<T>(quick, sh)) {
      add_int4<T>(cases, sh, M);
      add_fp8<T>(cases, sh, M);
#if defined(__CUDACC__)
      if (M <= dk::cuda::kMarlinMaxM) add_int4<T>(cases, sh, M, false, 0, true);
      if (M <= dk::cuda::kMarlinMaxM) add_int4<T>(cases, sh, M, false, 0, true, true);
      if (std::is_same_v<T, dk::bf16_t> && (M == 1 || M == 16)) {  // the CTAs-per-SM plan (2) against 1, 3, 4
        for (int ps : {1, 3, 4}) add_int4<T>(cases, sh, M, false, 0, true, true, ps);
      }
      if (std::is_same_v<T, dk::bf16_t> && (M == 16 || M == 64)) {
        add_int4<T>(cases, sh, M, false, 1);
        add_fp8<T>(cases, sh, M, false, 1);
      }
#endif
#if defined(__CUDACC__) && defined(DECODEKIT_CUTLASS)
      if (std::is_same_v<T, dk::bf16_t> && M >= 16) {
        add_int4<T>(cases, sh, M, true);
        add_fp8<T>(cases, sh, M, true);
      }
      if (std::is_same_v<T, dk::bf16_t> && M <= 512) {  // where the persistent tiles can leave SMs idle; M < 16:
        add_int4<T>(cases, sh, M, true, 0, false, false, 0, true);  // against the decode-sized kernels' rows
        add_fp8<T>(cases, sh, M, true, 0, true);
      }
#endif
    }
}

}  // namespace

DKB_BENCH_MAIN("bench_quant", add_cases)
