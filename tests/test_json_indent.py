"""``jsonout.dumps(doc, indent=n)`` writes what ``json.dumps`` writes, byte for byte, with json's C encoder
doing the flat containers (and the lists and tables of flat records in one call each): on made documents
with every shape the fast writer handles or hands back (empty containers, records lists, tables of records,
strings holding braces, quotes, escapes and non-ASCII, -0.0, huge ints, NaN, tuples, float and str
subclasses, numpy numbers, non-str keys), and on a real report."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from diagnoser.floor import Floor
from diagnoser.jsonout import _default, _Indented, clean, dumps


def reference(obj: Any, indent: int) -> str:
    """What jsonout.dumps wrote before its fast indented writer: json's own."""
    try:
        return json.dumps(obj, allow_nan=False, indent=indent, default=_default)
    except ValueError:
        return json.dumps(clean(obj), allow_nan=False, indent=indent, default=_default)


class S(str):
    pass


SCALARS: list[Any] = ["", "plain", 'q"uote', "back\\slash", "},\n  {", "{\"a\": [1]}", "é ü \u2028 \ud83d\ude00", "\x00\x1b",
                      0, -1, 10**25, 1.5, -0.0, 1e16, 2.5e-300, True, False, None]
ODD: list[Any] = [math.nan, math.inf, (1, 2), Floor(100.0, 200.0), S("s"), np.float64(0.25), np.int64(3), {1, 2}]


def make(rng: random.Random, depth: int, odd: float) -> Any:
    r = rng.random()
    if depth > 4 or r < 0.35:
        return rng.choice(ODD) if rng.random() < odd else rng.choice(SCALARS)
    if r < 0.5:
        return [make(rng, depth + 1, odd) for _ in range(rng.randint(0, 4))]
    if r < 0.65:
        keys = rng.sample(["a", "b", "c", "d", "é", "}, {"], rng.randint(1, 4))
        return [{k: rng.choice(SCALARS) for k in keys if rng.random() < 0.9} for _ in range(rng.randint(0, 30))]  # records
    if r < 0.75:
        return {f"t{i}": {"last": rng.choice(SCALARS), "n": i} for i in range(rng.randint(0, 20))}  # a table of records
    d = {rng.choice(["x", "y", "z", "w"]) + str(i): make(rng, depth + 1, odd) for i in range(rng.randint(0, 5))}
    if rng.random() < odd:
        d[3] = "a non-str key"  # type: ignore[index]
    return d


@pytest.mark.parametrize("indent", [2, 0, 4])
def test_indented_dumps_is_json_dumps(indent: int) -> None:
    rng = random.Random(indent)
    fast = 0
    for i in range(3000):
        doc = make(rng, 0, odd=0.0 if i % 2 else 0.05)
        want = reference(doc, indent)
        assert dumps(doc, indent=indent) == want, doc
        fast += _Indented(indent).dumps(doc) is not None
    assert fast > 1500  # most took the fast writer (the rest: json's own)


def test_what_the_fast_writer_hands_back() -> None:
    for doc in ([math.nan], {"a": (1,)}, {"a": Floor(1.0)}, {1: "x"}, [S("x")], {"a": np.float64(1.0)}, {"a": {"b": [{"c": math.inf}]}}):
        assert _Indented(2).dumps(doc) is None
        assert dumps(doc, indent=2) == reference(doc, 2)


def test_a_real_report_takes_the_fast_writer() -> None:
    from diagnoser.outputs.report import build
    from tests.test_report_fast import hostile_fleet

    col, rep = hostile_fleet(0)
    doc = build(col, rep)
    text = _Indented(2).dumps(doc)
    assert text is not None and text == reference(doc, 2)
    assert dumps(SimpleNamespace(), indent=2) == reference(SimpleNamespace(), 2)  # (not JSON: its str, as before)
