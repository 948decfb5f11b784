"""``diagnose compare BEFORE AFTER`` on real before/after pairs from the SGLang 0.5.23 CPU engine
(tests/data/sglang-cpu-before-after: kv-full, the KV pool capped at 2,048 tokens, then at the 16,384
diagnoser proposed; radix-off, the radix cache off under a shared prefix, then on; same load each; the
folder's README says how they were recorded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.cli import main as cli_main
from tests.conftest import DATA

PAIR = DATA / "sglang-cpu-before-after" / "kv-full"
BEFORE, AFTER = PAIR / "before", PAIR / "after"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_compare_json_reports_the_resolved_finding_and_predicted_vs_realized(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(AFTER), "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["before"]["top"] == "kv_saturation"
    assert doc["before"]["top_suggestion"]["flag"] == "--max-total-tokens"
    assert doc["top_resolved"] and doc["verdict"] in ("improved", "mixed")
    assert "kv_saturation" in {f["rule"] for f in doc["findings"]["resolved"]}
    changed = {c["flag"]: (c["before"], c["after"]) for c in doc["flags_changed"]}
    assert changed["--max-total-tokens"] == (2048, 16384) and changed["pool tokens"] == (2048, 16384)
    assert "--port" not in changed and "--random-seed" not in changed and "--max-total-num-tokens" not in changed
    head = {h["name"]: h for h in doc["headline"]}
    assert head["running"]["after"] > 2 * head["running"]["before"]
    assert head["queued"]["after"] < head["queued"]["before"] and head["queued"]["judgement"] == "better"
    row = next(r for r in doc["suggestions"] if r["flag"] == "--max-total-tokens")
    assert row["applied"] == "applied" and row["finding_resolved"] is True
    checks = {c["number"]: c for c in row["checks"]}
    assert checks["pool_tokens"]["predicted"] == checks["pool_tokens"]["realized"] == 16384
    run = checks["running"]
    assert run["predicted"] > run["before"] and run["realized"] > run["before"] and run["as_predicted"] is True
    assert row["verdict"] == "as predicted"


def test_compare_text_is_readable_at_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(AFTER))
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines()), max(out.splitlines(), key=len)
    assert "Flags changed" in out and "--max-total-tokens: 2048 → 16384" in out
    assert "Resolved" in out and "kv_saturation" in out
    assert "predicted vs realized" in out and "pool_tokens" in out


def test_compare_a_recording_with_itself_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(BEFORE), "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["flags_changed"] == [] and not doc["findings"]["resolved"] and not doc["findings"]["new"]
    assert doc["verdict"] == "no change"
    assert all(r["applied"] == "not applied" and r["verdict"] == "not applied" for r in doc["suggestions"])


def test_a_change_that_makes_things_worse_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """AFTER → BEFORE: the pool shrinks back; kv_saturation is new at warning, so the canary fails."""
    code, out, _ = _run(capsys, "compare", str(AFTER), str(BEFORE), "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "regressed"
    assert "kv_saturation" in {f["rule"] for f in doc["findings"]["new"]}


def test_unreadable_input_is_one_sentence(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _out, err = _run(capsys, "compare", str(tmp_path / "missing.dgb"), str(AFTER))
    assert code == 2 and "Traceback" not in err and err.startswith("diagnose: ") and err.count("\n") == 1


RADIX = DATA / "sglang-cpu-before-after" / "radix-off"


def test_radix_cache_off_under_a_shared_prefix_is_named_and_its_fix_checked(capsys: pytest.CaptureFixture[str]) -> None:
    """low_cache_hit (c) on the real run: from its log alone and from the whole recording; compare then
    finds it resolved and TTFT lower, as the rule's fix says."""
    for argv in (["--log", str(RADIX / "before" / "server.log")], ["--replay", str(RADIX / "before")]):
        code, out, _ = _run(capsys, "--once", *argv, "--format", "json")
        doc = json.loads(out)
        top = next(iter(doc["top"].values()))
        assert code == 1 and top["rule"] == "low_cache_hit", doc["findings"]
        assert top["suggestion"] == {"flag": "--disable-radix-cache", "current": True, "proposed": False}
        f = next(f for f in doc["findings"] if f["rule"] == "low_cache_hit")
        assert "shared prefix" in f["summary"] or "shared prefixes" in f["summary"]
        assert "s = 0.5 half the prefill work" in f["suggestions"][0]["effect"]
    code, out, _ = _run(capsys, "--once", "--replay", str(RADIX / "after"), "--format", "json")
    assert "low_cache_hit" not in {f["rule"] for f in json.loads(out)["findings"]}
    code, out, _ = _run(capsys, "compare", str(RADIX / "before"), str(RADIX / "after"), "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["top_resolved"] and doc["verdict"] == "improved"
    row = next(r for r in doc["suggestions"] if r["flag"] == "--disable-radix-cache")
    assert row["applied"] == "applied" and row["verdict"] == "as predicted"
    ttft = next(h for h in doc["headline"] if h["name"] == "ttft_p95_s")  # shown, not claimed (see FIX_MOVES)
    assert ttft["after"] < ttft["before"] and ttft["judgement"] == "better"
    hit = next(c for c in row["checks"] if c["number"] == "cache_hit")  # what re-enabling the cache does first
    assert hit["predicted_move"] == 1 and hit["before"] == 0.0 and hit["realized"] > 0.9 and hit["as_predicted"]
    assert next(h for h in doc["headline"] if h["name"] == "cache_hit")["judgement"] == "better"


def test_radix_cache_off_on_a_server_that_keeps_up_is_info(capsys: pytest.CaptureFixture[str]) -> None:
    """The same scenario on a quiet machine (real run): prefill 56x the tokens decoded, but TTFT p95 0.20 s
    and a queue in 29 % of the readings. The radix cache is still named, at info (the cost is engine
    time, not waiting), and its change is still the first one; nothing at warning, so exit 0."""
    quiet = DATA / "sglang-cpu-before-after" / "radix-off-quiet" / "before"
    code, out, _ = _run(capsys, "--once", "--replay", str(quiet), "--format", "json", "--ignore-eos")
    doc = json.loads(out)
    f = next(f for f in doc["findings"] if f["rule"] == "low_cache_hit")
    assert code == 0 and f["severity"] == "info" and "Not a warning" in f["summary"], f["summary"]
    top = next(iter(doc["top"].values()))
    assert top["rule"] == "low_cache_hit" and top["suggestion"]["flag"] == "--disable-radix-cache"
    code, out, _ = _run(capsys, "--once", "--replay", str(RADIX / "before"), "--format", "json")
    assert next(f for f in json.loads(out)["findings"] if f["rule"] == "low_cache_hit")["severity"] == "warning"
