"""Two documents equal to the bit: the same types, the same order of keys, floats of the same bits.
Shared by tests/test_report_fast.py and bench/bench_report.py (no pytest import: the bench runs without it)."""

from __future__ import annotations

import math
import struct
from typing import Any


def same(a: Any, b: Any, path: str = "$", *, any_nan: bool = False) -> None:
    """AssertionError naming the first place where ``a`` and ``b`` differ; ``any_nan``: two NaNs are the
    same whatever their bits (sign and payload)."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b) or (any_nan and math.isnan(a) and math.isnan(b)), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}", any_nan=any_nan)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]", any_nan=any_nan)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
