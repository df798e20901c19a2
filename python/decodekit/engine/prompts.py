"""Prompt admission shared by the engine and the server: encoding a text prompt within the context's limits and
SamplingParams.truncate_prompt_tokens."""
from __future__ import annotations

from decodekit.sampling import SamplingParamsError
from decodekit.sampling.params import _show


def truncate_prompt(ids: list[int], k: int | None, max_model_len: int, max_tokens: int | None) -> list[int]:
    """SamplingParams.truncate_prompt_tokens: the prompt's last k tokens (-1: as many as fit before
    max_tokens); SamplingParamsError past max_model_len."""
    if k is None:
        return ids
    if k > max_model_len or (k < 1 and k != -1):
        raise SamplingParamsError("truncate_prompt_tokens", f"must be -1 or in [1, max_model_len={max_model_len}], "
                                                            f"got {_show(k)}")
    keep = max(1, max_model_len - (max_tokens or 1)) if k == -1 else k
    return ids[-keep:] if len(ids) > keep else ids


def encode_prompt(tokenizer, prompt: str, max_model_len: int, vocab_size: int) -> list[int]:
    """A text prompt's token ids; ValueError (message "prompt: ...") for text that cannot fit in
    max_model_len (refused by its length alone, without spending seconds encoding megabytes), invalid
    Unicode, or ids past the embedding. Thread-safe: the server calls it off its event loop (also with an
    engine in another process, whose tokenizer it holds)."""
    limit = tokenizer.max_prompt_chars(max_model_len)
    if len(prompt) > limit:
        raise ValueError(f"prompt: {len(prompt)} characters cannot fit in max_model_len={max_model_len} "
                         f"tokens (at most {limit} characters could)")
    ids = tokenizer.encode(prompt, add_special_tokens=True)
    if ids and max(ids) >= vocab_size:  # a tokenizer with more ids than the embedding has rows (loader warned)
        raise ValueError(f"prompt: encodes to token id {max(ids)}, past the model's embedding (ids must be "
                         f"in [0, {vocab_size})): the tokenizer has tokens the weights do not")
    return ids
