"""Record from a loopback replay-server, replay the bundle, get identical findings; stopping cleanly
(Ctrl-C, SIGTERM, --max-size, a real file-size limit); secrets never reach the bundle."""

from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnoser.bundle import read_bundle
from diagnoser.cli import main as cli_main
from diagnoser.cli.replay_server import ReplayServer
from diagnoser.replay import load_source
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "kv-full-retract.dgb"
DIAGNOSE = [sys.executable, "-m", "diagnoser"]


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The kv-full-retract example played at 10x on a free loopback port, its log written to a file."""
    log = tmp_path / "server.log"
    fh = open(log, "ab")
    srv = ReplayServer(load_source(str(EXAMPLE)), port=0, speed=10.0, log_out=fh).start()
    try:
        yield srv.url, log
    finally:
        srv.stop()
        fh.close()


def _json_out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict]:
    code = cli_main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_record_then_replay_gives_identical_findings(server: tuple[str, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    url, log = server
    out = tmp_path / "rt.dgb"
    code, live = _json_out(capsys, ["record", "--url", url, "--log", str(log), "--duration", "5s", "--interval", "1",
                                    "-o", str(out), "--report", "json"])
    assert code == 0
    res = read_bundle(str(out))
    assert res.complete and res.end is not None and res.end["reason"] == "duration"
    assert res.count("scrape") == 6 and res.manifest is not None and res.manifest["sglang_version"] == "0.5.23"
    code2, replayed = _json_out(capsys, ["--once", "--replay", str(out), "--format", "json"])
    assert code2 == 1  # problems found
    assert live["findings"], "the recorded window must show the KV bottleneck"
    assert {f["rule"] for f in live["findings"]} >= {"kv_saturation"}
    assert replayed["findings"] == live["findings"]
    assert replayed["signals"] == live["signals"]
    assert replayed["config"] == live["config"]
    assert replayed["window"] == live["window"] and replayed["version"] == live["version"]
    # the bundle holds the exposition exactly as served
    served = {r["text"] for r in load_source(str(EXAMPLE)).records if r["kind"] == "scrape"}
    assert {r["text"] for r in res.records if r["kind"] == "scrape"} <= served


def test_a_direct_once_url_run_against_the_replay_server_names_the_bottleneck(server: tuple[str, Path],
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    url, log = server
    code, doc = _json_out(capsys, ["--once", "--url", url, "--log", str(log), "--duration", "3s", "--interval", "1", "--format", "json"])
    assert code == 1
    assert "kv_saturation" in {f["rule"] for f in doc["findings"]}
    assert doc["version"] == "0.5.23"


def _spawn_record(url: str, out: Path, *extra: str, preexec=None) -> subprocess.Popen[str]:
    return subprocess.Popen([*DIAGNOSE, "record", "--url", url, "-o", str(out), "--interval", "0.3", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=preexec)


def _wait_size(path: Path, size: int, timeout: float = 20.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if path.exists() and path.stat().st_size >= size:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {size} bytes")


@pytest.mark.parametrize("sig, words", [(signal.SIGINT, "stopped by Ctrl-C"), (signal.SIGTERM, "stopped by Ctrl-C/SIGTERM")])
def test_ctrl_c_or_sigterm_leaves_a_complete_bundle(server: tuple[str, Path], tmp_path: Path, sig: int, words: str) -> None:
    url, _ = server
    out = tmp_path / "int.dgb"
    p = _spawn_record(url, out, "--duration", "5m")
    _wait_size(out, 60_000)  # config + a few scrapes
    p.send_signal(sig)
    _, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    assert words in err and "Traceback" not in err
    res = read_bundle(str(out))
    assert res.complete and res.end is not None and res.end["reason"] == "interrupted"
    assert res.count("scrape") >= 2


def test_max_size_stops_before_the_cap(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    out = tmp_path / "cap.dgb"
    p = _spawn_record(url, out, "--duration", "5m", "--max-size", "80K")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "reached --max-size" in err
    assert out.stat().st_size <= 80 * 1024
    res = read_bundle(str(out))
    assert res.complete and res.end["reason"] == "max-size" and res.count("scrape") >= 2


def _fsize_limit(n: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    return pre


def test_a_write_error_stops_cleanly_and_keeps_a_valid_bundle(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    out = tmp_path / "full.dgb"
    p = _spawn_record(url, out, "--duration", "5m", preexec=_fsize_limit(70_000))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "file-size limit" in err and "valid bundle" in err and "Traceback" not in err
    assert out.stat().st_size <= 70_000
    res = read_bundle(str(out))  # no damaged block: the half-written one was cut off
    assert res.members_bad == 0 and not res.truncated and res.count("scrape") >= 1
    kept = int(err.split("stopped after ")[1].split(" ")[0])
    assert kept == res.count("scrape")


def test_secrets_never_reach_the_bundle(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    log = tmp_path / "secret.log"
    log.write_text(
        "[2026-11-29 10:00:00] server_args={'model_path': 'm', 'api_key': 'sk-topsecret-1', 'port': 30000}\n"
        "python -m sglang.launch_server --api-key sk-topsecret-2 --model m\n"
        "[2026-11-29 10:00:01] ServerArgs(admin_api_key='adm-topsecret-3')\n"
    )
    cred = url.replace("http://", "http://alice:pw-topsecret-4@")
    out = tmp_path / "s.dgb"
    assert cli_main(["record", "--url", cred, "--log", str(log), "--duration", "1s", "--interval", "1", "-o", str(out)]) == 0
    text = gzip.decompress(out.read_bytes()).decode()
    for secret in ("sk-topsecret-1", "sk-topsecret-2", "adm-topsecret-3", "pw-topsecret-4", "alice"):
        assert secret not in text
    assert text.count("***") >= 4


def test_usage_errors_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["record", "-o", str(tmp_path / "x.dgb")]) == 2
    assert "nothing to record" in capsys.readouterr().err
    (tmp_path / "exists.dgb").write_bytes(b"x")
    assert cli_main(["record", "--log", "/etc/hostname", "-o", str(tmp_path / "exists.dgb")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli_main(["record", "--log", str(tmp_path / "nope.log"), "-o", str(tmp_path / "y.dgb")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main(["record", "--url", "http://127.0.0.1:1", "--duration", "0", "-o", str(tmp_path / "z.dgb"), "--max-size", "lots"]) == 2
    assert "not a size" in capsys.readouterr().err


def test_an_unreachable_server_records_the_failures_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "down.dgb"
    assert cli_main(["record", "--url", "http://127.0.0.1:9", "--duration", "1s", "--interval", "1", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "nothing was recorded" in err and "Could not connect" in err
    res = read_bundle(str(out))
    assert res.complete and all(r.get("error") for r in res.records if r["kind"] == "scrape")
    # replaying it reports the target as unreachable, as the live run would
    assert cli_main(["--once", "--replay", str(out), "--format", "json"]) in (1, 2)
    doc = json.loads(capsys.readouterr().out)
    assert any("Could not connect" in m for i in doc["inputs"] for m in i.get("messages", []))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork for preexec_fn")
def test_module_entry_point_exists() -> None:
    r = subprocess.run([*DIAGNOSE, "record", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 0 and "--max-size" in r.stdout


def test_two_servers_and_a_log_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "a.log"
    fh = open(log, "ab")
    a = ReplayServer(load_source(str(EXAMPLE)), port=0, speed=10.0, log_out=fh).start()
    b = ReplayServer(load_source(str(ROOT / "examples" / "client-bound.dgb")), port=0, speed=10.0).start()
    out = tmp_path / "two.dgb"
    try:
        code, live = _json_out(capsys, ["record", "--url", a.url, "--url", b.url, "--log", str(log), "--duration", "3s",
                                        "--interval", "1", "-o", str(out), "--report", "json"])
    finally:
        a.stop()
        b.stop()
        fh.close()
    assert code == 0
    man = read_bundle(str(out)).manifest
    assert man is not None and [t["name"] for t in man["targets"]] == [a.url, b.url]
    assert man["logs"] == [{"source": str(log), "target": str(log)}]  # with two URLs a log is its own target
    _, replayed = _json_out(capsys, ["--once", "--replay", str(out), "--format", "json"])
    assert list(replayed["signals"]) == list(live["signals"]) == [a.url, b.url, str(log)]
    assert replayed["findings"] == live["findings"] and replayed["signals"] == live["signals"]
    assert a.url in {f["target"] for f in live["findings"]}  # (b's 3 s may be too short for a finding)
    assert live["signals"][b.url]["running_reqs"]["n"] >= 2


def test_recording_a_log_alone_equals_once_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = ROOT / "examples" / "kv-full-retract" / "server.log"
    out = tmp_path / "log.dgb"
    code, live = _json_out(capsys, ["record", "--log", str(log), "--duration", "0", "-o", str(out), "--report", "json"])
    assert code == 0
    _, replayed = _json_out(capsys, ["--once", "--replay", str(out), "--format", "json"])
    _, direct = _json_out(capsys, ["--once", "--log", str(log), "--format", "json"])
    assert "kv_saturation" in {f["rule"] for f in direct["findings"]}
    assert live["findings"] == replayed["findings"] == direct["findings"]
    assert live["signals"] == replayed["signals"] == direct["signals"]


class _DiskFillsUp:
    """A real file that fails like a full disk once ``room`` bytes are on it (fault injection: a real
    ENOSPC needs a small filesystem, which CI machines do not give us)."""

    def __init__(self, path: str, room: int) -> None:
        self.f = open(path, "wb", buffering=0)
        self.room = room

    def write(self, b: bytes) -> int:
        left = self.room - self.f.tell()
        if left <= 0:
            raise OSError(28, "No space left on device")
        return self.f.write(bytes(b[:left]))  # a short write, like the kernel's

    def __getattr__(self, name: str):  # flush, truncate, seek, fileno, close
        return getattr(self.f, name)


def test_a_full_disk_stops_cleanly_and_says_so(server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnoser.bundle as bundle

    url, _ = server
    out = tmp_path / "disk.dgb"
    import builtins

    def fake_open(p: str, mode: str = "r", *a: object, **k: object) -> object:
        return _DiskFillsUp(p, 50_000) if "w" in mode else builtins.open(p, mode, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(bundle, "open", fake_open, raising=False)
    code = cli_main(["record", "--url", url, "--duration", "30s", "--interval", "0.2", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "the disk is full" in err and "valid bundle" in err and "Traceback" not in err
    res = read_bundle(str(out))
    assert res.members_bad == 0 and not res.truncated and res.count("scrape") >= 2
    # cutting the half-written block off freed enough room for the small end record
    assert "the end record was written" in err and res.end is not None and res.end["reason"] == "write-error"
    assert res.end["counts"]["scrapes"] == res.count("scrape")
    assert out.stat().st_size <= 50_000
