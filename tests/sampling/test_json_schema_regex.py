"""json_schema_to_regex / json_object_regex: Python ``re.fullmatch`` on the produced regex is the oracle for
its meaning, the ``jsonschema`` package (format checking on) the oracle for validity, with the documented
semantics where they differ: 'pattern' must match the whole string, and jsonschema's quirks are closed (its
uuid check accepts "{...}", its date-time check a trailing newline). For each schema, random valid
instances (a seeded generator written here) and near-miss mutations of them (dropped required key, extra
key, out-of-range number, wrong type, too long string, ...) are serialised compactly and with a space after
``,``/``:`` (both allowed by the default whitespace ``[ ]?``): the regex must match exactly the valid ones.
Candidates keep the declared key order by construction (the generator emits it, mutations only drop or
append keys); the fixed order has its own test. Plus syntax breakage (trailing comma, bad escape, raw
control character), pattern translation, exhaustive integer ranges, decimal ranges, the errors (with the
schema path) and the size of the schema-free regexes."""
import copy
import json
import random
import re
import uuid
from fractions import Fraction

import pytest

from decodekit.sampling.guided import DEAD, LazyDFA, LazyPDA, RuleSet, compile_nfa
from decodekit.sampling.guided.json_schema import (
    DEFAULT_MAX_DEPTH, JSONSchemaError, decimal_range_regex, int_range_regex, json_object_guide, json_object_regex,
    json_schema_guide, json_schema_to_regex)
from decodekit.sampling.guided.pda import compile_rules

jsonschema = pytest.importorskip("jsonschema")

ALPHABET = ["a", "Z", "0", " ", '"', "\\", "/", "\n", "\t", "\x01", "\x1f", "é", "€", "😀", "\u2028", "{", "]"]
KEYS = ["k", "key two", "ü", 'q"t']

# ---------------------------------------------------------------- random instances

def _nesting(v):
    if isinstance(v, dict):
        return 1 + max(map(_nesting, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_nesting, v), default=0)
    return 0


