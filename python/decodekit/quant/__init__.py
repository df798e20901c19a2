"""Quantized weight formats and converters (issue 5). So far: INT4 weight-only (W4A16) in the
group-split layout of include/decodekit/gemm/int4.h, from and to GGUF Q4_0 / Q4_1, 4-bit GPTQ
(incl. act-order) and AWQ checkpoints, and INT8 weight-only (GGUF Q8_0)."""
from .gptq import from_awq, from_gptq, to_awq, to_gptq
from .int4 import Int4Weight, from_gguf_q4_0, from_gguf_q4_1, quantize_rtn, to_gguf_q4_1
from .int8 import Int8Weight, from_gguf_q8_0, quantize_int8, to_gguf_q8_0

__all__ = ["Int4Weight", "Int8Weight", "from_awq", "from_gguf_q4_0", "from_gguf_q4_1", "from_gguf_q8_0", "from_gptq",
           "quantize_rtn", "to_awq", "to_gguf_q4_1", "to_gguf_q8_0", "to_gptq"]
