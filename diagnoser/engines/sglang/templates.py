"""SGLang's log templates, compiled once into matchers: a message body → (template, typed fields).

The templates are the catalogue's (:mod:`diagnoser.engines.sglang.catalogue`), extracted from every
release's source. A template such as ``Capture {capture_name:any} {graph_backend[…]:any} end.
bs={runner.capture_bs:int}, elapsed={capture_time:float} s, …`` becomes an anchored regex; a field is
named by the label SGLang prints before it (``bs``, ``#running-req``, ``max_total_num_tokens``), else by
the expression.

Two entry points:

* :func:`match` — the best template for a body among all of them (coverage, tools);
* :func:`read` — the reader's hook for a body its own parsers did not read: only the template families
  whose meaning is written down in :data:`FAMILIES` act, each on the parser's sink (config facts,
  events). Called from :meth:`diagnoser.engines.sglang.logs.SGLangLogParser._message` (the unrecognised
  path) and from its CUDA-graph reader when the line's batch sizes were not read.

The semantics of each family are written once, in :data:`FAMILIES`, with the source they were read from
(file and line at a release tag, from the catalogue's ``at``); docs/catalogue.md lists them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from diagnoser.engines.sglang import catalogue

NUMBER = r"[-+]?(?:\d[\d,_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|NaN|Inf)"
_PLACEHOLDER_RE = re.compile(r"\{((?:[^{}:]|\{[^{}]*\})*):(int|float|hex|str|any)\}")
_LABEL_RE = re.compile(r"([#\w][\w #/()\-]*?)\s*(?:[:=]\s*\[?|\(\s*)$")
_MIN_LITERAL = 6  # a template with less literal text than this says nothing by itself (an opaque message)


@dataclass(frozen=True, slots=True)
class Template:
    id: str
    file: str
    level: str
    text: str
    releases: tuple[tuple[int, int], ...]
    at: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0]


@dataclass(slots=True)
class Compiled:
    template: Template
    regex: re.Pattern[str] | None  # None: opaque (the message is a variable)
    keys: tuple[str, ...]
    types: tuple[str, ...]
    anchor: str  # the longest literal run: a body must contain it
    literal: int  # literal characters: the more, the more specific
    head: str  # the first literal word when the template starts with one, else ""
    family: str | None = None


@dataclass(slots=True)
class Match:
    template: Template
    family: str | None
    fields: dict[str, Any]

    def get(self, *keys: str) -> Any:
        for k in keys:
            if k in self.fields:
                return self.fields[k]
        return None


def _literal_pieces(text: str) -> list[tuple[str, str]]:
    """("lit", text) / ("ph", "expr:type") / ("opt", "(") / ("opt", ")") pieces of one template line."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _PLACEHOLDER_RE.finditer(text):
        if m.start() > pos:
            out.append(("lit", text[pos:m.start()]))
        out.append(("ph", f"{m.group(1)}:{m.group(2)}"))
        pos = m.end()
    if pos < len(text):
        out.append(("lit", text[pos:]))
    res: list[tuple[str, str]] = []
    for kind, s in out:
        if kind != "lit":
            res.append((kind, s))
            continue
        buf = ""
        for ch in s:
            if ch in "\x02\x03":
                if buf:
                    res.append(("lit", buf.replace("{{", "{").replace("}}", "}")))
                    buf = ""
                res.append(("opt", "(" if ch == "\x02" else ")"))
            else:
                buf += ch
        if buf:
            res.append(("lit", buf.replace("{{", "{").replace("}}", "}")))
    return res


def _lit_regex(s: str) -> str:
    # SGLang's own spacing, but a run of spaces matches any run (aligned tables, a collector's squeeze)
    return r"\s+".join(re.escape(part) for part in re.split(r"\s+", s)) if s.strip() else r"\s*"


