// Argument validation shared by the CPU and CUDA launchers: one function per op checks
// every tensor (naming the argument in the error) and returns the sizes and strides the
// kernel needs. Device-specific launchers add only what is device-specific.
#pragma once
#include <cmath>
#include <cstdlib>
#include <limits>

#include <ATen/ops/linear.h>

#include "check.h"
#include "decodekit/attention/common.h"  // KVScales
#include "decodekit/gemm/dense_cpu.h"      // DenseDtype
#include "decodekit/gemm/amx_rows_layout.h"      // amx_rows_packed_bytes
#include "decodekit/gemm/int4_marlin_pack.h"  // int4_marlin_packed_bytes

namespace dk {

inline constexpr std::initializer_list<at::ScalarType> kFloatTypes = {at::kFloat, at::kHalf, at::kBFloat16};

// A tensor the op writes in place, viewed as `rows` rows of `cols` elements `row_stride` apart,
// must not have rows that overlap (an expanded x.expand(n, -1) has row stride 0): the kernels
// would write each element several times and read back their own results.
inline void check_rows_disjoint(const char* op, const char* name, int64_t rows, int64_t cols, int64_t row_stride) {
  TORCH_CHECK(rows <= 1 || cols == 0 || std::abs(row_stride) >= cols, op, ": '", name,
              "' is written in place but its rows overlap in memory (row stride ", row_stride, " < ", cols,
              " elements per row); pass a tensor that owns its elements (e.g. .contiguous())");
}

struct NormArgs {
  int64_t rows, hidden;
  int64_t x_stride;  // row stride of input
  int64_t r_stride;  // row stride of residual (fused_add_rms_norm only)
};

inline NormArgs rms_norm_args(const at::Tensor& out,     // [..., hidden]
                              const at::Tensor& input,   // [..., hidden]
                              const at::Tensor& weight,  // [hidden]
                              double epsilon) {
  const char* op = "decodekit::rms_norm";
  NormArgs a{};
  a.x_stride = Check(op, "input", input).min_dim(1).dtype(kFloatTypes).row_stride();
  a.hidden = input.size(-1);
  a.rows = rows_of(input);
  Check(op, "out", out).same_shape(input, "input").dtype_as(input, "input").device_as(input, "input").contiguous();
  Check(op, "weight", weight).dim(1).size(0, a.hidden, "hidden_size").dtype_as(input, "input")
      .device_as(input, "input").contiguous();
  check_range(op, "epsilon", epsilon, 0.0, 1.0);
  check_range<int64_t>(op, "hidden_size", a.hidden, 1, INT32_MAX);
  return a;
}

inline NormArgs fused_add_rms_norm_args(const at::Tensor& input,     // [..., hidden]
                                        const at::Tensor& residual,  // [..., hidden]
                                        const at::Tensor& weight,    // [hidden]
                                        double epsilon) {
  const char* op = "decodekit::fused_add_rms_norm";
  NormArgs a{};
  a.x_stride = Check(op, "input", input).min_dim(1).dtype(kFloatTypes).row_stride();
  a.hidden = input.size(-1);
  a.rows = rows_of(input);
  a.r_stride = Check(op, "residual", residual).same_shape(input, "input").dtype_as(input, "input")
                   .device_as(input, "input").row_stride();
  check_rows_disjoint(op, "input", a.rows, a.hidden, a.x_stride);
  check_rows_disjoint(op, "residual", a.rows, a.hidden, a.r_stride);
  TORCH_CHECK(a.rows == 0 || a.hidden == 0 || input.data_ptr() != residual.data_ptr(), op,
              ": 'input' and 'residual' are the same memory, but each receives a different result");
  Check(op, "weight", weight).dim(1).size(0, a.hidden, "hidden_size").dtype_as(input, "input")
      .device_as(input, "input").contiguous();
  check_range(op, "epsilon", epsilon, 0.0, 1.0);
  check_range<int64_t>(op, "hidden_size", a.hidden, 1, INT32_MAX);
  return a;
}

struct ActArgs {
  int64_t rows, d;
  int64_t in_stride;  // row stride of input
};

inline ActArgs silu_and_mul_args(const at::Tensor& out,     // [..., d]
                                 const at::Tensor& input) { // [..., 2 * d]
  const char* op = "decodekit::silu_and_mul";
  ActArgs a{};
  a.in_stride = Check(op, "input", input).min_dim(1).dtype(kFloatTypes).row_stride();
  TORCH_CHECK(input.size(-1) % 2 == 0, op, ": 'input' last dim must be even (gate | up), got ", input.size(-1));
  a.d = input.size(-1) / 2;
  a.rows = rows_of(input);
  Check(op, "out", out).dim(input.dim()).dtype_as(input, "input").device_as(input, "input").contiguous();
  for (int64_t i = 0; i + 1 < input.dim(); ++i) Check(op, "out", out).size(i, input.size(i), "as input");
  Check(op, "out", out).size(input.dim() - 1, a.d, "input.size(-1) / 2");
  return a;
}

struct RopeArgs {
  int64_t num_tokens;
  int head_size, rot_dim, num_q_heads, num_kv_heads;
  int64_t q_token_stride, q_head_stride, k_token_stride, k_head_stride;
  int64_t max_position;
};

// query/key: [T, H * D] or [T, H, D], any token stride, each head contiguous.
inline void rope_layout(const char* op, const char* name, const at::Tensor& t, int64_t num_tokens, int64_t head_size,
                        int& heads, int64_t& token_stride, int64_t& head_stride) {
  Check c(op, name, t);
  c.last_dim_contiguous();
  if (t.dim() == 2) {
    c.size(0, num_tokens, "num_tokens");
    TORCH_CHECK(t.size(1) % head_size == 0, op, ": '", name, "' last dim ", t.size(1),
                " is not a multiple of head_size ", head_size);
    heads = int(t.size(1) / head_size);
    token_stride = t.size(0) > 1 ? t.stride(0) : t.size(1);
    head_stride = head_size;
    check_rows_disjoint(op, name, t.size(0), t.size(1), token_stride);
  } else if (t.dim() == 3) {
    c.size(0, num_tokens, "num_tokens").size(2, head_size, "head_size");
    heads = int(t.size(1));
    token_stride = t.stride(0);
    head_stride = t.size(1) > 1 ? t.stride(1) : head_size;
    // Rotated in place: heads, and tokens, must not share elements (an expanded tensor would).
    TORCH_CHECK(heads <= 1 || std::abs(head_stride) >= head_size, op, ": '", name,
                "' is written in place but its heads overlap in memory (head stride ", head_stride, " < head_size ",
                head_size, ")");
    TORCH_CHECK(t.size(0) <= 1 || heads == 0 || token_stride != 0, op, ": '", name,
                "' is written in place but all its tokens share memory (token stride 0)");
  } else {
    c.fail("must be [num_tokens, num_heads * head_size] or [num_tokens, num_heads, head_size]");
  }
}

inline RopeArgs rotary_embedding_args(const at::Tensor& positions,              // [num_tokens]
                                      const at::Tensor& query,                  // [num_tokens, Hq(, D)]
                                      const std::optional<at::Tensor>& key,     // [num_tokens, Hk(, D)]
                                      const at::Tensor& cos_sin_cache,          // [max_position, rot_dim]
                                      int64_t head_size, bool /*is_neox*/) {
  const char* op = "decodekit::rotary_embedding";
  RopeArgs a{};
  Check(op, "positions", positions).dim(1).dtype({at::kLong}).device_as(query, "query").contiguous();
  a.num_tokens = positions.size(0);
  check_range<int64_t>(op, "head_size", head_size, 2, 1024);
  a.head_size = int(head_size);
  Check(op, "query", query).dtype(kFloatTypes);
  rope_layout(op, "query", query, a.num_tokens, head_size, a.num_q_heads, a.q_token_stride, a.q_head_stride);
  if (key.has_value()) {
    Check(op, "key", *key).dtype_as(query, "query").device_as(query, "query");
    rope_layout(op, "key", *key, a.num_tokens, head_size, a.num_kv_heads, a.k_token_stride, a.k_head_stride);
    TORCH_CHECK(query.numel() == 0 || key->numel() == 0 || query.data_ptr() != key->data_ptr(), op,
                ": 'query' and 'key' are the same memory (it would be rotated twice)");
  }
  Check(op, "cos_sin_cache", cos_sin_cache).dim(2).dtype({at::kFloat}).device_as(query, "query").contiguous();
  a.rot_dim = int(cos_sin_cache.size(1));
  a.max_position = cos_sin_cache.size(0);
  TORCH_CHECK(a.rot_dim >= 2 && a.rot_dim % 2 == 0 && a.rot_dim <= head_size, op,
              ": 'cos_sin_cache' dim 1 (rot_dim) must be even and in [2, head_size=", head_size, "], got ", a.rot_dim);
  return a;
}

struct GemmArgs {
  int64_t M, N, K, a_stride;
};

// out [M, N] contiguous = a [M, K] (row stride free) @ weight [N, K]^T (+ bias [N]), M <= max_m; `op` names
// the op in errors (dense_gemm, gemm_allreduce).
inline GemmArgs dense_gemm_args(const at::Tensor& out, const at::Tensor& a, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, int64_t max_m,
                                const char* op = "decodekit::dense_gemm") {
  GemmArgs g{};
  Check(op, "a", a).dim(2).dtype(kFloatTypes).last_dim_contiguous();
  g.M = a.size(0);
  g.K = a.size(1);
  g.a_stride = g.M > 1 ? a.stride(0) : g.K;
  check_range<int64_t>(op, "a.size(0) (M)", g.M, 0, max_m);
  Check(op, "weight", weight).dim(2).size(1, g.K, "K = a.size(1)").dtype_as(a, "a").device_as(a, "a").contiguous();
  g.N = weight.size(0);
  Check(op, "out", out).dim(2).size(0, g.M, "M").size(1, g.N, "N = weight.size(0)").dtype_as(a, "a")
      .device_as(a, "a").contiguous();
  if (bias.has_value())
    Check(op, "bias", *bias).dim(1).size(0, g.N, "N").dtype_as(a, "a").device_as(a, "a").contiguous();
  return g;
}

// Weight-only quantized GEMMs (include/decodekit/gemm/int4.h): scales (and INT4 mins) [N, K/G]
// float16, group_size G in {32, 64, 128}. `codes` is qweight's byte columns per K: 1/2 (INT4
// nibbles, uint8) or 1 (INT8, int8).
// copy_only: the weight is held only as its CPU AMX copy (passed as 'packed'): qweight [N, 0], scales / mins [N, 0].
inline GemmArgs quant_weight_args(const char* op, const at::Tensor& qweight, const at::Tensor& scales,
                                  const at::Tensor* mins, int64_t group_size, int64_t K, bool copy_only = false) {
  TORCH_CHECK(group_size == 32 || group_size == 64 || group_size == 128, op,
              ": 'group_size' must be 32, 64 or 128, got ", group_size);
  TORCH_CHECK(K % group_size == 0, op, ": K = ", K, " must be a multiple of group_size = ", group_size);
  GemmArgs g{};
  g.K = K;
  const int64_t qk = copy_only ? 0 : mins ? K / 2 : K, sk = copy_only ? 0 : K / group_size;
  const char* qk_what = copy_only ? "0 (the weight held in 'packed' alone)" : mins ? "K / 2" : "K";
  Check(op, "qweight", qweight).dim(2).size(1, qk, qk_what).dtype({mins ? at::kByte : at::kChar}).contiguous();
  g.N = qweight.size(0);
  for (auto [t, name] : {std::pair{&scales, "scales"}, std::pair{mins, "mins"}})
    if (t)
      Check(op, name, *t).dim(2).size(0, g.N, "N = qweight.size(0)").size(1, sk, copy_only ? "0" : "K / group_size")
          .dtype({at::kHalf}).device_as(qweight, "qweight").contiguous();
  return g;
}

// Whether int4_gemm / int8_gemm's / int8_dequantize_rows's weight is held only as its CPU AMX copy: qweight
// [N, 0] for K > 0 with a uint8 'packed' on the CPU (decodekit.ops.prepare_amx_rows(..., drop_stored=True)).
inline bool quant_copy_only(const char* op, const at::Tensor& qweight, int64_t K,
                            const std::optional<at::Tensor>& packed) {
  if (qweight.dim() != 2 || qweight.size(1) != 0 || K == 0) return false;
  TORCH_CHECK(packed.has_value() && packed->scalar_type() == at::kByte && packed->is_cpu(), op,
              ": 'qweight' is [N, 0] (a weight held only as its AMX copy): 'packed' must be that copy, uint8 on the "
              "CPU (decodekit.ops.prepare_amx_rows)");
  return true;
}

// int4_gemm (mins given) / int8_gemm (mins null): a [M, K] (row stride free), out [M, N], bias [N].
inline GemmArgs quant_gemm_args(const char* op, const at::Tensor& out, const at::Tensor& a, const at::Tensor& qweight,
                                const at::Tensor& scales, const at::Tensor* mins, int64_t group_size,
                                const std::optional<at::Tensor>& bias, bool copy_only = false) {
  Check(op, "a", a).dim(2).dtype(kFloatTypes).last_dim_contiguous();
  GemmArgs g = quant_weight_args(op, qweight, scales, mins, group_size, a.size(1), copy_only);
  Check(op, "qweight", qweight).device_as(a, "a");
  g.M = a.size(0);
  g.a_stride = g.M > 1 ? a.stride(0) : g.K;
  Check(op, "out", out).dim(2).size(0, g.M, "M").size(1, g.N, "N = qweight.size(0)").dtype_as(a, "a")
      .device_as(a, "a").contiguous();
  if (bias.has_value())
    Check(op, "bias", *bias).dim(1).size(0, g.N, "N").dtype_as(a, "a").device_as(a, "a").contiguous();
  return g;
}

// A CPU AMX copy passed as `packed` (int4_amx_rows_pack's / int8_amx_rows_pack's): `bytes` uint8 on a's device,
// contiguous and 64-byte aligned (the kernels' aligned loads; a fresh tensor, not a view).
inline void amx_rows_packed_check(const char* op, const at::Tensor& packed, const at::Tensor& a, int64_t bytes,
                                  const char* what) {
  Check(op, "packed", packed).dim(1).size(0, bytes, what).dtype({at::kByte}).device_as(a, "a").contiguous();
  TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % 64 == 0, op,
              ": 'packed' (an AMX rows copy) must start 64-byte aligned (a fresh tensor, not a view)");
}

