"""The n-gram (prompt-lookup) drafter against a brute-force search, on crafted and random sequences."""
import random

import pytest

from decodekit.spec import NgramProposer


def brute(tokens, k, min_n, max_n):
    L = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if L < n:
            continue
        suffix = tokens[L - n:]
        for e in range(L - 1, n - 1, -1):  # latest earlier occurrence ending at e < L
            if tokens[e - n:e] == suffix:
                return tokens[e:e + k]
    return []


def test_crafted():
    p = NgramProposer(k=3, min_n=1, max_n=3)
    p.extend([5, 6, 7, 8, 9, 5, 6, 7])
    assert p.propose() == [8, 9, 5]          # "5 6 7" occurred before: continue it
    p.extend([8])
    assert p.propose() == [9, 5, 6]
    q = NgramProposer(k=2, min_n=2, max_n=2)
    q.extend([1, 2, 3])
    assert q.propose() == []                 # no earlier "2 3"
    q.extend([1, 2])
    assert q.propose() == [3, 1]
    r = NgramProposer(k=4)
    r.extend([7, 7, 7])
    assert r.propose() == [7]                # the latest earlier "7 7" ends at 2: one token follows
    assert NgramProposer().propose() == []


def test_random_against_brute_force():
    rng = random.Random(0)
    for trial in range(200):
        V = rng.choice([2, 3, 5, 50])
        k, min_n = rng.randint(1, 5), rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        p = NgramProposer(k, min_n, max_n)
        seq = []
        for step in range(rng.randint(1, 12)):
            new = [rng.randrange(V) for _ in range(rng.randint(1, 6))]
            p.extend(new)
            seq += new
            assert p.propose() == brute(seq, k, min_n, max_n), (trial, step, seq)
            assert p.propose(1) == brute(seq, 1, min_n, max_n)


def test_errors():
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        NgramProposer(k=0)
    with pytest.raises(ValueError, match="min_n \\(3\\) must be <= max_n \\(2\\)"):
        NgramProposer(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="max_n must be an int"):
        NgramProposer(max_n=2.5)
