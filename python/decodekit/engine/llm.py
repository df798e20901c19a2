"""The offline API:

    from decodekit import LLM, SamplingParams
    llm = LLM()                                   # embedded SmolLM2-135M-Instruct on CPU
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    outs = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0))
    for delta in llm.stream("Once upon a time", SamplingParams(max_tokens=20)): print(delta, end="")
"""
from __future__ import annotations

from typing import Iterator, Sequence

from decodekit.sampling import SamplingParams

from .args import EngineArgs
from .llm_engine import LLMEngine
from .outputs import RequestOutput


class LLM:
    def __init__(self, model: str | None = None, **engine_args):
        self.engine = LLMEngine(EngineArgs(model=model, **engine_args))
        self.tokenizer = self.engine.tokenizer

    @property
    def llm_engine(self) -> LLMEngine:  # vLLM's name
        return self.engine

    def shutdown(self) -> None:
        """Stops tensor-parallel workers now (they also stop when the LLM is collected or at exit)."""
        self.engine.shutdown()

    def _run(self, prompts: Sequence, params) -> list[RequestOutput]:
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        ids = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(self.engine.add_request(None, p, sp))
        except Exception:
            for rid in ids:
                self.engine.abort_request(rid)
            while self.engine.has_unfinished_requests():
                self.engine.step()
            raise
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]

    def generate(self, prompts, params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """prompts: a string, a list of strings, or token-id lists ({"prompt_token_ids": [...]})."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run(list(prompts), params)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def chat(self, messages, params: SamplingParams | Sequence[SamplingParams] | None = None
             ) -> list[RequestOutput]:
        """messages: one conversation (list of {role, content}) or a list of conversations."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        return self._run([self.apply_chat_template(c) for c in convs], params)

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yields text deltas of one request as they are generated (other queued requests advance too)."""
        rid = self.engine.add_request(None, prompt, params or SamplingParams())
        try:
            finished = False
            while not finished:
                for out in self.engine.step():
                    if out.request_id == rid:
                        if out.outputs[0].delta_text:
                            yield out.outputs[0].delta_text
                        finished = out.finished
        finally:
            if not finished:
                self.engine.abort_request(rid)
