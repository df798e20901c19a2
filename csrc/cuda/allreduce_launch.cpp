// Torch launchers for custom_all_reduce and gemm_allreduce (CUDA dispatch key), the CUDA Signal
// initialisation and the CUDA IPC helpers. Host code, compiled by g++ in the CUDA build only; the
// kernels are instantiated in allreduce.cu (include/decodekit/comm/allreduce.cuh).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "../op_args.h"
#include "decodekit/comm/allreduce_launch.h"
#include "dispatch.h"
#include "launchers.h"

namespace {

void check_cuda_call(const char* op, const char* what, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": ", what, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

void custom_all_reduce_cuda(at::Tensor& out,              // [...] contiguous (may be inp)
                            const at::Tensor& inp,        // [...] contiguous
                            at::IntArrayRef buffer_ptrs,  // [world_size] device addresses (IPC-opened)
                            at::IntArrayRef signal_ptrs,  // [world_size] device addresses (IPC-opened)
                            int64_t rank, int64_t buffer_bytes, bool two_shot) {
  const char* op = "decodekit::custom_all_reduce";
  const dk::comm::Peers P = dk::comm_peers_args(op, buffer_ptrs, signal_ptrs, rank, buffer_bytes);
  const int64_t n = dk::custom_all_reduce_args(out, inp, P);
  dk::check_cuda(op, "inp", inp);
  if (n == 0) return;
  c10::cuda::OptionalCUDAGuard guard(inp.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  DK_CUDA_DISPATCH_FLOATING(inp.scalar_type(), op, [&] {
    dk::check_launch(op, dk::cuda::custom_all_reduce<scalar_t>(dk::cuda_ptr<scalar_t>(out),
                                                               dk::cuda_ptr<scalar_t>(inp), n, P, two_shot, stream));
  });
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// The body all three gemm_allreduce launchers share: the fused kernel when `fused_ok` (launch_fused()
// returns its cudaError_t); else gemm() writes this rank's product into out (rank 0 adding the bias) and
// out is all-reduced in place. Then the residual + RMSNorm epilogue.
template <class T, class Fused, class Gemm>
void fused_or_gemm_then_reduce(const char* op, at::Tensor& out, const dk::GemmAllReduceArgs& r,
                               const dk::comm::Peers& P, bool fused_ok, Fused&& launch_fused, Gemm&& gemm,
                               const std::optional<at::Tensor>& residual,
                               const std::optional<at::Tensor>& norm_weight, double eps, cudaStream_t stream) {
  T* o = dk::cuda_ptr<T>(out);
  if (fused_ok) {
    dk::check_launch(op, launch_fused());
  } else {
    gemm();
    const int64_t n = out.numel();
    const bool two_shot = n * int64_t(sizeof(T)) >= dk::comm::kFallbackTwoShotMinBytes;
    dk::check_launch(op, dk::cuda::custom_all_reduce<T>(o, o, n, P, two_shot, stream));
  }
  if (r.norm)
    dk::check_launch(op, dk::cuda::fused_add_rms_norm<T>(o, r.g.N, dk::cuda_ptr<T>(*residual), r.r_stride,
                                                         dk::cuda_ptr<T>(*norm_weight), r.g.M, int(r.g.N),
                                                         float(eps), stream));
}

void gemm_allreduce_cuda(at::Tensor& out,                               // [M, N] contiguous
                         const at::Tensor& a,                           // [M, K] (row stride free)
                         const at::Tensor& weight,                      // [N, K] this rank's shard
                         const std::optional<at::Tensor>& bias,         // [N] (rank 0 adds it)
                         at::IntArrayRef buffer_ptrs,                   // [world_size] device addresses
                         at::IntArrayRef signal_ptrs,                   // [world_size] device addresses
                         int64_t rank, int64_t buffer_bytes,
                         const std::optional<at::Tensor>& residual,     // [M, N] (row stride free), in/out
                         const std::optional<at::Tensor>& norm_weight,  // [N]
                         double eps) {
  const char* op = "decodekit::gemm_allreduce";
  const dk::comm::Peers P = dk::comm_peers_args(op, buffer_ptrs, signal_ptrs, rank, buffer_bytes);
  const dk::GemmAllReduceArgs r = dk::gemm_allreduce_args(out, a, weight, bias, residual, norm_weight, eps, P);
  dk::check_cuda(op, "a", a);
  const int64_t M = r.g.M, N = r.g.N, K = r.g.K;
  if (M == 0 || N == 0) return;  // every rank skips the same call
  c10::cuda::OptionalCUDAGuard guard(a.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool add_bias = bias.has_value() && rank == 0;
  DK_CUDA_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    using T = scalar_t;
    constexpr bool mma_type = !std::is_same_v<T, float>;
    const bool aligned = aligned16(out) && aligned16(a) && aligned16(weight) && (!bias || aligned16(*bias));
    fused_or_gemm_then_reduce<T>(
        op, out, r, P,
        dk::comm::cuda_gemm_fused_ok(mma_type, M, N, K, r.g.a_stride, aligned, P.world_size, buffer_bytes,
                                     int(sizeof(T))),
        [&] {
          return dk::cuda::gemm_all_reduce<T>(dk::cuda_ptr<T>(out), dk::cuda_ptr<T>(a), r.g.a_stride,
                                              dk::cuda_ptr<T>(weight), bias ? dk::cuda_ptr<T>(*bias) : nullptr, M, N,
                                              K, P, stream);
        },
        [&] {  // cuBLAS
          const at::Tensor wt = weight.t();
          if (add_bias) at::addmm_out(out, *bias, a, wt);
          else at::mm_out(out, a, wt);
        },
        residual, norm_weight, eps, stream);
  });
}

void gemm_allreduce_int4_cuda(at::Tensor& out,                               // [M, N] contiguous
                              const at::Tensor& a,                           // [M, K] (row stride free)
                              const at::Tensor& qweight,                     // [N, K / 2] uint8, this rank's shard
                              const at::Tensor& scales,                      // [N, K / G] float16
                              const at::Tensor& mins,                        // [N, K / G] float16
                              int64_t group_size,
                              const std::optional<at::Tensor>& bias,         // [N] (rank 0 adds it)
                              at::IntArrayRef buffer_ptrs,                   // [world_size] device addresses
                              at::IntArrayRef signal_ptrs,                   // [world_size] device addresses
                              int64_t rank, int64_t buffer_bytes,
                              const std::optional<at::Tensor>& residual,     // [M, N] (row stride free), in/out
                              const std::optional<at::Tensor>& norm_weight,  // [N]
                              double eps) {
  const char* op = "decodekit::gemm_allreduce_int4";
  const dk::comm::Peers P = dk::comm_peers_args(op, buffer_ptrs, signal_ptrs, rank, buffer_bytes);
  const dk::GemmAllReduceArgs r =
      dk::gemm_allreduce_int4_args(out, a, qweight, scales, mins, group_size, bias, residual, norm_weight, eps, P);
  dk::check_cuda(op, "a", a);
  const int64_t M = r.g.M, N = r.g.N, K = r.g.K;
  if (M == 0 || N == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool add_bias = bias.has_value() && rank == 0;
  DK_CUDA_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    using T = scalar_t;
    constexpr bool mma_type = !std::is_same_v<T, float>;
    const bool aligned = aligned16(out) && aligned16(a) && aligned16(qweight) && (!bias || aligned16(*bias));
    fused_or_gemm_then_reduce<T>(
        op, out, r, P,
        dk::comm::cuda_int4_gemm_fused_ok(mma_type, M, N, K, int(group_size), r.g.a_stride, aligned, P.world_size,
                                          buffer_bytes, int(sizeof(T))),
        [&] {
          return dk::cuda::gemm_all_reduce_int4<T>(
              dk::cuda_ptr<T>(out), dk::cuda_ptr<T>(a), r.g.a_stride, qweight.data_ptr<uint8_t>(),
              dk::cuda_ptr<__half>(scales), dk::cuda_ptr<__half>(mins), int(group_size),
              bias ? dk::cuda_ptr<T>(*bias) : nullptr, M, N, K, P, stream);
        },
        [&] {  // int4_gemm's own CUDA routing (GEMV / tensor-core kernels)
          static auto gemm = c10::Dispatcher::singleton().findSchemaOrThrow("decodekit::int4_gemm", "")
                                 .typed<void(at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                             const at::Tensor&, int64_t, const std::optional<at::Tensor>&,
                                             const std::optional<at::Tensor>&, int64_t)>();
          gemm.call(out, a, qweight, scales, mins, group_size, add_bias ? bias : std::nullopt, std::nullopt, -1);
        },
        residual, norm_weight, eps, stream);
  });
}

void gemm_allreduce_fp8_cuda(at::Tensor& out,                               // [M, N] contiguous
                             const at::Tensor& a,                           // [M, K] Float8_e4m3fn
                             const at::Tensor& a_scale,                     // [M] float32
                             const at::Tensor& weight,                      // [N, K] Float8_e4m3fn, this rank's shard
                             const at::Tensor& w_scale,                     // [N] float32
                             const std::optional<at::Tensor>& bias,         // [N] (rank 0 adds it)
                             at::IntArrayRef buffer_ptrs,                   // [world_size] device addresses
                             at::IntArrayRef signal_ptrs,                   // [world_size] device addresses
                             int64_t rank, int64_t buffer_bytes,
                             const std::optional<at::Tensor>& residual,     // [M, N] (row stride free), in/out
                             const std::optional<at::Tensor>& norm_weight,  // [N]
                             double eps) {
  const char* op = "decodekit::gemm_allreduce_fp8";
  const dk::comm::Peers P = dk::comm_peers_args(op, buffer_ptrs, signal_ptrs, rank, buffer_bytes);
  const dk::GemmAllReduceArgs r =
      dk::gemm_allreduce_fp8_args(out, a, a_scale, weight, w_scale, bias, residual, norm_weight, eps, P);
  dk::check_cuda(op, "a", a);
  const int64_t M = r.g.M, N = r.g.N, K = r.g.K;
  if (M == 0 || N == 0) return;
  c10::cuda::OptionalCUDAGuard guard(a.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool add_bias = bias.has_value() && rank == 0;
  DK_CUDA_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    using T = scalar_t;
    const bool aligned = aligned16(out) && aligned16(a) && aligned16(weight) && (!bias || aligned16(*bias));
    fused_or_gemm_then_reduce<T>(
        op, out, r, P,
        !std::is_same_v<T, float> &&
            dk::comm::cuda_fp8_gemm_fused_ok(M, N, K, K, aligned, P.world_size, buffer_bytes, int(sizeof(T))),
        [&] {
          return dk::cuda::gemm_all_reduce_fp8<T>(dk::cuda_ptr<T>(out), dk::cuda_ptr<uint8_t>(a), K,
                                                  a_scale.data_ptr<float>(), dk::cuda_ptr<uint8_t>(weight),
                                                  w_scale.data_ptr<float>(), bias ? dk::cuda_ptr<T>(*bias) : nullptr,
                                                  M, N, K, P, stream);
        },
        [&] {  // fp8_gemm's own CUDA kernel
          static auto gemm = c10::Dispatcher::singleton().findSchemaOrThrow("decodekit::fp8_gemm", "")
                                 .typed<void(at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                             const at::Tensor&, const std::optional<at::Tensor>&)>();
          gemm.call(out, a, a_scale, weight, w_scale, add_bias ? bias : std::nullopt);
        },
        residual, norm_weight, eps, stream);
  });
}

// Setup, not capturable: zeroes the block and writes the header on the current stream, then waits.
void allreduce_init_signal_cuda(at::Tensor& signal,  // [>= allreduce_signal_bytes()] uint8
                                int64_t world_size, double timeout_s, int64_t epoch, int64_t diag_ptr) {
  const char* op = "decodekit::allreduce_init_signal";
  const uint64_t timeout_ns = dk::allreduce_init_signal_args(signal, world_size, timeout_s);
  c10::cuda::OptionalCUDAGuard guard(signal.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dk::comm::SignalHeader h =
      dk::cpu::signal_header(int(world_size), timeout_ns, uint64_t(epoch), uint64_t(diag_ptr));
  check_cuda_call(op, "cudaMemsetAsync", cudaMemsetAsync(signal.data_ptr(), 0, sizeof(dk::comm::Signal), stream));
  check_cuda_call(op, "cudaMemcpyAsync", cudaMemcpyAsync(signal.data_ptr(), &h, sizeof(h), cudaMemcpyHostToDevice,
                                                         stream));
  check_cuda_call(op, "cudaStreamSynchronize", cudaStreamSynchronize(stream));
}

// ---- CUDA IPC ------------------------------------------------------------------------------
constexpr int64_t kHandleBytes = int64_t(sizeof(cudaIpcMemHandle_t));  // 64

std::mutex g_ipc_mutex;
std::unordered_map<int64_t, void*> g_ipc_bases;  // address returned by ipc_open -> opened allocation base

at::Tensor ipc_mem_handle_cuda(const at::Tensor& buf) {  // -> [72] uint8 CPU: handle + int64 offset
  const char* op = "decodekit::ipc_mem_handle";
  dk::check_cuda(op, "buf", buf);
  c10::cuda::CUDAGuard guard(buf.device());
  size_t size = 0;
  void* base = c10::cuda::CUDACachingAllocator::getBaseAllocation(buf.data_ptr(), &size);
  cudaIpcMemHandle_t h;
  check_cuda_call(op, "cudaIpcGetMemHandle", cudaIpcGetMemHandle(&h, base));
  const int64_t offset = static_cast<char*>(buf.data_ptr()) - static_cast<char*>(base);
  at::Tensor out = at::empty({kHandleBytes + 8}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(out.data_ptr(), &h, kHandleBytes);
  std::memcpy(static_cast<char*>(out.data_ptr()) + kHandleBytes, &offset, 8);
  return out;
}

int64_t ipc_open_cuda(const at::Tensor& handle) {  // [72] uint8 (CPU) from another process
  const char* op = "decodekit::ipc_open";
  dk::Check(op, "handle", handle).dim(1).size(0, kHandleBytes + 8, "64 + 8").dtype({at::kByte}).contiguous();
  TORCH_CHECK(handle.device().is_cpu(), op, ": 'handle' must be a CPU tensor, got one on ", handle.device());
  cudaIpcMemHandle_t h;
  int64_t offset = 0;
  std::memcpy(&h, handle.data_ptr(), kHandleBytes);
  std::memcpy(&offset, static_cast<const char*>(handle.data_ptr()) + kHandleBytes, 8);
  void* base = nullptr;
  check_cuda_call(op, "cudaIpcOpenMemHandle (a handle of this very process, or of another GPU's process without "
                  "peer access?)", cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess));
  const int64_t addr = reinterpret_cast<int64_t>(base) + offset;
  std::lock_guard<std::mutex> lock(g_ipc_mutex);
  g_ipc_bases[addr] = base;
  return addr;
}

void ipc_close_cuda(int64_t ptr) {
  const char* op = "decodekit::ipc_close";
  void* base = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_ipc_mutex);
    auto it = g_ipc_bases.find(ptr);
    TORCH_CHECK(it != g_ipc_bases.end(), op, ": ", ptr, " is not an address returned by ipc_open (or closed)");
    base = it->second;
    g_ipc_bases.erase(it);
  }
  check_cuda_call(op, "cudaIpcCloseMemHandle", cudaIpcCloseMemHandle(base));
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CUDA, m) {
  m.impl("custom_all_reduce", &custom_all_reduce_cuda);
  m.impl("gemm_allreduce", &gemm_allreduce_cuda);
  m.impl("gemm_allreduce_int4", &gemm_allreduce_int4_cuda);
  m.impl("gemm_allreduce_fp8", &gemm_allreduce_fp8_cuda);
  m.impl("allreduce_init_signal", &allreduce_init_signal_cuda);
  m.impl("ipc_mem_handle", &ipc_mem_handle_cuda);
}

TORCH_LIBRARY_IMPL(decodekit, CompositeExplicitAutograd, m) {
  m.impl("ipc_open", &ipc_open_cuda);
  m.impl("ipc_close", &ipc_close_cuda);
}
