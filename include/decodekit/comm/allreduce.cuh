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
// gemm_ar_kernel<T, Mainloop>: out [M <= 16, N] = sum_r a_r @ w_r^T, T fp16 / bf16, w_r dense T, packed
// INT4 or fp8 e4m3 (with a_r then fp8 codes and per-row / per-column scales). A persistent grid (at
// most the resident CTAs; every rank has the same) walks tiles of kCudaGemmTileN = 64 output columns:
// 8 warps split K, each running mma.sync (m16n8k16; fp8: m16n8k32) over the tile's 8 groups of 8
// weight rows, operands straight from global memory as 16-byte vectors (LDG.E.128): the mainloops
// (DenseMainloop, Int4Mainloop, Fp8Mainloop) say which k each lane loads; INT4 weights are decoded
// in registers. The warps' fp32 partial tiles are summed in smem in warp order, scaled (fp8), bias
// added on rank 0, rounded to T, and pushed (16-byte stores) into slot [rank] of every rank's
// buffer, then the tile's flag is released to every peer. After its last tile the CTA waits for
// each tile's flags from all peers and reduces the slots in rank order into out, so the
// communication of early tiles overlaps the GEMM of later ones. world_size 1: straight to out.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "decodekit/comm/allreduce.h"
#include "decodekit/common/mma.cuh"
#include "decodekit/common/vec.cuh"
#include "decodekit/gemm/int4_common.h"

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
#if defined(DK_CUDA_EMU)
  v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#endif
  return v;
}
DK_DEVICE void st_release_sys(uint64_t* p, uint64_t v) {
#if defined(DK_CUDA_EMU)
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#else
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}
DK_DEVICE uint64_t ld_volatile(const uint64_t* p) { return *reinterpret_cast<const volatile uint64_t*>(p); }
DK_DEVICE uint64_t global_timer_ns() {
  uint64_t t;
#if defined(DK_CUDA_EMU)
  t = dk_emu::global_timer_ns();  // also yields the OS thread: another rank's blocks run on other threads
#else
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
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
#if defined(DK_CUDA_EMU)
  *reinterpret_cast<uint4*>(p) = u;
#else
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
               : "memory");
#endif
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
// A mainloop adds a warp's share of K into acc[gr][e], the mma.sync m16n8k* D fragments of the
// tile's rows g (e 0-1), g + 8 (e 2-3) and columns n0 + 8 gr + 2 cq (+1); finish(s, m, n) turns the
// warp-summed fp32 value of output (m, n) into the product before bias (fp8: the two scales).
// Each mainloop reads A and B with the same permutation of k, so the dot products are unchanged.

// Dense fp16 / bf16 weight [N, K]: warp w takes the 32-wide k chunks w, w + 8, ...; lane (g, c) loads
// weight row g of each n8 group and activation rows g, g + 8 at k = 32 j + 8 c .. + 8 (16 bytes each)
// and uses elements 0-3 for the chunk's first k16 step, 4-7 for the second; one chunk ahead in flight.
template <class T, bool M16_>
struct DenseMainloop {
  static constexpr bool M16 = M16_;
  const T* a;          // [M, K], row stride a_stride
  int64_t a_stride;
  const T* w;          // [N, K]

