"""Differential audit of the JSON-schema guide against the ``jsonschema`` package (draft 2020-12, format
checking on) and the spec, driving ``json_schema_guide`` the way guided decoding runs it: its regex or rule
set compiled to the byte-level LazyDFA / LazyPDA, stepped byte by byte (and token by token over a toy
vocabulary).

(a) soundness: random walks through the automaton (a random live byte per step, chosen by the state it leads
    to so structure, escapes and multi-byte characters come up often, then the shortest way to an accepting
    state) are UTF-8, parse as JSON and are valid instances;
(b) completeness: valid instances (hand-written edge cases and random ones, serialised as ``json.dumps``
    does, with and without spaces) are accepted, except where a documented deviation narrows the language;
(c) unsupported keywords and impossible schemas raise JSONSchemaError naming the keyword (never another
    exception), and a guide is never silently built for them.

The oracle: jsonschema with numbers parsed as Decimal (schema values are mathematical: "0.99999999999999999"
is below 1 though it rounds to 1.0 as a float), an integral Decimal counted as an integer, ``pattern`` with
ECMA-262 semantics (the spec's; jsonschema uses Python's ``re``, whose ``\\w \\d \\s`` are Unicode) and the
documented full match (narrower than the spec's search), ``uri`` checked by an RFC 3986 parser written here
(jsonschema checks it only with an optional package). Plus one regression test per bug fixed in
json_schema.py."""
import copy
import json
import random
import re
from collections import deque
from decimal import Decimal, localcontext
from urllib.parse import quote

import numpy as np
import pytest

from decodekit.sampling.guided import DEAD, Guide, LazyDFA, LazyPDA, RuleSet, compile_nfa
from decodekit.sampling.guided.automaton import TokenVocab
from decodekit.sampling.guided.json_schema import JSONSchemaError, json_schema_guide, json_schema_to_regex
from decodekit.sampling.guided.pda import compile_rules

jsonschema = pytest.importorskip("jsonschema")


# ---------------------------------------------------------------- driving the guide

def automaton(schema, ws=None):
    g = json_schema_guide(schema, whitespace=ws)
    return LazyPDA(compile_rules(g)) if isinstance(g, RuleSet) else LazyDFA(compile_nfa(g))


def accepts(a, text):
    s = a.step(a.start, text.encode("utf-8"))
    return s != DEAD and a.is_accepting(s)


def _moves(a, sid):
    """{next state: [bytes leading there]} of the live bytes in state sid."""
    a.expand(sid)
    row, out = a.trans[sid], {}
    for b in np.nonzero(row != DEAD)[0].tolist():
        out.setdefault(int(row[b]), []).append(b)
    return out


def _finish(a, sid, limit=50_000):
    """The shortest byte string from sid to an accepting state (breadth-first over the lazy automaton)."""
    prev, queue = {sid: None}, deque([sid])
    while queue:
        s = queue.popleft()
        if a.is_accepting(s):
            path = bytearray()
            while prev[s] is not None:
                s, b = prev[s]
                path.append(b)
            return bytes(reversed(path))
        for t, bs in _moves(a, s).items():
            if t not in prev:
                prev[t] = (s, bs[0])
                queue.append(t)
        assert len(prev) < limit, "no accepting state within reach"
    raise AssertionError("a live state that cannot finish")


def walk(a, rng, max_steps=100):
    sid, out = a.start, bytearray()
    for _ in range(rng.randint(0, max_steps)):
        if a.is_accepting(sid) and rng.random() < 0.15:
            break
        moves = _moves(a, sid)
        assert moves or a.is_accepting(sid), bytes(out)
        if not moves:
            break
        sid, bs = rng.choice(list(moves.items()))
        out.append(rng.choice(bs))
    return bytes(out) + _finish(a, sid)


# ---------------------------------------------------------------- the oracle

_E_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"   # ECMA-262 \s
_E_NONSPACE = "\x00-\x08\x0e-\x1f!-\x9f\xa1-\u167f\u1681-\u1fff\u200b-\u2027\u202a-\u202e\u2030-\u205e" \
              "\u2060-\u2fff\u3001-\ufefe\uff00-\U0010ffff"


def ecma(pattern):
    """An ECMA-262 pattern (the subset used here) as a Python pattern of the same meaning (compiled with
    re.ASCII for \\d \\w): '.' excludes all line terminators, \\s / \\S are ECMA's Unicode sets, '^' / '$'
    match only at the ends."""
    out, i, items = [], 0, None          # items: where the current class's items start (None: outside one)
    sets = {"\\s": _E_SPACE, "\\S": _E_NONSPACE}
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            e = pattern[i:i + 2]
            out.append(e if e not in sets else sets[e] if items is not None else f"[{sets[e]}]")
            i += 2
        elif items is None and c == "[":
            items = i + 1 + (pattern[i + 1:i + 2] == "^")
            out.append(pattern[i:items])
            i = items
        else:
            if items is not None and c == "]" and i > items:
                items = None
            out.append(c if items is not None or c == "]" else
                       {".": "[^\n\r\u2028\u2029]", "^": r"\A", "$": r"\Z"}.get(c, c))
            i += 1
    return "".join(out)


