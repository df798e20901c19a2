"""Shortened reprs of user-supplied values for error messages (shared by sampling/params.py and the guided
decoding translators, which params.py imports: kept apart so neither imports the other)."""
from __future__ import annotations


def show(v, limit: int = 60) -> str:
    """repr(v) for an error message, at most `limit` characters (a huge int has no repr past
    sys.get_int_max_str_digits(): its size instead)."""
    try:
        r = repr(v)
    except ValueError:  # int with too many digits to print
        return f"<an int of {v.bit_length()} bits>"
    return r if len(r) <= limit else r[:limit - 3] + "..."
