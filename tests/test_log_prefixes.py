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

import re
from pathlib import Path

import pytest

from diagnoser.engines.sglang.prefixshapes import SGLANG_PREFIX as _SG
from diagnoser.engines.sglang.prefixshapes import SHAPES
from diagnoser.engines.sglang.prefixshapes import Wrapper as _Wrapper
from tests.helpers import READ_PATHS, read_log_bytes

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "data" / "sglang-cpu-real" / "kv-full-retract" / "server.log"


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