def _full_pattern(validator, pattern, instance, schema):
    if isinstance(instance, str) and not re.fullmatch(ecma(pattern), instance, re.ASCII):
        yield jsonschema.ValidationError(f"{instance!r} does not fully match {pattern!r} (ECMA-262)")


_URI_PARTS = re.compile(r"(([^:/?#]+):)?(//([^/?#]*))?([^?#]*)(\?([^#]*))?(#(.*))?")   # RFC 3986 appendix B
_PCT, _US = r"%[0-9A-Fa-f]{2}", r"A-Za-z0-9\-._~!$&'()*+,;="


def is_uri(s):
    """RFC 3986 ``URI`` (scheme, authority, path, query, fragment checked one by one)."""
    m = _URI_PARTS.fullmatch(s)
    scheme, auth, path, query, frag = m[2], m[4], m[5], m[7], m[9]
    pchar = rf"(?:[{_US}:@]|{_PCT})"
    if scheme is None or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+\-.]*", scheme):
        return False
    if auth is not None:
        info, at, hostport = auth.rpartition("@")
        if at and not re.fullmatch(rf"(?:[{_US}:]|{_PCT})*", info):
            return False
        if hostport.startswith("["):
            host, close, port = hostport.partition("]")
            if not close or not re.fullmatch(r"\[[0-9A-Fa-f:.]+", host) or not re.fullmatch(r"(?::[0-9]*)?", port):
                return False
        else:
            host, _, port = hostport.partition(":")
            if not re.fullmatch(rf"(?:[{_US}]|{_PCT})*", host) or not re.fullmatch("[0-9]*", port):
                return False
        if path and not path.startswith("/"):
            return False
    elif path.startswith("//"):
        return False
    return all(re.fullmatch(rf"{pchar}*", seg) for seg in path.split("/")) and all(
        x is None or re.fullmatch(rf"(?:{pchar}|[/?])*", x) for x in (query, frag))


FORMATS = copy.deepcopy(jsonschema.Draft202012Validator.FORMAT_CHECKER)     # (date-time / time: rfc3339-validator)
FORMATS.checks("uri")(lambda s: not isinstance(s, str) or is_uri(s))


def _is_integer(checker, x):
    if isinstance(x, Decimal):
        return x.is_finite() and (x.as_tuple().exponent >= 0 or x == x.to_integral_value())
    return jsonschema.Draft202012Validator.TYPE_CHECKER.is_type(x, "integer")


_Oracle = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"pattern": _full_pattern},
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer))


def _decimals(x):
    if isinstance(x, float):
        return Decimal(repr(x))
    if isinstance(x, dict):
        return {k: _decimals(v) for k, v in x.items()}
    return [_decimals(v) for v in x] if isinstance(x, list) else x


def _number(text):
    try:
        return Decimal(text)
    except ArithmeticError:                 # an exponent past Decimal's range (unbounded numbers only)
        return float(text)


def oracle(schema):
    v = _Oracle(_decimals(schema), format_checker=FORMATS)

    def valid(text):
        return v.is_valid(json.loads(text, parse_float=_number))
    return valid


# ---------------------------------------------------------------- the schemas

ALPHABET = ["a", "Z", "0", " ", '"', "\\", "/", "\n", "\t", "\x00", "\x1f", "\x7f", "é", "€", "😀", "\u2028",
            "\ud7ff", "\ue000", "\U0010ffff", "{", "}"]
