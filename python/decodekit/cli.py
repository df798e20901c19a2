"""The `decodekit` command line.

    decodekit generate "prompt"   complete a prompt (default: the embedded SmolLM2-135M-Instruct)
    decodekit chat                interactive chat that streams tokens
    decodekit serve               OpenAI-compatible HTTP server (decodekit.server)
    decodekit bench latency|throughput   offline engine benchmarks; bench serve: against a live server
    decodekit plan                capacity planner (roofline: TP/PP/replicas, KV capacity, Pareto front)
    decodekit demo                run every op against its float64 reference and time it
    decodekit info                what this build contains (CPU / CUDA kernels, versions)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time


def _info(args) -> int:
    import torch

    import decodekit
    print(f"decodekit {decodekit.__version__}  torch {torch.__version__}  python {sys.version.split()[0]}")
    print(f"CPU kernels: yes   CUDA kernels: {'yes' if decodekit.has_cuda_kernels() else 'no'}   "
          f"GPU visible: {torch.cuda.is_available()}")
    ops = sorted({n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("decodekit::")})
    # decoder_layer is registered for CUDA in every build (it only calls the other ops), so the mark is shown
    # only where this build has CUDA kernels at all
    cuda = decodekit.has_cuda_kernels()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    print(f"ops ({len(ops)}; * = has a CUDA kernel):",
          ", ".join(o + ("*" if cuda and has(f"decodekit::{o}", "CUDA") else "") for o in ops))
    return 0


def _demo(args) -> int:
    """Runs each op once on fresh random inputs, checks it against the float64 reference
    and prints its time next to the pure-PyTorch reference's (until the engine lands,
    this is the demo the README runs)."""
    import torch

    from decodekit import ops
    from decodekit.ops import reference as ref

    device = args.device
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    g = torch.Generator().manual_seed(args.seed)
    T, H = args.tokens, 576  # SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, MLP 1536
    x = torch.randn(T, H, generator=g).to(dtype).to(device)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(dtype).to(device)
    r = torch.randn(T, H, generator=g).to(dtype).to(device)
    qkv = torch.randn(T, (9 + 6) * 64, generator=g).to(dtype).to(device)
    gate_up = torch.randn(T, 2 * 1536, generator=g).to(dtype).to(device)
    pos = torch.arange(T, device=device)
    cache = ref.rope_cos_sin_cache(max(T, 1), 64, theta=100000.0).to(device)

    def timed(fn, reps=20):
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps * 1e6

    rows = []

    def check(name, got, want, fn_op, fn_ref):
        err = ((got.double() - want.double()).norm() / want.double().norm()).item()
        rows.append((name, err, timed(fn_op), timed(fn_ref)))

    check("rms_norm", ops.rms_norm(x, w), ref.rms_norm(x.double(), w.double(), 1e-6),
          lambda: ops.rms_norm(x, w), lambda: ref.rms_norm(x, w, 1e-6))
    xs, rs = x.clone(), r.clone()
    want, _ = ref.fused_add_rms_norm(x.double(), r.double(), w.double(), 1e-6)
    ops.fused_add_rms_norm(xs, rs, w)
    check("fused_add_rms_norm", xs, want, lambda: ops.fused_add_rms_norm(x.clone(), r.clone(), w),
          lambda: ref.fused_add_rms_norm(x, r, w, 1e-6))
    q, k = qkv[:, :576].clone(), qkv[:, 576:768].clone()
    wq, wk = ref.rotary_embedding(pos, q.double(), k.double(), cache.double(), 64, True)
    ops.rotary_embedding(pos, q, k, cache, 64, True)
    check("rotary_embedding", torch.cat([q, k], 1), torch.cat([wq, wk], 1),
          lambda: ops.rotary_embedding(pos, q, k, cache, 64, True),
          lambda: ref.rotary_embedding(pos, q, k, cache, 64, True))
    check("silu_and_mul", ops.silu_and_mul(gate_up), ref.silu_and_mul(gate_up.double()),
          lambda: ops.silu_and_mul(gate_up), lambda: ref.silu_and_mul(gate_up))

    print(f"decodekit ops on {device}, {args.dtype}, {T} tokens at SmolLM2-135M sizes")
    print(f"{'op':<20} {'rel. error':>11} {'decodekit us':>13} {'torch ref us':>13} {'speed-up':>9}")
    for name, err, t_op, t_ref in rows:
        print(f"{name:<20} {err:>11.2e} {t_op:>13.1f} {t_ref:>13.1f} {t_ref / t_op:>8.1f}x")
    bad = [n for n, e, *_ in rows if not e < {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]]
    if bad:
        print("MISMATCH vs reference:", ", ".join(bad))
        return 1
    print("all ops match the float64 reference")
    return 0


def _logit_bias(text: str) -> tuple[int, float]:
    """--logit-bias ID=BIAS"""
    tid, sep, bias = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(tid), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID=BIAS (e.g. 1000=-100), got {text!r}") from None


# Sampling flags left out take the model's recommendation (its generation config: EngineArgs.generation_config,
# --generation-config vllm for none), then these; generate's temperature stays 0 (greedy) unless given.
_CLI_SAMPLING_DEFAULTS = {"max_tokens": 128, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
_MODEL = "the model's generation config, else"


def _sampling_args(p: argparse.ArgumentParser, temperature: float, model_temperature: bool) -> None:
    """model_temperature: a missing --temperature takes the model's recommended one (chat), else `temperature`."""
    g = p.add_argument_group("sampling (options left out: the model's generation config, else the defaults shown)")
    g.add_argument("--max-tokens", type=int, default=None,
                   help=f"tokens to generate at most (default: {_MODEL} 128)")
    g.add_argument("--temperature", type=float, default=None,
                   help=f"0 = greedy (default: {_MODEL + ' ' if model_temperature else ''}{temperature})")
    p.set_defaults(cli_temperature=temperature, model_temperature=model_temperature)
    g.add_argument("--top-p", type=float, default=None, help=f"nucleus sampling mass (default: {_MODEL} 1.0 = off)")
    g.add_argument("--top-k", type=int, default=None,
                   help=f"keep the k most likely tokens (default: {_MODEL} -1 = off)")
    g.add_argument("--min-p", type=float, default=None,
                   help=f"drop tokens below min_p * p_max (default: {_MODEL} 0 = off)")
    g.add_argument("--repetition-penalty", type=float, default=None,
                   help=f"HF-style repetition penalty (default: {_MODEL} 1)")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI presence penalty (default 0)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI frequency penalty (default 0)")
    g.add_argument("--sample-seed", type=int, default=None, help="per-request seed: same seed, same tokens")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--bad-word", action="append", default=None, dest="bad_words",
                   help="a word never to generate (repeatable; vLLM's bad_words)")
    g.add_argument("--logit-bias", action="append", default=None, type=_logit_bias, metavar="ID=BIAS",
                   help="add BIAS (in [-100, 100]) to token ID's logit (repeatable)")
    g.add_argument("--guided-choice", action="append", default=None,
                   help="the output is one of these strings (repeatable; vLLM's guided_choice)")
    g.add_argument("--guided-regex", default=None, help="the output fully matches this regular expression")
    g.add_argument("--guided-json", default=None, metavar="SCHEMA",
                   help="the output is JSON valid under this JSON schema (its text, or @FILE)")
    g.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    g.add_argument("--guided-grammar", default=None, metavar="GBNF",
                   help="the output is a string of this GBNF grammar's root rule (its text, or @FILE)")
    g.add_argument("--n", type=int, default=1, help="samples per prompt (generate only)")
    g.add_argument("--logprobs", type=int, default=None,
                   help="print the top-N logprobs of each token (generate only; printed with the finished text, so "
                        "it implies --no-stream)")


