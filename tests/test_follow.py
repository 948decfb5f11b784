"""Reading a log from a file, from stdin (``-``), and following a growing file across rotation and
truncation (``tail -F`` semantics), with real SGLang 0.5.23 lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnoser.engines.sglang import ADAPTER
from diagnoser.sources.logs import LogFollower, open_log_reader, read_log
from diagnoser.timeline import Timeline

REAL = "sglang-cpu-real/kv-full-retract/server.log"


@pytest.fixture(scope="module")
def real_lines(data_dir: Path) -> list[bytes]:
    """Decode/prefill/retraction lines of a real run, verbatim, in file order."""
    raw = (data_dir / REAL).read_bytes().splitlines(keepends=True)
    keep = [ln for ln in raw if b"Decode batch" in ln or b"Prefill batch" in ln or b"Retract requests" in ln]
    assert len(keep) > 200
    return keep


def _follower(path: Path, from_start: bool = True) -> tuple[Timeline, LogFollower]:
    tl = Timeline(target="t")
    reader = open_log_reader(ADAPTER, tl, str(path))
    return tl, LogFollower(reader, str(path), from_start=from_start)


def _decode_values(tl: Timeline) -> list[float]:
    s = tl.get("gen_throughput_tps")
    return s.values.tolist() if s else []


def _expected_gen(lines: list[bytes]) -> list[float]:
    out = []
    for ln in lines:
        if b"Decode batch" in ln:
            out.append(float(ln.split(b"gen throughput (token/s): ")[1].split(b",")[0]))
    return out


def test_follow_growth_with_partial_lines(tmp_path: Path, real_lines: list[bytes]) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    tl, f = _follower(path)
    assert f.poll() == 0
    first, rest = real_lines[:50], real_lines[50:100]
    blob = b"".join(first)
    with open(path, "ab") as fh:
        fh.write(blob[:-40])  # the last line arrives cut in two
    assert f.poll() == 49
    with open(path, "ab") as fh:
        fh.write(blob[-40:])
    assert f.poll() == 1
    with open(path, "ab") as fh:
        fh.write(b"".join(rest))
    assert f.poll() == 50
    assert _decode_values(tl) == _expected_gen(real_lines[:100])
    assert f.reader.report.lines_read == 100 and f.reader.report.lines_recognized == 100
    f.close()


def test_follow_across_rotation(tmp_path: Path, real_lines: list[bytes]) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"".join(real_lines[:30]))
    tl, f = _follower(path)
    assert f.poll() == 30
    # the writer adds to the old file, logrotate renames it, the server reopens a new one
    with open(path, "ab") as fh:
        fh.write(b"".join(real_lines[30:40]))
    os.rename(path, tmp_path / "server.log.1")
    path.write_bytes(b"".join(real_lines[40:70]))
    assert f.poll() == 40
    assert f.rotations == 1
    with open(path, "ab") as fh:
        fh.write(b"".join(real_lines[70:80]))
    assert f.poll() == 10
    assert _decode_values(tl) == _expected_gen(real_lines[:80])
    assert f.reader.report.lines_recognized == 80
    f.close()


def test_follow_across_truncation(tmp_path: Path, real_lines: list[bytes]) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"".join(real_lines[:60]))
    tl, f = _follower(path)
    assert f.poll() == 60
    # copytruncate: same inode, emptied, then new lines
    with open(path, "r+b") as fh:
        fh.truncate(0)
    with open(path, "ab") as fh:
        fh.write(b"".join(real_lines[60:75]))
    assert f.poll() == 15
    assert f.truncations == 1 and f.rotations == 0
    assert _decode_values(tl) == _expected_gen(real_lines[:75])
    f.close()


def test_follow_from_end_and_late_file(tmp_path: Path, real_lines: list[bytes]) -> None:
    path = tmp_path / "server.log"
    tl, f = _follower(path, from_start=False)
    assert f.poll() == 0  # not there yet: no error
    path.write_bytes(b"".join(real_lines[:20]))
    assert f.poll() == 0  # from the end: what was there before is skipped
    with open(path, "ab") as fh:
        fh.write(b"".join(real_lines[20:25]))
    assert f.poll() == 5
    assert _decode_values(tl) == _expected_gen(real_lines[20:25])
    f.close()


def test_follow_skips_junk_and_keeps_going(tmp_path: Path, real_lines: list[bytes]) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"".join(real_lines[:5]) + b"\x00\xff\xfe garbage \x00\n" + b"".join(real_lines[5:10]))
    tl, f = _follower(path)
    assert f.poll() == 11
    rep = f.reader.report
    assert rep.errors == 1 and rep.lines_read == 11 and rep.lines_recognized == 10
    f.close()


def test_read_from_stdin_stream_matches_file(data_dir: Path) -> None:
    import io

    path = data_dir / REAL
    a, b = Timeline(target="a"), Timeline(target="b")
    ra = read_log(ADAPTER, a, str(path))
    rb = read_log(ADAPTER, b, "-", stream=io.BytesIO(path.read_bytes()))
    assert rb.report.source == "-" and rb.parser.source_name == "stdin"
    # 468 scheduler, startup and access lines + the 24 frame and exception lines of its 4 (benign) tracebacks
    assert (ra.report.lines_read, ra.report.lines_recognized) == (rb.report.lines_read, rb.report.lines_recognized) == (596, 492)
    assert a.get("running_reqs").values.tolist() == b.get("running_reqs").values.tolist()
    assert b.get("running_reqs").sources[0].startswith("stdin:")


def test_missing_and_directory_paths_say_what_to_do(tmp_path: Path) -> None:
    tl = Timeline(target="t")
    r = read_log(ADAPTER, tl, str(tmp_path / "nope.log"))
    assert r.report.messages and "does not exist" in r.report.messages[0] and "--log -" in r.report.messages[0]
    r = read_log(ADAPTER, tl, str(tmp_path))
    assert "is a directory" in r.report.messages[0]


def test_diagnose_once_reads_stdin(data_dir: Path) -> None:
    """The real command, reading the real log from a pipe."""
    data = (data_dir / REAL).read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "diagnoser", "--once", "--log", "-", "--format", "json"],
        input=data, capture_output=True, timeout=120, check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr.decode()
    doc = json.loads(proc.stdout)
    (inp,) = [i for i in doc["inputs"] if i["kind"] == "log"]
    assert inp["source"] == "-" and inp["lines_read"] == 596 and inp["lines_recognized"] == 492
    sig = next(iter(doc["signals"].values()))
    assert sig["running_reqs"]["max"] == 8 and sig["queue_reqs"]["max"] == 35


def test_diagnose_once_on_binary_junk_exits_2_with_one_sentence(tmp_path: Path) -> None:
    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(256)) * 40)
    proc = subprocess.run(
        [sys.executable, "-m", "diagnoser", "--once", "--log", str(junk)], capture_output=True, timeout=120, check=False,
    )
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert "Traceback" not in err and "was recognised" in err
