"""Engine behaviour on the embedded model: batch invariance, preemption and prefix
caching are transparent, n > 1 and seeds, stop strings, aborts, bad requests rejected alone.
KV-block leaks are checked after every scenario."""
import pytest
import torch

from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks, embedded_llm

PROMPTS = [
    "The history of the Roman Empire",
    "A recipe for pancakes: first,",
    "import numpy as np\n",
    "Q: What is 12 times 12?\nA:",
    "My favourite colour is",
    "In 1969, astronauts",
    "The mitochondria is",
    "Dear Sir or Madam,",
    "Rain fell on the",
    "The best way to learn a language is",
    "Once there was a robot who",
    "Photosynthesis converts",
    "The stock market today",
    "To be or not to be,",
    "Listen carefully: the password is",
    "Water boils at",
    "A long time ago in a galaxy far, far away",
]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return embedded_llm(kv_cache_memory="256MiB", seed=1)


def test_batch_invariance(llm):
    target = PROMPTS[-1]
    alone = llm.generate(target, GREEDY)[0].outputs[0].token_ids
    crowd = llm.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=4 + i, ignore_eos=True)
                                   for i in range(len(PROMPTS) - 1)] + [GREEDY])
    assert crowd[-1].outputs[0].token_ids == alone
    assert_no_leaks(llm)


def test_seeded_sampling_is_batch_invariant(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=1234)
    alone = llm.generate(PROMPTS[3], p)[0].outputs[0].token_ids
    mixed = llm.generate(PROMPTS[:6], [SamplingParams(temperature=0.7, max_tokens=8)] * 3 + [p] +
                         [SamplingParams(temperature=1.0, max_tokens=5)] * 2)
    assert mixed[3].outputs[0].token_ids == alone


def test_preemption_is_transparent(llm):
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:8], GREEDY)]
    small = embedded_llm(kv_cache_memory="6MiB", max_model_len=128, seed=1)  # 8 blocks of 16: forces preemption
    got = small.generate(PROMPTS[:8], GREEDY)
    assert [o.outputs[0].token_ids for o in got] == want
    assert small.engine.scheduler.num_preemptions > 0
    assert_no_leaks(small)


def test_prefix_caching_on_off_same_outputs(llm):
    shared = "You are a helpful assistant. Answer briefly and precisely. " * 4
    prompts = [shared + q for q in ("Why is the sky blue?", "What is 2+2?", "Name a fruit.")]
    off = embedded_llm(kv_cache_memory="128MiB", enable_prefix_caching=False)
    want = [o.outputs[0].token_ids for o in off.generate(prompts, GREEDY)]
    first = llm.generate(prompts[:1], GREEDY)
    got = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in got] == want
    assert first[0].outputs[0].token_ids == want[0]
    assert max(o.num_cached_tokens for o in got) >= 32  # the shared prefix was served from the cache
    assert llm.engine.kv_manager.prefix_cache_hit_rate > 0
    assert_no_leaks(llm)


def test_n_samples_and_seed_reproducibility(llm):
    p = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=7)
    a = llm.generate(PROMPTS[0], p)[0]
    b = llm.generate(PROMPTS[0], p)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # the samples differ from each other
    assert [c.index for c in a.outputs] == [0, 1, 2]


def test_n_samples_compute_the_prompt_once(llm):
    """n > 1: the first sample computes the prompt, the others wait one step and hit its cached blocks (scheduled
    together, each would compute it all); the samples are those of an engine without prefix caching; aborting
    while samples wait frees everything."""
    long = "The history of the printing press begins in the fifteenth century. " * 10
    sp = SamplingParams(n=5, temperature=0.9, seed=3, max_tokens=10)
    eng = llm.engine
    computed = []
    orig = eng.scheduler.schedule

    def counting():
        so = orig()
        computed.append(so.num_scheduled_tokens)
        return so
    eng.scheduler.schedule = counting
    try:
        (o,) = llm.generate(long, sp)
    finally:
        del eng.scheduler.schedule
    P, bs = len(o.prompt_token_ids), eng.args.block_size
    # the prompt once, then per other sample its tail past the last cached full block, then the decodes
    assert sum(computed) <= P + 4 * bs + 5 * 10, (sum(computed), P)
    off = embedded_llm(kv_cache_memory="64MiB", enable_prefix_caching=False)
    (want,) = off.generate(long, sp)
    assert [c.token_ids for c in o.outputs] == [c.token_ids for c in want.outputs]
    rid = eng.add_request("n-abort", long + "!", sp)
    eng.step()
    assert eng.abort_request(rid)
    while eng.has_unfinished_requests():
        eng.step()
    assert_no_leaks(llm)


def test_stop_string_and_max_tokens(llm):
    out = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=30, stop=[" 8"]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == " 8"
    assert " 8" not in out.text and out.text.strip().startswith("6")
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3


