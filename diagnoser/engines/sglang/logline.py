"""Where SGLang's message is in a log line, whatever was put around it (docs/sglang.md#log-prefix).

A line as a deployment stores it is SGLang's message behind a prefix nobody can list in full: SGLang's own
``[2026-11-29 09:32:06 TP0] ``, Python logging's default formats (``INFO:sglang.srt…:``, ``asctime - name -
LEVEL - ``), custom formatters bracketing time, file and level, a fork's rank tags and source file in one
bracket, journald (``Nov 29 09:32:06 host unit[pid]: ``), docker compose (``name  | ``), Ray (``(Scheduler
pid=123) ``), Kubernetes' CRI format (RFC3339 stamp, stream, ``P``/``F``), a tab-separated export from a
log store, ANSI colour codes, CRLF, or a JSON envelope from a log shipper with the message in a field.

So the message is found by what SGLang prints, not by the prefix: :data:`HEAD_RE` holds the heads of the
messages the parser reads (``Decode batch``, ``Prefill batch``, ``KV cache pool is full``, the summary and
start-up lines, access lines, and the field labels a pasted fragment can begin with), and the prefix is
whatever comes before the first head. From the prefix only the time (:func:`stamp`) and the rank tags are
taken, when it has them. A line without a head (a traceback, an exception) keeps the reader's own prefix
rules. Pure functions, no state; compiled once at import.
"""

from __future__ import annotations

import math
import re
from typing import Any

from diagnoser.engines.sglang.logformats import _PREFIX_RE, _WRAP_HEAD_RE, _WRAP_TAIL_RE

# the first words of every message the parser reads (its TRIGGERS say which lines to look at at all)
_HEADS = (
    r"(?:Prefill|Decode) batch",
    r"new fill batch\.",
    r"KV cache pool is full\.",
    r"Decode out of memory happened\.",
    r"Testing retraction\.",
    r"(?:Prefill|Decode|Extend|Idle) out of memory\. Try",
    r"max_total_num_tokens=",
    r"server_args=",
    r"Post-capture KV sizing:",
    r"KV [Cc]ache (?:is )?allocated\.",
    r"Load weight (?:begin|end)\.",
    r"Memory pool end\.",
    r"Capture (?:(?:cuda|cpu|npu|musa|piecewise CUDA|target \w+ CUDA|draft \w+ CUDA) graph)",
    r"Capturing batches \(",
    r"Allocating [\d.]+ GB host memory for hierarchical",
    r"Allocating \w+ hierarchical KV host pool",
    r"HiCache auto-sizing:",
    r"Not enough host memory available\.",
    r"max_running_requests (?:is|was|has been) ",
    r"Max running requests is reset",
    r"The server is fired up",
    r"Automatically reduce --mem-fraction-static",
    r"Not enough memory\. Please try to increase",
    r"Loaded weights leave no GPU memory",
    r"max_total_tokens=\d+ is larger than the profiled value",
    r"Cuda graph is disabled",
    r"\w* ?KV cache pool leak detected",
    r"token_to_kv_pool_allocator memory leak detected",
    r"Health check failed",
    r"Traceback \(most recent call last\)",
    r"\w+ hit an exception",
    r"(?:Prefill|Decode) (?:bootstrap|transfer) failed for request",
    r"Input length \(\d+ tokens?\) exceeds",
    r"Transfer Engine Throughput:",
    # the lines only the catalogue's templates read (templates.FAMILIES that act; templates._GATE)
    r"(?:\[gpu_id=\d{1,6}\] )?Prefil batch\.",  # 0.1.x: its template begins with the bracket
    r"decode out of memory happened,",
    r"Rank \d+: max_total_num_token=",
    r"(?:Decode|Prefill) out of memory\. This should never happen",
    r"Out of memory\. Try to lower your batch size",
    r"KV pool holds ",
    r"max_total_tokens=\S{1,40} is larger than the profiled value",
    r"Mamba Cache is allocated\.",
    r"SWAKVPool ",
    r"HiCache host KV pool \(",
    r"Use [Ss]liding window memory pool",
    r"Capture [\w ]{1,60}? (?:begin|end)\. (?:backend=|bs=)",
    # uvicorn's access line ("INFO:     127.0.0.1:42076 - \"POST /generate HTTP/1.1\" 200 OK")
    r"INFO: +[\w.:\[\]-]+:\d+ - \"",
)
# a fragment pasted without its head ("#running-req: 12, #token: 3400, token usage: 0.97, ..."): a field label
_FRAGMENT = (
    r"(?P<frag>(?:#(?:running-req|token|queue-req|new-seq|new-token|cached-token|pending-token|full token)"
    r"|(?:full |swa )?token usage|(?:cuda|cpu|npu|musa) graph|gen throughput \(token/s\)|input throughput \(token/s\)|cache hit rate): )"
)
# a head starts the line or follows what a prefix ends with (space, tab, bracket, colon, bar, quote, comma)
HEAD_RE = re.compile(r"(?:^|(?<=[\s\]\[):|>\"',}-]))(?:" + "|".join(_HEADS) + "|" + _FRAGMENT + ")")
# prose before a head means the head is quoted inside another message ("Scheduler hit an exception: ...")
# (or after an exception's type: "RuntimeError: Decode out of memory. Try to lower your batch size.")
_PROSE_RE = re.compile(r"[a-z]{2,} [a-z]{2,} [a-z]{2,}|[A-Za-z]\w*(?:Error|Exception|Warning)\b")
HEAD_WITHIN = 400  # a prefix is never longer than this

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# any time a prefix may hold: ISO date-time (SGLang's, Python's asctime, RFC3339 with an offset), the
# syslog/journald "Nov 29 09:32:06" (no year), a bare "09:32:06"
_MONTHS = {m: i + 1 for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))}
STAMP_RE = re.compile(
    r"(?<![\d:.])(?:(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[ T]|(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<sd>\d{1,2}) +)?"
    r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?(?P<z>Z|[+-]\d\d:?\d\d(?!\d))?(?![\d:])"
)
# rank tags anywhere in a prefix ("[... DP0 TP3 scheduler.py:12]", "TP0|EP1"): not part of a longer word
TAGS_IN_RE = re.compile(r"(?<![A-Za-z0-9])(?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d{1,9}(?![A-Za-z0-9])")

