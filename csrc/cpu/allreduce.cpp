// CPU launchers for custom_all_reduce and gemm_allreduce (kernels in
// include/decodekit/comm/allreduce.h): the ranks are processes that map each other's
// /dev/shm segments (decodekit.distributed.custom_allreduce), addressed by int64 pointers
// exactly like the CUDA version's IPC-opened ones. Also allreduce_signal_bytes /
// allreduce_init_signal, and the CUDA-only IPC ops' error on a CPU-only build.
#include <type_traits>
#include <ATen/ops/addmm.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "decodekit/comm/allreduce.h"
#include "decodekit/gemm/dense_cpu.h"
#include "decodekit/gemm/fp8_gemm.h"
#include "decodekit/gemm/int4.h"
#include "decodekit/norm.h"

namespace {

void raise_if_failed(const char* op, const dk::comm::CommStatus& st, const dk::comm::Peers& P) {
  if (st.ok) return;
  TORCH_CHECK(st.slot >= 0, op, ": rank ", P.rank, ": ", st.what, " (rank ", st.peer, ")");
  TORCH_CHECK(!st.peer_exited, op, ": rank ", P.rank, " of ", P.world_size, ": rank ", st.peer, "'s process exited ",
              "while this rank waited ", st.waited_s, " s for it (", st.what, "; call ", st.epoch,
              "). This communicator is unusable now: close it.");
  TORCH_CHECK(false, op, ": rank ", P.rank, " of ", P.world_size, " timed out after ", st.waited_s,
              " s waiting for rank ", st.peer, " (", st.what, "; call ", st.epoch, ", flag slot ", st.slot,
              "): that rank died, hangs, or made a different call. This communicator is unusable now: close it.");
}

void custom_all_reduce_cpu(at::Tensor& out,              // [...] contiguous (may be inp)
                           const at::Tensor& inp,        // [...] contiguous
                           at::IntArrayRef buffer_ptrs,  // [world_size] addresses
                           at::IntArrayRef signal_ptrs,  // [world_size] addresses
                           int64_t rank, int64_t buffer_bytes, bool two_shot) {
  const char* op = "decodekit::custom_all_reduce";
  const dk::comm::Peers P = dk::comm_peers_args(op, buffer_ptrs, signal_ptrs, rank, buffer_bytes);
  const int64_t n = dk::custom_all_reduce_args(out, inp, P);
  DK_CPU_DISPATCH_FLOATING(inp.scalar_type(), op, [&] {
    raise_if_failed(op, dk::cpu::all_reduce<scalar_t>(dk_ptr<scalar_t>(out), dk_ptr<scalar_t>(inp), n, P, two_shot),
                    P);
  });
}

static_assert(dk::cpu::kDenseRouteMaxM <= dk::cpu::kDenseGemvMaxM, "dense_gemm row limit");

// Column tile of the CPU gemm_allreduce: wide enough that dense_gemm parallelises inside it.
int64_t cpu_tile_n(int64_t N) {
  return std::max<int64_t>(256, dk::comm::round_up(dk::comm::cdiv(N, dk::comm::kMaxTiles), 16));
}

// Tiles of this rank's partial product to the peers as they are computed (gemm_tile(dst [M, nc]
// row-major, n0, nc)), the rank-order sum into out, then the residual + RMSNorm epilogue.
template <class T, class GemmTile>
void reduce_tiles(const char* op, at::Tensor& out, const dk::GemmAllReduceArgs& r, const dk::comm::Peers& P,
                  GemmTile&& gemm_tile, const std::optional<at::Tensor>& residual,
                  const std::optional<at::Tensor>& norm_weight, double eps) {
  const int64_t M = r.g.M, N = r.g.N;
  T* o = dk_ptr<T>(out);
  const int64_t tile_n = cpu_tile_n(N);
  if (P.world_size == 1) {
    gemm_tile(o, 0, N);
  } else if (dk::comm::gemm_fits(M, N, int(sizeof(T)), P.world_size, P.buffer_bytes, tile_n)) {
    raise_if_failed(op, dk::cpu::gemm_all_reduce<T>(o, M, N, tile_n, P, gemm_tile), P);
  } else {  // the partial products do not fit world_size slots: GEMM, then all-reduce in place
    gemm_tile(o, 0, N);
    raise_if_failed(op, dk::cpu::all_reduce<T>(o, o, M * N, P, /*two_shot=*/false), P);
  }
  if (r.norm)
    dk::cpu::fused_add_rms_norm<T>(o, N, dk_ptr<T>(*residual), r.r_stride, dk_ptr<T>(*norm_weight), M, int(N),
                                   float(eps));
}

void gemm_allreduce_cpu(at::Tensor& out,                               // [M, N] contiguous
                        const at::Tensor& a,                           // [M, K] (row stride free)
                        const at::Tensor& weight,                      // [N, K] this rank's shard
                        const std::optional<at::Tensor>& bias,         // [N] (rank 0 adds it)
                        at::IntArrayRef buffer_ptrs,                   // [world_size] addresses
                        at::IntArrayRef signal_ptrs,                   // [world_size] addresses
                        int64_t rank, int64_t buffer_bytes,
                        const std::optional<at::Tensor>& residual,     // [M, N] (row stride free), in/out
                        const std::optional<at::Tensor>& norm_weight,  // [N]
                        double eps) {
  const char* op = "decodekit::gemm_allreduce";
  const dk::comm::Peers P = dk::comm_peers_args(op, buffer_ptrs, signal_ptrs, rank, buffer_bytes);
  const dk::GemmAllReduceArgs r = dk::gemm_allreduce_args(out, a, weight, bias, residual, norm_weight, eps, P);
  const int64_t M = r.g.M, N = r.g.N, K = r.g.K;
  if (M == 0 || N == 0) return;  // every rank skips the same call
  const bool add_bias = bias.has_value() && rank == 0;
  DK_CPU_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    using T = scalar_t;
    // dst [M, nc] row-major = round_T(a @ weight[n0 : n0 + nc]^T (+ bias on rank 0)), routed exactly as
    // decodekit.ops.linear (dk::cpu::dense_route), so fused == ops.linear then all-reduce, bit for bit:
    // dense_gemm tile by tile (its per-element arithmetic does not depend on the tile); everything else
    // torch's GEMM (or the fp32 GEMM on upcast operands), run once over all N columns -- its blocking may
    // depend on N -- with the tiles published from it.
    const dk::cpu::DenseRoute route = dk::cpu::dense_route(dk::dense_dtype(a.scalar_type()));
    const bool tiled = M >= route.dense_min_m && M <= route.dense_max_m;
    at::Tensor whole;  // [M, N] the torch-routed product
    if (!tiled) whole = dk::dense_linear_torch(a, weight, add_bias ? bias : std::nullopt, route).contiguous();
    auto gemm_tile = [&](T* dst, int64_t n0, int64_t nc) {
      if (tiled) {
        dk::cpu::dense_gemm<T>(dst, dk_ptr<T>(a), r.g.a_stride, dk_ptr<T>(weight) + n0 * K,
                               add_bias ? dk_ptr<T>(*bias) + n0 : nullptr, M, nc, K);
        return;
      }
      at::from_blob(dst, {M, nc}, a.options()).copy_(whole.narrow(1, n0, nc));
    };
    reduce_tiles<T>(op, out, r, P, gemm_tile, residual, norm_weight, eps);
  });
}

