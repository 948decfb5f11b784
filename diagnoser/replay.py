"""Replay recorded inputs through the same pipeline as a live run.

Two kinds of input are accepted everywhere (``diagnose --once --replay``, ``serve --replay``,
``replay-server``):

* a **bundle** written by ``diagnose record`` (see :mod:`diagnoser.bundle`, docs/bundle-format.md);
* a **directory** laid out like a recorded run: ``server.log``, ``metrics/*_<epoch>.prom`` (one raw
  scrape per file, the epoch in the name is its time), ``get_server_info.json`` /
  ``server_info.json``, ``get_model_info.json`` / ``model_info.json``, ``v1_loads.json``. A case
  folder with only ``server.log`` (or only ``metrics/``) works too.

Every scrape goes through :meth:`diagnoser.sources.metrics.MetricsTarget.ingest_text` with its
recorded timestamp, every log line through the engine's log parser via
:class:`diagnoser.sources.logs.LogReader`, server info through the adapter's ``ingest_*`` calls in
the order ``fetch_config`` uses — so the findings equal those of the live run over the same window.

API:
    collect_replay(path, adapter) -> Collection        the whole recording at once (``--once``)
    load_source(path) -> ReplaySource                  records in time order (+ problems)
    ReplayFeed(path, speed=1.0, loop=False)             records due by wall time (``serve --replay``)
    ReplayIngest(adapter, source)                       apply records one by one; .collection()
"""

from __future__ import annotations

import calendar
import io
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from diagnoser.bundle import BundleError, decode_line, encode_line, read_bundle, redact_fast
from diagnoser.collect import Collection, finalize
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.model import InputReport
from diagnoser.redact import redact
from diagnoser.sources.http import Fetched
from diagnoser.sources.logs import LogReader, finish_report, open_log_reader
from diagnoser.sources.metrics import MetricsTarget
from diagnoser.timeline import Timeline

__all__ = ["BundleError", "ReplaySource", "ReplayFeed", "ReplayIngest", "collect_replay", "load_source"]

# file name in a run directory → the endpoint it was fetched from
CONFIG_FILES = {
    "server_info.json": "/server_info",
    "get_server_info.json": "/get_server_info",
    "get_server_args.json": "/get_server_args",
    "model_info.json": "/model_info",
    "get_model_info.json": "/get_model_info",
    "v1_loads.json": "/v1/loads",
}
LOG_FILES = ("server.log",)
_EPOCH_RE = re.compile(r"(\d{9,11}(?:\.\d+)?)\.prom$")
_STAMP_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")


