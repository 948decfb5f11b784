"""Apply recorded records to timelines through the live ingestion path (MetricsTarget.ingest_text,
the log reader, the adapter's server-info calls), one by one or all at once."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from diagnoser.bundle import decode_line
from diagnoser.collect import Collection, finalize, log_facts
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.model import InputReport
from diagnoser.redact import redact
from diagnoser.replay.source import ReplaySource, load_source
from diagnoser.sources.http import Fetched
from diagnoser.sources.logs import LogReader, finish_report, open_log_reader
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline


@dataclass(slots=True)
class _Target:
    tl: Timeline
    version: VersionRange
    metrics: MetricsTarget | None = None
    config_report: InputReport | None = None
    readers: dict[str, LogReader] = field(default_factory=dict)
    raw_config: dict[str, Any] = field(default_factory=dict)
    log_only: bool = False


class ReplayIngest:
    """Applies records to per-target timelines exactly as a live run would.

    ``apply(record)`` takes one record; ``collection()`` returns a finalised :class:`Collection` of
    copies (safe to call repeatedly while records keep arriving); ``finish()`` finalises in place.
    ``targets[name]`` exposes ``.tl`` (the Timeline being filled), ``.version`` (VersionRange from
    server info), ``.metrics`` (the MetricsTarget, or None for a log-only target) and ``.readers``
    (LogReader per log source) — live.ReplayMonitor relies on these names.
    """

    def __init__(self, adapter: Any, source: ReplaySource) -> None:
        self.adapter = adapter
        self.source = source
        self.targets: dict[str, _Target] = {}
        self.metric_names = set(source.targets)
        for name in source.targets:
            self._target(name)

    def _target(self, name: str) -> _Target:
        t = self.targets.get(name)
        if t is None:
            t = _Target(tl=Timeline(target=name), version=VersionRange())
            if name in self.metric_names:
                mt = MetricsTarget(name if "://" in name else "http://replay", self.adapter)
                mt.url = name.rstrip("/")  # messages name the recorded target, not a made-up URL
                mt.report.source = name
                t.metrics = mt
            else:
                t.log_only = True
            self.targets[name] = t
        return t

    def apply(self, rec: dict[str, Any]) -> None:
        kind = rec.get("kind")
        target = str(rec.get("target") or "")
        if kind in ("scrape", "log") and target in self.targets:
            self._ingest_config(self.targets[target])  # config precedes the first sample, as live
        if kind == "scrape":
            t = self._target(target)
            if t.metrics is None:
                self.metric_names.add(target)
                t.metrics = MetricsTarget("http://replay", self.adapter)
                t.metrics.url = target
                t.metrics.report.source = target
            ts = float(rec.get("t") or 0.0)
            if rec.get("error"):
                t.metrics._fail(str(rec["error"]))
                return
            text = str(rec.get("text") or "")
            fetched = Fetched(t.metrics.metrics_url, True, status=int(rec.get("status") or 200), text=text,
                              content_type=str(rec.get("content_type") or ""))
            t.metrics.ingest_text(text, ts, t.tl, fetched)
        elif kind == "log":
            t = self._target(target)
            src = str(rec.get("source") or "server.log")
            reader = t.readers.get(src)
            if reader is None:
                reader = t.readers[src] = open_log_reader(self.adapter, t.tl, src)
            for item in rec.get("lines") or []:
                reader.feed_bytes(decode_line(item))
        elif kind == "config":
            t = self._target(target)
            data = rec.get("data")
            if isinstance(data, dict) and t.config_report is None:
                t.raw_config[str(rec.get("path"))] = redact(data)

    def _ingest_config(self, t: _Target) -> None:
        """Mirror of sources.serverinfo.fetch_config over the recorded payloads (first path wins)."""
        if t.config_report is not None:
            return  # config is read once per target, like a live run
        paths = set(t.raw_config)
        models_path = getattr(self.adapter, "models_path", None)
        version_path = getattr(self.adapter, "version_path", None)
        if not any(p in paths for p in (*self.adapter.server_info_paths, *self.adapter.model_info_paths, self.adapter.loads_path,
                                        models_path, version_path)):
            return
        rep = InputReport(kind="server_info", source=t.tl.target)
        for p in self.adapter.server_info_paths:
            if p in t.raw_config:
                if self._guard(rep, p, self.adapter.ingest_server_info, t.raw_config[p], t.tl, p.lstrip("/"), t.version):
                    rep.lines_recognized += 1
                rep.scrapes += 1
                break
        for p in self.adapter.model_info_paths:
            if p in t.raw_config:
                self._guard(rep, p, self.adapter.ingest_model_info, t.raw_config[p], t.tl, p.lstrip("/"))
                rep.scrapes += 1
                break
        if models_path and isinstance(t.raw_config.get(models_path), dict):  # vLLM's /v1/models names the engine
            self._guard(rep, models_path, self.adapter.ingest_models, t.raw_config[models_path], t.tl, models_path.lstrip("/"))
            rep.scrapes += 1
        ver = t.raw_config.get(version_path) if version_path else None
        if isinstance(ver, dict) and isinstance(ver.get("version"), str) and version_path:
            self._guard(rep, version_path, self.adapter.ingest_version, ver, t.tl, version_path.lstrip("/"), t.version)
            rep.scrapes += 1
        if self.adapter.loads_path in t.raw_config:
            rep.scrapes += 1
        t.config_report = rep

    @staticmethod
    def _guard(rep: InputReport, path: str, fn: Any, *args: Any) -> bool:
        try:
            fn(*args)
            return True
        except Exception as e:  # an odd payload must not stop the replay
            rep.errors += 1
            rep.messages.append(f"The recorded {path} payload could not be read ({type(e).__name__}: {e}); config facts come from logs and metrics only.")
            return False

    def apply_all(self) -> None:
        """Apply every record in the order a live ``--once`` run reads them: config, scrapes, logs."""
        recs = self.source.records
        for kind in ("config", "scrape"):
            for r in recs:
                if r.get("kind") == kind:
                    self.apply(r)
        # each log whole, through the reader's stream path (what ``--once --log FILE`` uses)
        logs: dict[tuple[str, str], list[bytes]] = {}
        for r in recs:
            if r.get("kind") == "log":
                key = (str(r.get("target") or ""), str(r.get("source") or "server.log"))
                logs.setdefault(key, []).extend(decode_line(x) for x in r.get("lines") or [])
        for (target, src), lines in logs.items():
            t = self._target(target)
            self._ingest_config(t)
            reader = t.readers.get(src)
            if reader is None:
                reader = t.readers[src] = open_log_reader(self.adapter, t.tl, src)
            reader.feed_stream(io.BytesIO(b"\n".join(lines) + b"\n"))

    # -- results ---------------------------------------------------------------------------------
    def _build(self, copy: bool) -> Collection:
        col = Collection()
        metric_tls: list[Timeline] = []
        log_tls: list[Timeline] = []
        for t in self.targets.values():
            self._ingest_config(t)
            tl = t.tl
            if copy:
                tl = tl.window(None, None)
                tl.inputs = []
            version = VersionRange()
            version.merge(t.version)
            inputs: list[InputReport] = []
            if t.metrics is not None:
                inputs.append(t.metrics.report)
                if t.config_report is not None and t.config_report.scrapes:
                    inputs.append(t.config_report)
                version.merge(t.metrics.state.version)
                wq = getattr(self.adapter, "window_quantiles", None)
                if wq is not None and t.metrics.report.scrapes:
                    tl.meta["window_quantiles"] = wq(t.metrics.state)  # over the whole recording, as --once does live
                if t.metrics.report.scrapes == 0:
                    err = t.metrics.last_error or "no scrape was recorded for this target"
                    col.unreachable[tl.target] = err
                    tl.meta["unreachable"] = err
                    tl.meta["engine_exposition"] = t.metrics.is_engine
            for reader in t.readers.values():
                if not copy:
                    finish_report(self.adapter, reader)
                inputs.append(reader.report)
                version.merge(reader.parser.version)
                log_facts(tl, reader.parser)
                if t.metrics is None:
                    p = reader.parser
                    tl.untimed = bool(p.untimed_lines) and not p.saw_date and p.untimed_lines >= reader.report.lines_recognized
            tl.inputs.extend(inputs)
            col.inputs.extend(inputs)
            col.raw_config[tl.target] = dict(t.raw_config)
            finalize(tl, version)
            col.versions[tl.target] = version
            (metric_tls if t.metrics is not None else log_tls).append(tl)
        # URL (metrics) targets first, in manifest order, like a live run
        col.timelines = metric_tls + log_tls
        rep = InputReport(kind="replay", source=self.source.path, scrapes=self.source_count("scrape"),
                          lines_read=sum(len(r.get("lines") or []) for r in self.source.records if r.get("kind") == "log"))
        if self.source.problems:
            rep.errors = len(self.source.problems)  # the sentence itself goes to Collection.errors
        col.inputs.append(rep)
        if self.source.problems:
            col.errors.append(self.source.summary)
        return col

    def source_count(self, kind: str) -> int:
        return sum(1 for r in self.source.records if r.get("kind") == kind)

    def finish(self) -> Collection:
        """Finalise in place (once) and return the Collection."""
        return self._build(copy=False)

    def collection(self) -> Collection:
        """A finalised Collection of copies of what has been applied so far."""
        return self._build(copy=True)


def collect_replay(path: str, adapter: Any) -> Collection:
    """Replay a bundle file or a run directory through the live pipeline; returns the Collection.

    Raises :class:`BundleError` (one sentence) when nothing can be read (missing file, not a bundle,
    a newer format). A damaged bundle replays what is intact and says so in ``Collection.errors``.
    """
    src = load_source(path)
    ing = ReplayIngest(adapter, src)
    ing.apply_all()
    return ing.finish()

