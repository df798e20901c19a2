// paged_attention microbenchmarks (decode, and prefill on the GPU). Built twice: as C++ (bench_attention, CPU kernel
// from include/decodekit/attention/cpu.h) and, through bench_attention.cu, by nvcc
// (bench_attention_cuda, CUDA launcher from attention/paged.cuh). Method: see bench_common.h.
//
// A case is S sequences of ctx tokens with one new token each (decode), block size 16; the
// KV cache ([num_blocks, Hk, 16, D] for K and for V), the queries and the output of each call
// lie in their own arena slot (the rotation). Every sequence's blocks are a random
// permutation of the slot's S * ctx / 16 block ids. The metadata (block tables, seq lens,
// query starts) is built once per case, outside the timed region, and shared by all calls
// (it is one step's metadata, shared by all layers). Bytes per call: the K and V rows read
// (S * ctx * Hk * D * 2 elements) + the query read + the output written.
//
// Cases: heads of Llama-3-8B (32 query / 8 KV heads of 128) and SmolLM2-135M (9 / 3 of 64).
//   GPU prefill (fp16/bf16, tensor-core kernel): 4 prompts x 4096 tokens (reported in TFLOP/s:
//        the target is >= 50% of the measured bf16 matmul rate) and 1 x 512; fp8 KV at 4 x 4096.
//   GPU: batch 1/8/64/256 x context 512/4096/32768, those whose KV exceeds 8 GiB skipped
//        (the headline: batch 64 x context 4096 bf16; batch 1 x context 32768).
//   CPU: batch 1/16 x context 512/2048 (the CPU target: batch 16 x context 2048 with the
//        KV read at >= 50% of the copy bandwidth).
//   --quick: GPU batch 1/64 x context 512/4096; CPU batch 1/4 x context 128/512.
#include <memory>
#include <numeric>
#include <random>
#include <type_traits>

#include "bench_common.h"
#include "decodekit/attention/cpu.h"
#if defined(__CUDACC__)
#include "decodekit/attention/paged.cuh"
#endif

namespace {

constexpr int kBlockSize = 16;
constexpr double kMaxKvBytes = 8.0 * (1 << 30);  // larger batch x context combinations are skipped

struct HeadConfig { int hq, hk, head; const char* model; };
const HeadConfig kConfigs[] = {{32, 8, 128, "llama3-8b"}, {9, 3, 64, "smollm2-135m"}};

// (batches, contexts) of the decode cases: every batch with every context.
struct Grid { std::vector<int> batches, contexts; };
Grid decode_grid(bool quick) {
#if defined(__CUDACC__)
  return quick ? Grid{{1, 64}, {512, 4096}} : Grid{{1, 8, 64, 256}, {512, 4096, 32768}};
#else
  return quick ? Grid{{1, 4}, {128, 512}} : Grid{{1, 16}, {512, 2048}};
#endif
}

// One decode step's metadata, in one int32 buffer (one upload on the GPU):
//   block_tables [S, max_blocks] | seq_lens [S] | query_start_loc [S + 1]
struct Meta {
  int num_seqs = 0, max_blocks = 0;
  int64_t num_blocks = 0;      // blocks of a slot's cache: S * max_blocks, all in use
  std::vector<int32_t> host;
  const int32_t* dev = nullptr;  // device copy (CUDA build; freed at exit)

