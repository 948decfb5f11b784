"""Rule docs and the ``docs/`` pages: a small Markdown subset, rendered as terminal text (``diagnose
explain``), as HTML (``/rules/NAME`` and ``/docs/sglang`` in ``diagnose serve``) and as Markdown
(``docs/rules.md``).

The subset, which every rule docstring is written in:

* blocks: paragraphs; ``- `` / ``* `` / ``1. `` lists (nested by indentation, items may span lines);
  fenced code (```` ``` ````); ``#`` … ``######`` headings; tables (``| a | b |`` rows under a ``|---|``
  line); a line ``<a id="name"></a>`` names the heading that follows (the stable anchors of
  ``docs/sglang.md``). No other HTML is recognised: it is shown as text.
* inline: ``code`` spans in backticks, ``**bold**``, ``[text](target)`` links and bare ``https://`` URLs.

Link targets are ``http(s)://`` URLs, ``#anchor`` and paths in the repository such as
``docs/sglang.md#decode-line``; each output maps them (the terminal shows the path as written, the web app
links ``/docs/sglang#decode-line``, ``docs/rules.md`` links ``sglang.md#decode-line``). A target of any other
scheme (``javascript:``, ``data:``) is never linked. The HTML escapes every character of the source; markup
comes only from the constructs above.
"""

from __future__ import annotations

import html
import inspect
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

ANCHOR_RE = re.compile(r'<a id="([A-Za-z][\w-]*)"></a>')
_HEADING_RE = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE_RE = re.compile(r"(`{3,})\s*([\w+-]*)\s*$")
_TABLE_SEP_RE = re.compile(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_ITEM_RE = re.compile(r"( *)([-*]|\d{1,3}[.)]) +(\S.*)$")
_INLINE_RE = re.compile(
    r"(?P<code>(?P<ticks>`+)(?P<ctext>.+?)(?<!`)(?P=ticks)(?!`))"
    r"|\[(?P<ltext>[^\]\n]+)\]\((?P<href>[^)\s]+)\)"
    r"|\*\*(?P<bold>[^*\n]+?)\*\*"
    r"|(?P<url>https?://[^\s<>()\[\]`]*[^\s<>()\[\]`.,;:!?'\"])"
)
_SAFE_RELATIVE_RE = re.compile(r"[\w./#-]+$")

Link = Callable[[str], "str | None"]


@dataclass(slots=True)
class Block:
    kind: str  # para, heading, list, code, table, anchor
    text: str = ""
    level: int = 0
    anchor: str | None = None
    ordered: bool = False
    items: list[list[Block]] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


# -- parsing -------------------------------------------------------------------------------------------------

def parse(text: str) -> list[Block]:
    """The blocks of a Markdown-subset text (indentation is removed as from a docstring: the first line's
    own, and what the other lines share)."""
    return _blocks(inspect.cleandoc(text.expandtabs(4)).split("\n"))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _starts_block(line: str) -> bool:
    s = line.strip()
    return bool(_ITEM_RE.match(line) or _HEADING_RE.match(s) or _FENCE_RE.match(s) or ANCHOR_RE.fullmatch(s))


def _cells(row: str) -> list[str]:
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)]


def _blocks(lines: list[str]) -> list[Block]:
    out: list[Block] = []
    anchor: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if not s:
            i += 1
            continue
        if m := ANCHOR_RE.fullmatch(s):
            if anchor:
                out.append(Block("anchor", anchor=anchor))
            anchor = m.group(1)
            i += 1
            continue
        if m := _FENCE_RE.match(s):
            base, fence, body = _indent(line), m.group(1), []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i][base:] if not lines[i][:base].strip() else lines[i].lstrip())
                i += 1
            out.append(Block("code", "\n".join(body), anchor=anchor))
            anchor = None
            i += 1
            continue
        if m := _HEADING_RE.match(s):
            out.append(Block("heading", m.group(2), level=len(m.group(1)), anchor=anchor))
            anchor = None
            i += 1
            continue
        if s.startswith("|") and i + 1 < len(lines) and _TABLE_SEP_RE.match(lines[i + 1].strip()):
            rows = [_cells(s)]
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append(Block("table", rows=rows, anchor=anchor))
            anchor = None
            continue
        if m := _ITEM_RE.match(line):
            block, i = _list(lines, i)
            block.anchor, anchor = anchor, None
            out.append(block)
            continue
        para = [s]
        i += 1
        while i < len(lines) and lines[i].strip() and not _starts_block(lines[i]) and not (
                lines[i].strip().startswith("|") and i + 1 < len(lines) and _TABLE_SEP_RE.match(lines[i + 1].strip())):
            para.append(lines[i].strip())
            i += 1
        out.append(Block("para", " ".join(para), anchor=anchor))
        anchor = None
    if anchor:
        out.append(Block("anchor", anchor=anchor))
    return out


