"""The decodekit command line, run as a user would (subprocess)."""
import subprocess
import sys

import pytest


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "decodekit.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_generate_greedy_on_embedded_model():
    r = _run("generate", "The capital of France is", "--max-tokens", "8", "--no-stream", "--kv-cache-memory", "128MiB")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "tok/s" in r.stderr


@pytest.mark.parametrize("args, field", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "1.5"], "top_p"),
    (["--max-tokens", "0"], "max_tokens"),
    (["--kv-cache-memory", "lots"], "kv_cache_memory"),
    (["--block-size", "7"], "block_size"),
    (["--logit-bias", "1000"], "logit-bias"),
    (["--logit-bias", "1000=500"], "logit_bias"),
    (["--bad-word", " "], "bad_words"),
    (["--guided-regex", "(?<=x)"], "guided_regex"),
    (["--guided-json", '{"type": "object", "patternProperties": {}}'], "guided_json"),
    (["--guided-json", "@/nonexistent/schema.json"], "guided-json"),
    (["--guided-grammar", "root ::= nothing"], "guided_grammar"),
    (["--guided-grammar", "@/nonexistent/g.gbnf"], "guided-grammar"),
    (["--guided-regex", "a", "--json-object"], "guided_json_object"),
    (["--beam-width", "0"], "--beam-width"),
    (["--beam-width", "2", "--stop", "."], "--stop"),
    (["--beam-width", "2", "--presence-penalty", "1"], "--presence-penalty"),
    (["--beam-width", "2", "--json-object"], "not with --json-object"),
    (["--beam-width", "2", "--length-penalty", "nan"], "--length-penalty"),
    (["--length-penalty", "2"], "--beam-width"),
])
def test_bad_arguments_give_one_clear_line(args, field):
    r = _run("generate", "hi", *args)
    assert r.returncode == 2
    assert field in r.stderr and "Traceback" not in r.stderr


def test_bad_word_and_logit_bias():
    base = ("generate", "The capital of France is", "--max-tokens", "8", "--no-stream", "--temperature", "0",
            "--kv-cache-memory", "128MiB")
    r = _run(*base, "--bad-word", "Paris")
    assert r.returncode == 0 and "Paris" not in r.stdout, r.stderr
    r = _run(*base, "--logit-bias", "1000=100")
    assert r.returncode == 0 and r.stdout.count("()") == 8, (r.stdout, r.stderr)   # token 1000 is "()"


def test_guided_regex_json_and_choice(tmp_path):
    import json
    import re
    base = ("generate", "Describe a cat:", "--max-tokens", "60", "--no-stream", "--temperature", "0",
            "--kv-cache-memory", "128MiB")
    r = _run(*base, "--guided-regex", r"[A-Z][a-z]+ is a (?:small|big) cat\.")
    assert r.returncode == 0 and re.search(r"[A-Z][a-z]+ is a (?:small|big) cat\.", r.stdout), (r.stdout, r.stderr)
    schema = tmp_path / "cat.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
                                  "required": ["name"]}))
    r = _run(*base, "--guided-json", f"@{schema}")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout[r.stdout.index("{"):r.stdout.rindex("}") + 1])
    assert list(obj) == ["name"] and len(obj["name"]) <= 12
    r = _run(*base, "--guided-choice", "tabby", "--guided-choice", "siamese")
    assert r.returncode == 0 and ("tabby" in r.stdout or "siamese" in r.stdout), r.stdout
    gbnf = tmp_path / "cat.gbnf"
    gbnf.write_text('root ::= "The cat is " colour "."\ncolour ::= "black" | "white" | "ginger"\n')
    r = _run(*base, "--guided-grammar", f"@{gbnf}")
    assert r.returncode == 0 and re.search(r"The cat is (?:black|white|ginger)\.", r.stdout), (r.stdout, r.stderr)


def test_beam_search():
    r = _run("generate", "The capital of France is", "1, 2, 3,", "--beam-width", "3", "--max-tokens", "8",
             "--kv-cache-memory", "128MiB", "--logprobs", "2")
    assert r.returncode == 0, r.stderr
    heads = [ln for ln in r.stdout.splitlines() if ln.startswith("--- prompt")]
    assert [h.split(" (")[0] for h in heads] == [f"--- prompt {i} beam {j}" for i in range(2) for j in range(3)]
    scores = [float(h.split("score ")[1].split(",")[0]) for h in heads]
    assert scores[:3] == sorted(scores[:3], reverse=True) and scores[3:] == sorted(scores[3:], reverse=True)
    assert "Paris" in r.stdout
    # --logprobs: per generated token of each beam its id and top-2 (+ the token itself when not in them)
    tables = [ln for ln in r.stdout.splitlines() if ln.startswith("  ") and ": '" in ln]
    assert len(tables) >= 6 and all(2 <= ln.count("':") <= 3 for ln in tables), tables[:3]


def test_help_explains_options():
    r = _run("generate", "--help")
    assert r.returncode == 0
    for opt in ("--max-tokens", "--temperature", "--kv-cache-memory", "--max-num-batched-tokens", "--stop"):
        assert opt in r.stdout


def test_info_lists_the_registered_ops():
    r = _run("info", timeout=120)
    assert r.returncode == 0, r.stderr
    for op in ("paged_attention", "reshape_and_cache", "int4_gemm", "int8_gemm", "copy_blocks", "rms_norm"):
        assert op in r.stdout, r.stdout


def test_bench_throughput_rounds_report_ratio_to_batch1(tmp_path):
    """`bench throughput --rounds 2`: each round's steady-state decode rate over the batch-1 rate measured
    around it, and their median, in the JSON; a bad --rounds is refused naming the option."""
    import json
    out = tmp_path / "thr.json"
    r = _run("bench", "throughput", "--model", "random:tiny", "--num-prompts", "3", "--input-len", "9",
             "--output-len", "6", "--rounds", "2", "--peer", "none", "--output-json", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())["decodekit"]
    assert len(d["rounds"]) == 2
    for x in d["rounds"]:
        assert x["decode_phase_tok_s"] > 0 and x["batch1_decode_tok_s"] > 0
        assert abs(x["decode_phase_vs_batch1"] - x["decode_phase_tok_s"] / x["batch1_decode_tok_s"]) < 1e-9
    ratios = sorted(x["decode_phase_vs_batch1"] for x in d["rounds"])
    assert abs(d["decode_phase_vs_batch1_median"] - sum(ratios) / 2) < 1e-9
    assert d["prefix_cache_hit_rate"] == 0.0  # fresh prompts every round
    bad = _run("bench", "throughput", "--model", "random:tiny", "--rounds", "0", "--peer", "none")
    assert bad.returncode != 0 and "--rounds" in bad.stderr
