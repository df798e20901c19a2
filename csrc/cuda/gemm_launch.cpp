// Torch launchers for int4_gemm, int8_gemm, int4_dequantize, quantize_fp8 and fp8_gemm (CUDA dispatch key);
// the kernels are instantiated in gemm.cu (gemm/int4.cuh, int4_mma.cuh, fp8_gemm.cuh) and gemm_sm90_*.cu
// (gemm/sm90_gemm.cuh, CUTLASS). Host code, g++, CUDA build only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../op_args_marlin.h"
#include "dispatch.h"
#include "launchers.h"

namespace {

// Kernel table (rows of a = M). fp8's crossover is measured (bench_quant_cuda on the H200, 2026-12-04,
// bench/results/20261204-1700_H200_gpu_check.md): fp8_gemm_sm90 took 16.0-189 us where fp8_gemm took
// 22.8-333 us at M = 16 on the 8B / 70B shapes (1.3-1.8x), 2-3.5x at M = 32..64, and its time is flat in M
// up to the 128-row tile; below M = 16 it is not measured yet. INT4: Marlin won at M <= 32 on every shape
// (a tie on 8b.qkv at 32) and at M = 64 on the down projections (K = 14336, 28672: 1.3x), the sm90 kernel
// at M = 64 on the five with K <= 8192 (1.1-1.7x; Marlin's cost steps at M = 33, its 64-row tiles, the
// sm90 kernel's is flat to 128): sm90 from M = 33 where K <= 8192, from 128 otherwise.
//   int4_gemm  M <= 64 (fp16 / bf16, a's row stride  int4_gemm_marlin (Marlin-style: 4-stage cp.async pipeline,
//              a multiple of 16 bytes)              magic-number decode, mma.sync, striped units over all SMs,
//                                                   in-kernel reduction of split columns: gemm/int4_marlin.cuh)
//              M <= 8 otherwise (fp32, strides)     quant_gemv (one warp per output row, weights streamed)
//              9 <= M < 128, or G = 32, or N % 8 > 0 int4_gemm_mma (mma.sync m16n8k16, codes decoded in registers;
//                                                   split-K when the grid is small: gemm/mma_plan.h)
//              M >= 128 (33 if K <= 8192),           int4_gemm_sm90 (CUTLASS mixed input: TMA, wgmma, 128 x 128
//              G in {64, 128}, N % 8 == 0
//                                                   tiles of (N, M): below one M tile most of it idles)
//   fp8_gemm   M < 16, fp32 out, or N, K % 16 > 0   fp8_gemm (mma.sync m16n8k32 e4m3; ptxas lowers it to HMMA;
//                                                   split-K when the grid is small: gemm/mma_plan.h)
//              M >= 16, fp16 / bf16 out             fp8_gemm_sm90 (CUTLASS: QGMMA e4m3, per-token x per-channel
//                                                   scales and bias in the epilogue)
constexpr int64_t kInt4Sm90MinM = 128;
constexpr int64_t kInt4Sm90MinMShortK = 33, kInt4Sm90ShortK = 8192;  // measured (above)
int64_t int4_sm90_min_m(int64_t K) { return K <= kInt4Sm90ShortK ? kInt4Sm90MinMShortK : kInt4Sm90MinM; }
constexpr int64_t kFp8Sm90MinM = 16;

// DECODEKIT_SM90_GEMM: "auto" (default: the table above), "always" (whenever the shape allows, at any M:
// tests and benchmarks), "never" (the mma.sync kernels only). Read per call, so tests can switch it.
enum class Sm90Policy { kAuto, kAlways, kNever };

Sm90Policy sm90_policy(const char* op) {
  const char* v = std::getenv("DECODEKIT_SM90_GEMM");
  if (v == nullptr || *v == 0 || std::strcmp(v, "auto") == 0) return Sm90Policy::kAuto;
  if (std::strcmp(v, "always") == 0) return Sm90Policy::kAlways;
  if (std::strcmp(v, "never") == 0) return Sm90Policy::kNever;
  TORCH_CHECK(false, op, ": environment variable DECODEKIT_SM90_GEMM = '", v,
              "' must be one of 'auto', 'always', 'never'");
}

// DECODEKIT_INT4_MARLIN: "auto" (default) / "both": int4_gemm takes the Marlin-style kernel for M <= 64 where the
// table and the call allow it, on the packed copy when one is given (decodekit.ops passes the weight's, made at
// model load; "auto" models hold their weights as that copy alone and call int4_gemm_marlin), else on int4.h's
// layout; "unpacked": always int4.h's layout (A/B measurements); "never": the GEMV / mma.sync kernels (tests,
// benchmarks, a fallback). Read per call.
bool want_marlin(const char* op) {
  const char* v = std::getenv("DECODEKIT_INT4_MARLIN");
  if (v == nullptr || *v == 0 || std::strcmp(v, "auto") == 0 || std::strcmp(v, "both") == 0 ||
      std::strcmp(v, "unpacked") == 0)
    return true;
  if (std::strcmp(v, "never") == 0) return false;
  TORCH_CHECK(false, op, ": environment variable DECODEKIT_INT4_MARLIN = '", v,
              "' must be 'auto', 'both', 'unpacked' or 'never'");
}
bool marlin_unpacked_only() {
  const char* v = std::getenv("DECODEKIT_INT4_MARLIN");
  return v != nullptr && std::strcmp(v, "unpacked") == 0;
}

// The Marlin kernel's per-(device, stream) column counters (kMarlinMaxColumns zeros, left zero by every
// launch, so graph replays need no memset; one buffer per stream: launches on two streams may overlap),
// its shared-memory opt-in and occupancy per (device, type, rows). Kept for the process, never freed.
struct MarlinState {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, unsigned*> counters;
  std::map<std::tuple<int, int, int, bool>, int> ctas_per_sm;  // (device, type tag, rows, packed) -> CTAs an SM
};

// kMarlinMaxColumns zeroed counters on the current device, made outside any graph capture in progress
// (the first call may come while a stream captures: relaxed capture mode for this thread, cudaMalloc, a
// memset on a private stream, synchronized), so a captured graph never depends on a memset of its own.
unsigned* marlin_new_counters() {
  const size_t bytes = size_t(dk::cuda::kMarlinMaxColumns) * sizeof(unsigned);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  dk::check_launch("decodekit::int4_gemm (capture mode)", cudaThreadExchangeStreamCaptureMode(&mode));
  unsigned* p = nullptr;
  cudaStream_t side = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, bytes, side);
  if (e == cudaSuccess) e = cudaStreamSynchronize(side);
  if (side != nullptr) cudaStreamDestroy(side);
  cudaThreadExchangeStreamCaptureMode(&mode);  // back to the caller's mode
  if (e != cudaSuccess && p != nullptr) cudaFree(p);
  dk::check_launch("decodekit::int4_gemm (Marlin counters)", e);
  return p;
}
MarlinState& marlin_state() {
  static MarlinState* s = new MarlinState;  // leaked on purpose (see above)
  return *s;
}

