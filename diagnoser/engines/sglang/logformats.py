"""SGLang log-line formats (docs/sglang.md#logs): the patterns, field tables
and version tables the line parser (:mod:`diagnoser.engines.sglang.logs`) and the bulk reader
(:mod:`diagnoser.engines.sglang.logfast`, with the compiled scanner's glue
:mod:`diagnoser.engines.sglang.logscan`) share. Data and pure functions only, no state; every pattern is
compiled once, at import. The reader modules import this one and never each other in a circle:
``logs`` (the reference line parser) → ``logfast`` (the bulk reader, imported on first bulk use) →
``logscan`` (the C scanner's glue) → ``logformats``, ``logline``."""

from __future__ import annotations

import math
import re

from diagnoser.engines.sglang.logevents import TRIGGERS as EVENT_TRIGGERS
from diagnoser.engines.sglang.versions import Version

# ---------------------------------------------------------------------------------------------------
# prefix

_PREFIX_RE = re.compile(
    r"^(?:[\w.-]+\s+\|\s)?"  # docker compose: "sglang-1  | "
    r"(?:\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+)?"  # container stamp
    r"(?:\(SGLangEngine pid=\d+(?:, ip=[^)]*)?\)\s+)?"  # Ray
    r"(?:\[|(?=(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}[^\]]{0,60}\]))?"  # "[" (or missing "[" before a stamp)
    r"(?:(\d{4}-\d{2}-\d{2})[ T])?(\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?"
    r"((?:\s+(?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d{1,9})*)\]\s?"  # a rank of 10+ digits is no rank (as in logfast)
)
_BARE_PREFIX_RE = re.compile(r"^(?:[\w.-]+\s+\|\s)?(?:\(SGLangEngine pid=\d+(?:, ip=[^)]*)?\)\s+)?")
_TAG_RE = re.compile(r"(DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)(\d+)")


def rank_of(tags: str) -> tuple[str, dict[str, int]]:
    """A prefix's rank tags ("DP1 TP3") → (the rank a series is kept under: "dp1", "dp1/pp2" or "", the
    tags by name). TP and EP ranks print the same scheduler state, so they do not split series."""
    parsed = {k: int(v) for k, v in _TAG_RE.findall(tags)} if tags else {}
    parts = []
    if "DP" in parsed:
        parts.append(f"dp{parsed['DP']}")
    if parsed.get("PP"):
        parts.append(f"pp{parsed['PP']}")
    return "/".join(parts), parsed

_BATCH_RE = re.compile(r"(Prefill|Decode) batch(?:\s*\(mixed #running-req: (\d+)\))?\s*(?:\[(\d+)\])?\s*[.,]?\s*")

