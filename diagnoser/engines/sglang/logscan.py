"""The compiled scanner's half of the bulk backfill: :func:`parse` gives what
:meth:`~diagnoser.engines.sglang.logfast.BlockParser.parse_re` gives for the same block, with numpy
columns in place of lists.

``_scan.scan`` (``_scan.c``, built at install when a C compiler is there) takes the lines whose shape it
knows for certain — the bulk regex's decode, prefill and access lines with numbers it can convert
exactly — and returns them as columns; it hands every other line back untouched, and those go through
``parse_re`` as before (``parse_near`` when none of them can be a bulk shape: ``parse_residual``). The two parts are merged by row. ``tests/test_log_scan.py`` holds the scanner
to the regex path line by line; ``tests/test_log_bulk.py`` holds both to the reference line parser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from diagnoser.engines.sglang.logformats import DECODE_COLS, PREFILL_COLS, TRIGGERS

try:
    from diagnoser.engines.sglang import _scan  # type: ignore[attr-defined]
except ImportError:  # not built (no C compiler at install): the regex path does everything
    _scan = None

if TYPE_CHECKING:  # for the annotations only: logfast imports this module, never the reverse
    from diagnoser.engines.sglang.logfast import BlockParser

AVAILABLE = _scan is not None
_TRIGGERS = tuple(t.encode() for t in TRIGGERS)

_DECODE, _PREFILL, _ACCESS = 1, 2, 3
_HDR = (b". ", b", ", b"")
_TRAIL = (b"", b",", b", ")
_GLAB = (b"", b"cuda", b"cpu", b"npu")
_FRAC = 1 << 9
# (value column, signal, presence mask or 0 when always there, divide by 100) per kind, in the
# regex path's order (logfast.DECODE_COLS / PREFILL_COLS)
_HYBRID = 1 << 10
_OPT = {"d_alen": 1 << 6, "d_arate": 1 << 7, "d_graph": 3 << 4, "p_hit": 1 << 6, "p_pend": 1 << 7, "p_in": 1 << 8}
# the scanner's value slots of a decode line: the hybrid line's used_tokens and token_usage (the larger
# pool's usage, as the regex path derives it) share slots 1 and 2 with the plain line's
_DECODE_SLOTS = {"d_run": 0, "d_tok": 1, "d_use": 2, "d_alen": 3, "d_arate": 4, "d_graph": 5, "d_gen": 6, "d_queue": 7,
                 "d_fuse": 8, "d_suse": 9}
_DECODE_TABLE = tuple(
    (_DECODE_SLOTS[g], sig, _HYBRID if g in ("d_fuse", "d_suse") else _OPT.get(g, 0), False)
    for g, sig, _ in DECODE_COLS
    if g != "d_ftok"  # slot 1 holds "#full token" on hybrid lines
)
_TABLES: dict[int, tuple[str, tuple[tuple[int, str, int, bool], ...], tuple[int, ...]]] = {
    _DECODE: ("decode", _DECODE_TABLE, (6, 7, 10)),
    _PREFILL: ("prefill", tuple((j, sig, _OPT.get(g, 0), g == "p_hit") for j, (g, sig, _) in enumerate(PREFILL_COLS)), (6, 7, 8)),
}


def _merge(series: dict[tuple[str, str], tuple[Any, Any]], key: tuple[str, str], rows: Any, vals: Any) -> None:
    prev = series.get(key)
    if prev is None:
        series[key] = (rows, vals)
        return
    r2 = np.concatenate((prev[0], rows))
    v2 = np.concatenate((prev[1], vals))
    order = np.argsort(r2, kind="stable")  # rows of the two parts never coincide
    series[key] = (r2[order], v2[order])


def parse(bp: BlockParser, block: bytes) -> dict[str, Any]:
    """One block through the scanner, the rest through ``bp.parse_re`` (see the module doc)."""
    n, kind_b, bits_b, tag_b, ts_b, vals_b, st_b, path_b, tags, paths, rrows_b, residual, refs = _scan.scan(block, _TRIGGERS)
    kind = np.frombuffer(kind_b, np.uint8)
    bits = np.frombuffer(bits_b, np.uint16)
    tag = np.frombuffer(tag_b, np.int16)
    ts = np.frombuffer(ts_b, np.float64).copy()
    vals = np.frombuffer(vals_b, np.float64).reshape(n, 10)
    rrows = np.frombuffer(rrows_b, np.int32).astype(np.int64)

    before = set(bp.reported)
    sub: dict[str, Any] | None = bp.parse_residual(residual) if len(rrows) else None
    tag_info = [bp._tag(t) for t in tags]

    series: dict[tuple[str, str], tuple[Any, Any]] = {}
    kinds: dict[str, int] = {}
    shape_rows: dict[tuple[Any, ...], int] = {}
    for code in (_DECODE, _PREFILL, _ACCESS):
        rows = np.flatnonzero(kind == code)
        if not len(rows):
            continue
        name = "access" if code == _ACCESS else _TABLES[code][0]
        kinds[name] = len(rows)
        _shapes(code, name, rows, bits, tag, tag_info, before, shape_rows)
        if code == _ACCESS:
            continue
        _, table, _opts = _TABLES[code]
        tk = tag[rows]
        by_rank: dict[str, list[int]] = {}
        for t in np.unique(tk).tolist():
            by_rank.setdefault(tag_info[t][0], []).append(t)
        for rank in sorted(by_rank):
            ids = by_rank[rank]
            rrank = rows if len(by_rank) == 1 else rows[np.isin(tk, ids)]
            b = bits[rrank]
            for j, signal, mask, pct in table:
                if mask:
                    present = (b & mask) != 0
                    if not present.any():
                        continue
                    srows = rrank[present]
                else:
                    srows = rrank
                v = vals[srows, j]
                if pct:
                    v = v / 100.0
                _merge(series, (signal, rank), srows, v)

    access = np.flatnonzero(kind == _ACCESS)
    status: dict[str, int] = {}
    path_counts: dict[str, int] = {}
    access_last = int(access[-1]) if len(access) else -1
    if len(access):
        codes, counts = np.unique(np.frombuffer(st_b, np.int16)[access], return_counts=True)
        status = {f"{c:03d}": k for c, k in zip(codes.tolist(), counts.tolist(), strict=True)}
        pc = np.bincount(np.frombuffer(path_b, np.int32)[access], minlength=len(paths))
        path_counts = {p.decode(): k for p, k in zip(paths, pc.tolist(), strict=True) if k}

    bulk_rows = np.flatnonzero(kind)
    shapes_text: dict[int, bytes] = {}
    if sub is not None:
        sub_rows = np.asarray(sub["bulk_rows"], dtype=np.int64)
        if len(sub_rows):
            mapped = rrows[sub_rows]
            bulk_rows = np.sort(np.concatenate((bulk_rows, mapped)))
            ts[mapped] = np.asarray(sub["ts"], dtype=np.float64)[sub_rows]
        if sub["refs"]:
            refs = sorted(refs + [(int(rrows[i]), raw) for i, raw in sub["refs"]])
        for key, (srows, svals) in sub["series"].items():
            _merge(series, key, rrows[np.asarray(srows, dtype=np.int64)], np.asarray(svals, dtype=np.float64))
        for k, c in sub["kinds"].items():
            kinds[k] = kinds.get(k, 0) + c
        for k, c in sub["status"].items():
            status[k] = status.get(k, 0) + c
        for k, c in sub["paths"].items():
            path_counts[k] = path_counts.get(k, 0) + c
        if sub["access_last"] >= 0:
            access_last = max(access_last, int(rrows[sub["access_last"]]))
        for key, row, raw in sub["shapes"]:
            r = int(rrows[row])
            if r < shape_rows.get(key, n):
                shape_rows[key] = r
                shapes_text[r] = raw
    bp.reported.update(shape_rows)

    out: dict[str, Any] = {"n": n, "bulk_rows": bulk_rows, "refs": refs, "inert": sub["inert"] if sub is not None else 0}
    if not len(bulk_rows):
        out.update(ts=[], series={}, kinds={}, status={}, paths={}, access_last=-1, shapes=[])
        return out
    shapes = sorted(shape_rows.items(), key=lambda kv: kv[1])
    if any(r not in shapes_text for _, r in shapes):
        lines = block.split(b"\n")
        shapes_text.update({r: lines[r] for _, r in shapes if r not in shapes_text})
    out.update(ts=ts, series=series, kinds=kinds, status=status, paths=path_counts, access_last=access_last,
               shapes=[(key, r, shapes_text[r]) for key, r in shapes])
    return out


def _shapes(code: int, name: str, rows: Any, bits: Any, tag: Any, tag_info: list[tuple[str, tuple[str, ...]]],
            before: set[tuple[Any, ...]], found: dict[tuple[Any, ...], int]) -> None:
    """The first row of each line shape (the regex path's key: ``BlockParser._shapes``) not reported
    before this block."""
    combo = (bits[rows].astype(np.int64) << 16) | tag[rows].astype(np.int64)
    # usually one shape per block (the first row), else sorted without the row order (cheaper);
    # the first row is looked up only for shapes not reported before
    uniq = [int(combo[0])] if (combo == combo[0]).all() else np.unique(combo).tolist()
    opts = _TABLES[code][2] if code != _ACCESS else ()
    for c in uniq:
        b, t = c >> 16, c & 0xFFFF
        names = tag_info[t][1]
        frac = bool(b & _FRAC)
        if code == _ACCESS:
            key: tuple[Any, ...] = (name, names, frac)
        else:
            key = (name, _HDR[b & 3], _TRAIL[(b >> 2) & 3], _GLAB[(b >> 4) & 3], *(bool(b >> o & 1) for o in opts), names, frac)
        if key in before:
            continue
        r = int(rows[int(np.argmax(combo == c))])
        if r < found.get(key, 1 << 62):
            found[key] = r
