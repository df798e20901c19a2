"""Chat templates: equal to transformers' apply_chat_template, message validation, sandbox."""
from __future__ import annotations

import pytest

from decodekit.tokenizer import Tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Tell me a joke"}, {"role": "assistant", "content": "No."},
     {"role": "user", "content": "Please? 🙂 日本語"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "line1\nline2\n\n  indented", "name": "extra keys are fine"}],
]


@pytest.mark.parametrize("conv", CONVERSATIONS)
@pytest.mark.parametrize("gen", [True, False])
def test_equal_transformers(tok, hf_tok, conv, gen):
    ours = tok.apply_chat_template(conv, add_generation_prompt=gen)
    theirs = hf_tok.apply_chat_template(conv, add_generation_prompt=gen, tokenize=False)
    assert ours == theirs
    assert tok.encode(ours) == hf_tok.encode(theirs)


def test_template_from_gguf(tok):
    assert tok.has_chat_template
    assert "<|im_start|>" in tok.chat_template
    out = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert out.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "SmolLM" in out  # the default system prompt of this template


@pytest.mark.parametrize("bad, match", [
    ("hello", "list"),
    ([], "empty"),
    (["hello"], r"messages\[0\] must be a dict"),
    ([{"content": "x"}], r"messages\[0\] has no 'role'"),
    ([{"role": "user"}], r"messages\[0\] has no 'content'"),
    ([{"role": "user", "content": None}], r"messages\[0\]\['content'\] must be a string"),
    ([{"role": "user", "content": "a"}, {"role": 3, "content": "b"}], r"messages\[1\]\['role'\] must be a string"),
    ([{"role": "user", "content": ["a"]}], r"'content'\] must be a string, got list"),
])
def test_validation(tok, bad, match):
    with pytest.raises(ValueError, match=match):
        tok.apply_chat_template(bad)


def test_raise_exception_and_kwargs(tok):
    tmpl = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
            "{{ greeting }} {{ messages[0]['content'] }}{{ eos_token }}{{ x | tojson }}")
    assert tok.apply_chat_template([{"role": "user", "content": "a"}], chat_template=tmpl, greeting="hey",
                                   x={"k": "é"}) == 'hey a<|im_end|>{"k": "é"}'
    with pytest.raises(ValueError, match="first must be user"):
        tok.apply_chat_template([{"role": "system", "content": "a"}], chat_template=tmpl, greeting="")


def test_sandbox(tok):
    conv = [{"role": "user", "content": "a"}]
    with pytest.raises(ValueError):  # immutable sandbox: no mutation of the inputs
        tok.apply_chat_template(conv, chat_template="{{ messages.append(1) }}")
    with pytest.raises(ValueError):
        tok.apply_chat_template(conv, chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ValueError):  # syntax errors are reported the same way
        tok.apply_chat_template(conv, chat_template="{% for %}")


def test_default_templates():
    syn = Tokenizer.synthetic(512)  # has <|im_start|>/<|im_end|>: ChatML
    assert not syn.has_chat_template
    out = syn.apply_chat_template([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    from tokenizers import Tokenizer as Backend, models
    plain = Tokenizer(Backend(models.BPE({"a": 0}, [])))
    out = plain.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert out == "System: s\n\nUser: u\n\nAssistant:"


@pytest.mark.parametrize("last", ['{"name": "', "Sure, here is", "  padded  ", "", "   "])
def test_continue_final_message_equals_transformers(tok, hf_tok, last):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": last}]
    want = hf_tok.apply_chat_template(conv, tokenize=False, continue_final_message=True)
    assert tok.apply_chat_template(conv, add_generation_prompt=False, continue_final_message=True) == want


def test_continue_final_message_errors(tok):
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(ValueError, match="cannot both be true"):
        tok.apply_chat_template(conv, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ValueError, match="verbatim"):
        tok.apply_chat_template(conv, add_generation_prompt=False, continue_final_message=True,
                                chat_template="{% for m in messages %}{{ m.content | upper }}{% endfor %}")


def test_templates_cannot_build_huge_outputs():
    """Third audit: a (trusted request's) template of nested loops rendered 17 GB before the kernel killed the
    server. Rendering now streams and stops past the caller's limit; `*` and `**` refuse sizes no prompt has."""
    from decodekit.tokenizer.chat import RenderedTooLongError, render_chat_template
    msgs = [{"role": "user", "content": "hi"}]

    def render(t, limit=10_000):
        return render_chat_template(t, msgs, add_generation_prompt=True, special_tokens={}, max_chars=limit)
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    with pytest.raises(RenderedTooLongError, match="passes 10000 characters"):
        render(loops)
    assert render("{% for i in range(3) %}ab{% endfor %}", 6) == "ababab"
    with pytest.raises(RenderedTooLongError):
        render("{% for i in range(3) %}ab{% endfor %}", 5)
    for t, what in (("{{ 'x' * 10**9 }}", "str of 1 times 1000000000"), ("{{ [0] * 10**9 }}", "list"),
                    ("{{ 9 ** (10**8) }}", "9 \\*\\* 100000000 is too large")):
        with pytest.raises(ValueError, match=what):
            render(t)
    assert render("{{ 2 ** 10 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 3 * 4 }}") == "1024 ababab [1, 1] 12"