def _list(lines: list[str], i: int) -> tuple[Block, int]:
    first = _ITEM_RE.match(lines[i])
    assert first is not None
    base = len(first.group(1))
    block = Block("list", ordered=first.group(2)[0].isdigit())
    while i < len(lines):
        m = _ITEM_RE.match(lines[i])
        if not m or len(m.group(1)) != base:
            break
        content = m.start(3)
        item = [m.group(3)]
        i += 1
        while i < len(lines):
            line = lines[i]
            if not line.strip():
                nxt = next((k for k in range(i + 1, len(lines)) if lines[k].strip()), None)
                if nxt is None or _indent(lines[nxt]) <= base:
                    break  # a blank line then something at the list's indentation (or less): the item ends
                item.append("")
                i += 1
                continue
            ind = _indent(line)
            if ind <= base and (_starts_block(line) or item[-1] == ""):
                break  # the next item, or a paragraph after the list
            if ind < base:
                break
            item.append(line[content:] if ind >= content else line.strip())
            i += 1
        block.items.append(_blocks(item))
    return block, i


# -- inline --------------------------------------------------------------------------------------------------

def _pieces(text: str) -> list[tuple[str, str, str]]:
    """(kind, text, target) runs of one inline text: kind is text, code, bold, link or url."""
    out: list[tuple[str, str, str]] = []
    pos = 0
    for m in _INLINE_RE.finditer(text):
        if m.start() > pos:
            out.append(("text", text[pos:m.start()], ""))
        if m.group("code") is not None:
            code = m.group("ctext")
            if len(code) > 2 and code[0] == " " and code[-1] == " " and code.strip():
                code = code[1:-1]  # CommonMark: one space each side is padding (for spans that start with `)
            out.append(("code", code, ""))
        elif m.group("ltext") is not None:
            out.append(("link", m.group("ltext"), m.group("href")))
        elif m.group("bold") is not None:
            out.append(("bold", m.group("bold"), ""))
        else:
            out.append(("url", m.group("url"), m.group("url")))
        pos = m.end()
    if pos < len(text):
        out.append(("text", text[pos:], ""))
    return out


def safe_target(target: str) -> bool:
    """http(s) URLs, #anchors and plain relative paths; never javascript:, data: or other schemes."""
    if target.startswith(("https://", "http://")):
        return True
    return bool(_SAFE_RELATIVE_RE.match(target)) and not target.startswith("//")


def inline_text(text: str, link: Link | None = None) -> str:
    """One inline text without markup: code and bold as plain text, a link as ``text (target)``."""
    out = []
    for kind, t, target in _pieces(text):
        if kind == "link":
            shown = (link or _same)(target) if safe_target(target) else None
            label = inline_text(t)
            out.append(label if not shown or shown == label else f"{label} ({shown})")
        elif kind == "bold":
            out.append(inline_text(t))
        else:
            out.append(t)
    return "".join(out)


def inline_html(text: str, link: Link | None = None) -> str:
    out = []
    for kind, t, target in _pieces(text):
        if kind == "code":
            out.append(f"<code>{html.escape(t)}</code>")
        elif kind == "bold":
            out.append(f"<strong>{inline_html(t, link)}</strong>")
        elif kind in ("link", "url"):
            href = (link or _same)(target) if safe_target(target) else None
            label = inline_html(t, _no_link) if kind == "link" else html.escape(t)
            if href is None:
                out.append(label)
            else:
                ext = ' rel="noopener noreferrer"' if href.startswith(("http://", "https://")) else ""
                out.append(f'<a href="{html.escape(href, quote=True)}"{ext}>{label}</a>')
        else:
            out.append(html.escape(t))
    return "".join(out)


def _same(target: str) -> str:
    return target


def _no_link(target: str) -> None:
    return None


# -- outputs -------------------------------------------------------------------------------------------------

def slug(text: str) -> str:
    """A heading's id when no anchor names it (GitHub's rule, close enough for our own pages)."""
    t = re.sub(r"[^\w\s-]", "", inline_text(text).lower()).strip()
    return re.sub(r"\s+", "-", t)


def to_html(text: str, link: Link | None = None, heading_offset: int = 0) -> str:
    """HTML of a Markdown-subset text; ``heading_offset`` shifts heading levels (``#`` → ``h(1+offset)``)."""
    return _html_blocks(parse(text), link, heading_offset)