template <class T, bool kPacked>
void marlin_setup(const at::Tensor& like, int64_t M, cudaStream_t stream, unsigned** counters, int* per_sm) {
  MarlinState& st = marlin_state();
  std::lock_guard<std::mutex> lock(st.mu);
  const int dev = like.get_device();
  const auto ckey = std::make_tuple(dev, std::is_same_v<T, __half> ? 0 : 1, dk::cuda::int4_marlin_rows(M), kPacked);
  auto occ = st.ctas_per_sm.find(ckey);
  if (occ == st.ctas_per_sm.end()) {
    dk::check_launch("decodekit::int4_gemm (Marlin shared-memory opt-in)",
                     dk::cuda::int4_marlin_prepare<T, kPacked>(M));
    occ = st.ctas_per_sm.emplace(ckey, dk::cuda::int4_marlin_ctas_per_sm<T, kPacked>(M)).first;
  }
  *per_sm = occ->second;
  const auto key = std::make_pair(dev, stream);
  auto it = st.counters.find(key);
  if (it == st.counters.end()) it = st.counters.emplace(key, marlin_new_counters()).first;
  *counters = it->second;
}

// DECODEKIT_SM90_SCHEDULE: the sm90 GEMMs' tile schedule (Sm90Schedule, gemm/mma_plan.h): "persistent" (default:
// the data-parallel kernel measured on the H200, 2026-12-04) or "stream-k" (K ranges of the tiles over all SMs
// where the tiles alone leave SMs idle, e.g. N = 4096 at M <= 128: 32 tiles for 132 SMs; not yet measured, so
// not the default: bench_quant_cuda's "... stream-k" rows set the two side by side). Read per call.
dk::cuda::Sm90Schedule sm90_schedule(const char* op) {
  const char* v = std::getenv("DECODEKIT_SM90_SCHEDULE");
  if (v == nullptr || *v == 0 || std::strcmp(v, "persistent") == 0) return dk::cuda::Sm90Schedule::kPersistent;
  if (std::strcmp(v, "stream-k") == 0) return dk::cuda::Sm90Schedule::kStreamK;
  TORCH_CHECK(false, op, ": environment variable DECODEKIT_SM90_SCHEDULE = '", v,
              "' must be 'persistent' or 'stream-k'");
}