def _rand_scalar(rng):
    return rng.choice([None, True, False, rng.randint(-999, 999), rng.randint(-99, 99) + rng.choice([0.25, 0.5, 0.125]),
                       "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(4))), 10 ** 30, 0.0625])


def _rand_any(rng, depth):
    r = rng.random()
    if depth <= 0 or r < 0.4:
        return _rand_scalar(rng)
    n = rng.randrange(3)
    if r < 0.7:
        return [_rand_any(rng, depth - 1) for _ in range(n)]
    return {rng.choice(KEYS) + str(i): _rand_any(rng, depth - 1) for i in range(n)}


class _Impossible(Exception):
    pass


class Gen:
    """Random valid instance of a schema (the subset used in these tests), within the ref/depth limits."""

    def __init__(self, root, rng, max_depth=DEFAULT_MAX_DEPTH):
        self.root, self.rng, self.max_depth, self.refs = root, rng, max_depth, []

    def __call__(self, s, level=0):
        rng = self.rng
        if s is True or s == {}:
            return _rand_any(rng, self.max_depth - level)
        if "$ref" in s:
            ptr = s["$ref"][1:]
            if self.refs.count(ptr) >= self.max_depth:
                raise _Impossible
            node = self.root
            for tok in ptr.split("/")[1:]:
                node = node[tok]
            self.refs.append(ptr)
            try:
                return self(node, level)
            finally:
                self.refs.pop()
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                for sub in rng.sample(s[kw], len(s[kw])):
                    try:
                        return self(sub, level)
                    except _Impossible:
                        pass
                raise _Impossible
        if "allOf" in s:
            merged = {}
            for part in s["allOf"]:
                for k, v in part.items():
                    merged[k] = {**merged.get(k, {}), **v} if k == "properties" else (
                        merged.get(k, []) + v if k == "required" else v)
            return self(merged, level)
        if "enum" in s or "const" in s:
            return copy.deepcopy(rng.choice(s.get("enum", [s.get("const")])))
        t = s.get("type")
        t = rng.choice(t) if isinstance(t, list) else t
        if t == "null":
            return None
        if t == "boolean":
            return rng.random() < 0.5
        if t in ("integer", "number"):
            return self.number(s, t)
        if t == "string":
            if "pattern" in s or "format" in s:
                return rng.choice(s["examples"])
            lo = s.get("minLength", 0)
            n = rng.randint(lo, s.get("maxLength", lo + 6))
            return "".join(rng.choice(ALPHABET) for _ in range(n))
        if t == "object":
            props = s.get("properties")
            if props is None:
                n = rng.randint(s.get("minProperties", 0), s.get("maxProperties", 3))
                ap = s.get("additionalProperties", True)
                return {rng.choice(KEYS) + str(i): self(ap, level + 1) for i in range(n)}
            out = {}
            for name, sub in props.items():
                if name in s.get("required", []):
                    out[name] = self(sub, level + 1)
                elif rng.random() < 0.6:
                    try:
                        out[name] = self(sub, level + 1)
                    except _Impossible:
                        pass
            return out
        if t == "array":
            lo, prefix = s.get("minItems", 0), s.get("prefixItems", [])
            hi = s.get("maxItems", max(lo, len(prefix)) + 3)
            items = s.get("items", None if prefix else True)
            if items in (None, False):
                hi = min(hi, len(prefix))
            out = []
            for i in range(rng.randint(lo, hi)):
                try:
                    out.append(self(prefix[i] if i < len(prefix) else items, level + 1))
                except _Impossible:
                    if i < lo:
                        raise
                    break
            return out
        raise AssertionError(s)

    def number(self, s, t):
        rng = self.rng
        lo, hi = s.get("minimum", s.get("exclusiveMinimum")), s.get("maximum", s.get("exclusiveMaximum"))
        if lo is None:
            lo = (0 if hi is None else hi) - 10 ** rng.randint(1, 12)
        if hi is None:
            hi = lo + 10 ** rng.randint(1, 12)
        for _ in range(100):
            if rng.random() < 0.3:                                     # land on or next to a bound
                v = rng.choice([lo, hi]) + rng.choice([0, 0, -1, 1, -0.5, 0.5, 0.001, -0.001])
            else:
                v = rng.uniform(lo, hi)
            v = round(v) if t == "integer" else round(v, rng.randint(0, 3))
            if t == "integer":
                v = int(v)
            elif rng.random() < 0.5:
                v = float(v)
            v = 0 if v == 0 else v                                      # no negative zero
            if (v >= s.get("minimum", v) and v <= s.get("maximum", v) and v > s.get("exclusiveMinimum", v - 1)
                    and v < s.get("exclusiveMaximum", v + 1)):
                return v
        raise AssertionError(s)


# ---------------------------------------------------------------- mutations

def _nodes(v, path=()):
    yield path, v
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _nodes(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _nodes(x, path + (i,))


def _set(root, path, new):
    if not path:
        return new
    root = copy.deepcopy(root)
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return root


def mutate(v, rng):
    """A near miss of the instance v (often invalid)."""
    path, node = rng.choice(list(_nodes(v)))
    shallow = len(path) <= 1
    if isinstance(node, dict) and node and rng.random() < 0.5:
        node = dict(node)
        del node[rng.choice(list(node))]                      # drop a key (maybe a required one)
    elif isinstance(node, dict) and rng.random() < 0.5:
        node = {**node, rng.choice(["zz", "k0"]): _rand_scalar(rng)}  # extra key
    elif isinstance(node, list) and node and rng.random() < 0.6:
        node = node + [copy.deepcopy(rng.choice(node))] if rng.random() < 0.5 else node[1:]
    elif isinstance(node, str) and rng.random() < 0.6:
        node = node + "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 5)))  # too long / no match
    elif isinstance(node, (int, float)) and not isinstance(node, bool) and rng.random() < 0.7:
        node = rng.choice([node + 1, node - 1, node + 0.5, node * 10 + 1, -node - 1, node + 1000, node - 0.001])
        node = round(node, 4) or 0
        node = int(node) if isinstance(node, float) and node.is_integer() else node   # 2.0 is an integer
    else:                                                      # wrong type
        node = _rand_any(rng, 1) if shallow else _rand_scalar(rng)
    return _set(v, path, node)


def texts_of(v):
    return {json.dumps(v, ensure_ascii=False, separators=sep) for sep in ((",", ":"), (", ", ": "))}


def broken_texts(text, rng):
    """Texts derived from a valid one that are not JSON at all."""
    out = []
    for i, c in enumerate(text):
        if c in "}]" and text[i - 1] not in "[{ ":
            out.append(text[:i] + "," + text[i:])             # trailing comma
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"', text):
        j = m.start() + 1
        out.append(text[:j] + rng.choice(["\\q", "\\u12", "\\x41", "\n", "\x01", "\\"]) + text[j:])
    out.append(text[:-1])                                      # truncated
    return [t for t in out if not _is_json(t)]


def _is_json(t):
    try:
        json.loads(t)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------- the schemas

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$", "examples": ["01234", "99999"]}},
            "required": ["street"], "additionalProperties": False,
        },
    },
    "required": ["name", "age"], "additionalProperties": False,
}
OPTIONAL_MIX = {"type": "object", "properties": {
    "a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "number"}, "d": {"type": "string"},
    "e": {"type": ["integer", "null"]}}, "required": ["c", "e"], "additionalProperties": False}
ALL_OPTIONAL = {"type": "object", "properties": {
    "a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "integer", "maximum": -3},
    "d": {"type": "string", "maxLength": 2}}, "additionalProperties": False}
