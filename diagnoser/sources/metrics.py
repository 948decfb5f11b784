"""Metrics source: scrape an engine's ``/metrics`` and turn the exposition into signals.

Parsing uses prometheus_client's ``text_string_to_metric_families``. A truncated exposition keeps its
complete lines; lines the parser rejects are skipped and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from diagnoser.model import InputReport, SignalSink, iso
from diagnoser.sources.http import DEFAULT_MAX_BYTES, Fetched, base_url, display_url, fetch, looks_like_html


@dataclass(slots=True)
class ParseResult:
    families: list[Any]
    bad_lines: int = 0
    truncated: bool = False


def parse_exposition(text: str) -> ParseResult:
    """Parse an exposition; on a parser error, salvage line by line and count what was dropped."""
    truncated = bool(text) and not text.endswith("\n")
    if truncated:
        cut = text.rfind("\n")
        text = text[: cut + 1] if cut >= 0 else ""
    try:
        return ParseResult(list(text_string_to_metric_families(text)), 0, truncated)
    except Exception:
        pass
    good: list[str] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
            good.append(line)
        except Exception:
            bad += 1
    try:
        fams = list(text_string_to_metric_families("\n".join(good) + "\n"))
    except Exception:
        fams = []
    return ParseResult(fams, bad, truncated)


@dataclass(slots=True)
class MetricsTarget:
    """One scraped endpoint: its URL, adapter state between ticks and its input report."""

    url: str
    adapter: Any
    state: Any = None
    report: InputReport = field(default_factory=lambda: InputReport(kind="metrics", source=""))
    last_error: str = ""
    last_duration_s: float = 0.0
    consecutive_failures: int = 0
    is_engine: bool | None = None

    def __post_init__(self) -> None:
        self.url = base_url(self.url)
        if self.state is None:
            self.state = self.adapter.new_metrics_state()
        self.report.source = display_url(self.url)

    @property
    def metrics_url(self) -> str:
        return self.url + self.adapter.metrics_path

    def ingest_text(self, text: str, ts: float, sink: SignalSink, fetched: Fetched | None = None) -> bool:
        """Parse and ingest one exposition. Returns False (with ``last_error`` set) if unusable."""
        shown = display_url(self.metrics_url)
        if fetched is not None and looks_like_html(fetched):
            return self._fail(f"{shown} returned an HTML page, not Prometheus metrics. Point --url at the SGLang server itself (host:port), not a dashboard or login page.")
        pr = parse_exposition(text)
        if pr.bad_lines:
            self.report.errors += pr.bad_lines
        if pr.truncated:
            self.report.messages.append(f"The exposition from {shown} was cut off mid-line; the complete lines before the cut were used.")
        if not pr.families:
            return self._fail(f"{shown} returned no parseable Prometheus metrics. Check that the URL is SGLang's /metrics.")
        if not self.adapter.is_engine_exposition(pr.families):
            self.is_engine = False
            return self._fail(f"{shown} serves Prometheus metrics, but none are SGLang's (no sglang:/sglang_ series). Check the port (SGLang's default is 30000) and --enable-metrics.")
        self.is_engine = True
        used = self.adapter.ingest_families(pr.families, ts, sink, self.state, f"scrape@{_iso(ts)}")
        self.report.scrapes += 1
        self.report.lines_recognized += used
        self.consecutive_failures = 0
        self.last_error = ""
        return True

    def _fail(self, msg: str) -> bool:
        self.last_error = msg
        self.report.errors += 1
        self.consecutive_failures += 1
        if msg not in self.report.messages:
            self.report.messages.append(msg)
        return False

    def scrape(self, client: Any, sink: SignalSink, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bool, Fetched]:
        t0 = time.perf_counter()
        ts = time.time()
        f = fetch(client, self.metrics_url, max_bytes, "metrics")
        self.last_duration_s = time.perf_counter() - t0
        if not f.ok:
            return self._fail(f.error), f
        if f.truncated:
            self.report.messages.append(f"The exposition from {display_url(self.metrics_url)} exceeded {max_bytes} bytes and was cut; raise --max-bytes if this is expected.")
        return self.ingest_text(f.text, ts, sink, f), f


def _iso(ts: float) -> str:
    return iso(ts) or ""
