// Host emulation of the CUDA device features the decodekit kernels use, with fibers:
// every CUDA thread of a block is a user-level context with its own stack, switched by a
// hand-written x86-64 context switch; __syncthreads and warp shuffles are real barriers
// (a fiber that arrives yields until all participants arrived). The scheduler detects
// deadlocks (divergent barriers, shuffles with missing lanes) and can run the fibers of
// each phase in forward, reverse or random order (to expose missing barriers).
// Blocks of a launch run in parallel on DK_EMU_WORKERS OS threads (shared memory and the
// built-in variables are thread_local).
// (An earlier version ran one OS thread per CUDA thread; this one switches fibers, for speed.)
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <type_traits>
#include <vector>

#include "wgmma_desc.h"
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define DK_DEVICE inline
#define cudaGetLastError() cudaSuccess
#define cudaGetDevice(p) (*(p) = 0, cudaSuccess)
#define cudaDeviceGetAttribute(p, a, d) (*(p) = 132, cudaSuccess)

extern "C" void dk_emu_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.globl dk_emu_switch
.type dk_emu_switch,@function
dk_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size dk_emu_switch,.-dk_emu_switch
)");

inline thread_local uint3 threadIdx;
inline thread_local dim3 blockIdx, blockDim, gridDim;

namespace dk_emu {
struct Barrier { int arrived = 0, expected = 0; unsigned long gen = 0; };
// A cp.async copy not yet landed (source read at issue: global memory does not change under a kernel).
struct PendingCopy {
  void* dst;
  unsigned char data[16];
};
// A wgmma issued by this thread, not yet retired (its part: the thread's N / 2 accumulators).
struct WgOp {
  float* d;                 // the accumulators (N / 2 floats)
  int n;                    // N
  bool bf16, tnsp_b, scale_d;
  bool early;               // computed at issue (else at the wait that retires it)
  bool chained;             // an earlier op on the same accumulators was still pending at issue
  uint64_t desc;
  uint32_t a[4][4];         // A words of the lanes 4 g .. 4 g + 3 (rows g, g + 8 of the warp)
  float snap[128];          // late: d at issue; early: d after the computation
};
struct Fiber {
  void* sp = nullptr;
  std::vector<PendingCopy> cp_open;                 // issued since the last commit
  std::vector<std::vector<PendingCopy>> cp_groups;  // committed, not yet landed (oldest first)
  std::vector<WgOp> wg_open;                        // wgmma issued since the last commit_group
  std::vector<std::vector<WgOp>> wg_groups;         // committed, not yet retired
  uint3 tid;
  int lane = 0, warp = 0;
  bool done = false;
  Barrier* waiting = nullptr;
  unsigned long wait_gen = 0;
  std::vector<char> stack;
};
struct Block {
  std::vector<Fiber> fibers;
  Barrier bar;
  std::vector<Barrier> warp_bars;
  std::vector<Barrier> wg_bars;  // warpgroups (4 consecutive warps; wgmma)
  std::vector<float> shfl;  // one slot per thread
  std::vector<uint32_t> shfl_u;
  std::vector<uint32_t> xbuf;  // warp-collective operand exchange (mma, ldmatrix)
  void* sched_sp = nullptr;
  Fiber* cur = nullptr;
  const std::function<void()>* body = nullptr;
};
inline thread_local Block* blk = nullptr;
// When cp.async copies land: kLate -- as late as the program allows, at the cp_async_wait that must see them
// (a read before its wait sees the old contents); kEarly -- at the commit; kMixed (default) -- each group
// either way by a coin flip (so one run exposes both a missing wait and a refill racing with slower readers).
enum CpAsync { kCpEarly, kCpLate, kCpMixed };
inline CpAsync cp_async_mode = kCpMixed;
inline thread_local std::mt19937 cp_rng(4321);
inline unsigned grid_cap_x = 1u << 30;
inline unsigned grid_cap_y = 1u << 30;  // (like grid_cap_x: launches get at most this many blocks in y, to run grid-stride loops)
// kGreedy: one warp at a time (in random order) runs as far as it can before the next one
// starts, so a warp gets a whole phase ahead of the others (exposes a missing __syncthreads
// between warps, which the lock-step orders can miss when warp-collective ops interleave them).
enum Order { kForward, kReverse, kRandom, kGreedy };
inline Order order = kForward;
inline std::atomic<long> launches{0};
inline std::set<void*> distinct;
inline int last_threads = 0;
inline int workers = 2;
inline size_t stack_bytes = 64 * 1024;
// The options every emulator test takes: --reverse | --random | --greedy (the fiber order) and --workers N.
// Returns whether argv[i] was one (i then past its value).
inline bool parse_common_arg(int argc, char** argv, int& i) {
  const std::string a = argv[i];
  if (a == "--reverse") order = kReverse;
  else if (a == "--random") order = kRandom;
  else if (a == "--greedy") order = kGreedy;
  else if (a == "--workers" && i + 1 < argc) workers = atoi(argv[++i]);
  else return false;
  return true;
}
// dynamic shared memory (extern __shared__ in the kernels; dk_emu::dynamic_smem() here): thread_local
// like the static arrays, so that smem_handle's 32-bit offsets reach it
// The kernels' dynamic shared memory starts kDynSmemOffset bytes into a 1024-byte aligned buffer (the buffer's
// start playing the shared window's address 0): aligned to 128 bytes as the kernels declare it, not more -- on
// the GPU static shared memory comes first -- so a kernel that needs more (wgmma's swizzle atoms) must align
// itself, as on the GPU.
constexpr size_t kMaxDynamicSmem = 227 * 1024;
constexpr size_t kDynSmemOffset = 128;
alignas(1024) inline thread_local unsigned char dyn_smem_buf[kDynSmemOffset + kMaxDynamicSmem];
inline thread_local size_t dyn_smem_bytes = 0;
inline unsigned char* dynamic_smem() { return dyn_smem_buf + kDynSmemOffset; }

inline void wait(Barrier& b) {
  Fiber* f = blk->cur;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.gen;
    return;
  }
  f->waiting = &b;
  f->wait_gen = b.gen;
  dk_emu_switch(&f->sp, blk->sched_sp);
}

