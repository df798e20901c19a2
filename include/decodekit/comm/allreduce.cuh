// Custom AllReduce and gemm_allreduce CUDA kernels (torch-free; sm_90a). The protocol, layout,
// partition and rank-order sum are allreduce.h's, shared with the CPU kernels.
//
// Flags: st.release.sys of the epoch into the peer's Signal (after __syncthreads, so the release
// covers the whole CTA's earlier stores), ld.acquire.sys spinning on this rank's own Signal, then
// __syncthreads: threads q < world_size talk to rank q. A wait longer than the Signal's
// timeout_ns fills the diagnostics record (SignalHeader::diag_ptr) and traps (no printf: it
// would put the kernels on local memory). The epoch lives in device memory: every CTA reads it
// at the start, the last CTA to finish stores epoch + 1, so no host reset is needed and CUDA
// graph replays keep counting.
//
// all_reduce_kernel<T, TWO_SHOT>: a grid of at most kArMaxBlocks CTAs (all resident, as the
// per-CTA barriers need) of kArThreads threads; CTA b handles the same 16-byte units on every
// rank (allreduce.h Partition), loads are 16 bytes wide, all ranks' loads of a unit in flight
// before the fp32 sum.
//
// gemm_ar_kernel<T, M16>: out [M <= 16, N] = sum_r a_r @ w_r^T for fp16 / bf16. A persistent grid
// (at most the resident CTAs; every rank has the same) walks tiles of kCudaGemmTileN = 64 output
// columns: 8 warps split K (warp w takes the 32-wide k chunks w, w + 8, ...), each doing mma.sync
// m16n8k16 over the tile's 8 groups of 8 weight rows. Weights and activations come straight from
// global memory as 16-byte vectors (LDG.E.128): lane (g, c) = (lane / 4, lane % 4) loads weight row
// g of a group and activation rows g, g + 8 at k = 32 j + 8 c .. + 8, and uses elements 0-3 for
// the chunk's first k16 step and 4-7 for the second: the same permutation of k for A and B, so
// the dot products are unchanged. The warps' fp32 partial tiles are summed in smem in warp order,
// bias added on rank 0, rounded to T, and pushed (16-byte stores) into slot [rank] of every rank's
// buffer, then the tile's flag is released to every peer. After its last tile the CTA waits for
// each tile's flags from all peers and reduces the slots in rank order into out, so the
// communication of early tiles overlaps the GEMM of later ones. world_size 1: straight to out.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "decodekit/comm/allreduce.h"
#include "decodekit/common/mma.cuh"
#include "decodekit/common/vec.cuh"

