"""Bulk log backfill: the common SGLang line shapes read a chunk at a time, exactly as the line parser would.

:class:`~diagnoser.engines.sglang.logs.SGLangLogParser` is the reference: it reads one line at a time
and knows every format, at several microseconds a line. This module reads the shapes that make up
almost all of a busy log — current and older "Decode batch" / "Prefill batch" lines and uvicorn
access lines behind a ``[date time(.ms)( tags)]`` prefix (optionally behind a docker-compose or Ray
prefix) — with ONE ``findall`` of one compiled bytes regex over a whole chunk (one tuple per line, so
the tuple's index is the line's), then turns whole columns of numbers into signals with C-level
``map``/``compress``/``itemgetter`` calls, per kind of line and per rank.

The work is split in two so that it can run in worker processes (:mod:`diagnoser.sources.logs`):

* :meth:`BlockParser.parse` — a pure function of the chunk's bytes (no parser state): columns of points per
  series as row numbers and values, the time of every row, counts, the lines the bulk regex did not
  take, and the first row of each line *shape* the worker has not reported before;
* :meth:`BulkReader.apply` — in the reading process, in chunk order: version hints for new shapes,
  the reference parser on the other lines, merging, and the writes to the sink.

Exactness (tests compare both paths on every real log and on generated logs):

* a line the bulk regex does not take goes to the reference parser (``fallback``), unless it contains
  none of :data:`~diagnoser.engines.sglang.logs.TRIGGERS`, in which case the reference parser would
  return ``False`` without touching its state, so it is only counted;
* the first line of every distinct *shape* (kind, header form, optional fields, trailing comma, graph
  label, rank tag names, milliseconds — everything the reference parser's version hints look at) also
  goes to the reference parser, which applies its hints in file order. Hints only narrow the range, so
  a repeated shape adds nothing;
* a batch head behind the prefix that the bulk shapes do not take (``Decode batch, #x: 1``) goes to the
  reference parser only when it reads something from it (``logformats.batch_reads``, decided once per
  message with its digits made alike); else it is a bulk row that moves the clock and gives its prefix's
  hints (its shape), not a recognised line, as the reference parser has it;
* a batch head with no prefix at all (``Decode batch, #x: 1`` at the start of the line) that the
  reference parser reads nothing from only ticks its untimed clock (decided by the reference parser once
  per line with its digits made alike, ``_only_ticks``); the ticks are repeated in line order, not fed;
* points from reference lines and bulk points are merged per series in line order, and the parser's
  clock (``last_ts``) is set as if every line had been fed.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Callable
from itertools import chain, compress, repeat
from typing import TYPE_CHECKING, Any

from diagnoser.engines.sglang import logscan
from diagnoser.engines.sglang.logformats import (
    _DECODE_FIELDS,
    _PREFILL_FIELDS,
    _SUFFIX_PREFIXES,
    _TAG_RE,
    DECODE_COLS,
    PREFILL_COLS,
    TRIGGERS,
    batch_reads,
    date_ok,
    epoch_day,
    rank_of,
    time_ok,
)
from diagnoser.engines.sglang.logline import envelope, sglang_offset

if TYPE_CHECKING:  # for the annotations only: logs imports this module (on first bulk use), never the reverse
    from diagnoser.engines.sglang.logs import SGLangLogParser

# Every repeat is bounded so that no line the bulk regex takes can reach the reader's 64 KiB junk limit.
# Optional parts are written "(?:X|)" rather than "(?:X)?": the same match, but "?" compiles to a
# general repeat that copies the whole group-mark array at every step (a third of the regex time here).
# Access lines come first so that their groups have the lowest numbers (fewer marks to carry).
_PREFIX = (
    rb"(?:[\w.-]{1,200}[ \t]{1,50}\|[ \t]|)"  # docker compose "sglang-1  | " (no \s: it would cross lines)
    rb"(?:\(SGLangEngine pid=\d{1,20}(?:, ip=[^)\n]{0,200}|)\)[ \t]{1,50}|)"  # Ray
    rb"\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,6})|)"
    rb"(?P<tags>(?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d{1,9}){0,8})\] "
)
_N = rb"\d{1,30}"
_F = rb"\d{1,30}\.\d{1,30}"
_DECODE = (
    rb"(?P<dec>Decode) batch(?:(?P<d_hdr>\. |, )| \[\d{1,30}\], )"
    rb"#running-req: (?P<d_run>N), (?:#token: (?P<d_tok>N), token usage: (?P<d_use>F)|"
    # hybrid SWA models (0.4.10+): a full and a sliding-window pool; token usage is the larger (docs/sglang.md#metrics-scheduler)
    rb"#full token: (?P<d_ftok>N), full token usage: (?P<d_fuse>F), #swa token: \d{1,30}, swa token usage: (?P<d_suse>F)), "
    rb"(?:accept len: (?P<d_alen>F), |)(?:accept rate: (?P<d_arate>F), |)"
    rb"(?:(?P<d_glab>cuda|cpu|npu) graph: (?P<d_graph>True|False), |)"
    rb"gen throughput \(token/s\): (?P<d_gen>F), #queue-req: (?P<d_queue>N)(?P<d_trail>, |,|)"
)
_PREFILL = (
    rb"(?P<pre>Prefill) batch(?:(?P<p_hdr>\. |, )| \[\d{1,30}\], )"
    rb"#new-seq: (?P<p_seq>N), #new-token: (?P<p_new>N), #cached-token: (?P<p_cached>N), "
    rb"(?:cache hit rate: (?P<p_hit>F)%, |)"
    rb"token usage: (?P<p_use>F), #running-req: (?P<p_run>N), #queue-req: (?P<p_queue>N)"
    rb"(?:, #pending-token: (?P<p_pend>N)|)(?:, (?P<p_glab>cuda|cpu|npu) graph: (?:True|False)|)"
    rb"(?:, input throughput \(token/s\): (?P<p_in>F)|)(?P<p_trail>, |,|)"
)
# the reference parser reads a line whose message has "Prefill batch"/"Decode batch" near its start as a
# batch line even when it is an access line: the bulk pattern leaves such (odd) suffixes to it
_ACCESS = (
    rb"INFO: {1,50}[\w.:\[\]-]{1,200}:\d{1,9} - \"(?P<method>[A-Z]{1,20}) (?P<path>[!-~]{1,8000}) HTTP/[\d.]{1,10}\" (?P<status>\d{3})"
    rb"(?: (?![ -~]*(?:Prefill|Decode) batch)[ -~]{0,400}|)"
)
# any other batch head behind the prefix ("Decode batch, #x: 1, …", a field list the two shapes above do
# not take): printable ASCII not ending as a wrapped line does (logline._WRAP_LAST), so that the reference
# parser reads its message from SGLang's prefix as it does a bulk line's. Whether it reads anything from
# the message is decided once per message shape (BlockParser._near_reads); a line it reads something from
# goes to it, one it reads nothing from is a bulk row that only moves the clock (not recognised)
_NEAR = rb"(?P<near>(?:Decode|Prefill) batch[ -~]{0,8000})(?<![\\`>])"


def _numbers(p: bytes) -> bytes:
    return p.replace(b">N)", b">" + _N + b")").replace(b">F)", b">" + _F + b")")


FAST_RE = re.compile(_PREFIX + rb"(?:" + _ACCESS + rb"|" + _numbers(_DECODE) + rb"|" + _numbers(_PREFILL) + rb"|" + _NEAR + rb")")
assert b">N)" not in FAST_RE.pattern and b">F)" not in FAST_RE.pattern
TRIGGER_BYTES_RE = re.compile("|".join(re.escape(t) for t in TRIGGERS).encode())  # logformats.TRIGGERS, for bytes
# one match per line of a block: the bulk shapes fill their groups, any other line fills "other"
BLOCK_RE = re.compile(rb"^(?:" + FAST_RE.pattern + rb"|(?P<other>.*))$", re.MULTILINE)
_G = {name: i - 1 for name, i in BLOCK_RE.groupindex.items()}
NGROUPS = BLOCK_RE.groups
# A line without these words cannot be an access, decode or prefill line of the bulk regex (each of those
# alternatives holds one literally): behind the prefix only the near-miss alternative can take it, and
# NEAR_BLOCK_RE (:func:`near_block_re`), that alternative alone, takes it exactly as BLOCK_RE does (same prefix, same order).
SHAPE_WORDS = (b"INFO:", b"#running-req: ", b"#new-seq: ")
assert SHAPE_WORDS[0] in _ACCESS and SHAPE_WORDS[1] in _DECODE and SHAPE_WORDS[2] in _PREFILL
_NEAR_BLOCK: list[re.Pattern[bytes]] = []  # NEAR_BLOCK_RE, compiled on first use (most logs never need it)


def near_block_re() -> re.Pattern[bytes]:
    """NEAR_BLOCK_RE: a line of a block through the prefix and the near-miss alternative, else ``other``."""
    if not _NEAR_BLOCK:
        rx = re.compile(rb"^(?:" + _PREFIX + _NEAR + rb"|(?P<other>.*))$", re.MULTILINE)
        assert rx.groupindex == {"stamp": 1, "frac": 2, "tags": 3, "near": 4, "other": 5}
        _NEAR_BLOCK.append(rx)
    return _NEAR_BLOCK[0]

# what the reference parser's version hints look at, per kind (with the rank tag names and whether the
# stamp has milliseconds): header form, trailing comma, graph label, which optional fields are present
_DECODE_SHAPE = (("d_hdr", "d_trail", "d_glab"), ("d_alen", "d_arate", "d_fuse"))
_PREFILL_SHAPE = (("p_hdr", "p_trail", "p_glab"), ("p_hit", "p_pend", "p_in"))
_BOOL = {b"True": 1.0, b"False": 0.0}
# the groups read from every row, and per kind of line (one pass over the rows each)
_ROW_GROUPS = tuple(_G[g] for g in ("dec", "pre", "status", "near", "other", "stamp", "frac"))
_KIND_GROUPS: dict[str, tuple[str, ...]] = {
    "decode": tuple(g for g, _, _ in DECODE_COLS) + ("d_hdr", "d_trail", "d_glab", "tags", "frac"),
    "prefill": tuple(g for g, _, _ in PREFILL_COLS) + ("p_hdr", "p_trail", "p_glab", "tags", "frac"),
    "access": ("status", "method", "path", "tags", "frac"),
    "near": ("tags", "frac"),
}
# groups with few distinct values (counts of requests, 2-decimal ratios): each converted once per value
_FEW = frozenset({"d_run", "d_use", "d_fuse", "d_suse", "d_alen", "d_arate", "d_queue", "p_seq", "p_hit", "p_use", "p_run", "p_queue"})


def _stamp(stamp: bytes) -> int | None:
    """``b"2026-11-29 09:32:06"`` → epoch seconds, as the reference parser computes it; None for a stamp
    no calendar has (the reference parser makes such a line an error: ``logformats.date_ok``)."""
    y, mo, d = int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10])
    h, mi, s = int(stamp[11:13]), int(stamp[14:16]), int(stamp[17:19])
    if not (date_ok(y, mo, d) and time_ok(h, mi, s)):
        return None
    return epoch_day(y, mo, d) + h * 3600 + mi * 60 + s


def _unbulk(tuples: list[tuple[bytes, ...]], block: bytes, rows: list[int]) -> list[tuple[bytes, ...]]:
    """``tuples`` with these rows turned into "other" lines (only the ``other`` group set, to the line)."""
    lines = block.split(b"\n")
    other = _G["other"]
    out = list(tuples)
    for i in rows:
        out[i] = (b"",) * other + (lines[i],) + (b"",) * (NGROUPS - other - 1)
    return out


def _add_run(series: dict[tuple[str, str], tuple[list[int], list[float]]], key: tuple[str, str], rows: list[int], vals: list[float]) -> None:
    """Add points to a series of the block; a second run (decode and prefill lines both give it, or
    two fields do) is merged with the first by row."""
    prev = series.get(key)
    if prev is None:
        series[key] = (rows, vals)
        return
    r2 = prev[0] + rows
    v2 = prev[1] + vals
    perm = sorted(range(len(r2)), key=r2.__getitem__)
    series[key] = (list(map(r2.__getitem__, perm)), list(map(v2.__getitem__, perm)))


# SGLang's own prefix and one of the heads the bulk reader takes, anywhere in a line (a candidate only:
# sglang_offset decides), and digits made alike so that one decision serves every line of a wrapper's shape
_WRAPPED_RE = re.compile(
    rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,6})?(?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d{1,9}){0,8}\] "
    rb"(?:Decode batch|Prefill batch|INFO:     )"
)
_DIGITS_ALIKE = bytes.maketrans(b"0123456789", b"0000000000")
# BlockParser._near_reads decides per message with its digits made alike: sound while no field name has a digit
assert not any(c.isdigit() for k in (*_DECODE_FIELDS, *_PREFILL_FIELDS, *_SUFFIX_PREFIXES) for c in k)
_WRAP_TAIL = frozenset(b"\\`>\r")


def unwrap_block(block: bytes, decided: dict[bytes, bool] | None = None) -> tuple[bytes, dict[int, bytes]]:
    """A block whose lines mostly do not begin with SGLang's own prefix (a collector's or formatter's
    before it: ``2026-…Z stderr F [2026-11-29 09:32:06] Decode batch, …``) with that taken off each line
    the reference parser reads from SGLang's prefix, as if the line began there
    (:func:`~diagnoser.engines.sglang.logline.sglang_offset`), so that the bulk regex and the compiled
    scanner take wrapped logs too; and the original of each line changed, by row, for the lines that go
    to the reference parser (lines left as they are go there too: only speed depends on what is taken off). Whether a prefix may be taken off depends only on the prefix (its length,
    its letters, where its digits are: ``locate`` reads nothing else of it), so it is decided once per
    such shape (``decided``). A block whose first 64 KiB are mostly SGLang's own lines is returned as it is."""
    wrapped: dict[int, bytes] = {}
    head = block[:65536]  # how the block's lines look: from its first lines (a full count costs a third of a scan)
    if b"\r\n" in head:  # CRLF line ends: the reference parser reads a line without them
        lines = block.split(b"\n")
        for i, raw in enumerate(lines):
            if raw[-1:] == b"\r" and len(raw) < 65535:
                wrapped[i] = raw
                lines[i] = raw.rstrip(b"\r")
        if wrapped:
            block = b"\n".join(lines)
    if wrapped:
        head = block[:65536]
    if (head.count(b"\n[") + (head[:1] == b"[")) * 2 >= head.count(b"\n") + 1:
        return block, wrapped
    if decided is None:
        decided = {}
    lines = block.split(b"\n")
    find = _WRAPPED_RE.search
    trig = TRIGGER_BYTES_RE.search
    for i, raw in enumerate(lines):
        if raw[:1] == b"[" or len(raw) >= 65535:
            continue
        c = find(raw, 0, 600)
        if c is None or not raw.isascii() or b"\x00" in raw:
            continue
        at = c.start()
        if raw[:1] == b"{":  # a shipper's JSON (docker's json-file): the message, when it is SGLang's whole line
            env = envelope(raw.decode("ascii"))
            if env is not None and env[0].isascii() and "\n" not in env[0] and "\x1b" not in env[0]:
                msg = env[0].encode()
                if _WRAPPED_RE.match(msg) and trig(msg):
                    wrapped.setdefault(i, raw)
                    lines[i] = msg
            continue
        if raw[-1] in _WRAP_TAIL:  # the line's end changes how it is unwrapped: decided for this line alone
            ok = sglang_offset(raw.decode("ascii")) == at
        else:
            key = raw[:at].translate(_DIGITS_ALIKE)
            ok = decided.get(key)  # type: ignore[assignment]
            if ok is None:
                if len(decided) > 4096:
                    decided.clear()
                ok = decided[key] = sglang_offset(raw.decode("ascii")) == at
        if ok and (trig(raw, at) is not None or trig(raw, 0, at) is None):  # read by the reference parser alike
            wrapped.setdefault(i, raw)
            lines[i] = raw[at:]
    return (b"\n".join(lines), wrapped) if wrapped else (block, {})  # (lines changed only when something was taken off)


