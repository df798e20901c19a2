"""The offline API:

    from decodekit import LLM, SamplingParams
    llm = LLM()                                   # embedded SmolLM2-135M-Instruct on CPU
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    outs = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0))
    for delta in llm.stream("Once upon a time", SamplingParams(max_tokens=20)): print(delta, end="")
"""
from __future__ import annotations

import dataclasses
import numbers
from collections import deque
from typing import Iterator, Sequence

from decodekit.sampling import SamplingParams
from decodekit.sampling.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from decodekit.tokenizer.chat import check_template, check_template_kwargs

from .args import EngineArgs
from .llm_engine import LLMEngine
from .outputs import RequestOutput


class _Pending:
    """Outputs of one request this LLM added, until its caller takes them."""
    __slots__ = ("last", "deltas")

    def __init__(self, stream: bool):
        self.last: RequestOutput | None = None              # the latest output (finished: the final one)
        self.deltas: deque[str] | None = deque() if stream else None   # stream(): text deltas not yet yielded


class LLM:
    def __init__(self, model: str | None = None, **engine_args):
        self.engine = LLMEngine(EngineArgs(model=model, **engine_args))
        self.tokenizer = self.engine.tokenizer
        # Every generate() / stream() steps the same engine, so one step's outputs can belong to a stream
        # paused in another generator: they wait here for their own caller instead of being dropped.
        self._pending: dict[str, _Pending] = {}

    @property
    def llm_engine(self) -> LLMEngine:  # vLLM's name
        return self.engine

    def shutdown(self) -> None:
        """Stops tensor-parallel workers now (they also stop when the LLM is collected or at exit)."""
        self.engine.shutdown()

    def _add(self, prompt, params, stream: bool = False) -> str:
        rid = self.engine.add_request(None, prompt, params, final_only=not stream)
        self._pending[rid] = _Pending(stream)
        return rid

    def _forget(self, ids) -> None:
        """Drop the requests' buffers, aborting those not finished (their caller went away or failed)."""
        for rid in ids:
            p = self._pending.pop(rid, None)
            if p is not None and not (p.last is not None and p.last.finished):
                self.engine.abort_request(rid)

    def _step(self) -> None:
        """One engine step; its outputs go to their requests' buffers."""
        if not self.engine.has_unfinished_requests():  # never spin on an engine with nothing to do
            raise RuntimeError("the engine has no unfinished requests but an LLM request has not finished: "
                               "its outputs were taken by a direct LLMEngine.step() call")
        for out in self.engine.step():
            p = self._pending.get(out.request_id)
            if p is not None:
                p.last = out
                if p.deltas is not None and out.outputs[0].delta_text:
                    p.deltas.append(out.outputs[0].delta_text)

    def _run(self, prompts: Sequence, params) -> list[RequestOutput]:
        """Runs the prompts to the end; params: one SamplingParams or one per prompt (or BeamSearchParams)."""
        if isinstance(params, SamplingParams) or params is None:
            params = [params] * len(prompts)    # (None: the engine's defaults, fitted to each prompt)
        elif not isinstance(params, (list, tuple)):
            raise ValueError(f"params must be a SamplingParams or a list of them (one per prompt), "
                             f"got {type(params).__name__}")
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        ids = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(self._add(p, sp))
        except Exception:  # a bad prompt or params: none of this call's requests runs
            self._forget(ids)
            if ids:
                self._step()  # the engine hands out (and so forgets) the aborted requests
            raise
        try:
            pend = [self._pending[rid] for rid in ids]
            while not all(p.last is not None and p.last.finished for p in pend):
                self._step()
            return [p.last for p in pend]
        finally:
            self._forget(ids)

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate / chat / stream use without SamplingParams (vLLM's name): SamplingParams() with the
        fields the model's generation config recommends (EngineArgs.generation_config)."""
        return SamplingParams(**self.engine.default_sampling)

    def get_tokenizer(self):  # vLLM's name
        return self.tokenizer

    @staticmethod
    def _params_arg(params, sampling_params, use_tqdm):
        """vLLM's keyword `sampling_params` is the same as `params` (give one); use_tqdm is accepted (no bar)."""
        if sampling_params is not None:
            if params is not None:
                raise ValueError("give the sampling parameters once: params or sampling_params")
            params = sampling_params
        if not isinstance(use_tqdm, bool) and not callable(use_tqdm):
            raise ValueError(f"use_tqdm must be a bool, got {use_tqdm!r}")
        return params

    def generate(self, prompts, params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """prompts: a string, a list of strings, or token-id lists ({"prompt_token_ids": [...]}; also vLLM's
        {"prompt": str}). params (or vLLM's keyword sampling_params): one SamplingParams or one per prompt."""
        params = self._params_arg(params, sampling_params, use_tqdm)
        return self._run(self._prompt_list(prompts), params)

    @staticmethod
    def _prompt_list(prompts) -> list:
        """One prompt (a string, token ids, a prompt dict) or a list of them, as a list."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                and isinstance(prompts[0], numbers.Integral)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of token ids, a {{'prompt_token_ids': [...]}} "
                             f"dict or a list of those, got {type(prompts).__name__}")
        return list(prompts)

    def beam_search(self, prompts, params: BeamSearchParams, *, use_tqdm: bool = False,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """vLLM's beam search (sampling/beam_search.py, engine/beam_group.py): per prompt the
        params.beam_width best hypotheses, best first. prompts: a string, token ids, a
        {"prompt" | "prompt_token_ids": ...} dict, or a list of those; at most concurrency_limit prompts
        are searched at a time (default: all)."""
        self._params_arg(None, None, use_tqdm)
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        params.validate()
        prompts = self._prompt_list(prompts)
        if concurrency_limit is not None and (isinstance(concurrency_limit, bool) or
                                              not isinstance(concurrency_limit, int) or concurrency_limit < 1):
            raise ValueError(f"concurrency_limit must be None or an int >= 1, got {concurrency_limit!r}")
        if params.logprobs is None:  # each sequence's logprobs: per token the step's candidates (vLLM's)
            params = dataclasses.replace(params, logprobs=2 * params.beam_width)
        chunk = concurrency_limit or max(len(prompts), 1)
        outs = []
        for lo in range(0, len(prompts), chunk):
            part = list(prompts[lo:lo + chunk])
            outs += self._run(part, [params] * len(part))
        return [BeamSearchOutput([BeamSearchSequence(
            tokens=o.prompt_token_ids + c.token_ids, logprobs=c.logprobs or [], cum_logprob=c.cumulative_logprob,
            text=c.text, finish_reason=c.finish_reason, stop_reason=c.stop_reason,
            prompt_len=len(o.prompt_token_ids)) for c in o.outputs]) for o in outs]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, tools: list[dict] | None = None,
                            chat_template: str | None = None, chat_template_kwargs: dict | None = None) -> list[int]:
        """The conversation through the chat template (the model's, or `chat_template`), as token ids: the ids
        chat() hands the engine (messages in chat()'s forms); chat_template_kwargs: extra template variables (e.g.
        {"enable_thinking": False} for Qwen3)."""
        return self._chat_ids(self._chat_messages(messages, None), add_generation_prompt, continue_final_message,
                              tools, chat_template, chat_template_kwargs)

    def _chat_ids(self, messages: list[dict], add_generation_prompt: bool, continue_final_message: bool,
                  tools: list[dict] | None, chat_template: str | None, chat_template_kwargs: dict | None) -> list[int]:
        """A conversation in chat_messages' form through the template, as token ids (the template writes the
        special tokens it wants, BOS included: nothing is added, as vLLM's and transformers' chat encoding)."""
        kwargs = check_template_kwargs(chat_template_kwargs)
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  chat_template=check_template(chat_template),
                                                  continue_final_message=continue_final_message,
                                                  max_chars=self.tokenizer.max_prompt_chars(self.engine.max_model_len),
                                                  **({"tools": tools} if tools else {}), **kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def chat(self, messages, params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict] | None = None,
             chat_template: str | None = None, chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """messages: one conversation (list of {role, content}) or a list of conversations.
        continue_final_message: the model continues the last (assistant) message instead of answering it.
        tools: OpenAI-style tool definitions handed to the chat template (as vLLM's LLM.chat; to constrain
        the reply to a tool's parameters, give them as guided_json). chat_template: a Jinja template instead of
        the model's; chat_template_kwargs: extra template variables (vLLM's; e.g. {"documents": [...]})."""
        params = self._params_arg(params, sampling_params, use_tqdm)
        if not isinstance(messages, (list, tuple)):
            raise ValueError(f"messages must be a list of {{'role': str, 'content': str}} dicts (or a list of such "
                             f"conversations), got {type(messages).__name__}")
        if not messages:
            raise ValueError("messages must not be empty: give a conversation (a non-empty list of {'role', "
                             "'content'} dicts) or a non-empty list of conversations")
        one = isinstance(messages[0], dict)
        convs = [messages] if one else list(messages)
        convs = [self._chat_messages(c, None if one else i) for i, c in enumerate(convs)]
        return self._run([self._chat_ids(c, add_generation_prompt, continue_final_message, tools,
                                         chat_template, chat_template_kwargs)
                          for c in convs], params)

    @staticmethod
    def _chat_messages(conv, index: int | None) -> list[dict]:
        """One conversation in the server's form (server/protocol.py chat_messages, as /v1/chat/completions takes
        it): content as a string or a list of {"type": "text", "text": ...} parts, assistant turns with
        tool_calls (content may be None), tool turns with tool_call_id; ValueError naming the message otherwise."""
        from decodekit.server.protocol import APIError, chat_messages
        try:
            return chat_messages({"messages": list(conv) if isinstance(conv, tuple) else conv})
        except APIError as e:
            where = "" if index is None else f"conversation {index}: "
            raise ValueError(f"{where}{e.message}") from None

    def stream(self, prompt, params: SamplingParams | None = None, *,
               sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yields text deltas of one request as they are generated (other queued requests advance too;
        their outputs wait for their own callers)."""
        params = self._params_arg(params, sampling_params, False)
        rid = self._add(prompt, params, stream=True)
        p = self._pending[rid]
        try:
            while True:
                while p.deltas:
                    yield p.deltas.popleft()
                if p.last is not None and p.last.finished:
                    return
                self._step()
        finally:
            self._forget([rid])