  struct Frag {
    uint4 a_lo, a_hi;   // activation rows g and g + 8, k = 32 j + 8 c .. + 8
    uint4 w[kGroups];   // weight row g of each group of 8, same k
  };
  DK_DEVICE void load(Frag& f, const uint16_t* a_lo, const uint16_t* a_hi, const uint16_t* wr, int64_t w_group_stride,
                      int64_t kk, bool k_ok, bool lo_ok, bool hi_ok, unsigned w_ok) const {
    const uint4 z = make_uint4(0, 0, 0, 0);
    f.a_lo = k_ok && lo_ok ? __ldg(reinterpret_cast<const uint4*>(a_lo + kk)) : z;
    f.a_hi = M16 && k_ok && hi_ok ? __ldg(reinterpret_cast<const uint4*>(a_hi + kk)) : z;
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr)
      f.w[gr] = k_ok && (w_ok >> gr & 1u) ? __ldg(reinterpret_cast<const uint4*>(wr + gr * w_group_stride + kk)) : z;
  }
  DK_DEVICE void run(float (&acc)[kGroups][4], int n0, int M, int N, int K, int warp, int g, int cq) const {
    const uint16_t* a16 = reinterpret_cast<const uint16_t*>(a);
    const uint16_t* a_lo = a16 + int64_t(g) * a_stride;
    const uint16_t* a_hi = a16 + int64_t(g + 8) * a_stride;
    const int64_t wstride = int64_t(8) * K;
    const uint16_t* wr = reinterpret_cast<const uint16_t*>(w) + int64_t(n0 + g) * K;
    unsigned w_ok = 0;
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) w_ok |= unsigned(n0 + gr * 8 + g < N) << gr;
    const int nchunks = int(cdiv(K, 32));
    Frag cur, nxt;
    int j = warp;
    if (j < nchunks)
      load(cur, a_lo, a_hi, wr, wstride, int64_t(j) * 32 + cq * 8, j * 32 + cq * 8 < K, g < M, g + 8 < M, w_ok);
    for (; j < nchunks; j += kGemmWarps) {  // one chunk ahead: its loads fly during this chunk's mma
      const int jn = j + kGemmWarps;
      if (jn < nchunks)
        load(nxt, a_lo, a_hi, wr, wstride, int64_t(jn) * 32 + cq * 8, jn * 32 + cq * 8 < K, g < M, g + 8 < M, w_ok);
      const uint32_t a0[4] = {cur.a_lo.x, cur.a_hi.x, cur.a_lo.y, cur.a_hi.y};
      const uint32_t a1[4] = {cur.a_lo.z, cur.a_hi.z, cur.a_lo.w, cur.a_hi.w};
#pragma unroll
      for (int gr = 0; gr < kGroups; ++gr) {
        const uint32_t b0[2] = {cur.w[gr].x, cur.w[gr].y};
        const uint32_t b1[2] = {cur.w[gr].z, cur.w[gr].w};
        mma_m16n8k16<T>(acc[gr], a0, b0);
        mma_m16n8k16<T>(acc[gr], a1, b1);
      }
      cur = nxt;
    }
  }
  DK_DEVICE float finish(float s, int, int) const { return s; }
};

// Packed INT4 weight (gemm/int4.h layout: qweight [N, K/2], scales / mins [N, K/G] fp16): a row's
// 16-byte chunk q (bytes 16q .. 16q + 16, inside one group since G/2 >= 16) holds 32 codes, low
// nibbles = elements e0 .. e0 + 16, high = e0 + G/2 .. + 16 (e0 = group * G + 16q - group * G/2).
// Warp w takes chunk quads w, w + 8, ...; lane (g, c) takes chunk 4 j + c of weight row g of each n8
// group and the 32 matching activations of rows g, g + 8 (four 16-byte loads per row); its eight
// k16 steps use elements 4s .. 4s + 3 of those 32 (steps 0-3: low nibbles of word s, 4-7: high).
// Each weight is decoded as int4_weight (fp32) and rounded once to T, like int4_gemm_mma.
template <class T, bool M16_>
struct Int4Mainloop {
  static constexpr bool M16 = M16_;
  const T* a;                // [M, K], row stride a_stride
  int64_t a_stride;
  const uint8_t* qweight;    // [N, K/2]
  const __half* scales;      // [N, K/G]
  const __half* mins;        // [N, K/G]
  int G;

  DK_DEVICE void run(float (&acc)[kGroups][4], int n0, int M, int N, int K, int warp, int g, int cq) const {
    const int nq = K / 32;                 // 16-byte chunks per weight row
    const int64_t row_bytes = K / 2, ng = K / G;
    const int half = G / 2;
    const T* a_lo = a + int64_t(g) * a_stride;
    const T* a_hi = a + int64_t(g + 8) * a_stride;
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll 1
    for (int j = warp; 4 * j < nq; j += kGemmWarps) {
      const int q = 4 * j + cq;
      const bool k_ok = q < nq;
      const int grp = k_ok ? (16 * q) / half : 0;
      const int64_t e0 = int64_t(grp) * G + (16 * q - grp * half);  // low nibbles' first element
      uint4 alo[4], ahi[4];  // [0, 1]: elements e0 .. e0 + 16, [2, 3]: e0 + G/2 .. + 16
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t k = e0 + (i >> 1) * half + (i & 1) * 8;
        alo[i] = k_ok && g < M ? __ldg(reinterpret_cast<const uint4*>(a_lo + k)) : z;
        ahi[i] = M16 && k_ok && g + 8 < M ? __ldg(reinterpret_cast<const uint4*>(a_hi + k)) : z;
      }
#pragma unroll
      for (int gr = 0; gr < kGroups; ++gr) {
        const int64_t n = n0 + gr * 8 + g;
        const bool ok = k_ok && n < N;
        const uint4 wq = ok ? __ldg(reinterpret_cast<const uint4*>(qweight + n * row_bytes) + q) : z;
        const float sc = ok ? __half2float(__ldg(scales + n * ng + grp)) : 0.f;
        const float mn = ok ? __half2float(__ldg(mins + n * ng + grp)) : 0.f;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          const uint32_t wd = (s & 3) == 0 ? wq.x : (s & 3) == 1 ? wq.y : (s & 3) == 2 ? wq.z : wq.w;
          const int sh = s < 4 ? 0 : 4;
          auto wv = [&](int byte) { return int4_weight(int((wd >> (8 * byte + sh)) & 15u), sc, mn); };
          const uint32_t b[2] = {pack2<T>(wv(0), wv(1)), pack2<T>(wv(2), wv(3))};
          const uint4& al = alo[s >> 1];
          const uint4& ah = ahi[s >> 1];
          const uint32_t af[4] = {(s & 1) ? al.z : al.x, (s & 1) ? ah.z : ah.x, (s & 1) ? al.w : al.y,
                                  (s & 1) ? ah.w : ah.y};
          mma_m16n8k16<T>(acc[gr], af, b);
        }
      }
    }
  }
  DK_DEVICE float finish(float s, int, int) const { return s; }
};