[[noreturn]] inline void trampoline() {
  Block* b = blk;
  (*b->body)();
  b->cur->done = true;
  dk_emu_switch(&b->cur->sp, b->sched_sp);
  abort();  // never resumed
}

inline void run_block(Block& b, const std::function<void()>& body, int nt, std::mt19937& rng) {
  b.body = &body;
  b.fibers.resize(nt);
  b.bar = Barrier{0, nt, 0};
  b.warp_bars.assign(nt / 32, Barrier{0, 32, 0});
  b.wg_bars.assign(nt / 128, Barrier{0, 128, 0});
  b.shfl.assign(nt, 0.f);
  b.shfl_u.assign(nt, 0u);
  for (int t = 0; t < nt; ++t) {
    Fiber& f = b.fibers[t];
    f.done = false;
    f.waiting = nullptr;
    f.cp_open.clear();  // copies a previous block never waited for never land
    f.cp_groups.clear();
    f.wg_open.clear();
    f.wg_groups.clear();
    f.lane = t % 32;
    f.warp = t / 32;
    f.tid = uint3{unsigned(t % blockDim.x), unsigned((t / blockDim.x) % blockDim.y),
                  unsigned(t / (blockDim.x * blockDim.y))};
    if (f.stack.size() != stack_bytes) f.stack.assign(stack_bytes, 0);
    uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack.data()) + stack_bytes) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top - 64);
    for (int i = 0; i < 6; ++i) sp[i] = nullptr;            // r15 r14 r13 r12 rbx rbp
    sp[6] = reinterpret_cast<void*>(&trampoline);            // ret
    sp[7] = nullptr;                                         // trampoline's fake return address
    f.sp = sp;
  }
  std::vector<int> idx(nt);
  for (int i = 0; i < nt; ++i) idx[i] = i;
  int done = 0;
  auto run_fiber = [&](Fiber& f) {
    if (f.done || (f.waiting && f.waiting->gen == f.wait_gen)) return false;
    f.waiting = nullptr;
    b.cur = &f;
    threadIdx = f.tid;
    dk_emu_switch(&b.sched_sp, f.sp);
    if (f.done) ++done;
    return true;
  };
  if (order == kGreedy) {
    std::vector<int> warps(nt / 32);
    std::iota(warps.begin(), warps.end(), 0);
    while (done < nt) {
      std::shuffle(warps.begin(), warps.end(), rng);
      bool progress = false;
      for (int w : warps)
        for (bool more = true; more;) {
          more = false;
          for (int l = 0; l < 32; ++l) more |= run_fiber(b.fibers[w * 32 + l]);
          progress |= more;
        }
      if (!progress) {
        fprintf(stderr, "emulator: deadlock in block (%u,%u,%u)\n", blockIdx.x, blockIdx.y, blockIdx.z);
        abort();
      }
    }
  }
  while (done < nt) {
    if (order == kReverse) std::reverse(idx.begin(), idx.end());
    else if (order == kRandom) std::shuffle(idx.begin(), idx.end(), rng);
    bool progress = false;
    for (int i : idx) {
      Fiber& f = b.fibers[i];
      if (f.done) continue;
      if (f.waiting && f.waiting->gen == f.wait_gen) continue;  // barrier not complete yet
      f.waiting = nullptr;
      b.cur = &f;
      threadIdx = f.tid;
      dk_emu_switch(&b.sched_sp, f.sp);
      progress = true;
      if (f.done) ++done;
    }
    if (!progress) {
      fprintf(stderr, "emulator: deadlock in block (%u,%u,%u): %d of %d threads done, the rest wait at barriers\n",
              blockIdx.x, blockIdx.y, blockIdx.z, done, nt);
      abort();
    }
  }
  // A finished block must not leave a barrier half-arrived (threads that exited early
  // while others synchronised).
  if (b.bar.arrived != 0) { fprintf(stderr, "emulator: __syncthreads with exited threads\n"); abort(); }
  for (const Fiber& f : b.fibers)
    if (!f.wg_open.empty() || !f.wg_groups.empty()) {
      fprintf(stderr, "emulator: a thread exited with wgmma operations never waited for\n");
      abort();
    }
}