// The INT4 / fp8 tiles are int4_gemm / fp8_gemm over the tile's weight rows: their per-element
// arithmetic does not depend on N, so fused == ops.linear then all-reduce, bit for bit.
void gemm_allreduce_int4_cpu(at::Tensor& out,                               // [M, N] contiguous
                             const at::Tensor& a,                           // [M, K] (row stride free)
                             const at::Tensor& qweight,                     // [N, K / 2] uint8, this rank's shard
                             const at::Tensor& scales,                      // [N, K / G] float16
                             const at::Tensor& mins,                        // [N, K / G] float16
                             int64_t group_size,
                             const std::optional<at::Tensor>& bias,         // [N] (rank 0 adds it)
                             at::IntArrayRef buffer_ptrs,                   // [world_size] addresses
                             at::IntArrayRef signal_ptrs,                   // [world_size] addresses
                             int64_t rank, int64_t buffer_bytes,
                             const std::optional<at::Tensor>& residual,     // [M, N] (row stride free), in/out
                             const std::optional<at::Tensor>& norm_weight,  // [N]
                             double eps) {
  const char* op = "decodekit::gemm_allreduce_int4";
  const dk::comm::Peers P = dk::comm_peers_args(op, buffer_ptrs, signal_ptrs, rank, buffer_bytes);
  const dk::GemmAllReduceArgs r =
      dk::gemm_allreduce_int4_args(out, a, qweight, scales, mins, group_size, bias, residual, norm_weight, eps, P);
  const int64_t M = r.g.M, N = r.g.N, K = r.g.K, ng = K / group_size;
  if (M == 0 || N == 0) return;
  const bool add_bias = bias.has_value() && rank == 0;
  DK_CPU_DISPATCH_FLOATING(a.scalar_type(), op, [&] {
    using T = scalar_t;
    auto gemm_tile = [&](T* dst, int64_t n0, int64_t nc) {
      const dk::cpu::Int4GemmParams G{M, nc, K, int(group_size), r.g.a_stride};
      dk::cpu::int4_gemm<T>(dst, dk_ptr<T>(a), qweight.data_ptr<uint8_t>() + n0 * (K / 2),
                            dk_ptr<dk::half_t>(scales) + n0 * ng, dk_ptr<dk::half_t>(mins) + n0 * ng,
                            add_bias ? dk_ptr<T>(*bias) + n0 : nullptr, G);
    };
    reduce_tiles<T>(op, out, r, P, gemm_tile, residual, norm_weight, eps);
  });
}