// int4_gemm's optional packed copy: either int4_marlin_packed_bytes(N, K, G) / 2 elements of a's dtype on a's
// device (the CUDA Marlin-style kernel's), or, on the CPU, amx_rows_packed_bytes(N, K, G) uint8
// (int4_amx_rows_pack's). Returns whether it is the latter.
inline bool int4_gemm_packed_check(const char* op, const at::Tensor& packed, const at::Tensor& a, const GemmArgs& g,
                                   int64_t group_size) {
  if (packed.scalar_type() == at::kByte && a.is_cpu()) {
    amx_rows_packed_check(op, packed, a, dk::cpu::amx_rows_packed_bytes(g.N, g.K, int(group_size)),
                          "amx_rows_packed_bytes(N, K, group_size) (int4_amx_rows_pack)");
    return true;
  }
  Check(op, "packed", packed).dim(1).size(0, int4_marlin_packed_bytes(g.N, g.K, int(group_size)) / 2,
                                         "int4_marlin_packed_bytes(N, K, group_size) / 2")
      .dtype_as(a, "a").device_as(a, "a").contiguous();
  return false;
}

// int8_gemm's optional packed copy: amx_rows_int8_packed_bytes(N, K, G) uint8 on the CPU (int8_amx_rows_pack's),
// 64-byte aligned; ignored on CUDA (checked the same way).
inline void int8_gemm_packed_check(const char* op, const at::Tensor& packed, const at::Tensor& a, const GemmArgs& g,
                                   int64_t group_size) {
  amx_rows_packed_check(op, packed, a, dk::cpu::amx_rows_int8_packed_bytes(g.N, g.K, int(group_size)),
                        "amx_rows_int8_packed_bytes(N, K, group_size) (int8_amx_rows_pack)");
}

