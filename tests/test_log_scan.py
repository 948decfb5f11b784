"""The compiled line scanner (engines/sglang/_scan.c via logscan.py) must give exactly what the bulk
regex path (``BlockParser.parse_re``, the reference) gives for the same block: the same rows, times,
values, ranks, counts, reference lines and line shapes.

Proven on every real log in tests/data, on the generated benchmark log, and on tens of thousands of
mutated lines (a character dropped, doubled or changed, digits made too long, odd separators, a CR, a
trailing word...), so that every way a line can fall just outside the known shapes is covered: the
scanner must then leave it to the regex path, never read it differently.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from diagnoser.engines.sglang import logfast, logscan
from diagnoser.engines.sglang.logfast import BlockParser
from tests.conftest import DATA, IN_CI
from tests.test_log_bulk import _generator

pytestmark = pytest.mark.skipif(not logscan.AVAILABLE and not IN_CI, reason="the C scanner is not built (no compiler at install)")


def test_the_scanner_is_built_and_used_in_ci() -> None:
    # CI installs with a C compiler: the fast path must really be there (and the default), not skipped
    assert logscan.AVAILABLE, "diagnoser.engines.sglang._scan is not built: pip install -e . needs gcc and the Python headers"
    assert logfast.scanner() is logscan


def _norm(out: dict[str, Any]) -> dict[str, Any]:
    ts = np.asarray(out.get("ts", []), dtype=np.float64)
    return {
        "n": out["n"],
        "bulk_rows": np.asarray(out["bulk_rows"], dtype=np.int64).tolist(),
        # the time of every bulk row (other rows carry no time)
        "ts": ts[np.asarray(out["bulk_rows"], dtype=np.int64)].tolist() if len(ts) else [],
        "series": {k: (np.asarray(r, dtype=np.int64).tolist(), np.asarray(v, dtype=np.float64).tolist())
                   for k, (r, v) in sorted(out["series"].items())},
        "refs": list(out["refs"]),
        "kinds": dict(sorted(out["kinds"].items())),
        "status": dict(sorted(out["status"].items())),
        "paths": dict(sorted(out["paths"].items())),
        "access_last": out["access_last"],
        "shapes": list(out["shapes"]),
    }


def _assert_same(block: bytes) -> dict[str, Any]:
    ref = _norm(BlockParser().parse_re(block))
    got = _norm(logscan.parse(BlockParser(), block))
    for key in ref:
        if got[key] != ref[key]:
            if key == "series":
                for k in ref[key]:
                    assert got[key].get(k) == ref[key][k], f"series {k} differs"
                assert set(got[key]) == set(ref[key]), "series keys differ"
            assert got[key] == ref[key], f"scanner differs from the regex path in {key!r}"
    return ref


def _real_logs() -> list[Path]:
    files = sorted((DATA / "sglang" / "logs").glob("*"))
    files += sorted(DATA.glob("cases/*/server.log"))
    files += sorted(DATA.glob("sglang-cpu-real/*/server.log"))
    return files


@pytest.mark.parametrize("path", _real_logs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_scanner_equals_regex_path_on_real_logs(data_dir: Path, path: Path) -> None:
    data = path.read_bytes()
    ref = _assert_same(data[:-1] if data.endswith(b"\n") else data)
    assert ref["n"] > 0


def test_scanner_equals_regex_path_on_generated_log(tmp_path: Path) -> None:
    path = tmp_path / "g.log"
    _generator().generate(path, 3)
    data = path.read_bytes().rstrip(b"\n")
    ref = _assert_same(data)
    # every common shape is there, the hybrid SWA decode lines included
    assert {"decode", "prefill", "access"} <= set(ref["kinds"])
    assert any(k[0] == "swa_token_usage" for k in ref["series"])
    # and the scanner took almost every line itself (the rest went to the regex path)
    _, kind, *_ = logscan._scan.scan(data, logscan._TRIGGERS)
    assert np.count_nonzero(np.frombuffer(kind, np.uint8)) >= 0.99 * len(ref["bulk_rows"])


TEMPLATES = [
    "[2026-11-29 10:00:01] Decode batch, #running-req: 47, #token: 115000, token usage: 0.99, cuda graph: True, gen throughput (token/s): 850.12, #queue-req: 93",
    "[2026-11-29 10:00:01 TP0] Decode batch. #running-req: 4, #token: 9000, token usage: 0.10, gen throughput (token/s): 85.01, #queue-req: 0",
    "[2026-11-29 10:00:01.123 DP1 TP1 EP1] Decode batch, #running-req: 12, #token: 9000, token usage: 0.10, accept len: 2.31, accept rate: 0.77, cpu graph: False, gen throughput (token/s): 85.01, #queue-req: 0, ",
    "[2026-11-29 10:00:01 TP0] Decode batch, #running-req: 4, #full token: 41234, full token usage: 0.31, #swa token: 14592, swa token usage: 0.06, cuda graph: True, gen throughput (token/s): 429.34, #queue-req: 3",
    "(SGLangEngine pid=4242) [2026-11-29 10:00:01 TP0] Decode batch [68274], #running-req: 317, #token: 1094261, token usage: 0.67, cuda graph: True, gen throughput (token/s): 14806.57, #queue-req: 0,",
    "(SGLangEngine pid=4242, ip=10.0.0.7) [2026-11-29 10:00:01 PP1 TP0] Decode batch, #running-req: 3, #token: 1094, token usage: 0.67, npu graph: True, gen throughput (token/s): 14.57, #queue-req: 0",
    "[2026-11-29 10:00:01] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.45, #running-req: 40, #queue-req: 93, #pending-token: 12000, cuda graph: False, input throughput (token/s): 18231.02",
    "[2026-11-29 10:00:01 TP0] Prefill batch. #new-seq: 3, #new-token: 512, #cached-token: 64, cache hit rate: 11.11%, token usage: 0.05, #running-req: 2, #queue-req: 0",
    "sglang-1  | [2026-11-29 10:00:01,5 ATTN_CP0 MOE_DP2] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.01, #running-req: 3, #queue-req: 0, ",
    '[2026-11-29 10:00:01] INFO:     10.0.3.45:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    '[2026-11-29 10:00:01 DP0] INFO:     [::1]:8 - "GET /metrics?x=1 HTTP/1.1" 503 Service Unavailable',
    "[2026-11-29 10:00:01] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 100, #new_token_ratio: 0.2585 -> 0.8003",
    "[2026-11-29 10:00:01] Cache flushed successfully!",
]
_ALPHABET = "0123456789.,:;- []()|#%\"/\tabcTPDX\r\x00\xe9"


def _mutate(line: str, rnd: random.Random) -> str:
    i = rnd.randrange(len(line) + 1)
    op = rnd.randrange(9)
    if op == 0:
        return line[:i] + line[i + 1 :]  # drop a character
    if op == 1:
        return line[:i] + line[i : i + 1] * 2 + line[i + 1 :]  # double one
    if op == 2:
        return line[:i] + rnd.choice(_ALPHABET) + line[i + 1 :]  # change one
    if op == 3:
        return line[:i] + rnd.choice(_ALPHABET) + line[i:]  # insert one
    if op == 4:  # make a number too long for an exact double, or for the regex's bounds
        j = line.find(": ", i)
        return line if j < 0 else line[: j + 2] + "9" * rnd.choice((7, 15, 16, 19, 30, 31)) + line[j + 2 :]
    if op == 5:
        return line + rnd.choice((" ", ",", ", ", ",,", " Decode batch", " x", "\r"))
    if op == 6:  # long tails and long prefixes
        return rnd.choice(("a" * 201 + "  | ", "x" * 60)) + line if rnd.random() < 0.5 else line + " " + "y" * 401
    if op == 7:  # another rank tag, or nine of them
        return line.replace("] ", " TP" + "1" * rnd.choice((1, 9, 10)) + "] ", 1) if rnd.random() < 0.7 else line.replace("] ", " TP0" * 9 + "] ", 1)
    return line.replace(", ", ",  ", 1)


def test_scanner_equals_regex_path_on_mutated_lines() -> None:
    rnd = random.Random(20261129)
    lines = []
    for _ in range(6000):
        line = rnd.choice(TEMPLATES)
        for _ in range(rnd.choice((0, 1, 1, 2, 3))):
            line = _mutate(line, rnd)
        lines.append(line.replace("\n", " "))
    block = "\n".join(lines).encode("utf-8", errors="surrogateescape")
    ref = _assert_same(block)
    # the mutations both kept and broke the shapes: both paths had work to do
    assert 1000 < len(ref["bulk_rows"]) < 5900


def test_scanner_numbers_are_the_exact_doubles_python_reads() -> None:
    rnd = random.Random(7)
    lines = []
    for _ in range(3000):
        ints = rnd.randint(1, 8)
        frac = rnd.randint(1, 15 - ints)
        usage = f"{rnd.randrange(10 ** ints)}.{rnd.randrange(10 ** frac):0{frac}d}"
        gen = f"{rnd.random() * 10 ** rnd.randint(0, 9):.{rnd.randint(1, 6)}f}"
        stamp = f"2026-{rnd.randint(1, 12):02d}-{rnd.randint(1, 28):02d} {rnd.randint(0, 23):02d}:{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d}"
        frac_s = rnd.choice(("", f".{rnd.randrange(10 ** 6):0{rnd.randint(1, 6)}d}"[:7]))
        lines.append(f"[{stamp}{frac_s}] Decode batch, #running-req: {rnd.randrange(10 ** 15)}, #token: {rnd.randrange(10 ** rnd.randint(1, 15))}, "
                     f"token usage: {usage}, gen throughput (token/s): {gen}, #queue-req: {rnd.randrange(1000)}")
    ref = _assert_same("\n".join(lines).encode())
    assert len(ref["bulk_rows"]) == 3000
    got = _norm(logscan.parse(BlockParser(), "\n".join(lines).encode()))
    assert got["series"][("token_usage", "")][1][:5] == [float(line.split("token usage: ")[1].split(",")[0]) for line in lines[:5]]


@pytest.mark.parametrize("first", ["logscan", "logfast"])
def test_either_module_can_be_imported_first(first: str) -> None:
    """logfast imports logscan (the C scanner's glue), which imports neither logfast nor logs: either can
    be imported first (tests/test_startup.py checks the whole reader's import graph)."""
    import subprocess
    import sys

    code = (f"from diagnoser.engines.sglang import {first}\n"
            "from diagnoser.engines.sglang import logfast, logscan\n"
            "assert logfast.scanner() is logscan\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
