"""The log lines that say something went wrong: tracebacks and crash notices, requests longer than the
server accepts, and prefill/decode-disaggregation (PD) failures and transfer rates.

:class:`~diagnoser.engines.sglang.logs.SGLangLogParser` hands a message here (its prefix already read)
when the message has one of :data:`TRIGGERS`; :func:`read` writes events and returns whether the line
was recognised. Each event is what the line says, no judgement (the rules judge):

* ``exception``: ``TypeError: …``, ``torch.OutOfMemoryError: CUDA out of memory …`` (``type``, ``message``)
* ``crash_notice``: ``Scheduler hit an exception: …`` and the other processes' notices (``process``)
* ``traceback`` / ``frame``: ``Traceback (most recent call last):`` and ``File "…", line N, in func``
* ``fatal``: SIGQUIT from a child, a child that exited, segfaults, NCCL watchdog timeouts, CUDA errors
* ``oom`` with ``device_memory``: an out-of-memory exception of the device (CUDA/HIP/NPU), not the KV
  allocator's own message (that one is read by the main parser)
* ``oom_detail``: the KV allocator's state printed under its out-of-memory message
* ``request_too_long``: ``Input length (N tokens) exceeds the maximum allowed length (M tokens)`` and the
  context-length forms
* ``pd_failure``: ``Prefill bootstrap failed for request …`` / ``Decode transfer failed …`` (one per request,
  whatever the number of ranks that print it)
* ``kv_transfer_rate``: Mooncake's ``Transfer Engine Throughput: X MB/s`` (glog prefix)

Formats: SGLang's ``python/sglang/srt/managers/scheduler.py`` (``Scheduler hit an exception``, the input
length check), ``python/sglang/srt/mem_cache/allocator.py`` and ``common.py`` (the out-of-memory message
and the allocator state), ``python/sglang/srt/disaggregation/prefill.py`` / ``decode.py`` (bootstrap and
transfer failures) at v0.5.23, and Mooncake's ``transfer_engine.cpp`` metrics line.
"""

from __future__ import annotations

import re
from typing import Any

from diagnoser.model import LogEvent

# substrings that route a line here (the parser's TRIGGERS include them)
TRIGGERS: tuple[str, ...] = (
    "Error", "Exception", "hit an exception", '", line ', "sigquit", "SIGQUIT", "unexpectedly failed",
    "Segmentation fault", "Watchdog caught", "watchdog timeout", "NCCL", "Try to allocate", "able tokens:", "_size()=",
    "exceeds the maximum allowed length", "longer than the model's context length", "maximum context length",
    "failed for request", "Transfer Engine Throughput",
)

_EXC_RE = re.compile(r"^((?:[A-Za-z_]\w*\.){0,6}[A-Za-z_]\w*(?:Error|Exception))(?::\s?(.*?))?\s*$")
_FRAME_RE = re.compile(r'^File "([^"]+)", line (\d+), in (\S+)')
_NOTICE_RE = re.compile(r"(\w+) hit an exception")
_ALLOC_RE = re.compile(r"Try to allocate (\d+) tokens")
_AVAIL_RE = re.compile(r"(?:Avaliable|Available) tokens: (\d+)|available_size\(\)\s*=\s*(\d+)")
_EVICT_RE = re.compile(r"evictable_size\(\)\s*=\s*(\d+)")
_TOO_LONG_RES = (
    (re.compile(r"Input length \((\d+) tokens?\) exceeds the maximum allowed length \((\d+) tokens?\)"), "pool_or_context", False),
    (re.compile(r"The input \((\d+) tokens?\) is longer than the model's context length \((\d+) tokens?\)"), "context", False),
    (re.compile(r"maximum context length of (\d+) tokens\. You requested a total of (\d+) tokens"), "context", True),
)
_PD_FAIL_RE = re.compile(r"(Prefill|Decode) (bootstrap|transfer) failed for request(?: rank=(\d+))?(?: req\.rid='([^']*)')?.*?"
                         r"(?:with exception (\w+)(?:\([^)]*\))?: ?(.*))?$")
_RATE_RE = re.compile(r"Transfer Engine Throughput: ([\d.]+) (KB|MB|GB)/s")
_GLOG_RE = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{1,6})\s+\d+\s+[\w.+-]+:\d+\]\s?")
_DEVICE_OOM = ("CUDA out of memory", "HIP out of memory", "NPU out of memory", "out of memory", "OutOfMemoryError")
_FATAL = (
    ("Received sigquit", "SIGQUIT from a child process (a scheduler or worker died)"),
    ("SIGQUIT", "SIGQUIT (a scheduler or worker died)"),
    ("unexpectedly failed", "a child process exited"),
    ("Segmentation fault", "segmentation fault"),
    ("Fatal Python error", "fatal Python error"),
    ("Watchdog caught collective operation timeout", "NCCL collective timed out (watchdog)"),
    ("watchdog timeout", "the scheduler watchdog fired (a forward step hung)"),
)
_UNIT = {"KB": 1e-3, "MB": 1.0, "GB": 1e3}