template <class K, class... A>
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t, K kernel, A... args) {
  ++launches;
  const int nt = block.x * block.y * block.z;
  {
    static std::mutex mu;  // launches from several OS threads at once (the all-reduce test's ranks)
    std::lock_guard<std::mutex> lock(mu);
    distinct.insert((void*)kernel);
    last_threads = nt;
  }
  if (nt > 1024 || nt % 32 != 0 || nt == 0) { fprintf(stderr, "emulator: bad block %d\n", nt); abort(); }
  if (smem > kMaxDynamicSmem) { fprintf(stderr, "emulator: bad dynamic smem %zu\n", smem); abort(); }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    fprintf(stderr, "emulator: bad grid %u %u %u\n", grid.x, grid.y, grid.z); abort();
  }
  const dim3 g(std::min(grid.x, grid_cap_x), std::min(grid.y, grid_cap_y), grid.z);
  const long nblocks = long(g.x) * g.y * g.z;
  std::atomic<long> next{0};
  auto worker = [&](int w) {
    gridDim = g;
    blockDim = block;
    Block b;
    blk = &b;
    std::mt19937 rng(1234 + w);
    const std::function<void()> body = [&] { kernel(args...); };
    dyn_smem_bytes = smem;
    for (long i; (i = next++) < nblocks;) {
      // poisoned: a kernel must not read dynamic shared memory it did not write
      memset(dynamic_smem(), 0xff, smem);
      blockIdx = dim3(unsigned(i % g.x), unsigned((i / g.x) % g.y), unsigned(i / (long(g.x) * g.y)));
      run_block(b, body, nt, rng);
    }
    blk = nullptr;
  };
  const int nw = int(std::min<long>(workers, nblocks));
  std::vector<std::thread> th;
  for (int w = 1; w < nw; ++w) th.emplace_back(worker, w);
  worker(0);
  for (auto& x : th) x.join();
}
}  // namespace dk_emu

