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
from functools import partial
from itertools import chain, compress, repeat
from typing import TYPE_CHECKING, Any

from diagnoser.engines.sglang.logformats import TRIGGER_BYTES_RE, epoch_day

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
# one match per line of a block: the bulk shapes in "whole" (with their fields), any other line in "other"
BLOCK_RE = re.compile(rb"^(?:(?P<whole>" + FAST_RE.pattern + rb")|(?P<other>.*))$", re.MULTILINE)
# the same without DP/PP rank tags: when only a few lines carry them, those few go to the line parser
# and the bulk columns need no cutting by rank
_NO_RANK_TAGS = rb"(?P<tags>(?: (?:TP|EP|ATTN_CP|MOE_DP|CP)\d+)*)"
BLOCK_RE_ONE_RANK = re.compile(BLOCK_RE.pattern.replace(rb"(?P<tags>(?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d+)*)", _NO_RANK_TAGS), re.MULTILINE)
assert BLOCK_RE_ONE_RANK.pattern != BLOCK_RE.pattern and BLOCK_RE_ONE_RANK.groupindex == BLOCK_RE.groupindex
_G = {name: i - 1 for name, i in BLOCK_RE.groupindex.items()}

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
    """Append points in order: in one call when the sink takes columns (``Timeline.add_many``)."""
    if not ts:
        return
    add_many = getattr(sink, "add_many", None)
    if add_many is not None:
        add_many(signal, ts, vals, srcs, rank)
        return
    add = sink.add
    for t, v, src in zip(ts, vals, srcs, strict=True):
        add(signal, t, v, src, rank)


