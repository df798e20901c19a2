// Argument validation of the Marlin-layout INT4 ops (include/decodekit/gemm/int4_marlin_pack.h), shared by
// the CPU and CUDA launchers (the rest: op_args.h).
#pragma once
#include "op_args.h"

namespace dk {

// int4_marlin_pack: out [int4_marlin_packed_bytes(N, K, G) / 2] float16 / bfloat16 (the activations' type)
// from int4_gemm's qweight [N, K/2] / scales / mins (K = 2 qweight.size(1)).
inline GemmArgs int4_marlin_pack_args(const at::Tensor& out, const at::Tensor& qweight, const at::Tensor& scales,
                                      const at::Tensor& mins, int64_t group_size) {
  const char* op = "decodekit::int4_marlin_pack";
  Check(op, "qweight", qweight).dim(2);
  GemmArgs g = quant_weight_args(op, qweight, scales, &mins, group_size, 2 * qweight.size(1));
  TORCH_CHECK(g.N > 0 && g.K > 0, op, ": the weight must not be empty, got N = ", g.N, ", K = ", g.K);
  Check(op, "out", out).dim(1).size(0, int4_marlin_packed_bytes(g.N, g.K, int(group_size)) / 2,
                                     "int4_marlin_packed_bytes(N, K, group_size) / 2")
      .dtype({at::kHalf, at::kBFloat16}).device_as(qweight, "qweight").contiguous();
  return g;
}

// A weight in int4_marlin_pack's layout: G in {32, 64, 128}, 1 <= n, k < 2^31, k a multiple of G, `packed` 1-D
// contiguous of int4_marlin_packed_bytes(n, k, G) / 2 elements (the callers check its dtype and device).
inline void marlin_packed_check(const char* op, const at::Tensor& packed, int64_t n, int64_t k, int64_t group_size) {
  TORCH_CHECK(group_size == 32 || group_size == 64 || group_size == 128, op,
              ": 'group_size' must be 32, 64 or 128, got ", group_size);
  check_range<int64_t>(op, "n", n, 1, INT32_MAX);
  check_range<int64_t>(op, "k", k, 1, INT32_MAX);
  TORCH_CHECK(k % group_size == 0, op, ": k = ", k, " must be a multiple of group_size = ", group_size);
  Check(op, "packed", packed).dim(1).size(0, int4_marlin_packed_bytes(n, k, int(group_size)) / 2,
                                         "int4_marlin_packed_bytes(n, k, group_size) / 2").contiguous();
}

// int4_gemm_marlin: a [M, K] (row stride free, float16 / bfloat16), packed [int4_marlin_packed_bytes / 2] of
// a's dtype (int4_marlin_pack for that dtype), out [M, N], bias [N]; n = N >= 1, k = K >= 1.
inline GemmArgs int4_gemm_marlin_args(const at::Tensor& out, const at::Tensor& a, const at::Tensor& packed, int64_t n,
                                      int64_t k, int64_t group_size, const std::optional<at::Tensor>& bias) {
  const char* op = "decodekit::int4_gemm_marlin";
  marlin_packed_check(op, packed, n, k, group_size);
  Check(op, "a", a).dim(2).size(1, k, "k").dtype({at::kHalf, at::kBFloat16}).last_dim_contiguous();
  Check(op, "packed", packed).dtype_as(a, "a").device_as(a, "a");
  GemmArgs g{a.size(0), n, k, a.size(0) > 1 ? a.stride(0) : k};
  Check(op, "out", out).dim(2).size(0, g.M, "M").size(1, n, "n").dtype_as(a, "a").device_as(a, "a").contiguous();
  if (bias.has_value())
    Check(op, "bias", *bias).dim(1).size(0, n, "n").dtype_as(a, "a").device_as(a, "a").contiguous();
  return g;
}

// int4_marlin_dequantize: out [R, k] (packed's dtype, contiguous) = rows [row0, row0 + R) of the weight held in
// `packed` [int4_marlin_packed_bytes(n, k, G) / 2] float16 / bfloat16; 0 <= row0 <= n - R.
inline GemmArgs int4_marlin_dequantize_args(const at::Tensor& out, const at::Tensor& packed, int64_t n, int64_t k,
                                            int64_t group_size, int64_t row0) {
  const char* op = "decodekit::int4_marlin_dequantize";
  marlin_packed_check(op, packed, n, k, group_size);
  Check(op, "packed", packed).dtype({at::kHalf, at::kBFloat16});
  TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % 4 == 0, op,
              ": 'packed' must start 4-byte aligned (its codes are read as 32-bit words)");
  Check(op, "out", out).dim(2).size(1, k, "k").dtype_as(packed, "packed").device_as(packed, "packed").contiguous();
  check_range<int64_t>(op, "out.size(0) (rows)", out.size(0), 0, n);
  check_range<int64_t>(op, "row0", row0, 0, n - out.size(0));
  return GemmArgs{out.size(0), n, k, k};
}

}  // namespace dk