_BARE_HEADS = (b"Decode batch", b"Prefill batch")
_PRINTABLE = bytes(range(32, 127))


class _Watch:
    """A sink that only notes whether anything was written to it (the probe of :func:`_only_ticks`)."""

    __slots__ = ("wrote",)

    def __init__(self) -> None:
        self.wrote = False

    def add(self, *a: Any, **k: Any) -> None:
        self.wrote = True

    def add_event(self, *a: Any, **k: Any) -> None:
        self.wrote = True

    def set_config(self, *a: Any, **k: Any) -> None:
        self.wrote = True


def _only_ticks(raw: bytes, parser_cls: Any) -> bool:
    """Whether the reference parser, fed this line, does nothing but tick its untimed clock: not
    recognised, no point, event or config, no count, no version hint, ``untimed_lines`` + 1 and
    ``last_ts`` + 1 s. Asked of a fresh parser (the path such a line takes reads no parser state but the
    clock it ticks: ``SGLangLogParser._located`` with an empty prefix, ``_untimed_ts``, ``_batch``)."""
    if parser_cls is None:  # no reference parser to ask: the line goes the reference path
        return False
    sink = _Watch()
    p = parser_cls(sink, "probe")  # the bulk reader's own parser class (logs imports this module, never the reverse)
    p.last_ts = 1000.0
    version = (p.version.low, p.version.high, p.version.exact, p.version.reasons, p.version.conflicts)
    try:
        ok = p.feed(raw.decode("ascii"), 1)
    except Exception:  # noqa: BLE001 — whatever the reference does with it, the reference does it
        return False
    return (ok is False and not sink.wrote and p.last_ts == 1001.0 and p.untimed_lines == 1 and not p.kinds
            and not p.status_codes and not p.access_paths and p.access_last is None and p.dropped_values == 0
            and not p.saw_date and p.first_stamp is None and not p.graph_labels and not p._pending
            and not p._hints and version == (p.version.low, p.version.high, p.version.exact, p.version.reasons, p.version.conflicts))


