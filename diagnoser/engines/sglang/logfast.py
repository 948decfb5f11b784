"""Bulk log backfill: the common SGLang line shapes read a chunk at a time, exactly as the line parser would.

:class:`~diagnoser.engines.sglang.logs.SGLangLogParser` is the reference: it reads one line at a time
and knows every format, at several microseconds a line. This module reads the shapes that make up
almost all of a busy log — current and older "Decode batch" / "Prefill batch" lines and uvicorn
access lines behind a ``[date time(.ms)( tags)]`` prefix — with one compiled bytes regex per line (C),
and turns whole columns of numbers into signals with C-level ``map``/``zip`` calls.

Exactness (tests compare both paths on every real log and on generated logs):

* a line the bulk regex does not take goes to the reference parser (``fallback``), unless it contains
  none of :data:`~diagnoser.engines.sglang.logs.TRIGGERS`, in which case the reference parser would
  return ``False`` without touching its state, so it is only counted;
* the first line of every distinct *shape* (the line with its digits removed: kind, header form,
  optional fields, rank tags, milliseconds) also goes to the reference parser, which applies its
  version hints in file order. Hints only narrow the range, so a repeated shape adds nothing;
* points from reference lines and bulk points are merged per series in line order, and the parser's
  clock (``last_ts``) is set as if every line had been fed.
"""

from __future__ import annotations

import operator
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from itertools import compress, islice, repeat
from typing import TYPE_CHECKING, Any

from diagnoser.engines.sglang.logs import TRIGGER_BYTES_RE, epoch_day

if TYPE_CHECKING:
    from diagnoser.engines.sglang.logs import SGLangLogParser

FAST_RE = re.compile(
    rb"\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,6}))?"
    rb"(?P<tags>(?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d+)*)\] (?:"
    rb"(?P<dec>Decode) batch(?:\. |, | \[\d+\], )"
    rb"#running-req: (?P<d_run>\d+), #token: (?P<d_tok>\d+), token usage: (?P<d_use>\d+\.\d+), "
    rb"(?:accept len: (?P<d_alen>\d+\.\d+), )?(?:accept rate: (?P<d_arate>\d+\.\d+), )?"
    rb"(?:(?:cuda|cpu|npu) graph: (?P<d_graph>True|False), )?"
    rb"gen throughput \(token/s\): (?P<d_gen>\d+\.\d+), #queue-req: (?P<d_queue>\d+)(?:, ?)?"
    rb"|(?P<pre>Prefill) batch(?:\. |, | \[\d+\], )"
    rb"#new-seq: (?P<p_seq>\d+), #new-token: (?P<p_new>\d+), #cached-token: (?P<p_cached>\d+), "
    rb"(?:cache hit rate: (?P<p_hit>\d+\.\d+)%, )?"
    rb"token usage: (?P<p_use>\d+\.\d+), #running-req: (?P<p_run>\d+), #queue-req: (?P<p_queue>\d+)"
    rb"(?:, #pending-token: (?P<p_pend>\d+))?(?:, (?:cuda|cpu|npu) graph: (?:True|False))?"
    rb"(?:, input throughput \(token/s\): (?P<p_in>\d+\.\d+))?(?:, ?)?"
    rb"|INFO: +[\w.:\[\]-]+:\d+ - \"(?P<method>[A-Z]+) (?P<path>[!-~]+) HTTP/[\d.]+\" (?P<status>\d{3})(?: [ -~]{0,400})?"
    rb")"
)
_G = {name: i - 1 for name, i in FAST_RE.groupindex.items()}

# (group, canonical signal, converter) per kind — the same mapping as the reference field tables
_FLOAT = float
_BOOL = {b"True": 1.0, b"False": 0.0}.__getitem__
DECODE_COLS: tuple[tuple[str, str, Callable[[bytes], float]], ...] = (
    ("d_run", "running_reqs", _FLOAT),
    ("d_tok", "used_tokens", _FLOAT),
    ("d_use", "token_usage", _FLOAT),
    ("d_alen", "spec_accept_len", _FLOAT),
    ("d_arate", "spec_accept_rate", _FLOAT),
    ("d_graph", "cuda_graph", _BOOL),
    ("d_gen", "gen_throughput_tps", _FLOAT),
    ("d_queue", "queue_reqs", _FLOAT),
)
PREFILL_COLS: tuple[tuple[str, str, Callable[[bytes], float]], ...] = (
    ("p_seq", "prefill_new_seqs", _FLOAT),
    ("p_new", "prefill_new_tokens", _FLOAT),
    ("p_cached", "prefill_cached_tokens", _FLOAT),
    ("p_hit", "cache_hit_rate", lambda b: float(b) / 100.0),
    ("p_use", "token_usage", _FLOAT),
    ("p_run", "running_reqs", _FLOAT),
    ("p_queue", "queue_reqs", _FLOAT),
    ("p_pend", "pending_tokens", _FLOAT),
    ("p_in", "input_throughput_tps", _FLOAT),
)
_DIGITS = b"0123456789"
_groups = re.Match.groups