bool want_sm90(const char* op, int64_t M, int64_t min_m) {
  const Sm90Policy p = sm90_policy(op);
  return p == Sm90Policy::kAlways || (p == Sm90Policy::kAuto && M >= min_m);
}

// K = 0: every sum is empty, out = bias (or 0), no kernel (the kernels' plans assume K > 0). True when it was.
bool empty_k(at::Tensor& out, const std::optional<at::Tensor>& bias, int64_t K) {
  if (K != 0) return false;
  if (bias.has_value()) out.copy_(bias->expand_as(out));
  else out.zero_();
  return true;
}

// Multiprocessors of the tensor's GPU (the split-K plans of gemm/mma_plan.h).
int sm_count(const at::Tensor& t) {
  int n = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, t.get_device());
  TORCH_CHECK(err == cudaSuccess, "decodekit: cannot read the GPU's multiprocessor count: ",
              cudaGetErrorString(err));
  return n;
}

// The Marlin-style kernel (gemm/int4_marlin.cuh), fp16 / bf16 a: on the packed copy when `packed` is given,
// else on int4.h's layout (qweight, scales, mins); its workspace from the caching allocator, its counters and
// shared-memory opt-in from marlin_setup. The callers checked shapes and a's alignment (int4_marlin_supported).
void launch_marlin(const char* op, at::Tensor& out, const at::Tensor& a, const dk::GemmArgs& g, int G,
                   const std::optional<at::Tensor>& bias, const at::Tensor* packed, const at::Tensor* qweight,
                   const at::Tensor* scales, const at::Tensor* mins) {
  auto run = [&](auto type_tag) {
    using T = decltype(type_tag);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    unsigned* counters = nullptr;
    int per_sm = 1;
    if (packed) marlin_setup<T, true>(a, g.M, stream, &counters, &per_sm);
    else marlin_setup<T, false>(a, g.M, stream, &counters, &per_sm);
    const int ctas = dk::cuda::int4_marlin_ctas(g.N, g.K, sm_count(a), per_sm);
    at::Tensor partial = at::empty({int64_t(dk::cuda::int4_marlin_partial_floats(g.M, g.N, ctas))},
                                   a.options().dtype(at::kFloat));
    const T* b = bias.has_value() ? dk::cuda_ptr<T>(*bias) : nullptr;
    if (packed)
      dk::check_launch(op, dk::cuda::int4_gemm_marlin_packed<T>(dk::cuda_ptr<T>(out), dk::cuda_ptr<T>(a), g.a_stride,
                                                                dk::cuda_ptr<T>(*packed), b, g.M, g.N, g.K, G, ctas,
                                                                partial.data_ptr<float>(), counters, stream));
    else
      dk::check_launch(op, dk::cuda::int4_gemm_marlin<T>(dk::cuda_ptr<T>(out), dk::cuda_ptr<T>(a), g.a_stride,
                                                         qweight->data_ptr<uint8_t>(), dk::cuda_ptr<__half>(*scales),
                                                         dk::cuda_ptr<__half>(*mins), b, g.M, g.N, g.K, G, ctas,
                                                         partial.data_ptr<float>(), counters, stream));
  };
  if (a.scalar_type() == at::kHalf) run(__half{});
  else run(__nv_bfloat16{});
}

// The fp32 partial sums [splits, M, N] of a split-K launch (splits > 1), else null.
float* splitk_partial(at::Tensor& holder, int splits, int64_t M, int64_t N, const at::Tensor& like) {
  if (splits <= 1) return nullptr;
  holder = at::empty({splits, M, N}, like.options().dtype(at::kFloat));
  return holder.data_ptr<float>();
}

