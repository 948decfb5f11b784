"""Collect inputs into timelines: scrape URLs for a window, read logs, fetch config.

This is the glue between sources and the timeline; it knows nothing about rules or outputs.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from diagnoser.engines.sglang.versions import VersionRange, newest_on
from diagnoser.model import InputReport, iso
from diagnoser.sources.logs import LogReader, read_log
from diagnoser.timeline import Timeline


@dataclass(slots=True)
class Collection:
    timelines: list[Timeline] = field(default_factory=list)
    inputs: list[InputReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    versions: dict[str, VersionRange] = field(default_factory=dict)  # target → range
    unreachable: dict[str, str] = field(default_factory=dict)  # target → last error
    raw_config: dict[str, dict[str, Any]] = field(default_factory=dict)

    def usable(self) -> bool:
        """Something a rule can judge: signals or log events, or config from a log. Config from server
        info alone, with no /metrics scrape (e.g. SGLang without --enable-metrics), is not."""
        return any(tl.series or tl.events or (tl.config and not tl.meta.get("unreachable")) for tl in self.timelines)


@dataclass(slots=True)
class LogOptions:
    """How a one-shot run reads its logs. ``max_points`` / ``last_s``: keep only the window it judges
    while reading (:class:`diagnoser.timeline.window.LogWindow`; None and None keep every point, as a
    library caller gets by default); ``progress(reader)`` is called after each chunk of a big log."""

    max_points: int | None = None
    last_s: float | None = None
    progress: Callable[[LogReader], None] | None = None


def read_log_into(adapter: Any, tl: Timeline, path: str, stdin: IO[bytes] | None = None, options: LogOptions | None = None) -> LogReader:
    """:func:`read_log` into ``tl``, kept to the window ``options`` asks for (its report says what was judged)."""
    opts = options or LogOptions()
    keeper = None
    if opts.max_points is not None or opts.last_s is not None:
        from diagnoser.timeline.window import LogWindow

        keeper = LogWindow(tl, opts.max_points, opts.last_s)
    progress = opts.progress
    observer: Callable[[LogReader], None] | None
    if keeper is not None and progress is not None:
        def observer(reader: LogReader) -> None:
            keeper.observe(reader)
            progress(reader)
    else:
        observer = keeper.observe if keeper is not None else progress
    reader = read_log(adapter, tl, path, stream=stdin if path == "-" else None, observer=observer)
    if keeper is not None:
        keeper.finish()
        if keeper.trimmed:
            reader.report.window = tl.meta["log_window"] = keeper.summary()
            msg = keeper.message("stdin" if reader.report.source == "-" else reader.report.source)
            if msg:
                reader.report.messages.insert(0, msg)
    return reader


def finalize(tl: Timeline, version: VersionRange) -> None:
    """Sort the series, aggregate ranks, settle the version and derived config facts."""
    tl.settle()
    tl.aggregate_ranks()
    v = tl.cfg("version")
    if v:
        from diagnoser.engines.sglang.versions import parse_version

        pv = parse_version(str(v))
        if pv:
            version.set_exact(pv, "server info")
    date_bound(tl, version)
    tl.version = text = version.text()
    tl.meta["version_best"] = list(version.best()) if version.known else None
    tl.meta["version_reasons"] = list(version.reasons or [])
    if version.known:  # the detected version or range, with the evidence as its source
        why = version.reasons or []
        exact = [r for r in why if r.startswith("= ")]
        tl.set_config("version_detected", text, exact[-1] if version.exact and exact else "; ".join(why[-3:]))
    if version.conflicts:
        tl.set_config("version_conflicts", list(version.conflicts), "hints that contradicted stronger evidence (ignored)")
    # a pool size read from a series also counts as a config fact
    if "max_total_tokens" not in tl.config:
        s = tl.get("max_total_tokens")
        if s is not None and math.isfinite(s.last_value()):
            tl.set_config("max_total_tokens", int(s.last_value()), s.last_source())
    if "max_total_tokens" not in tl.config and "kv_pool_tokens_log" in tl.config:
        f = tl.config["kv_pool_tokens_log"]
        tl.set_config("max_total_tokens", f.value, f.source)


def log_facts(tl: Timeline, parser: Any) -> None:
    """What a log's parser learnt beyond its lines' values: the first date (version bound) and the
    device its batch lines name (``cpu graph`` / ``npu graph``)."""
    if getattr(parser, "first_stamp", None):
        tl.meta.setdefault("first_stamp", parser.first_stamp)
    labels = getattr(parser, "graph_labels", set())
    for dev in ("cpu", "npu", "musa"):
        if dev in labels:
            tl.set_config("device", dev, f"the '{dev} graph' field of the batch lines", override=False)


# memoised for date_bound: a fleet's targets mostly start at one time (iso and newest_on cost more than a
# lookup): time → day, day → (the newest version then, the reason) or None
_DAYS: dict[float, str] = {}
_NEWEST: dict[str, Any] = {}


def date_bound(tl: Timeline, version: VersionRange) -> None:
    """The earliest time read bounds the version from above: a release published after it cannot have
    printed it (a development build is at most the next release)."""
    if tl.untimed or version.exact or tl.engine != "sglang":  # the release dates are SGLang's
        return
    day = tl.meta.get("first_stamp")  # a log's first dated line (its span may hold no point)
    if not day:
        start, _ = tl.span()
        if start is None or start != start:
            return
        day = _DAYS.get(start)
        if day is None:
            day = (iso(start) or "")[:10]
            if len(_DAYS) > 4096:
                _DAYS.clear()
            _DAYS[start] = day
    bound = _NEWEST.get(day, _NEWEST)  # (the dict itself: not looked up yet)
    if bound is _NEWEST:
        got = newest_on(day)
        bound = None if got is None else (got[0], f"the inputs start on {day}, before {'.'.join(map(str, got[0]))} was released "
                                                  f"({got[1]}) or while it was in development")
        if len(_NEWEST) > 4096:
            _NEWEST.clear()
        _NEWEST[day] = bound
    if bound is not None:
        version.at_most(*bound)


def collect_logs(adapter: Any, paths: list[str], stdin: IO[bytes] | None = None, target: str | None = None,
                 options: LogOptions | None = None) -> Collection:
    col = Collection()
    for path in paths:
        tl = Timeline(target=target or path)
        reader = read_log_into(adapter, tl, path, stdin, options)
        tl.inputs.append(reader.report)
        col.inputs.append(reader.report)
        tl.untimed = bool(reader.parser.untimed_lines) and not reader.parser.saw_date and reader.parser.untimed_lines >= reader.report.lines_recognized
        log_facts(tl, reader.parser)
        version = reader.parser.version
        finalize(tl, version)
        col.versions[tl.target] = version
        col.timelines.append(tl)
    return col


def collect_files(adapter: Any, metrics_files: list[str], logs: list[str], stdin: IO[bytes] | None = None,
                  options: LogOptions | None = None) -> Collection:
    """Saved ``/metrics`` expositions (``--metrics-file``; ``-`` is stdin), as successive scrapes of one
    target at the files' modification times (a second apart when those do not increase), with the logs
    of that target. A file that cannot be read is one clear error; the others are still read."""
    import os

    from diagnoser.sources.metrics import MetricsTarget

    col = Collection()
    tl = Timeline(target=metrics_files[0] if len(metrics_files) == 1 else f"{metrics_files[0]} (+{len(metrics_files) - 1} more)")
    target = MetricsTarget("", adapter, label=metrics_files[0])
    version = VersionRange()
    prev: float | None = None
    for path in metrics_files:
        try:
            if path == "-":
                raw = (stdin or sys.stdin.buffer).read()
                ts = time.time()
            else:
                with open(path, "rb") as fh:
                    raw = fh.read()
                ts = os.path.getmtime(path)
        except OSError as e:
            msg = f"cannot read the metrics file {path} ({e.strerror or e}); pass a saved /metrics exposition (curl http://HOST:30000/metrics > metrics.txt)."
            col.errors.append(msg)
            target.report.errors += 1
            target.report.messages.append(msg)
            continue
        if prev is not None and ts <= prev:
            ts = prev + 1.0
        prev = ts
        target.label = path
        target.ingest_text(raw.decode("utf-8", errors="replace"), ts, tl)
    target.label = metrics_files[0]
    tl.inputs.append(target.report)
    col.inputs.append(target.report)
    version.merge(target.state.version)
    wq = getattr(adapter, "window_quantiles", None)
    if wq is not None and target.report.scrapes > 1:
        tl.meta["window_quantiles"] = wq(target.state)
    for path in logs:
        reader = read_log_into(adapter, tl, path, stdin, options)
        tl.inputs.append(reader.report)
        col.inputs.append(reader.report)
        version.merge(reader.parser.version)
        log_facts(tl, reader.parser)
    finalize(tl, version)
    col.versions[tl.target] = version
    col.timelines.append(tl)
    return col


GRACE_S = 0.5  # a request's thread gets this long past its deadline to hand its (failed) answer back


def in_threads(jobs: list[Callable[[], Any]], until: float, every: Callable[[], None] | None = None) -> list[tuple[bool, Any]]:
    """Run each job in a daemon thread and wait for all of them, but not past ``until``
    (``time.monotonic()``): ``(done, result)`` per job. A job still running then is abandoned (it cannot
    stop the process from exiting); its late result is dropped. An exception is the job's result.
    ``every`` is called about four times a second while waiting (a progress line)."""
    import threading

    out: list[tuple[bool, Any]] = [(False, None)] * len(jobs)

    def run(i: int, job: Callable[[], Any]) -> None:
        try:
            out[i] = (True, job())
        except Exception as e:  # noqa: BLE001 — handed to the caller as the job's result
            out[i] = (True, e)

    threads = [threading.Thread(target=run, args=(i, j), name="diagnoser-fetch", daemon=True) for i, j in enumerate(jobs)]
    for th in threads:
        th.start()
    for th in threads:
        while th.is_alive() and time.monotonic() < until:
            th.join(min(0.25, max(0.0, until - time.monotonic())) if every else max(0.0, until - time.monotonic()))
            if every is not None:
                every()
    return list(out)


def collect_once(
    adapter: Any,
    urls: list[str],
    logs: list[str],
    duration: float = 10.0,
    interval: float = 2.0,
    client: Any = None,
    stdin: IO[bytes] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[dict[str, Any]], None] | None = None,
    log_options: LogOptions | None = None,
    timeout: float | None = None,
) -> Collection:
    """Scrape every URL each ``interval`` for ``duration`` seconds and read the logs once.

    With one URL, the logs belong to that target; with several, each log is a target of its own.
    ``progress`` (a terminal's status line) is called after each round of scrapes and about every second
    while waiting, with ``scrapes`` done ``of`` the rounds, ``elapsed_s`` of ``duration_s``, and how many
    of the ``targets`` are ``failing`` (their last scrape failed). ``log_options``: the window the logs
    are kept to, and their reading progress (:class:`LogOptions`).

    Bounded in time whatever the servers do: the config endpoints of every target get ``2 × timeout``
    together, each scrape ``timeout`` for the whole request (each target is scraped on its own schedule,
    in its own thread), and no scrape starts after the sampling window, so the run ends within about
    ``2 × timeout + duration + timeout`` even against a server that trickles its answers.
    """
    col = Collection()
    if not urls:
        return collect_logs(adapter, logs, stdin, options=log_options)

    from diagnoser.sources.http import (
        DEFAULT_MAX_BYTES,
        Fetched,
        client_timeout,
        fetch,
        make_client,
        too_slow,
    )
    from diagnoser.sources.metrics import MetricsTarget
    from diagnoser.sources.serverinfo import fetch_config

    own_client = client is None
    client = client or make_client(**({"timeout": timeout} if timeout else {}))
    timeout = float(timeout or client_timeout(client))
    try:
        targets = [MetricsTarget(u, adapter) for u in urls]
        tls = {t.url: Timeline(target=t.report.source) for t in targets}
        ranges = {t.url: VersionRange() for t in targets}
        # config: every target at once, each into a scratch timeline merged when it came back in time
        cfg_until = time.monotonic() + 2 * timeout
        scratch = {t.url: (Timeline(target=t.report.source), VersionRange()) for t in targets}
        answers = in_threads([lambda t=t: fetch_config(client, t.url, adapter, *scratch[t.url], deadline=cfg_until)  # type: ignore[misc]
                              for t in targets], cfg_until + GRACE_S)
        for t, (done, res) in zip(targets, answers, strict=True):
            if not done or isinstance(res, BaseException):
                continue
            rep, raw = res
            tl, rng = scratch[t.url]
            tls[t.url].config.update(tl.config)
            ranges[t.url].merge(rng)
            col.raw_config[t.report.source] = raw
            if rep.scrapes:
                tls[t.url].inputs.append(rep)
                col.inputs.append(rep)
        n = max(1, int(round(duration / interval)) + 1) if duration > 0 and interval > 0 else 1
        start = time.monotonic()
        sampling_end = start + duration
        # each target on its own schedule in its own thread (a slow one never delays the others'
        # samples); what comes back is ingested here, in order, once every thread is done or given up
        fetched: dict[str, list[tuple[float, Fetched, float]]] = {t.url: [] for t in targets}

        def sample(t: MetricsTarget) -> None:
            got = fetched[t.url]
            for i in range(n):
                wait = start + i * interval - time.monotonic()
                if wait > 0:
                    sleep(wait)
                t0 = time.monotonic()
                if i and t0 > sampling_end + min(interval, timeout):  # slow answers: the window is over
                    return
                ts = time.time()
                f = fetch(client, t.metrics_url, DEFAULT_MAX_BYTES, "metrics", t0 + timeout)
                got.append((ts, f, time.monotonic() - t0))

        def report() -> None:
            if progress:
                rounds = [len(fetched[t.url]) for t in targets]
                failing = sum(1 for t in targets if fetched[t.url] and not fetched[t.url][-1][1].ok)
                progress({"scrapes": min(rounds), "of": n, "elapsed_s": time.monotonic() - start, "duration_s": duration,
                          "targets": len(targets), "failing": failing})

        done = in_threads([lambda t=t: sample(t) for t in targets], sampling_end + timeout + GRACE_S,  # type: ignore[misc]
                          every=report if progress else None)
        report()
        for t, (finished, _res) in zip(targets, done, strict=True):
            got = list(fetched[t.url])  # a thread given up may still append: take what is there now
            if not finished:  # still waiting on a server that trickles: its last request failed at the deadline
                got.append((time.time(), Fetched(t.metrics_url, False, error=too_slow(t.report.source + "/metrics", timeout)), timeout))
            for ts, f, took in got:
                t.take(f, ts, tls[t.url], DEFAULT_MAX_BYTES, took)
        for t in targets:
            tl = tls[t.url]
            tl.inputs.insert(0, t.report)
            col.inputs.insert(0, t.report)
            ranges[t.url].merge(t.state.version)
            wq = getattr(adapter, "window_quantiles", None)
            if wq is not None:
                tl.meta["window_quantiles"] = wq(t.state)  # histogram quantiles over the whole window
            if t.report.scrapes == 0:
                col.unreachable[tl.target] = t.last_error
                if t.last_error:
                    col.errors.append(t.last_error)
                tl.meta["unreachable"] = t.last_error
                tl.meta["engine_exposition"] = t.is_engine
        if logs:
            if len(targets) == 1:
                only = tls[targets[0].url]
                for path in logs:
                    reader = read_log_into(adapter, only, path, stdin, log_options)
                    only.inputs.append(reader.report)
                    col.inputs.append(reader.report)
                    ranges[targets[0].url].merge(reader.parser.version)
                    log_facts(only, reader.parser)
            else:
                extra = collect_logs(adapter, logs, stdin, options=log_options)
                col.timelines.extend(extra.timelines)
                col.inputs.extend(extra.inputs)
                col.versions.update(extra.versions)
        for t in targets:
            tl = tls[t.url]
            finalize(tl, ranges[t.url])
            col.versions[tl.target] = ranges[t.url]
            col.timelines.append(tl)
        # keep URL targets first, in the order given
        col.timelines.sort(key=lambda tl: (tl.target not in {tls[t.url].target for t in targets}))
    finally:
        if own_client:
            client.close()
    return col
