"""Sampling: per-request parameters, the Philox RNG and the batched sampler."""
from .guided import GuidedDecodingParams, StructuredOutputsParams
from .params import SamplingParams, SamplingParamsError
from .philox import derive_seed, philox4x32, token_gumbel, token_uniforms, uniform
from .sampler import (Sampler, SamplerOutput, SamplingMetadata, apply_penalties,
                      apply_top_k_top_p_min_p, draw_seed, request_seeds, set_global_seed)

__all__ = [
    "SamplingParams", "SamplingParamsError", "StructuredOutputsParams", "GuidedDecodingParams", "Sampler", "SamplerOutput", "SamplingMetadata",
    "apply_penalties", "apply_top_k_top_p_min_p", "draw_seed", "request_seeds",
    "set_global_seed", "derive_seed", "philox4x32", "token_gumbel", "token_uniforms", "uniform",
]
