"""Model definitions. All supported architectures share the Llama graph."""
from .llama import AttentionMetadata, LlamaModel

__all__ = ["AttentionMetadata", "LlamaModel"]
