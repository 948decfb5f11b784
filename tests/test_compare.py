"""``diagnose compare BEFORE AFTER`` on real before/after pairs from the SGLang 0.5.23 CPU engine
(tests/data/sglang-cpu-before-after: kv-full, the KV pool capped at 2,048 tokens, then at the 16,384
diagnoser proposed; radix-off, the radix cache off under a shared prefix, then on; same load each; the
folder's README says how they were recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def test_radix_cache_off_with_prompts_packed_into_full_chunks_names_the_cache(capsys: pytest.CaptureFixture[str]) -> None:
    """The scenario at 32 clients (real run, CI's engine suite): 63 % of the prefill batches computed exactly the
    4,096-token chunk while requests waited, but each batch was about 5.8 whole prompts of 703 tokens packed to the
    chunk size, not one prompt cut into chunks. A larger chunk packs more per step for about the same prefill rate,
    so prefill_stall says so at info, and the cause is the cache that is off (prefill 55x the tokens decoded)."""
    run = DATA / "sglang-cpu-before-after" / "radix-off-32" / "before"
    code, out, _ = _run(capsys, "--once", "--replay", str(run), "--format", "json")
    doc = json.loads(out)
    pf = next(f for f in doc["findings"] if f["rule"] == "prefill_stall")
    assert pf["severity"] == "info" and "fit in one chunk" in pf["summary"] and not pf["suggestions"], pf
    top = next(iter(doc["top"].values()))
    assert code == 1 and top["rule"] == "low_cache_hit" and top["severity"] == "warning"
    assert top["suggestion"]["flag"] == "--disable-radix-cache" and top["suggestion"]["proposed"] is False


# -- the verdict judges the change that was made ----------------------------------------------------------
def _edited_after(tmp_path: Path, edits: dict[str, tuple[Any, Any]]) -> Path:
    """A copy of the real kv-full AFTER run directory with server args rewritten in both places SGLang
    reports them (``get_server_info.json`` and the log's ``server_args=`` line): ``{name: (old, new)}``."""
    import shutil

    dst = tmp_path / "after"
    shutil.copytree(AFTER, dst)
    info = json.loads((dst / "get_server_info.json").read_text())
    log = (dst / "server.log").read_text()
    for name, (old, new) in edits.items():
        assert info[name] == old, (name, info[name])
        info[name] = new
        assert log.count(f"'{name}': {old!r}") == 1, name
        log = log.replace(f"'{name}': {old!r}", f"'{name}': {new!r}")
    (dst / "get_server_info.json").write_text(json.dumps(info))
    (dst / "server.log").write_text(log)
    return dst


def test_the_real_fix_is_improved_though_an_unrelated_hit_rate_fell(capsys: pytest.CaptureFixture[str]) -> None:
    """kv-full: the pool change resolved kv_saturation and moved the pool and the running batch as predicted,
    while the prefix-cache hit rate (unique prompts: nothing to share) fell 6.2 % -> 1.1 % (each prefill
    line's cached tokens over its own new tokens). That fall is reported, in points, and is not part of
    the verdict (it read MIXED)."""
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(AFTER), "--format", "json")
    doc = json.loads(out)
    assert doc["verdict"] == "improved", doc["verdict_basis"]
    basis = doc["verdict_basis"]
    assert basis["applied"] == ["--max-total-tokens"] and basis["other_flags"] == []
    assert "kv_saturation resolved" in basis["reasons"]
    assert any(r.startswith("pool tokens 2,048 → 16,384 as predicted") for r in basis["reasons"]), basis["reasons"]
    hit = next(h for h in doc["headline"] if h["name"] == "cache_hit")
    assert hit["judgement"] == "worse" and hit["change"] is None
    assert hit["change_points"] == pytest.approx((hit["after"] - hit["before"]) * 100) and -6 < hit["change_points"] < -4
    assert "cache_hit" in basis["other_movements"] and "running" not in basis["other_movements"]
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(AFTER))
    assert out.splitlines()[0] == "diagnoser compare · SGLang 0.5.23 · verdict: IMPROVED"  # the engine and its version first
    assert "not in the verdict: prefix cache hit rate 6.2% → 1.1% (-5.0 pt)" in out
    row = next(line for line in out.splitlines() if line.lstrip().startswith("prefix cache hit rate"))
    assert "-5.0 pt" in row and "%" not in row.split("1.1%")[1], row  # points, not "-81 %"


