"""Beam search in the server (vLLM's use_beam_search: n beams, length_penalty): the request's fields as
BeamSearchParams, which the endpoints hand to the engine in place of SamplingParams (one final output with
the n best hypotheses, best first; engine/beam_group.py)."""
from __future__ import annotations

from decodekit.sampling import SamplingParams, SamplingParamsError
from decodekit.sampling.beam_search import BeamSearchParams, beam_conflicts

from . import protocol as P


def beam_params(body: dict, params: SamplingParams) -> BeamSearchParams | None:
    """use_beam_search: the request's BeamSearchParams (n beams); None without it. A 400 names a field the
    search cannot honour (stop strings, penalties, guides / tools, token controls, prompt_logprobs)."""
    if not P.field(body, "use_beam_search", "bool", False):
        P.field(body, "length_penalty", "number", 1.0)  # typed even when unused
        return None
    for name in beam_conflicts(params):  # (prompt_logprobs: the endpoints check it)
        if name.startswith("guided_") or name in ("structured_outputs", "guided_decoding"):
            tools_forced = body.get("tools") and body.get("tool_choice") not in (None, "none", "auto")
            name = "tool_choice" if tools_forced else (P.guide_source(body) or name)
        raise P.APIError(400, f"'{name}' is not supported with use_beam_search", name)
    try:
        return BeamSearchParams(beam_width=params.n, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
                                temperature=params.temperature,
                                length_penalty=P.field(body, "length_penalty", "number", 1.0),
                                include_stop_str_in_output=params.include_stop_str_in_output,
                                logprobs=params.logprobs, truncate_prompt_tokens=params.truncate_prompt_tokens
                                ).validate(max_logprobs=P.MAX_LOGPROBS)
    except SamplingParamsError as e:
        name = "n" if e.field == "beam_width" else e.field
        raise P.APIError(400, f"'{name}'{' (the beam width)' if name == 'n' else ''} {e.message}", name) from None
