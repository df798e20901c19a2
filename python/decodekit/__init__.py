"""decodekit: an LLM inference engine for NVIDIA Hopper that also runs correctly on CPU.

Importing the package loads the native library ``decodekit._C``, which registers the ops
under ``torch.ops.decodekit``; ``decodekit.ops`` has typed wrappers and the references.

    from decodekit import LLM, SamplingParams
"""
import torch  # noqa: F401  (the native library links against torch)

from . import _C  # noqa: F401  registers torch.ops.decodekit.*
from . import ops  # noqa: F401

__version__ = "0.1.0"


def has_cuda_kernels() -> bool:
    """True when this build registered CUDA kernels (built with DECODEKIT_CUDA=1)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("decodekit::rms_norm", "CUDA")


def __getattr__(name):  # lazy: the engine pulls in the loader/tokenizer stack
    if name in ("LLM", "LLMEngine", "EngineArgs"):
        from . import engine
        from .engine import llm, llm_engine, args
        return {"LLM": llm.LLM, "LLMEngine": llm_engine.LLMEngine, "EngineArgs": args.EngineArgs}[name]
    if name == "SamplingParams":
        from .sampling import SamplingParams
        return SamplingParams
    if name in ("StructuredOutputsParams", "GuidedDecodingParams"):
        from .sampling import guided
        return getattr(guided, name)
    if name in ("BeamSearchParams", "BeamSearchOutput", "BeamSearchSequence"):
        from .sampling import beam_search
        return getattr(beam_search, name)
    raise AttributeError(name)
