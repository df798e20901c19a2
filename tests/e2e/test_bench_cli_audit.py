"""`decodekit bench latency|throughput|serve` audit on the tiny random model: self-consistent figures, strict JSON
result files, and one clear line (naming the option, exit code 2) for bad values. Each test marked "Was:" failed
before its fix. Runs in process (decodekit.cli.main), a few tokens per request."""
import json
import socket

import pytest

from decodekit.cli import main

TINY = ["--model", "random:tiny", "--kv-cache-memory", "16MiB", "--peer", "none"]


def _strict(text: str) -> dict:
    def bad(tok):
        raise ValueError(f"not JSON: {tok}")
    return json.loads(text, parse_constant=bad)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]   # closed when the block ends: connections are refused


def _one_line_error(capsys, argv, *words):
    try:
        rc = main(argv)
    except SystemExit as e:   # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("decodekit"), err
    for w in words:
        assert w in err, err
    return err


def test_latency_figures_are_self_consistent_and_written(tmp_path, capsys):
    out = tmp_path / "sub" / "lat.json"
    assert main(["bench", "latency", *TINY, "--input-len", "6", "--output-len", "4", "--iters", "1",
                 "--output-json", str(out)]) == 0
    printed = _strict(capsys.readouterr().out)
    r = _strict(out.read_text())
    assert r == printed and r["bench"] == "latency" and r["prompt_tokens_mean"] == 6
    d = r["decodekit"]
    assert d["decode_tok_s"] == pytest.approx(1 / d["tpot_s"]) and d["prefill_tok_s"] == pytest.approx(6 / d["ttft_s"])
    assert d["weight_gb_s"] == pytest.approx(r["weight_bytes"] / d["tpot_s"] / 1e9)
    assert r["decode_frac_of_copy_bw"] == pytest.approx(d["weight_gb_s"] / r["copy_bandwidth_gb_s"])
    # random:tiny (float32): embedding 512x64 not read by a decode step; LM head, 2 layers, final norm
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert r["weight_bytes"] == 4 * (512 * 64 + 2 * layer + 64)


def test_latency_refuses_one_output_token(capsys):
    """Was: --output-len 1 timed no decode step and reported ~500,000 decode tok/s and a decode at 7x the copy
    bandwidth (decode_frac_of_copy_bw 7.07)."""
    _one_line_error(capsys, ["bench", "latency", *TINY, "--input-len", "4", "--output-len", "1", "--iters", "1"],
                    "argument --output-len", ">= 2")


def test_throughput_with_one_output_token_has_no_batch1_decode_rate(capsys):
    """Was: batch1_decode_tok_s ~466,000 (the time between a request's only token and its end)."""
    assert main(["bench", "throughput", *TINY, "--input-len", "4", "--output-len", "1", "--num-prompts", "3"]) == 0
    r = _strict(capsys.readouterr().out)["decodekit"]
    assert r["batch1_decode_tok_s"] is None and r["decode_phase_vs_batch1"] is None
    assert r["output_tok_s"] == pytest.approx(3 / r["elapsed_s"])
    assert r["total_tok_s"] == pytest.approx((3 + 3 * 4) / r["elapsed_s"])


def test_dataset_prompts_shorter_than_input_len(tmp_path, capsys):
    """Was: prefill tok/s and total tok/s counted --input-len tokens per prompt although a dataset prompt was
    shorter (64 counted for 1-3 real tokens: 30x too high), and throughput's HF peer (the default) crashed on
    prompts of different lengths ("expected sequence of length 2 at dim 1")."""
    pytest.importorskip("transformers")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(["hi", "a b c", "ok then", "yo"]))
    base = ["--model", "random:tiny", "--kv-cache-memory", "16MiB", "--dataset", str(ds), "--input-len", "64",
            "--output-len", "3"]
    assert main(["bench", "latency", *base, "--iters", "2", "--peer", "none"]) == 0
    r = _strict(capsys.readouterr().out)
    assert 1 <= r["prompt_tokens_mean"] < 64
    assert r["decodekit"]["prefill_tok_s"] == pytest.approx(r["prompt_tokens_mean"] / r["decodekit"]["ttft_s"])
    assert main(["bench", "throughput", *base, "--num-prompts", "3", "--peer", "hf"]) == 0
    r = _strict(capsys.readouterr().out)
    assert 3 <= r["prompt_tokens"] < 3 * 64 and r["hf_transformers"]["output_tok_s"] > 0
    d = r["decodekit"]
    assert d["total_tok_s"] == pytest.approx((3 * 3 + r["prompt_tokens"]) / d["elapsed_s"])


