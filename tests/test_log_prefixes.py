"""Issue 24, item 2: the reader finds SGLang's message wherever the line puts it.

The real SGLang 0.5.23 CPU run's log (tests/data/sglang-cpu-real/kv-full-retract/server.log) is re-wrapped,
line by line, the way real deployments wrap it: a fork's rank tags and source file inside one bracket, a
custom formatter bracketing time, file and level, Python logging's default formats, journald, docker
compose, Ray, Kubernetes (CRI), JSON envelopes from log shippers (flat and nested, with SGLang's prefix
kept or the time in another field), tab-separated exports, ANSI colours and CRLF. No log content is
invented: every message is one of the real log's, only what is put around it changes. Each shape must
give the same lines recognised (within 5 %) and the same top finding as the plain log, through every
reading path (the line parser, the bulk reader with and without the C scanner).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import READ_PATHS, read_log_bytes

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "data" / "sglang-cpu-real" / "kv-full-retract" / "server.log"

# SGLang's own prefix: "[2026-11-29 09:32:06] " as this real log prints it (no rank tag on one CPU rank), with
# milliseconds and rank tags in other logs ("[2025-11-03 14:31:10.123 DP6 TP6 EP6] ")
_SG = re.compile(r"^\[(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)(?:[.,]\d{1,6})?((?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d+)*)\] ?(.*)$", re.DOTALL)
_MON = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class _Wrapper:
    """Wraps each real line: ``fn(original, date, time, message, stamped, rank tags)``; unstamped lines (tracebacks,
    warnings printed straight to stderr) keep the last stamp seen for shapes whose collector adds its own."""

    def __init__(self, fn: Callable[[str, str, str, str, bool, str], str]) -> None:
        self.fn = fn

    def __call__(self, data: bytes) -> bytes:
        out = []
        date, time = "2026-11-29", "09:32:00"
        for raw in data.decode().split("\n"):
            if not raw:
                out.append(raw)
                continue
            m = _SG.match(raw)
            tags = ""
            if m:
                date, time, tags, msg = m.group(1), m.group(2), m.group(3), m.group(4)
            else:
                msg = raw
            out.append(self.fn(raw, date, time, msg, m is not None, tags))
        return "\n".join(out).encode()


def _syslog(date: str, time: str) -> str:
    return f"{_MON[int(date[5:7]) - 1]} {date[8:10]} {time}"


SHAPES: dict[str, Callable[[bytes], bytes]] = {
    "plain": lambda data: data,
    # a fork that logs its own rank tags and the source file inside one bracket
    "fork_rank_file": _Wrapper(lambda raw, d, t, msg, s, tags: f"[{d} {t}{tags or ' TP0'} scheduler.py:2412] {msg}" if s else raw),
    # a custom formatter that brackets time, file and level
    "custom_brackets": _Wrapper(lambda raw, d, t, msg, s, tags: f"[{d} {t},417] [scheduler.py:2412] [INFO] {msg}" if s else raw),
    # Python logging's BASIC_FORMAT (no time at all) and a "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
    "python_basic": _Wrapper(lambda raw, d, t, msg, s, tags: f"INFO:sglang.srt.managers.scheduler:{msg}" if s else raw),
    "python_asctime": _Wrapper(lambda raw, d, t, msg, s, tags: f"{d} {t},417 - sglang.srt.managers.scheduler - INFO - {msg}" if s else raw),
    # journald (journalctl -u): its own head before the program's whole line
    "journald": _Wrapper(lambda raw, d, t, msg, s, tags: f"{_syslog(d, t)} gpu-node-1 python3[4242]: {raw}"),
    # docker compose, Ray's actor prefix, Kubernetes' CRI log format (RFC3339 nano, stream, P/F)
    "docker_compose": _Wrapper(lambda raw, d, t, msg, s, tags: f"sglang-1  | {raw}"),
    "ray": _Wrapper(lambda raw, d, t, msg, s, tags: f"(Scheduler pid=4242) {raw}"),
    "k8s_cri": _Wrapper(lambda raw, d, t, msg, s, tags: f"{d}T{t}.123456789Z stderr F {raw}"),
    # log shippers' JSON: docker's json-file (SGLang's prefix kept in "log"), and a nested envelope whose
    # message has no prefix (the time in another field), as Vector/Fluent Bit forward it
    "json_docker": _Wrapper(lambda raw, d, t, msg, s, tags: json.dumps({"log": raw + "\n", "stream": "stderr", "time": f"{d}T{t}.123456789Z"})),
    "json_nested": _Wrapper(lambda raw, d, t, msg, s, tags: json.dumps(
        {"@timestamp": f"{d}T{t}.417Z", "kubernetes": {"pod_name": "sglang-0", "container_name": "sglang"},
         "log": {"level": "INFO", "message": msg}})),
    # journald's own JSON (journalctl -o json): MESSAGE and __REALTIME_TIMESTAMP (microseconds)
    "json_journald": _Wrapper(lambda raw, d, t, msg, s, tags: json.dumps(
        {"__REALTIME_TIMESTAMP": str(_epoch(d, t) * 1_000_000), "_HOSTNAME": "gpu-node-1", "MESSAGE": raw})),
    # a tab-separated export from a log store (time, host, line)
    "tsv_export": _Wrapper(lambda raw, d, t, msg, s, tags: f"{d}T{t}.417Z\tgpu-node-1\t{raw}"),
    "tsv_message_only": _Wrapper(lambda raw, d, t, msg, s, tags: f"{d} {t}.417\tINFO\t{msg}"),
    # ANSI colours around the prefix and the level (colorlog), and CRLF line ends
    "ansi": _Wrapper(lambda raw, d, t, msg, s, tags: f"\x1b[32m[{d} {t}]\x1b[0m \x1b[1;34mINFO\x1b[0m {msg}" if s else f"\x1b[31m{raw}\x1b[0m"),
    "crlf": _Wrapper(lambda raw, d, t, msg, s, tags: raw + "\r"),
}


def _epoch(d: str, t: str) -> int:
    import calendar

    return calendar.timegm((int(d[:4]), int(d[5:7]), int(d[8:10]), int(t[:2]), int(t[3:5]), int(t[6:8]), 0, 0, 0))


def _run(data: bytes, how: str, tmp_path: Path) -> tuple[int, int, tuple[str | None, str | None, object]]:
    """(lines read, lines recognised, (top rule, its flag, proposed value)) through one reading path."""
    from diagnoser.engines.sglang import ADAPTER
    from diagnoser.evaluate import evaluate, top_cause

    path = tmp_path / "server.log"
    path.write_bytes(data)
    reader, tl = read_log_bytes(data, str(path), how)
    report = evaluate([tl], ADAPTER)
    f, s = top_cause(report.findings, tl.target)
    return reader.report.lines_read, reader.report.lines_recognized, (
        f.rule if f else None, s.flag if s else None, s.proposed if s else None)


@pytest.fixture(scope="module")
def plain() -> dict[str, tuple[int, int, tuple[str | None, str | None, object]]]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return {how: _run(REAL.read_bytes(), how, Path(d)) for how in READ_PATHS}


@pytest.mark.parametrize("how", READ_PATHS)
@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "plain"])
def test_every_prefix_shape_reads_like_the_plain_log(shape: str, how: str, plain: dict, tmp_path: Path) -> None:
    data = SHAPES[shape](REAL.read_bytes())
    read, recognised, top = _run(data, how, tmp_path)
    p_read, p_recognised, p_top = plain[how]
    assert read == p_read
    assert abs(recognised - p_recognised) <= 0.05 * p_recognised, (shape, how, recognised, p_recognised)
    assert top == p_top, (shape, how, top, p_top)
    assert p_top[0] == "kv_saturation"


@pytest.mark.parametrize("how", READ_PATHS)
def test_a_forks_dp_tags_beside_its_source_file_read_as_sglangs_own(how: str, tmp_path: Path) -> None:
    """DP0 TP0 in a fork's bracket with the file: the same as SGLang's own "[... DP0 TP0] " prefix (a DP
    rank makes the series per rank, so the plain log without tags is not the reference here)."""
    real = REAL.read_bytes()
    own = _Wrapper(lambda raw, d, t, msg, s, tags: f"[{d} {t} DP0 TP0] {msg}" if s else raw)(real)
    fork = _Wrapper(lambda raw, d, t, msg, s, tags: f"[{d} {t} DP0 TP0 scheduler.py:2412] {msg}" if s else raw)(real)
    assert _run(fork, how, tmp_path) == _run(own, how, tmp_path)


def test_fragments_pasted_without_their_head_are_read_for_their_fields() -> None:
    """Every real batch line of the log, cut after its head and after each of its first fields (as a
    field list is pasted from the middle of a line): the fields left give the same points as they do in
    the whole line, and a cut that leaves fewer than two known numbers is not read."""
    from diagnoser.engines.sglang.logformats import _DECODE_FIELDS, _PREFILL_FIELDS
    from diagnoser.engines.sglang.logs import SGLangLogParser
    from diagnoser.timeline import Timeline

    def points(line: str) -> tuple[bool, dict[str, list[float]]]:
        tl = Timeline(target="t")
        ok = SGLangLogParser(tl).feed(line, 1)
        return ok, {name: s.values.tolist() for (name, _), s in tl.series.items()}

    checked = 0
    for raw in REAL.read_text().splitlines():
        m = _SG.match(raw)
        if not m or not re.match(r"(?:Decode|Prefill) batch, ", m.group(4)):
            continue
        _, whole = points(raw)
        parts = m.group(4).split(", ")[1:]  # the fields, without the head
        for cut in range(len(parts)):
            left = parts[cut:]
            ok, got = points(", ".join(left))
            keys = [p.split(": ")[0] for p in left]
            table = _PREFILL_FIELDS if set(keys) & (set(_PREFILL_FIELDS) - set(_DECODE_FIELDS)) else _DECODE_FIELDS
            known = [k for k in keys if table.get(k)]
            if len(known) < 2:
                assert not ok, left
                continue
            assert ok, left
            for name, vals in got.items():
                assert vals == whole[name], (left, name)
            checked += 1
    assert checked > 500


def _data_logs() -> list[Path]:
    data = ROOT / "tests" / "data"
    return (sorted((data / "sglang" / "logs").glob("*")) + sorted(data.glob("cases/*/server.log"))
            + sorted(data.glob("sglang-cpu-real/*/server.log")))


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "plain"])
def test_every_real_log_in_every_shape_gives_the_same_kinds_of_lines(shape: str) -> None:
    """All real logs of tests/data (issue threads, docs, start-ups of TP8 and k8s runs, the cases, the CPU
    runs), re-wrapped: the line parser recognises the same lines, as the same kinds. One difference is
    the shape's own: Python's BASIC_FORMAT has neither time nor rank, so the same retraction printed by
    several TP ranks can no longer be told from several retractions."""
    from diagnoser.engines.sglang.logs import SGLangLogParser
    from diagnoser.timeline import Timeline

    def read(data: bytes) -> tuple[int, dict[str, int]]:
        p = SGLangLogParser(Timeline(target="t"))
        n = 0
        for i, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
            try:
                n += bool(p.feed(line, i))
            except Exception:  # an impossible stamp, as the reader counts it
                pass
        return n, dict(p.kinds)

    logs = _data_logs()
    assert len(logs) >= 25
    for path in logs:
        raw = path.read_bytes()
        n0, kinds0 = read(raw)
        n, kinds = read(SHAPES[shape](raw))
        if shape == "python_basic" and kinds0.get("retract_dup"):
            kinds0["retraction"] += kinds0.pop("retract_dup")
        assert (n, kinds) == (n0, kinds0), path.relative_to(ROOT)
