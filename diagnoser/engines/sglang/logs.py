"""SGLang server log lines → canonical signals, events and config facts.

Covers every scheduler-line format SGLang printed from 0.1.x to 0.5.23 (docs/sglang.md#logs):

* any prefix (docs/sglang.md#log-prefix): the message is found by its head (:mod:`~diagnoser.engines.sglang.logline`),
  the prefix gives the time and rank tags. SGLang's own — time-only ``[HH:MM:SS TP0]``, date-time, milliseconds,
  any order of DP/PP/ATTN_CP/MOE_DP/TP/EP tags — is version evidence; what deployments put around it (Ray,
  docker compose, container and Kubernetes stamps, journald, Python logging's formats, custom formatters,
  JSON envelopes, tab-separated exports, ANSI colours, CRLF, markdown, a missing leading ``[``) is not;
* a batch line's field list pasted without its head (``#running-req: 12, #token: 3400, …``);
* "Prefill batch" / "Decode batch" lines (docs/sglang.md#prefill-line, docs/sglang.md#decode-line) with ``.``, ``,`` or `` [N],`` headers, every field
  optional, optional trailing comma and suffixes, hybrid SWA/SSM, PD, speculative and graph fields;
* retraction (three generations) and OOM messages (docs/sglang.md#retraction, docs/sglang.md#oom);
* startup lines (docs/sglang.md#startup-lines): the summary line, ``KV Cache is allocated``, CUDA-graph capture, HiCache
  allocation, ``server_args=ServerArgs(…)``, the reduced max_running_requests notices;
* access-log lines (counted with their status codes).

Lines that match nothing are counted by the caller, never fatal; a located message no parser here
recognises is handed to :meth:`SGLangLogParser.unrecognised` (the one place to read more of them).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from diagnoser.engines.sglang import logevents, templates
from diagnoser.engines.sglang.config import facts_from_args
from diagnoser.engines.sglang.logformats import (  # noqa: F401  (TRIGGERS, epoch_day … re-exported)
    _ACCESS_RE,
    _AUTO_MEM_RE,
    _AVAIL_RE,
    _BARE_PREFIX_RE,
    _BATCH_RE,
    _CAPPED_RE,
    _DECODE_FIELDS,
    _DECODE_SINCE,
    _DECODE_UNTIL,
    _EVENT_TRIGGER_RE,
    _FLAG_RE,
    _GRAPH_BS_RE,
    _GRAPH_END_BS_RE,
    _GRAPH_END_RE,
    _GRAPH_MEM_RE,
    _HICACHE_AUTO_RE,
    _HICACHE_RE,
    _HOST_MEM_ERR_RE,
    _KV_RE,
    _LAST_FIELDS,
    _LOAD_BEGIN_RE,
    _LOAD_END_RE,
    _MAX_NUM_REQS_RE,
    _MEMPOOL_END_RE,
    _NO_HIGH,
    _NO_KV_MEM_RE,
    _NOT_ENOUGH_MEM,
    _OOM_RE,
    _PREFILL_FIELDS,
    _PREFILL_SINCE,
    _PREFILL_UNTIL,
    _PROFILED_RE,
    _REDUCED_RE,
    _RETRACT_RE,
    _SPEC_RESET_RE,
    _SUFFIX_PREFIXES,
    _SUMMARY_RE,
    _TAG_RE,
    IMPOSSIBLE,
    TRIGGER_RE,
    TRIGGERS,
    _num,
    _split_fields,
    date_ok,
    epoch_day,
    rank_of,
    time_ok,
)
from diagnoser.engines.sglang.logline import (  # noqa: F401  (unwrap re-exported)
    ANSI_RE,
    LOOSE_PREFIX_RE,
    TAGS_IN_RE,
    Stamp,
    envelope,
    locate,
    stamp,
    unwrap,
)
from diagnoser.engines.sglang.serverargs import parse_server_args_repr
from diagnoser.engines.sglang.versions import OLDEST, Version, VersionRange, fmt
from diagnoser.model import BadLine, LogEvent, SignalSink

_FACTS_RE = re.compile(r"(\w+)=([\d.]+)")


class SGLangLogParser:
    """Stateful line parser: one per log source (it keeps the version hints and the last timestamp).

    This is the reference parser: :mod:`diagnoser.engines.sglang.logfast` reads the common shapes in
    bulk and must produce exactly what this class produces (a test proves it on every real log).
    """

    def __init__(self, sink: SignalSink, source_name: str = "server.log") -> None:
        self.sink = sink
        self.source_name = source_name
        self.version = VersionRange()
        self.last_ts: float | None = None
        self.untimed_lines = 0
        self.kinds: Counter[str] = Counter()
        self.status_codes: Counter[str] = Counter()
        self.access_paths: Counter[str] = Counter()
        self.access_last: tuple[float, int] | None = None  # (ts, line_no) of the last access line
        self._day_cache: dict[str, int] = {}
        self._finished = False
        self._hints: set[str] = set()
        self._hint_keys: set[tuple[bool, Version, str]] = set()
        self._shapes_hinted: set[tuple[Any, ...]] = set()
        self._lows: list[Version] = []
        self._highs: list[Version] = []
        self._retract_seen: set[tuple[float, str, str]] = set()
        self.saw_date = False
        self._pending: list[LogEvent] = []  # events of side lines read before any timestamp
        self.first_stamp: str | None = None  # the date of the first dated prefix (YYYY-MM-DD), for the version bound
        self.graph_labels: set[str] = set()  # "cuda", "cpu", "npu", "musa": the device the batch lines name
        self._pd_seen: set[tuple[str, str, str]] = set()
        self.dropped_values = 0  # batch-line fields that were NaN, ±Inf or negative (not read)

    # -- version hints -------------------------------------------------------------------------
    def hint_at_least(self, v: Version, why: str) -> None:
        self._hint(v, why, lower=True)

    def hint_at_most(self, v: Version, why: str) -> None:
        self._hint(v, why, lower=False)

    def _hint(self, v: Version, why: str, *, lower: bool) -> None:
        """Narrow the version range. The range is a pure function of the *set* of hints seen (order
        and repeats do not matter); conflicting hints mean a development build between two releases
        (e.g. main between 0.5.3 and 0.5.4), reported as that span."""
        key = (lower, v, why)
        if key in self._hint_keys:  # a repeated hint (most lines repeat one): no text to build
            return
        self._hint_keys.add(key)
        text = f"{'>=' if lower else '<='} {fmt(v)}: {why}"
        if text in self._hints:
            return
        self._hints.add(text)
        (self._lows if lower else self._highs).append(v)
        lo = max(self._lows, default=OLDEST)
        hi = min(self._highs, default=_NO_HIGH)
        vr = self.version
        vr._why(text)
        if lo > hi:
            lo, hi = hi, lo
            vr._why(f"conflicting hints: a development build between {fmt(lo)} and {fmt(hi)}")
        vr.low, vr.high = lo, hi

    # -- prefix --------------------------------------------------------------------------------
    def _ts(self, m: re.Match[str]) -> float:
        """The prefix's time; raises :class:`BadLine` for a stamp no calendar has (``logformats.date_ok``)."""
        date, frac = m.group(1), m.group(5)
        h, mi, s = int(m.group(2)), int(m.group(3)), int(m.group(4))
        if not time_ok(h, mi, s):
            raise BadLine("timestamp")
        secs = h * 3600 + mi * 60 + s
        if date:
            day = self._day_cache.get(date)
            if day is None:
                y, mo, d = int(date[0:4]), int(date[5:7]), int(date[8:10])
                day = self._day_cache[date] = epoch_day(y, mo, d) if date_ok(y, mo, d) else -1
            if day == -1:
                raise BadLine("timestamp")
            self.saw_date = True
            if self.first_stamp is None:
                self.first_stamp = date
        else:
            # time-only prefix (<= 0.3.3, or abbreviated when pasted): keep the day of the last stamp
            day = 0 if self.last_ts is None else int(self.last_ts // 86400) * 86400
            if self.last_ts is not None and day + secs + 43200 < self.last_ts:  # wrapped past midnight
                day += 86400
        ts = day + secs
        return ts + (float("0." + frac) if frac else 0.0)

    _rank = staticmethod(rank_of)

    def _tag_hints(self, tags: str) -> None:
        """Rank-tag order per release (docs/sglang.md#log-prefix)."""
        names = _TAG_RE.findall(tags)
        order = [k for k, _ in names]
        if "ATTN_CP" in order or "MOE_DP" in order:
            self.hint_at_least((0, 5, 9), "ATTN_CP/MOE_DP rank tag")
        if "EP" in order:
            self.hint_at_least((0, 4, 10), "EP rank tag")
        if "PP" in order:
            pp = order.index("PP")
            if any(k in ("TP", "EP") for k in order[:pp]):
                self.hint_at_most((0, 5, 5), "PP tag after TP/EP")
            elif "TP" in order[pp:]:
                self.hint_at_least((0, 5, 6), "PP tag before TP")

    # -- main entry ----------------------------------------------------------------------------
    def feed(self, line: str, line_no: int) -> bool:
        """Parse one line. Returns True when the line was recognised.

        A line with none of :data:`TRIGGERS` is unrecognised and leaves the parser untouched. The
        message is found by its head (:func:`~diagnoser.engines.sglang.logline.find_head`), whatever the
        prefix before it; the prefix gives the time and the rank tags when it has them.
        """
        if not TRIGGER_RE.search(line):
            return False
        line = line.rstrip("\r\n")
        outer: float | str | None = None  # the time a JSON envelope gives beside its message
        if "\x1b" in line:
            line = ANSI_RE.sub("", line)
        if line[:1] == "{" or line[:1] in " \t" and line.lstrip()[:1] == "{":
            env = envelope(line)
            if env is not None:
                line, outer = env
                if "\x1b" in line:
                    line = ANSI_RE.sub("", line)
                if not TRIGGER_RE.search(line):
                    return False
        line, m, head = locate(line)
        if head is not None:
            return self._located(line, head.start(), outer, line_no)
        if m:
            ts = self._ts(m)
            tag_text = m.group(6) or ""
            rank, tags = self._rank(tag_text)
            msg = line[m.end():]
            if m.group(1) is None and not self.saw_date and tags:
                self.hint_at_most((0, 3, 3), "time-only log prefix")
            if m.group(5):
                self.hint_at_least((0, 5, 6), "milliseconds in the log prefix (SGLANG_LOG_MS)")
            if tags:
                self._tag_hints(tag_text)
            elif m.group(1) and ("Decode batch" in msg or "Prefill batch" in msg):
                self.hint_at_least((0, 4, 7), "scheduler line without a rank tag")
            self.last_ts = ts
        else:
            msg = line.lstrip()
            # strip Ray / compose prefixes even without a timestamp
            msg = _BARE_PREFIX_RE.sub("", msg).lstrip()
            rank, tags = "", {}
            glog = logevents.glog_prefix(msg) if msg[:1] in "IWEF" else None
            if glog is not None:  # a C++ library's glog line (Mooncake): its own time, no year
                (mo, d, hh, mi, ss, frac), msg = glog
                ts = self._glog_ts(mo, d, hh, mi, ss, frac)
            else:
                # a line without a head (a traceback's, an exception's) behind a collector's or a
                # formatter's prefix: only the prefix tokens every such prefix is made of are taken off
                lp = LOOSE_PREFIX_RE.match(msg)
                st = None
                if lp is not None and lp.end():
                    st = stamp(msg[:lp.end()])
                    msg = msg[lp.end():].lstrip()
                if st is not None or outer is not None:
                    ts = self._stamp_ts(st) if st is not None else self._outer_ts(outer)
                    self.last_ts = ts
                elif logevents.is_side_line(msg):
                    ts = self._side_ts()
                else:
                    ts = self._untimed_ts()
        src = f"{self.source_name}:{line_no}"
        return self._message(msg, ts, rank, tags, src, line_no)

    def _located(self, line: str, at: int, outer: float | str | None, line_no: int) -> bool:
        """A message found by its head at ``at``, behind a prefix that is not SGLang's own: the time is
        the prefix's last stamp (SGLang's clock when a collector's comes first), else the envelope's, else
        the line counts in order; the rank is the tags the prefix holds. No other version hint is taken
        from a prefix that is not SGLang's."""
        prefix = line[:at]
        st = stamp(prefix)
        tag_text = " ".join(TAGS_IN_RE.findall(prefix))
        rank, tags = self._rank(tag_text)
        if tags:
            self._tag_hints(tag_text)
        msg = line[at:]
        if st is not None:
            ts = self._stamp_ts(st)
            self.last_ts = ts
        elif outer is not None:
            ts = self._outer_ts(outer)
            self.last_ts = ts
        elif logevents.is_side_line(msg):
            ts = self._side_ts()
        else:
            ts = self._untimed_ts()
        return self._message(msg, ts, rank, tags, f"{self.source_name}:{line_no}", line_no)

    def _stamp_ts(self, st: Stamp) -> float:
        """A prefix's :class:`~diagnoser.engines.sglang.logline.Stamp` as epoch seconds (UTC): a date with
        its offset; a syslog month and day in the year of the last stamp (1970 before any); a bare time in
        the day of the last stamp, as :meth:`_ts` does. Raises :class:`BadLine` for a time no calendar has."""
        h, mi, s = st.hms
        if not time_ok(h, mi, s):
            raise BadLine("timestamp")
        secs = h * 3600 + mi * 60 + s
        if st.date is not None or st.syslog is not None:
            if st.date is not None:
                y, mo, d = st.date
            else:
                import time as _time

                y = _time.gmtime(self.last_ts).tm_year if self.last_ts is not None and self.last_ts == self.last_ts else 1970
                mo, d = st.syslog  # type: ignore[misc]
            if not date_ok(y, mo, d):
                raise BadLine("timestamp")
            self.saw_date = True
            if self.first_stamp is None:
                self.first_stamp = f"{y:04d}-{mo:02d}-{d:02d}"
            day = epoch_day(y, mo, d)
        else:
            day = 0 if self.last_ts is None else int(self.last_ts // 86400) * 86400
            if self.last_ts is not None and day + secs + 43200 < self.last_ts:  # wrapped past midnight
                day += 86400
        return day + secs - st.offset + st.fraction

    def _outer_ts(self, outer: float | str) -> float:
        """The time a JSON envelope gives: epoch seconds, or a text holding a stamp."""
        if isinstance(outer, float):
            if not 0.0 <= outer < 253_370_764_800.0:  # 9998-12-31, as logformats.STAMP_YEARS
                raise BadLine("timestamp")
            if self.first_stamp is None:
                import time as _time

                self.first_stamp = _time.strftime("%Y-%m-%d", _time.gmtime(outer))
            self.saw_date = True
            return outer
        st = stamp(outer)
        if st is None:
            return self._untimed_ts()
        return self._stamp_ts(st)

    def _untimed_ts(self) -> float:
        # Lines with no timestamp (pasted without prefix): order them one second apart after the last stamp.
        self.untimed_lines += 1
        base = self.last_ts if self.last_ts is not None else 0.0
        self.last_ts = base + 1.0
        return self.last_ts

    def _side_ts(self) -> float:
        """A traceback or allocator-state line without a stamp: it belongs to the line before it, so it
        takes that line's time without moving the clock; before any stamp, its events wait for one."""
        self.untimed_lines += 1
        return self.last_ts if self.last_ts is not None else float("nan")

    def _glog_ts(self, mo: int, d: int, hh: int, mi: int, ss: int, frac: float) -> float:
        """A glog stamp (month and day, no year): the year of the last stamp, else NaN (its events wait)."""
        if self.last_ts is None:
            return float("nan")
        import time as _time

        year = _time.gmtime(self.last_ts).tm_year
        try:
            return epoch_day(year, mo, d) + hh * 3600 + mi * 60 + ss + frac
        except (ValueError, OverflowError):
            return self.last_ts

    def emit_event(self, event: LogEvent) -> None:
        """Write an event; one read before any timestamp (NaN time) is kept until :meth:`finish`, which
        gives it the log's first time."""
        if event.ts != event.ts:
            if len(self._pending) < 10_000:
                self._pending.append(event)
            return
        self.sink.add_event(event)

    def bulk(self) -> Any:
        """The chunk reader for backfilling large logs (same result as :meth:`feed`, much faster)."""
        from diagnoser.engines.sglang.logfast import BulkReader

        return BulkReader(self)

    def access_summary(self) -> dict[str, Any]:
        """Requests and status codes counted from the access-log lines."""
        return {
            "requests": sum(self.status_codes.values()),
            "status": dict(sorted(self.status_codes.items())),
            "paths": dict(self.access_paths.most_common(10)),
        }

    def finish(self) -> None:
        """Emit what is only known at the end of the log (one access-log summary event, once)."""
        if self._pending:
            span = getattr(self.sink, "span", None)
            first = span()[0] if span is not None else None
            t0 = float(first) if first is not None else 0.0
            for e in self._pending:
                self.emit_event(LogEvent(e.kind, t0, e.line_no, e.source, e.fields, e.rank))
            self._pending = []
        if self.access_last is not None and not self._finished:
            self._finished = True
            ts, line_no = self.access_last
            self.emit_event(LogEvent("access_summary", ts, line_no, f"{self.source_name}:{line_no}", self.access_summary()))

    def _message(self, msg: str, ts: float, rank: str, tags: dict[str, int], src: str, line_no: int) -> bool:
        sink = self.sink
        if "batch" in msg:
            bm = _BATCH_RE.search(msg)
            if bm and bm.start() < 40:
                return self._batch(msg, bm, ts, rank, src)
        if "HTTP/" in msg:
            am = _ACCESS_RE.search(msg)
            if am:
                self.status_codes[am.group(3)] += 1
                self.access_paths[f"{am.group(1)} {am.group(2)}"] += 1
                self.access_last = (ts, line_no)
                self.kinds["access"] += 1
                return True
        if msg.startswith("new fill batch."):
            return self._old_fill(msg, ts, rank, src)
        side = _EVENT_TRIGGER_RE.search(msg) is not None and logevents.read(self, msg, ts, rank, src, line_no)
        if side and msg.startswith('File "'):
            return True
        if "leak detected" in msg:  # before the summary line: the leak check prints max_total_num_tokens= too
            self.emit_event(LogEvent("kv_leak", ts, line_no, src, {"text": msg[:200]}, rank))
            self.kinds["leak"] += 1
            return True
        if msg[:1] == "#" or msg.startswith(_FRAGMENT_STARTS):
            fields = _split_fields(msg)
            if msg.startswith("#running-req:") and "#queue-req" in msg and _V01_DECODE_KEYS.issuperset(k for k, _ in fields):
                if self._emit(fields, _DECODE_FIELDS, ts, rank, src):  # v0.1.x decode line, no header
                    self.hint_at_most((0, 2, 99), "v0.1.x decode line without header")
                    self.kinds["decode"] += 1
                    return True
            if self._fragment(fields, ts, rank, src):
                return True
        if "retracted_reqs" in msg:
            rm = _RETRACT_RE.search(msg)
            if rm:
                return self._retract(msg, rm, ts, rank, tags, src, line_no)
        if "out of memory" in msg:
            om = _OOM_RE.search(msg)
            if om:
                self.emit_event(LogEvent("oom", ts, line_no, src, {"phase": om.group(1).lower(), "text": msg[:200]}, rank))
                self.kinds["oom"] += 1
                return True
        if "max_total_num_tokens=" in msg:
            return self._summary(msg, ts, src, line_no)
        if msg.startswith("server_args=ServerArgs(") or msg.startswith("server_args="):
            args = parse_server_args_repr(msg)
            facts_from_args(args, sink, src)
            self.emit_event(LogEvent("server_args", ts, line_no, src, {"count": len(args)}, rank))
            self.kinds["server_args"] += 1
            return True
        if "KV Cache is allocated" in msg or "KV cache allocated" in msg:
            return self._kv_alloc(msg, src)
        if "Load weight" in msg:
            lm = _LOAD_END_RE.search(msg)
            if lm:
                sink.set_config("avail_mem_after_weights_gb", float(lm.group(1)), src)
                if lm.group(2):
                    sink.set_config("weight_mem_gb", float(lm.group(2)), src)
                if "Load weight end. elapsed=" in msg:
                    self.hint_at_least((0, 5, 9), "'Load weight end. elapsed=' line")
                self.kinds["startup"] += 1
                return True
            lb = _LOAD_BEGIN_RE.search(msg)
            if lb:
                sink.set_config("avail_mem_before_weights_gb", float(lb.group(1)), src)
                self.kinds["startup"] += 1
                return True
        if "Memory pool end" in msg:
            mp = _MEMPOOL_END_RE.search(msg)
            if mp:
                sink.set_config("avail_mem_after_pool_gb", float(mp.group(1)), src)
                self.kinds["startup"] += 1
                return True
        if "graph" in msg and "Capture" in msg or "Capturing batches" in msg:
            return self._graph(msg, src)
        if "hierarchical" in msg or "HiCache" in msg:
            hm = _HICACHE_RE.search(msg)
            if hm:
                gb = hm.group(1) or hm.group(4)
                sink.set_config("hicache_host_gb", float(gb), src)
                if hm.group(3):
                    sink.set_config("hicache_host_tokens", int(hm.group(3)), src)
                    self.hint_at_least((0, 5, 17), "'hierarchical KV host pool' allocation line")
                else:
                    self.hint_at_most((0, 5, 16), "'GB host memory for hierarchical KV cache' allocation line")
                sink.set_config("enable_hierarchical_cache", True, src)
                self.kinds["startup"] += 1
                return True
            ha = _HICACHE_AUTO_RE.search(msg)
            if ha:
                sink.set_config("hicache_ratio", float(ha.group(2)), src)
                sink.set_config("hicache_host_gb", float(ha.group(3)) * 1.073741824, src)
                sink.set_config("hicache_host_pools_gib", float(ha.group(6)), src)
                sink.set_config("enable_hierarchical_cache", True, src)
                self.hint_at_least((0, 5, 21), "'HiCache auto-sizing' line")
                self.kinds["startup"] += 1
                return True
            he = _HOST_MEM_ERR_RE.search(msg)
            if he:
                self.emit_event(LogEvent("hicache_host_oom", ts, line_no, src, {"requested_gb": float(he.group(1)), "free_gb": float(he.group(2))}, rank))
                self.kinds["oom"] += 1
                return True
        if "max_running_requests was reduced" in msg:
            rr = _REDUCED_RE.search(msg)
            if rr:
                sink.set_config("max_running_requests_requested", int(rr.group(1)), src)
                sink.set_config("max_running_requests", int(rr.group(2)), src)
                self.emit_event(LogEvent("max_running_requests_reduced", ts, line_no, src, {"requested": int(rr.group(1)), "effective": int(rr.group(2))}, rank))
                self.kinds["startup"] += 1
                return True
        if "max_num_reqs" in msg:
            mn = _MAX_NUM_REQS_RE.search(msg)
            if mn:
                sink.set_config("max_running_requests", int(mn.group(1)), src, override=False)
                sink.set_config("req_pool_size", int(mn.group(1)), src)
                self.kinds["startup"] += 1
                return True
        if "Max running requests is reset" in msg:
            sm = _SPEC_RESET_RE.search(msg)
            if sm:
                sink.set_config("max_running_requests", int(sm.group(1)), src)
                self.emit_event(LogEvent("max_running_requests_reduced", ts, line_no, src, {"requested": None, "effective": int(sm.group(1)), "reason": "speculative decoding"}, rank))
                self.hint_at_least((0, 5, 5) if "You can override" in msg else (0, 5, 4), "speculative max-running-requests reset notice")
                self.kinds["startup"] += 1
                return True
        if "fired up and ready to roll" in msg:
            self.emit_event(LogEvent("ready", ts, line_no, src, {}, rank))
            self.kinds["startup"] += 1
            return True
        if "mem-fraction-static" in msg:
            am2 = _AUTO_MEM_RE.search(msg)
            if am2:
                sink.set_config("mem_fraction_static", float(am2.group(1)), src)
                self.hint_at_least((0, 4, 2), "'Automatically reduce --mem-fraction-static' notice")
                self.hint_at_most((0, 4, 8), "'Automatically reduce --mem-fraction-static' notice")
                self.kinds["startup"] += 1
                return True
            nk = _NO_KV_MEM_RE.search(msg)
            if nk or any(s in msg for s in _NOT_ENOUGH_MEM):
                if nk:
                    sink.set_config("mem_fraction_static", float(nk.group(1)), src)
                    self.hint_at_least((0, 5, 14), "'Loaded weights leave no GPU memory' message")
                self.emit_event(LogEvent("startup_oom", ts, line_no, src, {"text": msg[:200]}, rank))
                self.kinds["oom"] += 1
                return True
        if "larger than the profiled value" in msg:
            pm = _PROFILED_RE.search(msg)
            if pm:
                sink.set_config("max_total_tokens_requested", int(pm.group(1)), src)
                self.kinds["startup"] += 1
                return True
        if msg.startswith("Cuda graph is disabled"):
            sink.set_config("cuda_graph_disabled_reason", msg[len("Cuda graph is disabled"):].strip(" .") or "disabled", src)
            sink.set_config("disable_cuda_graph", True, src)
            self.kinds["startup"] += 1
            return True
        if "Health check failed" in msg:
            self.emit_event(LogEvent("health_failed", ts, line_no, src, {"text": msg[:200]}, rank))
            self.kinds["health"] += 1
            return True
        if msg.startswith("max_running_requests ") and not side:
            cm = _CAPPED_RE.search(msg)
            if cm:
                return self._capped(msg, cm, ts, rank, src, line_no)
        return True if side else self.unrecognised(msg, ts, rank, tags, src, line_no)

    def unrecognised(self, msg: str, ts: float, rank: str, tags: dict[str, int], src: str, line_no: int) -> bool:
        """The one place a located message body (its prefix read: ``ts``, ``rank``, ``tags``) that no
        parser above recognised is handed on: a catalogue template (engines/sglang/templates.py) reads it
        when one matches; True when something here reads it. Only lines with one of :data:`TRIGGERS` get
        this far (a template read here needs its words among them)."""
        return templates.read(self, msg, ts, rank, src, line_no)

    def _fragment(self, fields: list[tuple[str, str]], ts: float, rank: str, src: str) -> bool:
        """A batch line's field list pasted without its head ("#running-req: 12, #token: 3400, token
        usage: 0.97, ..."): read for the fields it carries (a prefill field makes it a prefill line), when
        at least two of them are known numbers. No version hint: the line's shape is not all there."""
        keys = {k for k, _ in fields}
        kind, table = ("prefill", _PREFILL_FIELDS) if keys & _PREFILL_ONLY else ("decode", _DECODE_FIELDS)
        if sum(1 for k, v in fields if table.get(k) and _num(v) is not None) < 2:
            return False
        self._emit(fields, table, ts, rank, src, decode=kind == "decode")
        self.kinds[kind] += 1
        return True

    def _capped(self, msg: str, cm: re.Match[str], ts: float, rank: str, src: str, line_no: int) -> bool:
        """``max_running_requests is capped to 9 by the mamba state cache (…). To raise it: increase
        --mamba-full-memory-ratio or …``: the effective cap, the reason and the levers the line names."""
        requested = int(cm.group(1)) if cm.group(1) else None
        effective = int(cm.group(2))
        reason = (cm.group(3) or "").strip() or None
        detail = cm.group(4)
        levers = []
        for fm in _FLAG_RE.finditer(msg[cm.end():]):
            levers.append((fm.group(1), fm.group(2)))
        self.sink.set_config("max_running_requests", effective, src)
        if requested:
            self.sink.set_config("max_running_requests_requested", requested, src)
        fields: dict[str, Any] = {"requested": requested, "effective": effective, "reason": reason, "levers": levers}
        if detail:
            fields["detail"] = detail
        self.emit_event(LogEvent("max_running_requests_reduced", ts, line_no, src, fields, rank))
        self.kinds["startup"] += 1
        return True

    # -- startup lines -------------------------------------------------------------------------
    def _kv_alloc(self, msg: str, src: str) -> bool:
        km = _KV_RE.search(msg)
        if not km:
            return False
        sink = self.sink
        dtype, tokens, k, v, kv = km.groups()
        if tokens:
            sink.set_config("kv_pool_tokens_log", int(tokens), src)
        size = float(kv) if kv else (float(k or 0) + float(v or 0))
        sink.set_config("kv_cache_gb", size, src)
        if k:
            sink.set_config("kv_k_size_gb", float(k), src)
        sink.set_config("attention_kind_hint", "mla" if kv else "mha", src)
        if dtype:
            sink.set_config("kv_cache_dtype_log", dtype, src)
            self.hint_at_least((0, 5, 13), "dtype in the KV Cache allocation line")
        if tokens:
            self.hint_at_least((0, 4, 4), "#tokens in the KV Cache allocation line")
        else:
            self.hint_at_most((0, 4, 3), "KV Cache allocation line without #tokens")
        if kv:
            self.hint_at_least((0, 4, 6), "MLA 'KV size' in the KV Cache allocation line")
        if "Post-capture KV sizing" in msg:
            sink.set_config("kv_post_capture_sizing", True, src)
            am = re.search(r"avail mem=([\d.]+) GB", msg)
            if am:
                sink.set_config("avail_mem_after_pool_gb", float(am.group(1)), src)
        self.kinds["startup"] += 1
        return True

    def _graph(self, msg: str, src: str) -> bool:
        sink = self.sink
        if "Capturing batches" in msg:
            # tqdm's progress bar: sizes are captured largest first, so the size shown at step 0/N is the maximum
            # (a bar that shows only its last step, bs=1 at N/N, says nothing about the maximum)
            for bs, step in re.findall(r"Capturing batches \(bs=(\d+)[^)]*\):[^\r]*?\|\s*(\d+)/\d+", msg):
                if step == "0":
                    sink.set_config("cuda_graph_max_bs_captured", int(bs), src)
                    break
        capture = _GRAPH_BS_RE.search(msg)
        gb = capture or _GRAPH_END_BS_RE.search(msg)
        if gb:
            listed = gb.group(1)
            sizes = [int(x) for x in listed.replace(" ", "").split(",") if x.isdigit()]
            if sizes and "..." not in listed:  # an elided list ("[1, 2, 4, ...]") does not give the maximum
                sink.set_config("cuda_graph_bs", sizes, src)
                sink.set_config("cuda_graph_max_bs_captured", max(sizes), src)
            if capture:
                self.hint_at_least((0, 4, 7), "'Capture cuda graph bs [...]' line")
        elif "bs=" in msg:  # a capture line of a shape the patterns above do not know: SGLang's own template reads it
            templates.read(self, msg, self.last_ts if self.last_ts is not None else 0.0, "", src, 0)
        if _GRAPH_END_RE.search(msg) and "piecewise" not in msg and "draft" not in msg:
            am = _AVAIL_RE.search(msg)
            if am:
                sink.set_config("avail_mem_after_graph_gb", float(am.group(1)), src)
            mu = _GRAPH_MEM_RE.search(msg)
            if mu:
                sink.set_config("graph_mem_gb", float(mu.group(1)), src)
        if "target decode CUDA graph" in msg or "target verify CUDA graph" in msg or "target prefill CUDA graph" in msg:
            self.hint_at_least((0, 5, 14), "'Capture target ... CUDA graph' line")
        elif re.search(r"Capture (?:cuda|cpu|npu|musa) graph (?:begin|end)", msg):
            self.hint_at_most((0, 5, 13), "old-style 'Capture cuda graph begin/end' line")
            if re.search(r"Capture (?:cpu|npu) graph", msg):
                self.hint_at_least((0, 5, 2), "device label in the graph capture line")
            if "avail mem=" in msg:
                self.hint_at_least((0, 4, 4), "avail mem in the graph capture line")
        elif "piecewise CUDA graph" in msg:
            self.hint_at_least((0, 5, 6), "piecewise CUDA graph capture")
            self.hint_at_most((0, 5, 13), "piecewise CUDA graph capture")
        self.kinds["startup"] += 1
        return True

    # -- batch lines ---------------------------------------------------------------------------
    def _batch(self, msg: str, bm: re.Match[str], ts: float, rank: str, src: str) -> bool:
        kind = bm.group(1)
        header = msg[bm.start():bm.end()]
        body = msg[bm.end():]
        fields = _split_fields(body)
        if not fields:
            return False
        table = _DECODE_FIELDS if kind == "Decode" else _PREFILL_FIELDS
        read = self._emit(fields, table, ts, rank, src, decode=kind == "Decode")
        if bm.group(2):  # "Prefill batch(mixed #running-req: N)"
            self.sink.add("running_reqs", ts, float(bm.group(2)), src, rank)
        elif not read:  # a batch head over fields that carry nothing ("Decode batch, #x: 1"): not a batch line
            return False
        self._batch_version_hints(kind, header, body, fields)
        self.kinds[kind.lower()] += 1
        return True

    def _emit(self, fields: list[tuple[str, str]], table: dict[str, str | None], ts: float, rank: str, src: str, decode: bool = False) -> int:
        """Write the fields that name a signal and hold a number; returns how many did (a value no
        scheduler line can hold counts too: it is counted in ``dropped_values``). Which fields count is
        :func:`~diagnoser.engines.sglang.logformats.batch_reads` (the bulk reader's decision)."""
        add = self.sink.add
        usages = []
        read = 0
        for key, val in fields:
            if key.startswith(_SUFFIX_PREFIXES):
                continue
            signal = table.get(key)
            if signal is None:
                continue
            v = _num(val)
            if v is None:
                continue
            read += 1
            if v == IMPOSSIBLE:  # NaN, ±Inf or negative: counted, not read
                self.dropped_values += 1
                continue
            add(signal, ts, v, src, rank)
            if signal in ("full_token_usage", "swa_token_usage", "mamba_usage"):
                usages.append(v)
        if usages and not any(k == "token usage" for k, _ in fields):
            # hybrid models: the scheduler's token_usage gauge is max over the pools (docs/sglang.md#metrics-scheduler)
            add("token_usage", ts, max(usages), src, rank)
        return read

    def _batch_version_hints(self, kind: str, header: str, body: str, fields: list[tuple[str, str]]) -> None:
        """Version range implied by one batch line's shape (docs/sglang.md#prefill-line, docs/sglang.md#decode-line)."""
        h = header.rstrip()
        trailing = body.rstrip().endswith(",")
        shape = (kind, h[-1:], "[" in h, trailing, fields[-1][0] if fields else "", *(k for k, _ in fields))
        if shape in self._shapes_hinted:  # hints are a set: a repeated shape adds nothing
            return
        if len(self._shapes_hinted) < 4096:
            self._shapes_hinted.add(shape)
        hint_lo, hint_hi = self.hint_at_least, self.hint_at_most
        keys = {k for k, _ in fields}
        for label in ("cpu graph", "npu graph", "musa graph", "cuda graph"):
            if label in keys:
                self.graph_labels.add(label.split()[0])
        if h.endswith(","):
            if "[" in h:
                hint_lo((0, 5, 4), f"'{kind} batch [N],' header")
            else:
                hint_lo((0, 5, 5), f"'{kind} batch,' header")
            if trailing:
                hint_hi((0, 5, 8), f"'{kind} batch,' line with a trailing comma")
            elif fields[-1][0] in _LAST_FIELDS or fields[-1][0].startswith("est. "):
                hint_lo((0, 5, 9), f"'{kind} batch,' line without a trailing comma")
        elif h.endswith("."):
            hint_hi((0, 5, 3), f"'{kind} batch.' header")
            if trailing:
                hint_lo((0, 4, 4), f"'{kind} batch.' line with a trailing comma")
            elif "#queue-req" in keys and fields[-1][0] in ("#queue-req", "#transferring-req", "time", "input throughput (token/s)"):
                hint_hi((0, 4, 9), f"'{kind} batch.' line without a trailing comma")
                if kind == "Prefill" and "cache hit rate" not in keys and "(mixed" not in h:
                    hint_lo((0, 4, 4), "'Prefill batch.' line without cache hit rate")
        since, until = (_DECODE_SINCE, _DECODE_UNTIL) if kind == "Decode" else (_PREFILL_SINCE, _PREFILL_UNTIL)
        for key in keys:
            v = since.get(key)
            if v is not None:
                hint_lo(v, f"'{key}' field in {kind.lower()} lines")
            v = until.get(key)
            if v is not None:
                hint_hi(v, f"'{key}' field in {kind.lower()} lines")
        if any(k.startswith("est. ") for k in keys):
            hint_lo((0, 5, 10), "MFU 'est. ...' suffix")

    def _old_fill(self, msg: str, ts: float, rank: str, src: str) -> bool:
        vals = dict(re.findall(r"(#?\w+): ([\d.]+%?)", msg))
        m = {"#seq": "prefill_new_seqs", "#new_token": "prefill_new_tokens", "#cached_token": "prefill_cached_tokens",
             "#running_req": "running_reqs", "#remaining_req": "queue_reqs", "tree_cache_hit_rate": "cache_hit_rate"}
        read = 0
        for k, sig in m.items():
            if k in vals:
                v = _num(vals[k])
                if v is not None:
                    read += 1
                    if v != IMPOSSIBLE:
                        self.sink.add(sig, ts, v, src, rank)
        if not read:  # "new fill batch." over nothing it reads: not a batch line
            return False
        self.hint_at_most((0, 2, 99), "v0.1.x 'new fill batch' line")
        self.kinds["prefill"] += 1
        return True

    def _retract(self, msg: str, rm: re.Match[str], ts: float, rank: str, tags: dict[str, int], src: str, line_no: int) -> bool:
        n = int(rm.group(1))
        if "Decode out of memory happened" in msg:
            self.hint_at_most((0, 4, 6), "'Decode out of memory happened' retraction wording")
        elif rm.group(2) is not None:
            self.hint_at_least((0, 5, 7), "#new_tokens_gained in the retraction line")
        elif "KV cache pool is full" in msg:
            self.hint_at_least((0, 4, 7), "'KV cache pool is full' retraction wording")
            self.hint_at_most((0, 5, 6), "retraction line without #new_tokens_gained")
        if "Beam search group aborted" in msg:
            self.hint_at_least((0, 5, 19), "beam-search retraction line")
        # Every TP rank of one DP group prints the same retraction: count it once.
        key = (ts, rank, msg)
        fields: dict[str, Any] = {"retracted_reqs": n}
        if "Testing retraction" in msg:
            fields["test_mode"] = True
        if "Beam search group aborted" in msg:
            fields["beam_search"] = True
        if rm.group(3):
            fields["mamba_num_gained"] = int(rm.group(3))
        if rm.group(2):
            fields["new_tokens_gained"] = int(rm.group(2))
        if rm.group(4):
            fields["new_token_ratio_before"] = float(rm.group(4))
            fields["new_token_ratio_after"] = float(rm.group(5))
        if key in self._retract_seen:
            self.kinds["retract_dup"] += 1
            return True
        self._retract_seen.add(key)
        if len(self._retract_seen) > 4096:
            self._retract_seen.clear()
            self._retract_seen.add(key)
        self.emit_event(LogEvent("retraction", ts, line_no, src, fields, rank))
        self.sink.add("retracted_reqs", ts, float(n), src, rank)
        if rm.group(5):
            self.sink.add("new_token_ratio", ts, float(rm.group(5)), src, rank)
        self.kinds["retraction"] += 1
        return True

    def _summary(self, msg: str, ts: float, src: str, line_no: int) -> bool:
        if not _SUMMARY_RE.search(msg):
            return False
        facts = dict(_FACTS_RE.findall(msg))
        sink = self.sink
        mapping = {
            "max_total_num_tokens": "max_total_tokens",
            "chunked_prefill_size": "chunked_prefill_size",
            "max_prefill_tokens": "max_prefill_tokens",
            "max_running_requests": "max_running_requests",
            "context_len": "context_len",
        }
        for k, name in mapping.items():
            v = _num(facts[k]) if k in facts else None
            if v is not None and v != IMPOSSIBLE:
                sink.set_config(name, int(v), src)
        pool = _num(facts.get("max_total_num_tokens", ""))
        if pool is not None and pool != IMPOSSIBLE:
            sink.add("max_total_tokens", ts, pool, src)
        for mem_key in ("available_gpu_mem", "available_cpu_mem"):
            if mem_key in facts:
                sink.set_config("available_gpu_mem_gb", float(facts[mem_key]), src)
                sink.set_config("device", "cpu" if mem_key == "available_cpu_mem" else "gpu", src)
                self.hint_at_least((0, 5, 2) if mem_key == "available_cpu_mem" else (0, 4, 7), f"{mem_key} in the summary line")
        if "chunked_prefill_size" in facts:
            self.hint_at_least((0, 4, 2), "chunked_prefill_size in the summary line")
        elif "max_prefill_tokens" in facts:
            self.hint_at_most((0, 4, 1), "summary line without chunked_prefill_size")
        if "chunked_prefill_size" in facts and not any(k in facts for k in ("available_gpu_mem", "available_cpu_mem")):
            self.hint_at_most((0, 4, 6), "summary line without available_gpu_mem")
        self.kinds["startup"] += 1
        return True


_V01_DECODE_KEYS = frozenset(("#running-req", "#token", "token usage", "#queue-req"))  # docs/sglang.md#logs (0.1.x)
_PREFILL_ONLY = frozenset(_PREFILL_FIELDS).difference(_DECODE_FIELDS)
_FRAGMENT_STARTS = ("token usage: ", "full token usage: ", "swa token usage: ", "gen throughput (token/s): ",
                    "input throughput (token/s): ", "cache hit rate: ", "cuda graph: ", "cpu graph: ", "npu graph: ", "musa graph: ")
