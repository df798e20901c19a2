// CPU launcher for rotary_embedding (kernel in include/decodekit/rope.h).
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "decodekit/rope.h"

namespace {

void rotary_embedding_cpu(const at::Tensor& positions,           // [num_tokens] int64
                          at::Tensor& query,                     // [num_tokens, Hq * D] or [num_tokens, Hq, D]
                          const std::optional<at::Tensor>& key,  // [num_tokens, Hk * D] or [num_tokens, Hk, D]
                          const at::Tensor& cos_sin_cache,       // [max_position, rot_dim] float32
                          int64_t head_size, bool is_neox) {
  const dk::RopeArgs a = dk::rotary_embedding_args(positions, query, key, cos_sin_cache, head_size, is_neox);
  const int64_t* pos = positions.data_ptr<int64_t>();
  // Out-of-range positions would read outside the cache: checked here (cheap on the host).
  for (int64_t t = 0; t < a.num_tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < a.max_position, "decodekit::rotary_embedding: 'positions'[", t, "] = ", pos[t],
                " is outside [0, max_position=", a.max_position, ")");
  DK_CPU_DISPATCH_FLOATING(query.scalar_type(), "decodekit::rotary_embedding", [&] {
    scalar_t* k = key.has_value() ? dk_ptr<scalar_t>(*key) : nullptr;
    dk::cpu::rotary_embedding<scalar_t>(pos, dk_ptr<scalar_t>(query), a.q_token_stride, a.q_head_stride, a.num_q_heads,
                                        k, a.k_token_stride, a.k_head_stride, a.num_kv_heads,
                                        cos_sin_cache.data_ptr<float>(), a.rot_dim, is_neox, a.num_tokens);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) { m.impl("rotary_embedding", &rotary_embedding_cpu); }