KEYS = ["k", "é", 'q"t', "a/b", "x~y", "\n", "😀", ""]
NODE = {"type": "object", "properties": {"v": {"type": "integer"},
                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False}
SCHEMAS = {
    # types, integer vs number, bounds (negative, fractional, huge, exclusive)
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "int_bounds": {"type": "integer", "minimum": -17, "exclusiveMaximum": 1000},
    "int_frac_neg": {"type": "integer", "exclusiveMinimum": -7.5, "maximum": -0.5},
    "int_huge": {"type": "integer", "minimum": 10 ** 20, "maximum": 10 ** 20 + 5},
    "int_float_bounds": {"type": "integer", "minimum": -1e20, "exclusiveMaximum": 1e19, "multipleOf": 1},
    "num_bounds": {"type": "number", "exclusiveMinimum": -3, "maximum": 0},
    "num_neg": {"type": "number", "exclusiveMinimum": -2, "maximum": -1.0},
    "num_huge": {"type": "number", "exclusiveMinimum": 10 ** 20, "exclusiveMaximum": 10 ** 20 + 1},
    "num_point": {"type": "number", "minimum": 7, "maximum": 7},
    # strings: lengths count code points after unescaping; formats; patterns
    "string": {"type": "string"},
    "str_len": {"type": "string", "minLength": 2, "maxLength": 3},
    "str_empty": {"type": "string", "maxLength": 0},
    "str_min": {"type": "string", "minLength": 4},
    "date": {"type": "string", "format": "date", "examples": ["2024-02-29", "0001-01-01", "9999-12-31"]},
    "date_time": {"type": "string", "format": "date-time",
                  "examples": ["2024-01-05T10:20:30Z", "2023-06-30T23:59:59.125+05:30", "1999-12-31T00:00:00-23:59"]},
    "time": {"type": "string", "format": "time", "examples": ["00:00:00Z", "12:34:56.789-01:00"]},
    "uuid": {"type": "string", "format": "uuid", "examples": ["123e4567-e89b-12d3-a456-426614174000",
                                                             "ABCDEF01-2345-6789-ABCD-EF0123456789"]},
    "ipv4": {"type": "string", "format": "ipv4", "examples": ["192.168.0.1", "0.0.0.0", "255.255.255.255"]},
    "email": {"type": "string", "format": "email", "examples": ["a@b.co", "x.y+z@mail.example.org"]},
    "uri": {"type": "string", "format": "uri",
            "examples": ["https://example.com/a?b=c#d", "urn:isbn:0451450523", "http://u:p@h:8080/%20x", "a:"]},
    "pattern_anchored": {"type": "string", "pattern": r"^[a-z]+-\d{2}$", "examples": ["ab-01", "z-99"]},
    "pattern_free": {"type": "string", "pattern": "b+c?", "examples": ["b", "bbc"]},
    "pattern_dot": {"type": "string", "pattern": "^a.c$", "examples": ["abc", 'a"c', "aéc", "a\tc", "a😀c"]},
    "pattern_spaces": {"type": "string", "pattern": r"^\S+\s[^\s]$", "examples": ["ab x", "é\tZ", "😀\n😀"]},
    "pattern_escapes": {"type": "string", "pattern": r'^["\\/\n\u0001é]{1,3}$', "examples": ['"', "\\/", "\n\x01é"]},
    # enum / const of every JSON type
    "enum": {"enum": ["red", 1, 2.5, -7, 1e100, True, False, None, {"a": [1, "x"], "é": {}}, [], [None, [True]],
                      'q"\\', "é\n\t", "😀\u2028", ""]},
    "const_object": {"const": {"b": 1, "a": [True, "\u2028", {"n": None}]}},
    "const_string": {"const": "tab\there \"q\" \\ \x01 é 😀"},
    "enum_typed": {"type": "integer", "enum": [1, 2.0, "x", 3.5, True, None]},
    # anyOf / oneOf / allOf / type lists / nullable
    "any_of": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "maximum": 0}, {"type": "null"},
                         {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]},
    "one_of": {"oneOf": [{"type": "string"}, {"type": "boolean"}, {"type": "object", "properties": {
        "k": {"const": 1}}, "required": ["k"], "additionalProperties": False}]},
    "any_of_siblings": {"type": "object", "properties": {"a": {"type": "integer"}},
                        "anyOf": [{"required": ["a"]}, {"properties": {"b": {"type": "null"}}, "required": ["b"]}]},
    "all_of": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"type": "string", "maxLength": 3}}}, {"minProperties": 1}]},
    "all_of_numbers": {"allOf": [{"type": "number"}, {"type": "integer", "minimum": 0}, {"maximum": 99}]},
    "type_list": {"type": ["string", "integer", "null"], "maxLength": 2, "minimum": 3},
    "nullable": {"type": "string", "nullable": True, "maxLength": 4},
    # $ref / $defs / definitions, recursion, refs to '#'
    "tree": {"$defs": {"node": NODE}, "$ref": "#/$defs/node"},
    "linked": {"type": "object", "properties": {"head": {"type": "string"},
                                                "tail": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
               "required": ["head", "tail"], "additionalProperties": False},
    "definitions": {"definitions": {"p": {"type": "integer", "minimum": 5}, "q": {"$ref": "#/definitions/p"}},
                    "type": "array", "items": {"$ref": "#/definitions/q"}},
    "nested_arrays": {"type": "array", "items": {"$ref": "#"}, "maxItems": 3},
    # objects
    "object": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "string"}, "z": {"type": "boolean"}, "w": {"type": "null"}},
        "required": ["y", "w"]},
    "all_optional": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "string", "maxLength": 1}},
                     "additionalProperties": False},
    "keys": {"type": "object", "properties": {k: {"type": "integer"} for k in KEYS}, "required": ["é", 'q"t']},
    "ap_schema": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}, "maxProperties": 3},
    "ap_false": {"type": "object", "additionalProperties": False},
    "ap_true_props": {"type": "object", "properties": {"a": {"type": "boolean"}}, "additionalProperties": True},
    "false_property": {"type": "object", "properties": {"a": False, "b": {"type": "integer"}, "c": True}},
    "min_props": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}},
                  "minProperties": 1},
    # arrays
    "array": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4, "uniqueItems": False},
    "tuple": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
    "tuple_rest": {"type": "array", "prefixItems": [{"const": "x"}], "items": {"type": "number", "maximum": 0},
                   "minItems": 1, "maxItems": 3},
    "array_free": {"type": "array"},
    # schema-free
    "empty": {},
    "true": True,
    "object_free": {"type": "object"},
}
# instances the walks can't reach often enough: checked by hand
HAND_VALID = {
    "integer": ["0", "-1", str(10 ** 30), "-" + str(10 ** 30)],
    "number": ["0", "-0", "-0.0", "1e5", "1E+5", "2.5e-7", "0.00000000000000000001",
               "123456789012345678901234567890.5"],
    "int_bounds": ["-17", "999", "0"], "int_frac_neg": ["-7", "-1"], "int_huge": [str(10 ** 20), str(10 ** 20 + 5)],
    "int_float_bounds": [str(-10 ** 20), str(10 ** 19 - 1)],
    "num_bounds": ["0", "0.0", "-2.9999999999999999999999", "-0.5"],
    "num_neg": ["-1", "-1.0", "-1.9999999999999999999999"],
    "num_huge": ["100000000000000000000.5", "100000000000000000000.99999999999999"], "num_point": ["7", "7.000"],
    "string": ['""', '"\\u0041\\ud83d\\ude00\\/"', '"😀é\u2028\x7f"'],
    "str_len": ['"ab"', '"😀😀"', '"\\u00e9\\n"', '"\\ud83d\\ude00\\ud83d\\ude00\\ud83d\\ude00"', '"a\\\\"'],
    "str_empty": ['""'], "str_min": ['"😀😀😀😀"', '"\\ud83d\\ude00abc"'],
    "uri": ['"https://example.com/a?b=c#d"', '"mailto:a@b.c"', '"http://x/%20y"', '"foo:/a//b"'],
    "enum": ['"red"', '1', '2.5', '1e+100', '{"a": [1, "x"], "é": {}}', '[]', '[null, [true]]', '"q\\"\\\\"',
             '"é\\n\\t"', '""'],
    "enum_typed": ["1", "2.0"],
    "const_object": ['{"b": 1, "a": [true, "\u2028", {"n": null}]}'],
    "const_string": [json.dumps("tab\there \"q\" \\ \x01 é 😀", ensure_ascii=False)],
    "tree": ['{"v": 0}', '{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4}]}]}'],
    "linked": ['{"head": "a", "tail": {"head": "b", "tail": {"head": "c", "tail": null}}}'],
    "keys": ['{"é": 1, "q\\"t": 2}', '{"k": 0, "é": 1, "q\\"t": 2, "a/b": 3, "x~y": 4, "\\n": 5, "😀": 6, "": 7}'],
    "tuple": ["[]", '["a"]', '["a", 1]'], "tuple_rest": ['["x"]', '["x", -1.5, 0]'],
    "false_property": ["{}", '{"b": 1, "c": [{}]}'],
    "ap_schema": ["{}", '{"é": 0, "": 7}'], "ap_false": ["{}"],
    "all_of": ['{"a": 1}', '{"a": -1, "b": "xyz"}'],
}