def is_side_line(msg: str) -> bool:
    """A line of a traceback or of the allocator's state: it belongs to the timed line before it (it has
    no time of its own), so it does not advance the clock of untimed lines."""
    return bool(msg.startswith('File "') or "hit an exception" in msg or "Traceback (most recent" in msg
                or "Try to allocate" in msg or "able tokens:" in msg or "_size()=" in msg or _EXC_RE.match(msg)
                or any(needle in msg for needle, _ in _FATAL))


def glog_prefix(line: str) -> tuple[tuple[int, int, int, int, int, float], str] | None:
    """``I0518 08:57:10.155643 104603 transfer_engine.cpp:364] msg`` → ((month, day, h, m, s, frac), msg)."""
    m = _GLOG_RE.match(line)
    if not m:
        return None
    mo, d, hh, mm, ss, frac = m.groups()
    return (int(mo), int(d), int(hh), int(mm), int(ss), float("0." + frac)), line[m.end():]


def read(parser: Any, msg: str, ts: float, rank: str, src: str, line_no: int) -> bool:
    """Read one message; True when it is one of this module's lines."""
    emit = parser.emit_event
    found = False
    m = _EXC_RE.match(msg)
    if m:
        etype, message = m.group(1), (m.group(2) or "")
        fields: dict[str, Any] = {"type": etype, "message": message[:300]}
        emit(LogEvent("exception", ts, line_no, src, fields, rank))
        parser.kinds["exception"] += 1
        found = True
        low = message.lower()
        if ("OutOfMemoryError" in etype or any(s.lower() in low for s in _DEVICE_OOM)) and "try to lower your batch size" not in low:
            emit(LogEvent("oom", ts, line_no, src, {"phase": "unknown", "device_memory": True, "text": f"{etype}: {message}"[:200]}, rank))
            parser.kinds["oom"] += 1
        if "NCCL" in message or "NCCL" in etype or "CUDA error" in message:
            emit(LogEvent("fatal", ts, line_no, src, {"what": "NCCL error" if "NCCL" in message or "NCCL" in etype else "CUDA error",
                                                      "text": f"{etype}: {message}"[:200]}, rank))
    if '", line ' in msg:
        fm = _FRAME_RE.match(msg)
        if fm:
            path = fm.group(1).replace("\\", "/")
            emit(LogEvent("frame", ts, line_no, src, {"file": "/".join(path.split("/")[-3:]), "func": fm.group(3)}, rank))
            parser.kinds["traceback"] += 1
            return True
    if "hit an exception" in msg:
        nm = _NOTICE_RE.search(msg)
        if nm:
            emit(LogEvent("crash_notice", ts, line_no, src, {"process": nm.group(1), "text": msg[:200]}, rank))
            parser.kinds["exception"] += 1
            found = True
    if msg.startswith("Traceback (most recent call last)") or "Traceback (most recent call last)" in msg[:120]:
        emit(LogEvent("traceback", ts, line_no, src, {}, rank))
        if not found:
            parser.kinds["exception"] += 1
        found = True
    for needle, what in _FATAL:
        if needle in msg:
            emit(LogEvent("fatal", ts, line_no, src, {"what": what, "text": msg[:200]}, rank))
            parser.kinds["fatal"] += 1
            found = True
            break
    if not found and "NCCL" in msg and ("error" in msg.lower() or "WARN" in msg):
        emit(LogEvent("fatal", ts, line_no, src, {"what": "NCCL error", "text": msg[:200]}, rank))
        parser.kinds["fatal"] += 1
        found = True
    if "Try to allocate" in msg or "able tokens:" in msg or "_size()=" in msg:
        fields = {}
        if (am := _ALLOC_RE.search(msg)):
            fields["requested"] = int(am.group(1))
        if (vm := _AVAIL_RE.search(msg)):
            fields["available"] = int(vm.group(1) or vm.group(2))
        if (em := _EVICT_RE.search(msg)):
            fields["evictable"] = int(em.group(1))
        if fields:
            emit(LogEvent("oom_detail", ts, line_no, src, fields, rank))
            parser.kinds["oom"] += 1
            found = True
    if "length" in msg:
        for pat, limit, reversed_ in _TOO_LONG_RES:
            tm = pat.search(msg)
            if tm:
                a, b = int(tm.group(1)), int(tm.group(2))
                req, allowed = (b, a) if reversed_ else (a, b)
                emit(LogEvent("request_too_long", ts, line_no, src, {"input_tokens": req, "allowed_tokens": allowed, "limit": limit,
                                                                       "auto_truncate_hint": "allow-auto-truncate" in msg}, rank))
                parser.kinds["request_too_long"] += 1
                found = True
                break
    if "failed for request" in msg:
        pm = _PD_FAIL_RE.search(msg)
        if pm:
            side, stage, prank, rid, exc, reason = pm.groups()
            emit(LogEvent("pd_failure", ts, line_no, src, {"side": side.lower(), "stage": stage, "rid": rid or "", "rank": prank,
                                                            "error": exc or "", "reason": (reason or "").strip()[:200]}, rank))
            parser.kinds["pd"] += 1
            found = True
    if "Transfer Engine Throughput" in msg:
        rm = _RATE_RE.search(msg)
        if rm:
            emit(LogEvent("kv_transfer_rate", ts, line_no, src, {"mb_s": float(rm.group(1)) * _UNIT[rm.group(2)]}, rank))
            parser.kinds["pd"] += 1
            found = True
    return found