def test_a_suggestion_not_applied_is_not_judged_as_predicted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """AFTER keeps --max-total-tokens 2048 in its args and changes --mem-fraction-static instead (a built
    case from the real pair): the numbers still moved the suggestion's way, but nobody applied it, so none
    of its checks says "as predicted"; the verdict follows the findings and says no suggestion was applied."""
    after = _edited_after(tmp_path, {"max_total_tokens": (16384, 2048), "mem_fraction_static": (0.716, 0.8)})
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(after), "--format", "json")
    doc = json.loads(out)
    row = next(r for r in doc["suggestions"] if r["flag"] == "--max-total-tokens")
    assert row["applied"] == "not applied" and row["verdict"] == "not applied"
    assert all(c["as_predicted"] is None for c in row["checks"]), row["checks"]
    assert any(c["realized_move"] == c["predicted_move"] == 1 for c in row["checks"])  # it moved, and is still not claimed
    basis = doc["verdict_basis"]
    assert basis["applied"] == [] and doc["verdict"] == "improved"  # the findings resolved, whatever did it
    assert any("no suggestion made on BEFORE was applied (changed: --mem-fraction-static" in r for r in basis["reasons"]), basis
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(after))
    assert "--mem-fraction-static: 0.716 → 0.8" in out  # a flag's value as set, not rounded
    section = out.split("Suggestions made on BEFORE")[1]
    assert "not applied" in section and "yes" not in section and "as predicted" not in section.split("\n", 1)[1], section


def test_another_flag_changed_with_the_suggestion_is_said(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    after = _edited_after(tmp_path, {"schedule_conservativeness": (1.0, 1.3)})
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(after), "--format", "json")
    doc = json.loads(out)
    basis = doc["verdict_basis"]
    assert basis["applied"] == ["--max-total-tokens"] and basis["other_flags"] == ["--schedule-conservativeness"]
    assert any(r.startswith("also changed, not suggested: --schedule-conservativeness") for r in basis["reasons"])
    assert doc["verdict"] == "improved"


def _row(rule: str, resolved: bool | None, *oks: bool | None, applied: str = "applied") -> dict[str, Any]:
    checks = [{"number": "running", "before": 7.0, "predicted": 40.0, "realized": 35.0 if ok else 5.0, "predicted_move": 1,
               "realized_move": 1 if ok else -1, "as_predicted": ok} for ok in oks]
    return {"rule": rule, "flag": "--max-total-tokens", "applied": applied, "finding_resolved": resolved, "checks": checks}


def _finding(rule: str, sev: str = "warning") -> dict[str, Any]:
    return {"rule": rule, "severity": sev}


NONE_CHANGED: list[dict[str, Any]] = [{"flag": "--max-total-tokens", "kind": "server arg"}]


@pytest.mark.parametrize(("rows", "findings", "verdict"), [
    ([_row("kv_saturation", True, True)], {"resolved": [_finding("kv_saturation")], "persisting": [], "new": []}, "improved"),
    ([_row("kv_saturation", True, False)], {"resolved": [_finding("kv_saturation")], "persisting": [], "new": []}, "mixed"),
    ([_row("kv_saturation", False, True)], {"resolved": [], "persisting": [_finding("kv_saturation")], "new": []}, "mixed"),
    ([_row("kv_saturation", False, False)], {"resolved": [], "persisting": [_finding("kv_saturation")], "new": []}, "not improved"),
    ([_row("kv_saturation", None)], {"resolved": [], "persisting": [], "new": []}, "not judged"),
    ([_row("kv_saturation", True, True)], {"resolved": [_finding("kv_saturation")], "persisting": [],
                                            "new": [_finding("prefill_stall")]}, "regressed"),
    # an info finding that is new is no regression; one that stayed does not spoil an applied fix
    ([_row("kv_saturation", True, True)], {"resolved": [_finding("kv_saturation")], "persisting": [_finding("low_batch_occupancy", "info")],
                                            "new": [_finding("client_bound", "info")]}, "improved"),
    # a compound limit: BEFORE's kv_saturation gave the pool first and the slot cap that binds after it; the
    # cap's finding appearing after the pool change alone is that projection coming true, not a regression
    ([_row("kv_saturation", True, True), _row("kv_saturation", None, applied="not applied") | {"flag": "--max-running-requests"}],
     {"resolved": [_finding("kv_saturation")], "persisting": [],
      "new": [_finding("max_running_requests_cap") | {"flags": ["--max-running-requests"]}]}, "improved"),
    # the same new finding with a change BEFORE never named is a regression
    ([_row("kv_saturation", True, True)], {"resolved": [_finding("kv_saturation")], "persisting": [],
                                            "new": [_finding("max_running_requests_cap") | {"flags": ["--max-running-requests"]}]}, "regressed"),
    # nothing applied: the findings at warning or above decide
    ([_row("kv_saturation", None, True, applied="not applied")], {"resolved": [_finding("kv_saturation")], "persisting": [], "new": []},
     "improved"),
    ([], {"resolved": [_finding("kv_saturation")], "persisting": [_finding("queue_buildup")], "new": []}, "mixed"),
    ([], {"resolved": [_finding("kv_retraction", "info")], "persisting": [], "new": []}, "no change"),
])
def test_the_verdict_rests_on_the_applied_suggestions_and_the_findings(rows: list[dict[str, Any]], findings: dict[str, Any],
                                                                       verdict: str) -> None:
    from diagnoser.outputs.compare import headline_rows, judge

    # every headline number moved, some the wrong way: none of it may change the verdict
    hb = {"running": 7.0, "queued": 30.0, "kv_usage": 0.5, "gen_tps": 265.0, "ttft_p95_s": 5.0, "cache_hit": 0.06, "retractions": 2.0,
          "out_tps": 160.0}
    ha = {"running": 35.0, "queued": 40.0, "kv_usage": 0.2, "gen_tps": 100.0, "ttft_p95_s": 50.0, "cache_hit": 0.01, "retractions": 9.0,
          "out_tps": 60.0}
    j = judge(rows, findings, NONE_CHANGED, headline_rows(hb, ha))
    assert j["verdict"] == verdict, j
    assert "gen_tps" in j["other_movements"] and "cache_hit" in j["other_movements"]
    if any(r["applied"] == "applied" and r["checks"] and r["checks"][0]["as_predicted"] is not None for r in rows):
        assert "running" not in j["other_movements"]  # judged as the check of an applied suggestion


