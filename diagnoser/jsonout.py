"""Strict JSON for every JSON diagnoser writes (the report, web twins, bundles, the replay-server, plan).

JSON has no NaN or Infinity: Python's ``json`` prints them as the bare words ``NaN``/``Infinity``, which
other parsers (``jq``, browsers, Go, Grafana) reject. Here every non-finite number becomes ``null``, numpy
scalars become plain numbers, and anything else that is not JSON becomes its ``str``. The output always
passes a strict parser (``allow_nan=False`` is enforced, not hoped for).
"""

from __future__ import annotations

import json
import math
from typing import Any


def _default(o: Any) -> Any:
    """What ``json`` cannot write itself: numpy scalars and arrays, sets, and the rest as text."""
    item = getattr(o, "item", None)
    if item is not None and getattr(o, "shape", None) == ():  # a numpy scalar
        v = item()
        return None if isinstance(v, float) and not math.isfinite(v) else v
    tolist = getattr(o, "tolist", None)
    if tolist is not None:  # a numpy array
        return clean(tolist())
    if isinstance(o, set | frozenset):
        return clean(sorted(o, key=str))
    return str(o)


def clean(obj: Any) -> Any:
    """A copy of ``obj`` with every non-finite float (NaN, ±Inf) replaced by ``None``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` that never writes NaN/Infinity (``null`` instead) and never fails on a value type."""
    kw.setdefault("default", _default)
    try:  # the usual case: nothing to replace, no copy made
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(clean(obj), allow_nan=False, **kw)
