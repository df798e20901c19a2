// decoder_layer: one Llama-family decoder layer (attention + SwiGLU MLP) as one op call, for packed
// INT4 / INT8 or dense projection weights. It is the sequence the Python model runs op by op
// (python/decodekit/models/llama.py), issued here through the dispatcher: the same kernels on the
// same operands, so the results are bitwise those of the unfused sequence, on the CPU and on CUDA
// alike. What it saves is the per-op cost of the Python path (argument wrapping, dispatch from
// Python, allocation): about ten op calls per layer become one (SmolLM2: 30 layers per token).
// Semantics and oracle: decodekit.ops.reference.decoder_layer.
#include <algorithm>

#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "op_args.h"

namespace {

using OptTensor = std::optional<at::Tensor>;
constexpr const char* kOp = "decodekit::decoder_layer";

[[noreturn]] void fail(const char* name, const std::string& msg) { TORCH_CHECK(false, kOp, ": '", name, "' ", msg); }

// A decodekit op's typed handle, F its kernels' signature (found by name once).
template <class F>
struct Op {
  c10::TypedOperatorHandle<F> handle;
  explicit Op(const char* name)
      : handle(c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<F>()) {}
  template <class... A>
  void call(A&&... args) const {
    handle.call(std::forward<A>(args)...);
  }
};

using T_ = at::Tensor;
using CT = const at::Tensor&;
using CO = const OptTensor&;

// The constituent ops.
struct LayerOps {
  Op<void(T_&, T_&, CT, double)> add_norm{"decodekit::fused_add_rms_norm"};
  Op<void(T_&, CT, CT, double)> norm{"decodekit::rms_norm"};
  Op<void(T_&, CT, CT, CT, CT, int64_t, CO, CO, int64_t)> int4{"decodekit::int4_gemm"};
  Op<void(T_&, CT, CT, CT, int64_t, CO, CO, int64_t)> int8{"decodekit::int8_gemm"};
  Op<void(T_&, CT, CT, CO)> dense{"decodekit::dense_gemm"};
  Op<void(CT, T_&, CO, CT, int64_t, bool)> rope{"decodekit::rotary_embedding"};
  Op<void(CT, CT, T_&, T_&, CT, CO, CO)> cache{"decodekit::reshape_and_cache"};
  Op<void(T_&, CT, CT, CT, CT, CT, CT, double, CO, CO, CO, int64_t)> attn{"decodekit::paged_attention"};
  Op<void(T_&, CT)> silu_mul{"decodekit::silu_and_mul"};