@dataclass(slots=True)
class ReplaySource:
    """A recording normalised to records (the bundle's record dicts) in time order."""

    path: str
    kind: str  # "bundle" | "directory"
    manifest: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    summary: str = ""

    @property
    def targets(self) -> list[str]:
        return [t["name"] for t in self.manifest.get("targets", [])]

    def span(self) -> tuple[float, float]:
        ts = [float(r["t"]) for r in self.records if isinstance(r.get("t"), int | float)]
        return (min(ts), max(ts)) if ts else (0.0, 0.0)

    def interval(self) -> float:
        iv = self.manifest.get("interval_s")
        if isinstance(iv, int | float) and iv > 0:
            return float(iv)
        ts = sorted(float(r["t"]) for r in self.records if r.get("kind") == "scrape")
        gaps = sorted(b - a for a, b in zip(ts, ts[1:], strict=False) if b > a)
        return gaps[len(gaps) // 2] if gaps else 2.0

    def scrape_times(self) -> list[float]:
        return [float(r["t"]) for r in self.records if r.get("kind") == "scrape"]


def line_time(line: str) -> float | None:
    """The first ``YYYY-MM-DD HH:MM:SS`` stamp near the start of a log line, as UTC epoch seconds."""
    m = _STAMP_RE.search(line, 0, 120)
    if not m:
        return None
    y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
    try:
        ts = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    frac = m.group(7)
    return ts + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None


def _load_directory(path: str) -> ReplaySource:
    root = path.rstrip("/") or "/"
    problems: list[str] = []
    scrapes: list[tuple[float, str]] = []
    mdir = os.path.join(root, "metrics")
    if os.path.isdir(mdir):
        skipped = 0
        for name in sorted(os.listdir(mdir)):
            if not name.endswith(".prom"):
                continue
            m = _EPOCH_RE.search(name)
            if not m:
                skipped += 1
                continue
            scrapes.append((float(m.group(1)), os.path.join(mdir, name)))
        if skipped:
            problems.append(f"{skipped} .prom file(s) in {mdir} have no epoch in their name and were skipped")
    scrapes.sort(key=lambda p: p[0])
    logs = [os.path.join(root, n) for n in LOG_FILES if os.path.isfile(os.path.join(root, n))]
    if not scrapes and not logs:
        raise BundleError(
            f"{root} has neither server.log nor metrics/*_<epoch>.prom; pass a run directory, a case folder or a bundle file."
        )
    target = root if scrapes else logs[0]
    t_first = scrapes[0][0] if scrapes else None
    log_records: list[dict[str, Any]] = []
    for lp in logs:
        log_records.extend(_log_records(lp, target))
    if log_records:
        t_log = min(float(r["t"]) for r in log_records)
        t_first = t_log if t_first is None else min(t_first, t_log)
    t_first = t_first or 0.0
    records: list[dict[str, Any]] = []
    for fname, ep in CONFIG_FILES.items():
        fp = os.path.join(root, fname)
        if os.path.isfile(fp):
            data = _read_json(fp)
            if isinstance(data, dict):
                records.append({"kind": "config", "t": t_first, "target": target, "path": ep, "data": redact(data)})
            else:
                problems.append(f"{fp} is not a JSON object and was skipped")
    for ts, fp in scrapes:
        try:
            with open(fp, "rb") as fh:
                text = fh.read().decode("utf-8", errors="replace")
        except OSError as e:
            problems.append(f"{fp} could not be read ({e.strerror})")
            continue
        records.append({"kind": "scrape", "t": ts, "target": target, "text": redact_fast(text), "status": 200,
                        "content_type": "text/plain; version=0.0.4; charset=utf-8", "file": os.path.basename(fp)})
    records.extend(log_records)
    version = None
    for r in records:
        if r["kind"] == "config" and isinstance(r["data"].get("version"), str):
            version = r["data"]["version"]
    man = {
        "kind": "manifest", "format": "directory", "format_version": 1,
        "targets": [{"name": target, "url": ""}] if scrapes else [],
        "logs": [{"source": lp, "target": target} for lp in logs],
        "sglang_version": version, "interval_s": None, "window": {"start": t_first},
    }
    src = ReplaySource(path=root, kind="directory", manifest=man, records=_time_sorted(records), problems=problems)
    src.summary = f"{root}: {len(scrapes)} scrape(s), {sum(len(r['lines']) for r in log_records)} log line(s)."
    return src


def _log_records(path: str, target: str) -> list[dict[str, Any]]:
    """A log file as log records, each line timed by its own stamp (untimed lines take the last one)."""
    out: list[dict[str, Any]] = []
    with open(path, "rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    last: float | None = None
    pending: list[Any] = []
    first_line = 1
    cur_t: float | None = None
    for i, raw in enumerate(lines, start=1):
        t = line_time(raw[:160].decode("utf-8", errors="replace"))
        if t is not None:
            last = t
        t_line = last
        if pending and t_line != cur_t:
            out.append({"kind": "log", "t": cur_t, "target": target, "source": path, "first_line": first_line, "lines": pending})
            pending, first_line = [], i
        cur_t = t_line
        pending.append(encode_line(_redact_raw(raw)))
    if pending:
        out.append({"kind": "log", "t": cur_t, "target": target, "source": path, "first_line": first_line, "lines": pending})
    # lines before the first stamp: give them the first stamp seen
    first_t = next((r["t"] for r in out if r["t"] is not None), 0.0)
    for r in out:
        if r["t"] is None:
            r["t"] = first_t
    return out


def _redact_raw(raw: bytes) -> bytes:
    try:
        return redact_fast(raw.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        return redact_fast(raw.decode("latin-1")).encode("latin-1")


def _time_sorted(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    order = {"config": 0, "scrape": 1, "log": 2}
    return sorted(records, key=lambda r: (float(r.get("t") or 0.0), order.get(r.get("kind", ""), 3)))


def load_source(path: str) -> ReplaySource:
    """Load a bundle file or a run directory. Raises :class:`BundleError` (one sentence) when nothing
    can be read; damage that still leaves something readable is listed in ``problems``."""
    if os.path.isdir(path):
        return _load_directory(path)
    res = read_bundle(path)
    man = res.manifest or {"kind": "manifest", "targets": [], "logs": []}
    if not res.manifest:
        names = {r.get("target") for r in res.records if r.get("kind") == "scrape" and r.get("target")}
        man["targets"] = [{"name": n, "url": n} for n in sorted(names)]
        man["logs"] = sorted({(r.get("source"), r.get("target")) for r in res.records if r.get("kind") == "log"})
        man["logs"] = [{"source": s, "target": t} for s, t in man["logs"]]
    src = ReplaySource(path=path, kind="bundle", manifest=man, records=res.records, problems=list(res.problems))
    src.summary = res.summary()
    return src


# -- ingestion (the same calls a live run makes) ---------------------------------------------------


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
        if not any(p in paths for p in (*self.adapter.server_info_paths, *self.adapter.model_info_paths, self.adapter.loads_path)):
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


# -- playing in wall time ----------------------------------------------------------------------------


class ReplayFeed:
    """Plays a recording in (scaled) wall time.

    Usage::

        feed = ReplayFeed("run.dgb", speed=10, loop=True)   # or a run directory
        ing = ReplayIngest(adapter, feed.source)             # optional: same ingestion as --once
        while not feed.finished:
            for rec in feed.due():                           # records whose time has come
                ing.apply(rec)
            col = ing.collection()                           # evaluate / render this
            time.sleep(1)

    ``due(now=None)`` returns, in time order, the records whose recorded time ``t`` satisfies
    ``(t - t0) / speed <= now - started`` (``t0`` is the first record's time; ``started`` is the first
    call's wall time unless :meth:`start` set it). Each is a shallow copy of the bundle's record dict
    (kinds ``config``, ``scrape``, ``log``; see docs/bundle-format.md). With ``loop=True`` the recording
    restarts after its last record plus one scrape interval; later passes shift ``t`` forward by
    whole periods (so series keep moving forward; log *text* keeps its original stamps) and repeat
    only scrapes and log lines (config is sent once). ``finished`` becomes True after the last record
    when not looping. ``position()`` gives ``(pass, seconds into the recording)``.
    """

    def __init__(self, path: str | ReplaySource, speed: float = 1.0, loop: bool = False) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.source = path if isinstance(path, ReplaySource) else load_source(path)
        self.speed = float(speed)
        self.loop = loop
        self.records = self.source.records
        t0, t1 = self.source.span()
        self.t0 = t0
        self.period = max((t1 - t0) + self.source.interval(), 1e-3)
        self.started: float | None = None
        self._pass = 0
        self._i = 0
        self.finished = not self.records

    def start(self, now: float | None = None) -> None:
        self.started = time.time() if now is None else now

    def position(self, now: float | None = None) -> tuple[int, float]:
        now = time.time() if now is None else now
        if self.started is None:
            return 0, 0.0
        elapsed = (now - self.started) * self.speed
        if self.loop:
            return int(elapsed // self.period), elapsed % self.period
        return 0, elapsed

    def due(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        if self.started is None:
            self.start(now)
        assert self.started is not None
        elapsed = (now - self.started) * self.speed
        out: list[dict[str, Any]] = []
        while not self.finished:
            if self._i >= len(self.records):
                if not self.loop:
                    self.finished = True
                    break
                self._pass += 1
                self._i = 0
                continue
            rec = self.records[self._i]
            offset = self._pass * self.period
            rel = float(rec.get("t") or self.t0) - self.t0 + offset
            if rel > elapsed:
                break
            self._i += 1
            if self._pass and rec.get("kind") == "config":
                continue
            r = dict(rec)
            if self._pass:
                r["t"] = float(rec.get("t") or self.t0) + offset
                r["pass"] = self._pass
            out.append(r)
        return out


# -- converting a recording (a run directory, or a damaged bundle) into a bundle ----------------------


def write_source(src: ReplaySource, out: str, every: int = 1, name: str | None = None, note: str | None = None,
                 max_bytes: int | None = None) -> dict[str, Any]:
    """Write ``src`` as a bundle: one block per scrape (with the log lines up to the next scrape).

    ``every=N`` keeps every Nth scrape (the first and last always); ``name`` renames the target (and
    log sources keep only their file name), so a bundle does not carry local paths. Returns counts.
    """
    from diagnoser.bundle import BundleWriter, manifest

    rename: dict[str, str] = {}
    for t in src.targets:
        rename[t] = name or t
    for lg in src.manifest.get("logs", []):
        tgt = lg.get("target")
        if tgt and tgt not in rename:
            rename[tgt] = name or tgt
    scr = [r for r in src.records if r.get("kind") == "scrape"]
    keep = {id(r) for i, r in enumerate(scr) if i % max(1, every) == 0 or i == len(scr) - 1}
    t0, t1 = src.span()

    def src_name(s: Any) -> str:
        return os.path.basename(str(s)) if name else str(s)

    iv = src.interval() * max(1, every) if scr else None
    man = manifest(
        targets=[{"name": rename[t], "url": rename[t]} for t in src.targets],
        logs=[{"source": src_name(lg.get("source")), "target": rename.get(lg.get("target"), lg.get("target"))}
              for lg in src.manifest.get("logs", [])],
        start=t0, interval=iv or 0.0, planned_duration=t1 - t0, sglang_version=src.manifest.get("sglang_version"),
        converted_from=os.path.basename(src.path.rstrip("/")), thinned_every=max(1, every),
        **({"note": note} if note else {}),
    )
    man["created"] = src.manifest.get("created") or man["created"]
    w = BundleWriter(out, max_bytes=max_bytes, fsync=False)
    counts = {"scrapes": 0, "log_lines": 0, "dropped_scrapes": 0}
    try:
        head: list[dict[str, Any]] = [man]
        block: list[dict[str, Any]] = head
        for orig in src.records:
            kind = orig.get("kind")
            if kind == "scrape" and id(orig) not in keep:
                counts["dropped_scrapes"] += 1
                continue
            r = dict(orig)
            if "target" in r:
                r["target"] = rename.get(r["target"], r["target"])
            r.pop("file", None)
            if kind == "scrape":
                w.write_member(block)
                block = [r]
                counts["scrapes"] += 1
            elif kind == "log":
                r["source"] = src_name(r.get("source"))
                counts["log_lines"] += len(r.get("lines") or [])
                block.append(r)
                if sum(len(x.get("lines") or []) for x in block if x.get("kind") == "log") >= 400:
                    w.write_member(block)  # keep blocks small: damage then costs little
                    block = []
            elif kind in ("config", "note"):
                block.append(r)
        block.append({"kind": "end", "t": t1, "reason": "converted", "window": {"start": t0, "end": t1},
                      "counts": {"scrapes": counts["scrapes"], "log_lines": counts["log_lines"]},
                      "sglang_version": src.manifest.get("sglang_version")})
        w.write_member(block, final=True)
    finally:
        w.close()
    counts["bytes"] = w.size
    return counts

