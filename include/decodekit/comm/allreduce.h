// Custom AllReduce over peer-mapped buffers: the protocol shared by the CPU kernels (below)
// and the CUDA kernels (allreduce.cuh), torch-free.
//
// Each rank owns two blocks of memory that every other rank has mapped (CUDA: IPC handles;
// CPU: POSIX shared-memory segments): a data buffer of `buffer_bytes` and a Signal block.
// A call is identified by its epoch E = (the rank's Signal::h.epoch) + 1; the kernel bumps
// the epoch at its end (CUDA: the last CTA to finish), so nothing is reset from the host and
// a CUDA graph replays correctly. Every rank makes the same calls in the same order (same
// op, sizes, dtype, and on CUDA the same grid), so the epochs agree.
//
// Flags: Signal::flags[E & 1][slot][from] of rank q is written only by rank `from` (a
// release store of E, remote) and read only by q (acquire loads, local, spinning until the
// value EQUALS E). Two parity banks make equality safe: a peer can be at most one call ahead
// (it needs this rank's flags of a call to finish it), so it writes the other bank; epochs are
// 64-bit, so a stale flag never equals a later epoch (tests start near 2^64 to cross the wrap).
// Slots: one per (barrier phase, CTA) for all_reduce, one per output tile for gemm_allreduce.
//
// Buffers: two halves, used by calls of even / odd epoch. A rank writes half E & 1 of its own
// or a peer's buffer only after, in call E - 1, it acquired a flag of E - 1 from every peer,
// written once that peer had finished call E - 2 (each rank's calls are stream-ordered), so
// nobody still reads what it overwrites: no barrier at the end of a call.
//   half = [ in | red ] for all_reduce (each max_message_bytes): in = this rank's copy of its
//          input, red = (two-shot) the rank's reduced chunk;
//   half = [ slot 0 | ... | slot ws-1 ] for gemm_allreduce: slot q = rank q's partial product,
//          tile after tile (tile t = columns [t * tile_n, ...) of all M rows, row-major).
//
// Arithmetic: out[i] = round_T(x_0[i] + x_1[i] + ... + x_{ws-1}[i]), summed in fp32 in rank
// order (rank_order_sum) on every rank and by both algorithms, so all ranks get bitwise
// identical results (TP workers never diverge) and one-shot == two-shot.
//   one-shot: copy input to `in`; barrier; every rank reduces the whole message from all ins.
//   two-shot: copy input to `in`; barrier; rank c reduces chunk c (two_shot_chunk) into its
//             `red`; barrier; every rank gathers chunk c from rank c's `red`.
// The message is cut into 16-byte units (Partition); CUDA CTA b handles the same units on
// every rank (copy-in, reduce, gather), so a per-CTA barrier suffices.
#pragma once
#include <cstdint>

#include "decodekit/common/dtype.h"