class BulkReader:
    """Feeds whole chunks of lines into one :class:`SGLangLogParser` (see the module doc)."""

    def __init__(self, parser: SGLangLogParser) -> None:
        self.parser = parser
        self.shapes: set[bytes] = set()
        self._stamps: dict[bytes, float] = {}
        self._ranks: dict[bytes, str] = {}
        self._floats: dict[bytes, float] = {}
        self.bulk_lines = 0

    def _stamp(self, stamp: bytes) -> int:
        """``b"2026-11-29 09:32:06"`` → epoch seconds, as the reference parser computes it."""
        day = epoch_day(int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10]))
        return day + int(stamp[11:13]) * 3600 + int(stamp[14:16]) * 60 + int(stamp[17:19])

    def feed_lines(self, lines: list[bytes], first_line_no: int, fallback: Callable[[bytes, int], bool | None]) -> int:
        """:meth:`feed_block` for a list of lines (no newlines)."""
        return self.feed_block(b"\n".join(lines), first_line_no, fallback) if lines else 0

    def feed_block(self, block: bytes, first_line_no: int, fallback: Callable[[bytes, int], bool | None]) -> int:
        """Parse a block of ``block.count(b"\\n") + 1`` lines (no final newline); line ``i`` has number
        ``first_line_no + i``.

        ``fallback(raw, line_no)`` is the reader's exact per-line path (junk checks, decoding, the
        reference parser); it returns ``None`` when the line was skipped, else whether it was
        recognised. Returns the number of recognised lines.
        """
        parser = self.parser
        # one C call: a tuple of groups per line; the bulk shapes fill "whole", every other line "other"
        tagged = block.count(b" DP") + block.count(b" PP")
        regex = BLOCK_RE_ONE_RANK if tagged * 20 < block.count(b"\n") + 1 else BLOCK_RE
        tuples = regex.findall(block)
        n = len(tuples)
        cols = list(zip(*tuples, strict=True))
        del tuples
        whole, other = cols[_G["whole"]], cols[_G["other"]]
        rows = list(compress(range(n), whole))
        # lines for the reference parser: unmatched lines that it could recognise (or must check)
        trig = TRIGGER_BYTES_RE
        refs: list[int] = []
        if len(rows) < n:
            for i in compress(range(n), other):
                raw = other[i]
                if trig.search(raw) or not raw.isascii() or b"\x00" in raw or len(raw) >= 65535:
                    refs.append(i)
        # the first line of each shape not seen before: the reference parser applies its hints
        keys = list(map(bytes.translate, compress(whole, whole), repeat(None), repeat(_DIGITS)))
        shapes = self.shapes
        firsts = dict(zip(reversed(keys), reversed(rows), strict=True))  # last write wins: the first line
        first = {k: pos for k, pos in firsts.items() if k not in shapes}
        shapes.update(first)
        hint_rows = set(first.values())
        refs.extend(hint_rows)
        refs.sort()
        del keys
        ts = self._times(cols, n)

        # reference lines, in order, with the clock set as if the bulk lines had been fed
        recognized = len(rows)
        sink = parser.sink
        rec = _Recorder(sink)
        parser.sink = rec
        last_state = -1
        try:
            for L in refs:
                b = bisect_left(rows, L) - 1
                if b >= 0:
                    parser.saw_date = True
                    if rows[b] > last_state:
                        parser.last_ts = ts[rows[b]]
                rec.cur = L
                if L in hint_rows:
                    self._hints_only(whole[L], first_line_no + L)
                    last_state = L
                    continue
                raw = other[L]
                ok = fallback(raw, first_line_no + L)
                if ok is not None and trig.search(raw):
                    last_state = L
                if ok:
                    recognized += 1
        finally:
            parser.sink = sink
        if rows:
            parser.saw_date = True
            if rows[-1] > last_state:
                parser.last_ts = ts[rows[-1]]
        self._emit(cols, n, ts, first_line_no, rec)
        self.bulk_lines += len(rows)
        return recognized

    def _hints_only(self, raw: bytes, line_no: int) -> None:
        """Feed one bulk line to the reference parser for its version hints only: its points and
        counts come from the bulk columns, so the parser's counters are restored afterwards."""
        p = self.parser
        saved = (Counter(p.kinds), Counter(p.status_codes), Counter(p.access_paths), p.access_last, p.untimed_lines)
        sink = p.sink
        p.sink = _NULL_SINK
        try:
            p.feed(raw.decode("ascii"), line_no)
        finally:
            p.sink = sink
            p.kinds, p.status_codes, p.access_paths, p.access_last, p.untimed_lines = saved

    def _times(self, cols: list[tuple[Any, ...]], n: int) -> list[float]:
        stamps = self._stamps
        col = cols[_G["stamp"]]
        for u in set(col).difference(stamps):
            stamps[u] = float(self._stamp(u)) if u else 0.0  # int + 0.0, as the reference parser has it
        base = list(map(stamps.__getitem__, col))
        if len(stamps) > 100_000:
            stamps.clear()
        fr = cols[_G["frac"]]
        if any(fr):
            return [b + (float("0." + f.decode()) if f else 0.0) for b, f in zip(base, fr, strict=True)]
        return base

    def _rank_of(self, tags: bytes) -> str:
        r = self._ranks.get(tags)
        if r is None:
            r = self._ranks[tags] = self.parser._rank(tags.decode())[0]
        return r

    def _signals(
        self, todo: dict[tuple[str, str], Any], col: Callable[[int], tuple[Any, ...]], ts: list[float], srcs: list[str], pos: Any, rank: str
    ) -> None:
        """Each canonical signal's points over some rows (one rank), in row order."""
        for signal, (gnames, conv) in SIGNAL_GROUPS.items():
            gcols = [col(_G[g]) for g in gnames]
            if len(gcols) == 1:
                present: Any = gcols[0]
                values: Any = filter(None, gcols[0])
            else:  # decode and prefill rows both give it: one value per row, in row order
                present = list(map(operator.or_, *(map(bool, c) for c in gcols)))
                values = filter(None, chain.from_iterable(zip(*gcols, strict=True)))
            if not any(present):
                continue
            if conv is _FLOAT:  # few distinct values (counts, 2-decimal ratios): convert each once
                raw_p = list(values)
                fc = self._floats
                new_vals = set(raw_p).difference(fc)
                if len(new_vals) < len(raw_p) // 2:
                    for u in new_vals:
                        fc[u] = float(u)
                    vals_p = list(map(fc.__getitem__, raw_p))
                    if len(fc) > 500_000:
                        fc.clear()
                else:
                    vals_p = list(map(float, raw_p))
            else:
                vals_p = list(map(conv, values))
            todo[(signal, rank)] = (list(compress(ts, present)), vals_p, list(compress(srcs, present)), partial(_positions, pos, present))

    def _emit(self, cols: list[tuple[Any, ...]], n: int, ts: list[float], first_line_no: int, rec: _Recorder) -> None:
        """Turn the bulk rows' columns into points, per series in line order (C-level maps), merge in
        the reference lines' points, and write them to the sink."""
        parser = self.parser
        sink = parser.sink
        todo: dict[tuple[str, str], tuple[list[float], list[float], list[str], Callable[[], list[int]]]] = {}
        whole = cols[_G["whole"]]
        if any(whole):
            name = parser.source_name.replace("%", "%%")
            srcs = list(map((name + ":%d").__mod__, range(first_line_no, first_line_no + n)))
            tag_col = cols[_G["tags"]]
            utags = set(compress(tag_col, whole))
            ranks: list[str] | None = None
            if len(utags) > 1:
                by_tag = {t: self._rank_of(t) for t in set(tag_col)}
                ranks = list(map(by_tag.__getitem__, tag_col))
                if len({by_tag[t] for t in utags}) == 1:
                    ranks = None
            for kind, g in (("decode", "dec"), ("prefill", "pre")):
                k = n - cols[_G[g]].count(b"")
                if k:
                    parser.kinds[kind] += k
            if ranks is None:
                self._signals(todo, cols.__getitem__, ts, srcs, range(n), self._rank_of(next(iter(utags))))
            else:  # several DP/PP ranks: cut the columns by rank once, then read each rank's series
                needed = {_G[g] for gnames, _ in SIGNAL_GROUPS.values() for g in gnames}
                for r in set(compress(ranks, whole)):
                    mask = list(map(operator.and_, map(operator.eq, ranks, repeat(r)), map(bool, whole)))
                    sub = {gi: tuple(compress(cols[gi], mask)) for gi in needed}
                    self._signals(todo, sub.__getitem__, list(compress(ts, mask)), list(compress(srcs, mask)), list(compress(range(n), mask)), r)
            st = cols[_G["status"]]
            n_access = n - st.count(b"")
            if n_access:
                parser.kinds["access"] += n_access
                for code, c in Counter(filter(None, st)).items():
                    parser.status_codes[code.decode()] += c
                meth, path = cols[_G["method"]], cols[_G["path"]]
                for (m, p), c in Counter(zip(filter(None, meth), filter(None, path), strict=True)).items():
                    parser.access_paths[f"{m.decode()} {p.decode()}"] += c
                last = n - 1
                while not st[last]:
                    last -= 1
                line_no = first_line_no + last
                if parser.access_last is None or parser.access_last[1] < line_no:
                    parser.access_last = (ts[last], line_no)
        # merge the reference lines' points in, per series, by line
        for key in set(todo) | set(rec.points):
            signal, rank = key
            mine = todo.get(key)
            theirs = rec.points.get(key)
            if mine is None:
                assert theirs is not None
                _extend(sink, signal, rank, [t[2] for t in theirs], [t[3] for t in theirs], [t[4] for t in theirs])
                continue
            t_, v_, s_, positions = mine
            if theirs:
                # two runs sorted by line: a stable sort of the positions merges them in C
                idx = positions() + [p[0] for p in theirs]
                t_ += [p[2] for p in theirs]
                v_ += [p[3] for p in theirs]
                s_ += [p[4] for p in theirs]
                perm = sorted(range(len(idx)), key=idx.__getitem__)
                t_, v_, s_ = (list(map(x.__getitem__, perm)) for x in (t_, v_, s_))
            _extend(sink, signal, rank, t_, v_, s_)


def _positions(pos: Any, present: Any) -> list[int]:
    return list(compress(pos, present))


class _NullSink:
    def add(self, signal: str, ts: float, value: float, source: str, rank: str = "") -> None:
        pass

    def add_event(self, event: Any) -> None:
        pass

    def set_config(self, name: str, value: Any, source: str, *, override: bool = True) -> None:
        pass


_NULL_SINK = _NullSink()

# canonical signal → (bulk regex groups that give it, converter); one group per kind at most
SIGNAL_GROUPS: dict[str, tuple[tuple[str, ...], Callable[[bytes], float]]] = {}
for _g, _sig, _conv in DECODE_COLS + PREFILL_COLS:
    _prev = SIGNAL_GROUPS.get(_sig)
    SIGNAL_GROUPS[_sig] = ((*_prev[0], _g) if _prev else (_g,), _conv)