# ---------------------------------------------------------------- (a) soundness

@pytest.mark.parametrize("name", list(SCHEMAS))
def test_random_walks_are_valid_instances(name):
    schema = SCHEMAS[name]
    a, valid, rng = automaton(schema), oracle(schema), random.Random(name)
    for _ in range(80):
        text = walk(a, rng).decode("utf-8")           # (strict: the automaton only spells UTF-8)
        assert valid(text), (name, text)


@pytest.mark.parametrize("ws", [r"[ \t\n]*", "", r"\n?  "])
@pytest.mark.parametrize("name", ["object", "enum", "tree", "tuple_rest", "empty", "keys", "ap_schema"])
def test_walks_with_other_whitespace_are_valid(name, ws):
    schema = SCHEMAS[name]
    a, valid, rng = automaton(schema, ws), oracle(schema), random.Random(name + ws)
    for _ in range(40):
        text = walk(a, rng).decode("utf-8")
        assert valid(text), (name, ws, text)
        assert text == text.strip(), text                   # never around the top-level value


def _toy_vocab():
    """EOS (id 0), every single byte, and multi-byte tokens that cross JSON's structure and UTF-8."""
    multi = ['{"', '"}', '":', '": ', ', "', '",', '[', '],', '}]', 'true', 'false', 'null', '\\u00', '\\"', '\\\\',
             'é', '😀', '12', '-0.', '.5', 'e+', ' {', '"a', 'ab', '20', '-0', 'T1', ':0', '0Z', '@b.', '://',
             'ud83d', '\\n"', '""', '"x"', '1,', '}', '{}', '[]']
    return TokenVocab([None] + [bytes([b]) for b in range(256)] + [t.encode() for t in multi])


@pytest.mark.parametrize("name", ["object", "enum", "tree", "str_len", "date_time", "uri", "tuple_rest", "any_of"])
def test_token_walks_are_valid_instances(name):
    """A sampler's view: a random allowed token per step (every allowed token keeps the state alive), EOS
    allowed only in accepting states, then single-byte tokens to the nearest accepting state."""
    schema, vocab = SCHEMAS[name], _toy_vocab()
    a = automaton(schema)
    g, valid, rng = Guide(a, vocab, [0]), oracle(schema), random.Random(name)
    for _ in range(30):
        sid, out = g.initial, b""
        for _ in range(rng.randint(0, 40)):
            if a.is_accepting(sid) and rng.random() < 0.2:
                break
            rows = g.allowed_rows(sid).tolist()
            assert 0 not in rows and all(g.next_state(sid, t) != DEAD for t in rows)
            assert rows or a.is_accepting(sid)
            if not rows:
                break
            tok = rng.choice(rows)
            sid, out = g.next_state(sid, tok), out + vocab.token_bytes[tok]
        text = (out + _finish(a, sid)).decode("utf-8")
        assert valid(text), (name, text)