INT_ARRAY = {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 4}
ENUM = {"enum": ["red", 1, 2.5, True, None, {"a": [1, "x"]}, [], 'qu"ote', "é\n", -7]}
INTS = {"type": "object", "properties": {
    "neg": {"type": "integer", "minimum": -1000, "maximum": -17},
    "above": {"type": "integer", "exclusiveMinimum": 41},
    "below": {"type": "integer", "exclusiveMaximum": -3},
    "frac": {"type": "integer", "minimum": 2.5, "maximum": 7.5},
    "big": {"type": "integer", "minimum": -(10 ** 15), "maximum": 10 ** 18 + 7},
    "wide": {"type": "integer", "minimum": -98, "exclusiveMaximum": 12345}},
    "required": ["neg", "above", "below", "frac", "big", "wide"], "additionalProperties": False}
NUMBERS = {"type": "object", "properties": {
    "x": {"type": "number", "minimum": -2, "exclusiveMaximum": 3},
    "p": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
    "n": {"type": "number", "maximum": -1},
    "free": {"type": "number"}},
    "required": ["x", "p", "n", "free"], "additionalProperties": False}
STRINGS = {"type": "object", "properties": {
    "short": {"type": "string", "minLength": 2, "maxLength": 5},
    "code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$", "examples": ["AB-123", "ZZ-000"]},
    "dot": {"type": "string", "pattern": "a.c", "examples": ["abc", 'a"c', "a\\c", "a\tc", "aéc", "a\x01c"]},
    "alt": {"type": "string", "pattern": "^(?:x+|[^x]{2})$", "examples": ["x", "xxx", "ab", '"\\', "\n\n"]},
    "date": {"type": "string", "format": "date", "examples": ["2024-02-29", "1999-12-31", "2000-02-29"]},
    "dt": {"type": "string", "format": "date-time",
           "examples": ["2024-01-05T10:20:30Z", "2023-06-30T23:59:59.5+05:30"]},
    "time": {"type": "string", "format": "time", "examples": ["00:00:00Z", "12:34:56.789-01:00"]},
    "uuid": {"type": "string", "format": "uuid", "examples": ["123e4567-e89b-12d3-a456-426614174000"]},
    "ip": {"type": "string", "format": "ipv4", "examples": ["192.168.0.1", "0.0.0.0", "255.255.255.255"]}},
    "required": ["short"], "additionalProperties": False}
ANY_OF = {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0}, {"type": "null"},
                    {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
    "required": ["v", "kids"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
LINKED = {"definitions": {"cell": {"type": "object", "properties": {
    "head": {"type": "string", "maxLength": 2}, "tail": {"anyOf": [{"$ref": "#/definitions/cell"}, {"type": "null"}]}},
    "required": ["head", "tail"], "additionalProperties": False}}, "$ref": "#/definitions/cell"}
TUPLE = {"type": "array", "prefixItems": [{"type": "string", "maxLength": 2}, {"type": "integer"}, {"type": "boolean"}],
         "items": False, "minItems": 1}
TUPLE_REST = {"type": "array", "prefixItems": [{"const": "x"}], "items": {"type": "integer", "minimum": 0},
              "maxItems": 3}
FREE_DICT = {"type": "object", "additionalProperties": {"type": "integer", "maximum": 9}, "maxProperties": 3}
ALL_OF = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                    {"properties": {"b": {"type": "string", "maxLength": 3}}}], "title": "merged"}
TYPE_LIST = {"type": ["string", "null", "integer"], "maxLength": 3, "minimum": 5, "maximum": 20}
JSON_OBJECT = {"type": "object"}
ANY = {}