def compile_template(t: Template) -> Compiled:
    line = t.first_line
    pieces = _literal_pieces(line)
    lits = [s for k, s in pieces if k == "lit"]
    literal = sum(len(s.strip()) for s in lits)
    anchor = max((s.strip() for s in lits), key=len, default="")
    if literal < _MIN_LITERAL or not anchor:
        return Compiled(t, None, (), (), anchor, literal, "")
    parts: list[str] = []
    keys: list[str] = []
    types: list[str] = []
    prev_lit = ""
    open_opt = 0
    last_ph = max((i for i, (k, _) in enumerate(pieces) if k == "ph"), default=-1)
    for idx, (kind, s) in enumerate(pieces):
        if kind == "lit":
            parts.append(_lit_regex(s))
            prev_lit = s
        elif kind == "opt":
            if s == "(":
                parts.append("(?:")
                open_opt += 1
            elif open_opt:
                parts.append(")?")
                open_opt -= 1
        else:
            expr, typ = s.rsplit(":", 1)
            lm = _LABEL_RE.search(prev_lit)
            key = lm.group(1).strip() if lm else expr
            k, n = key, 2
            while k in keys:
                k, n = f"{key}#{n}", n + 1
            keys.append(k)
            types.append(typ)
            if typ in ("int", "float"):  # a list where the name said a number ("bs=[1, 2, 4]") reads too
                parts.append(rf"(\[[^\]]*\]|{NUMBER})")
            elif typ == "hex":
                parts.append(r"((?:0[xX])?[0-9a-fA-F]+)")
            else:
                parts.append("(.*)" if idx == last_ph == len(pieces) - 1 else "(.*?)")
            prev_lit = ""
    parts.extend(")?" for _ in range(open_opt))
    tail = "" if t.text != line else r"[\s,.;]*$"  # a multi-line message: its first line, whatever follows
    try:
        rx = re.compile("".join(parts) + tail, re.DOTALL)
    except re.error:
        return Compiled(t, None, (), (), anchor, literal, "")
    first = lits[0] if pieces and pieces[0][0] == "lit" else ""
    head = first.split()[0] if first.strip() and (len(first.split()) > 1 or first.endswith(" ")) else ""
    return Compiled(t, rx, tuple(keys), tuple(types), anchor, literal, head)


_NUMBER_RE = re.compile(NUMBER)


def _value(text: str, typ: str) -> Any:
    """A field's value: a number when it reads as one (an untyped ``{x:any}`` that prints a number too)."""
    if typ in ("int", "float", "any", "str") and not text.startswith("[") and _NUMBER_RE.fullmatch(text.strip()):
        text = text.strip()
        s = text.replace(",", "").replace("_", "")
        try:
            return int(s)
        except ValueError:
            try:
                return float(s)
            except ValueError:
                return text
    return text


# ------------------------------------------------------------------------------------------- semantics
@dataclass(frozen=True, slots=True)
class Family:
    """A group of templates that mean one thing, at every release that prints one of them."""

    name: str
    pattern: str  # a regex over the catalogue template's first line
    meaning: str  # what the fields mean (the source's own terms), written once
    cite: str  # where that was read: file:line at a release (the catalogue's ``at`` for the template)
    apply: Callable[[Any, Match, float, str, str, int], bool] | None = None  # acts on a parser; None: documented only


def _sizes(text: Any) -> list[int] | None:
    if not isinstance(text, str):
        return None
    if "..." in text:
        return None  # an elided list does not give the maximum
    nums = re.findall(r"-?\d+", text)
    return [int(x) for x in nums] if nums else None