# a shipper's JSON envelope: where the message and the time are (first found wins, nested objects too)
_MESSAGE_KEYS = ("message", "msg", "log", "MESSAGE", "text", "line", "textPayload", "body", "content")
_TIME_KEYS = ("time", "timestamp", "@timestamp", "ts", "datetime", "date", "asctime", "__REALTIME_TIMESTAMP",
              "_SOURCE_REALTIME_TIMESTAMP", "Timestamp", "eventTime", "receiveTimestamp")


class Stamp:
    """A time read from a prefix: its calendar parts (``date`` None when the prefix has a time only,
    ``syslog`` when it has a month and day but no year), the fraction and the UTC offset in seconds."""

    __slots__ = ("date", "fraction", "hms", "offset", "syslog")

    def __init__(self, date: tuple[int, int, int] | None, hms: tuple[int, int, int], fraction: float,
                 offset: int, syslog: tuple[int, int] | None) -> None:
        self.date, self.hms, self.fraction, self.offset, self.syslog = date, hms, fraction, offset, syslog


def _stamp_of(m: re.Match[str]) -> Stamp:
    g = m.group
    date = (int(g("y")), int(g("mo")), int(g("d"))) if g("y") else None
    syslog = (_MONTHS[g("mon")], int(g("sd"))) if g("mon") else None
    frac = float("0." + g("f")) if g("f") else 0.0
    z = g("z")
    offset = 0
    if z and z != "Z":
        zz = z.replace(":", "")
        offset = (1 if zz[0] == "+" else -1) * (int(zz[1:3]) * 3600 + int(zz[3:5]) * 60)
    return Stamp(date, (int(g("h")), int(g("mi")), int(g("s"))), frac, offset, syslog)


