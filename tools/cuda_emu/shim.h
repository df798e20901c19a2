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
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>
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
struct Fiber {
  void* sp = nullptr;
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
  std::vector<float> shfl;  // one slot per thread
  std::vector<uint32_t> shfl_u;
  void* sched_sp = nullptr;
  Fiber* cur = nullptr;
  const std::function<void()>* body = nullptr;
};
inline thread_local Block* blk = nullptr;
inline unsigned grid_cap_x = 1u << 30;
enum Order { kForward, kReverse, kRandom };
inline Order order = kForward;
inline std::atomic<long> launches{0};
inline std::set<void*> distinct;
inline int last_threads = 0;
inline int workers = 2;
inline size_t stack_bytes = 64 * 1024;

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
  b.shfl.assign(nt, 0.f);
  b.shfl_u.assign(nt, 0u);
  for (int t = 0; t < nt; ++t) {
    Fiber& f = b.fibers[t];
    f.done = false;
    f.waiting = nullptr;
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
}

template <class K, class... A>
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t, K kernel, A... args) {
  ++launches;
  distinct.insert((void*)kernel);
  const int nt = block.x * block.y * block.z;
  last_threads = nt;
  if (nt > 1024 || nt % 32 != 0 || nt == 0) { fprintf(stderr, "emulator: bad block %d\n", nt); abort(); }
  if (smem > 48 * 1024) { fprintf(stderr, "emulator: bad dynamic smem %zu\n", smem); abort(); }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    fprintf(stderr, "emulator: bad grid %u %u %u\n", grid.x, grid.y, grid.z); abort();
  }
  const dim3 g(std::min(grid.x, grid_cap_x), grid.y, grid.z);
  const long nblocks = long(g.x) * g.y * g.z;
  std::atomic<long> next{0};
  auto worker = [&](int w) {
    gridDim = g;
    blockDim = block;
    Block b;
    blk = &b;
    std::mt19937 rng(1234 + w);
    const std::function<void()> body = [&] { kernel(args...); };
    for (long i; (i = next++) < nblocks;) {
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
template <class T> inline T __ldg(const T* p) { return *p; }