class _Recorder:
    """Stands in for the sink while reference lines of a chunk are fed: points are held back so they
    can be merged with the bulk points in line order; events and config go straight through."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.cur = 0
        self.seq = 0
        self.points: dict[tuple[str, str], list[tuple[int, int, float, float, str]]] = {}

    def add(self, signal: str, ts: float, value: float, source: str, rank: str = "") -> None:
        self.seq += 1
        self.points.setdefault((signal, rank), []).append((self.cur, self.seq, ts, float(value), source))

    def add_event(self, event: Any) -> None:
        self.sink.add_event(event)

    def set_config(self, name: str, value: Any, source: str, *, override: bool = True) -> None:
        self.sink.set_config(name, value, source, override=override)


def _extend(sink: Any, signal: str, rank: str, ts: list[float], vals: list[float], srcs: list[str]) -> None:
    """Append points in order; straight into a Timeline's columns when that keeps the order exact."""
    if not ts:
        return
    series = getattr(sink, "series", None)
    if series is not None and all(map(operator.le, ts, islice(ts, 1, None))):
        s = series.get((signal, rank))
        if s is None or not s.ts or s.ts[-1] <= ts[0]:
            start = 0
            if s is None:
                sink.add(signal, ts[0], vals[0], srcs[0], rank)
                s = series[(signal, rank)]
                start = 1
            s.ts.extend(islice(ts, start, None))
            s.values.extend(islice(vals, start, None))
            s.sources.extend(islice(srcs, start, None))
            return
    add = sink.add
    for t, v, src in zip(ts, vals, srcs, strict=True):
        add(signal, t, v, src, rank)


