"""Result files of the benchmark commands (--output-json): checked before a run starts, so a path that
cannot be written fails at once with one line naming the option (not with a traceback after the run)."""
from __future__ import annotations

import json
import math
import os


def check_output_file(path: str | None, option: str = "--output-json") -> None:
    """Creates the file's directory and checks the file can be written (ValueError naming `option` if not)."""
    if not path:
        return
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise ValueError(f"argument {option}: {path!r} is a directory, not a file")
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        existed = os.path.exists(full)
        with open(full, "a"):
            pass
        if not existed:
            os.unlink(full)
    except OSError as e:
        raise ValueError(f"argument {option}: cannot write {path!r} ({e})") from None


def finite_json(x):
    """x with every non-finite float (NaN, inf) replaced by None, so json.dumps writes valid JSON (no NaN /
    Infinity tokens)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x


def dumps(res: dict, indent: int = 2) -> str:
    """The result as strict JSON text (non-finite numbers as null)."""
    return json.dumps(finite_json(res), indent=indent, default=str, allow_nan=False)
