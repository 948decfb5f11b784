"""The text report prints a suggestion's unknown current value as unknown, not as "unset"; the JSON keeps None."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

from diagnoser.cli import main as cli_main
from diagnoser.outputs.text import current_text

CASE = Path(__file__).parent / "data" / "cases" / "029-sglang-pr14050-back-to-back-prefills-starve-decode"


def _run(fmt: str, *more: str) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli_main(["--once", "--log", str(CASE / "server.log"), "--format", fmt, *more])
    return buf.getvalue()


def test_current_none_is_unknown_in_text_and_none_in_json() -> None:
    doc = json.loads(_run("json"))
    sugs = [s for f in doc["findings"] for s in f["suggestions"] if s["flag"] == "--chunked-prefill-size"]
    assert sugs and sugs[0]["current"] is None  # the real excerpt does not show the flag
    text = _run("text", "--verbose")
    assert "--chunked-prefill-size unknown (not in the inputs) → 8192" in " ".join(text.split())
    assert " unset → " not in text
    short = " ".join(_run("text").split())  # the default report: one word for it
    assert "--chunked-prefill-size unknown → 8192" in short and " unset → " not in short


def test_a_relative_proposal_never_reads_unknown_to_x_the_current() -> None:
    from diagnoser.outputs.text import change_text

    s = {"flag": "--tp-size", "current": None, "proposed": "2 x the current (more GPUs)", "why": ""}
    assert change_text(s) == change_text(s, short=True) == "--tp-size → 2 x the current (more GPUs)"
    assert change_text({"flag": "--tp-size", "current": 2, "proposed": 4}) == "--tp-size 2 → 4"


def test_current_text_rules() -> None:
    assert current_text({"current": 0.85}) == 0.85
    assert current_text({"current": False}) is False
    assert current_text({"current": None, "why": "x"}) == "unknown (not in the inputs)"
    assert current_text({"current": None, "why": "the flag is at its default", "assumptions": []}) == "unset (default)"
    assert current_text({"current": None, "why": "", "assumptions": ["the server runs at the default"]}) == "unset (default)"
