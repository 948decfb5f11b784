"""The prefix shapes real deployments wrap SGLang's log lines in (docs/sglang.md#log-prefix).

Each shape takes a log as SGLang prints it (``[2026-11-29 09:32:06 TP0] message``) and re-wraps every line
the way one deployment stores it: a fork's rank tags and source file inside one bracket, a custom formatter
bracketing time, file and level, Python logging's default formats, journald, docker compose, Ray,
Kubernetes (CRI), JSON envelopes from log shippers (flat and nested, with SGLang's prefix kept or the time
in another field), tab-separated exports, ANSI colours and CRLF. Only what is put around the message
changes. Used by ``diagnose catalogue coverage --shapes`` and by tests/test_log_prefixes.py.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Callable

# SGLang's own prefix: "[2026-11-29 09:32:06] " (no rank tag on one CPU rank), with milliseconds and rank
# tags in other logs ("[2025-11-03 14:31:10.123 DP6 TP6 EP6] ")
SGLANG_PREFIX = re.compile(
    r"^\[(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)(?:[.,]\d{1,6})?((?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d+)*)\] ?(.*)$", re.DOTALL)
_MON = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

LineFn = Callable[[str, str, str, str, bool, str], str]


class Wrapper:
    """Wraps each line: ``fn(original, date, time, message, stamped, rank tags)``; unstamped lines (tracebacks,
    warnings printed straight to stderr) keep the last stamp seen for shapes whose collector adds its own."""

    def __init__(self, fn: LineFn) -> None:
        self.fn = fn

    def __call__(self, data: bytes) -> bytes:
        out = []
        date, time = "2026-11-29", "09:32:00"
        for raw in data.decode("utf-8", "replace").split("\n"):
            if not raw:
                out.append(raw)
                continue
            m = SGLANG_PREFIX.match(raw)
            tags = ""
            if m:
                date, time, tags, msg = m.group(1), m.group(2), m.group(3), m.group(4)
            else:
                msg = raw
            out.append(self.fn(raw, date, time, msg, m is not None, tags))
        return "\n".join(out).encode()


def _syslog(date: str, time: str) -> str:
    return f"{_MON[int(date[5:7]) - 1]} {date[8:10]} {time}"


def _epoch(d: str, t: str) -> int:
    return calendar.timegm((int(d[:4]), int(d[5:7]), int(d[8:10]), int(t[:2]), int(t[3:5]), int(t[6:8]), 0, 0, 0))


def _plain(data: bytes) -> bytes:
    return data


SHAPES: dict[str, Callable[[bytes], bytes]] = {
    "plain": _plain,
    # a fork that logs its own rank tags and the source file inside one bracket
    "fork_rank_file": Wrapper(lambda raw, d, t, msg, s, tags: f"[{d} {t}{tags or ' TP0'} scheduler.py:2412] {msg}" if s else raw),
    # a custom formatter that brackets time, file and level
    "custom_brackets": Wrapper(lambda raw, d, t, msg, s, tags: f"[{d} {t},417] [scheduler.py:2412] [INFO] {msg}" if s else raw),
    # Python logging's BASIC_FORMAT (no time at all) and a "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
    "python_basic": Wrapper(lambda raw, d, t, msg, s, tags: f"INFO:sglang.srt.managers.scheduler:{msg}" if s else raw),
    "python_asctime": Wrapper(lambda raw, d, t, msg, s, tags: f"{d} {t},417 - sglang.srt.managers.scheduler - INFO - {msg}" if s else raw),
    # journald (journalctl -u): its own head before the program's whole line
    "journald": Wrapper(lambda raw, d, t, msg, s, tags: f"{_syslog(d, t)} gpu-node-1 python3[4242]: {raw}"),
    # docker compose, Ray's actor prefix, Kubernetes' CRI log format (RFC3339 nano, stream, P/F)
    "docker_compose": Wrapper(lambda raw, d, t, msg, s, tags: f"sglang-1  | {raw}"),
    "ray": Wrapper(lambda raw, d, t, msg, s, tags: f"(Scheduler pid=4242) {raw}"),
    "k8s_cri": Wrapper(lambda raw, d, t, msg, s, tags: f"{d}T{t}.123456789Z stderr F {raw}"),
    # log shippers' JSON: docker's json-file (SGLang's prefix kept in "log"), and a nested envelope whose
    # message has no prefix (the time in another field), as Vector/Fluent Bit forward it
    "json_docker": Wrapper(lambda raw, d, t, msg, s, tags: json.dumps({"log": raw + "\n", "stream": "stderr", "time": f"{d}T{t}.123456789Z"})),
    "json_nested": Wrapper(lambda raw, d, t, msg, s, tags: json.dumps(
        {"@timestamp": f"{d}T{t}.417Z", "kubernetes": {"pod_name": "sglang-0", "container_name": "sglang"},
         "log": {"level": "INFO", "message": msg}})),
    # journald's own JSON (journalctl -o json): MESSAGE and __REALTIME_TIMESTAMP (microseconds)
    "json_journald": Wrapper(lambda raw, d, t, msg, s, tags: json.dumps(
        {"__REALTIME_TIMESTAMP": str(_epoch(d, t) * 1_000_000), "_HOSTNAME": "gpu-node-1", "MESSAGE": raw})),
    # a tab-separated export from a log store (time, host, line)
    "tsv_export": Wrapper(lambda raw, d, t, msg, s, tags: f"{d}T{t}.417Z\tgpu-node-1\t{raw}"),
    "tsv_message_only": Wrapper(lambda raw, d, t, msg, s, tags: f"{d} {t}.417\tINFO\t{msg}"),
    # ANSI colours around the prefix and the level (colorlog), and CRLF line ends
    "ansi": Wrapper(lambda raw, d, t, msg, s, tags: f"\x1b[32m[{d} {t}]\x1b[0m \x1b[1;34mINFO\x1b[0m {msg}" if s else f"\x1b[31m{raw}\x1b[0m"),
    "crlf": Wrapper(lambda raw, d, t, msg, s, tags: raw + "\r"),
}


def wrap(shape: str, data: bytes) -> bytes:
    """``data`` (SGLang's own lines) re-wrapped in ``shape``."""
    return SHAPES[shape](data)