// int8_amx_rows_pack: out [amx_rows_int8_packed_bytes(N, K, G)] uint8 on the CPU from int8_gemm's qweight / scales.
inline GemmArgs int8_amx_rows_pack_args(const at::Tensor& out, const at::Tensor& qweight, const at::Tensor& scales,
                                        int64_t group_size) {
  const char* op = "decodekit::int8_amx_rows_pack";
  Check(op, "qweight", qweight).dim(2);
  GemmArgs g = quant_weight_args(op, qweight, scales, nullptr, group_size, qweight.size(1));
  Check(op, "out", out).dim(1).size(0, dk::cpu::amx_rows_int8_packed_bytes(g.N, g.K, int(group_size)),
                                     "amx_rows_int8_packed_bytes(N, K, group_size)")
      .dtype({at::kByte}).device_as(qweight, "qweight").contiguous();
  return g;
}

// int4_amx_rows_pack: out [amx_rows_packed_bytes(N, K, G)] uint8 on the CPU from int4_gemm's qweight / scales / mins.
inline GemmArgs int4_amx_rows_pack_args(const at::Tensor& out, const at::Tensor& qweight, const at::Tensor& scales,
                                        const at::Tensor& mins, int64_t group_size) {
  const char* op = "decodekit::int4_amx_rows_pack";
  Check(op, "qweight", qweight).dim(2);
  GemmArgs g = quant_weight_args(op, qweight, scales, &mins, group_size, 2 * qweight.size(1));
  Check(op, "out", out).dim(1).size(0, dk::cpu::amx_rows_packed_bytes(g.N, g.K, int(group_size)),
                                     "amx_rows_packed_bytes(N, K, group_size)")
      .dtype({at::kByte}).device_as(qweight, "qweight").contiguous();
  return g;
}

// fp8 W8A8 (include/decodekit/gemm/fp8_gemm.h): quantize_fp8 writes out [M, K] Float8_e4m3fn and
// scale [M] float32 from input [M, K] (row stride free); fp8_gemm reads a [M, K] / weight [N, K]
// Float8_e4m3fn (contiguous, K a multiple of 32) with a_scale [M] / w_scale [N] float32 and writes
// out [M, N] (float type; bias [N] of the same type).
struct Fp8Args {
  int64_t M, N, K, x_stride;
};

