"""Stable JSON: every JSON report validates against diagnoser/schema/report.schema.json (JSON Schema
2020-12, checked with the jsonschema library): the bundled recordings, every golden case's real log,
single real scrapes, an input with nothing usable, and `diagnose record`'s report; `plan` and `compare`
validate against the schema's $defs for them."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from diagnoser.cli import main as cli_main
from diagnoser.outputs.report import SCHEMA_VERSION

ROOT = Path(__file__).parent.parent
DATA = ROOT / "tests" / "data"
CASES = sorted(p for p in (DATA / "cases").iterdir() if (p / "server.log").is_file())


def schema() -> dict[str, Any]:
    return json.loads((resources.files("diagnoser") / "schema" / "report.schema.json").read_text())


def validator(defn: str | None = None) -> jsonschema.Draft202012Validator:
    s = schema()
    if defn:
        s = {"$schema": s["$schema"], "$ref": f"#/$defs/{defn}", "$defs": s["$defs"]}
    return jsonschema.Draft202012Validator(s)


def json_of(*argv: str) -> dict[str, Any]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main([*argv, "--format", "json"])
    return json.loads(buf.getvalue())


def check(doc: dict[str, Any], defn: str | None = None) -> None:
    errors = sorted(validator(defn).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5]]


def test_the_schema_is_a_valid_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    assert schema()["properties"]["schema_version"]["pattern"] == "^1\\.[0-9]+$" and SCHEMA_VERSION.startswith("1.")


@pytest.mark.parametrize("bundle", sorted((ROOT / "examples").glob("*.dgb")), ids=lambda p: p.name)
def test_reports_of_the_bundled_recordings_validate(bundle: Path) -> None:
    doc = json_of("--once", "--replay", str(bundle))
    check(doc)
    assert doc["schema_version"] == SCHEMA_VERSION
    if doc["findings"]:
        target = doc["findings"][0]["target"]
        assert doc["findings"][0]["rule"] == doc["top"][target]["rule"]  # findings[0] is the top cause
    assert {c["rule"] for c in doc["checked"]} >= {"kv_saturation", "queue_buildup", "insufficient_data"}


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name[:12])
def test_reports_of_every_golden_case_validate(case: Path) -> None:
    check(json_of("--once", "--log", str(case / "server.log")))


def test_single_scrapes_and_nothing_usable_validate(tmp_path: Path) -> None:
    for prom in sorted((DATA / "sglang" / "metrics").glob("*.prom")):
        check(json_of("--once", "--metrics-file", str(prom)))
    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(256)) * 8)
    doc = json_of("--once", "--log", str(junk))
    assert doc["status"] == "error"
    check(doc)


def test_a_wrong_document_fails_the_schema() -> None:
    """The schema can fail: a document missing a key, with an unknown status or a bad finding."""
    doc = json_of("--once", "--replay", str(ROOT / "examples" / "kv-full-retract.dgb"))
    for broken in ({k: v for k, v in doc.items() if k != "checked"}, {**doc, "status": "fine"},
                   {**doc, "findings": [{**doc["findings"][0], "severity": "bad"}]}, {**doc, "schema_version": 1}):
        assert list(validator().iter_errors(broken)), broken.keys()


def test_plan_and_compare_validate() -> None:
    cfg = ROOT / "tests" / "capacity_configs" / "llama-3.1-8b.json"
    check(json_of("plan", "--model-config", str(cfg), "--tp", "1", "--gpu-mem-gb", "80"), "plan")
    ex = ROOT / "examples"
    check(json_of("compare", str(ex / "kv-full-retract.dgb"), str(ex / "prefill-capped.dgb")), "compare")
