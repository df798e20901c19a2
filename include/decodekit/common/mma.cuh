// Warp-level tensor-core and async-copy building blocks (sm_80+ PTX, used on sm_90a):
//  - mma_m16n8k16<T>: D = A * B + D, A 16x16 / B 16x8 of T (half or bf16), fp32 accumulators,
//  - mma_m16n8k32_e4m3: the same for fp8 e4m3 operands, A 16x32 / B 32x8 (sm_89+),
//  - ldmatrix_x4 / ldmatrix_x4_trans: four 8x8 b16 matrices from shared memory into fragments,
//  - cp_async16 (LDGSTS, optional zero fill) with commit / wait_group,
//  - pack2<T>: two fp32 values rounded to T, packed in one 32-bit fragment register.
// Fragment layouts (PTX ISA, "mma.m16n8k16"), lane l, g = l / 4, c = 2 * (l % 4):
//   A (row-major 16x16): a0 = A[g][c..c+1], a1 = A[g+8][c..c+1], a2 = A[g][c+8..c+9], a3 = A[g+8][c+8..c+9]
//   B (16x8, "col"):     b0 = B[c..c+1][g], b1 = B[c+8..c+9][g]
//   C/D (16x8 fp32):     d0, d1 = D[g][c..c+1], d2, d3 = D[g+8][c..c+1]
// (low 16 bits = the lower column / row index.) ldmatrix: lane i gives the address of row
// i % 8 of matrix i / 8 (16 contiguous bytes); register j of lane l receives matrix j's
// elements [g][c..c+1] (non-transposed) or [c..c+1][g] (transposed).
// The CUDA emulator (tools/cuda_emu/shim.h, DK_CUDA_EMU) implements the same operations on
// the host, so the kernels built on these run there too.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "decodekit/common/macros.h"

namespace dk::cuda {

template <class T> inline constexpr bool kIsMmaType = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// Shared-memory address of a generic pointer into shared memory (the operand of ldmatrix / cp.async).
DK_DEVICE uint32_t smem_addr(const void* p) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#elif defined(DK_CUDA_EMU)
  return dk_emu::smem_handle(p);
#else
  return 0;
#endif
}

template <class T>
DK_DEVICE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(kIsMmaType<T>, "mma_m16n8k16: half or bf16 operands");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(DK_CUDA_EMU)
  dk_emu::mma_m16n8k16<T>(d, a, b);
#endif
}

// D (16x8 fp32) += A (16x32 e4m3) * B (32x8 e4m3). Fragments (lane l, g = l / 4, t = l % 4; 4 codes
// per register, lowest byte = lowest index): a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..],
// a3 = A[g+8][16+4t..]; b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]; D as mma_m16n8k16.
DK_DEVICE void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(DK_CUDA_EMU)
  dk_emu::mma_m16n8k32_e4m3(d, a, b);
#endif
}

template <bool TRANS>
DK_DEVICE void ldmatrix_x4_impl(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#elif defined(DK_CUDA_EMU)
  dk_emu::ldmatrix_x4(r, addr, TRANS);
#endif
}
DK_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* row) { ldmatrix_x4_impl<false>(r, smem_addr(row)); }
DK_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) { ldmatrix_x4_impl<true>(r, smem_addr(row)); }

// A kernel's dynamic shared memory as `unsigned char* name` (the emulator hands out its own buffer;
// nvcc's host pass sees a null pointer).
#if defined(__CUDA_ARCH__)
#define DK_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#elif defined(DK_CUDA_EMU)
#define DK_DYNAMIC_SMEM(name) unsigned char* name = dk_emu::dynamic_smem()
#else
#define DK_DYNAMIC_SMEM(name) unsigned char* name = nullptr
#endif

// 16 bytes global -> shared without a register round trip; bytes == 0 zero-fills the
// destination (src must still be a valid address; it is not read).
DK_DEVICE void cp_async16(void* smem_dst, const void* gmem_src, int bytes = 16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(bytes));
#elif defined(DK_CUDA_EMU)
  dk_emu::cp_async16(smem_dst, gmem_src, bytes);
#endif
}
// (No cp.async ... L2::cache_hint variant: nvcc 13.0's ptxas gave the Marlin kernel's createpolicy +
// cache_hint copies a memory descriptor in a uniform register it never wrote (desc[UR1]), which faulted
// with "illegal instruction" on the H200, 2026-12-04; tools/cuda_check.py now refuses odd descriptors.)
DK_DEVICE void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#elif defined(DK_CUDA_EMU)
  dk_emu::cp_async_commit();
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
DK_DEVICE void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#elif defined(DK_CUDA_EMU)
  dk_emu::cp_async_wait(N);
#endif
}

// Two fp32 values rounded (RNE) to T and packed: lo in bits 0..15.
template <class T>
DK_DEVICE uint32_t pack2(float lo, float hi) {
  static_assert(kIsMmaType<T>, "pack2: half or bf16");
  uint16_t l, h;
  if constexpr (std::is_same_v<T, __half>) {
    const __half a = __float2half_rn(lo), b = __float2half_rn(hi);
    l = *reinterpret_cast<const uint16_t*>(&a);
    h = *reinterpret_cast<const uint16_t*>(&b);
  } else {
    const __nv_bfloat16 a = __float2bfloat16_rn(lo), b = __float2bfloat16_rn(hi);
    l = *reinterpret_cast<const uint16_t*>(&a);
    h = *reinterpret_cast<const uint16_t*>(&b);
  }
  return uint32_t(l) | (uint32_t(h) << 16);
}

}  // namespace dk::cuda