# ---------------------------------------------------------------- (b) completeness

class _Skip(Exception):
    pass


class Gen:
    """Random instances (Python values, Decimal numbers) of the schemas above; the oracle filters out the ones
    this naive generator gets wrong (oneOf overlaps, exclusive bounds), so it only needs to hit valid ones often."""

    def __init__(self, root, rng):
        self.root, self.rng, self.depth = root, rng, 0

    def any(self, d=2):
        r = self.rng
        if d <= 0 or r.random() < 0.5:
            return r.choice([None, True, False, r.randint(-99, 99), Decimal(r.randint(-999, 999)) / 8,
                             self.text(r.randint(0, 3)), 10 ** 25, Decimal("1E-7")])
        if r.random() < 0.5:
            return [self.any(d - 1) for _ in range(r.randrange(3))]
        return {r.choice(KEYS) + str(i): self.any(d - 1) for i in range(r.randrange(3))}

    def text(self, n):
        return "".join(self.rng.choice(ALPHABET) for _ in range(n))

    def __call__(self, s):
        r = self.rng
        if s is True or s == {}:
            return self.any()
        if s is False:
            raise _Skip
        if "$ref" in s:
            node = self.root
            for tok in s["$ref"][1:].split("/")[1:]:
                node = node[tok.replace("~1", "/").replace("~0", "~")]
            self.depth += 1
            try:
                if self.depth > 6:
                    raise _Skip
                return self(node)
            finally:
                self.depth -= 1
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                rest = {k: v for k, v in s.items() if k != kw}
                branch = r.choice(s[kw])
                return self({**rest, **branch, "required": rest.get("required", []) + branch.get("required", []),
                             "properties": {**rest.get("properties", {}), **branch.get("properties", {})}})
        if "allOf" in s:
            merged = {k: v for k, v in s.items() if k != "allOf"}
            for part in s["allOf"]:
                merged.update({**part, "required": merged.get("required", []) + part.get("required", []),
                               "properties": {**merged.get("properties", {}), **part.get("properties", {})}})
            return self(merged)
        if "enum" in s or "const" in s:
            return r.choice(s.get("enum", [s.get("const")]))
        t = s.get("type") or r.choice(["object"] if "properties" in s else ["array"] if "items" in s else
                                      ["string", "number", "null", "boolean"])
        t = r.choice(t) if isinstance(t, list) else t
        return getattr(self, "g_" + t)(s)

    def g_null(self, s):
        return None

    def g_boolean(self, s):
        return self.rng.random() < 0.5

    def g_integer(self, s):
        return int(self.g_number(s, True))

    def g_number(self, s, integer=False):
        with localcontext() as ctx:
            ctx.prec = 100
            return self._number(s, integer)

    def _number(self, s, integer):
        r = self.rng
        lo = max([Decimal(repr(s[k])) for k in ("minimum", "exclusiveMinimum") if k in s], default=None)
        hi = min([Decimal(repr(s[k])) for k in ("maximum", "exclusiveMaximum") if k in s], default=None)
        lo = hi - 10 ** r.randint(0, 25) if lo is None and hi is not None else lo
        lo = Decimal(-(10 ** r.randint(0, 25))) if lo is None else lo
        hi = lo + 10 ** r.randint(0, 25) if hi is None else hi
        v = r.choice([lo, hi, lo + 1, hi - 1]) if r.random() < 0.4 else lo + (hi - lo) * Decimal(r.random())
        v = v.to_integral_value() if integer or r.random() < 0.3 else v.quantize(Decimal(1).scaleb(-r.randint(1, 25)))
        return v.copy_abs() if v == 0 else v                # (bounded numbers: no negative zero, a narrowing)

    def g_string(self, s):
        if "examples" in s:
            return self.rng.choice(s["examples"])
        lo = s.get("minLength", 0)
        return self.text(self.rng.randint(lo, s.get("maxLength", lo + 5)))

    def g_array(self, s):
        r, prefix = self.rng, s.get("prefixItems", [])
        items = s.get("items", None if prefix else True)
        hi = s.get("maxItems", len(prefix) + 3)
        hi = min(hi, len(prefix)) if items in (None, False) else hi
        hi = min(hi, max(s.get("minItems", 0), 1)) if self.depth > 2 else hi       # (recursion: end soon)
        return [self(prefix[i] if i < len(prefix) else items) for i in range(r.randint(s.get("minItems", 0), hi))]

    def g_object(self, s):
        r, props, req = self.rng, s.get("properties"), s.get("required", [])
        if props is None:
            n = r.randint(s.get("minProperties", 0), s.get("maxProperties", 3))
            return {r.choice(KEYS) + str(i): self(s.get("additionalProperties", True)) for i in range(n)}
        out = {}
        for k, sub in props.items():
            if k in req or r.random() < 0.5 and self.depth <= 2:
                try:
                    out[k] = self(sub)
                except _Skip:
                    pass
        return out