# field label in a batch line → canonical signal (None = recognised but not a timeline signal)
_DECODE_FIELDS: dict[str, str | None] = {
    "#running-req": "running_reqs",
    "#token": "used_tokens",
    "#full token": "used_tokens",
    "token usage": "token_usage",
    "full token usage": "full_token_usage",
    "swa token usage": "swa_token_usage",
    "mamba usage": "mamba_usage",
    "gen throughput (token/s)": "gen_throughput_tps",
    "#queue-req": "queue_reqs",
    "accept len": "spec_accept_len",
    "accept rate": "spec_accept_rate",
    "cuda graph": "cuda_graph",
    "cpu graph": "cuda_graph",
    "npu graph": "cuda_graph",
    "musa graph": "cuda_graph",
    "#retracted-req": None,
    "#swa token": None,
    "mamba num": None,
    "pre-allocated usage": "pd_prealloc_usage",
    "#prealloc-req": "pd_prealloc_reqs",
    "#transfer-req": "pd_transfer_reqs",
    "#host-receive-req": None,
    "largest-len": None,
    "waiting-image-req": None,
    "cap len": None,
    "block accept len": None,
    "fwd occupancy": None,
    "#gpu token": None,
    "gpu token usage": None,
    "#cpu token": None,
    "cpu token usage": None,
}
_PREFILL_FIELDS: dict[str, str | None] = {
    "#new-seq": "prefill_new_seqs",
    "#new-token": "prefill_new_tokens",
    "#cached-token": "prefill_cached_tokens",
    "cache hit rate": "cache_hit_rate",
    "token usage": "token_usage",
    "full token usage": "full_token_usage",
    "swa token usage": "swa_token_usage",
    "mamba usage": "mamba_usage",
    "#running-req": "prefill_running_reqs",  # the running batch beside this prefill, before its new requests join
    "#queue-req": "queue_reqs",
    "#pending-token": "pending_tokens",
    "input throughput (token/s)": "input_throughput_tps",
    "cuda graph": None,
    "cpu graph": None,
    "npu graph": None,
    "musa graph": None,
    "#unbootstrapped-req": "pd_bootstrap_reqs",
    "#transferring-req": "pd_inflight_reqs",
    "#prealloc-req": "pd_bootstrap_reqs",  # PD prefill 0.5.3-0.5.11: the bootstrap queue (renamed #bootstrap-req)
    "#bootstrap-req": "pd_bootstrap_reqs",
    "#inflight-req": "pd_inflight_reqs",
    "#optimistic-req": None,
    "#replay-token": None,
    "time": None,
    "waiting-image-req": None,
    "fwd occupancy": None,
}
_SUFFIX_PREFIXES = ("est. ",)

# the bulk reader's columns (logfast's regex groups; the C scanner's slots follow the same order):
# (group, canonical signal, optional) per kind — the same mapping as the field tables above
DECODE_COLS: tuple[tuple[str, str, bool], ...] = (
    ("d_run", "running_reqs", False),
    ("d_tok", "used_tokens", True),
    ("d_ftok", "used_tokens", True),
    ("d_use", "token_usage", True),
    ("d_fuse", "full_token_usage", True),
    ("d_suse", "swa_token_usage", True),
    ("d_alen", "spec_accept_len", True),
    ("d_arate", "spec_accept_rate", True),
    ("d_graph", "cuda_graph", True),
    ("d_gen", "gen_throughput_tps", False),
    ("d_queue", "queue_reqs", False),
)
PREFILL_COLS: tuple[tuple[str, str, bool], ...] = (
    ("p_seq", "prefill_new_seqs", False),
    ("p_new", "prefill_new_tokens", False),
    ("p_cached", "prefill_cached_tokens", False),
    ("p_hit", "cache_hit_rate", True),
    ("p_use", "token_usage", False),
    ("p_run", "prefill_running_reqs", False),
    ("p_queue", "queue_reqs", False),
    ("p_pend", "pending_tokens", True),
    ("p_in", "input_throughput_tps", True),
)

