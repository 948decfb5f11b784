"""Recordings as time-ordered records: a bundle file, or a run directory / case folder read as one
(``server.log``, ``metrics/*_<epoch>.prom``, server/model info JSON); and writing any of them back
out as a clean bundle (``diagnose record --from``)."""

from __future__ import annotations

import calendar
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from diagnoser.bundle import (
    MAX_INFLATED,
    BundleError,
    NotRegularFile,
    _gib,
    encode_line,
    read_bundle,
    read_regular,
    redact_fast,
    redact_raw,
    redact_record,
)
from diagnoser.jsonout import loads
from diagnoser.redact import redact

# file name in a run directory → the endpoint it was fetched from
CONFIG_FILES = {
    "server_info.json": "/server_info",
    "get_server_info.json": "/get_server_info",
    "get_server_args.json": "/get_server_args",
    "model_info.json": "/model_info",
    "get_model_info.json": "/get_model_info",
    "v1_loads.json": "/v1/loads",
    "version.json": "/version",  # vLLM's (SGLang serves no /version)
    "v1_models.json": "/v1/models",
}
LOG_FILES = ("server.log",)
# what a run directory's files may hold (checked before reading; a symlink to a device is refused):
# a scrape file as much as a live scrape (sources.http.DEFAULT_MAX_BYTES), a JSON payload what
# fetch_config reads, the log what a replay holds in memory as records (--once --log reads any size)
MAX_PROM_FILE = 32 * 1024 * 1024
MAX_JSON_FILE = 8 * 1024 * 1024
MAX_LOG_FILE = 512 * 1024 * 1024
_EPOCH_RE = re.compile(r"(\d{9,11}(?:\.\d+)?)\.prom$")
_STAMP_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
# vLLM's line head stamp, ``LEVEL MM-DD HH:MM:SS`` (vllm/logger.py): no year
_YEARLESS_RE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")


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


def record_engines(records: list[dict[str, Any]]) -> dict[str, str]:
    """The engine of each recorded target, from what its records show (diagnoser.engines.detect): a vLLM
    ``/version`` or ``/v1/models`` owned by ``vllm``, else its first scrape's series. Only engines other
    than SGLang (the default, which bundles have always held) are returned, so SGLang bundles stay as they
    were; a replay decides from the data again either way."""
    from diagnoser.engines import detect

    out: dict[str, str] = {}
    for r in records:
        tgt = r.get("target")
        if not isinstance(tgt, str) or tgt in out:
            continue
        if r.get("kind") == "config" and isinstance(r.get("data"), dict):
            data = r["data"]
            if r.get("path") == "/version" or (r.get("path") == "/v1/models" and any(
                    isinstance(m, dict) and m.get("owned_by") == "vllm" for m in data.get("data") or [])):
                out[tgt] = "vllm"
        elif r.get("kind") == "scrape" and isinstance(r.get("text"), str):
            got = detect.exposition_engine(r["text"])
            if got:
                out[tgt] = got[0]
    return {t: e for t, e in out.items() if e != "sglang"}


def yearless_time(line: str, near: float) -> float | None:
    """A vLLM head stamp (``INFO 12-02 15:03:43``, no year) as UTC epoch seconds, in the year that puts
    it closest to ``near`` (a recorded scrape time): a run that spans New Year keeps its order."""
    m = _YEARLESS_RE.search(line, 0, 160)
    if not m:
        return None
    mo, d, h, mi, s = (int(x) for x in m.groups()[:5])
    y0 = time.gmtime(near).tm_year
    best: float | None = None
    for y in (y0 - 1, y0, y0 + 1):
        try:
            ts = float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)))
        except (ValueError, OverflowError):
            continue
        if time.gmtime(ts).tm_mday != d:  # 29 February in a common year
            continue
        if best is None or abs(ts - near) < abs(best - near):
            best = ts
    frac = m.group(6)
    return None if best is None else best + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _read_json(path: str) -> tuple[Any, str]:
    """A JSON object from a file, or None and why not (one clause)."""
    try:
        data, size = read_regular(path, MAX_JSON_FILE + 1)
    except OSError as e:
        return None, f"could not be read ({_why(e)})"
    if size > MAX_JSON_FILE:
        return None, f"is {_gib(size)}, more than a server-info payload can be ({_gib(MAX_JSON_FILE)})"
    try:
        data = loads(data)  # invalid UTF-8 and lone surrogates replaced
    except (ValueError, RecursionError):
        return None, "is not a JSON object"
    return (data, "") if isinstance(data, dict) else (None, "is not a JSON object")


