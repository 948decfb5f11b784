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
from itertools import chain
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
    if kw.keys() == {"indent"} and type(kw["indent"]) is int and 0 <= kw["indent"] <= 16:
        text = _Indented(kw["indent"]).dumps(obj)  # (json's own indented writer is pure Python: 3.4 s for a fleet report)
        if text is not None:
            return text
    kw.setdefault("default", _default)
    try:  # the usual case: nothing to replace, no copy made
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(clean(obj), allow_nan=False, **kw)


_FLAT = frozenset((str, int, float, bool, type(None)))
_STR = frozenset((str,))
_DICT = frozenset((dict,))


class _Unsupported(Exception):
    """What :class:`_Indented` leaves to ``json.dumps``."""


class _Indented:
    """``json.dumps(obj, indent=n, allow_nan=False, default=_default)``, the same text, with json's C writer
    doing the flat containers (numbers and strings only: most of a report): each is written by the C
    encoder with the item separator of its depth (",\n" and the indent), then opened and closed as the
    indented form does. The rest (the few containers that hold containers) is walked here. Gives up (None)
    on what json's own writer does differently or refuses: a key that is not a str, a NaN or an infinity,
    a tuple, a subclass of a container or a scalar, a value only ``default`` can write, a depth past 200."""

    __slots__ = ("step", "pads", "flat")

    def __init__(self, indent: int) -> None:
        self.step = " " * indent
        self.pads: list[str] = []
        self.flat: list[Any] = []

    def dumps(self, obj: Any) -> str | None:
        try:
            return self.value(obj, 0)
        except (_Unsupported, ValueError, RecursionError):
            return None

    def pad(self, level: int) -> str:
        while len(self.pads) <= level:
            self.pads.append("\n" + self.step * len(self.pads))
            self.flat.append(json.encoder.c_make_encoder(  # type: ignore[attr-defined]
                None, _default, json.encoder.encode_basestring_ascii, None, ": ", "," + self.pads[-1] + self.step,
                False, False, False) if json.encoder.c_make_encoder is not None else None)  # type: ignore[attr-defined]
        return self.pads[level]

    def value(self, o: Any, level: int) -> str:
        t = type(o)
        if t is str:
            return json.encoder.encode_basestring_ascii(o)  # type: ignore[no-any-return]
        if o is None:
            return "null"
        if o is True:
            return "true"
        if o is False:
            return "false"
        if t is int:
            return int.__repr__(o)
        if t is float:
            if o != o or o in (math.inf, -math.inf):
                raise _Unsupported
            return float.__repr__(o)
        if t is dict:
            return self.mapping(o, level)
        if t is list:
            return self.sequence(o, level)
        raise _Unsupported

    def mapping(self, o: dict[Any, Any], level: int) -> str:
        if not o:
            return "{}"
        if level > 200:
            raise _Unsupported
        inner = self.pad(level + 1)
        enc = self.flat[level]
        if not _STR.issuperset(map(type, o)):
            raise _Unsupported
        if enc is not None and _FLAT.issuperset(map(type, o.values())):
            return "{" + inner + "".join(enc(o, 0))[1:-1] + self.pads[level] + "}"
        ek = json.encoder.encode_basestring_ascii
        vals = list(o.values())
        rows = self.records(vals, level + 1) if len(vals) > 1 and type(vals[0]) is dict else None
        if rows is not None:  # (a table of records: each target's signals)
            items = [ek(k) + ": " + r for k, r in zip(o, rows, strict=True)]
        else:
            items = [ek(k) + ": " + self.value(v, level + 1) for k, v in o.items()]
        return "{" + inner + ("," + inner).join(items) + self.pads[level] + "}"

    def sequence(self, o: list[Any], level: int) -> str:
        if not o:
            return "[]"
        if level > 200:
            raise _Unsupported
        inner = self.pad(level + 1)
        enc = self.flat[level]
        if enc is not None and _FLAT.issuperset(map(type, o)):
            return "[" + inner + "".join(enc(o, 0))[1:-1] + self.pads[level] + "]"
        rows = self.records(o, level + 1) if len(o) > 1 and type(o[0]) is dict else None
        if rows is not None:  # (the rules checked: 230,000 records at 10,000 targets)
            return "[" + inner + ("," + inner).join(rows) + self.pads[level] + "]"
        return "[" + inner + ("," + inner).join([self.value(v, level + 1) for v in o]) + self.pads[level] + "]"

    def records(self, rows: list[Any], level: int) -> list[str] | None:
        """The text of each of ``rows`` (at ``level``) when all are flat dicts, none empty, with str keys: one C
        call for all, split where one row ends and the next begins ("}," and the row indent, then "{": a raw
        newline is never inside a written string, and a flat row's last value never ends in "}"); else None."""
        enc = self.flat[level]
        if enc is None or not _DICT.issuperset(map(type, rows)) or not all(rows):
            return None
        if not _STR.issuperset(map(type, set().union(*rows))):
            return None
        if not _FLAT.issuperset(map(type, chain.from_iterable(map(dict.values, rows)))):
            return None
        inner = self.pad(level + 1)
        parts = "".join(enc(rows, 0))[2:-2].split("}," + inner + "{")
        if len(parts) != len(rows):
            return None
        head, tail = "{" + inner, self.pads[level] + "}"
        return [head + p + tail for p in parts]
