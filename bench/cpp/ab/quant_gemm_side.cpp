// One side of tools/ab_quant_gemm.sh: int4_gemm / int8_gemm (fp32 activations) from the headers this file
// is compiled against, in namespace DK_AB_NS (-Ddk=...: the two sides' inline templates must not merge at
// link time), exported as the C function DK_AB_FN.
#include "decodekit/gemm/int4.h"

extern "C" void DK_AB_FN(int int8, float* out,           // [M, N]
                         const float* a,                 // [M, K]
                         const uint8_t* q,               // INT4 [N, K / 2] or INT8 [N, K]
                         const void* scales,             // [N, K / 32] fp16
                         const void* mins,               // [N, K / 32] fp16 (INT4)
                         int64_t M, int64_t N, int64_t K) {
  const dk::cpu::Int4GemmParams P{M, N, K, 32, K};
  if (int8)
    dk::cpu::int8_gemm<float>(out, a, reinterpret_cast<const int8_t*>(q), static_cast<const dk::half_t*>(scales),
                              nullptr, P);
  else
    dk::cpu::int4_gemm<float>(out, a, q, static_cast<const dk::half_t*>(scales),
                              static_cast<const dk::half_t*>(mins), nullptr, P);
}