def dumps(v, compact=False, ascii=False):
    """json.dumps(v, ensure_ascii=ascii, separators compact or not) that writes Decimals as plain decimals."""
    c, col = (",", ":") if compact else (", ", ": ")
    if isinstance(v, dict):
        return "{" + c.join(f"{json.dumps(k, ensure_ascii=ascii)}{col}{dumps(x, compact, ascii)}"
                            for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + c.join(dumps(x, compact, ascii) for x in v) + "]"
    return format(v, "f") if isinstance(v, Decimal) else json.dumps(v, ensure_ascii=ascii)


# schemas whose strings may also be written with \\u escapes (no enum / const / pattern / format strings, no
# property names: those are spelled as an encoder writes them, a documented narrowing)
ESCAPES_OK = {"string", "str_len", "str_min", "object", "ap_schema", "tree", "linked", "empty", "true",
              "all_of", "any_of", "array_free", "object_free", "nested_arrays"}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_valid_instances_are_accepted(name):
    schema = SCHEMAS[name]
    a, valid, rng = automaton(schema), oracle(schema), random.Random("complete-" + name)
    gen, texts = Gen(schema, rng), list(HAND_VALID.get(name, []))
    for _ in range(60):
        try:
            v = gen(schema)
        except _Skip:
            continue
        texts += [dumps(v), dumps(v, compact=True)]
        if name in ESCAPES_OK:
            texts.append(dumps(v, ascii=True))
    checked = 0
    for text in texts:
        if text in HAND_VALID.get(name, []) or valid(text):
            assert valid(text), (name, text)
            assert accepts(a, text), (name, text)
            checked += 1
    assert checked >= 25, (name, checked)


def test_whitespace_rules():
    a = automaton({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})
    for ok in ['{"a": [1, 2]}', '{"a":[1,2]}', '{ "a" : [ 1 , 2 ] }', "{}", "{ }", '{"a": []}', '{"a": [ ]}']:
        assert accepts(a, ok), ok
    for bad in [' {"a": [1]}', '{"a": [1]} ', '{"a":  [1]}', '{"a":\n[1]}', '{"a": [1,\t2]}', '{"a": [1 2]}']:
        assert not accepts(a, bad), bad
    a = automaton(SCHEMAS["object"], ws=r"[ \t\n]*")
    for indent in (2, "\t", None):
        assert accepts(a, json.dumps({"x": 1, "y": "s", "z": True, "w": None}, indent=indent))


def test_documented_narrowings():
    """Valid instances the guide deliberately does not generate (json_schema.py's docstring)."""
    def rejects(schema, text):
        assert oracle(schema)(text) and not accepts(automaton(schema), text), (schema, text)
    obj = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    rejects(obj, '{"b": 1, "a": 2}')                                  # declared key order
    rejects(obj, '{"a": 1, "c": 2}')                                  # no extra keys next to properties
    rejects({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1, 2]")   # nothing after the tuple
    assert re.search(ecma("b"), "abc") and not accepts(automaton({"type": "string", "pattern": "b"}), '"abc"')
    rejects({"type": "string", "pattern": r"^\s$"}, '"\u00a0"')       # \s generates ASCII spaces
    rejects({"type": "integer"}, "1.0")                               # canonical integers
    rejects({"type": "integer"}, "-0")
    rejects({"type": "number", "maximum": 5}, "1e0")                  # bounded numbers: no exponent
    assert not accepts(automaton({"type": "string", "nullable": True}), "null")   # OpenAPI's nullable: ignored
    rejects({"enum": ["é"]}, '"\\u00e9"')                             # enum strings as an encoder writes them
    rejects({"const": {"a": 1, "b": 2}}, '{"b": 2, "a": 1}')         # const objects in their key order
    rejects({"type": "object", "properties": {"é": {}}}, '{"\\u00e9": 1}')   # property names likewise
    rejects({"minimum": 3}, '"x"')                                    # keywords imply their type
    # the one widening left: oneOf is anyOf (an instance matching two branches is generated)
    one_of = {"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 5}]}
    assert accepts(automaton(one_of), "3") and not oracle(one_of)("3")


# ---------------------------------------------------------------- regression tests (bugs fixed in json_schema.py)

def _both(schema, good=(), bad=()):
    """The guide accepts the valid `good` texts and refuses the invalid `bad` ones (checked by the oracle)."""
    a, valid = automaton(schema), oracle(schema)
    for t in good:
        assert valid(t) and accepts(a, t), (schema, t)
    for t in bad:
        assert not valid(t) and not accepts(a, t), (schema, t)


def test_all_of_additional_properties_constrain_the_other_parts_properties():
    """additionalProperties holds for every key its own part's properties don't list, so another part's
    properties too (was: merged as if it only saw the merged properties, letting {"a": 1} through)."""
    _both({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"additionalProperties": False}]},
          good=["{}"], bad=['{"a": 1}'])
    _both({"type": "object", "additionalProperties": {"type": "integer"},
           "anyOf": [{"properties": {"a": {"type": ["integer", "string"]}, "b": {"type": "string"}}}]},
          good=["{}", '{"a": 1}'], bad=['{"a": "x"}', '{"b": "x"}'])
    with pytest.raises(JSONSchemaError, match="no JSON value"):
        json_schema_guide({"allOf": [{"properties": {"a": {}}, "required": ["a"]}, {"additionalProperties": False}]})


def test_all_of_items_constrain_the_other_parts_prefix_items():
    _both({"allOf": [{"type": "array", "prefixItems": [{"type": "integer"}]}, {"items": {"type": "string"}}]},
          good=["[]"], bad=["[1]"])
    _both({"type": "array", "items": {"type": "number"}, "allOf": [{"prefixItems": [{"type": ["integer", "null"]}]}]},
          good=["[]", "[1]", "[1, 2.5]"], bad=["[null]"])


def test_extension_keywords_never_conflict_in_merges():
    _both({"allOf": [{"type": "integer", "x-a": 1}, {"x-a": 2, "minimum": 0}]}, good=["0", "7"], bad=["-1"])


def test_percent_encoded_ref_pointers_resolve():
    """A $ref is a URI: its fragment's JSON pointer is percent-encoded (RFC 6901 section 6)."""
    schema = {"$defs": {"a b": {"type": "integer"}, "ü%": {"type": "null"}},
              "type": "array", "prefixItems": [{"$ref": "#/$defs/a%20b"}, {"$ref": "#/$defs/" + quote("ü%")}]}
    _both(schema, good=["[1, null]"], bad=['["x"]'])


def test_string_lengths_count_code_points_after_unescaping():
    """A surrogate pair written as two \\u escapes is one character (was: two, so minLength 2 let one emoji
    through and maxLength 1 refused it); lone surrogates are not generated for counted strings."""
    _both({"type": "string", "minLength": 2}, good=['"\\ud83d\\ude00a"', '"ab"'], bad=['"\\ud83d\\ude00"'])
    _both({"type": "string", "maxLength": 1}, good=['"\\ud83d\\ude00"', '"😀"', '"\\u00e9"', '"\\\\"'],
          bad=['"\\ud83d\\ude00a"'])
    a = automaton({"type": "string", "maxLength": 2})
    assert not accepts(a, '"\\ud83d"') and not accepts(a, '"\\ude00\\ud83d"')


def test_const_and_enum_compare_as_json():
    """Booleans are not numbers at any depth ([true] != [1]; Python's == says they are)."""
    _both({"const": [1], "enum": [[True], [1], {"a": False}]}, good=["[1]"], bad=["[true]"])
    _both({"const": {"a": 0}, "enum": [{"a": False}, {"a": 0.0}]}, good=['{"a": 0.0}'], bad=['{"a": false}'])


def test_uri_format_is_rfc3986():
    """(was: any ':'-separated text: ports that are not digits, two '@'s)"""
    schema = {"type": "string", "format": "uri"}
    assert FORMATS.conforms("http://u:p@h:8/x?y#z", "uri") and not FORMATS.conforms("http://x:y", "uri")
    _both(schema, good=['"http://u:p@h:8/x?y#z"', '"urn:a:b"', '"s:"', '"file:///a"', '"x:/%41//b"'],
          bad=['"http://x:y"', '"http://a@b@c"', '"http://x:1:2/"', '"a:b#c#d"', '"http://x/%zz"'])


def test_pattern_dot_and_non_space_follow_ecma():
    """'.' excludes ECMA's line terminators (\\r, U+2028, U+2029, not only \\n) and \\S / [^\\s] exclude
    ECMA's Unicode spaces (was: NBSP, U+2028, U+FEFF... generated for \\S)."""
    for pattern in (r"^\S$", r"^[^\s]$", r"^[\S]$"):
        _both({"type": "string", "pattern": pattern}, good=['"a"', '"é"'],
              bad=['"\u00a0"', '"\u2028"', '"\ufeff"', '"\u3000"', '" "'])
    _both({"type": "string", "pattern": "^a.c$"}, good=['"abc"', '"a\\tc"'],
          bad=['"a\\rc"', '"a\u2028c"', '"a\u2029c"', '"a\\nc"'])
    _both({"type": "string", "pattern": r"^[^\S]$"}, good=['" "', '"\\t"'], bad=['"a"'])
    _both({"type": "string", "pattern": r"^[.\s]$"}, good=['"."', '" "'], bad=['"a"'])
    a = automaton({"type": "string", "pattern": r"(?#[.)\S."})         # (a comment is no class)
    assert accepts(a, '"ab"') and not accepts(a, '"\u00a0a"') and not accepts(a, '"a\\r"')


def test_null_counts_are_refused_not_a_crash():
    for kw in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
        with pytest.raises(JSONSchemaError, match=kw):
            json_schema_guide({kw: None})
    with pytest.raises(JSONSchemaError, match="'type'"):
        json_schema_guide({"type": None})


# ---------------------------------------------------------------- (c) errors

@pytest.mark.parametrize("schema, words", [
    ({"not": {"type": "null"}}, ["'not'"]),
    ({"if": {}, "then": {}, "else": {}}, ["'else'"]),
    ({"type": "object", "patternProperties": {"^x": {}}}, ["'patternProperties'"]),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, ["'propertyNames'"]),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, ["'dependentRequired'"]),
    ({"type": "object", "dependentSchemas": {"a": {}}}, ["'dependentSchemas'"]),
    ({"type": "object", "unevaluatedProperties": False}, ["'unevaluatedProperties'"]),
    ({"type": "array", "unevaluatedItems": False}, ["'unevaluatedItems'"]),
    ({"type": "array", "contains": {"type": "integer"}}, ["'contains'"]),
    ({"type": "array", "items": [{}], "additionalItems": False}, ["'additionalItems'"]),
    ({"type": "array", "items": [{"type": "integer"}]}, ["'items'", "prefixItems"]),
    ({"type": "array", "uniqueItems": True}, ["'uniqueItems'"]),
    ({"type": "integer", "multipleOf": 2}, ["'multipleOf'"]),
    ({"type": "number", "multipleOf": 0.01}, ["'multipleOf'"]),
    ({"type": "number", "minimum": 0.5}, ["'minimum'", "0.5"]),
    ({"type": "number", "exclusiveMaximum": -1.25}, ["'exclusiveMaximum'"]),
    ({"$dynamicRef": "#node"}, ["'$dynamicRef'"]),
    ({"$anchor": "x", "type": "integer"}, ["'$anchor'"]),
    ({"$ref": "#node"}, ["'$ref'", "local"]),
    ({"$ref": "other.json#/a"}, ["'$ref'", "local"]),
    ({"$ref": "#/$defs/nope"}, ["'$ref'", "does not resolve"]),
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "minimum": 3}, ["'$ref'", "minimum"]),
    ({"type": "string", "pattern": "(?=a)a"}, ["'pattern'", "lookaround"]),
    ({"type": "string", "pattern": r"(a)\1"}, ["'pattern'", "backreference"]),
    ({"type": "string", "pattern": r"\p{L}"}, ["'pattern'"]),
    ({"type": "string", "format": "date", "maxLength": 10}, ["'minLength'/'maxLength'", "format"]),
    ({"type": "string", "pattern": "a+", "minLength": 2}, ["'minLength'/'maxLength'", "pattern"]),
    ({"enum": ["a", "bb"], "maxLength": 1}, ["'enum'", "maxLength"]),
    ({"type": "string", "minLength": 3, "maxLength": 2}, ["'minLength'"]),
    ({"type": "integer", "minimum": 1.2, "maximum": 1.8}, ["'minimum'", "'maximum'", "no integer"]),
    ({"type": "number", "exclusiveMinimum": 3, "exclusiveMaximum": 3}, ["'exclusiveMinimum'", "'exclusiveMaximum'"]),
    ({"type": "string", "minLength": "3"}, ["'minLength'", "non-negative integer"]),
    ({"type": "array", "maxItems": -1}, ["'maxItems'"]),
    ({"type": "object", "properties": [], "required": []}, ["'properties'"]),
    ({"type": "object", "properties": {"a": {}}, "required": "a"}, ["'required'"]),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, ["'required'", "'b'"]),
    ({"type": "integer", "minimum": True}, ["'minimum'"]),
    ({"type": "integer", "maximum": "9"}, ["'maximum'"]),
    ({"type": "strin"}, ["'type'"]),
    ({"enum": []}, ["'enum'"]),
    ({"anyOf": []}, ["'anyOf'"]),
    ({"allOf": [{"type": "object", "properties": {"a": {}}, "additionalProperties": False},
                {"properties": {"b": {}}}]}, ["'properties'", "/allOf/1"]),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, ["no JSON value"]),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, ["no JSON value"]),
    ({"type": "integer", "const": 1.5}, ["no JSON value"]),
    (False, ["no JSON value"]),
    ({"$ref": "#"}, ["no JSON value"]),
    ({"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 200}, ["6000"]),
])
def test_unsupported_or_impossible_schemas_name_the_keyword(schema, words):
    for build in (json_schema_guide, json_schema_to_regex):
        with pytest.raises(JSONSchemaError) as e:
            build(schema)
        assert str(e.value).startswith("schema at /"), str(e.value)
        for w in words:
            assert w in str(e.value), (w, str(e.value))


_ODD_VALUES = [None, -1, 0, 1.5, 2, "x", "", [], [1], ["a"], {}, {"a": 1}, {"type": "string"}, True, False, 10 ** 40]
_KEYWORDS = ["type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
             "additionalProperties", "minProperties", "maxProperties", "items", "prefixItems", "minItems", "maxItems",
             "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
             "exclusiveMaximum", "multipleOf", "$defs", "nullable"]


@pytest.mark.parametrize("base", [{}, {"type": "object", "properties": {"a": {"type": "string"}}},
                                  {"type": "array"}, {"type": "string"}, {"type": "number"}])
def test_odd_keyword_values_raise_schema_errors_only(base):
    """Any value of any supported keyword (nested one level too) gives a guide or a JSONSchemaError."""
    for kw in _KEYWORDS:
        for v in _ODD_VALUES:
            for schema in ({**base, kw: v}, {"type": "array", "items": {**base, kw: v}}):
                try:
                    automaton(schema)
                except JSONSchemaError:
                    pass
