"""Which engine wrote an input: a ``/metrics`` exposition, a log's first lines, an endpoint's answer.

Each test returns ``(engine, reason)`` or ``None`` when the input does not say. The reasons are shown
as the source of the ``engine`` config fact, so a reader can check the call.
"""

from __future__ import annotations

import re
from typing import Any

# a vLLM log line's own head (vllm/logger.py): LEVEL MM-DD HH:MM:SS [file.py:N] — SGLang stamps carry the year
_VLLM_HEAD = re.compile(r"(?:^|[\s)|])(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w.-]+\.py:\d+\]")
_VLLM_NEEDLES = (
    "Avg prompt throughput:", "non-default args:", "LLM engine (v", "vLLM API server version", "(APIServer pid=",
    "(EngineCore", "(VllmWorker", "is preempted by PreemptionMode", "# GPU blocks:", "site-packages/vllm/", "vllm.entrypoints",
)
_SGLANG_NEEDLES = (
    "Decode batch", "Prefill batch", "server_args=ServerArgs", "max_total_num_tokens=", "KV cache pool is full",
    "sglang.launch_server", "site-packages/sglang/", "new fill batch",
)
HEAD_BYTES = 256 * 1024  # how much of a log's start is looked at


def log_engine(head: bytes | str) -> tuple[str, str] | None:
    """The engine of a log from its first lines: the first line that only one engine prints decides."""
    text = head.decode("utf-8", errors="replace") if isinstance(head, bytes) else head
    for n, line in enumerate(text.splitlines()[:5000], 1):
        if any(s in line for s in _SGLANG_NEEDLES):
            return "sglang", f"log line {n} is SGLang's ({line.strip()[:60]!r})"
        if any(s in line for s in _VLLM_NEEDLES) or _VLLM_HEAD.search(line):
            return "vllm", f"log line {n} is vLLM's ({line.strip()[:60]!r})"
    return None


def exposition_engine(text: str) -> tuple[str, str] | None:
    """``sglang:``/``sglang_`` series → SGLang; ``vllm:``/``vllm_`` series (and no SGLang one) → vLLM."""
    if text.startswith("sglang") or "\nsglang:" in text or "\nsglang_" in text:
        return "sglang", "the exposition's sglang: series"
    if text.startswith("vllm") or "\nvllm:" in text or "\nvllm_" in text:
        return "vllm", "the exposition's vllm: series"
    return None


def families_engine(families: list[Any]) -> tuple[str, str] | None:
    names = [getattr(f, "name", "") for f in families]
    if any(n.startswith(("sglang:", "sglang_")) for n in names):
        return "sglang", "the exposition's sglang: series"
    if any(n.startswith(("vllm:", "vllm_")) for n in names):
        return "vllm", "the exposition's vllm: series"
    return None