  const int32_t* block_tables(const int32_t* base) const { return base; }
  const int32_t* seq_lens(const int32_t* base) const { return base + int64_t(num_seqs) * max_blocks; }
  const int32_t* query_start(const int32_t* base) const { return seq_lens(base) + num_seqs; }
};

// S sequences of ctx tokens, n_new new tokens each (1: decode; ctx: a whole prompt's prefill);
// block tables a random permutation of the block ids 0 .. S * ceil(ctx / block) - 1 (fixed
// seed per shape).
std::shared_ptr<const Meta> make_meta(int S, int ctx, int n_new = 1) {
  auto m = std::make_shared<Meta>();
  m->num_seqs = S;
  m->max_blocks = (ctx + kBlockSize - 1) / kBlockSize;
  m->num_blocks = int64_t(S) * m->max_blocks;
  std::vector<int32_t> ids(size_t(m->num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(uint64_t(S) * 1000003u + uint64_t(ctx));
  std::shuffle(ids.begin(), ids.end(), rng);
  m->host = ids;
  m->host.insert(m->host.end(), size_t(S), ctx);                     // seq_lens
  for (int s = 0; s <= S; ++s) m->host.push_back(s * n_new);         // query_start_loc
#if defined(__CUDACC__)
  int32_t* d;
  const size_t bytes = m->host.size() * sizeof(int32_t);
  DKB_CUDA_CHECK(cudaMalloc(&d, bytes));
  DKB_CUDA_CHECK(cudaMemcpy(d, m->host.data(), bytes, cudaMemcpyHostToDevice));
  m->dev = d;  // freed at exit
#endif
  return m;
}

// One case: S sequences of ctx tokens, n_new new tokens each (1: decode; ctx: a whole prompt's
// prefill, causal over itself, which the GPU runs on the tensor-core kernel); queries/outputs of
// T, the KV cache of C (T, or fp8 e4m3: half the bytes of bf16; its arena bytes are arbitrary
// codes, NaN ones included, which changes no kernel's cost; scales 1). Bytes: K/V rows + q + out;
// prefill flops: 4 * D per (query head, visible key) pair (q.k and p.v), S * Hq * 2 * D * n (n + 1).
// splits > 0 (CUDA decode): that split-KV count instead of the plan's (the sweep of add_cases).
// variant (CUDA decode, dk::cuda::DecodeKernel): 2 = the tensor-core kernel (decode_tc.cuh; what
// paged_attention runs for half / bf16), 1 = the SIMT kernel with its prefetch, 0 = without (paged.cuh
// PF), for the A/B of add_cases (bf16 only). wgmma (prefill rows): the prefill kernel's warpgroup-MMA variant
// (DECODEKIT_PREFILL_ATTN=wgmma) instead of its mma.sync one.
constexpr int kTensorCoreDecode = 2;
const char* const kVariantName[] = {" simt", " simt-prefetch", ""};
template <class T, class C>
void add_case(std::vector<dkb::Case>& cases, const HeadConfig& hc, int S, int ctx, int n_new = 1, int splits_set = 0,
              int variant = kTensorCoreDecode, bool wgmma = false) {
  const int hq = hc.hq, hk = hc.hk, head = hc.head;
  const double kv_bytes = 2.0 * S * ctx * hk * head * sizeof(C);  // K and V rows read
  if (kv_bytes > kMaxKvBytes) return;
  const std::shared_ptr<const Meta> m = make_meta(S, ctx, n_new);
  const dk::PagedLayout L{hk, kBlockSize, head};
  const int64_t cache_elems = m->num_blocks * hk * kBlockSize * head;
  const int64_t tokens = int64_t(S) * n_new;
  const int64_t q_elems = tokens * hq * head;
  const float scale = 1.0f / std::sqrt(float(head));
  auto carve = [=](char* s, C*& kc, C*& vc, T*& q, T*& out) {
    dkb::Carver c{s};
    kc = c.take<C>(cache_elems);  // [num_blocks, Hk, block_size, D]
    vc = c.take<C>(cache_elems);  // [num_blocks, Hk, block_size, D]
    q = c.take<T>(q_elems);       // [S * n_new, Hq, D]
    out = c.take<T>(q_elems);     // [S * n_new, Hq, D]
    return c.used;
  };
  constexpr bool kFp8 = dk::kIsFp8<C>;
  dkb::Case c;
  c.bench = "paged_attention";
  c.shape = (n_new > 1 ? "prefill S=" + std::to_string(S) + " n=" + std::to_string(n_new) +
                             (ctx != n_new ? " ctx=" + std::to_string(ctx) : "")
                       : "S=" + std::to_string(S) + " ctx=" + std::to_string(ctx)) +
            " heads=" + std::to_string(hq) + "/" + std::to_string(hk) + " d=" + std::to_string(head) +
            (kFp8 ? " kv=fp8" : "") + (wgmma ? " wgmma" : "");
  c.dtype = dkb::DtypeName<T>::value;
  c.bytes = kv_bytes + 2.0 * q_elems * sizeof(T);  // + q read + out written
  // (visible keys: ctx - n_new + 1 + t for new token t)
  if (n_new > 1)
    c.flops = 4.0 * S * hq * head * (double(n_new) * (ctx - n_new) + 0.5 * double(n_new) * double(n_new + 1));
  C *kc, *vc;
  T *q, *out;
  c.slot_bytes = carve(nullptr, kc, vc, q, out);
  const dk::cpu::PagedAttentionParams P{tokens, S, hq, m->max_blocks, int64_t(hq) * head, scale, L};
  c.cpu = [=](char* s) {
    C *kc, *vc;
    T *q, *out;
    carve(s, kc, vc, q, out);
    const int32_t* meta = m->host.data();
    dk::cpu::paged_attention<T, C>(out, nullptr, q, kc, vc, m->block_tables(meta), m->seq_lens(meta),
                                   m->query_start(meta), P);
  };
#if defined(__CUDACC__)
  // split-KV plan and its workspace, as the torch launcher makes them (freed at exit)
  int sms = 132;
  DKB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const bool tc = dk::paged_attention_uses_prefill_kernel(sizeof(T) == 2, head, tokens, S);
  const int splits = tc ? 1 : splits_set > 0 ? splits_set
                                             : dk::paged_attention_num_splits(tokens, hk, hq,
                                                                              int64_t(m->max_blocks) * kBlockSize, sms);
  float* ws = nullptr;
  if (splits > 1)
    DKB_CUDA_CHECK(cudaMalloc(&ws, sizeof(float) * dk::paged_attention_workspace_floats(splits, tokens, hq, head)));
  if (n_new == 1)
    c.shape += " splits=" + std::to_string(splits) + (splits_set > 0 ? " (sweep)" : "") + kVariantName[variant];
  c.gpu = [=](char* s, cudaStream_t st) {
    using D = dkb::cuda_t<T>;
    using DC = std::conditional_t<kFp8, dk::fp8_e4m3_t, D>;
    C *kc, *vc;
    T *q, *out;
    carve(s, kc, vc, q, out);
    const int32_t* meta = m->dev;
    auto run = [&](auto kind) {
      return dk::cuda::paged_attention_variant<D, DC, decltype(kind)::value>(
          reinterpret_cast<D*>(out), nullptr, reinterpret_cast<const D*>(q), int64_t(hq) * head,
          reinterpret_cast<const DC*>(kc), reinterpret_cast<const DC*>(vc), m->block_tables(meta), m->max_blocks,
          m->seq_lens(meta), m->query_start(meta), S, tokens, hq, m->num_blocks, L, scale, dk::KVScales{}, 0, splits,
          ws, st, wgmma);
    };
    using K = dk::cuda::DecodeKernel;
    if constexpr (std::is_same_v<T, dk::bf16_t>) {  // the A/B variants: bf16 only (compile time)
      if (variant == int(K::kSimt)) return run(std::integral_constant<K, K::kSimt>{});
      if (variant == int(K::kSimtPrefetch)) return run(std::integral_constant<K, K::kSimtPrefetch>{});
    }
    return run(std::integral_constant<K, K::kTensorCore>{});
  };
#endif
  cases.push_back(std::move(c));
}

template <class T>
void add_cases(std::vector<dkb::Case>& cases, bool quick) {
#if defined(__CUDACC__)
  // prefill: 4 x 4096 (the target: >= 50% of the bf16 matmul rate) and 1 x 512, fp16/bf16 only; each by mma.sync
  // (the default) and by wgmma
  if constexpr (sizeof(T) == 2)
    for (const HeadConfig& hc : kConfigs)
      for (bool wg : {false, true}) {
        add_case<T, T>(cases, hc, 4, 4096, 4096, 0, kTensorCoreDecode, wg);
        if (!quick) add_case<T, T>(cases, hc, 1, 512, 512, 0, kTensorCoreDecode, wg);
        if (!quick && hc.hq == kConfigs[0].hq)
          add_case<T, dk::fp8_e4m3_t>(cases, hc, 4, 4096, 4096, 0, kTensorCoreDecode, wg);
        // a speculative verification step (5 drafts + 1) over 2048 cached tokens: short sequences, the prefill
        // kernel's 4-warp CTAs; judged by GB/s (the KV read) against the decode rows
        if (!quick) add_case<T, T>(cases, hc, 64, 2048, 6, 0, kTensorCoreDecode, wg);
      }
#endif
#if defined(__CUDACC__)
  // Split-KV sweep, bf16 Llama-3 heads: the 2026-12-04 H200 run had the decode kernel's bandwidth rise
  // with the CTA count (128 CTAs 0.09 of copy, 256 0.21, 512 0.38, 2048 0.40): is the plan's ~2 CTAs
  // per SM (kPlanCtasPerSm) too few for small batches, and what do 64 / 128 splits cost in the merge?
  // With the tensor-core kernel (3 CTAs per SM at head_dim 128) batch 64 x 8 KV heads is 1.3 waves of 512
  // CTAs: do 2-4 splits (more, shorter CTAs) fill the last wave better than the plan's 1?
  if constexpr (std::is_same_v<T, dk::bf16_t>)
    if (!quick) {
      for (int ctx : {4096, 32768})
        for (int S : {1, 8})
          for (int sp : {8, 16, 32, 64, 128})
            if (int64_t(ctx) / sp >= kBlockSize) add_case<T, T>(cases, kConfigs[0], S, ctx, 1, sp);
      for (int sp : {2, 3, 4}) add_case<T, T>(cases, kConfigs[0], 64, 4096, 1, sp);
    }
#endif
  const Grid grid = decode_grid(quick);
  for (const HeadConfig& hc : kConfigs)
    for (int ctx : grid.contexts)
      for (int S : grid.batches) {
        add_case<T, T>(cases, hc, S, ctx);
#if defined(__CUDACC__)
        // decode kernel A/B (tensor-core vs SIMT with / without prefetch), bf16 Llama-3 and SmolLM2 heads:
        // until an H200 run has measured all three
        if constexpr (std::is_same_v<T, dk::bf16_t>)
          for (int v : {0, 1}) {
            add_case<T, T>(cases, hc, S, ctx, 1, 0, v);
            if (hc.hq == kConfigs[0].hq && (S > 1 || ctx >= 4096))
              add_case<T, dk::fp8_e4m3_t>(cases, hc, S, ctx, 1, 0, v);
          }
#endif
        // Llama heads over an fp8 cache too (fp16/bf16 queries): the 1.7x-vs-bf16 target
        if constexpr (sizeof(T) == 2)
          if (hc.hq == kConfigs[0].hq && (S > 1 || ctx >= 4096)) add_case<T, dk::fp8_e4m3_t>(cases, hc, S, ctx);
      }
}

}  // namespace

DKB_BENCH_MAIN("bench_attention", add_cases)
