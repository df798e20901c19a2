// Warpgroup tensor-core operations of sm_90a (wgmma, PTX ISA "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate"), for the attention kernels:
//  - wgmma_rs<T, N, TNSP_B>: D (64 x N fp32) += A (64 x 16 of T, registers) * B (16 x N of T, shared memory
//    through a matrix descriptor), issued by the 4 warps of a warpgroup (consecutive warps from a multiple of 4);
//  - wgmma_fence / wgmma_commit / wgmma_wait<N>: the operation is asynchronous: its accumulators (and A
//    registers) must not be read or written between the issue and the wait_group that retires its group;
//  - fence_proxy_async_smem: shared memory written by ordinary stores or cp.async must be fenced to the async
//    proxy (the one wgmma reads through) before a barrier and the wgmma that reads it;
//  - wgmma_desc_sw128: the descriptor of a 128-byte-swizzled canonical layout (CUTLASS CuTe's
//    GMMA::Layout_K_SW128_Atom / Layout_MN_SW128_Atom, cute/atom/mma_traits_sm90_gmma.hpp, make_gmma_desc).
// Register layouts (the warp's 16 rows of the 64, warp w % 4 of the warpgroup -> rows 16 (w % 4) ..): A as
// mma.m16n8k16's A fragment (mma.cuh), D as its C fragment repeated over the N / 8 column tiles: d[j][e] =
// D[16 w + g + 8 (e >= 2)][8 j + c + (e & 1)], g = lane / 4, c = 2 (lane % 4).
// Shared layouts (2-byte T, 128-byte swizzle: 16-byte chunk index bits [4, 7) of the shared address XORed with
// bits [7, 10), so a swizzle atom of 8 rows x 128 bytes starts on a 1024-byte boundary):
//   K-major B (B[k][n] at row n, K contiguous):   desc start = the k-step's first chunk, SBO = bytes between
//     8-row groups, LBO unused (1);
//   MN-major B (TNSP_B = 1, N contiguous):         start = the k-step's first row, LBO = bytes between 64-element
//     column slabs, SBO = bytes between 8-row groups.
// The CUDA emulator (tools/cuda_emu/shim.h, DK_CUDA_EMU) implements the same operations (descriptor decoding
// included) with asynchronous retirement, so a missing wait or an accumulator touched in flight shows there.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "decodekit/common/macros.h"
#include "decodekit/common/mma.cuh"

namespace dk::cuda {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DK_WGMMA_ENABLED 1
#endif

// Shared-memory address as a wgmma descriptor sees it (its 1024-byte alignment decides the swizzle phase).
// (The emulator's are offsets in its dynamic shared buffer; mma.cuh's smem_addr on the GPU.)
DK_DEVICE uint32_t wgmma_smem_addr(const void* p) {
#if defined(DK_CUDA_EMU)
  return dk_emu::wgmma_smem_addr(p);
#else
  return smem_addr(p);
#endif
}

// Descriptor of a 128-byte-swizzled canonical layout whose k-step starts at shared address addr (16-byte aligned).
DK_HD uint64_t wgmma_desc_sw128_at(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}
DK_DEVICE uint64_t wgmma_desc_sw128(const void* p, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return wgmma_desc_sw128_at(wgmma_smem_addr(p), lbo_bytes, sbo_bytes);
}

DK_DEVICE void wgmma_fence() {
#if defined(DK_WGMMA_ENABLED)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
DK_DEVICE void wgmma_commit() {
#if defined(DK_WGMMA_ENABLED)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(DK_CUDA_EMU)
  dk_emu::wgmma_commit();
#endif
}
template <int N>
DK_DEVICE void wgmma_wait() {
#if defined(DK_WGMMA_ENABLED)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#elif defined(DK_CUDA_EMU)
  dk_emu::wgmma_wait(N);
#endif
}
DK_DEVICE void fence_proxy_async_smem() {
#if defined(DK_WGMMA_ENABLED)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of an accumulator across the wgmma issue / wait (CuTe's
// warpgroup_fence_operand).
DK_DEVICE void wgmma_fence_operand(float& r) {
#if defined(__CUDA_ARCH__)
  asm volatile("" : "+f"(r)::"memory");
#else
  (void)r;
#endif
}

// The asm of wgmma_rs for N = 64 / 128 (TY: the operand type's PTX name).
#define DK_WGMMA_RS_N64(TY) \
    asm volatile(                                                                                                                   \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                                \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                                                                \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                                       \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                                              \
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                                                          \
        :                                                                                                                           \
          "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),   \
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),   \
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),   \
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])    \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TNSP_B));
#define DK_WGMMA_RS_N128(TY) \
    asm volatile(                                                                                                                           \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                                        \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                                                                       \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                                                               \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                                                     \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                                                     \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                                                      \
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                                                                  \
        :                                                                                                                                   \
          "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),           \
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),           \
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),           \
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),           \
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),           \
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),   \
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),   \
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])    \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TNSP_B));

// D (64 x N, fp32) = A * B + (scale_d ? D : 0); see the header comment for the layouts.
template <class T, int N, int TNSP_B>
DK_DEVICE void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  static_assert(kIsMmaType<T> && (N == 64 || N == 128) && (TNSP_B == 0 || TNSP_B == 1), "wgmma_rs shape");
#if defined(DK_WGMMA_ENABLED)
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (N == 64 && kBf16) DK_WGMMA_RS_N64("bf16")
  else if constexpr (N == 64) DK_WGMMA_RS_N64("f16")
  else if constexpr (kBf16) DK_WGMMA_RS_N128("bf16")
  else DK_WGMMA_RS_N128("f16")
#elif defined(DK_CUDA_EMU)
  dk_emu::wgmma_rs<T, N>(&d[0][0], a, desc_b, TNSP_B, scale_d);
#elif defined(__CUDA_ARCH__)
  (void)d, (void)a, (void)desc_b, (void)scale_d;
  __trap();  // a build without sm_90a's features (TORCH_CUDA_ARCH_LIST): never a silent wrong result
#else
  (void)d, (void)a, (void)desc_b, (void)scale_d;
#endif
}

#undef DK_WGMMA_RS_N64
#undef DK_WGMMA_RS_N128

}  // namespace dk::cuda