def _graph_capture_end(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """A decode or verify graph capture with the batch sizes it captures (``bs=[…]``, on its begin or end
    line): the largest is the batch above which decode runs eagerly. A draft worker's graphs do not cap the
    target. Memory figures are taken from the end line only."""
    text = m.template.first_line
    whole = " ".join(str(v) for v in m.fields.values())
    if "draft" in whole.lower() or "draft" in text.lower():
        return True
    sizes = _sizes(m.get("bs"))
    if sizes:
        p.sink.set_config("cuda_graph_bs", sizes, src)
        p.sink.set_config("cuda_graph_max_bs_captured", max(sizes), src)
    if " begin" in text and " end" not in text.split(" begin", 1)[0]:
        return True
    mem = m.get("mem usage")
    if isinstance(mem, (int, float)):
        p.sink.set_config("graph_mem_gb", float(mem), src)
    avail = m.get("avail mem")
    if isinstance(avail, (int, float)):
        p.sink.set_config("avail_mem_after_graph_gb", float(avail), src)
    return True


def _profiled_pool(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """``max_total_tokens=R is larger than the profiled value P``: the requested pool R was cut to the
    profiled P. P ≤ 0 means the memory left after the weights holds no KV token at all."""
    from diagnoser.model import LogEvent

    requested = m.get("max_total_tokens")
    profiled = m.get("the profiled value", "profiled value")
    if profiled is None:
        vals = [v for v in m.fields.values() if isinstance(v, int)]
        profiled = vals[-1] if len(vals) >= 2 else None
    if isinstance(requested, int) and requested > 0:
        p.sink.set_config("max_total_tokens_requested", requested, src)
    if isinstance(profiled, int):
        if profiled <= 0:
            p.emit_event(LogEvent("startup_oom", ts, line_no, src,
                                  {"text": f"no KV memory: the profiled KV pool is {profiled} tokens (the memory left after "
                                           "the weights holds no KV cache; raise --mem-fraction-static or use less memory for weights)",
                                   "profiled_tokens": profiled}, rank))
            p.kinds["oom"] += 1
        else:
            p.sink.set_config("max_total_tokens_profiled", profiled, src)
            p.kinds["startup"] += 1
    return True


def _old_retraction(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """0.1.x-0.2.x: ``decode out of memory happened, #retracted_reqs: N, #new_token_ratio: a -> b``: N
    running requests were retracted (sent back to the queue) to free KV memory."""
    from diagnoser.model import LogEvent

    n = m.get("#retracted_reqs")
    if not isinstance(n, int) or n < 0:
        return False
    fields: dict[str, Any] = {"retracted_reqs": n}
    ratio = [v for k, v in m.fields.items() if k.startswith("#new_token_ratio") and isinstance(v, (int, float))]
    if len(ratio) == 2:
        fields["new_token_ratio_before"], fields["new_token_ratio_after"] = float(ratio[0]), float(ratio[1])
    p.emit_event(LogEvent("retraction", ts, line_no, src, fields, rank))
    p.sink.add("retracted_reqs", ts, float(n), src, rank)
    if len(ratio) == 2:
        p.sink.add("new_token_ratio", ts, float(ratio[1]), src, rank)
    p.kinds["retraction"] += 1
    return True


def _old_summary(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """0.1.x: ``Rank 0: max_total_num_token=N, max_prefill_num_token=M, context_len=C``: the KV pool (tokens)
    each rank allocated, the prefill budget and the context length."""
    names = {"max_total_num_token": "max_total_tokens", "max_prefill_num_token": "max_prefill_tokens", "context_len": "context_len"}
    done = False
    for k, name in names.items():
        v = m.get(k)
        if isinstance(v, int) and v > 0:
            p.sink.set_config(name, v, src)
            done = True
        if k == "max_total_num_token" and isinstance(v, int) and v > 0:
            p.sink.add("max_total_tokens", ts, float(v), src)
    if done:
        p.kinds["startup"] += 1
    return done


def _old_prefill(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """0.1.x ``[gpu_id=0] Prefil batch. #new-seq: …`` (SGLang's own spelling): the prefill fields, as in
    the later ``Prefill batch`` line."""
    from diagnoser.engines.sglang.logformats import _PREFILL_FIELDS, _split_fields

    body = m.fields.get("__body__", "")
    at = body.find("#new-seq")
    if at < 0:
        return False
    if not p._emit(_split_fields(body[at:]), _PREFILL_FIELDS, ts, rank, src):
        return False
    p.kinds["prefill"] += 1
    return True


def _mrr_reduced(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """``max_running_requests was reduced from the requested R to E (per dp worker) due to the available KV
    cache capacity``: E is the effective cap of each DP worker's scheduler; R what was asked for."""
    from diagnoser.model import LogEvent

    nums = [v for v in m.fields.values() if isinstance(v, int)]
    if len(nums) < 2 or nums[1] <= 0:
        return False
    requested, effective = nums[0], nums[1]
    p.sink.set_config("max_running_requests", effective, src)
    p.sink.set_config("max_running_requests_requested", requested, src)
    p.emit_event(LogEvent("max_running_requests_reduced", ts, line_no, src,
                          {"requested": requested, "effective": effective, "reason": "the available KV cache capacity (per DP worker)",
                           "levers": []}, rank))
    p.kinds["startup"] += 1
    return True


def _hicache_host_small(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """``HiCache host KV pool (H tokens) is smaller than the device pool (D tokens)``: the host tier holds
    H tokens, fewer than the GPU pool, so it adds little prefix cache."""
    nums = [v for v in m.fields.values() if isinstance(v, int)]
    if not nums or nums[0] <= 0:
        return False
    p.sink.set_config("hicache_host_tokens", nums[0], src)
    p.sink.set_config("enable_hierarchical_cache", True, src)
    p.kinds["startup"] += 1
    return True


def _oom(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """``Decode out of memory. This should never happen.`` (schedule_batch) or ``Out of memory. Try to lower
    your batch size.`` (mem_cache/allocation.py): the KV allocator had no room for a step."""
    from diagnoser.model import LogEvent

    body = str(m.fields.get("__body__", ""))
    head = body.split(" out of memory", 1)[0].strip().lower() if " out of memory" in body else ""
    phase = head if head in ("prefill", "decode", "extend") else "unknown"
    p.emit_event(LogEvent("oom", ts, line_no, src, {"phase": phase, "text": body[:200]}, rank))
    p.kinds["oom"] += 1
    return True


def _pool_below_context(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """``KV pool holds N tokens, fewer than --context-length C``: the pool (N tokens) cannot hold one
    request of the full context length."""
    nums = [v for v in m.fields.values() if isinstance(v, int)]
    if len(nums) < 2 or nums[0] <= 0:
        return False
    p.sink.set_config("max_total_tokens", nums[0], src, override=False)
    p.sink.set_config("context_len", nums[1], src, override=False)
    p.kinds["startup"] += 1
    return True


def _swa_pool(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """A hybrid sliding-window model's two pools: full-attention layers hold ``full_layer_tokens`` (``full
    size``) tokens, sliding-window layers ``swa_layer_tokens`` (``swa size``)."""
    swa = m.get("swa_layer_tokens", "swa size")
    full = m.get("full_layer_tokens", "full size")
    done = False
    if isinstance(swa, int) and swa > 0:
        p.sink.set_config("max_total_tokens_swa", swa, src)
        done = True
    if isinstance(full, int) and full > 0:
        p.sink.set_config("max_total_tokens", full, src, override=False)
        done = True
    if done:
        p.kinds["startup"] += 1
    return done


def _mamba_cache(p: Any, m: Match, ts: float, rank: str, src: str, line_no: int) -> bool:
    """``Mamba Cache is allocated. max_mamba_cache_size: N, …``: N request states in the mamba (SSM) state
    pool, a cap on the requests that can run at once on a hybrid SSM model."""
    n = m.get("max_mamba_cache_size")
    if not isinstance(n, int) or n <= 0:
        return False
    p.sink.set_config("mamba_cache_size", n, src)
    p.kinds["startup"] += 1
    return True


FAMILIES: tuple[Family, ...] = (
    Family(
        "decode_batch", r"^(?:\x02)?(?:\[[^\]]*\] )?(?:Decode batch|#running-req: \{)",
        "One decode step's state. #running-req is the requests in the running batch (len(running_batch.reqs)); "
        "#token the KV tokens in use (full - available - evictable); token usage their share of max_total_num_tokens; "
        "#queue-req the waiting queue. PD decode adds #prealloc-req (requests waiting for KV preallocation: "
        "len(disagg_decode_prealloc_queue.queue)) and #transfer-req (KV in transfer from prefill: "
        "len(disagg_decode_transfer_queue.queue)).",
        "sglang/srt/managers/scheduler.py:684 (0.3.6); sglang/srt/managers/scheduler_metrics_mixin.py:285 (0.5.4); "
        "sglang/srt/managers/scheduler_components/metrics_reporter.py:1071 (0.5.23)"),
    Family(
        "prefill_batch", r"^(?:\x02)?(?:\[[^\]]*\] )?(?:Prefill batch|new fill batch)",
        "One prefill step. #new-seq and #new-token are what this batch adds, #cached-token the prefix-cache hits; "
        "#running-req counts the requests already running (len(running_batch.reqs), before this batch joins them; "
        "0.5.23: prefill_stats.num_running_reqs.total), not the batch itself. PD prefill: #prealloc-req (0.5.3+: "
        "the bootstrap queue, len(disagg_prefill_bootstrap_queue.queue); called #unbootstrapped-req in 0.4.6-0.5.2), "
        "#inflight-req / #transferring-req (KV being sent: len(disagg_prefill_inflight_queue)).",
        "sglang/srt/managers/scheduler.py:655 (0.3.6), :1008 (0.4.6); sglang/srt/managers/scheduler_metrics_mixin.py:140 "
        "(0.5.4); sglang/srt/managers/scheduler_components/metrics_reporter.py:805 (0.5.23)"),
    Family(
        "scheduler_summary", r"^(?:\[[^\]]*\] )?max_total_num_tokens=\{",
        "Printed once by each scheduler after its pools exist: max_total_num_tokens is the KV pool actually allocated; "
        "max_running_requests is the EFFECTIVE cap (self.max_running_requests, from the TP worker: the requested value "
        "bounded by the request pool; hybrid and speculative models lower it), not server_args' requested value; "
        "context_len the model's. 0.5.x adds the memory left (available_gpu_mem / available_cpu_mem).",
        "sglang/srt/managers/tp_worker.py:148 (0.2.14); sglang/srt/managers/scheduler.py:211 (0.3.6), :377 (0.5.4), "
        ":1268 (0.5.23)"),
    Family(
        "max_running_requests_reduced_kv", r"^max_running_requests was reduced from the requested \{",
        "The effective max_running_requests of each DP worker, reduced from the requested value because the KV pool "
        "cannot hold that many requests' minimum; it outranks server_args' max_running_requests.",
        "sglang/srt/model_executor/model_runner_kv_cache_mixin.py; sglang/srt/mem_cache/kv_cache_configurator.py (0.5.23)",
        _mrr_reduced),
    Family(
        "hicache_host_smaller", r"^HiCache host KV pool \(\{",
        "The HiCache host pool's size in tokens, when it is smaller than the device pool (it then adds little).",
        "sglang/srt/mem_cache/memory_pool_host.py (0.5.2x)", _hicache_host_small),
    Family(
        "max_running_requests_effective",
        r"max_running_requests (?:was reduced|is capped)|Max running requests is reset|max_num_reqs",
        "Lines that state the effective max_running_requests when it differs from the requested one (reduced by the "
        "request or mamba state pool, reset for speculative decoding); they outrank server_args.",
        "sglang/srt/model_executor/model_runner.py (0.4.x-0.5.x), sglang/srt/server_args.py (speculative reset)"),
    Family(
        "old_retraction", r"^decode out of memory happened, #retracted_reqs: \{",
        "0.1.x-0.2.x retraction: #retracted_reqs running requests went back to the queue to free KV memory; "
        "#new_token_ratio is the scheduler's decode-growth estimate before and after.",
        "sglang/srt/managers/router/model_rpc.py (0.1.x); sglang/srt/managers/tp_worker.py (0.2.x)", _old_retraction),
    Family(
        "old_summary", r"^Rank \{[^}]*\}: max_total_num_token=\{",
        "0.1.x per-rank summary: max_total_num_token is the KV pool in tokens, max_prefill_num_token the prefill budget.",
        "sglang/srt/managers/router/model_rpc.py (0.1.x)", _old_summary),
    Family(
        "old_prefill", r"Prefil batch\. #new-seq",
        "0.1.x prefill line (spelled 'Prefil'): the same fields as the later Prefill batch line.",
        "sglang/srt/managers/controller/tp_worker.py (0.1.x)", _old_prefill),
    Family(
        "oom_other", r"^(?:Prefill|Decode) out of memory\. This should never happen|^Out of memory\. Try to lower your batch size",
        "The KV allocator could not serve a step (the shapes the reader's OOM pattern does not name a phase in).",
        "sglang/srt/managers/schedule_batch.py; sglang/srt/mem_cache/allocation.py (0.5.x)", _oom),
    Family(
        "pool_below_context", r"^KV pool holds \{",
        "The pool's size in tokens, when it cannot hold one request of the full context length.",
        "sglang/srt/managers/tp_worker.py (0.5.2x)", _pool_below_context),
    Family(
        "swa_pools", r"^Use [Ss]liding window memory pool|^SWAKVPool .*swa size: \{|^Post-capture KV sizing: full_layer_tokens=",
        "A hybrid sliding-window model's two pools, in tokens: full-attention layers (full_layer_tokens / full size) "
        "and sliding-window layers (swa_layer_tokens / swa size).",
        "sglang/srt/model_executor/model_runner.py (0.4.x-0.5.x), model_runner_kv_cache_mixin.py, "
        "sglang/srt/mem_cache/swa_memory_pool.py (0.5.2x)", _swa_pool),
    Family(
        "mamba_cache", r"^Mamba Cache is allocated\. max_mamba_cache_size: \{",
        "The mamba (SSM) state pool of a hybrid model: max_mamba_cache_size request states (one per running request).",
        "sglang/srt/mem_cache/memory_pool.py (0.5.x)", _mamba_cache),
    Family(
        "graph_capture_sizes", r"^Capture .*\b(?:begin|end)\b.*\bbs=\{",
        "A decode (or speculative verify) graph capture with the batch sizes it captures, bs=[…]: on the begin line "
        "in 0.5.14-0.5.21, on the end line from 0.5.22. The largest is the batch above which decode runs without a "
        "graph. Role 'draft' is the draft model's graph (not the target's cap). The graph label is CUDA/CPU/NPU/XPU "
        "graph by device.",
        "sglang/srt/model_executor/model_runner.py (0.5.14-0.5.15, begin); "
        "sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py (0.5.16-0.5.21 begin; :787 at 0.5.23, end)",
        _graph_capture_end),
    Family(
        "graph_capture", r"^Capture .*(?:graph|CUDA graph)|^Capturing batches|graph bs \[",
        "Graph capture begin/end lines (memory before and after, time); the capture list when printed.",
        "sglang/srt/model_executor/model_runner.py:964-969 (0.4.6), :2054-2068 (0.5.4); cuda_graph_setup.py:684-787 (0.5.23)"),
    Family(
        "profiled_pool", r"is larger than the profiled value \{",
        "The requested --max-total-tokens is above what memory allows, so the profiled value is used. The profiled "
        "value is computed from memory left after weights; it can be zero or negative (no KV memory at all), which "
        "this line then prints before the server fails.",
        "sglang/srt/model_executor/model_runner.py:355 (0.2.14), :1692 (0.5.4); "
        "sglang/srt/mem_cache/kv_cache_configurator.py:3102 (0.5.23)", _profiled_pool),
    Family(
        "kv_allocated", r"KV Cache is allocated|KV cache allocated",
        "The KV pool's allocation: #tokens, the K and V sizes in GB (the pool's bytes), the dtype.",
        "sglang/srt/mem_cache/memory_pool.py (0.4.x-0.5.x); sglang/srt/model_executor/model_runner_components/"
        "kv_pool_runtime.py:194 (0.5.23)"),
    Family(
        "hicache_host_pool", r"(?i)host (?:memory|pool)|hierarchical|HiCache",
        "HiCache's host pool: its size in GB and tokens (0.5.17+ prints tokens), the auto-sizing ratio, or an error "
        "when host memory is short. The host pool extends the prefix cache, not the decode pool.",
        "sglang/srt/mem_cache/memory_pool_host.py (0.4.3+); sglang/srt/mem_cache/hicache_auto_size.py (0.5.21+)"),
)


def _family_of(text: str) -> str | None:
    for f in FAMILIES:
        if re.search(f.pattern, text):
            return f.name
    return None


_GATE = re.compile(r"Capture|profiled|retracted_reqs|max_total_num_token=|Prefil batch|max_running_requests was reduced|HiCache host KV pool|[Oo]ut of memory|KV pool holds|[Ss]liding window memory pool|SWAKVPool|full_layer_tokens=|Mamba Cache is allocated")
_APPLY: dict[str, Callable[[Any, Match, float, str, str, int], bool]] = {f.name: f.apply for f in FAMILIES if f.apply}


# -------------------------------------------------------------------------------------------- matching
@dataclass(slots=True)
class Matcher:
    compiled: list[Compiled]
    by_head: dict[str, list[Compiled]]
    wild: list[Compiled]

    def match(self, body: str) -> Match | None:
        body = body.rstrip("\r\n")
        stripped = body.lstrip()
        first = stripped.split(None, 1)[0] if stripped else ""
        for c in (*self.by_head.get(first, ()), *self.wild):
            if c.anchor not in body:
                continue
            m = c.regex.match(stripped) if c.regex is not None else None
            if m is None:
                continue
            return Match(c.template, c.family,
                         {k: _value(v, t) for k, t, v in zip(c.keys, c.types, m.groups(), strict=False) if v is not None})
        return None


def _build(items: list[Compiled]) -> Matcher:
    items = sorted((c for c in items if c.regex is not None), key=lambda c: -c.literal)
    by_head: dict[str, list[Compiled]] = {}
    wild: list[Compiled] = []
    for c in items:
        (by_head.setdefault(c.head, []) if c.head else wild).append(c)
    return Matcher(items, by_head, wild)


@cache
def all_templates() -> tuple[Template, ...]:
    return tuple(Template(t["id"], t["file"], t["level"], t["template"], tuple(tuple(r) for r in t["releases"]), t.get("at", {}))
                 for t in catalogue.templates())


@cache
def compiled() -> tuple[Compiled, ...]:
    out = []
    for t in all_templates():
        c = compile_template(t)
        c.family = _family_of(t.first_line)
        out.append(c)
    return tuple(out)


@cache
def _matcher() -> Matcher:
    return _build(list(compiled()))


@cache
def _acting() -> Matcher:
    """Only the templates of the families that act, compiled (the reader's hook never pays for the rest)."""
    out = []
    for t in all_templates():
        fam = _family_of(t.first_line)
        if fam in _APPLY:
            c = compile_template(t)
            c.family = fam
            out.append(c)
    return _build(out)


def match(body: str) -> Match | None:
    """The most specific catalogue template (any release) whose first line the body matches, with its typed
    fields; None when none does. ``body`` is the message without its logging prefix."""
    return _matcher().match(body)


def read(parser: Any, body: str, ts: float, rank: str, src: str, line_no: int) -> bool:
    """The reader's hook for a message its own parsers did not read: match the families that act
    (:data:`FAMILIES` with an ``apply``) and apply the one found to the parser. True when one did."""
    if not _GATE.search(body):  # the acting families' words: a cheap gate
        return False
    m = _acting().match(body)
    if m is None or m.family is None:
        return False
    m.fields["__body__"] = body
    if not _APPLY[m.family](parser, m, ts, rank, src, line_no):
        return False
    lo, hi = text_span(m.template.first_line)
    if lo is not None and hi is not None:  # the releases that print this text bound the version
        why = f"log template {m.template.id} ({m.template.file})"
        parser.hint_at_least(lo, why)
        if hi < catalogue.release_versions()[-1]:
            parser.hint_at_most(hi, why)
    return True


@cache
def _spans() -> dict[str, tuple[Any, Any]]:
    vs = catalogue.release_versions()
    out: dict[str, tuple[Any, Any]] = {}
    for t in all_templates():
        lo, hi = vs[t.releases[0][0]], vs[t.releases[-1][1]]
        old = out.get(t.first_line)
        out[t.first_line] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
    return out


def text_span(first_line: str) -> tuple[Any, Any]:
    """The first and last release (version tuples) that print a template's first line, in any file."""
    return _spans().get(first_line, (None, None))


# values SGLang passes to placeholders that hold literal text of its own (coverage instances)
KNOWN_VALUES: dict[str, str] = {
    "msg_prefix": "KV cache pool is full. Retract requests. ",
    "iter_msg": " [17]",
}
FILLS: tuple[dict[str, str], ...] = (
    {"int": "17", "float": "0.42", "hex": "0x1f", "str": "x", "any": "x"},
    {"int": "17", "float": "0.42", "hex": "0x1f", "str": "17", "any": "17"},  # an untyped value that is a number
    {"int": "[1, 2, 4, 8]", "float": "0.42", "hex": "0x1f", "str": "cuda graph", "any": "cuda graph"},
)


def instance(c: Compiled, values: dict[str, str] | None = None, fill: dict[str, str] | None = None) -> str | None:
    """A message the template prints: ``values`` by field key, else ``fill`` by placeholder type
    (coverage; tests)."""
    if c.regex is None:
        return None
    vals = {**KNOWN_VALUES, **(values or {})}
    fill = fill or FILLS[0]
    out: list[str] = []
    i = 0
    for kind, s in _literal_pieces(c.template.first_line):
        if kind == "lit":
            out.append(s)
        elif kind == "ph":
            typ = s.rsplit(":", 1)[1]
            key = c.keys[i] if i < len(c.keys) else ""
            i += 1
            if key in vals:
                out.append(vals[key])
            else:
                out.append(fill.get(typ, "x"))
    return "".join(out)
