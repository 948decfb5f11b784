"""The terminal every text output shares: its width, its colour, wrapping at word boundaries, and the
one door every server- or bundle-provided string passes through before it is printed.

* Width: ``COLUMNS`` when set, else the size of the terminal the output goes to, else 80; at least 40
  and at most :data:`MAX_WIDTH` (a paragraph 250 columns wide is hard to read).
* Colour: on a TTY, unless ``NO_COLOR`` is set (https://no-color.org) or ``TERM=dumb``; ``--color
  always|never`` overrides. Colour is applied to whole wrapped lines or to a prefix, after wrapping, so
  the escape codes never count toward the width.
* Wrapping: :meth:`Term.wrap` breaks between words only; a single word longer than the line (a path, a
  URL) is broken after a ``/`` (or ``.``, ``_``, ``-``, ``=``, ``:``) when it has one, so no line is
  ever wider than the terminal; only a word with none of them is cut, and never below the width.
* :func:`shown` is the single place a string that came from a server or a bundle (a model name, a
  path, a log excerpt) is made safe to print: redacted, and control characters (escape sequences that
  could move the cursor or retitle the terminal) replaced.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import IO, Any

from diagnoser.outputs.termsafe import term_safe_line
from diagnoser.redact import redact_text

MAX_WIDTH = 160
MIN_WIDTH = 40
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BREAK_AFTER = "/._-=:,"
STYLES = {"bold": "1", "dim": "2", "red": "31", "yellow": "33", "green": "32", "cyan": "36", "boldred": "1;31", "boldyellow": "1;33"}
SEV_STYLE = {"critical": "boldred", "warning": "boldyellow", "info": "cyan", "CRIT": "boldred", "WARN": "boldyellow"}


def shown(value: Any) -> str:
    """A server- or bundle-provided value as it may be printed on a terminal: redacted, with control
    characters (ESC, BEL, CR, C1, bidi overrides, lone surrogates) shown escaped
    (:func:`diagnoser.outputs.termsafe.term_safe`). Every such string in a text output passes here."""
    return term_safe_line(redact_text(str(value)))


def visible_len(text: str) -> int:
    return len(_ANSI.sub("", text))


def columns(stream: IO[str] | None = None, default: int = 80) -> int:
    """The width to print at: ``COLUMNS``, else the terminal of ``stream`` (stdout), else ``default``."""
    try:
        n = int(os.environ.get("COLUMNS", "0") or 0)
    except ValueError:
        n = 0
    if n <= 0:
        stream = stream if stream is not None else sys.__stdout__
        try:
            n = os.get_terminal_size(stream.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            n = 0
    n = n if n > 0 else default
    return max(MIN_WIDTH, min(MAX_WIDTH, n))


def use_color(stream: IO[str] | None = None, mode: str | None = "auto") -> bool:
    """``--color always|never|auto``: auto is a TTY without ``NO_COLOR`` and not ``TERM=dumb``."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    stream = stream if stream is not None else sys.stdout
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _split_long(word: str, room: int) -> list[str]:
    """A word wider than ``room``: pieces that end after a separator (a path at its slashes), each at
    most ``room`` wide; a run with no separator is cut at ``room`` (the only cut left)."""
    out: list[str] = []
    rest = word
    while len(rest) > room:
        cut = rest.rfind("/", 0, room)  # a path at a slash first, else after another separator
        if cut < room // 3:
            cut = max((rest.rfind(c, 0, room) for c in _BREAK_AFTER), default=-1)
        cut = cut + 1 if cut > 0 else room
        out.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        out.append(rest)
    return out


@dataclass
class Term:
    """Width and colour of one output."""

    width: int = 80
    color: bool = False

    def wrap(self, text: str, indent: str = "  ", first: str | None = None) -> list[str]:
        """``text`` in lines of at most :attr:`width`, breaking between words (see the module doc)."""
        first = indent if first is None else first
        words = str(text).split()
        if words and len(words[0]) <= self.width - len(first) and max(map(len, words)) <= self.width - len(indent):
            return self._greedy(" ".join(words), indent, first)
        lines: list[str] = []
        line = first
        bare = True  # nothing but the indent on the current line yet
        for w in words:
            room = self.width - len(line) - (0 if bare else 1)
            if len(w) <= room:
                line = line + ("" if bare else " ") + w
                bare = False
                continue
            if not bare:
                lines.append(line)
                line, bare = indent, True
                room = self.width - len(line)
            if len(w) <= room:
                line, bare = line + w, False
                continue
            pieces = _split_long(w, max(8, room))
            for p in pieces[:-1]:
                lines.append(line + p)
                line = indent
            line, bare = line + pieces[-1], False
        if not bare or not lines:
            lines.append(line.rstrip() if bare else line)
        return lines

    def _greedy(self, rest: str, indent: str, first: str) -> list[str]:
        """:meth:`wrap` of words (``rest``, joined by single spaces) of which none is wider than a line: as many
        words on each line as fit, found with one ``rfind`` a line (the last space within the room)."""
        lines = []
        prefix = first
        while True:
            room = self.width - len(prefix)
            if len(rest) <= room:
                lines.append(prefix + rest)
                return lines
            cut = rest.rfind(" ", 0, room + 1)  # (the first word fits: a space follows it within the room)
            lines.append(prefix + rest[:cut])
            rest = rest[cut + 1:]
            prefix = indent

    def fit(self, text: str) -> str:
        """One line, cut at a word boundary with an ellipsis when wider than the terminal."""
        if len(text) <= self.width:
            return text
        cut = text.rfind(" ", 0, self.width - 1)
        cut = cut if cut > self.width // 2 else self.width - 1
        return text[:cut].rstrip(" ,;:·—-") + "…"

    def paint(self, text: str, style: str | None) -> str:
        if not self.color or not style or style not in STYLES:
            return text
        return f"\x1b[{STYLES[style]}m{text}\x1b[0m"


def term_for(stream: IO[str] | None = None, color: str | None = "auto", width: int | None = None) -> Term:
    """The :class:`Term` of ``stream`` (stdout by default) under ``--color``."""
    return Term(width=width or columns(stream), color=use_color(stream, color))