def test_stop_token_text_left_out_unless_asked(llm):
    """A request ending on a stop token (stop_token_ids, EOS) returns the token's id but not its text, unless
    include_stop_str_in_output (vLLM's rule), also with skip_special_tokens=False and under streaming."""
    tok = llm.engine.tokenizer
    free = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].outputs[0]
    stop_id = free.token_ids[3]   # a token after a few others
    for include in (False, True):
        p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop_token_ids=[stop_id],
                           include_stop_str_in_output=include, skip_special_tokens=False)
        out = llm.generate("1, 2, 3, 4, 5,", p)[0].outputs[0]
        assert out.finish_reason == "stop" and out.stop_reason == stop_id and out.token_ids[-1] == stop_id
        n = len(out.token_ids)
        assert out.text == tok.decode(out.token_ids if include else out.token_ids[:-1]), (include, out.text)
        assert "".join(llm.stream("1, 2, 3, 4, 5,", p)) == out.text
        if not include:
            assert n == free.token_ids.index(stop_id) + 1
    eos = llm.engine.eos_token_ids[0]
    out = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[eos], min_tokens=0,
                                            skip_special_tokens=False))[0].outputs[0]
    if out.token_ids and out.token_ids[-1] == eos:
        assert tok.decode([eos], skip_special_tokens=False) not in out.text


def test_params_are_copied_at_add(llm):
    """The caller's SamplingParams object may be changed after add_request: the queued request keeps its own."""
    eng = llm.engine
    p = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    rid = eng.add_request(None, "Hello there", p)
    p.max_tokens = 10
    p.temperature = float("nan")
    outs = []
    while eng.has_unfinished_requests():
        outs += [o for o in eng.step() if o.finished and o.request_id == rid]
    assert len(outs) == 1 and len(outs[0].outputs[0].token_ids) == 3
    assert_no_leaks(llm)


def test_streaming_equals_batch(llm):
    text = "".join(llm.stream(PROMPTS[1], GREEDY))
    assert text == llm.generate(PROMPTS[1], GREEDY)[0].outputs[0].text


def test_abort_frees_blocks(llm):
    eng = llm.engine
    rid = eng.add_request("to-abort", PROMPTS[0] * 5, SamplingParams(max_tokens=50))
    keep = eng.add_request("keep", PROMPTS[1], GREEDY)
    for _ in range(3):
        eng.step()
    assert eng.abort_request(rid)
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs[o.request_id] = o
    assert outs["to-abort"].outputs[0].finish_reason == "abort"
    assert outs[keep].outputs[0].finish_reason == "length"
    assert_no_leaks(llm)


@pytest.mark.parametrize("bad, field", [
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(top_k=2**63), "top_k"),
    (dict(stop_token_ids=[10**9]), "stop_token_ids"),
])
def test_bad_requests_rejected_alone(llm, bad, field):
    eng = llm.engine
    eng.add_request("good", PROMPTS[2], GREEDY)
    with pytest.raises(ValueError, match=field):
        # NaN / range errors are raised when the params are built; top_k and stop_token_ids
        # only once the vocabulary is known (add_request); either way nothing is queued.
        eng.add_request("bad", PROMPTS[2], SamplingParams(**{"max_tokens": 4, **bad}))
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request("huge", PROMPTS[2], SamplingParams(max_tokens=10**6))
    with pytest.raises(ValueError, match="prompt"):
        eng.add_request("empty", "", GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        eng.add_request("oob", [1, 2, 10**9], GREEDY)
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    assert [o.request_id for o in outs if o.finished] == ["good"]
    assert_no_leaks(llm)



def test_min_tokens_defers_stops(llm):
    free = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    out = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=12, stop=[","],
                                                        min_tokens=4))[0].outputs[0]
    # the first "," comes within min_tokens and does not stop; the next one after it does
    assert out.finish_reason == "stop" and len(out.token_ids) > 4
    assert free.outputs[0].text.startswith(out.text)


def test_static_decode_buckets_match_eager(llm):
    """The padded static-buffer decode path (what CUDA graphs replay) gives the eager tokens."""
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:5], GREEDY)]
    static = embedded_llm(kv_cache_memory="64MiB", max_model_len=256, decode_graphs="static", max_num_seqs=8)
    assert [b.size for b in static.engine.runner.buckets] == [1, 2, 4, 8]
    got = [o.outputs[0].token_ids for o in static.generate(PROMPTS[:5], GREEDY)]  # batch 5 -> bucket 8
    assert got == want
    assert_no_leaks(static)