inline Fp8Args quantize_fp8_args(const at::Tensor& out, const at::Tensor& scale, const at::Tensor& input) {
  const char* op = "decodekit::quantize_fp8";
  Fp8Args f{};
  Check(op, "input", input).dim(2).dtype(kFloatTypes).last_dim_contiguous();
  f.M = input.size(0);
  f.K = input.size(1);
  f.x_stride = f.M > 1 ? input.stride(0) : f.K;
  Check(op, "out", out).dim(2).size(0, f.M, "M").size(1, f.K, "K").dtype({at::kFloat8_e4m3fn})
      .device_as(input, "input").contiguous();
  Check(op, "scale", scale).dim(1).size(0, f.M, "M").dtype({at::kFloat}).device_as(input, "input").contiguous();
  check_range<int64_t>(op, "K", f.K, 0, INT32_MAX);
  return f;
}

inline Fp8Args fp8_gemm_args(const at::Tensor& out, const at::Tensor& a, const at::Tensor& a_scale,
                             const at::Tensor& weight, const at::Tensor& w_scale,
                             const std::optional<at::Tensor>& bias, const char* op = "decodekit::fp8_gemm") {
  Fp8Args f{};
  Check(op, "a", a).dim(2).dtype({at::kFloat8_e4m3fn}).contiguous();
  f.M = a.size(0);
  f.K = a.size(1);
  TORCH_CHECK(f.K % 32 == 0, op, ": K = ", f.K, " must be a multiple of 32");
  Check(op, "weight", weight).dim(2).size(1, f.K, "K = a.size(1)").dtype({at::kFloat8_e4m3fn}).device_as(a, "a")
      .contiguous();
  f.N = weight.size(0);
  Check(op, "a_scale", a_scale).dim(1).size(0, f.M, "M").dtype({at::kFloat}).device_as(a, "a").contiguous();
  Check(op, "w_scale", w_scale).dim(1).size(0, f.N, "N").dtype({at::kFloat}).device_as(a, "a").contiguous();
  Check(op, "out", out).dim(2).size(0, f.M, "M").size(1, f.N, "N = weight.size(0)").dtype(kFloatTypes)
      .device_as(a, "a").contiguous();
  if (bias.has_value())
    Check(op, "bias", *bias).dim(1).size(0, f.N, "N").dtype_as(out, "out").device_as(a, "a").contiguous();
  return f;
}

// rejection_sample (include/decodekit/sampling/rejection.h): out [B, k+1] int64, num_emitted [B]
// int32, draft_tokens [B, k] int64, num_draft [B] int32, draft_probs [B, k, V] float32 (optional),
// target_probs [B, k+1, V] float32, seeds / positions [B] int64; all contiguous, one device.
struct SpecArgs {
  int64_t B, k, V;
};

inline SpecArgs rejection_sample_args(const at::Tensor& out, const at::Tensor& num_emitted,
                                      const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                                      const std::optional<at::Tensor>& draft_probs, const at::Tensor& target_probs,
                                      const at::Tensor& seeds, const at::Tensor& positions) {
  const char* op = "decodekit::rejection_sample";
  SpecArgs a{};
  Check(op, "draft_tokens", draft_tokens).dim(2).dtype({at::kLong}).contiguous();
  a.B = draft_tokens.size(0);
  a.k = draft_tokens.size(1);
  Check(op, "target_probs", target_probs).dim(3).size(0, a.B, "B").size(1, a.k + 1, "k + 1").dtype({at::kFloat})
      .device_as(draft_tokens, "draft_tokens").contiguous();
  a.V = target_probs.size(2);
  check_range<int64_t>(op, "vocab size (target_probs.size(2))", a.V, 1, INT32_MAX);
  if (draft_probs.has_value())
    Check(op, "draft_probs", *draft_probs).dim(3).size(0, a.B, "B").size(1, a.k, "k").size(2, a.V, "V")
        .dtype({at::kFloat}).device_as(draft_tokens, "draft_tokens").contiguous();
  Check(op, "num_draft", num_draft).dim(1).size(0, a.B, "B").dtype({at::kInt}).device_as(draft_tokens, "draft_tokens")
      .contiguous();
  for (auto [t, name] : {std::pair{&seeds, "seeds"}, std::pair{&positions, "positions"}})
    Check(op, name, *t).dim(1).size(0, a.B, "B").dtype({at::kLong}).device_as(draft_tokens, "draft_tokens").contiguous();
  Check(op, "out", out).dim(2).size(0, a.B, "B").size(1, a.k + 1, "k + 1").dtype({at::kLong})
      .device_as(draft_tokens, "draft_tokens").contiguous();
  Check(op, "num_emitted", num_emitted).dim(1).size(0, a.B, "B").dtype({at::kInt})
      .device_as(draft_tokens, "draft_tokens").contiguous();
  return a;
}

struct ArgmaxArgs {
  int64_t B, V, row_stride;
};

// scores [B, V] float32 (row stride free, 1 <= V < 2^31, B < 2^31) and out [B] int64 contiguous on
// scores' device: the checks argmax_rows and gumbel_argmax share.
inline ArgmaxArgs score_rows_args(const char* op, const at::Tensor& out, const at::Tensor& scores) {
  ArgmaxArgs a{};
  a.row_stride = Check(op, "scores", scores).dim(2).dtype({at::kFloat}).row_stride();
  a.B = scores.size(0);
  a.V = scores.size(1);
  check_range<int64_t>(op, "batch size (scores.size(0))", a.B, 0, INT32_MAX);
  check_range<int64_t>(op, "vocab size (scores.size(1))", a.V, 1, INT32_MAX);
  Check(op, "out", out).dim(1).size(0, a.B, "B").dtype({at::kLong}).device_as(scores, "scores").contiguous();
  return a;
}

inline ArgmaxArgs argmax_rows_args(const at::Tensor& out, const at::Tensor& scores) {
  return score_rows_args("decodekit::argmax_rows", out, scores);
}

struct GumbelArgs {
  int64_t B, V, row_stride;
  uint32_t stream;
};

