"""Parse the ``server_args=ServerArgs(k=v, …)`` startup line into a dict (secrets redacted)."""

from __future__ import annotations

import ast
from typing import Any

from diagnoser.redact import redact_value


def _split_top(text: str) -> list[str]:
    parts, depth, cur, quote = [], 0, [], ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            cur.append(c)
            if c == "\\" and i + 1 < len(text):
                cur.append(text[i + 1])
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c in "([{":
            depth += 1
            cur.append(c)
        elif c in ")]}":
            depth -= 1
            cur.append(c)
        elif c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        parts.append("".join(cur))
    return parts


def _literal(text: str) -> Any:
    """``ast.literal_eval`` of log text, quietly: a garbled line may hold an invalid escape (``"\\_"``),
    which only warns."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.literal_eval(text)


def _value(text: str) -> Any:
    text = text.strip()
    try:
        return _literal(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _parse_dict(text: str) -> dict[str, Any]:
    try:
        d = _literal(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        d = None
    if isinstance(d, dict):
        return {str(k): redact_value(str(k), v) for k, v in d.items()}
    # a cut or odd line: split the top level "'k': v" pairs by hand
    body = text.strip().lstrip("{").rstrip("}")
    out: dict[str, Any] = {}
    for part in _split_top(body):
        key, sep, val = part.partition(":")
        key = key.strip().strip("'\"")
        if sep and key.isidentifier():
            out[key] = redact_value(key, _value(val))
    return out


def parse_server_args_repr(line: str) -> dict[str, Any]:
    """``server_args=ServerArgs(k=v, …)`` (dataclass repr) or ``server_args={'k': v, …}`` (0.5.2x dict)."""
    brace = line.find("server_args={")
    if brace >= 0:
        return _parse_dict(line[brace + len("server_args=") :].rstrip())
    start = line.find("ServerArgs(")
    if start < 0:
        return {}
    body = line[start + len("ServerArgs(") :]
    body = body.rstrip()
    if body.endswith(")"):
        body = body[:-1]
    out: dict[str, Any] = {}
    for part in _split_top(body):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            continue
        out[key] = redact_value(key, _value(val))
    return out
