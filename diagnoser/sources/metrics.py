"""Metrics source: scrape an engine's ``/metrics`` and turn the exposition into signals.

Clean text goes through the adapter's fast path (one regex over the mapped families); text with junk
bytes, or in which the fast path finds nothing, goes through prometheus_client's
``text_string_to_metric_families`` (the reference), which also tells "not Prometheus" from "not SGLang"
and counts the lines it had to skip. A partial last line (an exposition cut off mid-line, or at the size
cap) is dropped and the complete lines before it are used.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from diagnoser.model import InputReport, SignalSink, iso
from diagnoser.sources.http import DEFAULT_MAX_BYTES, Fetched, base_url, display_url, fetch, looks_like_html

# What one scrape can make us hold or parse (the body itself is capped at DEFAULT_MAX_BYTES after
# decompression by sources/http.py). Each cut is counted as an error of the scrape and said once.
MAX_LINE = 16 * 1024  # a sample line longer than this is dropped (bounds a label value and its labels)
MAX_LABELS = 64  # a series with more labels is dropped (SGLang's carry at most about 10)
MAX_SAMPLES = 50_000  # samples used per scrape (a busy 8-rank SGLang exposition has a few thousand)
MAX_REFERENCE_BYTES = 4 * 1024 * 1024  # text handed to the slow reference parser (junk, no fast-path sample)


def drop_long_lines(text: str, limit: int = MAX_LINE) -> tuple[str, int]:
    """``text`` without its lines longer than ``limit`` characters, and how many were dropped."""
    if len(text) <= limit:
        return text, 0
    # cheap test first: a line longer than `limit` covers a whole aligned window of limit/2 characters,
    # so when every such window holds a newline there is none (a few C searches, not a split per scrape)
    half = max(1, limit // 2)
    find = text.find
    if all(find("\n", k, k + half) != -1 for k in range(0, len(text) - half + 1, half)):
        return text, 0
    lines = text.split("\n")
    if max(map(len, lines)) <= limit:
        return text, 0
    kept = [ln for ln in lines if len(ln) <= limit]
    return "\n".join(kept), len(lines) - len(kept)


@dataclass(slots=True)
class ParseResult:
    families: list[Any]
    bad_lines: int = 0
    truncated: bool = False


_JUNK_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
# the same characters, each searched with str's C substring search (30 memchr-like passes over an 80 KB
# exposition cost ~1/30 of the character-class regex, which tests every character in the interpreter)
_JUNK_CHARS = tuple(chr(c) for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, 0xFFFD])


def cut_partial_line(text: str) -> tuple[str, bool]:
    """Drop an incomplete last line (an exposition cut off mid-line); True when something was cut."""
    if not text or text.endswith("\n"):
        return text, False
    cut = text.rfind("\n")
    return (text[: cut + 1] if cut >= 0 else ""), True


def has_junk(text: str) -> bool:
    """Control characters or undecodable bytes: the text is not a clean exposition (same answer as
    ``_JUNK_RE.search``, the reference in the tests)."""
    return any(c in text for c in _JUNK_CHARS)


def parse_exposition(text: str) -> ParseResult:
    """Parse an exposition with prometheus_client; on a parser error, salvage line by line and count
    what was dropped. A partial last line is dropped first."""
    text, truncated = cut_partial_line(text)
    try:
        return ParseResult(list(text_string_to_metric_families(text)), 0, truncated)
    except Exception:
        pass
    good: list[str] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        if has_junk(line):
            bad += 1
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
    label: str = ""  # a saved exposition (``--metrics-file``): its path, shown instead of a URL

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = self.adapter.new_metrics_state()
        if self.label:
            self.report.source = self.label
            return
        self.url = base_url(self.url)
        self.report.source = display_url(self.url)

    @property
    def metrics_url(self) -> str:
        return self.label or self.url + self.adapter.metrics_path

    def ingest_text(self, text: str, ts: float, sink: SignalSink, fetched: Fetched | None = None, *, fast: bool = True) -> bool:
        """Parse and ingest one exposition. Returns False (with ``last_error`` set) if unusable.

        Clean text goes through the adapter's fast path; text with junk bytes, or in which the fast path
        finds nothing, goes through prometheus_client (the reference), which also counts bad lines."""
        shown = display_url(self.metrics_url)
        if (fetched is not None and looks_like_html(fetched)) or _looks_like_html_text(text):
            if self.label and fetched is None:  # a saved file (--metrics-file), not a URL
                return self._fail(f"{shown} holds an HTML page, not Prometheus metrics. Save the SGLang server's own "
                                  "/metrics (e.g. curl http://HOST:30000/metrics > metrics.txt), not a dashboard or login page.")
            return self._fail(f"{shown} returned an HTML page, not Prometheus metrics. Point --url at the SGLang server itself (host:port), not a dashboard or login page.")
        text, truncated = cut_partial_line(text)
        text, long_lines = drop_long_lines(text)
        if long_lines:
            self.report.errors += 1
            self._note(f"{long_lines} line(s) longer than {MAX_LINE // 1024} KiB in the exposition from {shown} were dropped (a label "
                       "value that long is not SGLang's); the rest was used.")
        source = f"scrape@{_iso(ts)}"
        samples = None
        if fast and not has_junk(text):
            samples = self.adapter.fast_samples(text, MAX_SAMPLES + 1)
        if not samples and fetched is not None and fetched.truncated:
            # more than the size cap and nothing SGLang's in it: not an SGLang exposition (SGLang's is about
            # 100 KB), and not worth the line-by-line salvage; not "metrics disabled" either
            after = " after decompression" if "decompression" in fetched.cause else ""
            return self._fail(f"{shown} sent more than {DEFAULT_MAX_BYTES // (1024 * 1024)} MiB{after} with no SGLang sample in it; "
                              "that is not an SGLang exposition (about 100 KB). Check that --url is the SGLang server itself.")
        if not samples:
            if len(text) > MAX_REFERENCE_BYTES:  # the reference parser is slow: read only the first part
                text = text[: text.rfind("\n", 0, MAX_REFERENCE_BYTES) + 1]
                self.report.errors += 1
                self._note(f"The exposition from {shown} is not clean text and over {MAX_REFERENCE_BYTES // (1024 * 1024)} MiB; only "
                           "its first part was read.")
            pr = parse_exposition(text)
            if pr.bad_lines:
                self.report.errors += pr.bad_lines
                self._note(f"{pr.bad_lines} unreadable line(s) in the exposition from {shown} were skipped (binary junk or broken lines); the rest was used.")
            if not pr.families:
                return self._fail(f"{shown} returned no parseable Prometheus metrics. Check that the URL is SGLang's /metrics (e.g. http://HOST:30000).")
            if not self.adapter.is_engine_exposition(pr.families):
                self.is_engine = False
                what = getattr(self.adapter, "foreign_exposition", lambda f: None)(pr.families)
                if what:
                    return self._fail(f"{shown} looks like {what}.")
                return self._fail(f"{shown} serves Prometheus metrics, but none are SGLang's (no sglang:/sglang_ series). Check the port (SGLang's default is 30000) and that SGLang runs with --enable-metrics.")
            samples = self.adapter.samples_from_families(pr.families)
            if not samples:
                self.is_engine = True
                return self._fail(f"{shown} serves sglang series, but none of the scheduler or request metrics diagnoser reads. Point --url at an SGLang server (not the router) started with --enable-metrics.")
        self.is_engine = True
        samples = self._bound_samples(samples, shown)
        if truncated:
            self._note(f"The exposition from {shown} was cut off mid-line; the complete lines before the cut were used.")
        dropped = getattr(self.state, "dropped", 0)
        cut = getattr(self.state, "cut_series", 0)
        used = self.adapter.ingest_samples(samples, ts, sink, self.state, source)
        dropped = getattr(self.state, "dropped", 0) - dropped
        if getattr(self.state, "cut_series", 0) > cut:  # past the engine's cap on ranks or buckets
            self.report.errors += 1
            self._note(f"{shown} sends more series than diagnoser keeps per target (DP/PP ranks or histogram buckets past "
                       "the engine's cap); the extra ones were counted and not used.")
        if dropped:  # impossible values (NaN, ±Inf, negative, a bucket bound that is not a number)
            self.report.errors += dropped
            example = "; ".join(getattr(self.state, "drop_examples", [])[:1])
            self._note(f"Samples with impossible values from {shown} were dropped (NaN, ±Inf, negative, or a bucket le that "
                       f"is not a number; e.g. {example}); the rest was used. Check the server, or a proxy rewriting /metrics.")
        self.report.scrapes += 1
        self.report.lines_recognized += used
        self.consecutive_failures = 0
        self.last_error = ""
        return True

    def _bound_samples(self, samples: list[Any], shown: str) -> list[Any]:
        """At most :data:`MAX_SAMPLES` samples, none with more than :data:`MAX_LABELS` labels; a cut counts
        as one error of the scrape and is said once."""
        if len(samples) > MAX_SAMPLES:
            samples = samples[:MAX_SAMPLES]
            self.report.errors += 1
            self._note(f"{shown} sent more than {MAX_SAMPLES:,} SGLang samples in one scrape; the first {MAX_SAMPLES:,} were used.")
        wide = sum(1 for s in samples if len(s[1]) > MAX_LABELS)
        if wide:
            samples = [s for s in samples if len(s[1]) <= MAX_LABELS]
            self.report.errors += 1
            self._note(f"{wide} series with more than {MAX_LABELS} labels from {shown} were dropped; the rest was used.")
        return samples

    def _note(self, msg: str) -> None:
        if msg not in self.report.messages:
            self.report.messages.append(msg)

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
        return self.take(f, ts, sink, max_bytes, time.perf_counter() - t0), f

    def take(self, f: Fetched, ts: float, sink: SignalSink, max_bytes: int = DEFAULT_MAX_BYTES, duration_s: float = 0.0) -> bool:
        """Ingest one fetched answer (or record its failure); False when it was not usable."""
        self.last_duration_s = duration_s
        if not f.ok:
            return self._fail(f.error)
        if f.truncated:  # a cap tripped: said once, and counted as an error of this scrape
            self.report.errors += 1
            self._note(f.cause or f"The exposition from {display_url(self.metrics_url)} exceeded {max_bytes} bytes and was cut; the complete lines before the cut were used.")
        return self.ingest_text(f.text, ts, sink, f)


def _looks_like_html_text(text: str) -> bool:
    head = text[:512].lstrip().lower()
    return head.startswith("<!doctype html") or head.startswith("<html")


def _iso(ts: float) -> str:
    return iso(ts) or ""