inline GumbelArgs gumbel_argmax_args(const at::Tensor& out, const at::Tensor& scores, const at::Tensor& seeds,
                                     const at::Tensor& positions, int64_t stream) {
  const char* op = "decodekit::gumbel_argmax";
  const ArgmaxArgs r = score_rows_args(op, out, scores);
  GumbelArgs a{r.B, r.V, r.row_stride, 0};
  check_range<int64_t>(op, "stream", stream, 0, UINT32_MAX);
  a.stream = uint32_t(stream);
  for (auto [t, name] : {std::pair{&seeds, "seeds"}, std::pair{&positions, "positions"}})
    Check(op, name, *t).dim(1).size(0, a.B, "B").dtype({at::kLong}).device_as(scores, "scores").contiguous();
  return a;
}

struct SortArgs {
  int64_t B, V, row_stride;
};

// sort_desc_stable: x [B, V] float32 (row stride free), values [B, V] float32 and indices [B, V] int64
// contiguous on x's device; B * V < 2^31 (the CUDA kernel's item count).
inline SortArgs sort_desc_stable_args(const at::Tensor& values, const at::Tensor& indices, const at::Tensor& x) {
  const char* op = "decodekit::sort_desc_stable";
  SortArgs a{};
  a.row_stride = Check(op, "x", x).dim(2).dtype({at::kFloat}).row_stride();
  a.B = x.size(0);
  a.V = x.size(1);
  check_range<int64_t>(op, "number of values (x.numel())", a.B * a.V, 0, INT32_MAX);
  Check(op, "values", values).dim(2).size(0, a.B, "B").size(1, a.V, "V").dtype({at::kFloat}).device_as(x, "x")
      .contiguous();
  Check(op, "indices", indices).dim(2).size(0, a.B, "B").size(1, a.V, "V").dtype({at::kLong}).device_as(x, "x")
      .contiguous();
  return a;
}

// int4_dequantize (mins given, out [N, K]) / int8_dequantize_rows (mins null, out [R, K] for
// ids [R] int64; the ids' range is the device launcher's business).
inline GemmArgs quant_dequantize_args(const char* op, const at::Tensor& out, const at::Tensor& qweight,
                                      const at::Tensor& scales, const at::Tensor* mins, int64_t group_size,
                                      const at::Tensor* ids, bool copy_only = false) {
  Check(op, "out", out).dim(2).dtype(kFloatTypes).device_as(qweight, "qweight").contiguous();
  GemmArgs g = quant_weight_args(op, qweight, scales, mins, group_size, out.size(1), copy_only);
  if (ids)
    Check(op, "ids", *ids).dim(1).size(0, out.size(0), "out.size(0)").dtype({at::kLong}).device_as(qweight, "qweight")
        .contiguous();
  else
    Check(op, "out", out).size(0, g.N, "N = qweight.size(0)");
  return g;
}

// The paged K and V caches: [num_blocks, num_kv_heads, block_size, head_dim] each, alike.
inline void kv_cache_shape(const char* op, const at::Tensor& key_cache, const at::Tensor& value_cache,
                           int64_t& num_blocks, int& num_kv_heads, int& block_size, int& head_dim) {
  Check(op, "key_cache", key_cache).dim(4).dtype({at::kFloat, at::kHalf, at::kBFloat16, at::kFloat8_e4m3fn})
      .contiguous();
  num_blocks = key_cache.size(0);
  num_kv_heads = int(key_cache.size(1));
  block_size = int(key_cache.size(2));
  head_dim = int(key_cache.size(3));
  // Zero KV heads / block size would divide by zero in the kernels (GQA group, block of a slot);
  // int fields: the sizes must fit.
  check_range<int64_t>(op, "key_cache.size(1) (num_kv_heads)", key_cache.size(1), 1, INT32_MAX);
  check_range<int64_t>(op, "key_cache.size(2) (block_size)", key_cache.size(2), 1, INT32_MAX);
  check_range<int64_t>(op, "key_cache.size(3) (head_dim)", key_cache.size(3), 1, INT32_MAX);
  Check(op, "value_cache", value_cache).same_shape(key_cache, "key_cache").dtype_as(key_cache, "key_cache")
      .device_as(key_cache, "key_cache").contiguous();
}

// Whether a CPU kernel takes a 16-bit (Half / BFloat16) cache under Float32 activations (a float32 model
// with a bfloat16 / float16 KV cache: half the cache's bytes; the rows are rounded to nearest even on write).
inline bool kv_cache_mixed(const at::Tensor& key_cache, at::ScalarType act) {
  const auto c = key_cache.scalar_type();
  return key_cache.device().is_cpu() && act == at::kFloat && (c == at::kHalf || c == at::kBFloat16);
}

// The KV cache's element type against the activations' (key/value or query, dtype `act`):
// the same dtype, or fp8 e4m3 (then k_scale / v_scale: float32 [1] (per tensor) or
// [num_kv_heads] (per KV head), each independently, on the cache's device; absent = 1.0), or on
// the CPU a Half / BFloat16 cache under Float32 activations (kv_cache_mixed).
// Returns whether the cache is fp8 (no scales allowed otherwise).
inline bool kv_cache_scales(const char* op, const at::Tensor& key_cache, at::ScalarType act, const char* act_name,
                            const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                            int num_kv_heads) {
  const bool fp8 = key_cache.scalar_type() == at::kFloat8_e4m3fn;
  if (!fp8) {
    TORCH_CHECK(key_cache.scalar_type() == act || kv_cache_mixed(key_cache, act), op, ": 'key_cache' is ",
                key_cache.scalar_type(), " but '", act_name, "' is ", act,
                " (the cache holds the activations' dtype or Float8_e4m3fn; on the CPU a Float32 '", act_name,
                "' may also use a BFloat16 or Half cache)");
    TORCH_CHECK(!k_scale.has_value() && !v_scale.has_value(), op,
                ": 'k_scale'/'v_scale' are only for an fp8 (Float8_e4m3fn) KV cache, got a ", key_cache.scalar_type(),
                " cache");
    return false;
  }
  for (auto [t, name] : {std::pair{&k_scale, "k_scale"}, std::pair{&v_scale, "v_scale"}}) {
    if (!t->has_value()) continue;
    const at::Tensor& sc = **t;
    Check(op, name, sc).dim(1).dtype({at::kFloat}).device_as(key_cache, "key_cache").contiguous();
    TORCH_CHECK(sc.size(0) == 1 || sc.size(0) == num_kv_heads, op, ": '", name, "' must have 1 or num_kv_heads = ",
                num_kv_heads, " elements (per tensor or per KV head), got ", sc.size(0));
    if (sc.device().is_cpu()) {  // (a CUDA check would synchronise the stream: the values stay the caller's)
      const float* v = sc.data_ptr<float>();
      for (int64_t i = 0; i < sc.size(0); ++i)
        TORCH_CHECK(std::isfinite(v[i]) && v[i] > 0.f, op, ": '", name, "'[", i,
                    "] must be a finite scale > 0 (x is stored as x / scale), got ", v[i]);
    }
  }
  return true;
}

