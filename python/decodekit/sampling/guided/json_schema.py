"""JSON Schema -> regular expression, for structured-output ("guided_json") decoding (the job of outlines'
``build_regex_from_schema``; own code, stdlib only).

``json_schema_to_regex(schema)``: a regex whose full matches are JSON texts that are valid instances of the
schema; ``json_object_regex()``: any JSON object. The regex uses only the subset our byte-level engine
parses (and Python ``re.fullmatch`` agrees with): literals, escaped metacharacters, ``\\uHHHH`` and
``\\UHHHHHHHH``, classes, ``(?:...)``, ``|``, ``* + ?``, ``{n} {n,} {n,m}``; no anchors, lookarounds or
backreferences. An impossible branch is dropped; an impossible schema raises JSONSchemaError.

Supported (draft 2020-12 / OpenAI structured-outputs subset): ``type`` (a name or a list); ``enum``,
``const``; string ``minLength``, ``maxLength``, ``pattern``, ``format`` (date-time, date, time: RFC 3339 with
upper-case T/Z and no leap second; uuid; ipv4; uri: RFC 3986 without IP-literal hosts; email simplified:
dot-atom@host); integer ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` (numbers or
draft-4 booleans; non-integer bounds round inward), ``multipleOf`` 1; number: the same bounds when they are
integers; boolean; null; object ``properties``, ``required``, ``additionalProperties``, ``minProperties`` (0
or 1) / ``maxProperties`` (without ``properties``; with them when implied by ``required``, or minProperties 1
or all); array ``items``, ``prefixItems``, ``minItems``, ``maxItems``, ``uniqueItems`` false; ``anyOf``,
``oneOf``, ``allOf`` (merged when the parts don't conflict; a part's ``additionalProperties`` / ``items`` also
constrain another part's ``properties`` / ``prefixItems``, which are additional to it); ``$ref`` to "#..."
JSON pointers (``$defs``, ``definitions``, "#"; percent-encoded as URI fragments are), recursion included.
Annotations (title, description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly,
$defs, definitions, contentEncoding, contentMediaType, contentSchema, ``x-*`` extensions, OpenAPI's
discriminator (which the ``oneOf`` it goes with already expresses), example, externalDocs, xml and nullable
(so null is never generated for it: a narrowing)) are ignored; any other keyword raises JSONSchemaError, whose
message names the schema's JSON-pointer path.

Deliberate deviations; each narrows what matches except the one marked (*), which lets through instances a
strict validator refuses:
  * Keys come in the declared ``properties`` order, and when ``properties`` is given no other key is
    generated whatever ``additionalProperties`` says (as in OpenAI strict mode and outlines); likewise
    ``prefixItems`` without ``items`` allows nothing after the tuple.
  * Whitespace: the ``whitespace`` regex (default ``[ ]?``, which keeps models from looping on spaces) goes
    after ``{ [ , :`` and before ``} ] , :``; never around the top-level value, inside strings or numbers.
  * Where a string is constrained by ``pattern``, ``format``, ``enum`` or ``const``, and in property names,
    its characters are written the way a JSON encoder writes them (raw, or ``\\" \\\\ \\n``... for quote,
    backslash and controls); objects in ``enum`` / ``const`` keep their key order. ``minLength`` /
    ``maxLength`` count code points after unescaping (an escape is one, a surrogate pair written as two
    ``\\uXXXX`` escapes is one); such strings have no lone surrogate escape.
  * ``pattern`` must match the whole string (like outlines; JSON Schema would search); it is parsed by
    regex.py (its subset: lookarounds, backreferences, ``\\b``, inline flags and inner anchors are refused)
    with ECMA-262's meaning where it differs from Python's (``_ecma``): ``.`` excludes \\r, U+2028 and U+2029
    too, ``\\S`` excludes ECMA's Unicode spaces (NBSP, U+3000, U+FEFF...), ``\\d \\w`` are ASCII, and ``\\s``
    generates ASCII spaces only (except inside a negated class); each character class becomes the JSON text
    of those characters; ``pattern`` or ``format`` together with lengths are refused (regexes can't be
    intersected here).
  * Integers never match "-0" or "1.0"; bounded numbers have no exponent and no negative zero. Bounds hold
    for the decimal value written: "0.99999999999999999" is below ``exclusiveMaximum`` 1 though a reader
    that parses it as a binary float gets 1.0.
  * A schema without ``type`` but with type-specific keywords means the types those keywords constrain.
  * Other ``format`` values are annotations (ignored). ``oneOf`` is ``anyOf`` (*: exclusivity is not enforced).
  * What guided decoding runs is ``json_schema_guide``: schema-free values ({}, true, objects without
    properties, arrays without items; response_format json_object) call a rule ``dk_any`` and recursive
    ``$ref``s call a rule per pointer, so the guide is a RuleSet (pda.py) and they nest without a bound.
    In ``json_schema_to_regex`` (and in the guide of a schema that recurses before reading a character, e.g.
    ``{"anyOf": [{"$ref": "#"}, ...]}``) they nest at most ``max_depth`` containers from the top-level value
    (scalars are always allowed); a recursive ``$ref`` expands at most ``max_depth`` times, deeper branches
    can't match.
  * Counted repetition copies a sub-automaton: bounds needing over MAX_COPIES copies are refused, and so are
    schemas whose regex grows past MAX_REGEX_CHARS (about ten levels of nested arrays) or that nest keywords
    more than MAX_SCHEMA_DEPTH deep.
Size of ``json_object_regex()`` with the default whitespace: 1.8 KB at max_depth 2, 7.4 KB at 3, 30 KB at 4,
119 KB at 5 (x4 per level; ``{}``, any value, is twice that), hence DEFAULT_MAX_DEPTH = 4.
"""
import contextlib
import json
import math
import re
from urllib.parse import unquote

