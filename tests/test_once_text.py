"""The 80-column text report: headline numbers first, per-DP-rank line, errors last (real DP lines of
SGLang PR #7597 as input)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from diagnoser.collect import Collection, finalize
from diagnoser.engines.sglang import ADAPTER
from diagnoser.outputs.report import build
from diagnoser.outputs.text import render
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline


def test_dp_ranks_headline_and_width(data_dir: Path) -> None:
    text = (data_dir / "sglang" / "logs" / "lines_from_issue_threads.txt").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("sglang:gen_throughput{dp_rank")]
    assert len(lines) == 2
    target = "http://a-rather-long-hostname.cluster.example.internal:30000"
    t = MetricsTarget(target, ADAPTER)
    tl = Timeline(target=target)
    assert t.ingest_text("\n".join(lines) + "\n", 1.0, tl)
    finalize(tl, t.state.version)
    col = Collection(timelines=[tl], inputs=[t.report], errors=["http://b:30000/metrics did not answer within the timeout."])
    out = render(build(col, SimpleNamespace(findings=[], errors=[])))
    rows = out.splitlines()
    assert all(len(r) <= 80 for r in rows)
    assert rows[0] == "diagnoser · sglang >=0.4.10,<=0.5.6 · status: OK"
    assert "gen tok/s 772" in rows[4]
    assert "! input: http://b:30000/metrics did not answer" in out.replace("\n", " ").replace("  ", " ")


def test_bad_inputs_say_why_once_and_nothing_else(tmp_path: Path, capsys: object) -> None:
    """Nothing recognised: the report is the input's own sentence, printed once, with no note about
    'what the findings stand on' (there are none); a saved HTML page is named as a file, not a URL."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(256)) * 40)
    html = tmp_path / "m.txt"
    html.write_text("<html><body>Sign in</body></html>\n")
    for args, says in ((["--log", "junk.log"], "No line of junk.log was recognised"),
                       (["--metrics-file", "m.txt"], "m.txt holds an HTML page"),
                       (["--url", "http://127.0.0.1:9", "--duration", "1"], "Could not connect to http://127.0.0.1:9/metrics")):
        r = subprocess.run([sys.executable, "-m", "diagnoser", "--once", *args], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert r.returncode == 2, r
        out = " ".join(r.stdout.split())
        assert "insufficient_data" not in r.stdout, r.stdout
        assert ("top cause: source_unreachable" in r.stdout) == ("--url" in args), r.stdout
        assert out.count(says) == 1, r.stdout  # once: under its input, or as the finding that says it
        assert (f"! {says}" in out) != ("--url" in args), r.stdout
        assert says in r.stderr and "Traceback" not in r.stderr


def test_a_recording_is_counted_by_what_it_holds() -> None:
    """A replayed recording's own input line says what it held (scrapes, log lines), not "0 recognised":
    each input inside it has its own line with what was recognised."""
    from diagnoser.replay import collect_replay

    col = collect_replay(str(Path(__file__).parent.parent / "examples" / "kv-full-retract.dgb"), ADAPTER)
    out = render(build(col, SimpleNamespace(findings=[], errors=[])), verbose=True)  # the inputs in full: --verbose
    flat = " ".join(out.split())
    assert "kv-full-retract.dgb: 20 scrapes and 596 log lines replayed, 0 errors" in flat
    assert "input log server.log: 596 lines, 492 recognised, 0 errors" in flat
