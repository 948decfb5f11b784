"""Near-miss batch lines (issue 26): a ``Decode batch``/``Prefill batch`` head over fields that carry
nothing (``Decode batch, #x: 1, …``) is not a recognised line, on every read path; and the bulk reader,
which decides such lines once per message shape instead of handing each to the reference parser, still
gives exactly the reference parser's result (points, events, clock, version hints, counts).

The bulk path's cost of such lines against plain junk is measured by ``bench/bench_log_nearmiss.py``.
"""

from __future__ import annotations

import io
import random

import pytest

from diagnoser.engines.sglang import ADAPTER, logfast
from diagnoser.engines.sglang.logformats import batch_reads
from diagnoser.sources.logs import finish_report, open_log_reader
from diagnoser.timeline import Timeline
from tests.test_log_bulk import _assert_same, _bulk, _reference

REAL = (b"[2026-11-29 09:32:%02d] Decode batch, #running-req: 5, #token: 1539, token usage: 0.75, cuda graph: True, "
        b"gen throughput (token/s): 1035.84, #queue-req: 35")

# messages the reference parser reads nothing from, and ones it reads something from (False / True)
NEAR = [
    (b"Decode batch, #x: %d, #y: 3, z: 7", False),
    (b"Decode batch, #x %d foo", False),
    (b"Prefill batch. #x: %d, #new-sequence: 4", False),
    (b"Decode batch, #running-req: abc%d, token usage: n/a", False),  # known fields, no number
    (b"Decode batch, largest-len: %d, #swa token: 12", False),  # fields that name no signal
    (b"Decode batch, est. #running-req: %d", False),  # a suffix field
    (b"Prefill batch(mixed #running-req: %d)", False),  # no field after the head
    (b"Decode batch [%d], #x1: 2, #y22: 0.5,", False),  # digits in field names
    (b"Decode batch, #x: %d\\", False),  # ends as a wrapped line: the reference parser's own path
    (b"Decode batch, #x: %d`", False),
    (b"Decode batch, #x: %d <br>", False),
    (b"Decode batch,\t#x: %d", False),  # a tab: not printable ASCII
    (b"Decode batch, #x: %d, " + b"pad " * 2500, False),  # longer than the bulk pattern takes
    (b"Decode batch, #running-req: %d, #x: 1", True),  # one known field: read (not a bulk shape)
    (b"Decode batch, #x: 1, #queue-req: %d", True),
    (b"Decode batch, #running-req: -%d", True),  # impossible: counted as dropped, the line still read
    (b"Decode batch, #running-req: nan, #x: %d", True),
    (b"Prefill batch(mixed #running-req: %d). #x: 1", True),
    (b"Prefill batch, #new-seq: %d, #new-token: 64, #cached-token: 0", True),
    (b"Decode batch, cuda graph: True, #x: %d", True),
]
PREFIXES = [b"[2026-11-29 09:33:%02d] ", b"[2026-11-29 09:33:%02d.250 DP1 TP0] ", b"[2026-11-29 09:33:%02d TP3] ",
            b"sglang-1  | [2026-11-29 09:33:%02d] ", b"[2026-13-29 09:33:%02d] ", b"[09:33:%02d] "]


def _log(seed: int, n: int = 3000, prefixes: list[bytes] = PREFIXES) -> bytes:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        r = rnd.random()
        if r < 0.3:
            out.append(REAL % (i % 60))
        elif r < 0.35:
            out.append(b"[2026-11-29 09:32:%02d] lorem ipsum %d" % (i % 60, i))
        else:
            msg, _ = rnd.choice(NEAR)
            out.append(rnd.choice(prefixes) % (i % 60) + msg % rnd.randint(0, 10**rnd.randint(1, 6)))
    return b"\n".join(out) + b"\n"


def _count(data: bytes) -> tuple[int, int, dict[str, int]]:
    tl = Timeline(target="t")
    rd = open_log_reader(ADAPTER, tl, "server.log")
    rd.feed_stream(io.BytesIO(data), chunk=65536, bulk_min=0, workers=0)
    finish_report(ADAPTER, rd)
    return rd.report.lines_read, rd.report.lines_recognized, dict(rd.parser.kinds)