CASES = {
    "person": PERSON, "optional_mix": OPTIONAL_MIX, "all_optional": ALL_OPTIONAL, "int_array": INT_ARRAY,
    "enum": ENUM, "ints": INTS, "numbers": NUMBERS, "strings": STRINGS, "any_of": ANY_OF, "tree": TREE,
    "linked": LINKED, "tuple": TUPLE, "tuple_rest": TUPLE_REST, "free_dict": FREE_DICT, "all_of": ALL_OF,
    "type_list": TYPE_LIST, "json_object": JSON_OBJECT, "any": ANY,
}
# the schema-free cases: jsonschema accepts any depth, the regex nests at most max_depth containers
DEPTH_LIMITED = {"json_object", "any"}
# allOf can't close the merged object (additionalProperties would only see its own part): extra keys are
# valid instances the regex does not generate
CLOSED_KEYS = {"all_of": {"a", "b"}}
HAND_VALID = {
    "person": [{"name": "Ann", "age": 0}, {"name": 'q"\\', "age": 150, "tags": [],
                "address": {"street": "", "zip": "00000"}}],
    "all_optional": [{}, {"d": ""}, {"a": True, "c": -3}, {"b": None, "d": "\n"}],
    "enum": ["red", {"a": [1, "x"]}, [], -7, 2.5],
    "tree": [{"v": 0, "kids": []}, {"v": -1, "kids": [{"v": 2, "kids": [{"v": 3, "kids": [{"v": 4, "kids": []}]}]}]}],
    "tuple": [["ab"], ["", -5], ["x", 1, False]],
    "tuple_rest": [[], ["x"], ["x", 0, 7]],
    "numbers": [{"x": -2, "p": 0.001, "n": -1, "free": -1.5e-7}, {"x": 2.999, "p": 100.0, "n": -1.0, "free": 0}],
    "ints": [{"neg": -1000, "above": 42, "below": -4, "frac": 3, "big": 10 ** 18 + 7, "wide": 12344},
             {"neg": -17, "above": 10 ** 20, "below": -(10 ** 20), "frac": 7, "big": -(10 ** 15), "wide": -98}],
}
HAND_INVALID = {
    "person": [{"name": "", "age": 1}, {"name": "x", "age": -1}, {"age": 3}, {"name": "x", "age": 1.5},
               {"name": "x", "age": 1, "address": {"zip": "12345"}}],
    "tree": [{"v": 0}, {"v": 0, "kids": [{"v": 1}]}, {"v": 0, "kids": [{"v": 1, "kids": []}] * 3}],
    "tuple": [[], [1], ["a", 1, True, None]],
    "tuple_rest": [["y"], ["x", -1], ["x", 1, 2, 3]],
    "numbers": [{"x": 3, "p": 1, "n": -1, "free": 0}, {"x": 0, "p": 0, "n": -1, "free": 0},
                {"x": 0, "p": 1, "n": -0.5, "free": 0}, {"x": -2.001, "p": 1, "n": -1, "free": 0}],
    "ints": [{"neg": -16, "above": 42, "below": -4, "frac": 3, "big": 0, "wide": 0},
             {"neg": -17, "above": 41, "below": -4, "frac": 3, "big": 0, "wide": 0},
             {"neg": -17, "above": 42, "below": -3, "frac": 3, "big": 0, "wide": 0},
             {"neg": -17, "above": 42, "below": -4, "frac": 8, "big": 0, "wide": 0},
             {"neg": -17, "above": 42, "below": -4, "frac": 3, "big": 10 ** 18 + 8, "wide": 0},
             {"neg": -17, "above": 42, "below": -4, "frac": 3, "big": 0, "wide": 12345}],
    "strings": [{"short": "a"}, {"short": "abcdef"}, {"short": "ab", "code": "AB-12"}, {"short": "ab", "dot": "a\nc"},
                {"short": "ab", "date": "2023-02-29"}, {"short": "ab", "ip": "1.2.3.04"},
                {"short": "ab", "alt": "xa"}, {"short": "ab", "dt": "2024-01-05T24:00:00Z"}],
}


def _full_pattern(validator, pattern, instance, schema):
    """The documented semantics of 'pattern': the decoded string fully matches it (JSON Schema would search;
    Python's "$" would also accept a trailing newline)."""
    if isinstance(instance, str) and not re.fullmatch(pattern.removeprefix("^").removesuffix("$"), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not fully match {pattern!r}")


FORMAT_CHECKER = copy.deepcopy(jsonschema.Draft202012Validator.FORMAT_CHECKER)
# jsonschema's uuid check lets UUID() strip "{}" / "urn:uuid:": the RFC 4122 text form is the canonical one
FORMAT_CHECKER.checks("uuid", raises=ValueError)(lambda s: not isinstance(s, str) or str(uuid.UUID(s)) == s.lower())
# and its date-time / time checks (rfc3339_validator) end their regex in "$", which accepts a trailing newline
for _name in ("date-time", "time") if "date-time" in FORMAT_CHECKER.checkers else ():   # needs rfc3339-validator
    _check = FORMAT_CHECKER.checkers[_name][0]
    FORMAT_CHECKER.checks(_name)(lambda s, _check=_check: not isinstance(s, str) or "\n" not in s and _check(s))


def _validator(schema):
    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _full_pattern})
    return cls(schema, format_checker=FORMAT_CHECKER)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_exactly_the_valid_instances(name):
    schema = CASES[name]
    if name == "strings" and "date-time" not in FORMAT_CHECKER.checkers:
        pytest.skip("jsonschema checks date-time only with rfc3339-validator installed")
    rx = re.compile(json_schema_to_regex(schema))
    validator = _validator(schema)
    rng = random.Random(name)
    gen = Gen(schema, rng)
    valid = [gen(schema) for _ in range(60)] + HAND_VALID.get(name, [])
    for v in valid:
        assert validator.is_valid(v), (name, v)              # the generator itself is right
    candidates = valid + [mutate(v, rng) for v in valid for _ in range(8)] + HAND_INVALID.get(name, [])
    seen_valid = seen_invalid = 0
    for v in candidates:
        ok = validator.is_valid(v) and (name not in DEPTH_LIMITED or _nesting(v) <= DEFAULT_MAX_DEPTH) and (
            name not in CLOSED_KEYS or not isinstance(v, dict) or set(v) <= CLOSED_KEYS[name])
        seen_valid += ok
        seen_invalid += not ok
        for text in texts_of(v):
            assert bool(rx.fullmatch(text)) == ok, (name, text, ok)
    for v in valid[:10]:
        for text in broken_texts(json.dumps(v, ensure_ascii=False), rng):
            assert not rx.fullmatch(text), (name, text)
    assert seen_valid >= 40 and (seen_invalid >= 20 or name in ("any", "json_object")), (seen_valid, seen_invalid)