def _html_blocks(blocks: list[Block], link: Link | None, offset: int) -> str:
    out: list[str] = []
    for b in blocks:
        aid = f' id="{html.escape(b.anchor, quote=True)}"' if b.anchor else ""
        if b.kind == "para":
            out.append(f"<p{aid}>{inline_html(b.text, link)}</p>")
        elif b.kind == "heading":
            level = min(6, b.level + offset)
            hid = b.anchor or slug(b.text)
            out.append(f'<h{level} id="{html.escape(hid, quote=True)}">{inline_html(b.text, link)}</h{level}>')
        elif b.kind == "code":
            out.append(f"<pre{aid}><code>{html.escape(b.text)}</code></pre>")
        elif b.kind == "list":
            tag = "ol" if b.ordered else "ul"
            items = []
            for item in b.items:
                if len(item) == 1 and item[0].kind == "para":
                    items.append(f"<li>{inline_html(item[0].text, link)}</li>")
                else:
                    items.append(f"<li>{_html_blocks(item, link, offset)}</li>")
            out.append(f"<{tag}{aid}>" + "".join(items) + f"</{tag}>")
        elif b.kind == "table":
            head, *rows = b.rows
            th = "".join(f"<th>{inline_html(c, link)}</th>" for c in head)
            body = "".join("<tr>" + "".join(f"<td>{inline_html(c, link)}</td>" for c in r) + "</tr>" for r in rows)
            out.append(f'<div class="mdtable"{aid}><table class="md"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>')
        elif b.kind == "anchor":
            out.append(f"<span{aid}></span>")
    return "\n".join(out)


def terminal_width(default: int = 100) -> int:
    """The terminal's width (outputs/term.columns: COLUMNS, the TTY), at most ``default`` for prose."""
    from diagnoser.outputs.term import columns

    return max(40, min(default, columns()))


def to_text(text: str, width: int | None = None, indent: str = "", link: Link | None = None) -> str:
    """Plain terminal text: no markup, paragraphs re-wrapped at ``width``, lists with hanging indents."""
    return "\n".join(_text_blocks(parse(text), width or terminal_width(), indent, link))


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def _text_blocks(blocks: list[Block], width: int, indent: str, link: Link | None, tight: bool = False) -> list[str]:
    out: list[str] = []
    for b in blocks:
        if out and b.kind != "anchor" and not tight:
            out.append("")
        if b.kind == "para":
            out += _wrap(inline_text(b.text, link), width, indent, indent)
        elif b.kind == "heading":
            title = inline_text(b.text, link)
            out += [indent + title, indent + ("=" if b.level == 1 else "-") * len(title)]
        elif b.kind == "code":
            out += [indent + "    " + line if line else "" for line in b.text.split("\n")]
        elif b.kind == "list":
            for n, item in enumerate(b.items, 1):
                bullet = f"{n}. " if b.ordered else "- "
                pad = " " * len(bullet)
                lines = _text_blocks(item, width, indent + pad, link, tight=True)
                if lines:
                    lines[0] = indent + bullet + lines[0][len(indent + pad):]
                out += lines
        elif b.kind == "table":
            rows = [[inline_text(c, link) for c in r] for r in b.rows]
            ncol = max(len(r) for r in rows)
            widths = [min(40, max((len(r[k]) if k < len(r) else 0) for r in rows)) for k in range(ncol)]
            for n, r in enumerate(rows):
                out.append(indent + "  ".join((r[k] if k < len(r) else "").ljust(widths[k]) for k in range(ncol)).rstrip())
                if n == 0:
                    out.append(indent + "  ".join("-" * w for w in widths))
    while out and out[-1] == "":
        out.pop()
    return out


def rewrite_links(text: str, link: Link) -> str:
    """The Markdown source with every ``[text](target)`` target mapped (targets ``link`` returns None for
    are left as they are); for ``docs/rules.md``, which links ``sglang.md#…`` instead of ``docs/sglang.md#…``."""
    def sub(m: re.Match[str]) -> str:
        new = link(m.group(2))
        return f"[{m.group(1)}]({new if new else m.group(2)})"
    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", sub, text)


def links(text: str) -> list[str]:
    """Every link target of a Markdown-subset text (inline links and bare URLs)."""
    return [target for b in _walk(parse(text)) for t in _texts(b) for kind, _, target in _pieces(t) if kind in ("link", "url")]


def anchors(text: str) -> list[str]:
    """The stable anchors (``<a id="…"></a>``) a page defines."""
    return ANCHOR_RE.findall(text)


def _walk(blocks: list[Block]) -> list[Block]:
    out = []
    for b in blocks:
        out.append(b)
        for item in b.items:
            out += _walk(item)
    return out


def _texts(b: Block) -> list[str]:
    if b.kind in ("para", "heading"):
        return [b.text]
    if b.kind == "table":
        return [c for r in b.rows for c in r]
    return []