// Runs launch(workspace pointer, bytes) with a workspace of `bytes` from the caching allocator (graph-safe);
// true when it ran, false when the path declined the call (cudaErrorNotSupported: nothing was launched).
template <class F>
bool try_sm90(const char* op, const at::Tensor& like, size_t bytes, F&& launch) {
  if (bytes == 0) return false;
  at::Tensor ws = at::empty({int64_t(bytes)}, like.options().dtype(at::kByte));
  const cudaError_t err = launch(ws.data_ptr(), bytes);
  if (err == cudaErrorNotSupported) return false;
  dk::check_launch(op, err);
  return true;
}

void int4_gemm_cuda(at::Tensor& out,                        // [M, N]
                    const at::Tensor& a,                    // [M, K]
                    const at::Tensor& qweight,              // [N, K / 2] uint8
                    const at::Tensor& scales,               // [N, K / G] float16
                    const at::Tensor& mins,                 // [N, K / G] float16
                    int64_t group_size,
                    const std::optional<at::Tensor>& bias,     // [N]
                    const std::optional<at::Tensor>& packed,  // int4_marlin_pack's layout for a's dtype
                    int64_t /*decode_rows*/) {                // the CPU's batch invariance: ignored here
  const char* op = "decodekit::int4_gemm";
  const dk::GemmArgs g = dk::quant_gemm_args(op, out, a, qweight, scales, &mins, group_size, bias);
  dk::check_cuda(op, "a", a);
  if (packed.has_value()) dk::int4_gemm_packed_check(op, *packed, a, g, group_size);
  // M <= 8: the GEMV kernels (any dtype); more rows: the tensor-core GEMM (fp16 / bf16)
  if (a.scalar_type() == at::kFloat)
    dk::check_range<int64_t>(op, "a.size(0) (M) on CUDA with float32 activations (larger M: fp16/bf16)", g.M, 0,
                             dk::cuda::kQuantGemvMaxM);
  if (g.M == 0 || g.N == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  if (empty_k(out, bias, g.K)) return;
  if (a.scalar_type() != at::kFloat && want_sm90(op, g.M, int4_sm90_min_m(g.K))) {
    const dk::cuda::Sm90Schedule sched = sm90_schedule(op);
    const int sms = sm_count(a);
    auto run = [&](auto type_tag) {
      using T = decltype(type_tag);
      return try_sm90(op, a, dk::cuda::int4_gemm_sm90_workspace_bytes<T>(g.M, g.N, g.K, int(group_size), sched, sms),
                      [&](void* ws, size_t bytes) {
                        return dk::cuda::int4_gemm_sm90<T>(
                            dk::cuda_ptr<T>(out), dk::cuda_ptr<T>(a), g.a_stride, qweight.data_ptr<uint8_t>(),
                            dk::cuda_ptr<__half>(scales), dk::cuda_ptr<__half>(mins),
                            bias.has_value() ? dk::cuda_ptr<T>(*bias) : nullptr, g.M, g.N, g.K, int(group_size),
                            sched, sms, ws, bytes, c10::cuda::getCurrentCUDAStream());
                      });
    };
    if (a.scalar_type() == at::kHalf ? run(__half{}) : run(__nv_bfloat16{})) return;
  }
  if (a.scalar_type() != at::kFloat && want_marlin(op) &&
      dk::cuda::int4_marlin_supported(g.M, g.N, g.K, int(group_size), g.a_stride * int64_t(a.element_size())) &&
      reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(qweight.data_ptr()) % 16 == 0) {
    // the packed copy when given (and not DECODEKIT_INT4_MARLIN=unpacked): the same numbers, fewer instructions
    const bool use_packed = packed.has_value() && !marlin_unpacked_only();
    launch_marlin(op, out, a, g, int(group_size), bias, use_packed ? &*packed : nullptr, &qweight, &scales, &mins);
    return;
  }
  if (g.M > dk::cuda::kQuantGemvMaxM) {
    const int splits = dk::cuda::int4_mma_splits(g.M, g.N, g.K, int(group_size), sm_count(a));
    at::Tensor holder;
    float* partial = splitk_partial(holder, splits, g.M, g.N, a);
    DK_CUDA_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
      dk::check_launch(op, dk::cuda::int4_gemm_mma<scalar_t>(
                               dk::cuda_ptr<scalar_t>(out), dk::cuda_ptr<scalar_t>(a), g.a_stride,
                               qweight.data_ptr<uint8_t>(), dk::cuda_ptr<__half>(scales), dk::cuda_ptr<__half>(mins),
                               bias.has_value() ? dk::cuda_ptr<scalar_t>(*bias) : nullptr, g.M, g.N, g.K,
                               int(group_size), splits, partial, c10::cuda::getCurrentCUDAStream()));
    });
    return;
  }
  DK_CUDA_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::quant_gemv<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), dk::cuda_ptr<scalar_t>(a), g.a_stride,
                             qweight.data_ptr<uint8_t>(), dk::cuda_ptr<__half>(scales), dk::cuda_ptr<__half>(mins),
                             bias.has_value() ? dk::cuda_ptr<scalar_t>(*bias) : nullptr, int(g.M), g.N, g.K,
                             int(group_size), true, c10::cuda::getCurrentCUDAStream()));
  });
}

