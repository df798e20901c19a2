"""Speculative decoding's drafters (issue 6): n-gram / prompt lookup, layer-skip and draft model
(drafters.py), the adaptive draft length (adaptive.py). The engine side (proposing, verifying with
decodekit.ops.rejection_sample, rollback) is decodekit.engine.spec_decode."""
from .adaptive import AdaptiveK, StepCostModel
from .drafters import ModelDrafter, NgramDrafter
from .ngram import NgramProposer

__all__ = ["AdaptiveK", "ModelDrafter", "NgramDrafter", "NgramProposer", "StepCostModel"]