class BlockParser:
    """The pure half (see the module doc); one per process, it keeps only caches and the shapes it
    has already reported."""

    def __init__(self) -> None:
        self.reported: set[tuple[Any, ...]] = set()
        self._stamps: dict[bytes, float] = {b"": 0.0}
        self._fracs: dict[bytes, float] = {b"": 0.0}
        self._tags: dict[bytes, tuple[str, tuple[str, ...]]] = {}
        self._floats: dict[bytes, float] = {}
        self._wrappers: dict[bytes, bool] = {}  # unwrap_block's decisions, per shape of what precedes SGLang's prefix
        self._near: dict[bytes, bool] = {}  # batch_reads of batch heads the shapes do not take, digits made alike
        self.parser_cls: Any = None  # the reference parser's class, set by BulkReader (asked by _only_ticks)
        self._bare: dict[bytes, bool] = {}  # bare batch heads (no prefix) that only tick the untimed clock, digits alike

    def _tag(self, tags: bytes) -> tuple[str, tuple[str, ...]]:
        t = self._tags.get(tags)
        if t is None:
            text = tags.decode()
            t = self._tags[tags] = (rank_of(text)[0], tuple(k for k, _ in _TAG_RE.findall(text)))
        return t

    def _floats_of(self, raw: list[bytes], few: bool) -> list[float]:
        """``float`` of each. Columns with few distinct values (counts, 2-decimal ratios) convert each
        distinct value once and share the float objects."""
        if not few:
            return list(map(float, raw))
        fc = self._floats
        vals = list(map(fc.get, raw))
        if None in vals:
            if len(fc) > 200_000:
                fc.clear()
            for u in set(raw).difference(fc):
                fc[u] = float(u)
            vals = list(map(fc.__getitem__, raw))
        return vals

    def parse(self, block: bytes) -> dict[str, Any]:
        """Parse a block of ``block.count(b"\\n") + 1`` lines (no final newline); rows are 0-based.
        Through the compiled scanner when it is built (:mod:`diagnoser.engines.sglang.logscan`), else
        through :meth:`parse_re`; both give the same points."""
        block, wrapped = unwrap_block(block, self._wrappers)
        scan = scanner()
        out = scan.parse(self, block) if scan is not None else self.parse_re(block)
        if wrapped:  # the reference parser reads each line as it was in the file
            out["refs"] = [(i, wrapped.get(i, raw)) for i, raw in out["refs"]]
            out["shapes"] = [(key, row, wrapped.get(row, raw)) for key, row, raw in out["shapes"]]
        out["refs"], out["ticks"] = self._bare_ticks(out["refs"])
        return out

    def _bare_ticks(self, refs: list[tuple[int, bytes]]) -> tuple[list[tuple[int, bytes]], list[int]]:
        """``refs`` without the bare batch heads the reference parser reads nothing from, and those
        lines' rows. A bare head is a line that *begins* with ``Decode batch``/``Prefill batch`` (no prefix
        at all: a log piped through ``cut``, a paste), printable ASCII, shorter than the reader's junk
        limit. For the reference parser such a line is an untimed line that reads nothing
        (``Decode batch, #x: 1``): its only effect is the untimed clock's tick (``untimed_lines`` + 1,
        ``last_ts`` + 1 s: ``SGLangLogParser._untimed_ts``), which :meth:`BulkReader.apply` repeats in
        order. Whether a line is such a tick is decided by the reference parser itself
        (:func:`_only_ticks`) once per line with its digits made alike: nothing on that path tells one
        digit from another (``batch_reads``; ``find_head``; ``is_side_line``, whose words have none)."""
        if not refs:
            return refs, []
        heads = _BARE_HEADS
        if not any(raw.startswith(heads) for _, raw in refs):
            return refs, []
        known = self._bare
        keep: list[tuple[int, bytes]] = []
        ticks: list[int] = []
        for i, raw in refs:
            if raw.startswith(heads) and len(raw) < 65535 and not raw.translate(None, _PRINTABLE):
                key = raw.translate(_DIGITS_ALIKE)
                tick = known.get(key)
                if tick is None:
                    if len(known) > 4096:
                        known.clear()
                    tick = known[key] = _only_ticks(raw, self.parser_cls)
                if tick:
                    ticks.append(i)
                    continue
            keep.append((i, raw))
        return keep, ticks

    def parse_re(self, block: bytes) -> dict[str, Any]:
        """:meth:`parse` with the bulk regex alone (the reference for the compiled scanner)."""
        tuples = BLOCK_RE.findall(block)
        n = len(tuples)
        ig = operator.itemgetter
        # one pass over the rows for the groups every row needs (separate passes cost more: memory-bound)
        dec_c, pre_c, st_c, near_c, other_c, stamp_c, frac_c = zip(*map(ig(*_ROW_GROUPS), tuples), strict=True)
        # the time of each stamp (None: no calendar has it; such a line is the reference parser's error)
        stamps = self._stamps
        if len(stamps) > 100_000:
            stamps.clear()
            stamps[b""] = 0.0
        uniq = set(stamp_c)
        for u in uniq.difference(stamps):
            t = _stamp(u)
            stamps[u] = None if t is None else float(t)  # int + 0.0, as the reference parser has it
        unbulk = [i for i, u in enumerate(stamp_c) if stamps[u] is None] if any(stamps[u] is None for u in uniq) else []
        if near_c.count(b"") < n:  # batch heads the shapes do not take: the ones read from go to the reference parser
            unbulk += self._near_reads(near_c)
        if unbulk:
            tuples = _unbulk(tuples, block, sorted(set(unbulk)))
            dec_c, pre_c, st_c, near_c, other_c, stamp_c, frac_c = zip(*map(ig(*_ROW_GROUPS), tuples), strict=True)
        kinds_t: dict[str, tuple[list[int], dict[str, tuple[Any, ...]]]] = {}
        for kind, marker in (("decode", dec_c), ("prefill", pre_c), ("access", st_c), ("near", near_c)):
            if marker.count(b"") < n:
                names = _KIND_GROUPS[kind]
                sub = compress(tuples, marker)
                kinds_t[kind] = (list(compress(range(n), marker)), dict(zip(names, zip(*map(ig(*(_G[g] for g in names)), sub), strict=True), strict=True)))
        del tuples
        if len(kinds_t) > 1:
            bulk_rows = sorted(chain.from_iterable(rows for rows, _ in kinds_t.values()))
        else:
            bulk_rows = next(iter(kinds_t.values()))[0] if kinds_t else []
        # batch heads the reference parser reads nothing from: bulk rows for the clock and the prefix's
        # version hints (their shapes), not recognised
        out: dict[str, Any] = {"n": n, "bulk_rows": bulk_rows, "inert": len(kinds_t["near"][0]) if "near" in kinds_t else 0}

        # the other lines: the ones the reference parser could recognise (or must check) go to it
        refs: list[tuple[int, bytes]] = []
        if len(bulk_rows) < n:
            trig = TRIGGER_BYTES_RE.search
            for i in compress(range(n), other_c):
                raw = other_c[i]
                if trig(raw) or not raw.isascii() or b"\x00" in raw or len(raw) >= 65535:
                    refs.append((i, raw))
        out["refs"] = refs
        if not bulk_rows:
            out.update(ts=[], series={}, kinds={}, status={}, paths={}, access_last=-1, shapes=[])
            return out

        # time of every row (0.0 for the rows that are not bulk lines)
        ts = list(map(stamps.__getitem__, stamp_c))
        if frac_c.count(b"") < n:
            fr = self._fracs
            for u in set(frac_c).difference(fr):
                fr[u] = float("0." + u.decode())
            ts = list(map(operator.add, ts, map(fr.__getitem__, frac_c)))
        out["ts"] = ts
        tag_info: dict[bytes, tuple[str, tuple[str, ...]]] = {}
        for _rows, kc in kinds_t.values():
            for t in set(kc["tags"]).difference(tag_info):
                tag_info[t] = self._tag(t)
        one_rank = len({r for r, _ in tag_info.values()}) == 1
        rank_of = {t: info[0] for t, info in tag_info.items()}
        names_of = {t: info[1] for t, info in tag_info.items()}

        series: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        shapes: list[tuple[tuple[Any, ...], int]] = []
        kinds: dict[str, int] = {}
        for kind, table, shape_cols in (("decode", DECODE_COLS, _DECODE_SHAPE), ("prefill", PREFILL_COLS, _PREFILL_SHAPE)):
            if kind not in kinds_t:
                continue
            rows, kc = kinds_t[kind]
            kinds[kind] = len(rows)
            self._shapes(kind, rows, kc, shape_cols, names_of, shapes)
            groups: list[tuple[str, list[int], dict[str, tuple[Any, ...]]]]
            if one_rank:
                groups = [(rank_of[kc["tags"][0]], rows, kc)]
            else:  # several DP/PP ranks: cut the rows by rank once
                rks = list(map(rank_of.__getitem__, kc["tags"]))
                groups = []
                for rank in sorted(set(rks)):
                    mask = list(map(operator.eq, rks, repeat(rank)))
                    groups.append((rank, list(compress(rows, mask)), {g: tuple(compress(kc[g], mask)) for g, _, _ in table}))
            for rank, rrows, rc in groups:
                for g, signal, optional in table:
                    vals: Any = rc[g]
                    if optional:
                        if vals.count(b"") == len(vals):
                            continue
                        srows = list(compress(rrows, vals))
                        vals = list(filter(None, vals))
                    else:
                        srows = rrows
                    if g == "d_graph":
                        fvals = list(map(_BOOL.__getitem__, vals))
                    else:
                        fvals = self._floats_of(vals, g in _FEW)
                        if g == "p_hit":
                            fvals = [v / 100.0 for v in fvals]
                    _add_run(series, (signal, rank), srows, fvals)
                    if g == "d_suse":  # hybrid lines: token_usage is the larger of the two pools' usage
                        full = self._floats_of(list(filter(None, rc["d_fuse"])), True)
                        _add_run(series, ("token_usage", rank), srows, list(map(max, full, fvals)))
        out["series"] = series

        if "near" in kinds_t:
            rows, kc = kinds_t["near"]
            self._shapes("near", rows, kc, ((), ()), names_of, shapes)
        paths: dict[str, int] = {}
        codes: dict[str, int] = {}
        access_last = -1
        if "access" in kinds_t:
            rows, kc = kinds_t["access"]
            kinds["access"] = len(rows)
            self._shapes("access", rows, kc, ((), ()), names_of, shapes)
            for code, c in Counter(kc["status"]).items():
                codes[code.decode()] = c
            for (m, p), c in Counter(zip(kc["method"], kc["path"], strict=True)).items():
                k = f"{m.decode()} {p.decode()}"
                paths[k] = paths.get(k, 0) + c
            access_last = rows[-1]
        out.update(kinds=kinds, status=codes, paths=paths, access_last=access_last)

        # the text of the first line of each shape not reported before (for the reference's hints)
        shapes.sort(key=operator.itemgetter(1))
        if shapes:
            lines = block.split(b"\n")
            out["shapes"] = [(key, row, lines[row]) for key, row in shapes]
        else:
            out["shapes"] = []
        return out

    def parse_residual(self, block: bytes) -> dict[str, Any]:
        """The compiled scanner's residual lines: through :meth:`parse_near` when no line of them can be
        an access, decode or prefill line (none holds one of :data:`SHAPE_WORDS`: near-miss heads and
        other lines only), else through :meth:`parse_re`. Both give the same result on such a block."""
        if any(w in block for w in SHAPE_WORDS):
            return self.parse_re(block)
        return self.parse_near(block)

    def parse_near(self, block: bytes) -> dict[str, Any]:
        """:meth:`parse_re` for a block none of whose lines holds one of :data:`SHAPE_WORDS`: the same
        result with NEAR_BLOCK_RE (:func:`near_block_re`: five groups a line, not BLOCK_RE's fifty). A near-miss head
        the reference parser reads something from, or whose stamp no calendar has, is a reference line."""
        tuples = near_block_re().findall(block)
        n = len(tuples)
        stamp_c, frac_c, tags_c, near_c, other_c = zip(*tuples, strict=True)
        del tuples
        stamps = self._stamps
        if len(stamps) > 100_000:
            stamps.clear()
            stamps[b""] = 0.0
        uniq = set(stamp_c)
        for u in uniq.difference(stamps):
            t = _stamp(u)
            stamps[u] = None if t is None else float(t)
        near_rows = list(compress(range(n), near_c))
        unbulk = set(self._near_reads(near_c)) if near_rows else set()
        bad = any(stamps[u] is None for u in uniq)
        if bad:
            unbulk.update(i for i in near_rows if stamps[stamp_c[i]] is None)
        others = list(compress(range(n), other_c))
        lines: list[bytes] | None = None
        if unbulk:
            near_rows = [i for i in near_rows if i not in unbulk]
            lines = block.split(b"\n")
            others = sorted(others + list(unbulk))
        trig = TRIGGER_BYTES_RE.search
        refs: list[tuple[int, bytes]] = []
        for i in others:
            raw = lines[i] if i in unbulk else other_c[i]  # type: ignore[index]
            if trig(raw) or not raw.isascii() or b"\x00" in raw or len(raw) >= 65535:
                refs.append((i, raw))
        out: dict[str, Any] = {"n": n, "bulk_rows": near_rows, "inert": len(near_rows), "refs": refs}
        if not near_rows:
            out.update(ts=[], series={}, kinds={}, status={}, paths={}, access_last=-1, shapes=[])
            return out
        # the time of every row (0.0 for the rows that are not bulk lines, as parse_re has it)
        ts: list[float] = list(map(stamps.__getitem__, stamp_c))  # type: ignore[arg-type]
        if unbulk:
            for i in unbulk:
                ts[i] = 0.0
        if bad:
            ts = [0.0 if t is None else t for t in ts]
        if frac_c.count(b"") < n:
            fr = self._fracs
            for u in set(frac_c).difference(fr):
                fr[u] = float("0." + u.decode())
            fracs = list(map(fr.__getitem__, frac_c))
            if unbulk:
                for i in unbulk:
                    fracs[i] = 0.0
            ts = list(map(operator.add, ts, fracs))
        kc = {"tags": tuple(map(tags_c.__getitem__, near_rows)), "frac": tuple(map(frac_c.__getitem__, near_rows))}
        names_of = {t: self._tag(t)[1] for t in set(kc["tags"])}
        shapes: list[tuple[tuple[Any, ...], int]] = []
        self._shapes("near", near_rows, kc, ((), ()), names_of, shapes)
        shapes.sort(key=operator.itemgetter(1))
        if shapes and lines is None:
            lines = block.split(b"\n")
        out.update(ts=ts, series={}, kinds={}, status={}, paths={}, access_last=-1,
                   shapes=[(key, row, lines[row]) for key, row in shapes])  # type: ignore[index]
        return out

    def _near_reads(self, near_c: tuple[bytes, ...]) -> list[int]:
        """The rows of batch heads (the ``near`` group) the reference parser reads something from
        (:func:`~diagnoser.engines.sglang.logformats.batch_reads`), decided once per message with its
        digits made alike: the decision does not depend on them (a field name with a digit would
        break that: checked at import)."""
        known = self._near
        reads: dict[bytes, bool] = {b"": False}
        for u in set(near_c):  # each distinct message once (a log repeats its messages)
            if u:
                k = u.translate(_DIGITS_ALIKE)
                v = known.get(k)
                if v is None:
                    if len(known) > 4096:
                        known.clear()
                    v = known[k] = batch_reads(u.decode("ascii"))
                reads[u] = v
        if not any(reads.values()):
            return []
        return list(compress(range(len(near_c)), map(reads.__getitem__, near_c)))

    def _shapes(
        self,
        kind: str,
        rows: list[int],
        kc: dict[str, tuple[Any, ...]],
        shape_cols: tuple[tuple[str, ...], tuple[str, ...]],
        names_of: dict[bytes, tuple[str, ...]],
        found: list[tuple[tuple[Any, ...], int]],
    ) -> None:
        """Append (shape, first row) for each shape of these rows this parser has not reported."""
        text_cols, opt_cols = shape_cols
        parts: list[Any] = [kc[g] for g in text_cols]
        parts += [tuple(map(bool, kc[g])) for g in opt_cols]
        parts.append(tuple(map(names_of.__getitem__, kc["tags"])))
        parts.append(tuple(map(bool, kc["frac"])))
        if all(p.count(p[0]) == len(p) for p in parts):  # one shape (the usual case)
            first = {(kind, *(p[0] for p in parts)): rows[0]}
        else:
            first = {}
            for k, r in zip(zip(repeat(kind), *parts), rows, strict=True):
                if k not in first:
                    first[k] = r
        for k, r in first.items():
            if k not in self.reported:
                self.reported.add(k)
                found.append((k, r))