// The fp8 scales' pointers for the kernels (null: 1), each with its own stride over KV heads
// (0: one scale for the tensor, 1: one per KV head).
inline KVScales kv_scales_of(const std::optional<at::Tensor>& k, const std::optional<at::Tensor>& v, bool fp8) {
  if (!fp8) return {};
  auto stride_of = [](const std::optional<at::Tensor>& t) { return t && t->size(0) > 1 ? 1 : 0; };
  return {k ? k->data_ptr<float>() : nullptr, v ? v->data_ptr<float>() : nullptr, stride_of(k), stride_of(v)};
}

struct CacheArgs {
  int64_t num_tokens, k_stride, v_stride, num_blocks;
  int num_kv_heads, block_size, head_dim;
  bool fp8;          // an fp8 KV cache (its scales in kv)
  KVScales kv;       // the fp8 scales' pointers (null: 1) for the kernels
};

// key/value: [T, Hk, D] with a free token stride; caches [num_blocks, Hk, block_size, D].
inline CacheArgs reshape_and_cache_args(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                                        const at::Tensor& value_cache, const at::Tensor& slot_mapping,
                                        const std::optional<at::Tensor>& k_scale,
                                        const std::optional<at::Tensor>& v_scale) {
  const char* op = "decodekit::reshape_and_cache";
  CacheArgs a{};
  kv_cache_shape(op, key_cache, value_cache, a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
  Check(op, "slot_mapping", slot_mapping).dim(1).dtype({at::kLong}).device_as(key_cache, "key_cache").contiguous();
  a.num_tokens = slot_mapping.size(0);
  for (auto [t, name] : {std::pair{&key, "key"}, std::pair{&value, "value"}}) {
    Check(op, name, *t).dim(3).size(0, a.num_tokens, "num_tokens").size(1, a.num_kv_heads, "num_kv_heads")
        .size(2, a.head_dim, "head_dim").dtype(kFloatTypes).dtype_as(key, "key").device_as(key_cache, "key_cache");
    TORCH_CHECK(t->stride(2) == 1 && (t->size(1) == 1 || t->stride(1) == a.head_dim), op, ": '", name,
                "' must have contiguous heads (strides [*, head_dim, 1]), got ", t->strides());
  }
  a.k_stride = key.stride(0);
  a.v_stride = value.stride(0);
  a.fp8 = kv_cache_scales(op, key_cache, key.scalar_type(), "key", k_scale, v_scale, a.num_kv_heads);
  a.kv = kv_scales_of(k_scale, v_scale, a.fp8);
  return a;
}

struct BlockCopyArgs {
  int64_t num_pairs, num_blocks, block_bytes;
};

// copy_blocks: every cache of both lists with key_caches[0]'s shape, dtype and device,
// contiguous; block_mapping [N, 2] int64 on that device.
inline BlockCopyArgs copy_blocks_args(const at::TensorList& key_caches, const at::TensorList& value_caches,
                                      const at::Tensor& mapping) {
  const char* op = "decodekit::copy_blocks";
  TORCH_CHECK(!key_caches.empty() && key_caches.size() == value_caches.size(), op,
              ": 'key_caches' and 'value_caches' must be non-empty lists of the same length, got ", key_caches.size(),
              " and ", value_caches.size());
  const at::Tensor& first = key_caches[0];
  Check(op, "key_caches[0]", first).min_dim(1).contiguous();
  for (size_t i = 0; i < key_caches.size(); ++i)
    for (auto [t, name] : {std::pair{&key_caches[i], "key_caches"}, std::pair{&value_caches[i], "value_caches"}}) {
      const std::string n = std::string(name) + "[" + std::to_string(i) + "]";
      Check(op, n.c_str(), *t).same_shape(first, "key_caches[0]").dtype_as(first, "key_caches[0]")
          .device_as(first, "key_caches[0]").contiguous();
    }
  Check(op, "block_mapping", mapping).dim(2).size(1, 2, "2").dtype({at::kLong}).device_as(first, "key_caches[0]")
      .contiguous();
  return {mapping.size(0), first.size(0), first.numel() / std::max<int64_t>(first.size(0), 1) * first.element_size()};
}

// swap_blocks: src and dst with the same block shape and dtype (any devices), contiguous;
// block_mapping [N, 2] int64 on the CPU with ids inside each side's blocks.
inline BlockCopyArgs swap_blocks_args(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& mapping) {
  const char* op = "decodekit::swap_blocks";
  Check(op, "src", src).min_dim(1).contiguous();
  Check(op, "dst", dst).dim(src.dim()).dtype_as(src, "src").contiguous();
  for (int64_t d = 1; d < src.dim(); ++d)
    TORCH_CHECK(src.size(d) == dst.size(d), op, ": 'dst' must have the block shape of 'src' (", src.sizes().slice(1),
                "), got ", dst.sizes().slice(1));
  TORCH_CHECK(mapping.device().is_cpu(), op, ": 'block_mapping' must be a CPU tensor, got one on ", mapping.device());
  Check(op, "block_mapping", mapping).dim(2).size(1, 2, "2").dtype({at::kLong}).contiguous();
  const int64_t* m = mapping.data_ptr<int64_t>();
  for (int64_t i = 0; i < mapping.size(0); ++i) {
    TORCH_CHECK(m[2 * i] >= 0 && m[2 * i] < src.size(0), op, ": 'block_mapping'[", i, ", 0] = ", m[2 * i],
                " is outside src's [0, ", src.size(0), ")");
    TORCH_CHECK(m[2 * i + 1] >= 0 && m[2 * i + 1] < dst.size(0), op, ": 'block_mapping'[", i, ", 1] = ",
                m[2 * i + 1], " is outside dst's [0, ", dst.size(0), ")");
  }
  return {mapping.size(0), src.size(0), src.numel() / std::max<int64_t>(src.size(0), 1) * src.element_size()};
}

struct AttnArgs {
  int64_t num_tokens, q_stride, num_blocks;
  int num_seqs, num_q_heads, num_kv_heads, block_size, head_dim, max_blocks;
  bool fp8;          // an fp8 KV cache (its scales in kv)
  KVScales kv;       // the fp8 scales' pointers (null: 1) for the kernels
  int64_t window;    // sliding window (0: none)
};

inline AttnArgs paged_attention_args(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                                     const at::Tensor& value_cache, const at::Tensor& block_tables,
                                     const at::Tensor& seq_lens, const at::Tensor& query_start_loc, double scale,
                                     const std::optional<at::Tensor>& lse, const std::optional<at::Tensor>& k_scale,
                                     const std::optional<at::Tensor>& v_scale, int64_t sliding_window) {
  const char* op = "decodekit::paged_attention";
  AttnArgs a{};
  check_range<int64_t>(op, "sliding_window", sliding_window, 0, INT32_MAX);
  a.window = sliding_window;
  kv_cache_shape(op, key_cache, value_cache, a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
  Check(op, "query", query).dim(3).size(2, a.head_dim, "head_dim").dtype(kFloatTypes)
      .device_as(key_cache, "key_cache");
  a.num_tokens = query.size(0);
  a.num_q_heads = int(query.size(1));
  TORCH_CHECK(a.num_q_heads % a.num_kv_heads == 0, op, ": 'query' has ", a.num_q_heads,
              " heads, not a multiple of the cache's num_kv_heads ", a.num_kv_heads);
  TORCH_CHECK(query.stride(2) == 1 && (a.num_q_heads == 1 || query.stride(1) == a.head_dim), op,
              ": 'query' must have contiguous heads (strides [*, head_dim, 1]), got ", query.strides());
  a.q_stride = query.stride(0);
  Check(op, "out", out).same_shape(query, "query").dtype_as(query, "query").device_as(query, "query").contiguous();
  Check(op, "block_tables", block_tables).dim(2).dtype({at::kInt}).device_as(query, "query").contiguous();
  a.num_seqs = int(block_tables.size(0));
  a.max_blocks = int(block_tables.size(1));
  Check(op, "seq_lens", seq_lens).dim(1).size(0, a.num_seqs, "num_seqs").dtype({at::kInt}).device_as(query, "query")
      .contiguous();
  Check(op, "query_start_loc", query_start_loc).dim(1).size(0, a.num_seqs + 1, "num_seqs + 1").dtype({at::kInt})
      .device_as(query, "query").contiguous();
  if (lse.has_value())
    Check(op, "lse", *lse).dim(2).size(0, a.num_tokens, "num_tokens").size(1, a.num_q_heads, "num_q_heads")
        .dtype({at::kFloat}).device_as(query, "query").contiguous();
  TORCH_CHECK(std::isfinite(scale) && scale > 0, op, ": 'scale' must be a positive finite number, got ", scale);
  a.fp8 = kv_cache_scales(op, key_cache, query.scalar_type(), "query", k_scale, v_scale, a.num_kv_heads);
  a.kv = kv_scales_of(k_scale, v_scale, a.fp8);
  return a;
}

}  // namespace dk

// ---- custom all-reduce and gemm_allreduce (include/decodekit/comm/allreduce.h) ----------------
#include "decodekit/comm/allreduce.h"

namespace dk {

// buffer_ptrs / signal_ptrs: [world_size] addresses in this process (not checkable beyond
// count, null and alignment: they come from CustomAllReduce).
inline comm::Peers comm_peers_args(const char* op, at::IntArrayRef buffer_ptrs, at::IntArrayRef signal_ptrs,
                                   int64_t rank, int64_t buffer_bytes) {
  const int64_t ws = int64_t(buffer_ptrs.size());
  TORCH_CHECK(ws >= 1 && ws <= comm::kMaxRanks, op, ": 'buffer_ptrs' must hold one address per rank (1 to ",
              comm::kMaxRanks, "), got ", ws);
  TORCH_CHECK(int64_t(signal_ptrs.size()) == ws, op, ": 'signal_ptrs' must hold ", ws,
              " addresses (as many as 'buffer_ptrs'), got ", signal_ptrs.size());
  check_range<int64_t>(op, "rank", rank, 0, ws - 1);
  TORCH_CHECK(buffer_bytes >= 4 * comm::kAlign && buffer_bytes % comm::kAlign == 0, op,
              ": 'buffer_bytes' must be a positive multiple of ", comm::kAlign, " (>= ", 4 * comm::kAlign, "), got ",
              buffer_bytes);
  comm::Peers P;
  P.rank = int(rank);
  P.world_size = int(ws);
  P.buffer_bytes = buffer_bytes;
  for (int64_t q = 0; q < ws; ++q) {
    TORCH_CHECK(buffer_ptrs[q] != 0 && buffer_ptrs[q] % 16 == 0, op, ": 'buffer_ptrs'[", q,
                "] must be a non-null 16-byte aligned address, got ", buffer_ptrs[q]);
    TORCH_CHECK(signal_ptrs[q] != 0 && signal_ptrs[q] % 128 == 0, op, ": 'signal_ptrs'[", q,
                "] must be a non-null 128-byte aligned address, got ", signal_ptrs[q]);
    P.buf[q] = reinterpret_cast<void*>(buffer_ptrs[q]);
    P.sig[q] = reinterpret_cast<comm::Signal*>(signal_ptrs[q]);
  }
  return P;
}

inline void check_message_fits(const char* op, const char* name, int64_t nbytes, int64_t buffer_bytes) {
  const int64_t cap = comm::max_message_bytes(buffer_bytes);
  TORCH_CHECK(nbytes <= cap, op, ": '", name, "' has ", nbytes, " bytes, more than the buffers hold (", cap,
              " = buffer_bytes / 4); reduce it with torch.distributed instead");
}

// out, inp: [...] same shape, contiguous (out may be inp). Returns the element count.
inline int64_t custom_all_reduce_args(const at::Tensor& out, const at::Tensor& inp, const comm::Peers& P) {
  const char* op = "decodekit::custom_all_reduce";
  Check(op, "inp", inp).dtype(kFloatTypes).contiguous();
  Check(op, "out", out).same_shape(inp, "inp").dtype_as(inp, "inp").device_as(inp, "inp").contiguous();
  check_message_fits(op, "inp", inp.numel() * int64_t(inp.element_size()), P.buffer_bytes);
  return inp.numel();
}

// signal: [>= sizeof(Signal)] uint8, 128-byte aligned. Returns the timeout in ns.
inline uint64_t allreduce_init_signal_args(const at::Tensor& signal, int64_t world_size, double timeout_s) {
  const char* op = "decodekit::allreduce_init_signal";
  Check(op, "signal", signal).dim(1).dtype({at::kByte}).contiguous().aligned(128);
  TORCH_CHECK(signal.numel() >= int64_t(sizeof(comm::Signal)), op, ": 'signal' must have at least ",
              sizeof(comm::Signal), " bytes (allreduce_signal_bytes()), got ", signal.numel());
  check_range<int64_t>(op, "world_size", world_size, 1, comm::kMaxRanks);
  check_range(op, "timeout_s", timeout_s, 1e-6, 1e6);
  return uint64_t(timeout_s * 1e9);
}

struct GemmAllReduceArgs {
  GemmArgs g;
  bool norm;         // residual + norm_weight given
  int64_t r_stride;  // row stride of residual
};

// The epilogue of the gemm_allreduce family: residual [M, N] (row stride free) and norm_weight [N]
// together or not at all, both of out's dtype; the reduced message (out) fits the buffer.
inline GemmAllReduceArgs allreduce_epilogue_args(const char* op, const GemmArgs& g, const at::Tensor& out,
                                                 const std::optional<at::Tensor>& residual,
                                                 const std::optional<at::Tensor>& norm_weight, double eps,
                                                 const comm::Peers& P) {
  GemmAllReduceArgs r{};
  r.g = g;
  TORCH_CHECK(residual.has_value() == norm_weight.has_value(), op,
              ": 'residual' and 'norm_weight' go together (the residual + RMSNorm epilogue), got only ",
              residual.has_value() ? "'residual'" : "'norm_weight'");
  r.norm = residual.has_value();
  if (r.norm) {
    r.r_stride = Check(op, "residual", *residual).same_shape(out, "out").dtype_as(out, "out").device_as(out, "out")
                     .row_stride();
    check_rows_disjoint(op, "residual", g.M, g.N, r.r_stride);
    Check(op, "norm_weight", *norm_weight).dim(1).size(0, g.N, "N").dtype_as(out, "out").device_as(out, "out")
        .contiguous();
    check_range(op, "eps", eps, 0.0, 1.0);
    check_range<int64_t>(op, "N (hidden size of the norm)", g.N, 1, INT32_MAX);
  }
  check_message_fits(op, "out", g.M * g.N * int64_t(out.element_size()), P.buffer_bytes);
  return r;
}

// gemm_allreduce: out [M, N] contiguous; a [M, K] (row stride free); weight [N, K]; bias [N].
inline GemmAllReduceArgs gemm_allreduce_args(const at::Tensor& out, const at::Tensor& a, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias,
                                             const std::optional<at::Tensor>& residual,
                                             const std::optional<at::Tensor>& norm_weight, double eps,
                                             const comm::Peers& P) {
  const char* op = "decodekit::gemm_allreduce";
  const GemmArgs g = dense_gemm_args(out, a, weight, bias, std::numeric_limits<int64_t>::max(), op);
  return allreduce_epilogue_args(op, g, out, residual, norm_weight, eps, P);
}

// gemm_allreduce_int4: the operands of int4_gemm (this rank's shard), then the epilogue's.
inline GemmAllReduceArgs gemm_allreduce_int4_args(const at::Tensor& out, const at::Tensor& a,
                                                  const at::Tensor& qweight, const at::Tensor& scales,
                                                  const at::Tensor& mins, int64_t group_size,
                                                  const std::optional<at::Tensor>& bias,
                                                  const std::optional<at::Tensor>& residual,
                                                  const std::optional<at::Tensor>& norm_weight, double eps,
                                                  const comm::Peers& P) {
  const char* op = "decodekit::gemm_allreduce_int4";
  const GemmArgs g = quant_gemm_args(op, out, a, qweight, scales, &mins, group_size, bias);
  return allreduce_epilogue_args(op, g, out, residual, norm_weight, eps, P);
}

// gemm_allreduce_fp8: the operands of fp8_gemm (a / a_scale from quantize_fp8), then the epilogue's.
inline GemmAllReduceArgs gemm_allreduce_fp8_args(const at::Tensor& out, const at::Tensor& a,
                                                 const at::Tensor& a_scale, const at::Tensor& weight,
                                                 const at::Tensor& w_scale, const std::optional<at::Tensor>& bias,
                                                 const std::optional<at::Tensor>& residual,
                                                 const std::optional<at::Tensor>& norm_weight, double eps,
                                                 const comm::Peers& P) {
  const char* op = "decodekit::gemm_allreduce_fp8";
  const Fp8Args f = fp8_gemm_args(out, a, a_scale, weight, w_scale, bias, op);
  return allreduce_epilogue_args(op, GemmArgs{f.M, f.N, f.K, f.K}, out, residual, norm_weight, eps, P);
}

// dense_route's dtype (include/decodekit/gemm/dense_cpu.h) of a float tensor's scalar type.
inline cpu::DenseDtype dense_dtype(at::ScalarType t) {
  return t == at::kHalf ? cpu::DenseDtype::kFloat16
                        : t == at::kBFloat16 ? cpu::DenseDtype::kBFloat16 : cpu::DenseDtype::kFloat32;
}

// a [M, K] @ weight [N, K]^T (+ bias) on torch's GEMM, for the rows dense_route does not give dense_gemm
// (decodekit.ops.linear's other two routes): in fp32 on upcast operands when M reaches the route's
// upcast_min_m, else in a's dtype. [M, N] in a's dtype.
inline at::Tensor dense_linear_torch(const at::Tensor& a, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                     const cpu::DenseRoute& route) {
  if (a.size(0) < route.upcast_min_m) return at::linear(a, weight, bias);
  const std::optional<at::Tensor> b = bias ? std::optional<at::Tensor>(bias->to(at::kFloat)) : std::nullopt;
  return at::linear(a.to(at::kFloat), weight.to(at::kFloat), b).to(a.scalar_type());
}

}  // namespace dk