def _guide_matcher(g):
    """fullmatch of a guide (json_schema_guide's regex or RuleSet) by its automaton, as guided decoding runs it."""
    a = LazyPDA(compile_rules(g)) if isinstance(g, RuleSet) else LazyDFA(compile_nfa(g))

    def match(text):
        sid = a.step(a.start, text.encode("utf-8"))
        return sid != DEAD and a.is_accepting(sid)
    return match


@pytest.mark.parametrize("name", list(CASES))
def test_guide_matches_exactly_the_valid_instances(name):
    """json_schema_guide, what guided decoding runs: a RuleSet where the schema recurses (schema-free values,
    recursive $refs), whose pushdown automaton has no depth bound: instances nest up to 9 containers / refs
    here, all valid ones match; the rest as the regex test above."""
    schema = CASES[name]
    if name == "strings" and "date-time" not in FORMAT_CHECKER.checkers:
        pytest.skip("jsonschema checks date-time only with rfc3339-validator installed")
    g = json_schema_guide(schema)
    if name in ("any", "json_object", "tree", "linked"):
        assert isinstance(g, RuleSet)
    if name in ("person", "ints", "strings"):
        assert g == json_schema_to_regex(schema)
    match = _guide_matcher(g)
    validator = _validator(schema)
    rng = random.Random("guide-" + name)
    gen = Gen(schema, rng, max_depth=9)
    valid = [gen(schema) for _ in range(40)] + HAND_VALID.get(name, [])
    if name in DEPTH_LIMITED:
        assert max(map(_nesting, valid)) > DEFAULT_MAX_DEPTH + 1
    candidates = valid + [mutate(v, rng) for v in valid for _ in range(6)] + HAND_INVALID.get(name, [])
    for v in candidates:
        ok = validator.is_valid(v) and (name not in CLOSED_KEYS or not isinstance(v, dict)
                                        or set(v) <= CLOSED_KEYS[name])
        for text in texts_of(v):
            assert match(text) == ok, (name, text, ok)
    for v in valid[:8]:
        for text in broken_texts(json.dumps(v, ensure_ascii=False), rng):
            assert not match(text), (name, text)


def test_guides_nest_without_a_bound():
    deep = 1
    for i in range(60):
        deep = [True, deep, {"k": "v"}] if i % 7 == 0 else {"a": [deep], "b": None} if i % 2 else {"c": deep}
    text = json.dumps({"x": deep})
    assert _nesting(deep) > 50 and _guide_matcher(json_object_guide())(text)
    assert not _guide_matcher(json_object_guide())(text[:-1]) and not _guide_matcher(json_object_guide())(text + "}")
    tree = {"v": 0, "kids": []}
    for i in range(40):
        tree = {"v": i, "kids": [{"v": -i, "kids": []}, tree] if i % 3 else [tree]}
    match = _guide_matcher(json_schema_guide(TREE))
    assert match(json.dumps(tree)) and match(json.dumps(tree, separators=(",", ":")))
    assert not match(json.dumps(tree).replace('"kids": []', '"kids": [1]', 1))
    # a schema that recurses before any character: the unrolled regex (bounded), not a stack that never ends
    left = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}, {"$ref": "#/anyOf/1"}]}
    assert isinstance(json_schema_guide(left), RuleSet)
    self_ref = {"anyOf": [{"$ref": "#"}, {"type": "string", "maxLength": 2}]}
    g = json_schema_guide(self_ref)
    assert g == json_schema_to_regex(self_ref) and _guide_matcher(g)('"ab"') and not _guide_matcher(g)('"abc"')


def test_depth_limits():
    deep = [[[[1]]]]                                                       # 4 containers
    assert re.fullmatch(json_schema_to_regex({}), json.dumps(deep))
    assert not re.fullmatch(json_schema_to_regex({}), json.dumps([deep]))
    assert not re.fullmatch(json_schema_to_regex({}, max_depth=3), json.dumps(deep))
    assert re.fullmatch(json_object_regex(max_depth=2), '{"a":{"b":[1]}}') is None
    assert re.fullmatch(json_object_regex(max_depth=2), '{"a":{"b":1},"c":[]}')
    assert re.fullmatch(json_object_regex(max_depth=0), '{"a":1}')          # scalars always allowed
    # a recursive $ref expands max_depth times; the deepest children list can only be empty
    tree = {"v": 0, "kids": []}
    for _ in range(DEFAULT_MAX_DEPTH - 1):
        tree = {"v": 0, "kids": [tree]}
    rx = json_schema_to_regex(TREE)
    assert re.fullmatch(rx, json.dumps(tree, separators=(",", ":")))
    assert not re.fullmatch(rx, json.dumps({"v": 1, "kids": [tree]}, separators=(",", ":")))


