"""The text report prints a suggestion's unknown current value as unknown, not as "unset"; the JSON keeps None."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

from diagnoser.cli import main as cli_main
from diagnoser.outputs.text import current_text

CASE = Path(__file__).parent / "data" / "cases" / "029-sglang-pr14050-back-to-back-prefills-starve-decode"


def _run(fmt: str) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(["--once", "--log", str(CASE / "server.log"), "--format", fmt])
    return buf.getvalue()


def test_current_none_is_unknown_in_text_and_none_in_json() -> None:
    doc = json.loads(_run("json"))
    sugs = [s for f in doc["findings"] for s in f["suggestions"] if s["flag"] == "--chunked-prefill-size"]
    assert sugs and sugs[0]["current"] is None  # the real excerpt does not show the flag
    text = _run("text")
    assert "--chunked-prefill-size unknown (not in the inputs) → 8192" in text.replace("\n      ", " ")
    assert " unset → " not in text


def test_current_text_rules() -> None:
    assert current_text({"current": 0.85}) == 0.85
    assert current_text({"current": False}) is False
    assert current_text({"current": None, "why": "x"}) == "unknown (not in the inputs)"
    assert current_text({"current": None, "why": "the flag is at its default", "assumptions": []}) == "unset (default)"
    assert current_text({"current": None, "why": "", "assumptions": ["the server runs at the default"]}) == "unset (default)"
