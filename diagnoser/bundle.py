"""The bundle format: one file holding what a recording saw, raw, so a diagnosis can be re-run later.

A bundle is a sequence of gzip *members* (RFC 1952), each holding one or more JSON lines; ``zcat``
shows it. Every record is a JSON object with ``"v"`` (the format version) and ``"kind"``:

    manifest  {"format": "diagnoser-bundle", "format_version", "tool", "tool_version", "created",
               "targets": [{"name", "url", "engine"?}], "logs": [{"source", "target"}], "sglang_version",
               "engine_version"?, "interval_s", "planned_duration_s", "window": {"start"}}
              (``engine`` is "vllm" when the recording showed a vLLM server, absent for SGLang; a vLLM recording keeps its
              version in ``engine_version`` and leaves ``sglang_version`` null)
    config    {"t", "target", "path": "/get_server_info", "data": {...}}   (redacted JSON payload)
    scrape    {"t", "target", "text", "status", "content_type", "duration_s"}  (exposition as received)
              or {"t", "target", "error"} for a scrape that failed (the one-sentence error)
    log       {"t", "target", "source", "first_line", "lines": [...]}   lines as they arrived at ``t``
    note      {"t", "text"}
    end       {"t", "reason": "duration"|"interrupted"|"max-size"|"write-error", "counts", "window", "engines"?}

The writer flushes each member as soon as it is complete, so a file cut at any byte still yields every
record of the members before the cut (and the complete lines of the member that was cut). A member
whose CRC fails is skipped; reading resumes at the next member. See docs/bundle-format.md.
"""

from __future__ import annotations

import base64
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from diagnoser import __version__
from diagnoser.jsonout import dumps as json_dumps
from diagnoser.jsonout import loads
from diagnoser.redact import redact, redact_lines, redact_strings, redact_text

FORMAT = "diagnoser-bundle"
FORMAT_VERSION = 1
GZIP_MAGIC = b"\x1f\x8b\x08"
END_RESERVE = 1024  # bytes kept free under --max-size for the end record
_CHUNK = 64 * 1024
# What a reader holds in memory at most (docs/bundle-format.md, "Limits"): the bundle file itself, one
# member inflated (a member is one recorder tick: ~80 KB per target scrape, 400 log lines), all members
# inflated together. A member past MAX_MEMBER (a gzip bomb, a damaged length) is skipped as damaged;
# past MAX_INFLATED the rest of the file is not read, and the reader says so.
MAX_FILE = 1024**3
MAX_MEMBER = 64 * 1024**2
MAX_INFLATED = 2 * 1024**3
MAX_T = 253_402_214_400.0  # 9999-01-01T00:00:00Z: a record time must be a number in [0, MAX_T)


class BundleError(Exception):
    """A bundle that cannot be read at all (missing, not a bundle, newer format): one sentence."""


class BundleFull(Exception):
    """Raised by :meth:`BundleWriter.write_member` when the member would pass ``max_bytes``."""


def redact_fast(text: str) -> str:
    """Secrets out of line-based text (expositions, log lines): :func:`diagnoser.redact.redact_lines`."""
    return redact_lines(text)


