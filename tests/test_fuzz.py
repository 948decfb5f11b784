"""Fuzzing the readers with REAL data mutated: 100,000 log lines (every real SGLang log line in
tests/data, mutated byte- and field-wise) and 2,000 expositions (real scrapes, mutated line- and
value-wise), through every parser path and then the whole rule pass (evaluate, advice, the report, its
text and its strict JSON). Zero unhandled exceptions and zero rule errors; the three log reading paths
(line parser, bulk C scanner, bulk regex path) agree exactly on every mutated line.

Seeded: ``DIAGNOSER_FUZZ_SEED`` (default 17) fixes every mutation, and a failing case is written to
test-artifacts/fuzz-*.log|.prom with its seed and index, so it replays. ``DIAGNOSER_FUZZ_SCALE``
multiplies the case counts (e.g. 10 for a longer hunt).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from diagnoser.collect import finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.evaluate import evaluate
from diagnoser.jsonout import dumps
from diagnoser.outputs.text import render
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline
from tests.conftest import ARTIFACTS, DATA
from tests.helpers import READ_PATHS, read_log_bytes

SEED = int(os.environ.get("DIAGNOSER_FUZZ_SEED", "17"))
SCALE = max(1, int(os.environ.get("DIAGNOSER_FUZZ_SCALE", "1")))
LOG_LINES = 100_000 * SCALE
EXPOSITIONS = 2_000 * SCALE
LOG_CHUNK = 5_000  # lines per fuzzed log (each a reader, a timeline and a rule pass)
SCRAPE_RUN = 10  # expositions per scrape sequence (counters and histograms need two to give a rate)

_NUM = re.compile(rb"\d+(?:\.\d+)?")
_STAMP = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_VALUE = re.compile(r"^([^#\s][^ ]*(?:\{[^}\n]*\})?) (\S+)", re.MULTILINE)
WEIRD_NUMBERS = [b"0", b"-1", b"-0.5", b"nan", b"NaN", b"inf", b"-inf", b"1e400", b"9" * 400, b"0x1f", b"1_000", b"", b"1.2.3",
                 b"00000000000000000000000000000000001", b"3.4e38", b"-9223372036854775809", b"\xd9\xa3", b"1e-400"]
WEIRD_STAMPS = [b"0000-00-00 00:00:00", b"9999-12-31 23:59:59", b"2026-02-30 10:00:00", b"2026-13-01 25:61:61", b"1969-12-31 23:59:59",
                b"2026-11-29 99:99:99", b"2026-11-29T09:31:57", b"10000-01-01 00:00:00"]
JUNK = [b"\x00", b"\xff\xfe", b"\xe2\x80\xae", b"\r", b"\t", b"]", b"[", b",", b": ", b"%", b"{", b"}", b'"', b"\\", b"\x1b[31m", "模型".encode()]


def real_log_lines() -> list[bytes]:
    out: list[bytes] = []
    for p in sorted(DATA.rglob("*")):
        if p.is_file() and (p.suffix in (".log", ".txt") or p.name == "server.log"):
            out += [ln for ln in p.read_bytes().splitlines() if ln.strip()]
    return out


def mutate_line(rnd: random.Random, line: bytes, corpus: list[bytes]) -> bytes:
    for _ in range(rnd.choice((1, 1, 1, 2, 3))):
        op = rnd.randrange(12)
        if op == 0 and line:  # flip, insert or delete bytes
            i = rnd.randrange(len(line))
            line = line[:i] + bytes([rnd.randrange(256)]) + line[i + 1:]
        elif op == 1:
            i = rnd.randrange(len(line) + 1)
            line = line[:i] + rnd.choice(JUNK) + line[i:]
        elif op == 2 and line:
            i = rnd.randrange(len(line))
            line = line[:i] + line[i + rnd.randrange(1, 20):]
        elif op == 3:  # a number becomes something else
            nums = list(_NUM.finditer(line))
            if nums:
                m = rnd.choice(nums)
                line = line[:m.start()] + rnd.choice(WEIRD_NUMBERS) + line[m.end():]
        elif op == 4:  # the stamp becomes one no calendar has
            line = _STAMP.sub(lambda m: rnd.choice(WEIRD_STAMPS), line, count=1)
        elif op == 5 and line:  # cut short, as a pasted or rotated line is
            line = line[: rnd.randrange(len(line))]
        elif op == 6:  # two lines spliced
            other = rnd.choice(corpus)
            line = line[: rnd.randrange(len(line) + 1)] + other[rnd.randrange(len(other) + 1):]
        elif op == 7:  # a field repeated or dropped
            parts = line.split(b", ")
            if len(parts) > 2:
                i = rnd.randrange(len(parts))
                parts = parts[:i] + [parts[i]] * rnd.choice((0, 2, 3)) + parts[i + 1:]
                line = b", ".join(parts)
        elif op == 8:  # separators changed
            line = line.replace(rnd.choice((b", ", b": ", b"] ", b" ")), rnd.choice((b",", b":", b"]", b"  ", b"")), 1)
        elif op == 9:  # a very long line (the reader's junk limit is 64 KiB)
            if rnd.random() < 0.02:
                line = line + b"x" * rnd.choice((1000, 70_000))
        elif op == 10:  # rank tags, prefixes
            line = line.replace(b"]", rnd.choice((b" DP3 TP1]", b" PP9999999999]", b" TP0 TP0 TP0]", b" XX1]")), 1)
        else:  # case and encoding
            line = line.upper() if rnd.random() < 0.5 else line.decode("utf-8", "replace").encode("utf-16-le")[: len(line)]
    return line.replace(b"\n", b" ")


def _read(data: bytes, mode: str) -> tuple[Any, Timeline]:
    return read_log_bytes(data, "fuzz.log", mode, target="fuzz")


def _summary(r: Any, tl: Timeline) -> tuple[Any, ...]:
    series = {k: (s.ts.tolist(), [("nan" if v != v else v) for v in s.values.tolist()]) for k, s in sorted(tl.series.items())}
    events = [(e.kind, e.ts, e.line_no, e.rank) for e in tl.events]
    config = {k: repr(v.value) for k, v in sorted(tl.config.items())}
    rep = r.report
    return (rep.lines_read, rep.lines_recognized, rep.errors, series, events, config, tl.version)


def rule_pass(tls: list[Timeline], inputs: list[Any]) -> None:
    """Everything an output needs from these timelines; raises on any error a rule records."""
    from types import SimpleNamespace

    from diagnoser.advice import enrich
    from diagnoser.collect import Collection
    from diagnoser.outputs.report import build

    report = evaluate(tls, ADAPTER, {}, None, {})
    assert report.errors == [], [e.to_dict() for e in report.errors]
    enrich(report, tls, {})
    col = Collection(timelines=tls, inputs=inputs)
    doc = build(col, SimpleNamespace(findings=report.findings, errors=report.errors))
    render(doc, verbose=True)
    dumps(doc)


def _keep(name: str, data: bytes, note: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    p = ARTIFACTS / name
    p.write_bytes(data)
    return Path(f"{p} ({note}; DIAGNOSER_FUZZ_SEED={SEED})")


@pytest.mark.parametrize("part", range(LOG_LINES // LOG_CHUNK))
def test_mutated_real_log_lines(part: int) -> None:
    corpus = real_log_lines()
    assert len(corpus) > 3_000
    rnd = random.Random(f"{SEED}-log-{part}")
    lines = [mutate_line(rnd, rnd.choice(corpus), corpus) for _ in range(LOG_CHUNK)]
    data = b"\n".join(lines) + b"\n"
    try:
        got = {mode: _read(data, mode) for mode in READ_PATHS}
        sums = {mode: _summary(*rt) for mode, rt in got.items()}
        assert sums["line"] == sums["scan"] == sums["regex"], "the three reading paths disagree"
        r, tl = got["line"]
        finalize(tl, r.parser.version)
        rule_pass([tl], [r.report])
    except BaseException as e:
        where = _keep(f"fuzz-log-{SEED}-{part}.log", data, f"part {part}")
        raise AssertionError(f"{type(e).__name__}: {e}; the fuzzed log is {where}") from e


def real_expositions() -> list[list[str]]:
    runs = []
    for d in sorted((DATA / "sglang-cpu-real").iterdir()):
        files = sorted((d / "metrics").glob("*.prom"))
        if files:
            runs.append([p.read_text(errors="replace") for p in files])
    single = [p.read_text(errors="replace") for p in sorted((DATA / "sglang" / "metrics").glob("*.prom"))]
    return runs + [single]


def mutate_exposition(rnd: random.Random, text: str) -> str:
    lines = text.split("\n")
    for _ in range(rnd.choice((1, 2, 4, 8, 16))):
        op = rnd.randrange(11)
        i = rnd.randrange(len(lines))
        ln = lines[i]
        if op == 0:  # a value becomes something no server sends
            lines[i] = _VALUE.sub(lambda m: f"{m.group(1)} {rnd.choice(WEIRD_NUMBERS).decode('latin-1')}", ln, count=1)
        elif op == 1:  # a bucket bound that is not a number
            lines[i] = re.sub(r'le="[^"]*"', lambda m: rnd.choice(('le="abc"', 'le=""', 'le="NaN"', 'le="-Inf"', 'le="1e400"', "le=1")), ln, count=1)
        elif op == 2:  # a label broken
            lines[i] = ln.replace('"', rnd.choice(("", '\\"', '""', '"\n"')), 1)
        elif op == 3:
            lines[i] = ln.replace("{", rnd.choice(("", "{{", "{x=", "{le=\"0.1\",")), 1)
        elif op == 4:  # dropped or repeated lines
            del lines[i]
            if not lines:
                lines = [""]
        elif op == 5:
            lines.insert(i, ln)
        elif op == 6:  # the other spelling, or another family's name
            lines[i] = ln.replace("sglang:", rnd.choice(("sglang_", "sglang::", "SGLANG:", "vllm:", "")), 1)
        elif op == 7:  # junk bytes (decoded as the reader decodes them)
            j = rnd.randrange(len(ln) + 1)
            lines[i] = ln[:j] + rnd.choice(JUNK).decode("utf-8", "replace") + ln[j:]
        elif op == 8:  # HELP/TYPE lines of the wrong kind
            lines.insert(i, rnd.choice(("# TYPE sglang:num_running_reqs histogram", "# TYPE sglang:token_usage counter", "# HELP", "#",
                                        "# TYPE x", "# EOF")))
        elif op == 9:  # cut off mid-line (a size cap, a dropped connection)
            lines = lines[:i] + [ln[: rnd.randrange(len(ln) + 1)]]
        else:  # a long label value, a huge label set
            lines[i] = ln.replace('model_name="', 'model_name="' + "m" * rnd.choice((10, 5000)), 1)
    return "\n".join(lines) + rnd.choice(("", "\n", "\r\n"))


@pytest.mark.parametrize("part", range(EXPOSITIONS // (SCRAPE_RUN * 20)))
def test_mutated_real_expositions(part: int) -> None:
    runs = real_expositions()
    rnd = random.Random(f"{SEED}-prom-{part}")
    for seq in range(20):
        run = rnd.choice(runs)
        start = rnd.randrange(max(1, len(run) - SCRAPE_RUN))
        fast = rnd.random() < 0.7
        mt = MetricsTarget("http://127.0.0.1:1", ADAPTER)
        tl = Timeline(target=mt.report.source)
        texts = []
        try:
            for k in range(SCRAPE_RUN):
                text = mutate_exposition(rnd, run[(start + k) % len(run)])
                texts.append(text)
                mt.ingest_text(text, 1_795_944_700.0 + 2.0 * k + rnd.random(), tl, fast=fast)
            finalize(tl, mt.state.version)
            rule_pass([tl], [mt.report])
        except BaseException as e:
            where = _keep(f"fuzz-prom-{SEED}-{part}-{seq}.prom", "\n# ---- next scrape ----\n".join(texts).encode(), f"part {part}, sequence {seq}")
            raise AssertionError(f"{type(e).__name__}: {e}; the fuzzed scrapes are {where}") from e
