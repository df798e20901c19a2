"""Beam search in the server (vLLM's use_beam_search: n beams, length_penalty): request fields to
BeamSearchParams, and BeamSearchStream, a search over one prompt that drives the engine one step at a time
and looks like a RequestStream to the endpoints (one final output with the n best hypotheses, best first)."""
from __future__ import annotations

import asyncio
import time

from decodekit.engine.outputs import CompletionOutput, Logprob, RequestOutput
from decodekit.sampling import SamplingParams, SamplingParamsError
from decodekit.sampling.beam_search import BeamSearch, BeamSearchParams, beam_conflicts

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
                                include_stop_str_in_output=params.include_stop_str_in_output
                                ).validate(max_logprobs=P.MAX_LOGPROBS)
    except SamplingParamsError as e:
        name = "n" if e.field == "beam_width" else e.field
        raise P.APIError(400, f"'{name}'{' (the beam width)' if name == 'n' else ''} {e.message}", name) from None


def _user_logprobs(table: dict, tid: int, top: int) -> dict:
    """A step's candidate table cut to the caller's top-N (and the chosen token)."""
    return {t: Logprob(x.logprob, x.rank, x.decoded_token) for t, x in table.items()
            if t == tid or (x.rank is not None and x.rank <= top)}


class BeamSearchStream:
    """One prompt's beam search over the async engine (AsyncEngine or EngineProcess). `open` runs the
    first step's requests (so a rejected prompt is an error of the caller's start); iterating yields one
    finished RequestOutput; abort() stops the search and its in-flight requests."""

    def __init__(self, aeng, request_id: str, search: BeamSearch, logprobs: int | None, tokenizer):
        self.aeng, self.request_id, self.search, self.tokenizer = aeng, request_id, search, tokenizer
        self.logprobs = logprobs
        self.step = search.params.step_params(logprobs)
        self.finished = False
        self._live: list = []
        self._task: asyncio.Future | None = None
        self._metrics = {"arrival": time.monotonic(), "prompt_tokens": search.prompt_len}
        self._cached = 0

    @classmethod
    async def open(cls, aeng, request_id: str, prompt_ids: list[int], params: BeamSearchParams,
                   logprobs: int | None, eos_token_ids, max_model_len: int, tokenizer) -> "BeamSearchStream":
        try:
            search = BeamSearch(prompt_ids, params, eos_token_ids, max_model_len)
        except SamplingParamsError as e:  # the prompt (empty, too long for max_tokens): the endpoint's 400
            raise ValueError(str(e)) from None
        s = cls(aeng, request_id, search, logprobs, tokenizer)
        await s._submit()
        s._task = asyncio.ensure_future(s._run())
        return s

    async def _submit(self) -> None:
        live = []
        try:
            for j, b in enumerate(self.search.beams):
                live.append(await self.aeng.add(f"{self.request_id}-s{self.search.steps}b{j}",
                                                {"prompt_token_ids": b.tokens}, self.step))
        except BaseException:
            for r in live:
                r.abort()
            raise
        self._live = live

    async def _run(self) -> RequestOutput:
        while True:
            outs = await asyncio.gather(*(r.final() for r in self._live))
            self._live = []
            if self.search.steps == 0:
                self._metrics["first_scheduled"] = outs[0].metrics.get("first_scheduled")
                self._metrics["first_token"] = time.monotonic()
                self._cached = outs[0].num_cached_tokens
            self.search.advance([o.outputs[0].logprobs[0] for o in outs])
            if self.search.done:
                break
            await self._submit()
        self._metrics["finished"] = time.monotonic()
        return self._output()

    def _output(self) -> RequestOutput:
        res = self.search.result(self.tokenizer)
        comps = []
        for i, s in enumerate(res.sequences):
            gen = s.generated_token_ids
            lps = None
            if self.logprobs is not None:
                lps = [_user_logprobs(t, tid, self.logprobs) for t, tid in zip(s.logprobs, gen)]
            comps.append(CompletionOutput(index=i, text=s.text, token_ids=gen, cumulative_logprob=s.cum_logprob,
                                          logprobs=lps, finish_reason=s.finish_reason, stop_reason=s.stop_reason,
                                          delta_text=s.text, delta_token_ids=list(gen)))
        return RequestOutput(self.request_id, None, list(self.search.prompt_token_ids), comps, finished=True, num_cached_tokens=self._cached, metrics=self._metrics)

    def __aiter__(self):
        return self._iter()

    async def _iter(self):
        try:
            if not self.finished:
                out = await self._task
                self.finished = True
                yield out
        finally:
            self.abort()

    async def final(self) -> RequestOutput:
        last = None
        async for out in self:
            last = out
        return last

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            if self._task is not None and not self._task.done():
                self._task.cancel()
                self._task.add_done_callback(lambda t: t.cancelled() or t.exception())
            for r in self._live:
                r.abort()
            self._live = []