namespace dk::cuda {
namespace comm_detail {
using namespace dk::comm;

constexpr int kArThreads = 512;
constexpr int kArMaxBlocks = 36;  // <= kMaxBlocks flag slots per phase
constexpr int kGemmThreads = 256;
constexpr int kGemmWarps = kGemmThreads / 32;
constexpr int kTileN = kCudaGemmTileN;
constexpr int kGroups = kTileN / 8;  // n8 groups per tile
static_assert(kArMaxBlocks <= kMaxBlocks, "flag slots");

// Everything a kernel needs about the peers, by value (indexed with constants only: a run-time
// index into a kernel parameter array would go through local memory).
struct CommParams {
  void* buf[kMaxRanks];
  Signal* sig[kMaxRanks];
  Signal* self_sig;
  char* self_buf;
  int64_t buffer_bytes;
  int rank, ws;
};

inline CommParams make_params(const Peers& P) {
  CommParams c{};
  for (int q = 0; q < kMaxRanks; ++q) {
    c.buf[q] = q < P.world_size ? P.buf[q] : nullptr;
    c.sig[q] = q < P.world_size ? P.sig[q] : nullptr;
  }
  c.self_sig = P.sig[P.rank];
  c.self_buf = static_cast<char*>(P.buf[P.rank]);
  c.buffer_bytes = P.buffer_bytes;
  c.rank = P.rank;
  c.ws = P.world_size;
  return c;
}

// a[i] for a run-time i < kMaxRanks, by unrolled selection.
template <class P>
DK_DEVICE P pick(const P (&a)[kMaxRanks], int i) {
  P v = a[0];
#pragma unroll
  for (int q = 1; q < kMaxRanks; ++q)
    if (q == i) v = a[q];
  return v;
}

DK_DEVICE uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
DK_DEVICE void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
DK_DEVICE uint64_t ld_volatile(const uint64_t* p) { return *reinterpret_cast<const volatile uint64_t*>(p); }
DK_DEVICE uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __noinline__ void fail_timeout(const Signal* self, int peer, int slot, uint64_t epoch) {
  volatile int64_t* d = reinterpret_cast<volatile int64_t*>(ld_volatile(&self->h.diag_ptr));
  if (d != nullptr) {
    d[1] = peer;
    d[2] = slot;
    d[3] = int64_t(epoch);
    __threadfence_system();
    d[0] = 1;
    __threadfence_system();
  }
  __trap();
}

DK_DEVICE void wait_flag(const Signal* self, int slot, int from, uint64_t epoch, uint64_t timeout_ns) {
  const uint64_t* f = flag_ptr(const_cast<Signal*>(self), epoch, slot, from);
  if (ld_acquire_sys(f) == epoch) return;
  const uint64_t t0 = global_timer_ns();
  while (ld_acquire_sys(f) != epoch)
    if (global_timer_ns() - t0 > timeout_ns) fail_timeout(self, from, slot, epoch);
}

struct CallInfo {
  uint64_t epoch, timeout_ns;
};

// Every thread of the CTA gets this call's epoch (thread 0 reads the Signal).
DK_DEVICE CallInfo begin_call(const Signal* self) {
  __shared__ uint64_t s[2];
  if (threadIdx.x == 0) {
    s[0] = ld_volatile(&self->h.epoch) + 1;
    s[1] = ld_volatile(&self->h.timeout_ns);
  }
  __syncthreads();
  return {s[0], s[1]};
}

// The last CTA to finish stores the epoch: every CTA read the old one before its arrival.
DK_DEVICE void end_call(Signal* self, uint64_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&self->h.arrive, 1u) == gridDim.x - 1) {
      __threadfence();
      atomicExch(&self->h.arrive, 0u);
      *reinterpret_cast<volatile uint64_t*>(&self->h.epoch) = epoch;
    }
  }
}

// Flags `slot` to every peer (thread q -> rank q), then waits for every peer's.
DK_DEVICE void exchange_flags(const CommParams& c, const CallInfo& call, int slot) {
  __syncthreads();
  const int q = int(threadIdx.x);
  if (q < c.ws && q != c.rank) {
    st_release_sys(flag_ptr(pick(c.sig, q), call.epoch, slot, c.rank), call.epoch);
    wait_flag(c.self_sig, slot, q, call.epoch, call.timeout_ns);
  }
  __syncthreads();
}

// 16-byte global store, spelled out: NVVM splits store_vec into four 32-bit stores when it cannot
// prove the address (a buffer base plus run-time offsets) 16-byte aligned; ours always are.
template <class T>
DK_DEVICE void st_global16(T* p, const Vec<T>& v) {
  const uint4 u = *reinterpret_cast<const uint4*>(&v);
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
               : "memory");
}

template <class T>
DK_DEVICE Vec<T> zero_vec() {
  Vec<T> v;
#pragma unroll
  for (int k = 0; k < Vec<T>::kSize; ++k) v.v[k] = from_float<T>(0.f);
  return v;
}

// Unit u of x (elements [u V, u V + V) of n): one 16-byte load when whole and aligned, else by element (zeros past n).
template <class T>
DK_DEVICE Vec<T> load_unit(const T* x, const Partition& part, int64_t u, bool aligned) {
  constexpr int V = kVec16<T>;
  const int64_t e0 = u * V;
  if (aligned && e0 + V <= part.n) return load_vec<T, V>(x + e0);
  Vec<T> v = zero_vec<T>();
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (e0 + k < part.n) v.v[k] = x[e0 + k];
  return v;
}

template <class T>
DK_DEVICE void store_unit(T* x, const Vec<T>& v, const Partition& part, int64_t u, bool aligned) {
  constexpr int V = kVec16<T>;
  const int64_t e0 = u * V;
  if (aligned && e0 + V <= part.n) {
    st_global16(x + e0, v);
    return;
  }
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (e0 + k < part.n) x[e0 + k] = v.v[k];
}