def redact_raw(raw: bytes) -> bytes:
    """A log line's bytes with its secrets out (UTF-8, else Latin-1 so every byte round-trips)."""
    try:
        return redact_fast(raw.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        return redact_fast(raw.decode("latin-1")).encode("latin-1")


def redact_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A record with its secrets out — texts, log lines, payloads, target names, the manifest: what every
    bundle goes through when it is written and when it is read, whoever wrote it."""
    kind = rec.get("kind")
    if kind == "config":  # a server's payload: by key name too
        return {**redact_strings({k: v for k, v in rec.items() if k != "data"}), "data": redact(rec.get("data"))}
    if kind not in ("scrape", "log"):
        return redact_strings(rec)  # the manifest, notes, the end record: diagnoser's own fields
    out = dict(rec)
    for k in ("target", "error", "source"):
        if isinstance(out.get(k), str):
            out[k] = redact_text(out[k])
    if kind == "scrape" and isinstance(out.get("text"), str):
        out["text"] = redact_fast(out["text"])
    elif kind == "log" and isinstance(out.get("lines"), list):
        out["lines"] = [redact_fast(x) if isinstance(x, str) else encode_line(redact_raw(decode_line(x))) for x in out["lines"]]
    return out


def encode_line(raw: bytes) -> str | list[str]:
    """A log line as stored: text when it is UTF-8, else ``["b64", …]`` so junk replays byte-exact."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return ["b64", base64.b64encode(raw).decode("ascii")]


def decode_line(item: Any) -> bytes:
    if isinstance(item, str):
        return item.encode("utf-8", errors="replace")
    if isinstance(item, list) and len(item) == 2 and item[0] == "b64":
        try:
            return base64.b64decode(str(item[1]))
        except ValueError:
            return b""
    return str(item).encode("utf-8", errors="replace")


def dumps(rec: dict[str, Any]) -> bytes:
    rec = {"v": FORMAT_VERSION, **rec}
    return json_dumps(rec, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def manifest(targets: list[dict[str, str]], logs: list[dict[str, str]], start: float, interval: float,
             planned_duration: float, sglang_version: str | None = None, **extra: Any) -> dict[str, Any]:
    from diagnoser.model import iso

    return {
        "kind": "manifest",
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tool": "diagnoser",
        "tool_version": __version__,
        "created": iso(start),
        "targets": targets,
        "logs": logs,
        "sglang_version": sglang_version,
        "interval_s": interval,
        "planned_duration_s": planned_duration,
        "window": {"start": start},
        **extra,
    }


class BundleWriter:
    """Append gzip members to a bundle file, each flushed (and fsynced) as soon as it is written.

    ``write_member(records)`` writes one member. With ``max_bytes``, a member that would take the file
    past ``max_bytes - END_RESERVE`` raises :class:`BundleFull` and nothing is written. An ``OSError``
    while writing (disk full, file-size limit) truncates the file back to the last complete member,
    so what is on disk stays valid, then re-raises.
    """

    def __init__(self, path: str, max_bytes: int | None = None, fsync: bool = True, fh: IO[bytes] | None = None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.fsync = fsync
        # unbuffered: a failed write leaves no buffered tail that a later flush/close could append
        self.fh: IO[bytes] = fh if fh is not None else open(path, "wb", buffering=0)
        self.size = 0
        self.members = 0
        self.records = 0

    def write_member(self, records: list[dict[str, Any]], *, final: bool = False) -> int:
        if not records:
            return 0
        payload = b"".join(dumps(redact_record(r)) for r in records)  # the output door of every bundle
        co = zlib.compressobj(6, zlib.DEFLATED, 31)
        member = co.compress(payload) + co.flush()
        limit = None if self.max_bytes is None else self.max_bytes - (0 if final else END_RESERVE)
        if limit is not None and self.size + len(member) > limit:
            raise BundleFull(f"the next record would take the bundle past {self.max_bytes} bytes")
        try:
            mv = memoryview(member)
            while mv:
                n = self.fh.write(mv)
                if not n:
                    raise OSError(28, "No space left on device")
                mv = mv[n:]
            self.fh.flush()
            if self.fsync:
                try:
                    os.fsync(self.fh.fileno())
                except (OSError, ValueError, AttributeError):
                    pass
        except OSError:
            self._rollback()
            raise
        self.size += len(member)
        self.members += 1
        self.records += len(records)
        return len(member)

    def _rollback(self) -> None:
        """Cut a half-written member off the end of the file."""
        try:
            self.fh.truncate(self.size)
            self.fh.seek(self.size)
        except (OSError, ValueError):
            try:
                os.truncate(self.path, self.size)
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.fh.close()
        except (OSError, ValueError):
            pass


# -- reading -------------------------------------------------------------------------------------


@dataclass(slots=True)
class ReadResult:
    """Everything readable from a bundle, and what was not."""

    path: str
    manifest: dict[str, Any] | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    size: int = 0
    members_ok: int = 0
    members_bad: int = 0
    bytes_bad: int = 0
    truncated: bool = False
    bad_lines: int = 0
    end: dict[str, Any] | None = None

    @property
    def complete(self) -> bool:
        return self.end is not None and not self.problems

    def count(self, kind: str) -> int:
        return sum(1 for r in self.records if r.get("kind") == kind)

    def summary(self) -> str:
        """One sentence: what was readable and, if anything was not, what was wrong."""
        n_scr, n_log = self.count("scrape"), sum(len(r.get("lines") or []) for r in self.records if r.get("kind") == "log")
        what = f"{n_scr} scrape(s) and {n_log} log line(s)"
        if not self.problems:
            return f"{self.path}: {what}, complete."
        good = self.size - self.bytes_bad
        pct = 100.0 * good / self.size if self.size else 0.0
        return (f"{self.path} is damaged: {', '.join(self.problems)}; {good} of {self.size} bytes ({pct:.0f}%) were "
                f"readable, giving {what}, which are replayed. Re-record if you need the missing part.")


def iter_members(data: bytes, max_member: int = MAX_MEMBER) -> Iterator[tuple[int, int, bytes, str]]:
    """Yield ``(offset, length, payload, problem)`` for each gzip member; ``problem`` is "" when intact,
    "truncated" for a member cut short (payload = what decompressed), "corrupt" (payload empty), or
    "oversized" for a member that inflates past ``max_member`` bytes (payload empty; reading resumes at
    the next gzip header, and the inflated bytes are never held)."""
    mv = memoryview(data)
    n = len(data)
    pos = 0
    while pos < n:
        if data[pos:pos + 3] != GZIP_MAGIC:
            nxt = data.find(GZIP_MAGIC, pos + 1)
            end = n if nxt < 0 else nxt
            yield pos, end - pos, b"", "corrupt"
            pos = end
            continue
        d = zlib.decompressobj(31)
        out: list[bytes] = []
        p = pos  # input fed so far
        buf: Any = b""  # input fed but not consumed yet (held back by the output cap)
        size = 0
        try:
            while not d.eof and size <= max_member:
                if not buf:
                    if p >= n:
                        break
                    buf = mv[p:p + _CHUNK]
                    p += len(buf)
                piece = d.decompress(buf, max_member + 1 - size)
                buf = d.unconsumed_tail
                size += len(piece)
                out.append(piece)
            if size > max_member:
                out.clear()
                nxt = data.find(GZIP_MAGIC, pos + 1)
                end = n if nxt < 0 else nxt
                yield pos, end - pos, b"", "oversized"
                pos = end
                continue
            if d.eof:
                used = p - pos - len(d.unused_data) - len(buf)
                yield pos, used, b"".join(out), ""
                pos += used
            else:
                out.append(d.flush())
                yield pos, n - pos, b"".join(out), "truncated"
                pos = n
        except zlib.error:
            nxt = data.find(GZIP_MAGIC, pos + 1)
            end = n if nxt < 0 else nxt
            yield pos, end - pos, b"", "corrupt"
            pos = end


class NotRegularFile(OSError):
    """The path is a device, a FIFO, a socket or a directory (e.g. a symlink to /dev/zero)."""


def read_regular(path: str, limit: int) -> tuple[bytes, int]:
    """Up to ``limit`` bytes of a regular file (a symlink is followed, but only to a regular file), and
    the file's size, checked before reading. Never blocks on a FIFO and never reads a device: those
    raise :class:`NotRegularFile`. Other failures raise the usual ``OSError`` subclasses."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)  # of what was opened (no race with a swapped symlink)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket, not a regular file"
            raise NotRegularFile(f"{path} is {kind}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(min(limit, st.st_size) if st.st_size else limit), st.st_size
    finally:
        os.close(fd)


def _gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


def _finite_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def check_record(rec: dict[str, Any]) -> dict[str, Any] | None:
    """A record whose fields have the types the format gives them (docs/bundle-format.md), or None when
    it cannot be replayed (a time that is not a number in [0, 9999-01-01), a scrape text that is not text,
    log lines that are not a list…). Optional fields of a wrong type are dropped, not fatal."""
    kind = rec.get("kind")
    t = rec.get("t")
    if kind in ("scrape", "log", "config", "note"):
        if not _finite_number(t) or not 0 <= t < MAX_T:
            return None
        target = rec.get("target", "")
        if target is None:
            target = ""
        if not isinstance(target, str):
            return None
        rec = {**rec, "t": float(t), "target": target}
    if kind == "scrape":
        if "error" in rec:
            if not isinstance(rec["error"], str):
                return None
        elif not isinstance(rec.get("text"), str):
            return None
        status = rec.get("status")
        rec["status"] = int(status) if _finite_number(status) and 100 <= status < 600 else (0 if "error" in rec else 200)
        for k in ("content_type", "file"):
            if k in rec and not isinstance(rec[k], str):
                del rec[k]
        if "duration_s" in rec and not _finite_number(rec["duration_s"]):
            del rec["duration_s"]
    elif kind == "log":
        lines = rec.get("lines")
        if not isinstance(lines, list) or not all(isinstance(x, str) or (isinstance(x, list) and len(x) == 2 and x[0] == "b64" and isinstance(x[1], str)) for x in lines):
            return None
        if not isinstance(rec.get("source", ""), str):
            rec["source"] = "server.log"
        if "first_line" in rec and not (isinstance(rec["first_line"], int) and not isinstance(rec["first_line"], bool)):
            del rec["first_line"]
    elif kind == "config":
        if not isinstance(rec.get("data"), dict) or not isinstance(rec.get("path"), str):
            return None
    elif kind == "note":
        if not isinstance(rec.get("text", ""), str):
            return None
    return rec


def check_manifest(man: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The manifest with every field of a wrong type dropped (targets and logs then come from the
    records), and the sentences saying what was dropped."""
    out = dict(man)
    bad: list[str] = []
    targets = man.get("targets", [])
    if not isinstance(targets, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in targets):
        bad.append("targets")
        out.pop("targets", None)
    else:
        out["targets"] = [{"name": t["name"], "url": t.get("url") if isinstance(t.get("url"), str) else t["name"],
                           **({"engine": t["engine"]} if isinstance(t.get("engine"), str) else {})} for t in targets]
    logs = man.get("logs", [])
    if not isinstance(logs, list) or not all(isinstance(lg, dict) and isinstance(lg.get("source", ""), str)
                                             and isinstance(lg.get("target", ""), str | None) for lg in logs):
        bad.append("logs")
        out.pop("logs", None)
    for k, ok in (("interval_s", lambda v: v is None or (_finite_number(v) and v >= 0)),
                  ("planned_duration_s", lambda v: v is None or _finite_number(v)),
                  ("sglang_version", lambda v: v is None or isinstance(v, str)),
                  ("engine_version", lambda v: v is None or isinstance(v, str)),
                  ("created", lambda v: v is None or isinstance(v, str)),
                  ("window", lambda v: isinstance(v, dict))):
        if k in man and not ok(man[k]):
            bad.append(k)
            out.pop(k, None)
    return out, ([f"the manifest's {', '.join(bad)} field(s) had the wrong type and were ignored"] if bad else [])


def check_version(rec: dict[str, Any], path: str) -> None:
    v = rec.get("format_version", rec.get("v"))
    if isinstance(v, int) and v > FORMAT_VERSION:
        tool = rec.get("tool_version")
        by = f" (written by diagnoser {tool})" if tool else ""
        raise BundleError(
            f"{path} is bundle format v{v}{by}, but this diagnoser {__version__} reads up to v{FORMAT_VERSION}; "
            "upgrade diagnoser (pip install -U diagnoser) to replay it."
        )


def read_bundle(path: str, data: bytes | None = None) -> ReadResult:
    """Read every intact record of a bundle. Raises :class:`BundleError` only when nothing can be read
    (missing file, not a bundle) or the format is newer than this version reads."""
    if data is None:
        try:
            data, size = read_regular(path, MAX_FILE + 1)
        except FileNotFoundError:
            raise BundleError(f"bundle {path} does not exist; check the path (record one with 'diagnose record').") from None
        except IsADirectoryError:
            raise BundleError(f"{path} is a directory, not a bundle file.") from None
        except PermissionError:
            raise BundleError(f"bundle {path} cannot be read (permission denied); run as a user who can read it.") from None
        except NotRegularFile as e:
            raise BundleError(f"{e}; pass a bundle file written by 'diagnose record' or a run directory.") from None
        except OSError as e:
            raise BundleError(f"bundle {path} cannot be read ({e.strerror or e}); check the path.") from None
        if size > MAX_FILE:
            raise BundleError(f"bundle {path} is {_gib(size)}, more than the {_gib(MAX_FILE)} a replay reads; cut the recording "
                              "shorter (diagnose record --duration) or record at a longer --interval.")
    res = ReadResult(path=path, size=len(data))
    if not data:
        raise BundleError(f"bundle {path} is empty (0 bytes); the recording wrote nothing. Record it again.")
    if not data.startswith(GZIP_MAGIC):
        raise BundleError(f"{path} is not a diagnoser bundle (not gzip data); record one with 'diagnose record' or pass a run directory.")
    corrupt = oversized = 0
    inflated = 0
    for off, length, payload, problem in iter_members(data):
        if problem in ("corrupt", "oversized"):
            if problem == "corrupt":
                corrupt += 1
            else:
                oversized += 1
            res.members_bad += 1
            res.bytes_bad += length
            continue
        inflated += len(payload)
        if inflated > MAX_INFLATED:
            res.bytes_bad += len(data) - off
            res.problems.append(f"it inflates past {_gib(MAX_INFLATED)}, more than a replay holds, so only its first "
                                f"{100.0 * off / len(data):.0f}% was read")
            break
        if problem == "truncated":
            res.truncated = True
            res.bytes_bad += length
            # keep only complete lines of a cut member
            cut = payload.rfind(b"\n")
            payload = payload[: cut + 1] if cut >= 0 else b""
        else:
            res.members_ok += 1
        for line in payload.split(b"\n"):
            if not line or line.isspace():  # (no strip(): scrape lines are ~80 KB)
                continue
            try:
                rec = loads(line)  # invalid UTF-8 and lone surrogates replaced
            except (ValueError, RecursionError):
                res.bad_lines += 1
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
                res.bad_lines += 1
                continue
            check_version(rec, path)
            kind = rec["kind"]
            if kind == "manifest":
                if res.manifest is None:
                    res.manifest, why = check_manifest(rec)
                    res.problems.extend(why)
                continue
            if kind == "end":
                res.end = rec
                continue
            checked = check_record(rec)
            if checked is None:
                res.bad_lines += 1
                continue
            res.records.append(checked)
    if res.manifest is not None and res.manifest.get("format") != FORMAT:
        raise BundleError(f"{path} is gzip JSON but not a diagnoser bundle (format {res.manifest.get('format')!r}).")
    if corrupt:
        res.problems.append(f"{corrupt} damaged block(s) skipped")
    if oversized:
        res.problems.append(f"{oversized} block(s) that inflate past {_gib(MAX_MEMBER)} skipped (no recorder writes one)")
    if res.truncated:
        res.problems.append("the file ends mid-block (cut short)")
    if res.bad_lines:
        res.problems.append(f"{res.bad_lines} unreadable record(s)")
    if res.manifest is None:
        if not res.records:
            raise BundleError(f"{path} has no readable record (damaged from the start); nothing can be replayed.")
        res.problems.append("the manifest is missing")
    elif res.end is None and not res.truncated and not corrupt:
        res.problems.append("no end record (the recording was cut off before it could finish)")
    return res


def validate(path: str) -> tuple[bool, str]:
    """``(ok, one sentence)`` for a bundle: ok when it is complete and undamaged."""
    try:
        res = read_bundle(path)
    except BundleError as e:
        return False, str(e)
    return res.complete, res.summary()