@pytest.mark.parametrize("argv, words", [
    (["--dataset", "/nonexistent/ds.json"], ["argument --dataset", "no such file"]),   # was "[Errno 2] ..."
    (["--output-json", "/"], ["argument --output-json", "is a directory"]),          # was IsADirectoryError after the run
])
def test_bad_files_are_named_before_the_run(capsys, argv, words):
    _one_line_error(capsys, ["bench", "latency", *TINY, "--output-len", "2", *argv], *words)


def test_output_json_under_a_file(tmp_path, capsys):
    """Was: FileExistsError traceback once the benchmark had run."""
    f = tmp_path / "f"
    f.write_text("x")
    _one_line_error(capsys, ["bench", "throughput", *TINY, "--output-json", str(f / "r.json")],
                    "argument --output-json: cannot write")


def test_serve_without_a_server(capsys):
    """Was: an httpx.ConnectError traceback when no --model was given (the id is read from /v1/models)."""
    _one_line_error(capsys, ["bench", "serve", "--base-url", f"http://127.0.0.1:{_closed_port()}"],
                    "argument --base-url", "/v1/models", "--model")


def test_serve_result_is_strict_json(tmp_path, capsys):
    """Was: "request_rate": Infinity (the default rate), which strict JSON readers refuse."""
    out = tmp_path / "serve.json"
    rc = main(["bench", "serve", "--base-url", f"http://127.0.0.1:{_closed_port()}", "--model", "m",
               "--num-prompts", "2", "--input-len", "3", "--output-len", "2", "--timeout", "5",
               "--output-json", str(out)])
    assert rc == 1   # every request failed
    r = _strict(out.read_text())
    assert r["request_rate"] == "inf" and r["completed"] == 0 and r["failed"] == 2 and r["errors"]
    assert _strict(capsys.readouterr().out) == r


@pytest.mark.parametrize("argv, words", [
    (["--vocab", "0"], ["--vocab must be >= 1"]),                          # was "empty range for randrange()"
    (["--timeout", "-1"], ["--timeout must be"]),                          # was every request a "TimeoutError: "
    (["--timeout", "nan"], ["--timeout must be"]),
    (["--burstiness", "inf", "--request-rate", "10"], ["--burstiness must be"]),   # was gammavariate's message
    (["--base-url", "localhost:8000"], ["--base-url must start with http://"]),    # was every request failing
    (["--dataset", "/nonexistent.json"], ["argument --dataset"]),
])
def test_serve_bad_values(capsys, argv, words):
    base = ["bench", "serve", "--model", "m", "--num-prompts", "1", "--base-url", f"http://127.0.0.1:{_closed_port()}"]
    _one_line_error(capsys, base + argv, *words)


@pytest.mark.parametrize("sub", ["latency", "throughput", "serve"])
def test_help(capsys, sub):
    with pytest.raises(SystemExit) as e:
        main(["bench", sub, "--help"])
    assert e.value.code == 0 and "--output-json" in capsys.readouterr().out


def test_serve_launch_of_a_server_that_cannot_start(capsys):
    """Was: a RuntimeError traceback carrying the server log's last 2000 characters."""
    err = _one_line_error(capsys, ["bench", "serve", "--launch", "--model random:nosuch", "--num-prompts", "1",
                                   "--rounds", "1", "--low-load-prompts", "1", "--launch-timeout", "120"],
                          "argument --launch: the server exited with code 2", "random:nosuch", "(log: ")
    assert err.strip().splitlines()[-1].startswith("decodekit: error:")


def test_closed_stdout_and_unwritable_paths_are_no_tracebacks(tmp_path):
    """`decodekit plan | head -1` exits 0 without a BrokenPipeError traceback; an OSError on a path (a directory
    where a file is wanted) is one line naming the option. Was: tracebacks."""
    import subprocess
    import sys
    code = "import sys; from decodekit.cli import main; sys.exit(main(sys.argv[1:]))"
    p = subprocess.Popen([sys.executable, "-c", code, "plan"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"decodekit plan:")
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and "Traceback" not in err, err
    (tmp_path / "file").write_text("")
    r = subprocess.run([sys.executable, "-c", code, "plan", "--json", "--plot", str(tmp_path / "file" / "sub")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--plot" in r.stderr, r.stderr
