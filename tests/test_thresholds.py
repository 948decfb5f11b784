"""Thresholds: per-rule defaults, a TOML file ([rules.NAME]) and --set on the command line (CLI wins)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.cli import main as cli_main
from diagnoser.rules import REGISTRY
from diagnoser.thresholds import load_thresholds

CASES = Path(__file__).parent / "data" / "cases"


def test_toml_and_set_merge_with_cli_winning(tmp_path: Path) -> None:
    cfg = tmp_path / "t.toml"
    cfg.write_text('[rules.kv_saturation]\nusage_high = 0.9\nmin_share = 0.5\n\n[rules.queue_buildup]\nhealthy_max = 1000\n')
    th = load_thresholds(str(cfg), ["kv_saturation.usage_high=0.97", "low_batch_occupancy.small_batch=4"])
    assert th == {"kv_saturation": {"usage_high": 0.97, "min_share": 0.5}, "queue_buildup": {"healthy_max": 1000},
                  "low_batch_occupancy": {"small_batch": 4}}
    assert isinstance(th["low_batch_occupancy"]["small_batch"], int)


def test_unknown_key_lists_the_valid_keys() -> None:
    with pytest.raises(ValueError) as e:
        load_thresholds(None, ["kv_saturation.usage=0.9"])
    msg = str(e.value)
    assert "unknown threshold kv_saturation.usage" in msg
    for k in REGISTRY[0].defaults:
        assert k in msg


def test_unknown_rule_bad_value_and_bad_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown rule 'nope'; valid rules: .*kv_saturation"):
        load_thresholds(None, ["nope.x=1"])
    with pytest.raises(ValueError, match="must be a number"):
        load_thresholds(None, ["kv_saturation.usage_high=high"])
    with pytest.raises(ValueError, match="must look like RULE.KEY=VALUE"):
        load_thresholds(None, ["usage_high=0.9"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[rules.kv_saturation\n")
    with pytest.raises(ValueError, match="is not valid TOML"):
        load_thresholds(str(bad), None)
    with pytest.raises(ValueError, match="does not exist"):
        load_thresholds(str(tmp_path / "missing.toml"), None)


def test_every_default_is_overridable_by_name() -> None:
    for rule in REGISTRY:
        for key, value in rule.defaults.items():
            got = load_thresholds(None, [f"{rule.name}.{key}={value}"])
            assert got[rule.name][key] == value


def test_a_threshold_changes_the_verdict_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """Case 009: the eager share is 25 %; raising eager_share to 0.3 turns the warning into info."""
    log = str(CASES / "009-sglang-pr13023-cuda-graph-off-above-max-bs" / "server.log")
    rc = cli_main(["--once", "--log", log, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    sev = {f["rule"]: f["severity"] for f in doc["findings"]}
    assert rc == 1 and sev["cuda_graph_disabled_or_exceeded"] == "warning"
    rc = cli_main(["--once", "--log", log, "--format", "json", "--set", "cuda_graph_disabled_or_exceeded.eager_share=0.3"])
    doc = json.loads(capsys.readouterr().out)
    sev = {f["rule"]: f["severity"] for f in doc["findings"]}
    assert rc == 0 and sev["cuda_graph_disabled_or_exceeded"] == "info"


def test_unknown_key_on_the_cli_is_one_sentence_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    log = str(CASES / "009-sglang-pr13023-cuda-graph-off-above-max-bs" / "server.log")
    rc = cli_main(["--once", "--log", log, "--set", "kv_saturation.bogus=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "valid keys for kv_saturation" in err and "Traceback" not in err
