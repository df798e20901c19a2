// The one schema list of decodekit. CPU kernels register in csrc/cpu/*.cpp and CUDA
// kernels in csrc/cuda/*_launch.cpp with TORCH_LIBRARY_IMPL (the kernels themselves are
// instantiated in csrc/cuda/*.cu). Ops are out-variants (the caller allocates; nothing is
// allocated inside) so the engine can capture them in CUDA graphs.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(decodekit, m) {
  // out = input * rsqrt(mean(input^2, -1) + epsilon) * weight
  // out: [..., hidden] contiguous; input: [..., hidden] (rows may be strided); weight: [hidden]
  m.def("rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float epsilon) -> ()");
  // residual <- input + residual; input <- rms_norm(input + residual) * weight (in place)
  // input, residual: [..., hidden] (rows may be strided); weight: [hidden]
  m.def("fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float epsilon) -> ()");
  // In-place rotary embedding of query (and key) at positions.
  // positions: [num_tokens] int64; query: [num_tokens, num_heads * head_size] or
  // [num_tokens, num_heads, head_size] (token stride free); key: same with num_kv_heads, or None;
  // cos_sin_cache: [max_position, rot_dim] float32 (cos | sin), rot_dim <= head_size.
  m.def(
      "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, Tensor cos_sin_cache, "
      "int head_size, bool is_neox) -> ()");
  // out = silu(input[..., :d]) * input[..., d:];  out: [..., d] contiguous; input: [..., 2d]
  m.def("silu_and_mul(Tensor(a!) out, Tensor input) -> ()");

  // Dense weight GEMM for small M (decode) on the CPU: out = a @ weight^T (+ bias).
  // out: [M, N]; a: [M, K] (row stride free); weight: [N, K]; bias: [N]; M <= 64.
  m.def("dense_gemm(Tensor(a!) out, Tensor a, Tensor weight, Tensor? bias) -> ()");
  // The CPU route of a dense projection in dtype (fp32 / bf16 / fp16; include/decodekit/gemm/dense_cpu.h):
  // [dense_min_m, dense_max_m, upcast_min_m]: dense_gemm for M in [min, max], an fp32 GEMM on
  // upcast operands from upcast_min_m rows (INT64_MAX: never), torch's own otherwise.
  m.def("dense_route(ScalarType dtype) -> int[]");

  // INT4 weight-only GEMM: out [M, N] = a [M, K] @ w^T (+ bias [N]) with w decoded from
  // qweight [N, K/2] uint8 (group-split nibbles), scales / mins [N, K/G] float16:
  // w = scale * q + min (include/decodekit/gemm/int4.h). int4_dequantize writes w [N, K].
  // packed: optionally the same weight in int4_marlin_pack's layout for a's dtype (CUDA: the Marlin-style
  // kernel reads it instead where the dispatch table picks that kernel; the CPU ignores it), or in
  // int4_amx_rows_pack's (CPU: float32 / float16 activations of 1 .. 12 rows then run on the AMX int8 unit with
  // the exact integer products that 9+ rows get anyway, so a row's bits do not depend on the row count). With
  // that CPU copy, qweight may be [N, 0] and scales / mins [N, 0]: the weight held only as the copy (any M reads it;
  // decodekit.ops.prepare_amx_rows(weight, drop_stored=True)); int8_gemm / int8_dequantize_rows likewise.
  // decode_rows (CPU; CUDA ignores it): batch invariance. Rows [0, decode_rows) are decode-phase rows, each computed
  // with the bits it gets alone (the GEMV's arithmetic, or the AMX copy's, whose semantics hold at every row count);
  // rows [decode_rows, M) are prompt rows, run as one block of at least 17 rows (zero rows appended to fewer) on the
  // many-row kernels, where a row's bits do not depend on the rows beside it; -1: every row by the row count.
  m.def("int4_gemm(Tensor(a!) out, Tensor a, Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "Tensor? bias, Tensor? packed=None, int decode_rows=-1) -> ()");
  m.def("int4_dequantize(Tensor(a!) out, Tensor qweight, Tensor scales, Tensor mins, int group_size) -> ()");
  // The packed layout of the CUDA Marlin-style INT4 kernel (include/decodekit/gemm/int4_marlin_pack.h: contiguous
  // 128 x 128 units, codes in the lanes' order, scale / min pairs inside, in the activations' type): out
  // [int4_marlin_packed_bytes(N, K, G) / 2] float16 / bfloat16 from int4_gemm's qweight / scales / mins.
  // int4_gemm_marlin: out [M, N] = a [M, K] @ w^T (+ bias [N]) from such a buffer `packed` of a's dtype, n = N,
  // k = K (CUDA: M <= 64; the CPU kernel, for tests, decodes each weight as the CUDA kernel rounds it).
  m.def("int4_marlin_pack(Tensor(a!) out, Tensor qweight, Tensor scales, Tensor mins, int group_size) -> ()");
  // The CPU's copy for int4_gemm's 1 .. 12-row AMX kernels (include/decodekit/gemm/amx_rows_layout.h): out
  // [amx_rows_packed_bytes(N, K, G)] uint8 from qweight / scales / mins (CPU only).
  m.def("int4_amx_rows_pack(Tensor(a!) out, Tensor qweight, Tensor scales, Tensor mins, int group_size) -> ()");
  // Whether this build and CPU run that kernel (AMX-INT8 in a native build, DECODEKIT_CPU_AMX not 0).
  m.def("int4_amx_rows_available() -> bool");
  m.def("int4_gemm_marlin(Tensor(a!) out, Tensor a, Tensor packed, int n, int k, int group_size, Tensor? bias) -> ()");
  // int4_marlin_dequantize: out [R, k] (packed's dtype) = rows [row0, row0 + R) of the weight held in `packed`
  // (int4_marlin_pack's layout), each as the Marlin-style kernel rounds it: w = round_T(s_T q + m_T) (a model
  // holding its INT4 weights as that copy alone decodes chunks of them for cuBLAS past the kernel's 64 rows).
  m.def("int4_marlin_dequantize(Tensor(a!) out, Tensor packed, int n, int k, int group_size, int row0=0) -> ()");
  // INT8 weight-only (GGUF Q8_0): w = scale * q, qweight [N, K] int8, scales [N, K/G] float16.
  // int8_dequantize_rows writes out [R, K] = the rows `ids` [R] int64 of w (the embedding lookup; packed: the
  // CPU's copy below, read when qweight is [N, 0]).
  // packed: optionally int8_amx_rows_pack's copy (CPU: float32 / float16 activations of 1 .. 8 rows then run on
  // the AMX int8 unit with the exact integer products 9+ rows get anyway; CUDA ignores it).
  m.def("int8_gemm(Tensor(a!) out, Tensor a, Tensor qweight, Tensor scales, int group_size, Tensor? bias, "
        "Tensor? packed=None, int decode_rows=-1) -> ()");
  m.def("int8_amx_rows_pack(Tensor(a!) out, Tensor qweight, Tensor scales, int group_size) -> ()");
  m.def("int8_dequantize_rows(Tensor(a!) out, Tensor qweight, Tensor scales, int group_size, Tensor ids, "
        "Tensor? packed=None) -> ()");
  // fp8 e4m3 W8A8 (include/decodekit/gemm/fp8_gemm.h): quantize_fp8 writes the per-token dynamic
  // quantization of input [M, K] (row stride free): out [M, K] Float8_e4m3fn, scale [M] float32
  // (max |x| / 448). fp8_gemm: out [M, N] = (a [M, K] @ weight [N, K]^T) * a_scale [M] * w_scale [N]
  // (+ bias [N]); a / weight Float8_e4m3fn, K a multiple of 32.
  m.def("quantize_fp8(Tensor(a!) out, Tensor(b!) scale, Tensor input) -> ()");
  m.def("fp8_gemm(Tensor(a!) out, Tensor a, Tensor a_scale, Tensor weight, Tensor w_scale, Tensor? bias) -> ()");

  // Speculative-decoding verification (include/decodekit/sampling/rejection.h): per request b,
  // the first num_draft[b] of draft_tokens [B, k] (int64) checked against target_probs [B, k+1, V]
  // (float32) with draft_probs [B, k, V] (float32; None: one-hot drafts), Philox numbers keyed by
  // seeds [B] / positions [B] (int64: the first draft's position); writes out [B, k+1] int64 (the
  // emitted tokens, -1 after them) and num_emitted [B] int32 (1 .. num_draft + 1). greedy:
  // temperature 0 (argmax).
  m.def("rejection_sample(Tensor(a!) out, Tensor(b!) num_emitted, Tensor draft_tokens, Tensor num_draft, "
        "Tensor? draft_probs, Tensor target_probs, Tensor seeds, Tensor positions, bool greedy) -> ()");

  // Gumbel-max sampling (include/decodekit/sampling/gumbel_max.h): out [B] int64 = argmax_v of
  // scores[b, v] + g(seeds[b], positions[b], v) for scores [B, V] float32 (row stride free; -inf:
  // never drawn), Philox stream `stream` in [0, 2^32) (the sampler's noise: 0); ties -> the lowest v.
  m.def("gumbel_argmax(Tensor(a!) out, Tensor scores, Tensor seeds, Tensor positions, int stream) -> ()");
  // The greedy token of each row: torch.argmax's rule (ties -> lowest index, NaN wins), sampling/argmax.h.
  m.def("argmax_rows(Tensor(a!) out, Tensor scores) -> ()");

  // Stable descending sort of rows (include/decodekit/sampling/sort_desc.h): values [B, V] float32 and
  // indices [B, V] int64 = torch.sort(x, dim=-1, descending=True, stable=True) of x [B, V] float32 (row
  // stride free), bit for bit: ties in index order, NaNs first, -0.0 equal to +0.0.
  m.def("sort_desc_stable(Tensor(a!) values, Tensor(b!) indices, Tensor x) -> ()");

  // Paged KV cache: [num_blocks, num_kv_heads, block_size, head_dim] per layer for K and V,
  // in the activations' dtype or fp8 e4m3 (Float8_e4m3fn: stored x / scale, saturated at
  // +-448; k_scale / v_scale float32 [1] or [num_kv_heads], absent = 1).
  // Writes key/value [num_tokens, num_kv_heads, head_dim] (token stride free) at
  // slot_mapping [num_tokens] int64 (slot = block * block_size + offset; < 0 skipped).
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping, Tensor? k_scale=None, Tensor? v_scale=None) -> ()");
  // Copy whole blocks src -> dst (block_mapping [N, 2] int64, on the caches' device) in every
  // layer's K and V cache (copy-on-write of a shared partial block when n > 1 sequences fork).
  m.def("copy_blocks(Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor block_mapping) -> ()");
  // Copy whole blocks src[i] -> dst[j] between caches of the same block shape, on the same or
  // different devices (CPU <-> CUDA swap); block_mapping [N, 2] int64 on the CPU.
  m.def("swap_blocks(Tensor src, Tensor(a!) dst, Tensor block_mapping) -> ()");
  // Causal attention of each sequence's new tokens over its paged context.
  // out: [T, Hq, D]; query: [T, Hq, D] (token stride free); block_tables: [S, max_blocks] int32;
  // seq_lens: [S] int32 context length incl. new tokens; query_start_loc: [S + 1] int32;
  // lse (optional): [T, Hq] float32, natural-log sum of exp of the scaled scores.
  // fp8 caches: K and V are read as float(q) * k_scale / v_scale. sliding_window > 0: each token
  // sees only its last sliding_window keys (itself included; Mistral / Qwen2 sliding layers), and
  // only the blocks that hold them are read (earlier block_tables entries are not looked at).
  m.def(
      "paged_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, float scale, Tensor(b!)? lse=None, "
      "Tensor? k_scale=None, Tensor? v_scale=None, int sliding_window=0) -> ()");

  // One Llama-family decoder layer with packed INT4 / INT8 projections, the op sequence of
  // python/decodekit/models/llama.py in one call (csrc/decoder_layer.cpp; bitwise that sequence):
  //   if add_input: fused_add_rms_norm(hidden, residual, input_norm)
  //   qkv = hidden @ Wqkv^T (+ qkv_bias); (q_norm / k_norm given: rms_norm of each q / k head, Qwen3)
  //   rotary_embedding(q, k); reshape_and_cache(k, v)
  //   attn = paged_attention(q); hidden <- attn @ Wo^T; fused_add_rms_norm(hidden, residual, post_norm)
  //   out = silu_and_mul(hidden @ Wgate_up^T) @ Wdown^T
  // hidden [T, hidden] contiguous (overwritten), residual [T, hidden], out [T, hidden]; workspace
  // [>= T * (2 q + 2 kv + 3 I)] of hidden's dtype (q = num_heads * head_dim, kv = num_kv_heads *
  // head_dim, I = intermediate size); each weight [qweight, scales, mins (, packed)] (INT4) or [qweight,
  // scales (, packed)] (INT8: told apart by qweight's int8 dtype), int4_gemm's / int8_gemm's operands, with its
  // group size in group_sizes (qkv, o, gate_up, down); the attention arguments are paged_attention's and
  // reshape_and_cache's. decode_rows: rows [0, decode_rows) are decode-phase rows (a decode step's or a
  // verification pass's; -1: none marked): on the CPU every projection gives them their one-row bits and runs
  // the other rows as one block of at least 17 (int4_gemm's decode_rows; dense weights: dense_gemm's row blocks;
  // include/decodekit/gemm/dense_cpu.h); CUDA ignores it.
  // On CUDA only the shapes int4_gemm / int8_gemm's CUDA kernels take (the others raise
  // there).
  m.def(
      "decoder_layer(Tensor(a!) out, Tensor(b!) hidden, Tensor(c!) residual, Tensor(d!) workspace, "
      "Tensor(e!) key_cache, Tensor(f!) value_cache, Tensor[] qkv_weight, Tensor? qkv_bias, Tensor[] o_weight, "
      "Tensor[] gate_up_weight, Tensor[] down_weight, int[] group_sizes, Tensor input_norm, Tensor post_norm, "
      "bool add_input, float eps, Tensor positions, Tensor cos_sin_cache, bool is_neox, Tensor slot_mapping, "
      "Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, int num_heads, int num_kv_heads, "
      "int head_dim, float scale, Tensor? k_scale=None, Tensor? v_scale=None, int sliding_window=0, "
      "Tensor? q_norm=None, Tensor? k_norm=None, int decode_rows=-1) -> ()");

  // A stack of L decoder layers in one call: decoder_layer on each in turn (bitwise that sequence of calls), for
  // the per-call cost from Python. Per-layer arguments are lists of L: key_caches / value_caches, qkv_biases,
  // input_norms / post_norms, sliding_windows, and k_scales / v_scales / q_norms / k_norms ([L] or empty: none);
  // weights holds every layer's qkv, o, gate_up and down operand lists back to back, their lengths in
  // weight_counts [4 L] and their group sizes in group_sizes [4 L]. add_input applies to layer 0 (every later layer
  // adds its input, the previous layer's output); the last layer's output is written to out, hidden is scratch.
  m.def(
      "decoder_layers(Tensor(a!) out, Tensor(b!) hidden, Tensor(c!) residual, Tensor(d!) workspace, "
      "Tensor(e!)[] key_caches, Tensor(f!)[] value_caches, Tensor[] weights, int[] weight_counts, "
      "Tensor?[] qkv_biases, int[] group_sizes, Tensor[] input_norms, Tensor[] post_norms, bool add_input, "
      "float eps, Tensor positions, Tensor cos_sin_cache, bool is_neox, Tensor slot_mapping, Tensor block_tables, "
      "Tensor seq_lens, Tensor query_start_loc, int num_heads, int num_kv_heads, int head_dim, float scale, "
      "Tensor?[] k_scales, Tensor?[] v_scales, int[] sliding_windows, Tensor?[] q_norms, Tensor?[] k_norms, "
      "int decode_rows=-1) -> ()");

  // Custom AllReduce over peer-mapped buffers (include/decodekit/comm/allreduce.h; driver:
  // decodekit.distributed.custom_allreduce.CustomAllReduce). buffer_ptrs / signal_ptrs: [world_size]
  // addresses, in this process, of every rank's data buffer (buffer_bytes each, 256-byte aligned) and
  // Signal block (allreduce_signal_bytes() each); CUDA: IPC-opened device pointers, CPU: mapped
  // /dev/shm segments. Every rank must make the same calls in the same order (a collective).
  // out, inp: [...] same shape, contiguous; out may be inp. nbytes <= buffer_bytes / 4.
  // two_shot: reduce-scatter + all-gather instead of every rank reducing the whole message.
  m.def("custom_all_reduce(Tensor(a!) out, Tensor inp, int[] buffer_ptrs, int[] signal_ptrs, int rank, "
        "int buffer_bytes, bool two_shot) -> ()");
  // out [M, N] = sum over ranks of a [M, K] (row stride free) @ weight [N, K]^T (+ bias [N], added by rank 0);
  // with residual [M, N] (row stride free) and norm_weight [N]: residual <- out + residual, out <-
  // rms_norm(residual) * norm_weight (fused_add_rms_norm after the reduction). Partial tiles go
  // straight into the peers' buffers as they are computed.
  m.def("gemm_allreduce(Tensor(a!) out, Tensor a, Tensor weight, Tensor? bias, int[] buffer_ptrs, "
        "int[] signal_ptrs, int rank, int buffer_bytes, Tensor(b!)? residual, Tensor? norm_weight, "
        "float eps) -> ()");
  // The same with this rank's shard of a packed INT4 weight (int4_gemm's operands) or fp8 W8A8
  // (fp8_gemm's: a [M, K] / a_scale [M] from quantize_fp8; out's dtype is the output's).
  m.def("gemm_allreduce_int4(Tensor(a!) out, Tensor a, Tensor qweight, Tensor scales, Tensor mins, int group_size, "
        "Tensor? bias, int[] buffer_ptrs, int[] signal_ptrs, int rank, int buffer_bytes, Tensor(b!)? residual, "
        "Tensor? norm_weight, float eps) -> ()");
  m.def("gemm_allreduce_fp8(Tensor(a!) out, Tensor a, Tensor a_scale, Tensor weight, Tensor w_scale, Tensor? bias, "
        "int[] buffer_ptrs, int[] signal_ptrs, int rank, int buffer_bytes, Tensor(b!)? residual, Tensor? norm_weight, "
        "float eps) -> ()");
  // Bytes of one Signal block; allreduce_init_signal zeroes signal [>= that] uint8 and writes its
  // header (world size, wait timeout, the epoch the first call follows; CUDA: diag_ptr = address of
  // int64 [4] pinned host memory that a timed-out kernel fills before it traps) before peers map it.
  m.def("allreduce_signal_bytes() -> int");
  m.def("allreduce_init_signal(Tensor(a!) signal, int world_size, float timeout_s, int epoch, "
        "int diag_ptr=0) -> ()");
  // CUDA IPC (setup only; CUDA builds; the CPU raises): ipc_mem_handle(buf: CUDA) -> [72] uint8 CPU =
  // the cudaIpcMemHandle (64 bytes) of buf's allocation + buf's int64 offset in it; ipc_open(handle
  // [72] uint8) -> buf's address in this process (another process's handle); ipc_close(that address).
  m.def("ipc_mem_handle(Tensor buf) -> Tensor");
  m.def("ipc_open(Tensor handle) -> int");
  m.def("ipc_close(int ptr) -> ()");
}

// `import decodekit._C` loads this library, which runs the registrations above.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "decodekit native ops", -1, nullptr};
  return PyModule_Create(&module_def);
}