  static const LayerOps& get() {
    static const LayerOps ops;
    return ops;
  }
};

// A projection: [qweight, scales, mins (, packed)] (INT4: uint8 qweight; packed: int4_gemm's), [qweight, scales
// (, packed)] (INT8: int8 qweight; packed: int8_gemm's) or [weight] (dense, the activations' dtype); returns its
// rows N.
bool is_int8(at::TensorList w) { return w.size() >= 2 && w[0].scalar_type() == at::kChar; }

int64_t proj_rows(const char* name, at::TensorList w) {
  if (w.empty() || w.size() > 4 || (is_int8(w) ? w.size() > 3 : w.size() == 2))
    fail(name, "must hold 3 or 4 tensors (INT4: qweight, scales, mins, optionally int4_gemm's packed copy), 2 or 3 "
               "(INT8: int8 qweight, scales, optionally int8_gemm's packed copy) or 1 (a dense weight), got " +
                   std::to_string(w.size()));
  dk::Check(kOp, name, w[0]).dim(2);
  return w[0].size(0);
}

// out [T, N] = a [T, K] @ w^T (+ bias) through one op (dense: by dense_route: dense_gemm, an fp32 GEMM on upcast
// operands, or torch's; everything else at::linear).
void project_once(const LayerOps& ops, at::Tensor& out, const at::Tensor& a, at::TensorList w, int64_t group_size,
                  const OptTensor& bias, int64_t decode_rows) {
  if (is_int8(w))
    return ops.int8.call(out, a, w[0], w[1], group_size, bias, w.size() == 3 ? OptTensor(w[2]) : std::nullopt,
                         decode_rows);
  if (w.size() == 3 || w.size() == 4)
    return ops.int4.call(out, a, w[0], w[1], w[2], group_size, bias, w.size() == 4 ? OptTensor(w[3]) : std::nullopt,
                         decode_rows);
  const int64_t M = a.size(0);
  const at::ScalarType st = a.scalar_type();
  if (a.is_cpu() && (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf)) {
    const dk::cpu::DenseRoute r = dk::cpu::dense_route(dk::dense_dtype(st));
    if (M >= r.dense_min_m && M <= r.dense_max_m) return ops.dense.call(out, a, w[0], bias);
    out.copy_(dk::dense_linear_torch(a, w[0], bias, r));
    return;
  }
  out.copy_(at::linear(a, w[0], bias));
}

// out [T, N] = a [T, K] @ w^T (+ bias), routed as ops.linear routes it (python/decodekit/ops/__init__.py), so the
// result is bitwise the op-by-op path's: int4_gemm / int8_gemm for packed weights (decode_rows passed on: they split
// the rows themselves), dense weights as project_once. Batch invariance for dense weights (decode_rows >= 0, CPU):
// the decode rows in blocks of dense_route's dense_gemm rows (its tiles give a row the same bits at any row count),
// the prompt rows as one block of at least dense_prefill_rows_min (zero rows appended: one route for every block).
void project(const LayerOps& ops, at::Tensor& out, const at::Tensor& a, at::TensorList w, int64_t group_size,
             const OptTensor& bias, int64_t decode_rows) {
  const bool dense = w.size() == 1;
  if (!dense || decode_rows < 0 || !a.is_cpu()) return project_once(ops, out, a, w, group_size, bias, decode_rows);
  const auto dtype = dk::dense_dtype(a.scalar_type());
  const int64_t M = a.size(0), P = dk::cpu::dense_prefill_rows_min(dtype);
  const int64_t B = std::max<int64_t>(1, dk::cpu::dense_route(dtype).dense_max_m);
  for (int64_t m0 = 0; m0 < decode_rows; m0 += B) {
    const int64_t rows = std::min(B, decode_rows - m0);
    at::Tensor o = out.narrow(0, m0, rows);
    project_once(ops, o, a.narrow(0, m0, rows), w, group_size, bias, -1);
  }
  const int64_t p = M - decode_rows;
  if (p >= P) {
    at::Tensor o = out.narrow(0, decode_rows, p);
    project_once(ops, o, a.narrow(0, decode_rows, p), w, group_size, bias, -1);
  } else if (p > 0) {
    at::Tensor ap = at::zeros({P, a.size(1)}, a.options()), op = at::empty({P, out.size(1)}, out.options());
    ap.narrow(0, 0, p).copy_(a.narrow(0, decode_rows, p));
    project_once(ops, op, ap, w, group_size, bias, -1);
    out.narrow(0, decode_rows, p).copy_(op.narrow(0, 0, p));
  }
}

// The workspace regions a layer works in and the views of them its ops take (cut once per stack of layers: a
// view costs ~0.3 us to make, and a decode step's layer ~16 of them, more than its small ops' kernels).
struct LayerViews {
  const void* ws = nullptr;  // what they were cut for
  int64_t T = -1, q = 0, kv = 0, I = 0, heads = 0, kv_heads = 0, D = 0;
  at::Tensor qkv;      // [T, q + 2 kv]
  at::Tensor attn;     // [T, heads, D]: the attention output
  at::Tensor attn2;    // [T, q]: the same
  at::Tensor gate_up;  // [T, 2 I]
  at::Tensor act;      // [T, I]
  at::Tensor q2, k2;   // [T, q] / [T, kv] views of qkv
  at::Tensor q3;       // [T, heads, D] view of qkv
  at::Tensor k3, v3;   // [T, kv_heads, D] views of qkv