// fp8 e4m3 W8A8 (gemm/fp8_gemm.h): a [M, K] and w [N, K] codes, a_scale [M], w_scale [N] fp32.
// Warp w takes the 64-wide k chunks w, w + 8, ...; lane (g, c) loads 16 codes of weight row g of each
// n8 group and of activation rows g, g + 8 at k = 64 j + 16 c, words x, y feed the first m16n8k32
// step (A/B fragment registers 0 and 2 / b0 and b1), z, w the second. finish: * a_scale * w_scale.
template <bool M16_>
struct Fp8Mainloop {
  static constexpr bool M16 = M16_;
  const uint8_t* a;          // [M, K] e4m3 codes, row stride a_stride
  int64_t a_stride;
  const float* a_scale;      // [M]
  const uint8_t* w;          // [N, K] e4m3 codes
  const float* w_scale;      // [N]

  DK_DEVICE void run(float (&acc)[kGroups][4], int n0, int M, int N, int K, int warp, int g, int cq) const {
    const uint8_t* a_lo = a + int64_t(g) * a_stride;
    const uint8_t* a_hi = a + int64_t(g + 8) * a_stride;
    const uint4 z = make_uint4(0, 0, 0, 0);
    const int nchunks = int(cdiv(K, 64));
#pragma unroll 1
    for (int j = warp; j < nchunks; j += kGemmWarps) {
      const int64_t kk = int64_t(j) * 64 + cq * 16;
      const bool k_ok = kk < K;  // K is a multiple of 16
      const uint4 al = k_ok && g < M ? __ldg(reinterpret_cast<const uint4*>(a_lo + kk)) : z;
      const uint4 ah = M16 && k_ok && g + 8 < M ? __ldg(reinterpret_cast<const uint4*>(a_hi + kk)) : z;
      uint4 wv[kGroups];
#pragma unroll
      for (int gr = 0; gr < kGroups; ++gr) {
        const int64_t n = n0 + gr * 8 + g;
        wv[gr] = k_ok && n < N ? __ldg(reinterpret_cast<const uint4*>(w + n * K + kk)) : z;
      }
      const uint32_t a0[4] = {al.x, ah.x, al.y, ah.y};
      const uint32_t a1[4] = {al.z, ah.z, al.w, ah.w};
#pragma unroll
      for (int gr = 0; gr < kGroups; ++gr) {
        const uint32_t b0[2] = {wv[gr].x, wv[gr].y};
        const uint32_t b1[2] = {wv[gr].z, wv[gr].w};
        mma_m16n8k32_e4m3(acc[gr], a0, b0);
        mma_m16n8k32_e4m3(acc[gr], a1, b1);
      }
    }
  }
  DK_DEVICE float finish(float s, int m, int n) const { return s * __ldg(a_scale + m) * __ldg(w_scale + n); }
};

// (min 1 CTA per SM stated: with the bare bound ptxas capped the INT4 fp16 variant at 80 registers and spilled)
template <class T, class ML>
__global__ void __launch_bounds__(kGemmThreads, 1)
gemm_ar_kernel(const CommParams c, T* out, const ML ml, const T* bias, int M, int N, int K) {
  __shared__ float red[kGemmWarps][16][kTileN + 4];
  constexpr bool M16 = ML::M16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  const bool comm = c.ws > 1;
  CallInfo call{0, 0};
  if (comm) call = begin_call(c.self_sig);
  const uint64_t E = call.epoch;
  const int ntiles = int(cdiv(N, kTileN));
  const int64_t slot_bytes = gemm_slot_bytes(M, N, int(sizeof(T)));
  // this thread's output vector of a tile: row m, columns v8 .. v8 + 8
  const int om = threadIdx.x / (kTileN / 8), ov = (threadIdx.x % (kTileN / 8)) * 8;

  for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const int n0 = t * kTileN;
    const int nc = min(kTileN, N - n0);
    float acc[kGroups][4];
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) acc[gr][0] = acc[gr][1] = acc[gr][2] = acc[gr][3] = 0.f;
    ml.run(acc, n0, M, N, K, warp, g, cq);
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
        s = ml.finish(s, om, n0 + ov + k);
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