// Unit u summed over the ranks' `in` regions (all loads in flight, then rank_order_sum).
template <class T>
DK_DEVICE Vec<T> reduce_unit(const CommParams& c, uint64_t epoch, int64_t u) {
  constexpr int V = kVec16<T>;
  Vec<T> v[kMaxRanks];
#pragma unroll
  for (int q = 0; q < kMaxRanks; ++q)
    if (q < c.ws) v[q] = load_vec<T, V>(reinterpret_cast<const T*>(in_region(c.buf[q], c.buffer_bytes, epoch)) + u * V);
  Vec<T> o;
#pragma unroll
  for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(rank_order_sum(c.ws, [&](int q) { return to_float(v[q].v[k]); }));
  return o;
}

template <class T, bool TWO_SHOT>
__global__ void __launch_bounds__(kArThreads)
all_reduce_kernel(const CommParams c, T* out, const T* inp, int64_t n, bool aligned) {
  constexpr int V = kVec16<T>;
  const CallInfo call = begin_call(c.self_sig);
  const uint64_t E = call.epoch;
  const Partition part(n, int(sizeof(T)), c.ws);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t t0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  T* mine = reinterpret_cast<T*>(in_region(c.self_buf, c.buffer_bytes, E));
  // this rank's input into its buffer: the units this CTA (and each peer's CTA blockIdx.x) reads
  if constexpr (!TWO_SHOT) {
    for (int64_t u = t0; u < part.units; u += stride) st_global16(mine + u * V, load_unit(inp, part, u, aligned));
  } else {
    for (int ch = 0; ch < c.ws; ++ch)
      for (int64_t u = part.chunk_begin(ch) + t0; u < part.chunk_end(ch); u += stride)
        st_global16(mine + u * V, load_unit(inp, part, u, aligned));
  }
  exchange_flags(c, call, barrier_slot(0, blockIdx.x));
  if constexpr (!TWO_SHOT) {
    for (int64_t u = t0; u < part.units; u += stride) store_unit(out, reduce_unit<T>(c, E, u), part, u, aligned);
  } else {
    T* red = reinterpret_cast<T*>(red_region(c.self_buf, c.buffer_bytes, E));
    for (int64_t u = part.chunk_begin(c.rank) + t0; u < part.chunk_end(c.rank); u += stride) {
      const Vec<T> s = reduce_unit<T>(c, E, u);
      st_global16(red + u * V, s);
      store_unit(out, s, part, u, aligned);
    }
    exchange_flags(c, call, barrier_slot(1, blockIdx.x));
    for (int ch = 0; ch < c.ws; ++ch) {
      if (ch == c.rank) continue;
      const T* rc = reinterpret_cast<const T*>(red_region(pick(c.buf, ch), c.buffer_bytes, E));
      for (int64_t u = part.chunk_begin(ch) + t0; u < part.chunk_end(ch); u += stride)
        store_unit(out, load_vec<T, V>(rc + u * V), part, u, aligned);
    }
  }
  end_call(c.self_sig, E);
}

// ---- gemm_allreduce ------------------------------------------------------------------------

struct GemmFrag {
  uint4 a_lo, a_hi;   // activation rows g and g + 8, k = 32 j + 8 c .. + 8
  uint4 w[kGroups];   // weight row g of each group of 8, same k
};

// w: this lane's weight row of group 0; group gr's row is w + gr * w_group_stride; w_ok bit gr: row < N.
template <bool M16>
DK_DEVICE void gemm_load(GemmFrag& f, const uint16_t* a_lo, const uint16_t* a_hi, const uint16_t* w,
                         int64_t w_group_stride, int64_t kk, bool k_ok, bool lo_ok, bool hi_ok, unsigned w_ok) {
  const uint4 z = make_uint4(0, 0, 0, 0);
  f.a_lo = k_ok && lo_ok ? __ldg(reinterpret_cast<const uint4*>(a_lo + kk)) : z;
  f.a_hi = M16 && k_ok && hi_ok ? __ldg(reinterpret_cast<const uint4*>(a_hi + kk)) : z;
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
    f.w[g] = k_ok && (w_ok >> g & 1u) ? __ldg(reinterpret_cast<const uint4*>(w + g * w_group_stride + kk)) : z;
}