namespace dk::comm {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 64;    // CTAs of one all_reduce launch (flag slots per barrier phase)
constexpr int kMaxTiles = 1024;   // output tiles of one gemm_allreduce
constexpr int kSlots = 2 * kMaxBlocks + kMaxTiles;
constexpr int kUnitBytes = 16;    // partition unit: one 16-byte vector
constexpr int64_t kAlign = 256;   // region alignment inside a buffer
constexpr uint64_t kSignalMagic = 0x646b2d6172763031ull;  // "dk-arv01"

struct alignas(128) SignalHeader {
  uint64_t magic;
  uint64_t epoch;        // calls this rank has completed (wraps at 2^64)
  uint64_t timeout_ns;   // a wait longer than this fails the call (CPU: error; CUDA: trap)
  uint64_t diag_ptr;     // CUDA: int64 [4] in mapped pinned host memory, or 0: before trapping on a
                         // timeout the kernel writes {1, peer, flag slot, epoch} there (readable after)
  uint32_t world_size;
  uint32_t arrive;       // CUDA: CTAs of the running call that have finished
  uint32_t pid;          // CPU: the process that owns this block (its waiters notice when it exits); 0: unknown
};

struct Signal {
  SignalHeader h;
  uint64_t flags[2][kSlots][kMaxRanks];  // [epoch parity][slot][writer rank] = epoch
};

DK_HD int barrier_slot(int phase, int block) { return phase * kMaxBlocks + block; }
DK_HD int tile_slot(int tile) { return 2 * kMaxBlocks + tile; }
DK_HD uint64_t* flag_ptr(Signal* s, uint64_t epoch, int slot, int from) {
  return &s->flags[epoch & 1][slot][from];
}

DK_HD int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
DK_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Buffer layout (see the top of the file).
DK_HD int64_t half_bytes(int64_t buffer_bytes) { return buffer_bytes / 2 / kAlign * kAlign; }
DK_HD int64_t max_message_bytes(int64_t buffer_bytes) { return half_bytes(buffer_bytes) / 2 / kAlign * kAlign; }
DK_HD char* half_ptr(void* buf, int64_t buffer_bytes, uint64_t epoch) {
  return static_cast<char*>(buf) + int64_t(epoch & 1) * half_bytes(buffer_bytes);
}
DK_HD char* in_region(void* buf, int64_t buffer_bytes, uint64_t epoch) { return half_ptr(buf, buffer_bytes, epoch); }
DK_HD char* red_region(void* buf, int64_t buffer_bytes, uint64_t epoch) {
  return half_ptr(buf, buffer_bytes, epoch) + max_message_bytes(buffer_bytes);
}
DK_HD int64_t gemm_slot_bytes(int64_t M, int64_t N, int elem) { return round_up(M * N * elem, kAlign); }
DK_HD bool gemm_fits(int64_t M, int64_t N, int elem, int ws, int64_t buffer_bytes, int64_t tile_n) {
  return ws * gemm_slot_bytes(M, N, elem) <= half_bytes(buffer_bytes) && cdiv(N, tile_n) <= kMaxTiles;
}
DK_HD char* gemm_slot(void* buf, int64_t buffer_bytes, uint64_t epoch, int q, int64_t slot_bytes) {
  return half_ptr(buf, buffer_bytes, epoch) + q * slot_bytes;
}
// Offset (elements) of tile t in a slot and its width: tiles before it are full.
DK_HD int64_t tile_offset(int64_t t, int64_t M, int64_t tile_n) { return t * M * tile_n; }
DK_HD int64_t tile_width(int64_t t, int64_t N, int64_t tile_n) {
  const int64_t w = N - t * tile_n;
  return w < tile_n ? w : tile_n;
}

// CUDA gemm_allreduce: tensor-core tiles of kCudaGemmTileN output columns for up to kCudaGemmMaxM
// rows (fp16 / bf16, K and N multiples of 8, 16-byte aligned operands); otherwise the launcher runs
// cuBLAS into `out` and all-reduces it in place, two-shot from kFallbackTwoShotMinBytes (to be
// calibrated with decodekit.distributed.custom_allreduce.TWO_SHOT_MIN_BYTES).
constexpr int kCudaGemmTileN = 64;
constexpr int kCudaGemmMaxM = 16;
constexpr int64_t kFallbackTwoShotMinBytes = int64_t(1) << 20;
DK_HD bool cuda_gemm_fused_ok(bool mma_type, int64_t M, int64_t N, int64_t K, int64_t a_stride, bool aligned16,
                              int ws, int64_t buffer_bytes, int elem) {
  if (!mma_type || M < 1 || M > kCudaGemmMaxM || N % 8 != 0 || K % 8 != 0 || a_stride % 8 != 0 || !aligned16)
    return false;
  if (N > (int64_t(1) << 30) || K > (int64_t(1) << 30)) return false;
  return ws == 1 || gemm_fits(M, N, elem, ws, buffer_bytes, kCudaGemmTileN);
}
// The INT4 kernel: also K a multiple of G in {32, 64, 128} (K / 32 16-byte chunks per weight row).
DK_HD bool cuda_int4_gemm_fused_ok(bool mma_type, int64_t M, int64_t N, int64_t K, int G, int64_t a_stride,
                                   bool aligned16, int ws, int64_t buffer_bytes, int elem) {
  if (G != 32 && G != 64 && G != 128) return false;
  return K % G == 0 && cuda_gemm_fused_ok(mma_type, M, N, K, a_stride, aligned16, ws, buffer_bytes, elem);
}
// The fp8 kernel (e4m3 codes, 16-byte loads of 16 codes): K and a's row stride multiples of 16.
DK_HD bool cuda_fp8_gemm_fused_ok(int64_t M, int64_t N, int64_t K, int64_t a_stride, bool aligned16, int ws,
                                  int64_t buffer_bytes, int elem) {
  return K % 16 == 0 && a_stride % 16 == 0 &&
         cuda_gemm_fused_ok(true, M, N, K, a_stride, aligned16, ws, buffer_bytes, elem);
}

// The message as 16-byte units of V = 16 / sizeof(T) elements (the last one may be partial);
// two-shot chunk c = units [c * chunk, min((c + 1) * chunk, units)), possibly empty.
struct Partition {
  int64_t n, units, chunk;
  int V;
  DK_HD Partition(int64_t n_, int elem_bytes, int ws) : n(n_) {
    V = kUnitBytes / elem_bytes;
    units = cdiv(n, V);
    chunk = cdiv(units, ws);
  }
  DK_HD int64_t chunk_begin(int c) const { const int64_t b = c * chunk; return b < units ? b : units; }
  DK_HD int64_t chunk_end(int c) const { return chunk_begin(c + 1); }
  DK_HD int64_t elem_begin(int64_t unit) const { const int64_t e = unit * V; return e < n ? e : n; }
};

// The reduction of one element: load(q) is rank q's value as fp32; summed in rank order.
// (Starts from rank 0's value, not from 0.f, so -0 stays -0.) MAXR bounds the unrolled loop,
// so the CUDA kernels index their per-rank registers with constants.
template <int MAXR = kMaxRanks, class Load>
DK_HD float rank_order_sum(int ws, Load&& load) {
  float acc = load(0);
#pragma unroll
  for (int q = 1; q < MAXR; ++q)
    if (q < ws) acc += load(q);
  return acc;
}

// Peers as the kernels see them: this rank, every rank's buffer and signal in this process.
struct Peers {
  int rank = 0, world_size = 1;
  int64_t buffer_bytes = 0;
  void* buf[kMaxRanks] = {};
  Signal* sig[kMaxRanks] = {};
};

// What a failed call reports (timeouts; a signal block that was not initialised).
struct CommStatus {
  int ok = 1;
  int peer = -1;       // the rank waited for
  int slot = -1;
  uint64_t epoch = 0;
  double waited_s = 0;
  const char* what = "";
  int peer_exited = 0;  // CPU: the wait ended because that rank's process is gone (not the timeout)
};

}  // namespace dk::comm

