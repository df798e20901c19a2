"""Planner audit: the figures against hand computations from the public model shapes, and the inputs that used to
give wrong numbers, hangs or tracebacks (each regression test below failed before its fix)."""
import dataclasses
import json
import math
import time

import pytest

from decodekit import planner as P
from decodekit.cli import main
from decodekit.planner import roofline as rf
from decodekit.planner.shapes import divisors

# public config.json shapes: vocab, hidden, layers, heads, kv heads, head_dim, intermediate, tied, qkv bias
SHAPES = {
    "llama3-8b": (128256, 4096, 32, 32, 8, 128, 14336, False, False),
    "llama3-70b": (128256, 8192, 80, 64, 8, 128, 28672, False, False),
    "qwen2.5-7b": (152064, 3584, 28, 28, 4, 128, 18944, False, True),
    "mistral-7b-v0.1": (32000, 4096, 32, 32, 8, 128, 14336, False, False),
    "smollm2-135m": (49152, 576, 30, 9, 3, 64, 1536, True, False),
    "phi-4-mini": (200064, 3072, 32, 24, 8, 128, 8192, True, False),
}
# the published parameter counts
PARAMS = {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "qwen2.5-7b": 7_615_616_512,
          "mistral-7b-v0.1": 7_241_732_096, "smollm2-135m": 134_515_008, "phi-4-mini": 3_836_021_760}