void gemm_allreduce_fp8_cpu(at::Tensor& out,                               // [M, N] contiguous
                            const at::Tensor& a,                           // [M, K] Float8_e4m3fn
                            const at::Tensor& a_scale,                     // [M] float32
                            const at::Tensor& weight,                      // [N, K] Float8_e4m3fn, this rank's shard
                            const at::Tensor& w_scale,                     // [N] float32
                            const std::optional<at::Tensor>& bias,         // [N] (rank 0 adds it)
                            at::IntArrayRef buffer_ptrs,                   // [world_size] addresses
                            at::IntArrayRef signal_ptrs,                   // [world_size] addresses
                            int64_t rank, int64_t buffer_bytes,
                            const std::optional<at::Tensor>& residual,     // [M, N] (row stride free), in/out
                            const std::optional<at::Tensor>& norm_weight,  // [N]
                            double eps) {
  const char* op = "decodekit::gemm_allreduce_fp8";
  const dk::comm::Peers P = dk::comm_peers_args(op, buffer_ptrs, signal_ptrs, rank, buffer_bytes);
  const dk::GemmAllReduceArgs r =
      dk::gemm_allreduce_fp8_args(out, a, a_scale, weight, w_scale, bias, residual, norm_weight, eps, P);
  const int64_t M = r.g.M, N = r.g.N, K = r.g.K;
  if (M == 0 || N == 0) return;
  const bool add_bias = bias.has_value() && rank == 0;
  DK_CPU_DISPATCH_FLOATING(out.scalar_type(), op, [&] {
    using T = scalar_t;
    auto gemm_tile = [&](T* dst, int64_t n0, int64_t nc) {
      dk::cpu::fp8_gemm<T>(dst, dk_ptr<uint8_t>(a), a_scale.data_ptr<float>(), dk_ptr<uint8_t>(weight) + n0 * K,
                           w_scale.data_ptr<float>() + n0, add_bias ? dk_ptr<T>(*bias) + n0 : nullptr, M, nc, K);
    };
    reduce_tiles<T>(op, out, r, P, gemm_tile, residual, norm_weight, eps);
  });
}

int64_t allreduce_signal_bytes() { return int64_t(sizeof(dk::comm::Signal)); }

void allreduce_init_signal_cpu(at::Tensor& signal,  // [>= allreduce_signal_bytes()] uint8
                               int64_t world_size, double timeout_s, int64_t epoch, int64_t /*diag_ptr*/) {
  const uint64_t timeout_ns = dk::allreduce_init_signal_args(signal, world_size, timeout_s);
  dk::cpu::init_signal(reinterpret_cast<dk::comm::Signal*>(signal.data_ptr()), int(world_size), timeout_ns,
                       uint64_t(epoch));
}

at::Tensor ipc_mem_handle_cpu(const at::Tensor& buf) {
  TORCH_CHECK(false, "decodekit::ipc_mem_handle: CUDA IPC needs a CUDA tensor, got one on ", buf.device(),
              " (on the CPU, CustomAllReduce shares /dev/shm segments instead)");
}

#if !defined(DECODEKIT_CUDA)
int64_t ipc_open_unavailable(const at::Tensor&) {
  TORCH_CHECK(false, "decodekit::ipc_open: this build has no CUDA kernels (DECODEKIT_CUDA=1 builds them)");
}
void ipc_close_unavailable(int64_t) {
  TORCH_CHECK(false, "decodekit::ipc_close: this build has no CUDA kernels (DECODEKIT_CUDA=1 builds them)");
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) {
  m.impl("custom_all_reduce", &custom_all_reduce_cpu);
  m.impl("gemm_allreduce", &gemm_allreduce_cpu);
  m.impl("gemm_allreduce_int4", &gemm_allreduce_int4_cpu);
  m.impl("gemm_allreduce_fp8", &gemm_allreduce_fp8_cpu);
  m.impl("allreduce_init_signal", &allreduce_init_signal_cpu);
  m.impl("ipc_mem_handle", &ipc_mem_handle_cpu);
}

// No tensor arguments (or a CPU handle that a CUDA build turns into a device pointer).
TORCH_LIBRARY_IMPL(decodekit, CompositeExplicitAutograd, m) {
  m.impl("allreduce_signal_bytes", &allreduce_signal_bytes);
#if !defined(DECODEKIT_CUDA)
  m.impl("ipc_open", &ipc_open_unavailable);
  m.impl("ipc_close", &ipc_close_unavailable);
#endif
}