def test_rates_change_in_points_and_small_moves_of_a_rate_are_no_movement() -> None:
    from diagnoser.outputs.compare import _change, headline_rows

    base = {"running": 7.0, "queued": 0.0, "kv_usage": 0.027, "gen_tps": 100.0, "ttft_p95_s": 1.0, "cache_hit": 0.027, "retractions": 0.0,
            "out_tps": 100.0}
    heads = {h["name"]: h for h in headline_rows(base, {**base, "kv_usage": 0.031, "cache_hit": 0.031, "gen_tps": 116.0})}
    hit = heads["cache_hit"]
    assert hit["change"] is None and hit["change_points"] == pytest.approx(0.4) and hit["move"] == 0 and hit["judgement"] is None
    assert _change(hit) == "+0.4 pt"  # not "+15 %"
    assert heads["kv_usage"]["change_points"] == pytest.approx(0.4)
    assert heads["gen_tps"]["change"] == pytest.approx(0.16) and heads["gen_tps"]["judgement"] == "better"  # a throughput stays relative
    heads = {h["name"]: h for h in headline_rows(base, {**base, "cache_hit": 0.9})}
    assert heads["cache_hit"]["judgement"] == "better" and _change(heads["cache_hit"]) == "+87 pt"


def test_a_suggestion_taken_part_of_the_way_is_judged(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """AFTER's args say --max-total-tokens 8192 (built from the real pair): towards the proposed 16384 from
    2048, so it counts as applied in part, and its numbers are checked."""
    after = _edited_after(tmp_path, {"max_total_tokens": (16384, 8192)})
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(after), "--format", "json")
    doc = json.loads(out)
    row = next(r for r in doc["suggestions"] if r["flag"] == "--max-total-tokens")
    assert row["applied"] == "partly (same direction)" and row["after"] == 8192
    assert row["verdict"] != "not applied" and any(c["as_predicted"] is not None for c in row["checks"])
    assert doc["verdict_basis"]["applied"] == ["--max-total-tokens"]
    code, out, _ = _run(capsys, "compare", str(BEFORE), str(after))
    assert "partly (same direction) [AFTER has 8192]" in " ".join(out.split())


def test_a_warning_the_change_did_not_address_is_said_beside_the_verdict() -> None:
    from diagnoser.outputs.compare import judge

    rows = [_row("kv_saturation", True, True)]
    findings = {"resolved": [_finding("kv_saturation")], "persisting": [_finding("prefill_stall")], "new": []}
    j = judge(rows, findings, NONE_CHANGED, [])
    assert j["verdict"] == "improved"  # the change did what it was for
    assert "still there, not what the change addressed: prefill_stall (warning)" in j["reasons"]