template <class T>
DK_DEVICE void gemm_mma(float (&acc)[kGroups][4], const GemmFrag& f) {
  const uint32_t a0[4] = {f.a_lo.x, f.a_hi.x, f.a_lo.y, f.a_hi.y};
  const uint32_t a1[4] = {f.a_lo.z, f.a_hi.z, f.a_lo.w, f.a_hi.w};
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const uint32_t b0[2] = {f.w[g].x, f.w[g].y};
    const uint32_t b1[2] = {f.w[g].z, f.w[g].w};
    mma_m16n8k16<T>(acc[g], a0, b0);
    mma_m16n8k16<T>(acc[g], a1, b1);
  }
}

template <class T, bool M16>
__global__ void __launch_bounds__(kGemmThreads)
gemm_ar_kernel(const CommParams c, T* out, const T* a, int64_t a_stride, const T* w, const T* bias, int M, int N,
               int K) {
  __shared__ float red[kGemmWarps][16][kTileN + 4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  const bool comm = c.ws > 1;
  CallInfo call{0, 0};
  if (comm) call = begin_call(c.self_sig);
  const uint64_t E = call.epoch;
  const int ntiles = int(cdiv(N, kTileN));
  const int64_t slot_bytes = gemm_slot_bytes(M, N, int(sizeof(T)));
  const int nchunks = int(cdiv(K, 32));
  // this thread's output vector of a tile: row m, columns v8 .. v8 + 8
  const int om = threadIdx.x / (kTileN / 8), ov = (threadIdx.x % (kTileN / 8)) * 8;
  const uint16_t* a16 = reinterpret_cast<const uint16_t*>(a);
  const uint16_t* a_lo = a16 + int64_t(g) * a_stride;
  const uint16_t* a_hi = a16 + int64_t(g + 8) * a_stride;

  for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const int n0 = t * kTileN;
    const int nc = min(kTileN, N - n0);
    const int64_t wstride = int64_t(8) * K;
    const uint16_t* wr = reinterpret_cast<const uint16_t*>(w) + int64_t(n0 + g) * K;
    unsigned w_ok = 0;
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) w_ok |= unsigned(n0 + gr * 8 + g < N) << gr;
    float acc[kGroups][4];
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) acc[gr][0] = acc[gr][1] = acc[gr][2] = acc[gr][3] = 0.f;
    GemmFrag cur, nxt;
    int j = warp;
    if (j < nchunks)
      gemm_load<M16>(cur, a_lo, a_hi, wr, wstride, int64_t(j) * 32 + cq * 8, j * 32 + cq * 8 < K, g < M, g + 8 < M,
                     w_ok);
    for (; j < nchunks; j += kGemmWarps) {  // one chunk ahead: its loads fly during this chunk's mma
      const int jn = j + kGemmWarps;
      if (jn < nchunks)
        gemm_load<M16>(nxt, a_lo, a_hi, wr, wstride, int64_t(jn) * 32 + cq * 8, jn * 32 + cq * 8 < K, g < M, g + 8 < M,
                       w_ok);
      gemm_mma<T>(acc, cur);
      cur = nxt;
    }
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) {
      const int col = gr * 8 + 2 * cq;
      red[warp][g][col] = acc[gr][0];
      red[warp][g][col + 1] = acc[gr][1];
      if (M16) {
        red[warp][g + 8][col] = acc[gr][2];
        red[warp][g + 8][col + 1] = acc[gr][3];
      }
    }
    __syncthreads();
    if (om < M && ov < nc) {
      Vec<T> part;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float s = red[0][om][ov + k];
#pragma unroll
        for (int ww = 1; ww < kGemmWarps; ++ww) s += red[ww][om][ov + k];
        if (bias != nullptr && c.rank == 0) s += to_float(bias[n0 + ov + k]);
        part.v[k] = from_float<T>(s);
      }
      if (!comm) {
        st_global16(out + int64_t(om) * N + n0 + ov, part);
      } else {
        const int64_t off = tile_offset(t, M, kTileN) + int64_t(om) * nc + ov;
#pragma unroll
        for (int q = 0; q < kMaxRanks; ++q)
          if (q < c.ws)
            st_global16(reinterpret_cast<T*>(gemm_slot(c.buf[q], c.buffer_bytes, E, c.rank, slot_bytes)) + off, part);
      }
    }
    __syncthreads();  // red is rewritten by the next tile; the flag release covers every thread's pushes
    const int q = int(threadIdx.x);
    if (comm && q < c.ws && q != c.rank)
      st_release_sys(flag_ptr(pick(c.sig, q), E, tile_slot(t), c.rank), E);
  }
  if (!comm) return;
  for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const int q = int(threadIdx.x);
    if (q < c.ws && q != c.rank) wait_flag(c.self_sig, tile_slot(t), q, E, call.timeout_ns);
    __syncthreads();
    const int n0 = t * kTileN;
    const int nc = min(kTileN, N - n0);
    if (om < M && ov < nc) {
      const int64_t off = tile_offset(t, M, kTileN) + int64_t(om) * nc + ov;
      Vec<T> v[kMaxRanks];
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r)
        if (r < c.ws) v[r] = load_vec<T, 8>(reinterpret_cast<const T*>(gemm_slot(c.self_buf, c.buffer_bytes, E, r,
                                                                                 slot_bytes)) + off);
      Vec<T> o;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        o.v[k] = from_float<T>(rank_order_sum(c.ws, [&](int r) { return to_float(v[r].v[k]); }));
      st_global16(out + int64_t(om) * N + n0 + ov, o);
    }
  }
  end_call(c.self_sig, E);
}

