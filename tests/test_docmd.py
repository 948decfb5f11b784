"""The doc renderer (diagnoser/outputs/docmd.py): its Markdown subset as blocks, as terminal text and as
HTML, with hostile input escaped. The real rule docs and docs/sglang.md are checked in test_docs.py."""

from __future__ import annotations

import re

import pytest

from diagnoser.outputs import docmd

SAMPLE = """Intro with `code <x>`, **bold** and a [link with `code`](docs/sglang.md#decode-line); a bare URL
https://github.com/sgl-project/sglang/issues/2746, then more text.

- first item,
  continued on the next line
  - a nested item
- second item

1. one
2. two

```
Decode batch, #running-req: 4, <b>not bold</b>
    indented
```

<a id="stable"></a>
## A heading with `code`

| field | meaning |
|---|---|
| `#token` | KV slots held |
"""

HOSTILE = """<script>alert(1)</script> and <img src=x onerror=alert(2)>

- [click](javascript:alert(3)) and [data](data:text/html,<b>x</b>) and [quote](https://e.com/"onmouseover="alert(4))
- `<script>alert(5)</script>` and **<i>x</i>**

<a id="x" onclick="alert(6)"></a>

| <b>h</b> | `<td>` |
|---|---|
| <iframe> | & |
"""


def test_blocks_of_the_subset() -> None:
    blocks = docmd.parse(SAMPLE)
    assert [b.kind for b in blocks] == ["para", "list", "list", "code", "heading", "table"]
    ul, ol = blocks[1], blocks[2]
    assert not ul.ordered and ol.ordered and len(ul.items) == 2 and len(ol.items) == 2
    first = ul.items[0]
    assert first[0].text == "first item, continued on the next line" and first[1].kind == "list"
    assert blocks[3].text == "Decode batch, #running-req: 4, <b>not bold</b>\n    indented"
    assert blocks[4].anchor == "stable" and blocks[4].level == 2
    assert blocks[5].rows == [["field", "meaning"], ["`#token`", "KV slots held"]]


def test_docstring_indentation_is_removed() -> None:
    doc = "First line.\n    - an item\n      continued\n    - another\n"
    blocks = docmd.parse(doc)
    assert [b.kind for b in blocks] == ["para", "list"]
    assert [i[0].text for i in blocks[1].items] == ["an item continued", "another"]


def test_html_has_the_structure() -> None:
    h = docmd.to_html(SAMPLE, link=lambda t: "/docs/sglang#" + t.split("#")[1] if t.startswith("docs/sglang.md") else t)
    assert "<code>code &lt;x&gt;</code>" in h and "<strong>bold</strong>" in h
    assert '<a href="/docs/sglang#decode-line">link with <code>code</code></a>' in h
    assert '<a href="https://github.com/sgl-project/sglang/issues/2746" rel="noopener noreferrer">' in h
    assert re.search(r"<ul><li><p>first item, continued on the next line</p>\s*<ul><li>a nested item</li></ul></li><li>second item</li></ul>", h)
    assert "<ol><li>one</li><li>two</li></ol>" in h
    assert "<pre><code>Decode batch, #running-req: 4, &lt;b&gt;not bold&lt;/b&gt;\n    indented</code></pre>" in h
    assert '<h2 id="stable">A heading with <code>code</code></h2>' in h
    assert "<th>field</th>" in h and "<td><code>#token</code></td>" in h
    assert docmd.to_html("## Plain heading") == '<h2 id="plain-heading">Plain heading</h2>'
    assert docmd.to_html("# One", heading_offset=2).startswith("<h3 ")


def test_html_escapes_everything_and_links_only_safe_targets() -> None:
    h = docmd.to_html(HOSTILE)
    # no tag from the input survives: every < of the source is &lt;
    tags = set(re.findall(r"<(/?[a-z0-9]+)", h))
    assert tags <= {"p", "/p", "ul", "/ul", "li", "/li", "code", "/code", "strong", "/strong", "a", "/a", "div", "/div",
                    "table", "/table", "thead", "/thead", "tbody", "/tbody", "tr", "/tr", "th", "/th", "td", "/td"}, tags
    assert "<script" not in h and "<img" not in h and "<iframe" not in h and 'onclick="' not in h and 'onmouseover="' not in h
    hrefs = re.findall(r'href="([^"]*)"', h)
    assert all(href.startswith("https://") for href in hrefs), hrefs
    assert all('"' not in href for href in hrefs)  # the quote in the URL ends it, no attribute injection
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in h and "&amp;" in h


def test_unsafe_targets() -> None:
    for bad in ("javascript:alert(1)", "data:text/html,x", "vbscript:x", "//evil.example/x", "file:///etc/passwd", "a b"):
        assert not docmd.safe_target(bad), bad
    for good in ("https://docs.sglang.ai/x.html", "docs/sglang.md#decode-line", "#kv-sizing", "rules.md"):
        assert docmd.safe_target(good), good


def test_text_has_no_markup_and_wraps() -> None:
    t = docmd.to_text(SAMPLE, width=60)
    assert "`" not in t and "**" not in t and "](" not in t and "<a id" not in t
    assert "link with code (docs/sglang.md#decode-line)" in " ".join(t.split())
    lines = t.split("\n")
    assert "- first item, continued on the next line" in lines and "  - a nested item" in lines
    assert "1. one" in lines and "    Decode batch, #running-req: 4, <b>not bold</b>" in lines
    assert "A heading with code" in lines
    for line in lines:
        assert len(line) <= 60 or " " not in line.strip() or line.startswith("    "), line
    # flags and URLs are never broken at a hyphen or inside
    t = docmd.to_text("raise --mem-fraction-static and --cuda-graph-max-bs-decode, see https://docs.sglang.ai/advanced_features/hyperparameter_tuning.html", width=30)
    assert "--mem-fraction-static" in t and "--cuda-graph-max-bs-decode," in t
    assert "https://docs.sglang.ai/advanced_features/hyperparameter_tuning.html" in t


@pytest.mark.parametrize(("src", "text"), [
    ("`x`", "x"), ("``a `b` c``", "a `b` c"), ("[t](https://a.b/c)", "t (https://a.b/c)"),
    ("[https://a.b](https://a.b)", "https://a.b"), ("**b**", "b"), ("[t](javascript:x)", "t"),
])
def test_inline_text(src: str, text: str) -> None:
    assert docmd.inline_text(src) == text


def test_links_anchors_and_rewrite() -> None:
    assert docmd.links(SAMPLE) == ["docs/sglang.md#decode-line", "https://github.com/sgl-project/sglang/issues/2746"]
    assert docmd.anchors(SAMPLE) == ["stable"]
    out = docmd.rewrite_links("see [the\nline](docs/sglang.md#decode-line) and [x](https://e.com)",
                              lambda t: t.removeprefix("docs/") if t.startswith("docs/") else None)
    assert out == "see [the\nline](sglang.md#decode-line) and [x](https://e.com)"