def _schema_arg(text: str | None, option: str = "--guided-json"):
    """--guided-json / --guided-grammar: the text, or @FILE holding it."""
    if text is None or not text.startswith("@"):
        return text
    try:
        with open(text[1:], encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{option}: cannot read {text[1:]!r}: {e.strerror}") from None


def _params(args, defaults: dict | None = None):
    """The flags' SamplingParams; flags left out take `defaults` (the engine's default_sampling), then the CLI's."""
    from decodekit.sampling import SamplingParams
    d = dict(defaults or {})
    if not args.model_temperature:
        d.pop("temperature", None)

    def pick(name: str):
        v = getattr(args, name)
        return v if v is not None else d.get(name, args.cli_temperature if name == "temperature"
                                             else _CLI_SAMPLING_DEFAULTS[name])
    return SamplingParams(guided_choice=args.guided_choice, guided_regex=args.guided_regex,
                          guided_json=_schema_arg(args.guided_json), guided_json_object=args.json_object,
                          guided_grammar=_schema_arg(args.guided_grammar, "--guided-grammar"),
                          n=args.n, temperature=pick("temperature"), top_p=pick("top_p"), top_k=pick("top_k"),
                          min_p=pick("min_p"), repetition_penalty=pick("repetition_penalty"),
                          presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                          seed=args.sample_seed, stop=args.stop, max_tokens=pick("max_tokens"),
                          logprobs=args.logprobs, bad_words=args.bad_words,
                          logit_bias=dict(args.logit_bias) if args.logit_bias else None)


def _engine(args):
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm import LLM
    return LLM(**vars(EngineArgs.from_cli(args)))


def _beam_params(args, params):
    """--beam-width / --length-penalty: BeamSearchParams (None without --beam-width)."""
    from decodekit.sampling import SamplingParamsError
    from decodekit.sampling.beam_search import BeamSearchParams, beam_conflicts
    if args.beam_width is None:
        if args.length_penalty is not None:
            raise ValueError("argument --length-penalty: needs --beam-width")
        return None
    bad = beam_conflicts(params) + (["n"] if params.n != 1 else [])
    if bad:
        flag = {"guided_json_object": "json-object", "bad_words": "bad-word"}.get(bad[0], bad[0].replace("_", "-"))
        raise ValueError(f"argument --beam-width: not with --{flag} (beam search has no stop strings, penalties, "
                         f"token controls, guides nor samples)")
    try:
        return BeamSearchParams(beam_width=args.beam_width, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
                                length_penalty=1.0 if args.length_penalty is None else args.length_penalty,
                                logprobs=params.logprobs)
    except SamplingParamsError as e:
        raise ValueError(f"argument --{e.field.replace('_', '-')}: {e.message}") from None


def _print_logprobs(token_ids, logprobs) -> None:
    """--logprobs: per generated token its id and {token: logprob} table."""
    for tok, lp in zip(token_ids, logprobs):
        top = ", ".join(f"{v.decoded_token!r}:{v.logprob:.2f}" for v in lp.values())
        print(f"  {tok}: {top}")


def _template_kwargs(args) -> dict:
    """--chat-template-kwargs: a JSON object of template variables (checked as the server checks them)."""
    from decodekit.tokenizer.chat import check_template_kwargs
    if args.chat_template_kwargs is None:
        return {}
    try:
        value = json.loads(args.chat_template_kwargs)
    except ValueError as e:
        raise ValueError(f"argument --chat-template-kwargs: not JSON ({e})") from None
    try:
        return check_template_kwargs(value)
    except ValueError as e:
        raise ValueError(f"argument --chat-template-kwargs: {e}") from None


def _generate(args) -> int:
    params = _params(args)      # (the flags checked before the model loads)
    beam = _beam_params(args, params)
    llm = _engine(args)
    params = _params(args, llm.engine.default_sampling)
    prompts = args.prompt or ["The three laws of thermodynamics are"]
    kwargs = _template_kwargs(args)
    if args.chat_template:
        prompts = [{"prompt_token_ids": llm.apply_chat_template([{"role": "user", "content": p}],
                                                                chat_template_kwargs=kwargs)} for p in prompts]
    elif kwargs:
        raise ValueError("argument --chat-template-kwargs: needs --chat-template")
    t0 = time.perf_counter()
    if beam is not None:
        from decodekit.sampling.beam_search import beam_score
        eos = set(llm.engine.eos_token_ids)
        for i, out in enumerate(llm.beam_search(prompts, beam)):
            for j, s in enumerate(out.sequences):
                print(f"--- prompt {i} beam {j} ({s.finish_reason}, score {beam_score(s, eos, beam.length_penalty):.4f}, "
                      f"cum_logprob {s.cum_logprob:.4f}) ---")
                print(s.text)
                if beam.logprobs is not None:
                    _print_logprobs(s.generated_token_ids, s.logprobs)
        print(f"[beam search, {beam.beam_width} beams: {time.perf_counter() - t0:.2f} s]", file=sys.stderr)
        return 0
    if len(prompts) == 1 and params.n == 1 and params.logprobs is None and not args.no_stream:
        for delta in llm.stream(prompts[0], params):
            print(delta, end="", flush=True)
        print()
    else:
        for i, out in enumerate(llm.generate(prompts, params)):
            for c in out.outputs:
                print(f"--- prompt {i} sample {c.index} ({c.finish_reason}) ---")
                print(c.text)
                if c.logprobs:
                    _print_logprobs(c.token_ids, c.logprobs)
    dt = time.perf_counter() - t0
    st = llm.engine.stats
    spec = ""
    if llm.engine.spec is not None:
        s = llm.engine.spec.summary()
        spec = (f"; {s['spec_method']}: acceptance {s['spec_acceptance_rate']:.2f}, "
                f"{s['spec_mean_accepted_length']:.2f} tokens per verification")
    print(f"[{st['generation_tokens']} tokens in {dt:.2f} s, {st['generation_tokens'] / dt:.1f} tok/s{spec}]",
          file=sys.stderr)
    return 0


def _chat(args) -> int:
    if args.logprobs is not None:  # a chat streams its replies: no place for logprobs
        raise ValueError("argument --logprobs: not supported by chat (use decodekit generate --logprobs)")
    if args.n != 1:  # one reply per turn: the conversation goes on from it
        raise ValueError(f"argument --n: chat answers each message once, so --n must be 1 (got {args.n}; "
                         "use decodekit generate --n N for several samples)")
    params = _params(args)      # (the flags checked before the model loads)
    llm = _engine(args)
    params = _params(args, llm.engine.default_sampling)
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    from decodekit.sampling.reasoning import ReasoningStream
    kwargs = _template_kwargs(args)
    thinker = llm.engine.reasoning      # --reasoning-parser: the thinking shown apart (dim on a terminal)
    dim, plain = ("\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "")
    print("decodekit chat: type a message, empty line or Ctrl-D to quit, /reset to start over", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        if not line.strip():
            return 0
        if line.strip() == "/reset":
            messages = messages[:1] if args.system else []
            continue
        reply = ""
        try:
            ids = llm.apply_chat_template(messages + [{"role": "user", "content": line}], chat_template_kwargs=kwargs)
            split = ReasoningStream(thinker, llm.engine.reasoning_of(ids)[1]) if thinker else None
            thinking = False
            for delta in llm.stream({"prompt_token_ids": ids}, params):
                reply += delta
                if split is None:
                    print(delta, end="", flush=True)
                    continue
                for text, is_thought in zip(split.feed(reply), (True, False)):
                    if text and is_thought != thinking:
                        print(f"{dim}[thinking] " if is_thought else f"{plain}\n", end="")
                        thinking = is_thought
                    print(text, end="", flush=True)
            if split is not None:
                print("".join(split.finish(reply)) + (plain if thinking else ""), end="")
        except ValueError as e:  # this message is refused (not valid text, conversation too long): the session goes on
            print(f"{plain}decodekit: error: {e}", file=sys.stderr)
            continue
        print()
        answer = {"role": "assistant", "content": reply}
        if split is not None:       # the history keeps the answer, and the thinking apart (as templates expect it)
            answer = {"role": "assistant", "content": split.content, "reasoning_content": split.reasoning}
        messages += [{"role": "user", "content": line}, answer]


def _quantize(a) -> int:
    import os
    import time

    from decodekit import LLM
    from decodekit.quant.export import check_out_dir, save_quantized
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        raise ValueError(f"--model {a.model!r}: not a Hugging Face model directory (no config.json)")
    try:
        check_out_dir(a.model, a.out)       # before the (GPTQ: minutes-long) quantization, not after it
    except ValueError as e:
        raise ValueError(f"--out: {str(e).removeprefix('save_quantized: ')}") from None
    t = time.perf_counter()
    llm = LLM(a.model, dtype="float32", device=a.device, kv_cache_memory="64MiB", quantize_lm_head=False,
              quantization="int4-gptq" if a.method == "gptq" else "int4-rtn")     # (the format keeps a float head)
    qc = save_quantized(llm.engine.model, a.model, a.out)
    print(f"quantized {a.model} with {a.method} (groups of {qc['group_size']}) in {time.perf_counter() - t:.0f} s "
          f"-> {a.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="decodekit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    from decodekit.engine.args import EngineArgs
    g = sub.add_parser("generate", help="complete one or more prompts",
                       description="Complete prompts with the engine (continuous batching over a paged KV cache).")
    g.add_argument("prompt", nargs="*", help="prompt text(s); several are batched together")
    g.add_argument("--chat-template", action="store_true", help="wrap each prompt as a user chat message")
    g.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='extra chat-template variables, e.g. \'{"enable_thinking": false}\' (with --chat-template)')
    g.add_argument("--no-stream", action="store_true",
                   help="print when done instead of streaming (implied by several prompts, --n > 1 or --logprobs)")
    EngineArgs.add_cli_args(g)
    _sampling_args(g, temperature=0.0, model_temperature=False)
    b = g.add_argument_group("beam search")
    b.add_argument("--beam-width", type=int, default=None, metavar="N",
                   help="beam search with N beams instead of sampling: prints the N best hypotheses of each prompt, "
                        "best first, with their scores (takes --max-tokens; stop strings, "
                        "penalties, guides and --n do not apply)")
    b.add_argument("--length-penalty", type=float, default=None,
                   help="beam score = cum_logprob / length ** LENGTH_PENALTY (default 1.0; needs --beam-width)")
    g.set_defaults(fn=_generate)
    c = sub.add_parser("chat", help="interactive chat (streams tokens)")
    c.add_argument("--system", default=None, help="system prompt")
    c.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='extra chat-template variables, e.g. \'{"enable_thinking": false}\' for Qwen3')
    EngineArgs.add_cli_args(c)
    _sampling_args(c, temperature=0.7, model_temperature=True)
    c.set_defaults(fn=_chat)
    d = sub.add_parser("demo", help="run every op against its reference and time it")
    d.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run (default cpu)")
    d.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"],
                   help="activation dtype (default bfloat16)")
    d.add_argument("--tokens", type=int, default=256, help="number of tokens in the batch (default 256)")
    d.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    d.set_defaults(fn=_demo)
    b = sub.add_parser("bench", help="benchmarks: latency (batch 1), throughput (batched), serve (a live server)")
    bsub = b.add_subparsers(dest="bench_kind", required=True)
    from decodekit.bench import engine_bench
    for kind, helptext in (("latency", "one request at a time: prefill and decode tokens/s"),
                           ("throughput", "many requests at once: output tokens/s")):
        bp = bsub.add_parser(kind, help=helptext, description=engine_bench.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        engine_bench.add_args(bp)
        bp.set_defaults(fn=lambda a, k=kind: engine_bench.run(k, a))
    from decodekit.bench import serve_bench
    sp = bsub.add_parser("serve", help="serving benchmark against an OpenAI-compatible server",
                         description=serve_bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve_bench.add_args(sp)
    sp.set_defaults(fn=serve_bench.run)
    q = sub.add_parser("quantize", help="quantize a float HF checkpoint to INT4 and save it",
                       description="Quantize the projections of a float Hugging Face directory to INT4 (GPTQ with "
                                   "act-order on built-in calibration text, or round to nearest) and save a "
                                   "directory that decodekit loads without re-quantizing (quant_method "
                                   "decodekit-int4; see decodekit.quant.export).")
    q.add_argument("--model", required=True, help="float Hugging Face model directory (config.json + safetensors)")
    q.add_argument("--method", default="gptq", choices=["gptq", "rtn"], help="quantizer (default gptq)")
    q.add_argument("--out", required=True, help="output directory")
    q.add_argument("--device", default="cpu", help="where to run the calibration (default cpu)")
    q.set_defaults(fn=_quantize)
    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)",
                        description="Serve the model over the OpenAI API (FastAPI + uvicorn); see decodekit.server.")
    from decodekit import server
    server.add_args(sv)
    sv.set_defaults(fn=server.serve)
    from decodekit.planner import cli as planner_cli  # pure Python: no torch import
    pl = sub.add_parser("plan", help="capacity planner: TP/PP/replica shapes from the roofline (plan explain: one shape)",
                        description=planner_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    planner_cli.add_args(pl)
    pl.set_defaults(fn=planner_cli.run)
    i = sub.add_parser("info", help="show what this build contains")
    i.set_defaults(fn=_info)
    return p


_PARAM_DESTS = {"seed": "sample_seed"}   # SamplingParams field -> its option's dest where the names differ


def _option_named(parser: argparse.ArgumentParser, args, e: Exception) -> str:
    """The error text, led by "argument --opt: " when it is about one option's value (argparse's style): a
    SamplingParamsError names its field, EngineArgs / SchedulerConfig messages start with theirs, and
    --sample-seed (seed) or --spec-k (num_speculative_tokens) are not spelled like the field."""
    from decodekit.sampling.params import SamplingParamsError
    sub = next((a.choices.get(getattr(args, "cmd", None)) for a in parser._actions
                if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        return str(e)
    opts = {a.dest: "/".join(a.option_strings) for a in sub._actions if a.option_strings}
    if isinstance(e, SamplingParamsError):
        dest, text = _PARAM_DESTS.get(e.field, e.field), str(e).removeprefix(f"SamplingParams.{e.field}: ")
        if dest in opts:
            return f"argument {opts[dest]} ({e.field}): {text}"
        return str(e)
    m = re.match(r"(?:SchedulerConfig\.)?(\w+) ", str(e))
    if m and m.group(1) in opts:
        return f"argument {opts[m.group(1)]}: {e}"
    # a request's limits (the scheduler's "request '0': prompt (n tokens) + max_tokens (m) = ..."): the flag that
    # set max_tokens, where the command has one
    for dest in ("max_tokens", "output_len"):
        if re.search(r"\bmax_tokens \(", str(e)) and dest in opts:
            return f"argument {opts[dest]}: {e}"
    return str(e)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "tokens", 1) < 1:
        print("decodekit: --tokens must be >= 1", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except BrokenPipeError:  # stdout closed early (decodekit plan | head -1): not the command's error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # (no second error at exit)
        return 0
    except (ValueError, OSError) as e:  # bad input / an unusable path: one clear line, no traceback
        print(f"decodekit: error: {_option_named(parser, args, e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
