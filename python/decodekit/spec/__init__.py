"""Speculative decoding (issue 6): drafters that propose tokens for the target model to verify with
the exact rejection_sample op (decodekit.ops.rejection_sample). So far: the n-gram / prompt-lookup
drafter."""
from .ngram import NgramProposer

__all__ = ["NgramProposer"]
