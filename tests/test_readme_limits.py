"""README's security section states what is bounded and the limits' values (issue 26): each value in its
two tables ("Bounded input" and "Limits at serve's front door and in fleet mode") is rendered here from
the constant the code uses, so a limit changed in the code and not in the README (or the reverse) fails."""

from __future__ import annotations

import resource

import pytest

from diagnoser.engines.sglang.metrics import MAX_BUCKETS, MAX_NAMES, MAX_RANKS
from diagnoser.fleet.promapi import DEADLINE_GRACE_S, MAX_ANSWER_BYTES
from diagnoser.fleet.source import MAX_TARGETS, PASS_QUERIES, QUERY_TIMEOUT_MIN, WORKERS
from diagnoser.redact import MAX_DEPTH
from diagnoser.sources.http import DEFAULT_MAX_BYTES, MAX_HEADER_LINE, MAX_HEADER_LINES, MAX_REDIRECTS
from diagnoser.sources.metrics import MAX_LABELS, MAX_LINE, MAX_REFERENCE_BYTES, MAX_SAMPLES
from diagnoser.sources.serverinfo import LOADS_MAX_BYTES, MODEL_INFO_MAX_BYTES, SERVER_INFO_MAX_BYTES
from diagnoser.web import door
from tests.conftest import ROOT

MIB, KIB = 2**20, 2**10


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("Bounded input (what a target, a Prometheus or a bundle can make diagnoser hold")
    end = text.index("| one fleet pass |", start)
    return text[start : text.index("\n", end)]


def _mib(n: int) -> str:
    assert n % MIB == 0, n
    return f"{n // MIB} MiB"


def test_the_security_tables_state_the_limits_the_code_uses() -> None:
    s = _section()
    httpcore_head = __import__("httpcore._sync.http11", fromlist=["HTTP11Connection"]).HTTP11Connection.MAX_INCOMPLETE_EVENT_SIZE
    stated = {
        "/metrics body": f"{_mib(DEFAULT_MAX_BYTES)} for `/metrics`",
        "server info": f"{_mib(SERVER_INFO_MAX_BYTES)} server info",
        "model info and loads": f"{MODEL_INFO_MAX_BYTES // MIB}–{LOADS_MAX_BYTES // MIB} MiB model info/loads",
        "a Prometheus answer": f"{_mib(MAX_ANSWER_BYTES)} a Prometheus answer in fleet mode",
        "redirects": f"at most {MAX_REDIRECTS}, and only to the same scheme, host and port",
        "header caps": f"{MAX_HEADER_LINES} lines of {MAX_HEADER_LINE // KIB} KiB; {httpcore_head // KIB} KiB through httpx",
        "a sample line": f"{MAX_LINE // KIB} KiB (bounds a label value); a series with more than {MAX_LABELS} labels is dropped",
        "samples per scrape": f"{MAX_SAMPLES:,} (the reader stops there); the slow reference parser reads at most {_mib(MAX_REFERENCE_BYTES)}",
        "series per target": f"{MAX_RANKS} DP/PP ranks, {MAX_BUCKETS} bucket bounds per histogram, {MAX_NAMES} model/label names",
        "JSON nesting": f"redaction keeps {MAX_DEPTH} levels",
        "head deadline": f"must be in within {door.HEAD_TIMEOUT_S:g} s of the connection (or of the previous answer on a kept-alive one); "
                         f"at most {door.MAX_HEAD_BYTES // KIB} KiB",
        "request deadline": f"{door.REQUEST_TIMEOUT_S:g} s; an idle kept-alive connection is closed after {door.KEEP_ALIVE_S:g} s",
        "connection cap": f"the open-file limit less {door.RESERVED_FDS} files for the process, {door.BACKLOG} for the accept backlog and 2 per target",
        "fleet answers at once": f"at most {WORKERS} read at once",
        "fleet query deadline": f"within `--timeout` (at least {QUERY_TIMEOUT_MIN:g} s) plus {DEADLINE_GRACE_S:g} s",
        "fleet pass": f"{PASS_QUERIES} query deadlines ({PASS_QUERIES * (QUERY_TIMEOUT_MIN + DEADLINE_GRACE_S):g} s at the default `--timeout`)",
        "fleet targets": f"at most {MAX_TARGETS:,} targets",
    }
    missing = {k: v for k, v in stated.items() if v not in s}
    assert not missing, missing


def test_the_stated_connection_cap_at_1024_files_is_the_code_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's worked example of the connection cap (one target at ``ulimit -n 1024``)."""
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (1024, 1024))
    n = door.default_max_connections(1)
    assert f"({n} for one target at `ulimit -n 1024`" in _section(), n