def stamp(prefix: str) -> Stamp | None:
    """The time a prefix holds; when it holds several (a collector's before SGLang's own), the last,
    which is the nearest to the message: SGLang's clock. A dated stamp wins over a bare time after it."""
    best: re.Match[str] | None = None
    for m in STAMP_RE.finditer(prefix):
        if best is None or m.group("y") or m.group("mon") or not (best.group("y") or best.group("mon")):
            best = m
    return _stamp_of(best) if best is not None else None


def find_head(line: str) -> re.Match[str] | None:
    """The first message head in the line, when what comes before it can be a prefix (no prose)."""
    h = HEAD_RE.search(line, 0, HEAD_WITHIN + 80)
    if h is None or h.start() > HEAD_WITHIN:
        return None
    if h.start() and _PROSE_RE.search(line, 0, h.start()):
        return None
    return h


def _find(obj: Any, keys: tuple[str, ...], depth: int = 0) -> Any:
    if not isinstance(obj, dict) or depth > 4:
        return None
    for k in keys:
        v = obj.get(k)
        if v is not None and not isinstance(v, (dict, list)):
            return v
    for k in keys:  # a nested object under a message key ("log": {"message": ...})
        v = obj.get(k)
        if isinstance(v, dict) and (found := _find(v, keys, depth + 1)) is not None:
            return found
    for v in obj.values():
        if isinstance(v, dict) and (found := _find(v, keys, depth + 1)) is not None:
            return found
    return None


def envelope(line: str) -> tuple[str, float | str | None] | None:
    """A JSON object line → (the message it carries, its time: an ISO text, epoch seconds, or None);
    None when the line is not a JSON object with a message."""
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    import json  # only for JSON lines: the start-up path never imports it

    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
        return None
    msg = _find(obj, _MESSAGE_KEYS)
    if not isinstance(msg, str):
        return None
    when = _find(obj, _TIME_KEYS)
    t: float | str | None = None
    if isinstance(when, str) and when.strip().isdigit():
        when = int(when.strip())
    if isinstance(when, bool):
        t = None
    elif isinstance(when, (int, float)) and math.isfinite(when) and when > 0:
        v = float(when)
        while v > 1e11:  # milliseconds, microseconds, nanoseconds → seconds
            v /= 1000.0
        t = v
    elif isinstance(when, str):
        t = when
    return msg.rstrip("\r\n"), t


# the tokens a formatter's or collector's prefix is made of, for a line without a head (a traceback's frame,
# an exception): stamps, a stream and P/F (Kubernetes), an actor (Ray), brackets without prose, levels,
# logger names and file:line, with their separators; up to the last tab of a tab-separated export
LOOSE_PREFIX_RE = re.compile(
    r"(?:.*\t)?"
    r"(?:(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
    r"|(?:stdout|stderr) [PF]"
    r"|\([\w.-]{1,80} pid=\d{1,12}(?:, ip=[^)]{0,80})?\)"
    r"|\[[^\]\s]{1,80}(?: [^\]\s]{1,80}){0,8}\]"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?=[\s:\]-])"
    r"|sglang(?:\.\w+){0,8}|__main__|[\w-]{1,80}\.py:\d{1,9}"
    r")(?:\s+-\s+|\s*:\s*|\s+|\s*\|\s*))*"
)

# SGLang's own bracketed prefix right before a head, behind something else ("... stderr F [2026-11-29 09:32:06] ")
_SG_TAIL_RE = re.compile(
    r"\[(?:\d{4}-\d{2}-\d{2}[ T])?\d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?(?:\s+(?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d{1,9})*\]\s?$"
)
_COMMON_HEADS = ("Decode batch", "Prefill batch", "INFO:     ")  # most lines: no need to try every head (HEAD_RE)