from ..shorten import show as _short
from .pda import LeftRecursionError, RuleSet, RuleSetError, compile_rules
from .regex import RegexError, escape, negate
from .regex import repeat as _rep
from .regex import parse as parse_regex

__all__ = ["JSONSchemaError", "DEFAULT_WHITESPACE", "DEFAULT_MAX_DEPTH", "MAX_COPIES", "json_schema_to_regex",
           "json_object_regex", "json_schema_guide", "json_object_guide", "int_range_regex", "decimal_range_regex"]


class JSONSchemaError(ValueError):
    """Unsupported or invalid schema; the message names the JSON-pointer path of the schema holding the
    offending keyword, e.g. "schema at /properties/age: 'minimum' 1.5 on type number is not supported"."""


DEFAULT_WHITESPACE = r"[ ]?"
DEFAULT_MAX_DEPTH = 4
MAX_COPIES = 6000
MAX_REGEX_CHARS = 200_000       # a schema whose regex grows past this is refused (nested containers: x4 a level)
MAX_SCHEMA_DEPTH = 128          # keyword nesting (path components) of a schema
NEVER = r"[^\x00-\U0010FFFF]"

_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
# one code point of a string whose length is counted: a surrogate pair's two escapes together, no lone surrogate
_CODE_POINT = (r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|'
               r'[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))')
_STRING = f'"{_CHAR}*"'
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_SCALARS = f"{_STRING}|{_NUMBER}|true|false|null"
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"        # 0001-9999
_LEAP = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (rf"(?:{_YEAR}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|"
         rf"(?:0[13578]|1[02])-31)|{_LEAP}-02-29)")