inline void __syncthreads() { dk_emu::wait(dk_emu::blk->bar); }
inline void __syncwarp(unsigned = 0xffffffffu) { dk_emu::wait(dk_emu::blk->warp_bars[dk_emu::blk->cur->warp]); }
inline float __shfl_xor_sync(unsigned mask, float v, int o) {
  if (mask != 0xffffffffu) { fprintf(stderr, "emulator: partial shuffle mask\n"); abort(); }
  auto* b = dk_emu::blk;
  const int t = b->cur->warp * 32, lane = b->cur->lane;
  b->shfl[t + lane] = v;
  dk_emu::wait(b->warp_bars[b->cur->warp]);
  const float r = b->shfl[t + (lane ^ o)];
  dk_emu::wait(b->warp_bars[b->cur->warp]);
  return r;
}
// __shfl_sync of a 32-bit int: lane src's value (0 <= src < 32; the kernels shuffle within the warp).
inline int __shfl_sync(unsigned mask, int v, int src) {
  if (mask != 0xffffffffu) { fprintf(stderr, "emulator: partial shuffle mask\n"); abort(); }
  if (src < 0 || src > 31) { fprintf(stderr, "emulator: shuffle source lane %d\n", src); abort(); }
  auto* b = dk_emu::blk;
  const int t = b->cur->warp * 32, lane = b->cur->lane;
  b->shfl_u[t + lane] = uint32_t(v);
  dk_emu::wait(b->warp_bars[b->cur->warp]);
  const int r = int(b->shfl_u[t + src]);
  dk_emu::wait(b->warp_bars[b->cur->warp]);
  return r;
}
// __shfl_xor_sync of a 32-bit int (not through float: INT_MAX would not survive).
inline int __shfl_xor_sync(unsigned mask, int v, int o) {
  if (mask != 0xffffffffu) { fprintf(stderr, "emulator: partial shuffle mask\n"); abort(); }
  auto* b = dk_emu::blk;
  const int t = b->cur->warp * 32, lane = b->cur->lane;
  b->shfl_u[t + lane] = uint32_t(v);
  dk_emu::wait(b->warp_bars[b->cur->warp]);
  const int r = int(b->shfl_u[t + (lane ^ o)]);
  dk_emu::wait(b->warp_bars[b->cur->warp]);
  return r;
}
// __any_sync: whether any lane of the warp passes a nonzero predicate.
inline int __any_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) { fprintf(stderr, "emulator: partial vote mask\n"); abort(); }
  auto* b = dk_emu::blk;
  const int t = b->cur->warp * 32, lane = b->cur->lane;
  b->shfl_u[t + lane] = pred != 0;
  dk_emu::wait(b->warp_bars[b->cur->warp]);
  int r = 0;
  for (int i = 0; i < 32; ++i) r |= int(b->shfl_u[t + i]);
  dk_emu::wait(b->warp_bars[b->cur->warp]);
  return r;
}
template <class T> inline T __ldg(const T* p) { return *p; }