def locate(line: str) -> tuple[str, re.Match[str] | None, re.Match[str] | None]:
    """Where the line parser reads a line (CR/LF, ANSI codes and a JSON envelope already taken off):
    ``(line, m, head)`` with ``line`` the text it reads (a suffix of the input: markdown and journald heads
    and a collector's prefix before SGLang's own taken off), ``m`` SGLang's own prefix at its start
    (``logformats._PREFIX_RE``) or None, and ``head`` the message head when the message is found by its
    head behind a prefix that is not SGLang's (else None: the message follows ``m``, or the line has no
    head and keeps the parser's own prefix rules)."""
    if line[:1] in _WRAP_FIRST or line[-1:] in _WRAP_LAST or line.startswith(_WRAP_STARTS):
        line = unwrap(line)
    m = _PREFIX_RE.match(line)
    if m and line[m.end():m.end() + 1] in ("[", "(") and (inner := _PREFIX_RE.match(line[m.end():])):
        line, m = line[m.end():], inner  # an outer collector's stamp before SGLang's own prefix: SGLang's clock and rank tags
    # SGLang's own prefix and a head right after it (almost every line), else the first head anywhere
    head = None if m is not None and (line.startswith(_COMMON_HEADS, m.end()) or HEAD_RE.match(line, m.end())) else find_head(line)
    if head is not None and m is not None:
        # after SGLang's own prefix the text is SGLang's message, unless what stands before the head
        # is more prefix (a formatter's "[scheduler.py:12] [INFO] "): a head inside a message is no head
        lp = LOOSE_PREFIX_RE.match(line, m.end())
        # (a head that begins with a bracket, 0.1.x's "[gpu_id=0] Prefil batch", may begin inside it)
        if head.start() < m.end() or lp is None or not head.start() <= lp.end() < head.end() or (
                lp.end() != head.start() and line[head.start()] != "["):
            head = None
    elif head is not None and head.start():
        # SGLang's own prefix behind a collector's ("2026-…Z stderr F [2026-11-29 09:32:06] Decode batch"):
        # read from it, exactly as if the line began there (its clock, its tags, its version hints)
        b = _SG_TAIL_RE.search(line, 0, head.start())
        if b is not None and (inner := _PREFIX_RE.match(line[b.start():])) is not None and inner.end() == head.start() - b.start():
            line, m, head = line[b.start():], inner, None
    return line, m, head


def sglang_offset(line: str) -> int:
    """How much stands before SGLang's own prefix in a line the parser reads from that prefix, as if the
    line began there (0 when nothing does, or the line is read another way). The bulk reader takes that
    much off such lines so that the compiled scanner and the bulk regex read wrapped logs too; what it
    takes off changes nothing the parser reads (``locate``)."""
    if "\x1b" in line or line[:1] == "{" or line.lstrip()[:1] == "{":
        return 0
    body = line.rstrip("\r")
    rest, m, head = locate(body)
    if head is not None or m is None or not body.endswith(rest):
        return 0
    b = (m.start(1) if m.group(1) else m.start(2)) - 1
    if b < 0 or rest[b] != "[":
        return 0
    return len(body) - len(rest) + b


_WRAP_FIRST = frozenset(">`-*+ \t")
_WRAP_LAST = frozenset("\\`>")
_WRAP_STARTS = ("[pod/", "Jan ", "Feb ", "Mar ", "Apr ", "May ", "Jun ", "Jul ", "Aug ", "Sep ", "Oct ", "Nov ", "Dec ")


def unwrap(line: str) -> str:
    """A line as pasted or shipped, without what was put around it: GitHub markdown (``> `` quotes,
    list bullets, backticks, a trailing backslash or ``<br>``), ``kubectl logs --prefix``'s
    ``[pod/NAME/CONTAINER]`` and a journald/syslog ``Mon DD HH:MM:SS host unit[pid]:`` head."""
    prev = None
    while prev != line:
        prev = line
        line = _WRAP_HEAD_RE.sub("", line, count=1)
        line = _WRAP_TAIL_RE.sub("", line, count=1)
    return line