#if !defined(__CUDACC__) || !defined(__CUDA_ARCH__)
// ---- CPU kernels: ranks are processes sharing /dev/shm segments (or threads, in the tests). ----
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace dk::cpu {
namespace comm_detail {
using namespace dk::comm;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
inline uint64_t load_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void store_release(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

// Whether process `pid` has ended: gone, or a zombie its parent has not reaped (the driver, spinning here,
// reaps nobody). 0 or this process (ranks as threads, in the tests): never. Linux (/proc).
inline bool process_exited(uint32_t pid) {
  if (pid == 0 || pid_t(pid) == getpid()) return false;
  if (kill(pid_t(pid), 0) != 0) return errno == ESRCH;
  char path[40], buf[512];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return errno == ENOENT;
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');  // "pid (comm) state ...": comm may hold spaces and parentheses
  return close != nullptr && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

// Spins until *flag == epoch: a short pause loop, then sched_yield (so more ranks than cores
// make progress), checking the clock every few yields. False after timeout_ns, or (*exited set) once the
// process `peer_pid` writing the flag has ended -- checked every ~20 ms after the first 20 ms, so a crashed
// rank fails the call at once instead of after the timeout.
inline bool wait_flag(const uint64_t* flag, uint64_t epoch, uint64_t timeout_ns, double* waited_s,
                      uint32_t peer_pid = 0, int* exited = nullptr) {
  using Clock = std::chrono::steady_clock;
  if (load_acquire(flag) == epoch) return true;
  const auto t0 = Clock::now();
  double next_check = 0.02;
  for (uint32_t it = 1;; ++it) {
    if (load_acquire(flag) == epoch) return true;
    if (it < 256) { cpu_relax(); continue; }
    sched_yield();
    if ((it & 15) == 0) {
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s * 1e9 > double(timeout_ns)) { *waited_s = s; return false; }
      if (peer_pid != 0 && s > next_check) {
        next_check = s + 0.02;
        if (process_exited(peer_pid) && load_acquire(flag) != epoch) {
          *waited_s = s;
          if (exited != nullptr) *exited = 1;
          return false;
        }
      }
    }
  }
}

inline CommStatus timeout_status(int peer, int slot, uint64_t epoch, double waited, const char* what,
                                 int exited = 0) {
  CommStatus st;
  st.ok = 0; st.peer = peer; st.slot = slot; st.epoch = epoch; st.waited_s = waited; st.what = what;
  st.peer_exited = exited;
  return st;
}

// Waits for `q`'s flag at `slot` of call `epoch` in this rank's block: {} or the failure.
inline CommStatus wait_peer(const Peers& P, int q, uint64_t epoch, int slot, const char* what) {
  double waited = 0;
  int exited = 0;
  const uint32_t pid = __atomic_load_n(&P.sig[q]->h.pid, __ATOMIC_RELAXED);
  if (!wait_flag(flag_ptr(P.sig[P.rank], epoch, slot, q), epoch, P.sig[P.rank]->h.timeout_ns, &waited, pid,
                 &exited))
    return timeout_status(q, slot, epoch, waited, what, exited);
  return {};
}

// Signals `slot` of call `epoch` to every peer, then waits for every peer's.
inline CommStatus barrier(const Peers& P, uint64_t epoch, int slot, const char* what) {
  const int r = P.rank;
  for (int q = 0; q < P.world_size; ++q)
    if (q != r) store_release(flag_ptr(P.sig[q], epoch, slot, r), epoch);
  for (int q = 0; q < P.world_size; ++q)
    if (q != r)
      if (CommStatus st = wait_peer(P, q, epoch, slot, what); !st.ok) return st;
  return {};
}

inline CommStatus check_signals(const Peers& P) {
  for (int q = 0; q < P.world_size; ++q) {
    const SignalHeader& h = P.sig[q]->h;
    if (h.magic != kSignalMagic || int(h.world_size) != P.world_size) {
      CommStatus st;
      st.ok = 0; st.peer = q; st.what = "signal block not initialised for this world size (allreduce_init_signal)";
      return st;
    }
  }
  return {};
}

inline uint64_t begin_call(const Peers& P) { return __atomic_load_n(&P.sig[P.rank]->h.epoch, __ATOMIC_RELAXED) + 1; }
inline void end_call(const Peers& P, uint64_t epoch) {
  __atomic_store_n(&P.sig[P.rank]->h.epoch, epoch, __ATOMIC_RELAXED);
}

// out[i] = rank_order_sum over src[q][i] for i in [b, e): blocked so the fp32 partial sums
// stay in L1 and the loops vectorize; the additions per element are rank_order_sum's, in order.
template <class T>
void reduce_range(T* out, const T* const* src, int ws, int64_t b, int64_t e) {
  constexpr int64_t kBlock = 1024;
  const int64_t nblk = cdiv(e - b, kBlock);
  DK_OMP_PARALLEL_FOR_IF((e - b) * ws >= 4 * kParallelGrain)
  for (int64_t k = 0; k < nblk; ++k) {
    const int64_t i0 = b + k * kBlock, len = std::min(kBlock, e - i0);
    float acc[kBlock];
    const T* s0 = src[0] + i0;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) acc[i] = to_float(s0[i]);
    for (int q = 1; q < ws; ++q) {
      const T* sq = src[q] + i0;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) acc[i] += to_float(sq[i]);
    }
    T* o = out + i0;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) o[i] = from_float<T>(acc[i]);
  }
}

}  // namespace comm_detail