_H, _M = r"(?:[01][0-9]|2[0-3])", r"[0-5][0-9]"
_TIME = rf"{_H}:{_M}:{_M}(?:\.[0-9]+)?(?:Z|[+\-]{_H}:{_M})"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?\^_`{|}~\-]+"
_PCT, _US = r"%[0-9A-Fa-f]{2}", r"A-Za-z0-9\-._~!$&'()*+,;="     # RFC 3986: unreserved and sub-delims
_PCHAR, _SEGS = rf"(?:[{_US}:@]|{_PCT})", rf"(?:/(?:[{_US}:@]|{_PCT})*)*"
_AUTH = rf"(?:(?:[{_US}:]|{_PCT})*@)?(?:[{_US}]|{_PCT})*(?::[0-9]*)?"     # host: a reg-name (IPv4 is one)
_QUERY = rf"(?:{_PCHAR}|[/?])*"
FORMATS = {
    "date": _DATE, "time": _TIME, "date-time": f"{_DATE}T{_TIME}",
    "uuid": "-".join(f"[0-9a-fA-F]{{{n}}}" for n in (8, 4, 4, 4, 12)),
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
    "email": rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})+",
    "uri": rf"[A-Za-z][A-Za-z0-9+.\-]*:(?://{_AUTH}{_SEGS}|/(?:{_PCHAR}+{_SEGS})?|{_PCHAR}+{_SEGS})?"
           rf"(?:\?{_QUERY})?(?:#{_QUERY})?",
}
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                "readOnly", "writeOnly", "$defs", "definitions", "contentEncoding", "contentMediaType",
                "contentSchema", "discriminator",     # discriminator (OpenAPI / pydantic): oneOf already says it
                "nullable", "example", "externalDocs", "xml"}   # OpenAPI 3.0 (nullable: null is never generated)
_BY_TYPE = {
    "object": {"properties", "required", "additionalProperties", "minProperties", "maxProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
_KNOWN = set().union(*_BY_TYPE.values(), {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"})
_TYPES = ("string", "integer", "number", "boolean", "null", "object", "array")
_UNSAFE = set(range(0x20)) | {0x22, 0x5C}      # code points a JSON string must escape


# ---------------------------------------------------------------- regex text
def _u(cp):
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def _alt(parts):
    """Alternation of the parts that aren't None, grouped when needed; None when there are none."""
    out = list(dict.fromkeys(p for p in parts if p is not None))
    if len(out) <= 1:
        return out[0] if out else None
    body = [p for p in out if p]
    return "(?:" + "|".join(body) + (")?" if len(body) < len(out) else ")")


def _copies(rx):
    """Sub-automaton copies made by the counted repetitions of an unnested regex (integer ranges)."""
    return sum(int(m[2] or int(m[0]) + 1) if m[1] else int(m[0]) for m in re.findall(r"\{(\d+)(,?)(\d*)\}", rx))


def _char_set(ranges):
    """One character of a JSON string's content out of the code-point ``ranges``: safe characters raw,
    quote, backslash and controls as the escapes a JSON encoder writes."""
    unsafe = [c for c in sorted(_UNSAFE) if any(lo <= c <= hi for lo, hi in ranges)]
    safe = negate(list(negate(ranges)) + [(c, c) for c in _UNSAFE])
    def cc(cp):
        return chr(cp) if chr(cp).isascii() and chr(cp).isalnum() else _u(cp)
    parts = [escape(chr(safe[0][0])) if len(safe) == 1 and safe[0][0] == safe[0][1] else
             "[" + "".join(cc(lo) if lo == hi else f"{cc(lo)}-{cc(hi)}" for lo, hi in safe) + "]"] if safe else []
    parts += [r'\\"'] * (0x22 in unsafe) + [r"\\\\"] * (0x5C in unsafe)
    short = "".join(ch for cp, ch in ((8, "b"), (9, "t"), (10, "n"), (12, "f"), (13, "r")) if cp in unsafe)
    parts += [r"\\" + (short if len(short) == 1 else f"[{short}]")] if short else []
    for nib in (0, 1):
        lows = "".join(f"{c & 15:x}" + f"{c & 15:X}" * (c & 15 > 9) for c in unsafe if c >> 4 == nib)
        parts += [rf"\\u00{nib}" + (lows if len(lows) == 1 else f"[{lows}]")] if lows else []
    return _alt(parts) or NEVER


# ---------------------------------------------------------------- integer and decimal ranges
def _same_len(x, y):
    """Digit strings from x to y (same length, x <= y)."""
    if x == y:
        return x
    i = next(k for k in range(len(x)) if x[k] != y[k])
    pre, x, y = x[:i], x[i:], y[i:]
    n, a, b, alts, last = len(x) - 1, int(x[0]), int(y[0]), [], None
    if x[1:] != "0" * n:
        alts.append(x[0] + _same_len(x[1:], "9" * n))
        a += 1
    if y[1:] != "9" * n:
        last, b = y[0] + _same_len("0" * n, y[1:]), b - 1
    if a <= b:
        alts.append((str(a) if a == b else f"[{a}-{b}]") + _rep("[0-9]", n, n))
    return pre + _alt(alts + [last])


def _pos_range(a, b):
    """Decimal integers from a >= 1 to b (None: unbounded)."""
    la, alts, full = len(str(a)), [], []
    for n in range(la, (la if b is None else len(str(b))) + 1):
        lo, hi = max(a, 10 ** (n - 1)), 10 ** n - 1 if b is None else min(b, 10 ** n - 1)
        if (lo, hi) == (10 ** (n - 1), 10 ** n - 1):
            full.append(n)                  # all n-digit numbers: merged into one [1-9][0-9]{..} below
        else:
            alts.append(_same_len(str(lo), str(hi)))
    if b is None:
        alts.append("[1-9]" + _rep("[0-9]", (full[0] if full else la + 1) - 1, None))
    elif full:
        alts.append("[1-9]" + _rep("[0-9]", full[0] - 1, full[-1] - 1))
    return _alt(alts)


def int_range_regex(lo, hi):
    """Regex for the JSON integers n with lo <= n <= hi (ints; None: unbounded), canonical form only (no "-0",
    no leading zeros); None when the range is empty."""
    if lo is None and hi is None:
        return "(?:0|-?[1-9][0-9]*)"
    alts = []
    if lo is None or lo < 0:
        a, b = (1 if hi is None or hi >= -1 else -hi), (None if lo is None else -lo)
        alts.append("-" + _pos_range(a, b) if b is None or a <= b else None)
    alts.append("0" if (lo is None or lo <= 0) and (hi is None or hi >= 0) else None)
    a = 1 if lo is None or lo <= 1 else lo
    alts.append(_pos_range(a, hi) if hi is None or a <= hi else None)
    return _alt(alts)


def _nonneg_decimal(lo, lox, hi, hix):
    """Numbers I(.F)? from lo >= 0 to hi (ints; hi None: unbounded; lox/hix: exclusive)."""
    ilo, ihi = lo + lox, None if hi is None else hi - 1       # integer parts that allow any fraction
    return _alt([
        int_range_regex(ilo, ihi) + r"(?:\.[0-9]+)?" if ihi is None or ilo <= ihi else None,
        str(lo) + r"\.[0-9]*[1-9][0-9]*" if lox and (hi is None or lo < hi) else None,
        str(hi) + r"(?:\.0+)?" if hi is not None and not hix and (hi > lo or hi == lo and not lox) else None])


def decimal_range_regex(lo, lox, hi, hix):
    """Regex for JSON numbers without exponent or negative zero between the integer bounds lo and hi
    (None: unbounded; lox/hix: the bound is exclusive); None when there are none."""
    alts = []
    if hi is None or hi > 0 or hi == 0 and not hix:
        alts.append(_nonneg_decimal(0, False, hi, hix) if lo is None or lo < 0 else _nonneg_decimal(lo, lox, hi, hix))
    if lo is None or lo < 0:              # -u with u > 0 and u >= -hi (> when hix), u <= -lo (< when lox)
        neg = _nonneg_decimal(*((0, True) if hi is None or hi >= 0 else (-hi, hix)), None if lo is None else -lo, lox)
        alts.append(None if neg is None else "-" + neg)
    return _alt(alts)


# ---------------------------------------------------------------- pattern: value regex -> content regex
_ECMA_SPACE = ((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
               (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF))     # ECMA-262 \s
_ECMA_LINE_END = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))


def _items(ranges):
    return "".join(_u(lo) if lo == hi else f"{_u(lo)}-{_u(hi)}" for lo, hi in ranges)


def _ecma(pattern):
    """A JSON Schema (ECMA-262) ``pattern`` in regex.py's dialect (Python's): '.' excludes all of ECMA's line
    terminators, not only \\n; \\S (and \\s in a negated class) mean ECMA's Unicode spaces; \\s elsewhere
    stays ASCII (a narrowing)."""
    out, i, cls = [], 0, None              # cls: None outside a class, else (where its items start, negated)
    while i < len(pattern):
        c, nxt = pattern[i], pattern[i + 1:i + 2]
        if c == "\\" and nxt in ("s", "S"):
            if cls is None:
                out.append(rf"[^{_items(_ECMA_SPACE)}]" if nxt == "S" else r"\s")
            else:
                out.append(_items(negate(_ECMA_SPACE)) if nxt == "S" else _items(_ECMA_SPACE) if cls[1] else r"\s")
            i += 2
        elif c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        elif cls is None and pattern.startswith("(?#", i):      # a comment, kept as it is
            j = pattern.find(")", i) % (len(pattern) + 1) + 1
            out.append(pattern[i:j])
            i = j
        elif cls is None and c == "[":
            j = i + 1 + (nxt == "^")
            cls = (j, j > i + 1)
            out.append(pattern[i:j])
            i = j
        else:
            if cls is not None and c == "]" and i > cls[0]:
                cls = None
            out.append(f"[^{_items(_ECMA_LINE_END)}]" if c == "." and cls is None else c)
            i += 1
    return "".join(out)


_PLAIN = {(0, None), (1, None), (0, 1)}     # * + ?: no copies


def _content(node):
    """(regex over a JSON string's content, copies its counted repetitions make) of a parsed (regex.parse)
    pattern over the string's value: each character class becomes ``_char_set`` of its code points."""
    kind = node[0]
    if kind == "set":
        return _char_set(list(node[1])), 0
    if kind in ("cat", "alt"):
        parts = [_content(c) for c in node[1]]
        copies = sum(k for _, k in parts)
        if kind == "alt":
            return _alt([t for t, _ in parts]), copies
        texts = [t for t, _ in parts]
        return (None if None in texts else "".join(texts)), copies
    _, child, lo, hi = node
    text, inner = _content(child)
    k = 0 if (lo, hi) in _PLAIN else hi if hi is not None else lo + 1
    copies = k * (1 + inner) - inner if k else inner
    if text is None:
        return ("" if lo == 0 else None), copies
    return (_rep(text if len(text) == 1 else f"(?:{text})", lo, hi) if text else ""), copies


# ---------------------------------------------------------------- the translator
def _key(name):
    return escape(json.dumps(name, ensure_ascii=False))


def _json_eq(a, b):
    """JSON equality: numbers by value (1 == 1.0), booleans only equal booleans, at any depth."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_json_eq, a, b))
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and isinstance(a, bool) == isinstance(b, bool):
        return a == b
    return type(a) is type(b) and a == b


def _type_ok(v, types):
    if isinstance(v, bool):
        return "boolean" in types
    if isinstance(v, (int, float)):
        return "number" in types or "integer" in types and (isinstance(v, int) or v.is_integer())
    return {str: "string", type(None): "null", list: "array", dict: "object"}.get(type(v)) in types


class _Translator:
    def __init__(self, root, ws, max_depth, rules=False):
        self.root, self.ws, self.max_depth = root, ws, max_depth
        self.refs, self.mult, self.copies, self.any_cache = [], 1, 0, {}
        self.rules = rules                  # recursion as rule calls (a pushdown guide) instead of unrolled
        self.rule_names: dict = {}          # rules mode: $ref pointer -> rule name (the recursive ones)
        self.rule_targets: dict = {}        # and -> the schema it points at

    def any_value(self, v):
        """Any JSON value whose container members are `v` (None: scalars only)."""
        ws, alts = self.ws, _SCALARS
        if v is not None:
            m = f"{_STRING}{ws}:{ws}{v}"
            alts += rf"|\{{{ws}(?:{m}(?:{ws},{ws}{m})*{ws})?\}}|\[{ws}(?:{v}(?:{ws},{ws}{v})*{ws})?\]"
        return f"(?:{alts})"

    def err(self, path, msg):
        raise JSONSchemaError(f"schema at {path or '/'}: {msg}")

    @contextlib.contextmanager
    def times(self, k):                     # what is generated inside gets copied k times
        old, self.mult = self.mult, self.mult * max(k, 1)
        try:
            yield
        finally:
            self.mult = old

    def charge(self, n, path):
        self.copies += self.mult * n
        if self.copies > MAX_COPIES:
            self.err(path, f"the length/item/value bounds need {self.copies} automaton copies, more than {MAX_COPIES}")

    def rep(self, atom, lo, hi, path):
        text = _rep(atom, lo, hi)
        if text.endswith("}"):
            self.charge(hi if hi is not None else lo + 1, path)
        return text

    def count(self, s, key, path, default=None):
        v = s[key] if key in s else default
        if key in s and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 and (
                isinstance(v, int) or v.is_integer())):
            self.err(path, f"{key!r} must be a non-negative integer, not {v!r}")
        return None if v is None else int(v)

    def any(self, level):
        if self.rules:
            self.rule_names.setdefault(None, "dk_any")
            return "(?&dk_any)"
        d = max(self.max_depth - level, 0)
        if d not in self.any_cache:
            self.any_cache[d] = self.any_value(self.any(level + 1) if d > 0 else None)
        return self.any_cache[d]

    def gen(self, s, path, level):
        """Regex for the schema ``s`` at JSON nesting ``level``; None when nothing can match."""
        if path.count("/") > MAX_SCHEMA_DEPTH:
            self.err(path[:200] + "...", f"the schema nests more than {MAX_SCHEMA_DEPTH} levels deep")
        rx = self._gen(s, path, level)
        if rx is not None and len(rx) > MAX_REGEX_CHARS:
            self.err(path, f"the schema's regex grows past {MAX_REGEX_CHARS} characters (deeply nested arrays / "
                           f"objects, or large enums)")
        return rx

    def _gen(self, s, path, level):
        if s is True or s == {}:
            return self.any(level)
        if s is False:
            return None
        if not isinstance(s, dict):
            self.err(path, f"expected a schema object or boolean, got {s!r}")
        keys = {k for k in s if k not in _ANNOTATIONS and not (isinstance(k, str) and k.startswith("x-"))}
        for k in sorted(keys - _KNOWN):
            self.err(path, f"keyword {k!r} is not supported")
        if "allOf" in s:
            if not isinstance(s["allOf"], list) or not s["allOf"]:
                self.err(path, "'allOf' must be a non-empty array")
            merged = {k: v for k, v in s.items() if k != "allOf"}
            for i, part in enumerate(s["allOf"]):
                merged = self.merge(merged, part, f"{path}/allOf/{i}")
            return None if merged is False else self.gen(merged, path, level)
        if "$ref" in s:
            if keys - {"$ref"}:
                self.err(path, f"'$ref' next to {sorted(keys - {'$ref'})} is not supported")
            return self.ref(s["$ref"], path, level)
        for kw in ("anyOf", "oneOf"):
            if kw in s:                     # siblings apply to every branch
                if not isinstance(s[kw], list) or not s[kw]:
                    self.err(path, f"{kw!r} must be a non-empty array")
                rest = {k: v for k, v in s.items() if k != kw}
                return _alt([self.gen(self.merge(rest, sub, f"{path}/{kw}/{i}"), f"{path}/{kw}/{i}", level)
                             for i, sub in enumerate(s[kw])])
        types = self.types(s, path)
        if "enum" in s or "const" in s:
            if keys - {"enum", "const", "type"}:
                self.err(path, f"'enum'/'const' next to {sorted(keys - {'enum', 'const', 'type'})} is not supported")
            vals = s["enum"] if "enum" in s else [s["const"]]
            if not isinstance(vals, list) or not vals:
                self.err(path, "'enum' must be a non-empty array")
            if "const" in s:                # both: the enum values equal to the const (1 == 1.0, True != 1)
                vals = [v for v in vals if _json_eq(v, s["const"])]
            return _alt([self.literal(v, path) for v in vals if "type" not in s or _type_ok(v, types)])
        if not keys:
            return self.any(level)
        if "multipleOf" in s and ("integer" in types or "number" in types) and (
                "number" in types or s["multipleOf"] != 1):
            self.err(path, f"'multipleOf' {s['multipleOf']!r} is not supported (only 1, on integers)")
        out = []
        for t in types:
            if t in ("null", "boolean"):
                out.append("null" if t == "null" else "(?:true|false)")
            elif t == "integer" and "number" not in types or t == "number":
                out.append(self.number(s, path, t == "integer"))
            elif t != "integer":
                out.append(getattr(self, t)(s, path, level))
        return _alt(out)

    def merge(self, a, b, path):
        """A schema for the instances valid under both ``a`` and ``b`` (False: none), if the parts don't conflict."""
        if b is True or a is False or b is False:
            return False if b is False else a
        if not isinstance(b, dict):
            self.err(path, f"expected a schema object or boolean, got {b!r}")
        a, b = self.constrain(a, b), self.constrain(b, a)
        out = dict(a)
        for k, v in b.items():
            if k not in out or k in _ANNOTATIONS or isinstance(k, str) and k.startswith("x-") or out[k] == v:
                out.setdefault(k, v)
            elif k == "type":               # intersection; a number may be an integer
                ta, tb = ([t] if isinstance(t, str) else list(t) for t in (out[k], v))
                ta, tb = (t + ["integer"] * ("number" in t) for t in (ta, tb))
                out[k] = list(dict.fromkeys(x for x in ta if x in tb))
                if not out[k]:
                    return False
            elif k == "required":
                out[k] = list(out[k]) + [r for r in v if r not in out[k]]
            elif k == "properties" and not set(out[k]) & set(v) and "additionalProperties" not in {**out, **b}:
                out[k] = {**out[k], **v}
            else:
                self.err(path, f"merging two different {k!r} (allOf, or anyOf/oneOf with siblings) is not supported")
        return out

    @staticmethod
    def constrain(x, y):
        """``x`` with its ``properties`` (``prefixItems``) also held to ``y``'s ``additionalProperties``
        (``items``) when ``y`` lists none: for ``y`` those keys (positions) are additional."""
        x = dict(x)
        if isinstance(x.get("properties"), dict) and "properties" not in y and y.get(
                "additionalProperties", True) not in (True, {}):
            x["properties"] = {k: {"allOf": [v, y["additionalProperties"]]} for k, v in x["properties"].items()}
        if isinstance(x.get("prefixItems"), list) and "prefixItems" not in y and y.get(
                "items", True) not in (True, {}):
            x["prefixItems"] = [{"allOf": [v, y["items"]]} for v in x["prefixItems"]]
        return x

    def ref(self, ref, path, level):
        if not isinstance(ref, str) or not ref.startswith("#") or ref[1:2] not in ("", "/"):
            self.err(path, f"'$ref' {ref!r}: only local JSON-pointer references ('#', '#/...') are supported")
        target, pointer = self.root, unquote(ref[1:])      # a URI fragment: percent-encoded (RFC 6901 6.)
        for tok in pointer.split("/")[1:]:
            tok = tok.replace("~1", "/").replace("~0", "~")
            try:
                target = target[int(tok) if isinstance(target, list) else tok]
            except (KeyError, ValueError, IndexError, TypeError):
                self.err(path, f"'$ref' {ref!r} does not resolve")
        if self.rules and pointer in self.refs:     # recursion: a call of the pointer's rule
            self.rule_targets[pointer] = target
            return "(?&" + self.rule_names.setdefault(pointer, f"dk_ref{len(self.rule_names)}") + ")"
        if self.refs.count(pointer) >= self.max_depth:
            return None                     # recursion deeper than max_depth: this branch can't match
        self.refs.append(pointer)
        try:
            return self.gen(target, pointer, level)
        finally:
            self.refs.pop()

    def types(self, s, path):
        t = s.get("type")
        if "type" not in s:
            return [k for k, kws in _BY_TYPE.items() if kws & set(s)] or list(_TYPES)
        t = [t] if isinstance(t, str) else t
        if not isinstance(t, list) or not t or any(x not in _TYPES for x in t):
            self.err(path, f"'type' {s['type']!r} is not a type name or a list of them")
        return list(dict.fromkeys(t))

    def literal(self, v, path):
        ws = self.ws
        if isinstance(v, dict):
            inner = f"{ws},{ws}".join(f"{_key(k)}{ws}:{ws}{self.literal(x, path)}" for k, x in v.items())
            return rf"\{{{ws}{inner}{ws}\}}" if v else rf"\{{{ws}\}}"
        if isinstance(v, list):
            inner = f"{ws},{ws}".join(self.literal(x, path) for x in v)
            return rf"\[{ws}{inner}{ws}\]" if v else rf"\[{ws}\]"
        if isinstance(v, float) and not math.isfinite(v):
            self.err(path, f"{v!r} is not a JSON value")
        return escape(json.dumps(v, ensure_ascii=False))

    def string(self, s, path, level):
        lo, hi = self.count(s, "minLength", path, 0), self.count(s, "maxLength", path)
        if hi is not None and lo > hi:
            self.err(path, f"'minLength' {lo} is greater than 'maxLength' {hi}")
        fmt = FORMATS.get(s["format"]) if isinstance(s.get("format"), str) else None
        if "pattern" in s and fmt:
            self.err(path, "'pattern' together with 'format' is not supported")
        if ("pattern" in s or fmt) and (lo or hi is not None):
            self.err(path, f"'minLength'/'maxLength' with {'format' if fmt else 'pattern'} is not supported")
        if "pattern" not in s:
            return f'"{fmt if fmt else self.rep(_CHAR if (lo, hi) == (0, None) else _CODE_POINT, lo, hi, path)}"'
        try:
            parse_regex(s["pattern"])       # (errors name positions in the pattern as given)
            body, copies = _content(parse_regex(_ecma(s["pattern"])))
        except RegexError as e:
            self.err(path, f"'pattern' {s['pattern']!r} is not supported: {e}")
        self.charge(copies, path)
        return None if body is None else f'"{body}"'

    def bound(self, s, path, kw, ex, tighter):
        v, e = s.get(kw), s.get(ex)
        for k, x in ((kw, v), (ex, e)):     # (an int is exact at any size: only a float can be inf / NaN)
            if x is not None and (not isinstance(x, (int, float)) or isinstance(x, bool) and k == kw
                                  or isinstance(x, float) and not math.isfinite(x)):
                self.err(path, f"{k!r} must be a number, not {_short(x)}")
        if isinstance(e, bool):             # draft 4: a flag on minimum / maximum
            if e and v is None:
                self.err(path, f"{ex!r} true without {kw!r}")
            return v, e, kw
        return (e, True, ex) if e is not None and (v is None or tighter(e, v)) else (v, False, kw)

    def number(self, s, path, integer):
        lo, lox, lok = self.bound(s, path, "minimum", "exclusiveMinimum", lambda e, v: e >= v)
        hi, hix, hik = self.bound(s, path, "maximum", "exclusiveMaximum", lambda e, v: e <= v)
        if lo is None and hi is None:
            return int_range_regex(None, None) if integer else _NUMBER
        if integer:                         # round inward
            ilo = None if lo is None else math.floor(lo) + 1 if lox else math.ceil(lo)
            ihi = None if hi is None else math.ceil(hi) - 1 if hix else math.floor(hi)
            rx = int_range_regex(ilo, ihi)
        else:
            for k, v in ((lok, lo), (hik, hi)):
                if v is not None and v != int(v):
                    self.err(path, f"{k!r} {_short(v)} on type number is not supported (only integer bounds)")
            rx = decimal_range_regex(None if lo is None else int(lo), lox, None if hi is None else int(hi), hix)
        if rx is None:
            self.err(path, f"{lok!r} {_short(lo)} and {hik!r} {_short(hi)} leave no "
                           f"{'integer' if integer else 'number'}")
        self.charge(_copies(rx), path)
        return rx

    def object(self, s, path, level):
        ws, req, props = self.ws, s.get("required", []), s.get("properties")
        lo, hi = self.count(s, "minProperties", path, 0), self.count(s, "maxProperties", path)
        if hi is not None and lo > hi:
            self.err(path, f"'minProperties' {lo} is greater than 'maxProperties' {hi}")
        if not isinstance(props, (dict, type(None))):
            self.err(path, f"'properties' must be an object (property name: schema), not {_short(props)}")
        if not isinstance(req, list):
            self.err(path, f"'required' must be an array of property names, not {_short(req)}")
        if any(not isinstance(r, str) or r not in (props or {}) for r in req):
            self.err(path, f"'required' {_short(req)} must list names in 'properties'")
        if props is None:                   # any keys, values per additionalProperties
            if lo > 1:                      # a regex cannot keep the keys apart: "a" twice would count as 2
                self.err(path, f"'minProperties' {lo} without 'properties' is not supported (the generated keys "
                               f"could repeat; list the properties instead)")
            with self.times(hi if hi is not None else max(lo, 1)):
                v = None if hi == 0 else self.gen(s.get("additionalProperties", True), f"{path}/additionalProperties",
                                                  level + 1)
            if v is None:
                return rf"\{{{ws}\}}" if lo == 0 else None
            m = f"{_STRING}{ws}:{ws}{v}"
            body = m + self.rep(f"(?:{ws},{ws}{m})", max(lo - 1, 0), None if hi is None else hi - 1, path)
            return rf"\{{{ws}{body}{ws}\}}" if lo else rf"\{{{ws}(?:{body}{ws})?\}}"
        members = []                        # [member regex, required], in the declared order
        for name, sub in props.items():
            ptr = str(name).replace("~", "~0").replace("/", "~1")
            v = self.gen(sub, f"{path}/properties/{ptr}", level + 1)
            if v is None and name in req:
                return None
            members += [[f"{_key(name)}{ws}:{ws}{v}", name in req]] if v is not None else []
        nreq = sum(r for _, r in members)
        if hi is not None and hi < nreq or lo > len(members):
            return None
        if lo == len(members):
            members = [[m, True] for m, _ in members]
        elif lo > max(nreq, 1) or hi is not None and hi < len(members):     # minProperties 1: non-empty
            self.err(path, "'minProperties'/'maxProperties' that don't follow from 'required' are not supported")
        sep, alts = f"{ws},{ws}", []
        for i, (m, required) in enumerate(members):     # i: the first member present
            alts.append(m + "".join(f"{sep}{mj}" if rj else f"(?:{sep}{mj})?" for mj, rj in members[i + 1:]))
            if required:
                break
        if not alts:
            return rf"\{{{ws}\}}"
        return rf"\{{{ws}{_alt(alts)}{ws}\}}" if nreq or lo else rf"\{{{ws}(?:{_alt(alts)}{ws})?\}}"

    def array(self, s, path, level):
        ws, items, prefix = self.ws, s.get("items"), s.get("prefixItems", [])
        if s.get("uniqueItems") not in (None, False):
            self.err(path, "'uniqueItems' true is not supported (not expressible as a regular expression)")
        if not isinstance(prefix, list) or isinstance(items, list):
            self.err(path, "'prefixItems' must be an array and 'items' a schema (tuples: use prefixItems)")
        lo, hi = self.count(s, "minItems", path, 0), self.count(s, "maxItems", path)
        if hi is not None and lo > hi:
            self.err(path, f"'minItems' {lo} is greater than 'maxItems' {hi}")
        k, sep, x, need = len(prefix), f"{ws},{ws}", None, max(lo, 1)   # need: for the non-empty body
        p = [self.gen(sub, f"{path}/prefixItems/{i}", level + 1) for i, sub in enumerate(prefix[:hi])]
        if items is not False and not (prefix and items is None) and (hi is None or hi > k):
            with self.times(hi - k if hi is not None else max(lo - k, 1)):
                x = self.gen(True if items is None else items, f"{path}/items", level + 1)

        def seq(i):                         # the elements from index i on; None: impossible
            if hi is not None and i >= hi:
                return ""
            if i < k:
                nxt = None if p[i] is None else seq(i + 1)
                rest = None if nxt is None else (sep if i else "") + p[i] + nxt
                return rest if i < need else "" if rest is None else f"(?:{rest})?"
            if x is None:
                return "" if i >= need else None
            more = None if hi is None else hi - i
            if i == 0:
                return x + self.rep(f"(?:{sep}{x})", need - 1, None if more is None else more - 1, path)
            return self.rep(f"(?:{sep}{x})", max(need - i, 0), more, path)

        body = None if hi == 0 else seq(0)
        if body is None:
            return rf"\[{ws}\]" if lo == 0 else None
        return rf"\[{ws}{body}{ws}\]" if lo else rf"\[{ws}(?:{body}{ws})?\]"


def _prepare(schema, whitespace):
    """(the schema as data, the whitespace regex grouped) or JSONSchemaError / ValueError."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise JSONSchemaError("schema at /: nested too deeply") from None
        except ValueError as e:
            raise JSONSchemaError(f"schema at /: not valid JSON: {e}") from None
    ws = DEFAULT_WHITESPACE if whitespace is None else whitespace
    try:
        parse_regex(ws)
    except RegexError as e:
        raise ValueError(f"whitespace {ws!r} is not a regular expression: {e}") from None
    if ws and not re.fullmatch(r"(?:\[[^\]]*\]|\\?[^\\()|\[\]])[?*+]?", ws):
        ws = f"(?:{ws})"
    return schema, ws


def json_schema_to_regex(schema, whitespace: str | None = None, max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    """schema: dict | bool | JSON text of one -> regex (str) whose full matches are valid instances.
    whitespace: the regex put where JSON allows whitespace (None: DEFAULT_WHITESPACE); max_depth: the nesting
    bound of schema-free values and recursive $refs. Raises JSONSchemaError (a ValueError)."""
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be a non-negative integer, not {max_depth!r}")
    schema, ws = _prepare(schema, whitespace)
    try:
        rx = _Translator(schema, ws, max_depth).gen(schema, "", 0)
    except RecursionError:
        raise JSONSchemaError("schema at /: nested too deeply") from None
    if rx is None:
        raise JSONSchemaError(f"schema at /: no JSON value satisfies the schema (recursion limited to "
                              f"max_depth={max_depth})")
    return rx


def json_schema_guide(schema, whitespace: str | None = None):
    """What the guide runs for a schema: its regex (str) when nothing in it recurses, else a RuleSet (pda.py)
    in which schema-free values (rule dk_any) and recursive $refs (rules dk_ref<n>) are rule calls, so they
    nest without a depth bound. A schema that recurses before any character (left recursion, e.g. a
    "$ref": "#" alternative at its top) falls back to json_schema_to_regex's unrolled recursion."""
    data, ws = _prepare(schema, whitespace)
    t = _Translator(data, ws, DEFAULT_MAX_DEPTH, rules=True)
    try:
        rx = t.gen(data, "", 0)
        if rx is None:
            raise JSONSchemaError("schema at /: no JSON value satisfies the schema")
        if not t.rule_names:
            return rx
        rules, done = [("root", rx)], set()
        while len(done) < len(t.rule_names):
            for key, name in list(t.rule_names.items()):
                if name in done:
                    continue
                done.add(name)
                if key is None:
                    body = t.any_value("(?&dk_any)")
                else:
                    t.refs = [key]
                    body = t.gen(t.rule_targets[key], key, 0)
                    t.refs = []
                rules.append((name, NEVER if body is None else body))
    except RecursionError:
        raise JSONSchemaError("schema at /: nested too deeply") from None
    rs = RuleSet(tuple(rules))
    try:
        compile_rules(rs)
    except LeftRecursionError:
        return json_schema_to_regex(data, whitespace)
    except RuleSetError as e:             # (a rule set built here only fails when its recursion never ends)
        raise JSONSchemaError(f"schema at /: no JSON value satisfies the schema ({e})") from None
    return rs


def json_object_regex(whitespace: str | None = None, max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    """-> regex (str) for any JSON object nesting at most max_depth containers."""
    return json_schema_to_regex({"type": "object"}, whitespace, max_depth)


def json_object_guide(whitespace: str | None = None):
    """The guide of any JSON object, nesting without a bound (response_format json_object): a RuleSet."""
    return json_schema_guide({"type": "object"}, whitespace)