def test_key_order_and_no_extra_keys_when_properties_are_given():
    rx = json_schema_to_regex({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                               "required": ["a", "b"]})
    assert re.fullmatch(rx, '{"a":1,"b":2}') and re.fullmatch(rx, '{ "a" : 1 , "b" : 2 }')
    assert not re.fullmatch(rx, '{"b":2,"a":1}')            # valid JSON Schema instance, but not declared order
    assert not re.fullmatch(rx, '{"a":1,"b":2,"c":3}')      # additionalProperties defaults to true: not generated
    assert not re.fullmatch(rx, ' {"a":1,"b":2}') and not re.fullmatch(rx, '{"a":1,"b":2}\n')
    assert not re.fullmatch(rx, '{"a":1,  "b":2}')          # [ ]? allows one space


def test_other_whitespace_pattern():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
                                               "b": {"enum": [{"x": [1, 2]}]}}}
    v = {"a": [1, 2, 3], "b": {"x": [1, 2]}}
    rx = json_schema_to_regex(schema, whitespace=r"[ \t\n]*")
    assert re.fullmatch(rx, json.dumps(v, indent=2)) and re.fullmatch(rx, json.dumps(v, indent="\t"))
    assert re.fullmatch(json_schema_to_regex(schema, whitespace=""), json.dumps(v, separators=(",", ":")))
    assert not re.fullmatch(json_schema_to_regex(schema, whitespace=""), json.dumps(v))
    assert re.fullmatch(json_object_regex(whitespace=r"\n|  "), '{\n"a"  :\n[\n1\n]\n}')
    assert re.fullmatch(json_schema_to_regex(json.dumps(schema)), json.dumps(v))       # schema given as JSON text


# ---------------------------------------------------------------- numeric ranges

WINDOW = list(range(-1200, 1201)) + [10 ** 12, -(10 ** 12), 10 ** 20 + 3, -(10 ** 20) - 3, 99999, -99999, 100000]


@pytest.mark.parametrize("seed", range(4))
def test_integer_range_regex_is_exact(seed):
    rng = random.Random(seed)
    pairs = [(None, None), (0, None), (None, 0), (1, 1), (-1, -1), (0, 0), (-5, None), (None, -5), (10, 99), (-99, -10)]
    for _ in range(12):
        a, b = sorted(rng.choice([rng.randint(-1300, 1300), rng.randint(-10 ** 6, 10 ** 6), 0]) for _ in range(2))
        pairs += [(a, b), (a, None), (None, b)]
    for lo, hi in pairs[seed * 12: seed * 12 + 30]:
        rx = re.compile(int_range_regex(lo, hi))
        for n in WINDOW:
            want = (lo is None or lo <= n) and (hi is None or n <= hi)
            assert bool(rx.fullmatch(str(n))) == want, (lo, hi, n)
        for bad in ("-0", "01", "+1", "-01", "00", "1.0", " 1", ""):
            assert not rx.fullmatch(bad), (lo, hi, bad)
    assert int_range_regex(5, 4) is None
    assert int_range_regex(1, 10 ** 30 - 1) == "[1-9][0-9]{0,29}"          # whole digit lengths merge
    assert int_range_regex(-(10 ** 6), None) == "(?:-(?:1000000|[1-9][0-9]{0,5})|0|[1-9][0-9]*)"


@pytest.mark.parametrize("seed", range(3))
def test_decimal_range_regex_is_exact(seed):
    rng = random.Random(seed)
    texts = ["0", "0.0", "0.000", "1", "1.5", "10", "10.00", "9.999", "-1", "-0.5", "-2.0", "-10.01", "3", "3.0",
             "3.0001", "-3", "-3.00", "-2.999", "100", "99.9", "0.001"]
    texts += [f"{rng.choice(['', '-'])}{rng.randint(0, 120)}{rng.choice(['', '.' + str(rng.randint(0, 999)).zfill(3)])}"
              for _ in range(400)]
    for _ in range(25):
        lo, hi = sorted(rng.randint(-12, 12) for _ in range(2))
        lo, hi = rng.choice([lo, None]), rng.choice([hi, None])
        lox, hix = rng.random() < 0.5, rng.random() < 0.5
        if lo is not None and hi is not None and lo == hi and (lox or hix):
            continue
        rx = re.compile(decimal_range_regex(lo, lox, hi, hix))
        for t in texts:
            v = Fraction(t)
            want = ((lo is None or (v > lo if lox else v >= lo)) and (hi is None or (v < hi if hix else v <= hi))
                    and not (t.startswith("-") and v == 0))        # no negative zero
            assert bool(rx.fullmatch(t)) == want, (lo, lox, hi, hix, t)
        for bad in ("01", "1.", ".5", "1e3", "+1", "-", "1.2.3"):
            assert not rx.fullmatch(bad)


