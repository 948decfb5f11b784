"""The bundle format: write/read round trip, damage (truncation at many byte offsets, flipped bytes),
newer versions, and the writer's size cap and write-error rollback."""

from __future__ import annotations

import errno
import gzip
import io
import json
import random
from pathlib import Path

import pytest

from diagnoser.bundle import (
    FORMAT_VERSION,
    BundleError,
    BundleFull,
    BundleWriter,
    decode_line,
    encode_line,
    iter_members,
    manifest,
    read_bundle,
    validate,
)
from diagnoser.engines import get_adapter
from diagnoser.replay import ReplayIngest, collect_replay, load_source, write_source
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "kv-full-retract.dgb"


def _small_bundle(path: Path, n: int = 6) -> list[dict]:
    recs = [{"kind": "scrape", "t": 1000.0 + i, "target": "http://h:1", "text": f"sglang:num_running_reqs {i}\n"} for i in range(n)]
    w = BundleWriter(str(path), fsync=False)
    w.write_member([manifest([{"name": "http://h:1", "url": "http://h:1"}], [], 1000.0, 1.0, n)])
    for r in recs:
        w.write_member([r, {"kind": "log", "t": r["t"], "target": "http://h:1", "source": "s.log", "first_line": 1,
                            "lines": [f"[2026-11-29 10:00:0{int(r['t']) % 10}] line {r['t']}"]}])
    w.write_member([{"kind": "end", "t": 2000.0, "reason": "duration"}], final=True)
    w.close()
    return recs


def test_round_trip_keeps_every_record_and_reads_with_plain_gzip(tmp_path: Path) -> None:
    p = tmp_path / "b.dgb"
    recs = _small_bundle(p)
    res = read_bundle(str(p))
    assert res.complete and res.problems == []
    assert res.manifest is not None and res.manifest["format_version"] == FORMAT_VERSION
    assert [r["text"] for r in res.records if r["kind"] == "scrape"] == [r["text"] for r in recs]
    assert res.end is not None and res.end["reason"] == "duration"
    # a bundle is plain concatenated gzip: zcat/gzip read it whole
    lines = gzip.decompress(p.read_bytes()).decode().splitlines()
    assert json.loads(lines[0])["kind"] == "manifest" and len(lines) == 2 + 2 * len(recs)
    assert validate(str(p))[0] is True


def test_binary_log_lines_survive_byte_exact() -> None:
    raw = b"\xff\xfe\x00junk\x80"
    assert decode_line(encode_line(raw)) == raw
    assert decode_line(encode_line("é ok".encode())) == "é ok".encode()


def test_truncation_at_every_byte_of_a_small_bundle_reads_what_is_complete(tmp_path: Path) -> None:
    p = tmp_path / "b.dgb"
    _small_bundle(p)
    data = p.read_bytes()
    bounds = [off + ln for off, ln, _, _ in iter_members(data)]
    prev = -1
    for cut in range(len(data)):
        try:
            res = read_bundle("cut.dgb", data[:cut])
        except BundleError as e:  # only when nothing at all is readable
            assert cut < bounds[0] + 1, f"cut at {cut}: {e}"
            msg = str(e)
            assert "\n" not in msg and "cut.dgb" in msg
            continue
        n = len(res.records)
        assert n >= prev, f"cut at {cut} read fewer records than a shorter cut"
        prev = n
        # every member wholly before the cut is read
        whole = sum(1 for b in bounds if b <= cut)
        assert res.members_ok == whole
        assert res.problems or cut in bounds
        assert "readable" in res.summary() or not res.problems


def test_truncating_a_real_bundle_at_many_offsets_replays_the_part_before(tmp_path: Path) -> None:
    data = EXAMPLE.read_bytes()
    full = read_bundle(str(EXAMPLE))
    total_scrapes = full.count("scrape")
    bounds = [off + ln for off, ln, _, _ in iter_members(data)]
    adapter = get_adapter("sglang")
    offsets = sorted(set(range(7, len(data), 4099)) | {b - 1 for b in bounds[:8]} | {b + 3 for b in bounds[:8]})
    replayed = 0
    for cut in offsets:
        try:
            res = read_bundle("x.dgb", data[:cut])
        except BundleError as e:  # nothing readable yet: only inside the first block
            assert cut < bounds[0] and "no readable record" in str(e)
            continue
        assert res.count("scrape") <= total_scrapes
        assert sum(1 for b in bounds if b <= cut) <= res.members_ok + 1
        if cut in offsets[::6]:  # the whole pipeline on a sample of cuts: no exception, partial data used
            p = tmp_path / f"cut{cut}.dgb"
            p.write_bytes(data[:cut])
            col = collect_replay(str(p), adapter)
            assert col.errors and "damaged" in col.errors[0] and "readable" in col.errors[0]
            scr = sum(i.scrapes for i in col.inputs if i.kind == "metrics")
            assert scr == res.count("scrape")
            replayed += 1
    assert replayed >= 5