// out [n] = sum over ranks of every rank's inp [n] (out may alias inp). world_size 1: a copy.
template <class T>
dk::comm::CommStatus all_reduce(T* out, const T* inp, int64_t n, const dk::comm::Peers& P, bool two_shot) {
  using namespace comm_detail;
  const int r = P.rank, ws = P.world_size;
  if (ws == 1) {
    if (out != inp) std::memmove(out, inp, size_t(n) * sizeof(T));
    return {};
  }
  if (CommStatus st = check_signals(P); !st.ok) return st;
  const uint64_t E = begin_call(P);
  T* mine = reinterpret_cast<T*>(in_region(P.buf[r], P.buffer_bytes, E));
  std::memcpy(mine, inp, size_t(n) * sizeof(T));
  if (CommStatus st = barrier(P, E, barrier_slot(0, 0), "all_reduce: inputs published"); !st.ok) return st;
  const T* src[kMaxRanks];
  for (int q = 0; q < ws; ++q) src[q] = reinterpret_cast<const T*>(in_region(P.buf[q], P.buffer_bytes, E));
  if (!two_shot) {
    reduce_range(out, src, ws, 0, n);
  } else {
    const Partition part(n, int(sizeof(T)), ws);
    // reduce my chunk into `red` (same offsets as in the message), then gather the others'
    T* red = reinterpret_cast<T*>(red_region(P.buf[r], P.buffer_bytes, E));
    const int64_t b = part.elem_begin(part.chunk_begin(r)), e = part.elem_begin(part.chunk_end(r));
    reduce_range(red, src, ws, b, e);
    std::memcpy(out + b, red + b, size_t(e - b) * sizeof(T));
    if (CommStatus st = barrier(P, E, barrier_slot(1, 0), "all_reduce: reduced chunks published"); !st.ok)
      return st;
    for (int c = 0; c < ws; ++c) {
      if (c == r) continue;
      const T* rc = reinterpret_cast<const T*>(red_region(P.buf[c], P.buffer_bytes, E));
      const int64_t cb = part.elem_begin(part.chunk_begin(c)), ce = part.elem_begin(part.chunk_end(c));
      std::memcpy(out + cb, rc + cb, size_t(ce - cb) * sizeof(T));
    }
  }
  end_call(P, E);
  return {};
}

