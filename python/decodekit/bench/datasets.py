"""Benchmark prompts shared by `decodekit bench latency/throughput` and `bench serve`: a ShareGPT-format
JSON (or a JSON list of strings) read once, and random token-id prompts."""
from __future__ import annotations

import json
import random


def dataset_pairs(path: str) -> list[tuple[str, str]]:
    """(prompt, reference answer or "") per usable item: ShareGPT {"conversations": [{"value": q},
    {"value": a}, ...]} items, or plain strings (no answer)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"argument --dataset: no such file {path!r}") from None
    except (OSError, ValueError) as e:  # a directory, unreadable, not JSON, not UTF-8
        raise ValueError(f"argument --dataset: cannot read {path!r} as JSON ({getattr(e, 'strerror', None) or e})") \
            from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset {path}: expected a JSON list (ShareGPT format or strings)")
    pairs = []
    for item in data:
        if isinstance(item, str):
            pairs.append((item, ""))
        elif isinstance(item, dict) and isinstance(item.get("conversations"), list) and item["conversations"]:
            conv = item["conversations"]
            q = conv[0].get("value", "") if isinstance(conv[0], dict) else ""
            a = conv[1].get("value", "") if len(conv) > 1 and isinstance(conv[1], dict) else ""
            pairs.append((q, a))
    pairs = [(q, a) for q, a in pairs if q]
    if not pairs:
        raise ValueError(f"--dataset {path}: no prompts found")
    return pairs


def random_token_prompts(rng: random.Random, n: int, length: int, vocab: int) -> list[list[int]]:
    """n prompts of `length` random token ids, avoiding the special ids at the start of the vocabulary."""
    lo = min(100, vocab // 2)
    return [[rng.randrange(lo, vocab) for _ in range(length)] for _ in range(n)]
