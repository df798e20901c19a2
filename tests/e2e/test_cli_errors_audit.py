"""Bad option values on the command line (input-robustness audit): one argparse-style line naming the option the
user typed (and the field, where it is spelled differently) with the allowed range, exit code 2, no traceback."""
import subprocess
import sys

import pytest


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "decodekit.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, expect", [
    # were "SamplingParams.seed: ..." (easily read as --seed) and "num_speculative_tokens must be ..." (no such option)
    (["--sample-seed", "-1"], "argument --sample-seed (seed): must be an int in [0, 2**63)"),
    (["--spec-k", "0"], "argument --spec-k: num_speculative_tokens must be an int in [1, 32], got 0"),
    (["--tp", "0"], "argument --tensor-parallel-size/--tp: tensor_parallel_size must be an int in [1, 64]"),
    (["--top-p", "0"], "argument --top-p (top_p): must be a number in (0, 1], got 0.0"),
    (["--temperature", "nan"], "argument --temperature (temperature): must be a finite number in [0, 100]"),
    (["--logprobs", "99"], "argument --logprobs (logprobs): must be an int in [0, 20]"),
    (["--block-size", "7"], "argument --block-size: block_size must be one of 8, 16, 32, 64, 128; got 7"),
    (["--seed", "-1"], "argument --seed: seed must be an int in [0, 2^63)"),
])
def test_bad_option_values_name_the_option(args, expect):
    r = _run("generate", "hi", *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("decodekit: error: ") and expect in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_options_checked_after_the_model_loads_name_the_option_too():
    r = _run("generate", "hi", "--max-num-seqs", "0", "--kv-cache-memory", "64MiB")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "argument --max-num-seqs: SchedulerConfig.max_num_seqs must be an int >= 1, got 0" in r.stderr, r.stderr


def test_chat_session_survives_a_refused_message():
    """Was: a line that is not valid UTF-8 (or a conversation grown past max_model_len) ended the whole chat
    session with exit code 2; now that message is refused with one error line and the chat goes on."""
    r = subprocess.run([sys.executable, "-m", "decodekit.cli", "chat", "--max-tokens", "4", "--temperature", "0",
                        "--kv-cache-memory", "64MiB"], input=b"Say hi\xff\nSay bye\n\n", capture_output=True,
                       timeout=300)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err
    assert "decodekit: error: prompt: not valid Unicode text" in err and "Traceback" not in err
    assert r.stdout.decode().count("> ") == 3 and r.stdout.decode().split("> ")[2].strip()  # the next turn answered


def test_generate_logprobs_are_printed_not_dropped_by_streaming():
    """Was: one prompt streamed its text and silently ignored --logprobs; now --logprobs prints when done."""
    r = _run("generate", "hello", "--model", "random:tiny", "--max-tokens", "3", "--logprobs", "2",
             "--kv-cache-memory", "16MiB")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("--- prompt 0 sample 0 (length) ---"), r.stdout
    per_token = [ln for ln in lines if ln.startswith("  ")]
    assert len(per_token) == 3 and all(ln.count(":") >= 3 for ln in per_token), r.stdout  # "  id: 'tok':lp, ..."
    h = " ".join(_run("generate", "--help").stdout.split())
    assert "it implies --no-" in h and "--n > 1 or --logprobs)" in h, h        # argparse may wrap at a hyphen


def test_chat_refuses_logprobs():
    """Was: silently ignored (chat streams its replies)."""
    r = _run("chat", "--logprobs", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == "decodekit: error: argument --logprobs: not supported by chat (use decodekit generate " \
                               "--logprobs)", r.stderr


def test_chat_refuses_n_other_than_one():
    """Was: silently ignored (a chat turn has one reply, which the conversation continues from)."""
    r = _run("chat", "--n", "3")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().startswith("decodekit: error: argument --n: chat answers each message once, so --n must "
                                       "be 1 (got 3;"), r.stderr


def test_chat_shows_the_reasoning_apart_and_takes_template_kwargs():
    """--reasoning-parser: the thinking is shown after "[thinking]" and kept apart in the history (the template
    gets it as reasoning_content); --chat-template-kwargs reaches the template; a bad value names the option."""
    r = subprocess.run([sys.executable, "-m", "decodekit.cli", "chat", "--max-tokens", "6", "--temperature", "0",
                        "--kv-cache-memory", "64MiB", "--reasoning-parser", "deepseek_r1"],
                       input=b"Say hi\nSay bye\n\n", capture_output=True, timeout=300)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    assert out.count("[thinking] ") == 2 and "\033[" not in out, out     # (no colours when not on a terminal)
    r = subprocess.run([sys.executable, "-m", "decodekit.cli", "chat", "--max-tokens", "3", "--temperature", "0",
                        "--kv-cache-memory", "64MiB", "--reasoning-parser", "qwen3",
                        "--chat-template-kwargs", '{"enable_thinking": false}'],
                       input=b"Say hi\n\n", capture_output=True, timeout=300)
    assert r.returncode == 0 and "[thinking]" not in r.stdout.decode(), r.stderr.decode()
    for args, expect in ((["chat", "--chat-template-kwargs", "{nope"], "argument --chat-template-kwargs: not JSON"),
                         (["chat", "--chat-template-kwargs", '{"messages": 1}'], "has its own parameter"),
                         (["generate", "hi", "--chat-template-kwargs", "{}"], None),
                         (["generate", "hi", "--chat-template-kwargs", '{"a": 1}'], "needs --chat-template"),
                         (["generate", "hi", "--reasoning-parser", "r1"], "argument --reasoning-parser: invalid choice")):
        r = _run(*args, "--max-tokens", "1", "--kv-cache-memory", "64MiB")
        if expect is None:
            assert r.returncode == 0, r.stderr
            continue
        assert r.returncode == 2 and expect in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args, expect", [
    # were: a driver RuntimeError traceback from inside the model load
    (["generate", "hi", "--device", "cuda"], "argument --device: device 'cuda': no CUDA device is visible"),
    # were: a traceback (-1) and a segfault (100000) from torch.set_num_threads; 0 was taken as "all cores"
    (["bench", "latency", "--input-len", "4", "--output-len", "2", "--peer", "none", "--threads", "-1"],
     "--threads must be in [1, "),
    (["bench", "latency", "--input-len", "4", "--output-len", "2", "--peer", "none", "--threads", "100000"],
     "--threads must be in [1, "),
    # were: a socket.gaierror traceback after the model loaded; accepted (the server started)
    (["serve", "--host", "999.1.1.1", "--port", "0"], "--host / --port 999.1.1.1:0: cannot listen there"),
    (["serve", "--shutdown-timeout", "nan"], "--shutdown-timeout must be a finite number of seconds >= 0"),
    (["serve", "--max-body-bytes", "0"], "--max-body-bytes must be >= 1, got 0"),
    # were: "argument --model: ..." (the draft's loader error taken for the target's)
    (["generate", "hi", "--max-tokens", "2", "--spec", "draft", "--spec-draft-model", "/no/such/draft.gguf",
      "--kv-cache-memory", "64MiB"], "argument --spec-draft-model: spec_draft_model '/no/such/draft.gguf'"),
    # was: the scheduler's line without the option that set max_tokens
    (["generate", "hi", "--max-tokens", "100000000", "--kv-cache-memory", "64MiB"],
     "argument --max-tokens: request '0': prompt ("),
])
def test_more_bad_values_name_the_option(args, expect):
    if args[:3] == ["generate", "hi", "--device"] and __import__("torch").cuda.is_available():
        pytest.skip("a GPU is visible here")
    r = _run(*args)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("decodekit: error: ")]  # (after load notes)
    assert len(errors) == 1 and expect in errors[0] and r.stderr.endswith(errors[0] + "\n"), r.stderr
    assert "Traceback" not in r.stderr


def test_serve_port_in_use_is_one_line():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = _run("serve", "--engine-in-thread", "--port", str(s.getsockname()[1]))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "cannot listen there (Address already in use)" in r.stderr, r.stderr
