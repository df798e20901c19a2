// CPU launchers for rejection_sample, gumbel_argmax, argmax_rows and sort_desc_stable (the rules in
// include/decodekit/sampling/rejection.h, gumbel_max.h, argmax.h and sort_desc.h).
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "decodekit/sampling/argmax.h"
#include "decodekit/sampling/gumbel_max.h"
#include "decodekit/sampling/rejection.h"
#include "decodekit/sampling/sort_desc.h"

namespace {

void rejection_sample_cpu(at::Tensor& out,                         // [B, k+1] int64
                          at::Tensor& num_emitted,                 // [B] int32
                          const at::Tensor& draft_tokens,          // [B, k] int64
                          const at::Tensor& num_draft,             // [B] int32
                          const std::optional<at::Tensor>& draft_probs,  // [B, k, V] float32
                          const at::Tensor& target_probs,          // [B, k+1, V] float32
                          const at::Tensor& seeds,                 // [B] int64
                          const at::Tensor& positions,             // [B] int64
                          bool greedy) {
  const char* op = "decodekit::rejection_sample";
  const dk::SpecArgs a = dk::rejection_sample_args(out, num_emitted, draft_tokens, num_draft, draft_probs,
                                                   target_probs, seeds, positions);
  const int32_t* nd = num_draft.data_ptr<int32_t>();
  for (int64_t b = 0; b < a.B; ++b)
    TORCH_CHECK(nd[b] >= 0 && nd[b] <= a.k, op, ": 'num_draft'[", b, "] = ", nd[b], " is outside [0, k = ", a.k, "]");
  const int64_t* draft = draft_tokens.data_ptr<int64_t>();
  const float* p = target_probs.data_ptr<float>();
  const float* q = draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr;
  const int64_t* seed = seeds.data_ptr<int64_t>();
  const int64_t* pos = positions.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  int32_t* ne = num_emitted.data_ptr<int32_t>();
  const int64_t k = a.k, V = a.V;
  DK_OMP_PARALLEL_FOR_IF(a.B > 1 && a.B * (k + 1) * V >= dk::kParallelGrain)  // (one request: no team to wake)
  for (int64_t b = 0; b < a.B; ++b) {
    const float* pb = p + b * (k + 1) * V;
    const float* qb = q ? q + b * k * V : nullptr;
    int64_t* ob = o + b * (k + 1);
    for (int64_t i = 0; i <= k; ++i) ob[i] = -1;
    ne[b] = dk::spec_verify(draft + b * k, nd[b], [&](int i, int64_t v) { return pb[i * V + v]; },
                            [&](int i, int64_t v) { return qb[i * V + v]; }, qb != nullptr, V, uint64_t(seed[b]),
                            uint64_t(pos[b]), greedy, ob);
  }
}

void gumbel_argmax_cpu(at::Tensor& out,               // [B] int64
                       const at::Tensor& scores,      // [B, V] float32, row stride free
                       const at::Tensor& seeds,       // [B] int64
                       const at::Tensor& positions,   // [B] int64
                       int64_t stream) {
  const dk::GumbelArgs a = dk::gumbel_argmax_args(out, scores, seeds, positions, stream);
  const float* x = scores.data_ptr<float>();
  const int64_t* seed = seeds.data_ptr<int64_t>();
  const int64_t* pos = positions.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  DK_OMP_PARALLEL_FOR_IF(a.B > 1 && a.B * a.V >= dk::kParallelGrain)
  for (int64_t b = 0; b < a.B; ++b)
    o[b] = dk::gumbel_argmax_row(x + b * a.row_stride, a.V, uint64_t(seed[b]), uint64_t(pos[b]), a.stream);
}

void argmax_rows_cpu(at::Tensor& out,            // [B] int64
                     const at::Tensor& scores) {  // [B, V] float32, row stride free
  const dk::ArgmaxArgs a = dk::argmax_rows_args(out, scores);
  const float* x = scores.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  DK_OMP_PARALLEL_FOR_IF(a.B > 1 && a.B * a.V >= dk::kParallelGrain)
  for (int64_t b = 0; b < a.B; ++b) o[b] = dk::argmax_row(x + b * a.row_stride, a.V);
}

void sort_desc_stable_cpu(at::Tensor& values,     // [B, V] float32
                          at::Tensor& indices,    // [B, V] int64
                          const at::Tensor& x) {  // [B, V] float32, row stride free
  const dk::SortArgs a = dk::sort_desc_stable_args(values, indices, x);
  if (a.B == 0 || a.V == 0) return;
  dk::cpu::sort_desc_stable(values.data_ptr<float>(), indices.data_ptr<int64_t>(), x.data_ptr<float>(), a.row_stride,
                            a.B, a.V);
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) {
  m.impl("rejection_sample", &rejection_sample_cpu);
  m.impl("gumbel_argmax", &gumbel_argmax_cpu);
  m.impl("argmax_rows", &argmax_rows_cpu);
  m.impl("sort_desc_stable", &sort_desc_stable_cpu);
}