class BulkReader:
    """Feeds whole chunks of lines into one :class:`SGLangLogParser` (see the module doc)."""

    def __init__(self, parser: SGLangLogParser) -> None:
        self.parser = parser
        self.shapes: set[bytes] = set()
        self._stamps: dict[bytes, int] = {}
        self._ranks: dict[bytes, str] = {}
        self.bulk_lines = 0

    def _stamp(self, stamp: bytes) -> int:
        """``b"2026-11-29 09:32:06"`` → epoch seconds, as the reference parser computes it."""
        day = epoch_day(int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10]))
        return day + int(stamp[11:13]) * 3600 + int(stamp[14:16]) * 60 + int(stamp[17:19])

    def feed_lines(self, lines: list[bytes], first_line_no: int, fallback: Callable[[bytes, int], bool | None]) -> int:
        """Parse ``lines`` (no newlines; line ``i`` has number ``first_line_no + i``).

        ``fallback(raw, line_no)`` is the reader's exact per-line path (junk checks, decoding, the
        reference parser); it returns ``None`` when the line was skipped, else whether it was
        recognised. Returns the number of recognised lines.
        """
        parser = self.parser
        n = len(lines)
        matches = list(map(FAST_RE.fullmatch, lines))
        rows = list(compress(range(n), matches))
        mats = list(compress(matches, matches))
        # lines for the reference parser: unmatched lines that it could recognise (or must check)
        trig = TRIGGER_BYTES_RE
        refs: list[int] = []
        if len(rows) < n:
            for i in compress(range(n), map(operator.not_, matches)):
                raw = lines[i]
                if raw and (trig.search(raw) or not raw.isascii() or b"\x00" in raw or len(raw) >= 65535):
                    refs.append(i)
        del matches
        # first line of each shape not seen before → reference parser
        keys = list(map(bytes.translate, (lines[i] for i in rows), repeat(None), repeat(_DIGITS)))
        first: dict[bytes, int] = {}
        shapes = self.shapes
        for k, pos in zip(reversed(keys), reversed(range(len(rows))), strict=True):
            if k not in shapes:
                first[k] = pos
        shapes.update(first)
        first_pos = set(first.values())
        refs.extend(rows[p] for p in first_pos)
        refs.sort()
        bulk_pos = [p for p in range(len(rows)) if p not in first_pos] if first_pos else list(range(len(rows)))
        groups = list(map(_groups, (mats[p] for p in bulk_pos)))
        bulk_idx = [rows[p] for p in bulk_pos]
        del mats, keys
        nb = len(groups)
        cols = list(zip(*groups, strict=True)) if nb else [()] * len(_G)
        del groups
        ts = self._times(cols, nb)

        # reference lines, in order, with the clock set as if the bulk lines had been fed
        recognized = nb
        sink = parser.sink
        rec = _Recorder(sink)
        parser.sink = rec
        last_state = -1
        try:
            for L in refs:
                b = bisect_left(bulk_idx, L) - 1
                if b >= 0:
                    parser.saw_date = True
                    if bulk_idx[b] > last_state:
                        parser.last_ts = ts[b]
                rec.cur = L
                raw = lines[L]
                ok = fallback(raw, first_line_no + L)
                if ok is not None and trig.search(raw):
                    last_state = L
                if ok:
                    recognized += 1
        finally:
            parser.sink = sink
        if nb:
            parser.saw_date = True
            if bulk_idx[-1] > last_state:
                parser.last_ts = ts[-1]
        self._emit(cols, nb, ts, bulk_idx, first_line_no, rec)
        self.bulk_lines += nb
        return recognized

    def _times(self, cols: list[tuple[Any, ...]], nb: int) -> list[float]:
        if not nb:
            return []
        stamps = self._stamps
        col = cols[_G["stamp"]]
        for u in set(col).difference(stamps):
            stamps[u] = self._stamp(u)
        base = list(map(stamps.__getitem__, col))
        if len(stamps) > 100_000:
            stamps.clear()
        fr = cols[_G["frac"]]
        if any(fr):
            return [b + (float("0." + f.decode()) if f else 0.0) for b, f in zip(base, fr, strict=True)]
        return list(map(float, base))

    def _rank_of(self, tags: bytes) -> str:
        r = self._ranks.get(tags)
        if r is None:
            r = self._ranks[tags] = self.parser._rank(tags.decode())[0]
        return r

    def _emit(self, cols: list[tuple[Any, ...]], nb: int, ts: list[float], bulk_idx: list[int], first_line_no: int, rec: _Recorder) -> None:
        parser = self.parser
        sink = parser.sink
        name = parser.source_name.replace("%", "%%")
        fmt = (name + ":%d").__mod__
        todo: dict[tuple[str, str], tuple[list[float], list[float], list[str], list[int]]] = {}
        if nb:
            srcs = list(map(fmt, (first_line_no + i for i in bulk_idx)))
            tag_col = cols[_G["tags"]]
            utags = set(tag_col)
            ranks_by_tag = {t: self._rank_of(t) for t in utags}
            for kind, kcol, table in (("decode", "dec", DECODE_COLS), ("prefill", "pre", PREFILL_COLS)):
                kpos = list(compress(range(nb), cols[_G[kcol]]))
                if not kpos:
                    continue
                parser.kinds[kind] += len(kpos)
                if len(utags) == 1:
                    groups = {ranks_by_tag[next(iter(utags))]: kpos}
                else:
                    groups = {}
                    for p in kpos:
                        groups.setdefault(ranks_by_tag[tag_col[p]], []).append(p)
                for rank, pos in groups.items():
                    for gname, signal, conv in table:
                        col = cols[_G[gname]]
                        vals = list(map(col.__getitem__, pos))
                        if None in vals:
                            sel = [p for p, v in zip(pos, vals, strict=True) if v is not None]
                            vals = [v for v in vals if v is not None]
                        else:
                            sel = pos
                        if not sel:
                            continue
                        entry = todo.setdefault((signal, rank), ([], [], [], []))
                        entry[0].extend(map(ts.__getitem__, sel))
                        entry[1].extend(map(conv, vals))
                        entry[2].extend(map(srcs.__getitem__, sel))
                        entry[3].extend(map(bulk_idx.__getitem__, sel))
            apos = list(compress(range(nb), cols[_G["status"]]))
            if apos:
                parser.kinds["access"] += len(apos)
                st = cols[_G["status"]]
                for code, c in Counter(map(st.__getitem__, apos)).items():
                    parser.status_codes[code.decode()] += c
                meth, path = cols[_G["method"]], cols[_G["path"]]
                for (m, p), c in Counter(zip(map(meth.__getitem__, apos), map(path.__getitem__, apos), strict=True)).items():
                    parser.access_paths[f"{m.decode()} {p.decode()}"] += c
                last = apos[-1]
                line_no = first_line_no + bulk_idx[last]
                if parser.access_last is None or parser.access_last[1] < line_no:
                    parser.access_last = (ts[last], line_no)
        # merge with the reference lines' points, per series, in line order
        for key in set(todo) | set(rec.points):
            signal, rank = key
            mine = todo.get(key)
            theirs = rec.points.get(key)
            if theirs is None and mine is not None:
                t_, v_, s_, order = mine
                if not all(map(operator.lt, order, islice(order, 1, None))):  # decode and prefill rows interleave
                    perm = sorted(range(len(order)), key=order.__getitem__)
                    t_, v_, s_ = (list(map(x.__getitem__, perm)) for x in (t_, v_, s_))
                _extend(sink, signal, rank, t_, v_, s_)
                continue
            merged = list(theirs or [])
            if mine is not None:
                merged.extend(zip(mine[3], repeat(0), mine[0], mine[1], mine[2], strict=False))
            merged.sort(key=operator.itemgetter(0, 1))
            _extend(sink, signal, rank, [m[2] for m in merged], [m[3] for m in merged], [m[4] for m in merged])