void int4_marlin_pack_cuda(at::Tensor& out,            // [int4_marlin_packed_bytes / 2] float16 / bfloat16
                           const at::Tensor& qweight,  // [N, K / 2] uint8
                           const at::Tensor& scales,   // [N, K / G] float16
                           const at::Tensor& mins,     // [N, K / G] float16
                           int64_t group_size) {
  const char* op = "decodekit::int4_marlin_pack";
  const dk::GemmArgs g = dk::int4_marlin_pack_args(out, qweight, scales, mins, group_size);
  dk::check_cuda(op, "qweight", qweight);
  c10::cuda::OptionalCUDAGuard guard(out.device());
  auto run = [&](auto type_tag) {
    using T = decltype(type_tag);
    dk::check_launch(op, dk::cuda::int4_marlin_pack<T>(dk::cuda_ptr<T>(out), qweight.data_ptr<uint8_t>(),
                                                       dk::cuda_ptr<__half>(scales), dk::cuda_ptr<__half>(mins), g.N,
                                                       g.K, int(group_size), c10::cuda::getCurrentCUDAStream()));
  };
  if (out.scalar_type() == at::kHalf) run(__half{});
  else run(__nv_bfloat16{});
}

// int4_gemm_marlin: the Marlin-style kernel on the packed layout (gemm/int4_marlin.cuh), M <= 64.
void int4_gemm_marlin_cuda(at::Tensor& out,                        // [M, N]
                           const at::Tensor& a,                    // [M, K]
                           const at::Tensor& packed,               // [int4_marlin_packed_bytes / 2]
                           int64_t n, int64_t k, int64_t group_size,
                           const std::optional<at::Tensor>& bias) {  // [N]
  const char* op = "decodekit::int4_gemm_marlin";
  const dk::GemmArgs g = dk::int4_gemm_marlin_args(out, a, packed, n, k, group_size, bias);
  dk::check_cuda(op, "a", a);
  dk::check_range<int64_t>(op, "a.size(0) (M) on CUDA", g.M, 0, dk::cuda::kMarlinMaxM);
  TORCH_CHECK((g.a_stride * int64_t(a.element_size())) % 16 == 0 && reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0,
              op, ": 'a' must start 16-byte aligned with a row stride of a multiple of 16 bytes, got stride ",
              g.a_stride);
  if (g.M == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  if (empty_k(out, bias, g.K)) return;
  launch_marlin(op, out, a, g, int(group_size), bias, &packed, nullptr, nullptr, nullptr);
}

// int4_marlin_dequantize: rows of a weight held in the Marlin layout alone (gemm/int4_marlin.cuh).
void int4_marlin_dequantize_cuda(at::Tensor& out,           // [R, K] packed's dtype
                                 const at::Tensor& packed,  // [int4_marlin_packed_bytes / 2]
                                 int64_t n, int64_t k, int64_t group_size, int64_t row0) {
  const char* op = "decodekit::int4_marlin_dequantize";
  const dk::GemmArgs g = dk::int4_marlin_dequantize_args(out, packed, n, k, group_size, row0);
  dk::check_cuda(op, "packed", packed);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0, op, ": 'out' must start 16-byte aligned");
  c10::cuda::OptionalCUDAGuard guard(out.device());
  auto run = [&](auto type_tag) {
    using T = decltype(type_tag);
    dk::check_launch(op, dk::cuda::int4_marlin_dequantize<T>(dk::cuda_ptr<T>(out), dk::cuda_ptr<T>(packed), n, k,
                                                             int(group_size), row0, g.M,
                                                             c10::cuda::getCurrentCUDAStream()));
  };
  if (out.scalar_type() == at::kHalf) run(__half{});
  else run(__nv_bfloat16{});
}