template <class T, bool M16>
int gemm_grid_cap() {  // resident CTAs of the whole GPU (cached per device)
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = 0;
  if (cache[dev] == 0) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemm_ar_kernel<T, M16>, kGemmThreads, 0) !=
            cudaSuccess || per_sm < 1)
      per_sm = 1;
    cache[dev] = per_sm * num_sms();
  }
  return cache[dev];
}

}  // namespace comm_detail

// out [n] = sum over ranks of inp [n] (out may be inp). world_size 1: a copy.
template <class T>
cudaError_t custom_all_reduce(T* out, const T* inp, int64_t n, const dk::comm::Peers& P, bool two_shot,
                              cudaStream_t stream) {
  using namespace comm_detail;
  if (n <= 0) return cudaSuccess;
  if (P.world_size == 1)
    return out == inp ? cudaSuccess
                      : cudaMemcpyAsync(out, inp, size_t(n) * sizeof(T), cudaMemcpyDeviceToDevice, stream);
  const CommParams c = make_params(P);
  const Partition part(n, int(sizeof(T)), P.world_size);
  const int64_t work = two_shot ? part.chunk : part.units;
  const int blocks = int(std::min<int64_t>(kArMaxBlocks, std::max<int64_t>(1, cdiv(work, kArThreads))));
  const bool aligned = aligned16(out) && aligned16(inp);
  if (two_shot) all_reduce_kernel<T, true><<<blocks, kArThreads, 0, stream>>>(c, out, inp, n, aligned);
  else all_reduce_kernel<T, false><<<blocks, kArThreads, 0, stream>>>(c, out, inp, n, aligned);
  return cudaGetLastError();
}

// out [M, N] = sum over ranks of a [M, K] (row stride a_stride) @ w [N, K]^T (+ bias [N] on rank 0),
// for fp16 / bf16 when cuda_gemm_fused_ok(...) holds; cudaErrorNotSupported otherwise.
template <class T>
cudaError_t gemm_all_reduce(T* out, const T* a, int64_t a_stride, const T* w, const T* bias, int64_t M, int64_t N,
                            int64_t K, const dk::comm::Peers& P, cudaStream_t stream) {
  using namespace comm_detail;
  const bool aligned = aligned16(out) && aligned16(a) && aligned16(w) && (bias == nullptr || aligned16(bias));
  if constexpr (!kIsMmaType<T>) {
    return cudaErrorNotSupported;
  } else {
    if (!cuda_gemm_fused_ok(true, M, N, K, a_stride, aligned, P.world_size, P.buffer_bytes, int(sizeof(T))))
      return cudaErrorNotSupported;
    if (M == 0 || N == 0) return cudaSuccess;
    const CommParams c = make_params(P);
    const int64_t ntiles = cdiv(N, kTileN);
#define DK_GEMM_AR_LAUNCH(M16)                                                                             \
  gemm_ar_kernel<T, M16><<<int(std::min<int64_t>(ntiles, gemm_grid_cap<T, M16>())), kGemmThreads, 0, stream>>>( \
      c, out, a, a_stride, w, bias, int(M), int(N), int(K))
    if (M > 8) DK_GEMM_AR_LAUNCH(true);
    else DK_GEMM_AR_LAUNCH(false);
#undef DK_GEMM_AR_LAUNCH
    return cudaGetLastError();
  }
}

}  // namespace dk::cuda