// ---- what the custom all-reduce kernels (include/decodekit/comm/allreduce.cuh) need: ranks are
// launches running at the same time on different OS threads of this process, sharing host memory
// as peer buffers; a kernel spinning on a peer's flag holds its OS thread (yielding) until the
// peer's launch stores it.
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor(p, ...) (*(p) = 1, cudaSuccess)  // (the kernel name may hold commas)
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
using std::max;  // CUDA's device min / max of ints
using std::min;
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() {
  fprintf(stderr, "emulator: __trap (a peer flag wait timed out)\n");
  abort();
}
namespace dk_emu {
inline uint64_t global_timer_ns() {
  std::this_thread::yield();
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count());
}
}  // namespace dk_emu

// ---- tensor-core and async-copy operations of include/decodekit/common/mma.cuh (warp-collective:
// the lanes exchange operands through per-thread slots between two warp barriers, like a shuffle).
#define DK_CUDA_EMU 1
namespace dk_emu {
// The hardware faults on a misaligned vector access ("misaligned address"); x86 does not: check each one.
inline void check_aligned(const void* p, size_t n, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % n != 0) {
    fprintf(stderr, "emulator: misaligned %zu-byte %s at %p\n", n, what, p);
    abort();
  }
}
inline thread_local char smem_anchor;  // emulated shared memory is thread_local too: 32-bit offsets from here
inline uint32_t smem_handle(const void* p) {
  return uint32_t(int32_t(reinterpret_cast<intptr_t>(p) - reinterpret_cast<intptr_t>(&smem_anchor)));
}
// (integer arithmetic, not pointer arithmetic on &smem_anchor: the compiler must assume the
// result may point to any shared array whose address was taken by smem_handle)
inline const char* smem_ptr(uint32_t h) {
  return reinterpret_cast<const char*>(reinterpret_cast<intptr_t>(&smem_anchor) + int32_t(h));
}
inline uint32_t* xslot(int lane) {  // 16 words per thread
  auto* b = blk;
  if (b->xbuf.size() < b->fibers.size() * 16) b->xbuf.resize(b->fibers.size() * 16);
  return &b->xbuf[(size_t(b->cur->warp) * 32 + lane) * 16];
}
inline void warp_wait() { wait(blk->warp_bars[blk->cur->warp]); }
template <class T> float bits_to_float(uint16_t h) {
  T x;
  memcpy(&x, &h, 2);
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
}
// e4m3 code -> float (the same exact conversion as common/fp8.h, written out here so that the
// shim does not depend on the headers under test).
inline float fp8_e4m3_value(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
  if (exp == 15 && man == 7) return NAN;
  const float mag = exp ? std::ldexp(1.f + float(man) / 8.f, exp - 7) : std::ldexp(float(man), -9);
  return sign ? -mag : mag;
}
// D (16x8 fp32) += A (16xK) * B (Kx8) for the mma.sync shapes with E = K / 8 elements per 32-bit
// register (m16n8k16 half/bf16: E = 2; m16n8k32 e4m3: E = 4). Lane l, g = l / 4, t = l % 4 holds
// A[g (+8)][E t .. E t + E - 1 (+ K/2)] in a0..a3 and B[E t .. (+ K/2)][g] in b0, b1; element e of a
// register is value(word, e). The lanes exchange their fragments between two warp barriers.
template <int K, class Value>
void mma_sync(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], Value value) {
  constexpr int E = K / 8, H = K / 2;
  const int lane = blk->cur->lane;
  uint32_t* mine = xslot(lane);
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  warp_wait();
  auto A = [&](int r, int k) {
    return value(xslot((r % 8) * 4 + (k % H) / E)[(r >= 8 ? 1 : 0) + (k >= H ? 2 : 0)], k % E);
  };
  auto B = [&](int k, int n) { return value(xslot(n * 4 + (k % H) / E)[4 + (k >= H ? 1 : 0)], k % E); };
  const int g = lane / 4, c = 2 * (lane % 4);
  float r[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = c + (i & 1);
    float acc = d[i];
    for (int k = 0; k < K; ++k) acc += A(row, k) * B(k, col);
    r[i] = acc;
  }
  warp_wait();
  for (int i = 0; i < 4; ++i) d[i] = r[i];
}
template <class T>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_sync<16>(d, a, b, [](uint32_t w, int e) { return bits_to_float<T>(uint16_t(w >> (16 * e))); });
}
inline void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_sync<32>(d, a, b, [](uint32_t w, int e) { return fp8_e4m3_value(uint8_t(w >> (8 * e))); });
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
  const int lane = blk->cur->lane;
  check_aligned(smem_ptr(addr), 16, "ldmatrix row");
  xslot(lane)[0] = addr;
  warp_wait();
  const int g = lane / 4, c = 2 * (lane % 4);
  for (int j = 0; j < 4; ++j) {
    if (!trans) {
      memcpy(&r[j], smem_ptr(xslot(j * 8 + g)[0]) + 2 * c, 4);
    } else {
      uint16_t lo, hi;
      memcpy(&lo, smem_ptr(xslot(j * 8 + c)[0]) + 2 * g, 2);
      memcpy(&hi, smem_ptr(xslot(j * 8 + c + 1)[0]) + 2 * g, 2);
      r[j] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
  warp_wait();
}
inline void cp_async16(void* dst, const void* src, int bytes) {
  check_aligned(dst, 16, "cp.async destination");
  if (bytes != 0) check_aligned(src, 16, "cp.async source");
  PendingCopy c{dst, {}};
  if (bytes == 16) memcpy(c.data, src, 16);
  else memset(c.data, 0, 16);
  blk->cur->cp_open.push_back(c);
}
inline void land(std::vector<PendingCopy>& g) {
  for (const PendingCopy& c : g) memcpy(c.dst, c.data, 16);
  g.clear();
}
inline void cp_async_commit() {
  Fiber* f = blk->cur;
  const bool early = cp_async_mode == kCpEarly || (cp_async_mode == kCpMixed && (cp_rng() & 1));
  if (early) land(f->cp_open);
  f->cp_groups.push_back(std::move(f->cp_open));
  f->cp_open.clear();
}
inline void cp_async_wait(int n) {  // all but the newest n committed groups land
  Fiber* f = blk->cur;
  while (int(f->cp_groups.size()) > n) {
    land(f->cp_groups.front());
    f->cp_groups.erase(f->cp_groups.begin());
  }
}

// ---- wgmma (include/decodekit/common/wgmma.cuh). Shared addresses of descriptors are offsets from the start of
// the dynamic shared buffer (1024-byte aligned like the GPU's shared window, so the swizzle phase is the same;
// the kernel's dynamic memory starts kDynSmemOffset into it, so its own alignment step is exercised).
inline uint32_t wgmma_smem_addr(const void* p) {
  const intptr_t off = reinterpret_cast<intptr_t>(p) - reinterpret_cast<intptr_t>(dyn_smem_buf);
  if (off < intptr_t(kDynSmemOffset) || size_t(off) >= kDynSmemOffset + kMaxDynamicSmem) {
    fprintf(stderr, "emulator: wgmma operand outside dynamic shared memory\n");
    abort();
  }
  return uint32_t(off);
}
inline void wgmma_compute(WgOp& op) {
  const int lane = blk->cur->lane, g = lane / 4, c = 2 * (lane % 4);
  auto A = [&](int r, int k) {  // row r (0..15) of the warp, column k (0..15)
    const uint32_t w = op.a[(k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
    const uint16_t h = uint16_t(w >> (16 * (k % 2)));
    return op.bf16 ? bits_to_float<__nv_bfloat16>(h) : bits_to_float<__half>(h);
  };
  auto B = [&](int k, int n) {
    const uint32_t off = wgmma_b_offset(op.desc, op.tnsp_b, k, n);
    if (off < kDynSmemOffset || off + 2 > kDynSmemOffset + dyn_smem_bytes) {
      fprintf(stderr, "emulator: wgmma B operand read past the dynamic shared memory (%u)\n", off);
      abort();
    }
    uint16_t h;
    memcpy(&h, dyn_smem_buf + off, 2);
    return op.bf16 ? bits_to_float<__nv_bfloat16>(h) : bits_to_float<__half>(h);
  };
  for (int j = 0; j < op.n / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e >= 2 ? 8 : 0), col = 8 * j + c + (e & 1);
      float acc = op.scale_d ? op.d[4 * j + e] : 0.f;
      for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
      op.d[4 * j + e] = acc;
    }
}
inline bool wgmma_pending_on(const float* d) {
  const Fiber* f = blk->cur;
  for (const WgOp& o : f->wg_open) if (o.d == d) return true;
  for (const auto& g : f->wg_groups) for (const WgOp& o : g) if (o.d == d) return true;
  return false;
}
// Issue (warpgroup-collective: every thread of the 4 warps arrives, or the scheduler reports a deadlock).
template <class T, int N>
void wgmma_rs(float* d, const uint32_t (&a)[4], uint64_t desc, int tnsp_b, int scale_d) {
  Block* b = blk;
  Fiber* f = b->cur;
  if (b->wg_bars.empty() || b->fibers.size() % 128 != 0) {
    fprintf(stderr, "emulator: wgmma in a block of %zu threads (warpgroups of 128)\n", b->fibers.size());
    abort();
  }
  const int lane = f->lane;
  uint32_t* mine = xslot(lane);
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  memcpy(mine + 4, &desc, 8);
  wait(b->wg_bars[f->warp / 4]);
  WgOp op{};
  op.d = d;
  op.n = N;
  op.bf16 = std::is_same_v<T, __nv_bfloat16>;
  op.tnsp_b = tnsp_b != 0;
  op.scale_d = scale_d != 0;
  op.desc = desc;
  const int g = lane / 4;
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 4; ++i) op.a[t][i] = xslot(4 * g + t)[i];
  for (int l = 0; l < 32; ++l) {
    uint64_t other;
    memcpy(&other, xslot(l) + 4, 8);
    if (other != desc) {
      fprintf(stderr, "emulator: wgmma descriptors differ across the warp\n");
      abort();
    }
  }
  wait(b->wg_bars[f->warp / 4]);
  op.chained = wgmma_pending_on(d);
  op.early = !op.chained && (cp_async_mode == kCpEarly || (cp_async_mode == kCpMixed && (cp_rng() & 1)));
  if (op.early) wgmma_compute(op);
  memcpy(op.snap, d, sizeof(float) * (N / 2));
  f->wg_open.push_back(op);
}
inline void wgmma_commit() {
  Fiber* f = blk->cur;
  f->wg_groups.push_back(std::move(f->wg_open));
  f->wg_open.clear();
}
inline void wgmma_wait(int n) {  // all but the newest n committed groups retire
  Fiber* f = blk->cur;
  while (int(f->wg_groups.size()) > n) {
    std::vector<WgOp> g = std::move(f->wg_groups.front());
    f->wg_groups.erase(f->wg_groups.begin());
    for (size_t i = 0; i < g.size(); ++i) {
      WgOp& op = g[i];
      bool later = wgmma_pending_on(op.d);
      for (size_t j = i + 1; j < g.size(); ++j) later |= g[j].d == op.d;
      // the accumulators must not change between the issue and the retirement (checked where they are known)
      if ((!op.early && !op.chained) || (op.early && !later))
        if (memcmp(op.snap, op.d, sizeof(float) * (op.n / 2)) != 0) {
          fprintf(stderr, "emulator: wgmma accumulators written while the operation was in flight\n");
          abort();
        }
      if (!op.early) wgmma_compute(op);
    }
  }
}
}  // namespace dk_emu