// out [M, N] (contiguous) = sum over ranks of every rank's partial product, computed tile by
// tile: gemm_tile(dst, n0, nc) must write rank-local round_T(a @ w[n0 : n0 + nc]^T (+ bias on
// rank 0)) as [M, nc] row-major at dst. Each tile goes into this rank's slot of every peer's
// buffer as soon as it is computed (flag per tile), then the tiles are reduced in rank order as
// their flags arrive. Caller: gemm_fits(...) must hold (else GEMM + all_reduce); ws > 1.
template <class T, class GemmTile>
dk::comm::CommStatus gemm_all_reduce(T* out, int64_t M, int64_t N, int64_t tile_n, const dk::comm::Peers& P,
                                     GemmTile&& gemm_tile) {
  using namespace comm_detail;
  const int r = P.rank, ws = P.world_size;
  if (CommStatus st = check_signals(P); !st.ok) return st;
  const uint64_t E = begin_call(P);
  const int64_t slot_bytes = gemm_slot_bytes(M, N, int(sizeof(T)));
  const int64_t ntiles = cdiv(N, tile_n);
  T* own = reinterpret_cast<T*>(gemm_slot(P.buf[r], P.buffer_bytes, E, r, slot_bytes));
  for (int64_t t = 0; t < ntiles; ++t) {
    const int64_t off = tile_offset(t, M, tile_n), nc = tile_width(t, N, tile_n);
    gemm_tile(own + off, t * tile_n, nc);
    for (int q = 0; q < ws; ++q) {
      if (q == r) continue;
      T* dst = reinterpret_cast<T*>(gemm_slot(P.buf[q], P.buffer_bytes, E, r, slot_bytes));
      std::memcpy(dst + off, own + off, size_t(M * nc) * sizeof(T));
      store_release(flag_ptr(P.sig[q], E, tile_slot(int(t)), r), E);
    }
  }
  const T* src[kMaxRanks];
  for (int q = 0; q < ws; ++q)
    src[q] = reinterpret_cast<const T*>(gemm_slot(P.buf[r], P.buffer_bytes, E, q, slot_bytes));
  for (int64_t t = 0; t < ntiles; ++t) {
    for (int q = 0; q < ws; ++q) {
      if (q == r) continue;
      if (CommStatus st = wait_peer(P, q, E, tile_slot(int(t)), "gemm_allreduce: partial tile published"); !st.ok)
        return st;
    }
    const int64_t off = tile_offset(t, M, tile_n), nc = tile_width(t, N, tile_n);
    for (int64_t m = 0; m < M; ++m) {
      const T* row[kMaxRanks];
      for (int q = 0; q < ws; ++q) row[q] = src[q] + off + m * nc;
      reduce_range(out + m * N + t * tile_n, row, ws, 0, nc);
    }
  }
  end_call(P, E);
  return {};
}

// Zeroes a signal block and writes its header (setup; peers must not signal it before).
inline dk::comm::SignalHeader signal_header(int world_size, uint64_t timeout_ns, uint64_t epoch, uint64_t diag_ptr) {
  dk::comm::SignalHeader h{};
  h.magic = dk::comm::kSignalMagic;
  h.epoch = epoch;
  h.timeout_ns = timeout_ns;
  h.diag_ptr = diag_ptr;
  h.world_size = uint32_t(world_size);
  return h;
}

// (the calling process owns the block: its pid lets peers waiting on it notice when it exits)
inline void init_signal(dk::comm::Signal* s, int world_size, uint64_t timeout_ns, uint64_t epoch) {
  std::memset(static_cast<void*>(s), 0, sizeof(dk::comm::Signal));
  const dk::comm::SignalHeader h = signal_header(world_size, timeout_ns, epoch, 0);
  s->h.world_size = h.world_size;
  s->h.timeout_ns = h.timeout_ns;
  s->h.epoch = h.epoch;
  s->h.pid = uint32_t(getpid());
  __atomic_store_n(&s->h.magic, h.magic, __ATOMIC_RELEASE);
}

}  // namespace dk::cpu
#endif