def test_bounded_numbers_have_no_exponent_and_no_negative_zero():
    rx = json_schema_to_regex({"type": "number", "minimum": -5, "maximum": 500})
    assert re.fullmatch(rx, "250.5") and re.fullmatch(rx, "-0.5") and re.fullmatch(rx, "0")
    for valid_but_not_generated in ("2.5e2", "1E1", "-0", "-0.0"):
        assert not re.fullmatch(rx, valid_but_not_generated)
    rx = json_schema_to_regex({"type": "number"})
    assert all(re.fullmatch(rx, t) for t in ("2.5e2", "1E+1", "-0", "-0.0", "1e-07"))
    assert not any(re.fullmatch(json_schema_to_regex({"type": "integer"}), t) for t in ("-0", "1.0", "1e2"))


def test_draft4_boolean_exclusive_bounds():
    rx = json_schema_to_regex({"type": "integer", "minimum": 5, "exclusiveMinimum": True, "maximum": 8,
                               "exclusiveMaximum": True})
    assert [n for n in range(0, 12) if re.fullmatch(rx, str(n))] == [6, 7]
    rx = json_schema_to_regex({"type": "number", "minimum": 0, "exclusiveMinimum": True})
    assert not re.fullmatch(rx, "0") and re.fullmatch(rx, "0.01") and not re.fullmatch(rx, "0.00")


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, ["/properties/a", "'not'"]),
    ({"type": "object", "patternProperties": {"^x": {}}}, ["/", "patternProperties"]),
    ({"$ref": "#/$defs/missing"}, ["/", "does not resolve"]),
    ({"properties": {"a": {"$ref": "https://example.com/s.json"}}}, ["/properties/a", "local"]),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, ["/", "'b'", "properties"]),
    ({"type": "object", "required": ["b"]}, ["/", "'b'"]),
    ({"type": "string", "minLength": 5, "maxLength": 2}, ["/", "minLength"]),
    ({"type": "array", "items": {"type": "array", "minItems": 3, "maxItems": 1}}, ["/items", "minItems"]),
    ({"type": "integer", "minimum": 3, "maximum": 2}, ["/", "minimum", "maximum"]),
    ({"type": "integer", "minimum": 2.2, "maximum": 2.8}, ["/", "no integer"]),
    ({"type": "number", "exclusiveMinimum": 2, "maximum": 2}, ["/", "exclusiveMinimum"]),
    ({"properties": {"age": {"type": "number", "minimum": 1.5}}},
     ["schema at /properties/age: 'minimum' 1.5 on type number is not supported"]),
    ({"type": "array", "uniqueItems": True}, ["/", "uniqueItems"]),
    ({"type": "integer", "multipleOf": 3}, ["/", "multipleOf"]),
    ({"type": "string", "pattern": "^(?=a)b$"}, ["/", "pattern"]),
    ({"type": "string", "pattern": r"(a)\1"}, ["/", "pattern"]),
    ({"type": "string", "pattern": r"a\bc"}, ["/", "pattern"]),
    ({"type": "string", "pattern": "(?i)abc"}, ["/", "pattern"]),
    ({"type": "string", "pattern": "a^b"}, ["/", "anchor"]),
    ({"type": "string", "pattern": "[a-z]+", "maxLength": 3}, ["/", "maxLength"]),
    ({"enum": [1, 2], "minimum": 0}, ["/", "enum"]),
    ({"type": "strin"}, ["/", "type"]),
    ({"$defs": {"s": {"type": "string", "maxLength": 7000}}, "$ref": "#/$defs/s"}, ["/$defs/s", "6000"]),
    ({"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 100}, ["/", "6000"]),
    ({"type": "object", "minProperties": 2}, ["/", "minProperties", "repeat"]),
    ({"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {
        "type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {
            "type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {
                "type": "integer"}}}}}}}}}}}}}, ["/", "200000 characters"]),
    ({"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {}}}]},
     ["/allOf/1", "properties"]),
    ({"enum": []}, ["non-empty"]),
    (False, ["no JSON value"]),
    ({"$ref": "#"}, ["no JSON value"]),                   # only infinite recursion
    ('{"type": "object",', ["not valid JSON"]),
])
def test_errors_name_the_path(schema, words):
    with pytest.raises(JSONSchemaError) as e:
        json_schema_to_regex(schema)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert str(e.value).startswith("schema at /")


PATTERN_ALPHABET = ["a", "b", "x", "z", '"', "\\", "\n", "\t", "\x08", "\x01", "é", "1", " ", "-", "]", ".", "{", "}"]