@pytest.mark.parametrize("scan", [True, False], ids=["scanner", "regex"])
def test_near_miss_lines_are_not_recognised(scan: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 real decode lines and 2,000 ``Decode batch, #x: …`` lines: 200 recognised, on the line path and
    on both bulk paths; the near-miss lines give no decode count, no point and no version hint of a batch line."""
    if not scan:
        monkeypatch.setattr(logfast, "SCAN", None)
    lines = [REAL % (i % 60) for i in range(200)]
    lines += [b"[2026-11-29 09:33:%02d] Decode batch, #x: %d, #y: %d" % (i % 60, i, i % 7) for i in range(2000)]
    data = b"\n".join(lines) + b"\n"
    ref = _reference(data)
    assert ref["report"]["lines_read"] == 2200
    assert ref["report"]["lines_recognized"] == 200
    assert ref["kinds"] == {"decode": 200}
    got, recognised = _bulk(data, 65536)
    assert recognised == 200 and got == ref
    # the near-miss lines alone: nothing recognised, no batch-line hint ("'Decode batch,' header")
    only = b"\n".join(lines[200:]) + b"\n"
    ref = _reference(only)
    assert ref["report"]["lines_recognized"] == 0 and ref["kinds"] == {} and ref["series"] == {}
    assert not any("header" in why for why in ref["version"][3])
    got, recognised = _bulk(only, 65536)
    assert recognised == 0 and got == ref
    # the clock still moved with them (their prefix has a time)
    assert ref["clock"][0] is not None and ref["clock"][1] is True


def test_a_batch_line_with_an_impossible_value_is_still_recognised() -> None:
    """A field that names a signal and holds NaN or a negative number is counted as dropped: the line is
    a batch line with a bad value, not junk; a known field without a number makes it junk."""
    tl = Timeline(target="t")
    rd = open_log_reader(ADAPTER, tl, "server.log")
    rd.feed_lines(io.BytesIO(b"[2026-11-29 09:33:00] Decode batch, #running-req: nan, #x: 1\n"
                             b"[2026-11-29 09:33:01] Decode batch, #running-req: many, #token: some\n"
                             b"#running-req: a, #queue-req: b\n"
                             b"[2026-11-29 09:33:02] new fill batch. #seq: x. #new_token: y.\n"))
    assert rd.report.lines_read == 4 and rd.report.lines_recognized == 1
    assert rd.parser.dropped_values == 1 and dict(rd.parser.kinds) == {"decode": 1}


@pytest.mark.parametrize("scan", [True, False], ids=["scanner", "regex"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bulk_equals_reference_with_near_miss_lines(seed: int, scan: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real decode lines, plain junk and every kind of near-miss line (read from or not, behind several
    prefixes, impossible stamps, time-only prefixes, wrapped-line ends, over-long ones) mixed at random:
    the bulk reader gives exactly the reference parser's result, in chunks that cut shapes apart."""
    if not scan:
        monkeypatch.setattr(logfast, "SCAN", None)
    data = _log(seed)
    for chunk in (1 << 23, 7777, 900):
        ref = _assert_same(data, chunk)
    assert 0 < ref["report"]["lines_recognized"] < ref["report"]["lines_read"]
    assert ref["report"]["errors"] > 0  # the impossible stamps


def test_parallel_workers_equal_reference_with_near_miss_lines() -> None:
    _assert_same(_log(4, 6000), 20000, workers=2)


def test_the_decision_does_not_depend_on_the_digits() -> None:
    """``batch_reads`` is decided once per message with its digits made alike (logfast): on seeded random
    batch messages built from real field names, odd names and values of every kind, the answer with the
    digits made alike is the answer on the message itself."""
    from diagnoser.engines.sglang.logformats import _DECODE_FIELDS, _PREFILL_FIELDS

    rnd = random.Random(26)
    keys = [*_DECODE_FIELDS, *_PREFILL_FIELDS, "#x", "#x1", "est. #token", "a2b", "", "token usage "]
    values = ["12", "0.75", "-3", "-0", "nan", "inf", "1e5", "1_000", "0x1F", "True", "False", "12%", "n/a", "7,", "3.", ""]
    heads = ["Decode batch, ", "Decode batch. ", "Prefill batch, ", "Prefill batch [3], ", "Prefill batch(mixed #running-req: 4). ",
             "Prefill batch(mixed #running-req: 4)", "Decode batch", "Decode batchx "]
    alike = str.maketrans("0123456789", "0000000000")
    seen = {True: 0, False: 0}
    for _ in range(20000):
        fields = [f"{rnd.choice(keys)}: {rnd.choice(values)}" if rnd.random() < 0.9 else rnd.choice(values) for _ in range(rnd.randint(0, 5))]
        msg = rnd.choice(heads) + ", ".join(fields)
        want = batch_reads(msg)
        assert batch_reads(msg.translate(alike)) == want, msg
        seen[want] += 1
    assert min(seen.values()) > 1000  # both answers were exercised


@pytest.mark.parametrize("scan", [True, False], ids=["scanner", "regex"])
@pytest.mark.parametrize("shape", ["k8s_cri", "json_docker", "journald", "crlf", "ansi", "tsv_export"])
def test_bulk_equals_reference_with_wrapped_near_miss_lines(shape: str, scan: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same mix wrapped as deployments wrap logs (the bulk reader takes a collector's prefix off
    before its regex and scanner): still exactly the reference parser's result."""
    from tests.test_log_prefixes import SHAPES

    if not scan:
        monkeypatch.setattr(logfast, "SCAN", None)
    data = SHAPES[shape](_log(5, 2000, [p for p in PREFIXES if b"-13-" not in p]))  # (the wrappers need a real date)
    for chunk in (1 << 23, 5555):
        _assert_same(data, chunk)


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_parse_near_equals_parse_re_on_blocks_without_bulk_shapes(seed: int) -> None:
    """The scanner's residual lines that cannot be a bulk shape (no ``INFO:``, ``#running-req: `` or
    ``#new-seq: ``) are read by ``parse_near`` with a five-group regex: on seeded blocks of every near-miss
    kind, prefix, impossible stamp and junk line, its result is ``parse_re``'s, key by key."""
    rnd = random.Random(seed)
    data = _log(seed, 4000)
    lines = [ln for ln in data.split(b"\n") if not any(w in ln for w in logfast.SHAPE_WORDS)]
    lines += [b"", b"[2026-11-29 09:33:01] Decode batch", b"Decode batch, #x: 1", b"caf\xc3\xa9 batch", b"x\x00y"]
    rnd.shuffle(lines)
    for size in (len(lines), 700, 31):
        for at in range(0, len(lines), size):
            block = b"\n".join(lines[at:at + size])
            assert not any(w in block for w in logfast.SHAPE_WORDS)
            want, got = logfast.BlockParser().parse_re(block), logfast.BlockParser().parse_near(block)
            assert got.keys() == want.keys()
            for key in want:
                assert got[key] == want[key], key
    assert want["inert"] > 0 and want["refs"]


NO_PREFIX = [b"", b"  ", b"\t", b"sglang-1  | ", b"(SGLangEngine pid=12) "]


@pytest.mark.parametrize("scan", [True, False], ids=["scanner", "regex"])
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_bulk_equals_reference_with_bare_near_miss_lines(seed: int, scan: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Near-miss heads with no prefix at all (their only effect on the reference parser is the untimed
    clock's tick), mixed with bare real decode lines (read at the untimed clock: their times check the ticks
    line by line), prefixed lines, millisecond stamps and bare lines behind blanks or a compose/Ray name
    (the reference parser's own path): the bulk reader gives exactly the reference parser's result."""
    if not scan:
        monkeypatch.setattr(logfast, "SCAN", None)
    rnd = random.Random(seed)
    out = []
    for i in range(4000):
        r = rnd.random()
        if r < 0.1:
            out.append(REAL % (i % 60))
        elif r < 0.15:
            out.append(b"[2026-11-29 09:33:%02d.%03d] Decode batch, #x: %d" % (i % 60, rnd.randint(0, 999), i))
        elif r < 0.25:
            out.append((REAL % 0).split(b"] ", 1)[1])  # a bare real decode line: read, at the untimed clock
        elif r < 0.3:
            out.append(b"lorem ipsum %d" % i)
        else:
            msg, _ = rnd.choice(NEAR)
            out.append(rnd.choice(NO_PREFIX) + msg % rnd.randint(0, 10**rnd.randint(1, 6)))
    data = b"\n".join(out) + b"\n"
    for chunk in (1 << 23, 7777, 901):
        ref = _assert_same(data, chunk)
    assert ref["clock"][2] > 1000 and 0 < ref["report"]["lines_recognized"] < 4000  # many untimed lines, some read
    _assert_same(data, 20000, workers=2)


def test_a_log_of_bare_near_miss_lines_only_ticks_the_clock() -> None:
    """A log of nothing but bare near-miss heads: nothing recognised, one untimed second a line, on the
    bulk path as on the reference."""
    data = b"\n".join(b"Decode batch, #x: %d, #y: 3" % i for i in range(5000)) + b"\n"
    ref = _assert_same(data, 65536)
    assert ref["report"]["lines_recognized"] == 0 and ref["clock"] == (5000.0, False, 5000)