def _hand_params(v, d, L, h, kv, hd, inter, tied, bias):
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d + ((h * hd + 2 * kv * hd) if bias else 0)
    return v * d * (1 if tied else 2) + L * (attn + 3 * d * inter + 2 * d) + d


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_params_weight_and_kv_bytes_by_hand(name):
    m = P.load_model(name)
    v, d, L, h, kv, hd, inter, tied, bias = SHAPES[name]
    assert m.params == _hand_params(*SHAPES[name]) == PARAMS[name]
    assert P.weight_format("bf16").total_bytes(m) == 2 * m.params
    assert P.weight_format("fp8").total_bytes(m) == m.params
    assert P.weight_format("int4").total_bytes(m) == pytest.approx(m.params * (4 + 16 / 128) / 8)   # 16-bit scale / 128
    assert P.weight_format("int4", 32).total_bytes(m) == pytest.approx(m.params * 4.5 / 8)
    assert P.weight_format("int4", 0).total_bytes(m) == m.params / 2
    assert m.kv_bytes_per_token("bf16") == 2 * L * kv * hd * 2 and m.kv_bytes_per_token("fp8") == L * kv * hd * 2


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "qwen2.5-7b", "mistral-7b-v0.1"])
def test_decode_bytes_and_capacity_by_hand(name):
    """t_mem = (W / TP + B * attended context * KV per token / min(TP, kv heads)) / bandwidth; capacity = (memory -
    W / TP - reserve) // per-GPU KV per token // held context; monotone in TP, context and format."""
    m, hw = P.load_model(name), P.load_hardware("h100")
    kv_heads, window = SHAPES[name][4], m.sliding_window or math.inf
    for fmt in ("bf16", "fp8", "int4"):
        wf = P.weight_format(fmt)
        W = wf.total_bytes(m)
        for tp in (1, 2, 4, 8, 16):
            if m.n_heads % tp:
                continue
            per_tok = m.kv_bytes_per_token("bf16") / min(tp, kv_heads)
            for B, L in ((1, 0), (8, 2048), (64, 8000), (3, 30000)):
                s = P.decode_step(m, hw, wf, batch=B, context=L, tp=tp)
                want = W / tp + B * min(L, window) * per_tok
                assert s.weight_bytes + s.kv_bytes == pytest.approx(want, rel=1e-12)
                assert s.t_mem == pytest.approx(want / 3.35e12, rel=1e-12)
            cap = P.capacity(m, hw, wf, context=4096, tp=tp)
            reserve = 2048 * (4 * m.hidden + 3 * m.intermediate / tp) * 2
            held = min(4096, m.sliding_window + 16) if m.sliding_window else 4096
            assert cap.max_batch == max(0, int((80e9 - W / tp - reserve) // per_tok) // held)
    wf = P.weight_format("bf16")
    step = lambda **kw: P.decode_step(m, hw, wf, batch=16, **kw)  # noqa: E731
    assert [step(tp=t).weight_bytes + step(tp=t).kv_bytes for t in (1, 2, 4, 8)] == sorted(
        (step(tp=t).weight_bytes + step(tp=t).kv_bytes for t in (1, 2, 4, 8)), reverse=True)
    tpots = [step(context=c).tpot for c in (0, 100, 1000, 10000, 100000)]
    assert tpots == sorted(tpots)
    sizes = [P.weight_format(f).total_bytes(m) for f in ("int4", "fp8", "bf16")]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3


def test_calibrated_dense_weights_use_the_engine_decode_not_a_quantized_gemv(tmp_path):
    """Was: with int4 / int8 GEMV rows but no dense ones (bench/results' H200 run), bf16 weights took the int8
    kernel's fraction of the copy ceiling (0.21) although the same results held the engine's own bf16 decode (0.47):
    the calibrated Llama-3-8B TPOT was 18 ms against the measured 7.5 ms."""
    dev = "NVIDIA H200"
    rows = [{"kind": "copy_gbps", "value": 4000.0, "device_name": dev},
            {"bench": "int4_gemm", "case": "M=1 4096x4096", "dtype": "bfloat16", "device_name": dev,
             "ceiling_kind": "copy_gbps", "ceiling": 4000.0, "frac_of_ceiling": 0.15},
            {"bench": "int8_gemm", "case": "M=1 4096x4096", "dtype": "bfloat16", "device_name": dev,
             "ceiling_kind": "copy_gbps", "ceiling": 4000.0, "frac_of_ceiling": 0.2},
            {"bench": "latency", "device": dev, "weight_bytes": 15e9, "decode_frac_of_copy_bw": 0.5,
             "copy_bandwidth_gb_s": 4000.0, "decodekit": {"tpot_s": 0.0075}}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    cal = P.load_calibration(dev, str(tmp_path))
    hw = P.load_hardware("h200")
    eff = P.calibrated(hw, cal)
    base = 4000e9 / 4.8e12
    assert eff.weight_frac("dense") == pytest.approx(base * 0.5)
    assert eff.weight_frac("int4") == pytest.approx(base * 0.15) and eff.weight_frac("int8") == pytest.approx(base * 0.2)
    m = P.load_model("llama3-8b")
    t = P.decode_step(m, hw, P.weight_format("bf16"), batch=1, eff=eff).t_weights
    assert t == pytest.approx(2 * m.params / (4.8e12 * base * 0.5))


@pytest.mark.parametrize("config, words", [
    ({"num_attention_heads": 0}, ["num_attention_heads", ">= 1", "got 0"]),          # was ZeroDivisionError
    ({"hidden_size": 4096.7}, ["hidden_size", "4096.7"]),                            # was silently 4096
    ({"num_attention_heads": "abc"}, ["num_attention_heads", "'abc'"]),               # was int()'s message
    ({"num_key_value_heads": 5}, ["n_kv_heads (5)"]),
])
def test_bad_hf_config_fields_are_named(tmp_path, capsys, config, words):
    c = {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 128256,
         "intermediate_size": 14336, "num_key_value_heads": 8, "model_type": "llama", **config}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(c))
    assert main(["plan", "--model", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decodekit: error:") and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("text, words", [("[1, 2]", ["not a config.json", "list"]),          # was TypeError
                                         ("{not json", ["not a JSON config"])])             # named no file
def test_config_that_is_not_a_json_object(tmp_path, capsys, text, words):
    f = tmp_path / "config.json"
    f.write_text(text)
    assert main(["plan", "--model", str(f)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and all(w in err for w in words) and len(err.splitlines()) == 1, err
    (tmp_path / "empty").mkdir()
    assert main(["plan", "--model", str(tmp_path / "empty")]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_context_beyond_the_models_limit_is_refused(tmp_path, capsys):
    """Was: any prompt + output length was planned (SmolLM2 at 100k tokens, past its 8192 positions)."""
    assert main(["plan", "--model", "smollm2-135m", "--prompt-len", "8000", "--output-len", "193"]) == 2
    err = capsys.readouterr().err
    assert "argument --prompt-len/--output-len" in err and "8193" in err and "8192" in err, err
    assert main(["plan", "--model", "smollm2-135m", "--prompt-len", "8000", "--output-len", "192", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["context_limit"] == 8192
    assert P.MODEL_PRESETS["qwen3-8b"].context_limit == 40960
    with pytest.raises(ValueError, match="context length 40960"):
        P.plan(P.load_model("qwen3-8b"), P.load_hardware("h100"), P.weight_format("bf16"), P.Workload(40000, 961),
               P.Constraints(1))
    # a config.json: max_position_embeddings, YaRN extending it as the engine does
    c = {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 4, "vocab_size": 1000,
         "intermediate_size": 2048, "model_type": "qwen2", "max_position_embeddings": 32768}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(c))
    assert P.load_model(str(f)).context_limit == 32768
    c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    f.write_text(json.dumps(c))
    assert P.load_model(str(f)).context_limit == 131072
    assert main(["plan", "--model", str(f), "--prompt-len", "100000", "--gpus", "1"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("argv, field", [
    (["--gpus", "100000000"], "--gpus"),                 # was an O(n) divisor loop: 11 s here, 1e12 never ends
    (["--spec-k", "9" * 400], "--spec-k"),               # was OverflowError tracebacks
    (["--concurrency", "9" * 400], "--concurrency"),
    (["--prompt-len", "9" * 400], "--prompt-len"),
    (["explain", "--batch", "9" * 400], "--batch"),
    (["explain", "--tp", "9" * 400], "--tp"),
])
def test_huge_values_are_refused_with_the_range(capsys, argv, field):
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        main(["plan"] + argv)
    assert e.value.code == 2 and time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert f"argument {field}: must be an integer in [" in err and "Traceback" not in err, err


def test_divisors_are_fast_and_right():
    for n in list(range(1, 300)) + [720720, 999983]:
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    t0 = time.perf_counter()
    assert divisors(1 << 27) == [1 << i for i in range(28)]   # was a loop over 1..n: seconds here, 1e12 never ends
    assert time.perf_counter() - t0 < 1


def test_shape_options_outside_explain_are_refused(capsys):
    """Was: `plan --tp 4` silently listed every TP (the option only picks explain's shape)."""
    for argv in (["--tp", "4"], ["--batch", "8"], ["--pp", "2"], ["--replicas", "1"]):
        assert main(["plan"] + argv) == 2
        err = capsys.readouterr().err
        assert f"argument {argv[0]}:" in err and "plan explain" in err, err
    assert main(["plan", "explain", "--tp", "4", "--batch", "8"]) == 0
    assert "TP=4 PP=1 replicas=2, batch 8" in capsys.readouterr().out


def test_output_paths_checked_first(tmp_path, capsys):
    """Was: --plot FILE raised FileExistsError (traceback); --measure-json in a missing directory failed after
    the engine had run, naming no option; --measure-json without --measure was ignored."""
    f = tmp_path / "a_file"
    f.write_text("x")
    assert main(["plan", "--plot", str(f)]) == 2
    assert "argument --plot:" in capsys.readouterr().err
    assert main(["plan", "--measure-json", str(tmp_path / "m.json")]) == 2
    assert "argument --measure-json:" in capsys.readouterr().err
    assert main(["plan", "--gpu", "cpu-calibrated", "--measure", "--measure-json",
                 str(tmp_path / "no" / "dir" / "m.json")]) == 2
    assert "argument --measure-json: cannot write" in capsys.readouterr().err


def test_a_step_that_never_ends_is_not_feasible(capsys):
    """Was: a draft cost of 1e308 made every TPOT infinite and every row feasible and on the Pareto front."""
    m, hw, wf = P.load_model("llama3-8b"), P.load_hardware("h100"), P.weight_format("bf16")
    pl = P.plan(m, hw, wf, P.Workload(100, 10), P.Constraints(2), spec=rf.SpecDecode(4, 0.8, 1e308))
    assert pl.rows and not any(r.feasible for r in pl.rows) and not pl.front
    assert all("not finite" in " ".join(r.reasons) for r in pl.rows)


def test_tp_scaling_plot_draws_only_possible_tps():
    """Was: TP 2..16 for every model (SmolLM2's 9 heads split over none of them; Qwen2.5-7B's 28 not over 8)."""
    from decodekit.planner.plots import valid_tps
    h100 = P.load_hardware("h100")
    assert valid_tps(P.load_model("smollm2-135m"), h100) == [1]
    assert valid_tps(P.load_model("qwen2.5-7b"), h100) == [1, 2, 4]
    assert valid_tps(P.load_model("llama3-70b"), h100) == [1, 2, 4, 8, 16]
    assert valid_tps(P.load_model("llama3-8b"), dataclasses.replace(h100, link_bw=None)) == [1]   # no interconnect


def test_json_is_strict_for_extreme_inputs(capsys):
    def bad(x):
        raise ValueError(x)
    for argv in (["--prompt-len", "100000", "--all"], ["--reserve-gb", "1e300"],
                 ["--spec-k", "4", "--spec-draft-cost", "1e308", "--all"]):
        assert main(["plan", "--json"] + argv) == 0
        d = json.loads(capsys.readouterr().out, parse_constant=bad)
        assert d["rows"]


def test_gguf_context_limit_and_unreadable_files(tmp_path, capsys):
    """Was: a .gguf that is not one gave the reader's bare message ("GGUF magic invalid"), naming no file; one
    without the shape's metadata a TypeError traceback (int(None))."""
    for name, data in (("text.gguf", b'["not", "gguf"]'), ("short.gguf", b"GGUF\x03\x00\x00\x00" + b"\x00" * 40)):
        f = tmp_path / name
        f.write_bytes(data)
        assert main(["plan", "--model", str(f)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"decodekit: error: model: {f} ") and len(err.splitlines()) == 1, err
        assert ("not a readable GGUF file" if name == "text.gguf" else "lacks the GGUF metadata") in err, err
    try:
        from decodekit.loader._common import embedded_model_path
        path = embedded_model_path()
    except Exception:  # noqa: BLE001
        path = None
    if not path or not str(path).endswith(".gguf"):
        pytest.skip("no embedded SmolLM2 GGUF")
    m = P.load_model(str(path))
    assert m.context_limit == 8192 and m.params == PARAMS["smollm2-135m"]
    assert P.weight_format("stored", model=m).total_bytes(m) == P.weight_format("q4_1").total_bytes(m)