class _Recorder:
    """Stands in for the sink while reference lines of a chunk are fed: points are held back so they
    can be merged with the bulk points in line order; events and config go straight through."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.cur = 0
        self.points: dict[tuple[str, str], list[tuple[int, float, float, str]]] = {}

    def add(self, signal: str, ts: float, value: float, source: str, rank: str = "") -> None:
        self.points.setdefault((signal, rank), []).append((self.cur, ts, float(value), source))

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
        scanner()  # imported here, in the reading process, before any worker process forks
        self.block_parser = BlockParser()
        self.block_parser.parser_cls = type(parser)
        self.shapes: set[tuple[Any, ...]] = set()
        self.bulk_lines = 0

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
        return self.apply(self.block_parser.parse(block), first_line_no, fallback)

    def apply(self, parsed: dict[str, Any], first_line_no: int, fallback: Callable[[bytes, int], bool | None]) -> int:
        """The stateful half: hints, reference lines, merge, sink writes (chunks in file order)."""
        import numpy as np

        parser = self.parser
        rows = np.asarray(parsed["bulk_rows"], dtype=np.int64)
        ts = np.asarray(parsed.get("ts", ()), dtype=np.float64)
        # the first line of each shape not seen before: the reference parser applies its hints
        hint_lines: dict[int, bytes] = {}
        for key, row, raw in parsed.get("shapes", ()):
            if key not in self.shapes:
                self.shapes.add(key)
                hint_lines[row] = raw
        refs = parsed["refs"]
        if hint_lines:
            refs = sorted(refs + list(hint_lines.items()))
        ticks = parsed.get("ticks")
        if ticks:  # bare batch heads that only tick the untimed clock: runs of them, in line order with the rest
            refs = self._with_ticks(refs, rows, ticks)

        # reference lines, in order, with the clock set as if the bulk lines had been fed
        recognized = len(rows) - parsed.get("inert", 0)  # batch heads read nothing from: only the clock
        sink = parser.sink
        rec = _Recorder(sink)
        last_state = -1
        if refs:
            trig = TRIGGER_BYTES_RE.search
            before = np.searchsorted(rows, np.fromiter((L for L, _ in refs), dtype=np.int64, count=len(refs))) - 1
            parser.sink = rec
            try:
                for (L, raw), b in zip(refs, before.tolist(), strict=True):
                    if b >= 0:
                        parser.saw_date = True
                        if parser.first_stamp is None:
                            parser.first_stamp = _day(float(ts[rows[0]]))
                        if rows[b] > last_state:
                            parser.last_ts = float(ts[rows[b]])
                    if raw.__class__ is tuple:  # a run of k bare ticks, the last on line last_row
                        k, last_row = raw
                        t = parser.last_ts if parser.last_ts is not None else 0.0
                        for _ in range(k):
                            t += 1.0  # one second a line, as _untimed_ts adds it (not k at once: the same rounding)
                        parser.last_ts = t
                        parser.untimed_lines += k
                        last_state = last_row
                        continue
                    rec.cur = L
                    if L in hint_lines:
                        self._hints_only(raw, first_line_no + L)
                        last_state = L
                        continue
                    ok = fallback(raw, first_line_no + L)
                    if ok is not None and trig(raw):
                        last_state = L
                    if ok:
                        recognized += 1
            finally:
                parser.sink = sink
        if len(rows):
            parser.saw_date = True
            if parser.first_stamp is None:
                parser.first_stamp = _day(float(ts[rows[0]]))
            if rows[-1] > last_state:
                parser.last_ts = float(ts[rows[-1]])
            for kind, c in parsed["kinds"].items():
                parser.kinds[kind] += c
            for code, c in parsed["status"].items():
                parser.status_codes[code] += c
            for path, c in parsed["paths"].items():
                parser.access_paths[path] += c
            last = parsed["access_last"]
            if last >= 0:
                line_no = first_line_no + last
                if parser.access_last is None or parser.access_last[1] < line_no:
                    parser.access_last = (float(ts[last]), line_no)
        self._emit(parsed["series"], ts, first_line_no, rec)
        self.bulk_lines += len(rows)
        return recognized

    @staticmethod
    def _with_ticks(refs: list[tuple[int, Any]], rows: Any, ticks: list[int]) -> list[tuple[int, Any]]:
        """``refs`` and the tick rows in line order, each run of ticks with no bulk row or reference line
        between them as one ``(first row, (count, last row))``."""
        import numpy as np

        t = np.asarray(ticks, dtype=np.int64)
        ref_rows = np.fromiter((L for L, _ in refs), dtype=np.int64, count=len(refs))
        bb = np.searchsorted(rows, t)
        rb = np.searchsorted(ref_rows, t)
        starts = np.flatnonzero(np.concatenate(([True], (bb[1:] != bb[:-1]) | (rb[1:] != rb[:-1]))))
        ends = np.append(starts[1:], len(t)) - 1
        runs = [(int(t[a]), (int(b - a + 1), int(t[b]))) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        return sorted(refs + runs, key=operator.itemgetter(0)) if refs else runs

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

    def _emit(self, series: dict[tuple[str, str], tuple[Any, Any]], ts: Any, first_line_no: int, rec: _Recorder) -> None:
        """Write each series' points (bulk rows merged with the reference lines' points, in line order):
        whole columns when the sink takes them (``Timeline.add_columns``), else lists."""
        import numpy as np

        sink = self.parser.sink
        name = self.parser.source_name
        columns = getattr(sink, "add_columns", None)
        for key in sorted(set(series) | set(rec.points)):
            signal, rank = key
            mine = series.get(key)
            theirs = rec.points.get(key, [])
            if mine is None:
                srows = np.zeros(0, dtype=np.int64)
                t_ = vals = np.zeros(0, dtype=np.float64)
            else:
                srows = np.asarray(mine[0], dtype=np.int64)
                vals = np.asarray(mine[1], dtype=np.float64)
                t_ = ts[srows]
            lines = srows + first_line_no
            odd: list[str] | None = None  # sources of reference points not of the form "name:line"
            if theirs:
                # the (few) reference points go between the bulk points by line (no bulk row is a reference row)
                at = np.searchsorted(srows, [p[0] for p in theirs])
                t_ = np.insert(t_, at, [p[1] for p in theirs])
                vals = np.insert(vals, at, [p[2] for p in theirs])
                lines = np.insert(lines, at, [first_line_no + p[0] for p in theirs])
                if any(p[3] != f"{name}:{first_line_no + p[0]}" for p in theirs):
                    odd = [f"{name}:{k}" for k in lines.tolist()]
                    for i, p in zip((at + np.arange(len(theirs))).tolist(), theirs, strict=True):
                        odd[i] = p[3]
            if not len(t_):
                continue
            if columns is not None and odd is None:
                columns(signal, rank, t_, vals, name, lines)
                continue
            srcs = odd if odd is not None else [f"{name}:{k}" for k in lines.tolist()]
            _extend(sink, signal, rank, t_.tolist(), vals.tolist(), srcs)


def _day(ts: float) -> str:
    """``YYYY-MM-DD`` of an epoch time (UTC), as the reference parser keeps its first dated prefix."""
    import time as _time

    return _time.strftime("%Y-%m-%d", _time.gmtime(ts))


class _NullSink:
    def add(self, signal: str, ts: float, value: float, source: str, rank: str = "") -> None:
        pass

    def add_event(self, event: Any) -> None:
        pass

    def set_config(self, name: str, value: Any, source: str, *, override: bool = True) -> None:
        pass


_NULL_SINK = _NullSink()


SCAN: Any = "unloaded"  # the compiled scanner's glue module once :func:`scanner` has looked, or None


def scanner() -> Any:
    """The compiled scanner's glue (:mod:`logscan`) when ``_scan`` is built and not switched off with
    ``DIAGNOSER_NO_SCAN=1``; else None (the regex path does everything). The switch is read on first
    use (tests set ``SCAN = "unloaded"`` to read it again); :class:`BulkReader` looks before any worker forks."""
    global SCAN
    if isinstance(SCAN, str):
        import os

        off = os.environ.get("DIAGNOSER_NO_SCAN", "").strip() not in ("", "0")
        SCAN = logscan if logscan.AVAILABLE and not off else None
    return SCAN