void int8_gemm_cuda(at::Tensor& out,                        // [M, N]
                    const at::Tensor& a,                    // [M, K]
                    const at::Tensor& qweight,              // [N, K] int8
                    const at::Tensor& scales,               // [N, K / G] float16
                    int64_t group_size,
                    const std::optional<at::Tensor>& bias,     // [N]
                    const std::optional<at::Tensor>& packed,  // the CPU's AMX copy: unused here
                    int64_t /*decode_rows*/) {                // the CPU's batch invariance: ignored here
  const char* op = "decodekit::int8_gemm";
  const dk::GemmArgs g = dk::quant_gemm_args(op, out, a, qweight, scales, nullptr, group_size, bias);
  if (packed.has_value()) dk::int8_gemm_packed_check(op, *packed, a, g, group_size);
  dk::check_cuda(op, "a", a);
  dk::check_range<int64_t>(op, "a.size(0) (M) on CUDA", g.M, 0, dk::cuda::kQuantGemvMaxM);
  if (g.M == 0 || g.N == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  if (empty_k(out, bias, g.K)) return;
  DK_CUDA_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::quant_gemv<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), dk::cuda_ptr<scalar_t>(a), g.a_stride,
                             reinterpret_cast<const uint8_t*>(qweight.data_ptr<int8_t>()),
                             dk::cuda_ptr<__half>(scales), nullptr,
                             bias.has_value() ? dk::cuda_ptr<scalar_t>(*bias) : nullptr, int(g.M), g.N, g.K,
                             int(group_size), false, c10::cuda::getCurrentCUDAStream()));
  });
}

void int4_dequantize_cuda(at::Tensor& out,            // [N, K]
                          const at::Tensor& qweight,  // [N, K / 2] uint8
                          const at::Tensor& scales,   // [N, K / G] float16
                          const at::Tensor& mins,     // [N, K / G] float16
                          int64_t group_size) {
  const char* op = "decodekit::int4_dequantize";
  const dk::GemmArgs g = dk::quant_dequantize_args(op, out, qweight, scales, &mins, group_size, nullptr);
  dk::check_cuda(op, "qweight", qweight);
  c10::cuda::OptionalCUDAGuard guard(out.device());
  DK_CUDA_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::int4_dequantize<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), qweight.data_ptr<uint8_t>(), dk::cuda_ptr<__half>(scales),
                             dk::cuda_ptr<__half>(mins), g.N, g.K, int(group_size),
                             c10::cuda::getCurrentCUDAStream()));
  });
}

void int8_dequantize_rows_cuda(at::Tensor& out,            // [R, K]
                               const at::Tensor& qweight,  // [N, K] int8
                               const at::Tensor& scales,   // [N, K / G] float16
                               int64_t group_size,
                               const at::Tensor& ids,      // [R] int64 (outside [0, N): NaN rows, no host check)
                               const std::optional<at::Tensor>& packed) {  // the CPU's AMX copy: not on CUDA
  const char* op = "decodekit::int8_dequantize_rows";
  TORCH_CHECK(!packed.has_value(), op, ": 'packed' (an AMX copy of the weight) is CPU only");
  const dk::GemmArgs g = dk::quant_dequantize_args(op, out, qweight, scales, nullptr, group_size, &ids);
  dk::check_cuda(op, "qweight", qweight);
  c10::cuda::OptionalCUDAGuard guard(out.device());
  DK_CUDA_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::int8_dequantize_rows<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), qweight.data_ptr<int8_t>(), dk::cuda_ptr<__half>(scales),
                             ids.data_ptr<int64_t>(), ids.size(0), g.N, g.K, int(group_size),
                             c10::cuda::getCurrentCUDAStream()));
  });
}