def test_gguf_4bit_weights_stay_packed_and_match_dequantized(llm):
    """On the CPU the embedded Q4_1 projections stay packed (int4_gemm decodes them in registers);
    with weight_format="dequantized" they are dense tensors; the greedy tokens agree (the weights
    are bit-identical, only the fp32 summation order differs)."""
    import torch
    from decodekit.quant import Int4Weight
    L = llm.engine.model.layers[0]
    assert all(isinstance(w, Int4Weight) for w in (L.qkv, L.o, L.gate_up, L.down))
    dense = embedded_llm(kv_cache_memory="128MiB", seed=1, weight_format="dequantized")
    assert isinstance(dense.engine.model.layers[0].qkv, torch.Tensor)
    a = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:6], GREEDY)]
    b = [o.outputs[0].token_ids for o in dense.generate(PROMPTS[:6], GREEDY)]
    assert sum(x == y for x, y in zip(a, b)) >= 5, (a, b)
    with pytest.raises(ValueError, match="weight_format must be one of auto, packed, dequantized"):
        embedded_llm(weight_format="int3")
    assert_no_leaks(llm)


def test_fp8_quantization_at_load(llm):
    """--quantization fp8 (W8A8): the projections become e4m3 with per-channel scales, activations
    are quantized per token; teacher-forced next-token choices agree with the float model's on
    most positions (measured 0.89 on this text), and generation runs end to end."""
    from decodekit.quant.fp8 import Fp8Weight
    from decodekit.quant.gptq_quantizer import calibration_forward, calibration_text
    fp8 = embedded_llm(kv_cache_memory="64MiB", weight_format="dequantized", quantization="fp8")
    L = fp8.engine.model.layers[0]
    assert isinstance(L.qkv, Fp8Weight) and isinstance(L.down, Fp8Weight)
    ids = llm.engine.tokenizer.encode(calibration_text()[-3000:])[:400]
    seqs = [ids[:200], ids[200:]]
    with torch.no_grad():
        a = calibration_forward(llm.engine.model, seqs)
        b = calibration_forward(fp8.engine.model, seqs)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.8
    out = fp8.generate(PROMPTS[:2], GREEDY)
    assert all(o.outputs[0].token_ids for o in out)
    assert_no_leaks(fp8)


def test_int4_rtn_quantization_at_load(llm):
    """--quantization int4-rtn packs a float checkpoint's projections at load. On the embedded
    model dequantized from its Q4_1 file, RTN with the same group size finds (nearly) the file's
    own grid again, so greedy outputs match the packed-GGUF engine's."""
    from decodekit.quant import Int4Weight
    rtn = embedded_llm(kv_cache_memory="128MiB", seed=1, weight_format="dequantized", quantization="int4-rtn")
    L = rtn.engine.model.layers[0]
    assert isinstance(L.qkv, Int4Weight) and isinstance(L.down, Int4Weight)
    a = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:6], GREEDY)]
    b = [o.outputs[0].token_ids for o in rtn.generate(PROMPTS[:6], GREEDY)]
    assert sum(x == y for x, y in zip(a, b)) >= 4, (a, b)
    with pytest.raises(ValueError, match="quantization must be one of None, int4-rtn"):
        embedded_llm(quantization="int2")


@pytest.mark.parametrize("model", ["random:tiny", "random:tiny-qwen3"])     # separate LM head / tied embedding
def test_int4_rtn_packs_the_lm_head_as_int8_on_the_cpu(model):
    """With a big vocabulary the float LM head is most of a CPU decode step's bytes: int4-rtn packs it too, as
    INT8 in groups of 32 (Q8_0; a tied embedding with it). Against the same engine with a float head: the logprobs
    move by Q8_0's rounding only."""
    from decodekit import LLM
    from decodekit.quant import Int8Weight
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
    prompt = {"prompt_token_ids": [5, 9, 200, 31, 77]}
    packed = LLM(model=model, quantization="int4-rtn", kv_cache_memory="16MiB")
    m = packed.engine.model
    assert isinstance(m.lm_head, Int8Weight) and (m.embed is m.lm_head) == m.config.tie_word_embeddings
    plain = LLM(model=model, quantization="int4-rtn", kv_cache_memory="16MiB", quantize_lm_head=False)
    assert not isinstance(plain.engine.model.lm_head, Int8Weight)
    (a,), (b,) = packed.generate(prompt, params), plain.generate(prompt, params)
    la = [lp[t].logprob for lp, t in zip(a.outputs[0].logprobs, a.outputs[0].token_ids)]
    lb = [lp[t].logprob for lp, t in zip(b.outputs[0].logprobs, b.outputs[0].token_ids)]
    assert a.outputs[0].token_ids[:3] == b.outputs[0].token_ids[:3]
    n = next((i for i, (x, y) in enumerate(zip(a.outputs[0].token_ids, b.outputs[0].token_ids)) if x != y), 8)
    assert max(abs(x - y) for x, y in zip(la[:n], lb[:n])) < 0.02, (la, lb)