@pytest.mark.parametrize("pattern", [
    "^(ab)+$", '"+', "\\u00e9+x?", '[\\\\"]{2}', "[^a-z]*", "\\d\\D", "\\w+\\s\\S", "(?P<n>x|y)z?", "(?:a|)b{2,3}?",
    "[\\]a-]+", "[-a]", "\\.\\{?", "\\t|\\n", "x{", "}", "[\\b]+", ".{2}", "\\x7b|\\U0001F600", "(a|b){,2}$",
])
def test_pattern_is_translated_to_the_json_content(pattern):
    """A string value fully matches the pattern (ECMA classes: ASCII \\d \\w \\s) iff its JSON text matches."""
    rx = re.compile(json_schema_to_regex({"type": "string", "pattern": pattern}))
    oracle = re.compile(pattern.removeprefix("^").removesuffix("$"), re.ASCII)
    rng = random.Random(pattern)
    values = [""] + PATTERN_ALPHABET + ["".join(t) for t in
                                        zip(PATTERN_ALPHABET * 3, rng.sample(PATTERN_ALPHABET * 3, 54))]
    values += ["".join(rng.choice(PATTERN_ALPHABET) for _ in range(rng.randint(2, 5))) for _ in range(3000)]
    values += ["ab", "abab", "éé", "éx", "x", "yz", "abb", "bbb", "\\\\", '""', "\\t", "{😀", "1a", "a1 b", "a b"]
    matched = 0
    for v in values:
        want = bool(oracle.fullmatch(v))
        matched += want
        assert bool(rx.fullmatch(json.dumps(v, ensure_ascii=False))) == want, (pattern, v)
    assert matched, pattern


def test_min_max_properties():
    props = {"a": {"type": "integer"}, "b": {"type": "null"}}
    cases = [({"minProperties": 2}, ['{"a":1,"b":null}']),
             ({"minProperties": 1}, ['{"a":1}', '{"b":null}', '{"a":1,"b":null}']),
             ({"maxProperties": 5, "required": ["b"]}, ['{"b":null}', '{"a":1,"b":null}'])]
    texts = ["{}", '{"a":1}', '{"b":null}', '{"a":1,"b":null}']
    for extra, want in cases:
        rx = json_schema_to_regex({"type": "object", "properties": props, **extra})
        assert [t for t in texts if re.fullmatch(rx, t)] == want, extra
    rx = json_schema_to_regex({"type": "object", "minProperties": 1, "maxProperties": 2,
                               "additionalProperties": {"type": "boolean"}})
    assert [t for t in ["{}", '{"x":true}', '{"x":true,"y":false}', '{"x":true,"y":false,"z":true}']
            if re.fullmatch(rx, t)] == ['{"x":true}', '{"x":true,"y":false}']
    with pytest.raises(JSONSchemaError, match="minProperties"):
        json_schema_to_regex({"type": "object", "properties": {**props, "c": {}}, "minProperties": 2})


def test_simplified_formats():
    """email and uri are simplified (jsonschema only checks for an "@" / needs an extra package): common
    addresses match, and what matches is valid."""
    email = json_schema_to_regex({"type": "string", "format": "email"})
    for ok in ["a@b.co", "x.y+z@mail.example.org", "first_last-1@sub.domain-x.io"]:
        assert re.fullmatch(email, json.dumps(ok)), ok
    for bad in ["a@", "@b.c", "a b@c.d", "a@b", "a..b@c.d", "a@-b.c"]:
        assert not re.fullmatch(email, json.dumps(bad)), bad
    uri = json_schema_to_regex({"type": "string", "format": "uri"})
    for ok in ["https://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.c", "http://x/%20y"]:
        assert re.fullmatch(uri, json.dumps(ok)), ok
    for bad in ["example.com", "/relative/path", "http://a b", "1http://x", "http://x/%zz"]:
        assert not re.fullmatch(uri, json.dumps(bad)), bad


def test_annotations_and_unknown_formats_are_ignored():
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "t", "description": "d",
              "type": "string", "format": "hostname", "default": "a", "examples": ["a"], "$comment": "c",
              "deprecated": False, "readOnly": True, "writeOnly": False}
    assert json_schema_to_regex(schema) == json_schema_to_regex({"type": "string"})
    assert json_schema_to_regex(True) == json_schema_to_regex({})
    rx = json_schema_to_regex({"type": "object", "properties": {"a": {"type": "integer"}}})   # type-free keywords
    assert re.fullmatch(rx, '{"a":1}') and re.fullmatch(rx, "{}") and not re.fullmatch(rx, "1")


# ---------------------------------------------------------------- sizes

def test_schema_free_regex_sizes():
    sizes = {d: len(json_object_regex(max_depth=d)) for d in range(1, DEFAULT_MAX_DEPTH + 1)}
    assert len(json_object_regex()) < 40_000 and len(json_schema_to_regex({})) < 100_000, sizes
    assert all(sizes[d + 1] < 4.2 * sizes[d] for d in range(2, DEFAULT_MAX_DEPTH)), sizes
    for rx in (json_object_regex(), json_schema_to_regex({}), json_schema_to_regex(PERSON)):
        re.compile(rx)
        assert "(?=" not in rx and "(?!" not in rx and "^" not in rx.replace("[^", "").replace("\\^", "")