void quantize_fp8_cuda(at::Tensor& out,            // [M, K] Float8_e4m3fn
                       at::Tensor& scale,          // [M] float32
                       const at::Tensor& input) {  // [M, K]
  const char* op = "decodekit::quantize_fp8";
  const dk::Fp8Args f = dk::quantize_fp8_args(out, scale, input);
  dk::check_cuda(op, "input", input);
  if (f.M == 0) return;
  c10::cuda::OptionalCUDAGuard guard(input.device());
  DK_CUDA_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::quantize_fp8<scalar_t>(reinterpret_cast<uint8_t*>(out.data_ptr()),
                                                          scale.data_ptr<float>(), dk::cuda_ptr<scalar_t>(input), f.M,
                                                          f.K, f.x_stride, c10::cuda::getCurrentCUDAStream()));
  });
}

void fp8_gemm_cuda(at::Tensor& out,                        // [M, N]
                   const at::Tensor& a,                    // [M, K] Float8_e4m3fn
                   const at::Tensor& a_scale,              // [M] float32
                   const at::Tensor& weight,               // [N, K] Float8_e4m3fn
                   const at::Tensor& w_scale,              // [N] float32
                   const std::optional<at::Tensor>& bias) {  // [N]
  const char* op = "decodekit::fp8_gemm";
  const dk::Fp8Args f = dk::fp8_gemm_args(out, a, a_scale, weight, w_scale, bias);
  dk::check_cuda(op, "a", a);
  if (f.M == 0 || f.N == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  if (empty_k(out, bias, f.K)) return;
  if (out.scalar_type() != at::kFloat && want_sm90(op, f.M, kFp8Sm90MinM)) {
    const dk::cuda::Sm90Schedule sched = sm90_schedule(op);
    const int sms = sm_count(a);
    auto run = [&](auto type_tag) {
      using T = decltype(type_tag);
      return try_sm90(op, a, dk::cuda::fp8_gemm_sm90_workspace_bytes<T>(f.M, f.N, f.K, sched, sms),
                      [&](void* ws, size_t bytes) {
        return dk::cuda::fp8_gemm_sm90<T>(dk::cuda_ptr<T>(out), reinterpret_cast<const uint8_t*>(a.data_ptr()),
                                          a_scale.data_ptr<float>(), reinterpret_cast<const uint8_t*>(weight.data_ptr()),
                                          w_scale.data_ptr<float>(), bias.has_value() ? dk::cuda_ptr<T>(*bias) : nullptr,
                                          f.M, f.N, f.K, sched, sms, ws, bytes, c10::cuda::getCurrentCUDAStream());
      });
    };
    if (out.scalar_type() == at::kHalf ? run(__half{}) : run(__nv_bfloat16{})) return;
  }
  const int splits = dk::cuda::fp8_mma_splits(f.M, f.N, f.K, sm_count(a));
  at::Tensor holder;
  float* partial = splitk_partial(holder, splits, f.M, f.N, a);
  DK_CUDA_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::fp8_gemm<scalar_t>(
                             dk::cuda_ptr<scalar_t>(out), reinterpret_cast<const uint8_t*>(a.data_ptr()),
                             a_scale.data_ptr<float>(), reinterpret_cast<const uint8_t*>(weight.data_ptr()),
                             w_scale.data_ptr<float>(), bias.has_value() ? dk::cuda_ptr<scalar_t>(*bias) : nullptr,
                             f.M, f.N, f.K, splits, partial, c10::cuda::getCurrentCUDAStream()));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CUDA, m) {
  m.impl("int8_dequantize_rows", &int8_dequantize_rows_cuda);
  m.impl("int4_gemm", &int4_gemm_cuda);
  m.impl("int8_gemm", &int8_gemm_cuda);
  m.impl("int4_dequantize", &int4_dequantize_cuda);
  m.impl("int4_marlin_pack", &int4_marlin_pack_cuda);
  m.impl("int4_gemm_marlin", &int4_gemm_marlin_cuda);
  m.impl("int4_marlin_dequantize", &int4_marlin_dequantize_cuda);
  m.impl("quantize_fp8", &quantize_fp8_cuda);
  m.impl("fp8_gemm", &fp8_gemm_cuda);
}