def test_flipped_bytes_lose_only_the_damaged_block(tmp_path: Path) -> None:
    data = EXAMPLE.read_bytes()
    members = list(iter_members(data))
    full = read_bundle(str(EXAMPLE))
    rng = random.Random(6)
    checked = 0
    for k, (off, ln, payload, _) in enumerate(members):
        if ln < 40:
            continue
        in_member = payload.count(b"\n")
        for pos in (off + 12 + rng.randrange(ln - 20), off + ln - 5):  # deflate data; CRC/size trailer
            bad = bytearray(data)
            bad[pos] ^= 0x5A
            try:
                res = read_bundle("flip.dgb", bytes(bad))
            except BundleError as e:  # only if the manifest block itself is unreadable and nothing else is
                pytest.fail(f"flip at {pos} in block {k}: {e}")
            lost = (len(full.records) + 2) - (len(res.records) + (res.manifest is not None) + (res.end is not None))
            assert 0 <= lost <= in_member, f"flip at {pos} lost {lost} records, block had {in_member}"
            if lost:
                assert res.problems and "damaged" in res.summary()
            checked += 1
    assert checked >= 20


def test_a_flipped_byte_replays_the_rest_with_a_clear_message(tmp_path: Path) -> None:
    data = bytearray(EXAMPLE.read_bytes())
    members = list(iter_members(bytes(data)))
    off, ln, _, _ = members[5]
    data[off + ln // 2] ^= 0xFF
    p = tmp_path / "flip.dgb"
    p.write_bytes(bytes(data))
    src = load_source(str(p))
    assert src.problems == ["1 damaged block(s) skipped"]
    col = collect_replay(str(p), get_adapter("sglang"))
    assert "1 damaged block(s) skipped" in col.errors[0]
    assert sum(i.scrapes for i in col.inputs if i.kind == "metrics") == read_bundle(str(EXAMPLE)).count("scrape") - 1


def test_newer_format_version_is_one_clear_line(tmp_path: Path) -> None:
    p = tmp_path / "new.dgb"
    w = BundleWriter(str(p), fsync=False)
    man = manifest([], [], 0.0, 1.0, 1.0)
    man["format_version"] = FORMAT_VERSION + 1
    man["tool_version"] = "9.0.0"
    w.write_member([man])
    w.close()
    with pytest.raises(BundleError) as ei:
        read_bundle(str(p))
    msg = str(ei.value)
    assert "\n" not in msg and f"v{FORMAT_VERSION + 1}" in msg and "9.0.0" in msg and "upgrade" in msg
    # through the CLI: exit 2 and that one line, for --once --replay and for replay-server
    import subprocess
    import sys

    for argv in (["--once", "--replay", str(p)], ["replay-server", str(p), "--port", "0"]):
        r = subprocess.run([sys.executable, "-m", "diagnoser", *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr == f"diagnose: {msg}\n" and r.stdout == ""


@pytest.mark.parametrize(
    "content, words",
    [(b"", "empty"), (b"hello, not gzip\n", "not a diagnoser bundle"), (gzip.compress(b"not json\n"), "no readable record"),
     (gzip.compress(b'{"kind": "manifest", "format": "other"}\n'), "not a diagnoser bundle")],
)
def test_not_a_bundle_is_one_sentence(tmp_path: Path, content: bytes, words: str) -> None:
    p = tmp_path / "x.dgb"
    p.write_bytes(content)
    with pytest.raises(BundleError, match=words):
        read_bundle(str(p))
    with pytest.raises(BundleError, match="does not exist"):
        read_bundle(str(tmp_path / "missing.dgb"))


def test_max_bytes_refuses_a_block_and_leaves_the_file_valid(tmp_path: Path) -> None:
    p = tmp_path / "cap.dgb"
    w = BundleWriter(str(p), max_bytes=4096, fsync=False)
    w.write_member([manifest([], [], 0.0, 1.0, 1.0)])
    rng = random.Random(1)
    with pytest.raises(BundleFull):
        for i in range(100):  # incompressible text fills the cap fast
            w.write_member([{"kind": "note", "t": i, "text": "".join(rng.choice("abcdefghij0123456789") for _ in range(300))}])
    w.write_member([{"kind": "end", "t": 1.0, "reason": "max-size"}], final=True)
    w.close()
    assert p.stat().st_size <= 4096
    res = read_bundle(str(p))
    assert res.complete and res.end is not None and res.end["reason"] == "max-size"


class _FullDisk(io.BytesIO):
    """A file that accepts ``room`` bytes and then fails like a full disk (half-writes the last block)."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, b: bytes) -> int:  # type: ignore[override]
        left = self.room - self.tell()
        if len(b) > left:
            super().write(bytes(b[: max(0, left)]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(b)

    def fileno(self) -> int:
        raise OSError("no fd")


def test_write_error_cuts_the_half_written_block(tmp_path: Path) -> None:
    fh = _FullDisk(room=900)
    w = BundleWriter("mem.dgb", fh=fh, fsync=True)
    w.write_member([manifest([], [], 0.0, 1.0, 1.0)])
    rng = random.Random(2)
    with pytest.raises(OSError) as ei:
        for i in range(50):
            w.write_member([{"kind": "note", "t": i, "text": "".join(rng.choice("xyz123") for _ in range(200))}])
    assert ei.value.errno == errno.ENOSPC
    data = fh.getvalue()
    assert len(data) == w.size  # nothing half-written is left
    res = read_bundle("mem.dgb", data)
    assert res.problems == ["no end record (the recording was cut off before it could finish)"]
    assert res.count("note") == w.members - 1


def test_write_source_round_trip_equals_the_directory(tmp_path: Path, data_dir: Path) -> None:
    run = data_dir / "sglang-cpu-real" / "kv-full-retract"
    src = load_source(str(run))
    out = tmp_path / "k.dgb"
    counts = write_source(src, str(out))
    back = load_source(str(out))
    assert counts["scrapes"] == len(src.scrape_times()) == len(back.scrape_times()) == 20
    assert [r["text"] for r in back.records if r["kind"] == "scrape"] == [r["text"] for r in src.records if r["kind"] == "scrape"]
    a = ReplayIngest(get_adapter("sglang"), src)
    a.apply_all()
    b = ReplayIngest(get_adapter("sglang"), back)
    b.apply_all()
    ca, cb = a.finish(), b.finish()
    ta, tb = ca.timelines[0], cb.timelines[0]
    assert {k: (s.ts.tolist(), s.values.tolist()) for k, s in ta.series.items()} == {k: (s.ts.tolist(), s.values.tolist()) for k, s in tb.series.items()}
    assert [(e.kind, e.ts, e.line_no) for e in ta.events] == [(e.kind, e.ts, e.line_no) for e in tb.events]
    # thinning keeps the first and last scrape
    thin = write_source(src, str(tmp_path / "t.dgb"), every=3)
    assert thin["scrapes"] == 8 and thin["dropped_scrapes"] == 12


def test_the_cli_replays_a_damaged_bundle_and_says_how_much_was_readable(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from diagnoser.cli import main as cli_main

    data = EXAMPLE.read_bytes()
    flipped = bytearray(data)
    off, ln, _, _ = list(iter_members(data))[3]
    flipped[off + ln // 2] ^= 0x10
    for name, content in (("cut.dgb", data[: len(data) // 2]), ("flip.dgb", bytes(flipped))):
        p = tmp_path / name
        p.write_bytes(content)
        code = cli_main(["--once", "--replay", str(p), "--format", "json"])
        captured = capsys.readouterr()
        doc = json.loads(captured.out)
        assert code in (0, 1) and "Traceback" not in captured.err
        errs = [e["error"] for e in doc["errors"]]
        assert len(errs) == 1 and "is damaged" in errs[0] and "were readable" in errs[0] and "which are replayed" in errs[0]
        assert any(i["kind"] == "metrics" and i["scrapes"] > 0 for i in doc["inputs"])


def test_record_from_a_damaged_bundle_writes_a_clean_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from diagnoser.cli import main as cli_main

    cut = tmp_path / "cut.dgb"
    cut.write_bytes(EXAMPLE.read_bytes()[:90_000])
    fixed = tmp_path / "fixed.dgb"
    assert cli_main(["record", "--from", str(cut), "-o", str(fixed)]) == 0
    assert "is damaged" in capsys.readouterr().err
    ok, msg = validate(str(fixed))
    assert ok, msg
    assert read_bundle(str(fixed)).count("scrape") == read_bundle(str(cut)).count("scrape") > 0