_RETRACT_RE = re.compile(
    r"(?:KV cache pool is full\. Retract requests\.|Decode out of memory happened\.|Testing retraction\.)"
    r"\s*#retracted_reqs: (\d+)(?:, #new_tokens_gained: (\d+))?(?:, #mamba_num_gained: (\d+))?"
    r"(?:, #new_token_ratio: ([\d.]+) -> ([\d.]+))?"
)
_OOM_RE = re.compile(r"(Prefill|Decode|Extend|Idle|\w+) out of memory\. Try to lower your batch size")
_SUMMARY_RE = re.compile(r"max_total_num_tokens=(\d+)(?:, .*)?$")
_KV_RE = re.compile(
    r"KV [Cc]ache (?:is )?allocated\.(?: dtype: ([\w.]+),)?(?: #tokens: (\d+),)?\s*(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)"
)
_LOAD_END_RE = re.compile(r"Load weight end\..*?avail mem=([\d.]+) GB(?:, mem usage=([\d.]+) GB)?")
_LOAD_BEGIN_RE = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")
_MEMPOOL_END_RE = re.compile(r"Memory pool end\. avail mem=([\d.]+) GB")
_GRAPH_BS_RE = re.compile(r"Capture (?:cuda|cpu|npu|musa) graph bs \[([\d, .]*)\]")
_GRAPH_END_RE = re.compile(r"Capture (?:(?:cuda|cpu|npu|musa) graph|target decode CUDA graph) end\.")
_GRAPH_END_BS_RE = re.compile(r"Capture target decode CUDA graph end\. bs=\[([\d, .]*)\]")
_GRAPH_MEM_RE = re.compile(r"mem usage=(\d+(?:\.\d+)?) GB")
_AVAIL_RE = re.compile(r"avail mem=(\d+(?:\.\d+)?) GB")
_HICACHE_RE = re.compile(
    r"Allocating (?:([\d.]+) GB host memory for hierarchical KV cache|(\w+) hierarchical KV host pool: (\d+) tokens, ([\d.]+) GB host memory)"
)
_REDUCED_RE = re.compile(r"max_running_requests was reduced from requested (\d+) to (\d+)")
_MAX_NUM_REQS_RE = re.compile(r"max_num_reqs\s*=\s*(\d+)")
_SPEC_RESET_RE = re.compile(r"Max running requests is reset to (\d+) for speculative decoding")
_ACCESS_RE = re.compile(r'INFO:\s+[\w.:\[\]-]+:\d+ - "(\w+) (\S+) HTTP/[\d.]+" (\d{3})')
_AUTO_MEM_RE = re.compile(r"Automatically reduce --mem-fraction-static to ([\d.]+)")
_NOT_ENOUGH_MEM = ("Not enough memory. Please try to increase --mem-fraction-static", "leave no GPU memory for the KV cache")
_HOST_MEM_ERR_RE = re.compile(r"Not enough host memory available\. Requesting ([\d.]+) GB but only have ([\d.]+) GB free")
_PROFILED_RE = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (\d+)")
_HICACHE_AUTO_RE = re.compile(
    r"HiCache auto-sizing: ratio ([\d.]+) -> ([\d.]+); ([\d.]+) GiB host memory per rank \(fraction ([\d.]+), (\d+) ranks? on this host\), host pools ([\d.]+) GiB"
)
_NO_KV_MEM_RE = re.compile(r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=(\d+(?:\.\d+)?)")

# "max_running_requests is capped to 9 by the mamba state cache (max_mamba_cache_size=47, …). To raise it:
# …"; "max_running_requests was reduced from requested 128 to 50" (the other forms of a cap set at start-up)
_CAPPED_RE = re.compile(
    r"max_running_requests (?:is|was|has been) (?:capped|reduced|limited|clamped|lowered|adjusted|set)"
    r"(?: from (?:requested |the requested )?(\d+))? to (\d+)"
    r"(?:(?: by| because of| because| due to| for) (?:the )?([^(.;]+?))?\s*(?:\(([^)]*)\))?(?:[.;]|$)"
)
_FLAG_RE = re.compile(r"(--[a-z][a-z0-9-]+)(?: (?!or\b|and\b|to\b|by\b)([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*))?")
# GitHub markdown around a pasted line, kubectl --prefix, journald heads; trailing backslash / backticks
_WRAP_HEAD_RE = re.compile(
    r"^(?:\s*>)+ ?|^\s*[-*+] (?=\[|\d{4}-)|^\s*`{1,3}(?=\S)|^\s+(?=\[\d{4}-)|^\[pod/[^\]\s]+\] ?"
    r"|^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]+ [\w./@-]+(?:\[\d+\])?: "
)
_WRAP_TAIL_RE = re.compile(r"(?:\s*\\|\s*`{1,3}|\s*<br\s*/?>)\s*$")

_NO_HIGH: Version = (99, 0, 0)

# Every line the parser can recognise contains one of these substrings (case-sensitive). A line with
# none of them is counted as unrecognised without touching the parser's state, which is what lets
# the bulk backfill (``logfast``) skip such lines in C and still produce exactly the same result.
TRIGGERS: tuple[str, ...] = (
    "batch",
    "#running-req:",
    "#token: ",  # a batch line's fields pasted without its head (SGLangLogParser._fragment)
    "#new-token: ",
    "#queue-req: ",
    "token usage: ",
    "throughput (token/s): ",
    "retracted_reqs",
    "out of memory",
    "max_total_num_tokens=",
    "max_total_num_token=",  # 0.1.x spelling (templates.py, family old_summary)
    "KV pool holds",  # templates.py, family pool_below_context
    "liding window memory pool",  # templates.py, family swa_pools (Sliding / sliding)
    "SWAKVPool",
    "full_layer_tokens=",
    "Mamba Cache is allocated",  # templates.py, family mamba_cache
    "server_args=",
    "KV Cache is allocated",
    "KV cache allocated",
    "Load weight",
    "Memory pool end",
    "Capture",
    "Capturing batches",
    "hierarchical",
    "HiCache",
    "max_running_requests ",
    "max_num_reqs",
    "Max running requests is reset",
    "HTTP/",
    "fired up and ready to roll",
    "mem-fraction-static",
    "larger than the profiled value",
    "Cuda graph is disabled",
    "leak detected",
    "Health check failed",
    "Traceback",
    *EVENT_TRIGGERS,  # crash, request-limit and PD lines (logevents)
)
TRIGGER_RE = re.compile("|".join(re.escape(t) for t in TRIGGERS))
_EVENT_TRIGGER_RE = re.compile("|".join(re.escape(t) for t in (*EVENT_TRIGGERS, "Traceback")))

# decode-line fields → the first version that prints them (docs/sglang.md#decode-line); "=" marks one-release fields
_DECODE_SINCE: dict[str, Version] = {
    "accept len": (0, 4, 2), "accept rate": (0, 5, 4), "pre-allocated usage": (0, 4, 6), "#retracted-req": (0, 4, 8),
    "#full token": (0, 4, 10), "full token usage": (0, 4, 10), "#swa token": (0, 4, 10), "swa token usage": (0, 4, 10),
    "cpu graph": (0, 5, 2), "#prealloc-req": (0, 5, 3), "#transfer-req": (0, 5, 3), "mamba num": (0, 5, 4),
    "mamba usage": (0, 5, 4), "npu graph": (0, 5, 9), "waiting-image-req": (0, 5, 9), "fwd occupancy": (0, 5, 11),
    "cap len": (0, 5, 16), "block accept len": (0, 5, 16), "#host-receive-req": (0, 5, 21), "#gpu token": (0, 5, 21),
    "gpu token usage": (0, 5, 21), "#cpu token": (0, 5, 21), "cpu token usage": (0, 5, 21), "cuda graph": (0, 4, 7),
    "largest-len": (0, 4, 4),
}
_PREFILL_SINCE: dict[str, Version] = {
    "#unbootstrapped-req": (0, 4, 6), "#transferring-req": (0, 4, 6), "input throughput (token/s)": (0, 4, 8),
    "full token usage": (0, 4, 10), "swa token usage": (0, 4, 10), "#prealloc-req": (0, 5, 3), "#inflight-req": (0, 5, 3),
    "mamba usage": (0, 5, 4), "cuda graph": (0, 5, 9), "cpu graph": (0, 5, 9), "npu graph": (0, 5, 9),
    "waiting-image-req": (0, 5, 9), "#pending-token": (0, 5, 11), "fwd occupancy": (0, 5, 11), "#bootstrap-req": (0, 5, 12),
    "#optimistic-req": (0, 5, 16), "#replay-token": (0, 5, 21), "time": (0, 4, 7),
}
# the field a complete 0.5.9+ batch line ends with (a ragged pasted line may stop anywhere)
_LAST_FIELDS = ("#queue-req", "input throughput (token/s)", "cuda graph", "cpu graph", "npu graph", "musa graph", "fwd occupancy")
_DECODE_UNTIL: dict[str, Version] = {"largest-len": (0, 4, 4)}
_PREFILL_UNTIL: dict[str, Version] = {
    "cache hit rate": (0, 4, 3), "#unbootstrapped-req": (0, 5, 2), "#transferring-req": (0, 5, 2),
    "#prealloc-req": (0, 5, 11), "time": (0, 4, 7),
}


def epoch_day(y: int, m: int, d: int) -> int:
    """Seconds from 1970-01-01 to the start of that UTC day (days_from_civil, H. Hinnant): the same as
    ``calendar.timegm`` without importing calendar and locale at start-up."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return (era * 146097 + doe - 719468) * 86400


# A log stamp is a real UTC time from 1970-01-01 00:00:00 to 9998-12-31 23:59:59 (a day short of what
# datetime can show, so a stamp plus a day still has a calendar date). Any other stamp — 0000-00-00,
# 9999-12-31, month 13, 31 April, hour 24, second 60 (POSIX time has no leap seconds) — makes its line an
# error (counted), the same in the line parser, the bulk regex path and the C scanner.
STAMP_YEARS = (1970, 9998)
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def date_ok(y: int, m: int, d: int) -> bool:
    if not (STAMP_YEARS[0] <= y <= STAMP_YEARS[1] and 1 <= m <= 12 and d >= 1):
        return False
    leap = m == 2 and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    return d <= _MONTH_DAYS[m - 1] + leap


def time_ok(h: int, mi: int, s: int) -> bool:
    return h < 24 and mi < 60 and s < 60


IMPOSSIBLE = -1.0  # what _num returns for a number no scheduler line holds (NaN, ±Inf, negative)


def _num(text: str) -> float | None:
    """A batch-line field's value; None when it is not a number, :data:`IMPOSSIBLE` when it is one that
    no field of a scheduler line can be (every one is a count, a size, a ratio or a rate: finite, >= 0)."""
    text = text.strip().rstrip(",.")
    if text in ("True", "False"):
        return 1.0 if text == "True" else 0.0
    pct = text.endswith("%")
    if pct:
        text = text[:-1]
    try:
        v = float(text)
    except ValueError:
        return None
    if not 0.0 <= v < math.inf:  # NaN fails both comparisons
        return IMPOSSIBLE
    return v / 100.0 if pct else v


def _split_fields(body: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for part in body.split(", "):
        part = part.strip().rstrip(",")
        if not part:
            continue
        key, sep, val = part.partition(": ")
        if not sep:
            continue
        out.append((key.strip(), val.strip()))
    return out


def batch_reads(msg: str) -> bool:
    """Whether ``SGLangLogParser._batch`` reads anything from a message that begins with a batch head
    (``Decode batch``/``Prefill batch``) over at least one ``key: value`` field: the
    ``(mixed #running-req: N)`` count, or a field that names a signal and holds a number (one no scheduler line can hold counts: it is counted as dropped). A line
    it reads nothing from is no batch line (``Decode batch, #x: 1``): not recognised, no version hint.

    The answer never depends on which digits the message has, only on where (no field name of either
    table has a digit; ``_BATCH_RE`` and ``float`` take any digit alike), so the bulk reader decides it
    once per message with its digits made alike (``logfast``)."""
    bm = _BATCH_RE.match(msg)
    if bm is None:
        return False
    fields = _split_fields(msg[bm.end():])
    if not fields:
        return False
    if bm.group(2):
        return True
    table = _DECODE_FIELDS if bm.group(1) == "Decode" else _PREFILL_FIELDS
    for key, val in fields:
        if not key.startswith(_SUFFIX_PREFIXES) and table.get(key) is not None and _num(val) is not None:
            return True
    return False