def _why(e: OSError) -> str:
    return str(e) if isinstance(e, NotRegularFile) else (e.strerror or str(e))


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
    logs = [os.path.join(root, n) for n in LOG_FILES if os.path.lexists(os.path.join(root, n))]
    if not scrapes and not logs:
        raise BundleError(
            f"{root} has neither server.log nor metrics/*_<epoch>.prom; pass a run directory, a case folder or a bundle file"
            + (" (for its single saved exposition use --metrics-file " + os.path.join(root, "metrics.txt") + ")."
               if os.path.isfile(os.path.join(root, "metrics.txt")) else ".")
        )
    target = root if scrapes else logs[0]
    t_first = scrapes[0][0] if scrapes else None
    log_records: list[dict[str, Any]] = []
    for lp in logs:
        try:
            log_records.extend(_log_records(lp, target, problems, t_first))
        except OSError as e:
            problems.append(f"{lp} could not be read ({_why(e)}) and was skipped")
    if log_records:
        t_log = min(float(r["t"]) for r in log_records)
        t_first = t_log if t_first is None else min(t_first, t_log)
    t_first = t_first or 0.0
    records: list[dict[str, Any]] = []
    for fname, ep in CONFIG_FILES.items():
        fp = os.path.join(root, fname)
        if os.path.lexists(fp):
            data, why = _read_json(fp)
            if isinstance(data, dict):
                records.append({"kind": "config", "t": t_first, "target": target, "path": ep, "data": redact(data)})
            else:
                problems.append(f"{fp} {why} and was skipped")
    total = 0
    for ts, fp in scrapes:
        try:
            raw, size = read_regular(fp, MAX_PROM_FILE + 1)
        except OSError as e:
            problems.append(f"{fp} could not be read ({_why(e)}) and was skipped")
            continue
        if size > MAX_PROM_FILE:
            problems.append(f"{fp} is {_gib(size)}, more than a scrape can be ({_gib(MAX_PROM_FILE)}), and was skipped")
            continue
        total += len(raw)
        if total > MAX_INFLATED:
            problems.append(f"the scrapes of {mdir} add up to more than {_gib(MAX_INFLATED)}; the later ones were not read")
            break
        text = raw.decode("utf-8", errors="replace")
        records.append({"kind": "scrape", "t": ts, "target": target, "text": redact_fast(text), "status": 200,
                        "content_type": "text/plain; version=0.0.4; charset=utf-8", "file": os.path.basename(fp)})
    records.extend(log_records)
    version = None
    for r in records:
        if r["kind"] == "config" and isinstance(r["data"].get("version"), str):
            version = r["data"]["version"]
    engine = record_engines(records).get(target)
    man = {
        "kind": "manifest", "format": "directory", "format_version": 1,
        "targets": [{"name": target, "url": "", **({"engine": engine} if engine else {})}] if scrapes else [],
        "logs": [{"source": lp, "target": target} for lp in logs],
        "sglang_version": version if engine != "vllm" else None, "interval_s": None, "window": {"start": t_first},
        **({"engine_version": version} if engine == "vllm" and version else {}),
    }
    src = ReplaySource(path=root, kind="directory", manifest=man, records=_time_sorted(records), problems=problems)
    n_scrapes = sum(1 for r in records if r["kind"] == "scrape")
    src.summary = f"{root}: {n_scrapes} scrape(s), {sum(len(r['lines']) for r in log_records)} log line(s)" + (
        f"; {'; '.join(problems)}." if problems else ".")
    return src


def _log_records(path: str, target: str, problems: list[str], near: float | None = None) -> list[dict[str, Any]]:
    """A log file as log records, each line timed by its own stamp (untimed lines take the last one).
    A vLLM stamp has no year: with scrapes beside the log (``near``, the first scrape's time) it takes the
    year that puts it closest to them; a log alone keeps only full stamps.
    At most :data:`MAX_LOG_FILE` bytes are read (up to the last whole line), and the cut is said."""
    out: list[dict[str, Any]] = []
    data, size = read_regular(path, MAX_LOG_FILE)
    if size > MAX_LOG_FILE:
        data = data[: data.rfind(b"\n") + 1]
        problems.append(f"{path} is {_gib(size)}; its first {_gib(MAX_LOG_FILE)} were replayed "
                        f"(diagnose --once --log {path} reads a log of any size)")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    last: float | None = None
    pending: list[Any] = []
    first_line = 1
    cur_t: float | None = None
    for i, raw in enumerate(lines, start=1):
        head = raw[:160].decode("utf-8", errors="replace")
        t = line_time(head)
        if t is None and near is not None:
            t = yearless_time(head, near)
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
    return redact_raw(raw)


def _time_sorted(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    order = {"config": 0, "scrape": 1, "log": 2}
    return sorted(records, key=lambda r: (float(r.get("t") or 0.0), order.get(r.get("kind", ""), 3)))


def load_source(path: str) -> ReplaySource:
    """Load a bundle file or a run directory. Raises :class:`BundleError` (one sentence) when nothing
    can be read; damage that still leaves something readable is listed in ``problems``."""
    if os.path.isdir(path):
        return _load_directory(path)
    res = read_bundle(path)
    records = [redact_record(r) for r in res.records]  # whoever wrote the bundle: secrets never get further
    man = redact(res.manifest) if res.manifest else {"kind": "manifest"}
    if "targets" not in man:  # no manifest, or one whose targets were unreadable: the records name them
        names = {r["target"] for r in records if r.get("kind") == "scrape" and r["target"]}
        man["targets"] = [{"name": n, "url": n} for n in sorted(names)]
    if "logs" not in man:
        logs = sorted({(str(r.get("source") or "server.log"), r["target"]) for r in records if r.get("kind") == "log"})
        man["logs"] = [{"source": s, "target": t} for s, t in logs]
    src = ReplaySource(path=path, kind="bundle", manifest=man, records=records, problems=list(res.problems))
    src.summary = res.summary()
    return src


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
    engines = {**record_engines(src.records), **{t["name"]: t["engine"] for t in src.manifest.get("targets", [])
                                                 if isinstance(t.get("engine"), str)}}
    extra_version = {"engine_version": src.manifest["engine_version"]} if isinstance(src.manifest.get("engine_version"), str) else {}
    man = manifest(
        targets=[{"name": rename[t], "url": rename[t], **({"engine": engines[t]} if t in engines else {})} for t in src.targets],
        logs=[{"source": src_name(lg.get("source")), "target": rename.get(lg.get("target"), lg.get("target"))}
              for lg in src.manifest.get("logs", [])],
        start=t0, interval=iv or 0.0, planned_duration=t1 - t0, sglang_version=src.manifest.get("sglang_version"),
        converted_from=os.path.basename(src.path.rstrip("/")), thinned_every=max(1, every), **extra_version,
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

