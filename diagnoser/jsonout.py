"""Strict JSON for every JSON diagnoser writes (the report, web twins, bundles, the replay-server, plan).

JSON has no NaN or Infinity: Python's ``json`` prints them as the bare words ``NaN``/``Infinity``, which
other parsers (``jq``, browsers, Go, Grafana) reject. Here every non-finite number becomes ``null``, numpy
scalars become plain numbers, and anything else that is not JSON becomes its ``str``. The output always
passes a strict parser (``allow_nan=False`` is enforced, not hoped for).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def loads(data: str | bytes) -> Any:
    """``json.loads`` that is total on text: bytes are decoded with invalid UTF-8 replaced, and a lone
    surrogate written as an escape (``"\\ud800"``, which json accepts and no output can encode) becomes
    U+FFFD, in values and keys at any depth (walked without recursion). Raises what ``json.loads`` raises
    (ValueError, RecursionError for a nesting deeper than it parses)."""
    if isinstance(data, bytes | bytearray):
        data = bytes(data).decode("utf-8", "replace")
    doc = json.loads(data)
    if "\\" in data and "\\u" in data and _SURROGATE_ESCAPE.search(data):  # (one character: the fast scan first)
        doc = _no_surrogates(doc)
    return doc


def _fix(s: str) -> str:
    return s if s.isascii() else _SURROGATE.sub("\ufffd", s)


def _no_surrogates(doc: Any) -> Any:
    if isinstance(doc, str):
        return _fix(doc)
    stack = [doc] if isinstance(doc, dict | list) else []
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, str):
                    node[i] = _fix(v)
                elif isinstance(v, dict | list):
                    stack.append(v)
        else:
            items = list(node.items())
            node.clear()
            for k, v in items:
                if isinstance(v, str):
                    v = _fix(v)
                elif isinstance(v, dict | list):
                    stack.append(v)
                node[_fix(k)] = v
    return doc


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
