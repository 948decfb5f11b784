"""Neutral terminal output: what HTML escaping is to the web pages, :func:`term_safe` is to every line
diagnoser writes to a terminal (the text report, watch mode, progress and status lines, error lines).

A string a server, a Prometheus or a bundle provided (a target name, a log source, a model name, an
error message) may hold terminal controls: ESC sequences (OSC 52 clipboard writes, screen clears,
title changes, cursor moves), other C0 and C1 controls (a carriage return that overwrites a line, the
8-bit CSI ``\\x9b``), bidirectional overrides that reorder what is shown (U+202E), and lone surrogates
that no terminal encoding can write. Each is shown escaped, as text (``\\x1b``, ``\\u202e``), so the
reader sees that it was there and the terminal interprets nothing. Newlines and tabs are kept (the
report is multi-line); everything else passes unchanged.
"""

from __future__ import annotations

import re

# C0 controls but \t and \n, DEL, C1 controls, the bidi embeddings/overrides/isolates and marks, the line
# and paragraph separators, and lone surrogates
_UNSAFE_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def term_safe(s: str) -> str:
    """``s`` with every terminal control shown escaped (newlines and tabs kept)."""
    if not s:
        return s
    if s.isascii() and s.isprintable():  # the common case: printable ASCII, nothing to do
        return s
    return _UNSAFE_RE.sub(_escape, s)


def term_safe_line(s: str) -> str:
    """:func:`term_safe` for one line (a status or progress line): a newline is shown escaped too."""
    return term_safe(s).replace("\n", "\\n")