template <class T, class ML>
int gemm_grid_cap() {  // resident CTAs of the whole GPU (cached per device)
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = 0;
  if (cache[dev] == 0) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemm_ar_kernel<T, ML>, kGemmThreads, 0) !=
            cudaSuccess || per_sm < 1)
      per_sm = 1;
    cache[dev] = per_sm * num_sms();
  }
  return cache[dev];
}

// The mainloop for M <= 8 (M16 = false: rows g + 8 are never loaded) or M <= 16.
template <class T, template <class, bool> class MLT, class... Args>
cudaError_t launch_gemm_ar(T* out, const T* bias, int64_t M, int64_t N, int64_t K, const Peers& P,
                           cudaStream_t stream, Args... args) {
  if (M == 0 || N == 0) return cudaSuccess;
  const CommParams c = make_params(P);
  const int64_t ntiles = cdiv(N, kTileN);
  if (M > 8) {
    using ML = MLT<T, true>;
    gemm_ar_kernel<T, ML><<<int(std::min<int64_t>(ntiles, gemm_grid_cap<T, ML>())), kGemmThreads, 0, stream>>>(
        c, out, ML{args...}, bias, int(M), int(N), int(K));
  } else {
    using ML = MLT<T, false>;
    gemm_ar_kernel<T, ML><<<int(std::min<int64_t>(ntiles, gemm_grid_cap<T, ML>())), kGemmThreads, 0, stream>>>(
        c, out, ML{args...}, bias, int(M), int(N), int(K));
  }
  return cudaGetLastError();
}

template <class T, bool M16>
using Fp8MainloopT = Fp8Mainloop<M16>;

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
    return launch_gemm_ar<T, DenseMainloop>(out, bias, M, N, K, P, stream, a, a_stride, w);
  }
}

// The same for a packed INT4 weight (gemm/int4.h layout) when cuda_int4_gemm_fused_ok(...) holds.
template <class T>
cudaError_t gemm_all_reduce_int4(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                                 const __half* mins, int G, const T* bias, int64_t M, int64_t N, int64_t K,
                                 const dk::comm::Peers& P, cudaStream_t stream) {
  using namespace comm_detail;
  const bool aligned = aligned16(out) && aligned16(a) && aligned16(qweight) && (bias == nullptr || aligned16(bias));
  if constexpr (!kIsMmaType<T>) {
    return cudaErrorNotSupported;
  } else {
    if (!cuda_int4_gemm_fused_ok(true, M, N, K, G, a_stride, aligned, P.world_size, P.buffer_bytes, int(sizeof(T))))
      return cudaErrorNotSupported;
    return launch_gemm_ar<T, Int4Mainloop>(out, bias, M, N, K, P, stream, a, a_stride, qweight, scales, mins, G);
  }
}

// The same for fp8 e4m3 W8A8: out = sum over ranks of (a @ w^T) * a_scale[m] * w_scale[n] (+ bias on
// rank 0), a / w e4m3 codes, when cuda_fp8_gemm_fused_ok(...) holds.
template <class T>
cudaError_t gemm_all_reduce_fp8(T* out, const uint8_t* a, int64_t a_stride, const float* a_scale, const uint8_t* w,
                                const float* w_scale, const T* bias, int64_t M, int64_t N, int64_t K,
                                const dk::comm::Peers& P, cudaStream_t stream) {
  using namespace comm_detail;
  const bool aligned = aligned16(out) && aligned16(a) && aligned16(w) && (bias == nullptr || aligned16(bias));
  if constexpr (!kIsMmaType<T>) {
    return cudaErrorNotSupported;
  } else {
    if (!cuda_fp8_gemm_fused_ok(M, N, K, a_stride, aligned, P.world_size, P.buffer_bytes, int(sizeof(T))))
      return cudaErrorNotSupported;
    return launch_gemm_ar<T, Fp8MainloopT>(out, bias, M, N, K, P, stream, a, a_stride, a_scale, w, w_scale);
  }
}

}  // namespace dk::cuda