  void cut(const at::Tensor& workspace, int64_t T_, int64_t q_, int64_t kv_, int64_t I_, int64_t heads_,
           int64_t kv_heads_, int64_t D_) {
    if (ws == workspace.data_ptr() && T == T_ && q == q_ && kv == kv_ && I == I_ && heads == heads_ &&
        kv_heads == kv_heads_ && D == D_ && workspace.scalar_type() == qkv.scalar_type())
      return;
    ws = workspace.data_ptr(), T = T_, q = q_, kv = kv_, I = I_, heads = heads_, kv_heads = kv_heads_, D = D_;
    const at::Tensor flat = workspace.view({-1});
    qkv = flat.narrow(0, 0, T * (q + 2 * kv)).view({T, q + 2 * kv});
    attn = flat.narrow(0, T * (q + 2 * kv), T * q).view({T, heads, D});
    attn2 = attn.view({T, q});
    gate_up = flat.narrow(0, T * (2 * q + 2 * kv), T * 2 * I).view({T, 2 * I});
    act = flat.narrow(0, T * (2 * q + 2 * kv + 2 * I), T * I).view({T, I});
    q2 = qkv.narrow(1, 0, q);
    k2 = qkv.narrow(1, q, kv);
    q3 = q2.view({T, heads, D});
    k3 = k2.view({T, kv_heads, D});
    v3 = qkv.narrow(1, q + kv, kv).view({T, kv_heads, D});
  }
};

// decoder_layer's body; V: views to reuse (decoder_layers' stack), cut here if they do not fit.
void decoder_layer_in(LayerViews& V,
                   at::Tensor& out,                  // [T, hidden]: the MLP's output
                   at::Tensor& hidden,               // [T, hidden] contiguous: the layer's input (see add_input)
                   at::Tensor& residual,             // [T, hidden], updated in place
                   at::Tensor& workspace,            // [>= T * (2 q + 2 kv + 3 I)] of hidden's dtype
                   at::Tensor& key_cache,            // [num_blocks, Hk, block_size, D]
                   at::Tensor& value_cache,          // [num_blocks, Hk, block_size, D]
                   at::TensorList qkv_weight,        // packed or dense [q + 2 kv, hidden] (see proj_rows)
                   const OptTensor& qkv_bias,        // [q + 2 kv]
                   at::TensorList o_weight,          // packed or dense [hidden, q]
                   at::TensorList gate_up_weight,    // packed or dense [2 I, hidden]
                   at::TensorList down_weight,       // packed or dense [hidden, I]
                   at::IntArrayRef group_sizes,      // [4]: qkv, o, gate_up, down
                   const at::Tensor& input_norm,     // [hidden]
                   const at::Tensor& post_norm,      // [hidden]
                   bool add_input, double eps,
                   const at::Tensor& positions,        // [T] int64
                   const at::Tensor& cos_sin_cache,    // [max_position, rot_dim] float32
                   bool is_neox,
                   const at::Tensor& slot_mapping,     // [T] int64
                   const at::Tensor& block_tables,     // [S, max_blocks] int32
                   const at::Tensor& seq_lens,         // [S] int32
                   const at::Tensor& query_start_loc,  // [S + 1] int32
                   int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale,
                   const OptTensor& k_scale,           // fp8 cache: [1] or [Hk] float32
                   const OptTensor& v_scale,
                   int64_t sliding_window,             // paged_attention's (0: none)
                   const OptTensor& q_norm,            // [head_dim] Qwen3: RMSNorm weight of each query head
                   const OptTensor& k_norm,            // [head_dim] and of each key head (both or neither)
                   int64_t decode_rows) {              // rows [0, decode_rows): decode-phase (project); -1: none
  const LayerOps& ops = LayerOps::get();
  dk::Check(kOp, "hidden", hidden).dim(2).contiguous();
  const int64_t T = hidden.size(0), H = hidden.size(1);
  dk::check_range<int64_t>(kOp, "num_heads", num_heads, 1, 1 << 16);
  dk::check_range<int64_t>(kOp, "num_kv_heads", num_kv_heads, 1, num_heads);
  dk::check_range<int64_t>(kOp, "head_dim", head_dim, 1, 1 << 16);
  if (group_sizes.size() != 4)
    fail("group_sizes", "must hold 4 values (qkv, o, gate_up, down), got " +
                                                  std::to_string(group_sizes.size()));
  const int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
  const int64_t qkv_rows = proj_rows("qkv_weight", qkv_weight);
  if (qkv_rows != q + 2 * kv)
    fail("qkv_weight", "must have (num_heads + 2 num_kv_heads) * head_dim = " +
                                                 std::to_string(q + 2 * kv) + " rows, got " + std::to_string(qkv_rows));
  const int64_t gate_up_rows = proj_rows("gate_up_weight", gate_up_weight);
  if (gate_up_rows % 2 != 0)
    fail("gate_up_weight", "must have an even number of rows (gate | up), got " +
                                                     std::to_string(gate_up_rows));
  const int64_t I = gate_up_rows / 2;
  if (proj_rows("o_weight", o_weight) != H || proj_rows("down_weight", down_weight) != H)
    fail("o_weight / down_weight", "must have hidden_size = " + std::to_string(H) + " rows");
  dk::Check(kOp, "out", out).same_shape(hidden, "hidden").dtype_as(hidden, "hidden").contiguous();
  dk::Check(kOp, "workspace", workspace).dtype_as(hidden, "hidden").device_as(hidden, "hidden").contiguous();
  const int64_t need = T * (2 * q + 2 * kv + 3 * I);
  if (workspace.numel() < need)
    fail("workspace", "must have at least T * (2 q + 2 kv + 3 I) = " + std::to_string(need) +
                                                " elements, got " + std::to_string(workspace.numel()));
  if (q_norm.has_value() != k_norm.has_value()) fail("q_norm / k_norm", "must be given both or neither");
  if (decode_rows < -1 || decode_rows > T)
    fail("decode_rows", "must be in [-1, T = " + std::to_string(T) + "], got " + std::to_string(decode_rows));
  if (T == 0) return;

  V.cut(workspace, T, q, kv, I, num_heads, num_kv_heads, head_dim);

  if (add_input) ops.add_norm.call(hidden, residual, input_norm, eps);
  project(ops, V.qkv, hidden, qkv_weight, group_sizes[0], qkv_bias, decode_rows);
  const OptTensor k = V.k2;  // [T, kv]: rope in place, then cached
  if (q_norm.has_value()) {  // each head normed on its own (as the Python path: rms_norm of [T * heads, D] rows)
    // into workspace regions that are free until attention / the MLP write them (the attention output holds
    // the q heads exactly; gate_up, 2 I per token, the k heads unless a model's kv is larger)
    at::Tensor qn = V.attn.view({T * num_heads, head_dim});
    at::Tensor kn = kv <= 2 * I ? V.gate_up.view({-1}).narrow(0, 0, T * kv).view({T * num_kv_heads, head_dim})
                                : at::empty({T * num_kv_heads, head_dim}, hidden.options());
    for (auto [x, w, normed] : {std::tuple{V.q2, *q_norm, qn}, std::tuple{V.k2, *k_norm, kn}}) {
      const int64_t heads = normed.size(0) / T;
      ops.norm.call(normed, x.reshape({T * heads, head_dim}), w, eps);  // (a view when T = 1: decode)
      x.view({T, heads, head_dim}).copy_(normed.view({T, heads, head_dim}));
    }
  }
  ops.rope.call(positions, V.q2, k, cos_sin_cache, head_dim, is_neox);
  ops.cache.call(V.k3, V.v3, key_cache, value_cache, slot_mapping, k_scale, v_scale);
  ops.attn.call(V.attn, V.q3, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, std::nullopt,
                k_scale, v_scale, sliding_window);
  project(ops, hidden, V.attn2, o_weight, group_sizes[1], std::nullopt, decode_rows);  // hidden <- o-proj
  ops.add_norm.call(hidden, residual, post_norm, eps);
  project(ops, V.gate_up, hidden, gate_up_weight, group_sizes[2], std::nullopt, decode_rows);
  ops.silu_mul.call(V.act, V.gate_up);
  project(ops, out, V.act, down_weight, group_sizes[3], std::nullopt, decode_rows);
}

// The op: one layer (its views cut for this call).
void decoder_layer(at::Tensor& out, at::Tensor& hidden, at::Tensor& residual, at::Tensor& workspace,
                   at::Tensor& key_cache, at::Tensor& value_cache, at::TensorList qkv_weight, const OptTensor& qkv_bias,
                   at::TensorList o_weight, at::TensorList gate_up_weight, at::TensorList down_weight,
                   at::IntArrayRef group_sizes, const at::Tensor& input_norm, const at::Tensor& post_norm,
                   bool add_input, double eps, const at::Tensor& positions, const at::Tensor& cos_sin_cache,
                   bool is_neox, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                   const at::Tensor& seq_lens, const at::Tensor& query_start_loc, int64_t num_heads,
                   int64_t num_kv_heads, int64_t head_dim, double scale, const OptTensor& k_scale,
                   const OptTensor& v_scale, int64_t sliding_window, const OptTensor& q_norm, const OptTensor& k_norm,
                   int64_t decode_rows) {
  LayerViews V;
  decoder_layer_in(V, out, hidden, residual, workspace, key_cache, value_cache, qkv_weight, qkv_bias, o_weight,
                   gate_up_weight, down_weight, group_sizes, input_norm, post_norm, add_input, eps, positions,
                   cos_sin_cache, is_neox, slot_mapping, block_tables, seq_lens, query_start_loc, num_heads,
                   num_kv_heads, head_dim, scale, k_scale, v_scale, sliding_window, q_norm, k_norm, decode_rows);
}

// decoder_layers: a stack of L layers in one call, decoder_layer on each in turn (so bitwise that sequence of calls).
// What it saves is decoder_layer's per-call cost from Python, ~6 us of argument conversion for its 33 arguments
// (SmolLM2: 30 layers a token). Per-layer arguments are lists of L (weights flattened: layer i's qkv, o, gate_up and
// down operand lists back to back, their lengths in weight_counts [4 L], their group sizes in group_sizes [4 L]);
// k_scales / v_scales and q_norms / k_norms are [L] or empty (none). Layer 0 adds its input to the residual if
// add_input, every later layer does (the previous layer's MLP output); the last layer's output lands in out,
// hidden is scratch (the layers' inputs and outputs alternate between hidden and out).
void decoder_layers(at::Tensor& out,                   // [T, hidden]: the last layer's MLP output
                    at::Tensor& hidden,                // [T, hidden] contiguous: layer 0's input; overwritten
                    at::Tensor& residual,              // [T, hidden], updated in place
                    at::Tensor& workspace,             // decoder_layer's
                    at::TensorList key_caches,         // [L] x [num_blocks, Hk, block_size, D]
                    at::TensorList value_caches,       // [L] x [num_blocks, Hk, block_size, D]
                    at::TensorList weights,            // sum(weight_counts): the layers' projection operands
                    at::IntArrayRef weight_counts,     // [4 L]: tensors of each projection (qkv, o, gate_up, down)
                    const c10::List<std::optional<at::Tensor>>& qkv_biases,  // [L] x [q + 2 kv] or None
                    at::IntArrayRef group_sizes,       // [4 L]
                    at::TensorList input_norms,        // [L] x [hidden]
                    at::TensorList post_norms,         // [L] x [hidden]
                    bool add_input, double eps,
                    const at::Tensor& positions, const at::Tensor& cos_sin_cache, bool is_neox,
                    const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                    const at::Tensor& query_start_loc, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                    double scale,
                    const c10::List<std::optional<at::Tensor>>& k_scales,  // [L] or []: [1] / [Hk] float32 or None
                    const c10::List<std::optional<at::Tensor>>& v_scales,  // [L] or []
                    at::IntArrayRef sliding_windows,   // [L]
                    const c10::List<std::optional<at::Tensor>>& q_norms,   // [L] or []: [head_dim] or None
                    const c10::List<std::optional<at::Tensor>>& k_norms,   // [L] or []
                    int64_t decode_rows) {
  const char* op = "decodekit::decoder_layers";
  const int64_t L = int64_t(key_caches.size());
  auto need = [&](const char* name, int64_t got, int64_t want, bool may_be_empty) {
    TORCH_CHECK(got == want || (may_be_empty && got == 0), op, ": '", name, "' must have ", want,
                may_be_empty ? " entries (one per layer) or none" : " entries", " (L = ", L,
                " layers, from key_caches), got ", got);
  };
  TORCH_CHECK(L >= 1, op, ": 'key_caches' must hold at least one layer's cache, got none");
  need("value_caches", int64_t(value_caches.size()), L, false);
  need("weight_counts", int64_t(weight_counts.size()), 4 * L, false);
  need("qkv_biases", int64_t(qkv_biases.size()), L, false);
  need("group_sizes", int64_t(group_sizes.size()), 4 * L, false);
  need("input_norms", int64_t(input_norms.size()), L, false);
  need("post_norms", int64_t(post_norms.size()), L, false);
  need("k_scales", int64_t(k_scales.size()), L, true);
  need("v_scales", int64_t(v_scales.size()), L, true);
  need("sliding_windows", int64_t(sliding_windows.size()), L, false);
  need("q_norms", int64_t(q_norms.size()), L, true);
  need("k_norms", int64_t(k_norms.size()), L, true);
  int64_t total = 0;
  for (int64_t c : weight_counts) {
    TORCH_CHECK(c >= 1 && c <= 4, op, ": 'weight_counts' entries must be in [1, 4] (a projection's operands), got ", c);
    total += c;
  }
  need("weights", int64_t(weights.size()), total, false);  // (sum of weight_counts)
  TORCH_CHECK(!out.is_same(hidden), op, ": 'out' and 'hidden' must be different tensors");
  at::Tensor cur = hidden, nxt = out;
  if (L % 2 == 0) std::swap(nxt, cur), cur.copy_(hidden);  // an even count ends in out: start from out
  int64_t at = 0;
  LayerViews V;  // (one set for every layer)
  for (int64_t i = 0; i < L; ++i) {
    at::TensorList proj[4];  // qkv, o, gate_up, down: views of weights
    for (int j = 0; j < 4; ++j) {
      proj[j] = weights.slice(at, weight_counts[4 * i + j]);
      at += weight_counts[4 * i + j];
    }
    at::Tensor kc = key_caches[i], vc = value_caches[i];
    auto entry = [&](const c10::List<std::optional<at::Tensor>>& l) {
      return l.empty() ? OptTensor() : OptTensor(l.get(i));
    };
    decoder_layer_in(V, nxt, cur, residual, workspace, kc, vc, proj[0], entry(qkv_biases), proj[1], proj[2],
                     proj[3], group_sizes.slice(4 * i, 4), input_norms[i], post_norms[i], add_input || i > 0, eps,
                     positions, cos_sin_cache, is_neox, slot_mapping, block_tables, seq_lens, query_start_loc,
                     num_heads, num_kv_heads, head_dim, scale, entry(k_scales), entry(v_scales), sliding_windows[i],
                     entry(q_norms), entry(k_norms), decode_rows);
    std::swap(cur, nxt);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) {
  m.impl("decoder_layer", &decoder_layer);
  m.impl("decoder_layers", &decoder_layers);
}
TORCH_LIBRARY_IMPL(decodekit, CUDA, m) {
  m.impl("decoder_layer", &decoder_layer);
  m.impl("decoder_layers", &decoder_layers);
}
