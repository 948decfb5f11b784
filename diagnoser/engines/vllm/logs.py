"""vLLM server logs → canonical signals, config facts and events (docs/vllm.md#logs).

Line head (``vllm/logger.py``): ``LEVEL MM-DD HH:MM:SS file.py:N] msg`` (0.2.x–0.6.x) and
``LEVEL MM-DD HH:MM:SS [file.py:N] msg`` (later), optionally after the multiprocess tag
``(APIServer pid=N)`` / ``(EngineCore_DP0 pid=N)`` / ``(VllmWorkerProcess pid=N)`` and after whatever an
outer collector put in front (a ``[YYYY-MM-DD HH:MM:SS]`` stamp, a docker-compose name). vLLM's stamp has
no year: the outer stamp's year is used when there is one, else the current year (the earlier one when
the day would be in the future), and the timeline says so (config fact ``log_year``).

Periodic stats line, every shape (``vllm/engine/metrics.py`` LoggingStatLogger for V0,
``vllm/v1/metrics/loggers.py`` LoggingStatLogger for V1):

* V0: ``Avg prompt throughput: X tokens/s, Avg generation throughput: Y tokens/s, Running: N reqs,
  Swapped: S reqs, Pending: M reqs, GPU KV cache usage: U%, CPU KV cache usage: C%`` (+ ``Prefix cache
  hit rate: GPU: H%, CPU: H%`` in 0.5–0.6)
* V1: ``[Engine 000: ]Avg prompt throughput: X tokens/s, Avg generation throughput: Y tokens/s, Running: N
  reqs, Waiting: M reqs, GPU KV cache usage: U%, Prefix cache hit rate: H%`` (``CPU KV cache usage`` on
  the CPU build); 0.32.0 adds, when non-zero, ``Deferred: D reqs``, ``KV fetch: …`` and ``Preemptions: P``
  (preemptions in the interval) before the KV usage, and more hit rates after it

Also: V0's preemption warning (``Sequence group … is preempted by PreemptionMode.RECOMPUTE mode because
there is not enough KV cache space … total_num_cumulative_preemption=N``), startup lines (``# GPU blocks:
N, # CPU blocks: M``, ``KV cache size: N tokens``, ``Maximum concurrency for L tokens per request: Xx``,
``Overriding num_gpu_blocks=…``, ``Using max model len L``, the ``non-default args: {…}`` line and the
older ``args: Namespace(…)``, ``Initializing a[n] [V1] LLM engine (vX) with config: …`` with its
CUDA-graph capture sizes, ``Model loading took X GiB``), speculative-decoding metrics lines, tracebacks
and exceptions (Python's own format, read by the same reader as SGLang's), and uvicorn access lines.

Two things are read from the stats lines beyond their fields (each in its own function):

* the config fact ``vllm_engine`` (``V0`` / ``V1``): which of vLLM's two engines printed them
  (:func:`engine_from_stats`; the start-up line ``Initializing a V0 / V1 LLM engine`` says it too,
  :func:`engine_from_init`). The scheduler differs: V0 without chunked prefill runs prefill-only steps.
* the canonical signal ``output_floor_tokens`` (:class:`OutputFloor`): a lower bound on the output of one
  request, from the generation throughput of intervals in which no prompt was admitted.
"""

from __future__ import annotations

import ast
import calendar
import re
import time
from collections import Counter
from typing import Any

from diagnoser.engines.sglang import logevents
from diagnoser.engines.vllm import config
from diagnoser.engines.vllm.versions import VersionRange, parse_version
from diagnoser.model import BadLine, LogEvent, SignalSink

_HEAD_RE = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][\w.-]*) pid=(?P<pid>\d+)\)\s+)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+)?"
    r"(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<frac>\d+))?\s+"
    r"\[?(?P<file>[\w.-]+\.py):(?P<lineno>\d+)\]\s?")
_OUTER_YEAR_RE = re.compile(r"(?<!\d)(\d{4})-\d\d-\d\d[T ]")
_PROC_ONLY_RE = re.compile(r"^\s*\((?P<proc>[A-Za-z_][\w.-]*) pid=\d+\)\s+")
_ACCESS_RE = re.compile(r'INFO:\s+[\w.:\[\]-]+ - "(GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) (\S+) HTTP/[\d.]+" (\d{3})')
# SGLang's endpoints that diagnoser itself probes when it does not yet know the engine: vLLM answers them 404,
# and those answers are ours, not the clients' requests failing (request_outcomes must not count them)
_OWN_PROBES = frozenset({"/server_info", "/get_server_info", "/get_server_args", "/model_info", "/get_model_info", "/v1/loads", "/load"})

_STAT_FIELDS = (
    ("prompt_tps", re.compile(r"Avg prompt throughput: ([\d.]+) tokens/s")),
    ("gen_throughput_tps", re.compile(r"Avg generation throughput: ([\d.]+) tokens/s")),
    ("running_reqs", re.compile(r"Running: (\d+) reqs")),
    ("swapped_reqs", re.compile(r"Swapped: (\d+) reqs")),
    ("queue_reqs", re.compile(r"(?:Pending|Waiting): (\d+) reqs")),
    ("deferred_reqs", re.compile(r"Deferred: (\d+) reqs")),  # 0.32: waiting requests skipped this step (in Waiting too)
)
_PREEMPTIONS_RE = re.compile(r"Preemptions: (\d+)")  # 0.32 V1: preemptions in the interval (shown when > 0)
_KV_USAGE_RE = re.compile(r"(?:(GPU|CPU|XPU|NPU|TPU|HPU) )?KV cache usage: ([\d.]+)%")
_HIT_RE = re.compile(r"(?<!External )(?<!MM )Prefix cache hit rate: (?:GPU: )?([\d.]+)%")
_ENGINE_RE = re.compile(r"Engine (\d+):")
_PREEMPT_RE = re.compile(r"is preempted by (?:PreemptionMode\.)?(\w+) mode because there is not enough KV cache space"
                         r"(?:.*?total_num_cumulative_preemption=(\d+))?")
_BLOCKS_RE = re.compile(r"# (?:GPU|gpu) blocks: (\d+), # (?:CPU|cpu) blocks: (\d+)|# (?:CPU|cpu) blocks: (\d+)")
_KV_SIZE_RE = re.compile(r"(?:(GPU|CPU|XPU|NPU|TPU|HPU) )?KV cache size: ([\d,]+) tokens")
_CONC_RE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_AVAIL_KV_RE = re.compile(r"Available KV cache memory: ([\d.]+) ?GiB")  # v1/worker/gpu_worker.py determine_available_memory
_OVERRIDE_RE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")
_MAXLEN_RE = re.compile(r"Using max model len (\d+)")
_CHUNKED_RE = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
_INIT_RE = re.compile(r"Initializing an? (?:(V\d) )?LLM engine \(v([\w.+-]+)\) with config: (.*)")
_BANNER_RE = re.compile(r"(?:vLLM API server version|█\s+version)\s+v?(\d+\.\d+(?:\.\d+)?[\w.+-]*)")
_WEIGHTS_RE = re.compile(r"(?:Model loading took|Loading model weights took) ([\d.]+) ?(GiB|GB)")
_GRAPH_DONE_RE = re.compile(r"Graph capturing finished in ([\d.]+) secs?(?:, took ([\d.]+) GiB)?")
_CAPTURE_SIZES_RE = re.compile(r"['\"]?cudagraph_capture_sizes['\"]?: \[([\d, ]*)\]")
_SPEC_V1_RE = re.compile(r"SpecDecoding metrics: .*?Mean acceptance length: ([\d.]+).*?(?:Avg Draft acceptance rate: ([\d.]+)%)?$")
_SPEC_V0_RE = re.compile(r"Speculative metrics: Draft acceptance rate: ([\d.]+)")
_TOO_LONG_RE = re.compile(r"Input prompt \((\d+) tokens\) is too long and exceeds (?:the capacity of block_manager|limit of (\d+))")
_CTX_RE = re.compile(r"maximum context length is (\d+) tokens\. However, you requested (\d+) tokens")
_KV_TOO_SMALL_RE = re.compile(r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)")
_FATAL = (("EngineDeadError", "the engine core died (EngineDeadError)"),
          ("Engine core initialization failed", "the engine core failed to start"),
          ("EngineCore encountered a fatal error", "the engine core hit a fatal error"),
          ("AsyncEngineDeadError", "the engine loop died (AsyncEngineDeadError)"))

# server arg (non-default args / Namespace / engine config) → config fact; the names the rules share
# with SGLang's adapter where the meaning is the same, vLLM's own name otherwise (docs/vllm.md#flags)
ARG_FACTS: dict[str, str] = {
    "max_num_seqs": "max_running_requests",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_model_len": "context_len",
    "max_seq_len": "context_len",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
    "kv_cache_dtype": "kv_cache_dtype",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "chunked_prefill_enabled": "enable_chunked_prefill",  # the engine config in 'Initializing … LLM engine' (0.6.6+)
    "enforce_eager": "enforce_eager",
    "block_size": "block_size",
    "num_gpu_blocks_override": "num_gpu_blocks_override",
    "swap_space": "swap_space_gb",
    "cpu_offload_gb": "cpu_offload_gb",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "quantization": "quantization",
    "speculative_config": "speculative",
    "model": "model_path",
    "served_model_name": "served_model_name",
    "preemption_mode": "preemption_mode",
    "max_cudagraph_capture_size": "max_cudagraph_capture_size",
    "watermark": "kv_watermark",  # --watermark (0.32: SchedulerConfig.watermark, the blocks V1 admission keeps free)
}
_NS_PAIR_RE = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\[[^\]]*\]|[^,()]+)")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _value(text: str) -> Any:
    t = text.strip()
    try:
        return ast.literal_eval(t)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return t


def engine_from_stats(sink: SignalSink, v0: bool, src: str) -> None:
    """``vllm_engine`` from the stats line's shape: V0's ``LoggingStatLogger`` prints ``Swapped: … Pending:``
    (``vllm/engine/llm_engine.py`` at v0.2.7, ``vllm/engine/metrics.py`` at v0.4.3 … v0.10.2), V1's
    ``Waiting:`` (``vllm/v1/metrics/loggers.py`` at v0.8.5 … v0.32.0). The first evidence read stands."""
    sink.set_config("vllm_engine", "V0" if v0 else "V1",
                    f"{src} (the stats line's shape: {'Swapped / Pending' if v0 else 'Waiting'})", override=False)


def engine_from_init(sink: SignalSink, tag: str | None, version: str, src: str) -> None:
    """``vllm_engine`` from the start-up line: ``Initializing a V0 / V1 LLM engine (vX)`` (0.8.5 and later,
    ``vllm/engine/llm_engine.py`` and ``vllm/v1/engine/core.py``); an untagged ``Initializing an LLM engine``
    is V0's before vLLM had a V1 engine (0.4.3), and ambiguous in 0.6.6, where the experimental V1 core
    prints the same words."""
    if tag in ("V0", "V1"):
        sink.set_config("vllm_engine", tag, f"{src} (Initializing a {tag} LLM engine)", override=False)
    else:
        config.engine_from_version(version, sink, src)


class OutputFloor:
    """A lower bound on the output of one request, from consecutive stats lines (the signal
    ``output_floor_tokens``).

    Each stats line's throughputs are the tokens of its interval over the seconds since the previous
    line (``_get_throughput`` in ``vllm/v1/metrics/loggers.py`` at v0.10.2, ``vllm/engine/metrics.py`` at
    v0.6.6). A chain starts at a line with requests running and none waiting or swapped: only those
    requests can generate until one is admitted, and an admitted request computes its prompt (V1 counts
    the prompt when its prefill completes, ``IterationStats.update_from_output``; V0 in the prefill step),
    so the chain lasts while the following lines show no prompt throughput. The tokens generated over the
    chain belong to at most the requests running at its start: one of them generated at least their
    share (a V0 request counts all its sampled sequences: V0's ``Running`` counts sequence groups). Seconds are taken conservatively: at most the usual gap between lines (V1 logs an idle interval
    at debug level, so a gap can span unlogged intervals), less one second for whole-second stamps, and
    each throughput less its last printed digit's half."""

    __slots__ = ("start_running", "tokens", "last_ts", "gaps")

    def __init__(self) -> None:
        self.start_running = 0.0
        self.tokens = 0.0
        self.last_ts: float | None = None
        self.gaps: list[float] = []

    def _start(self, vals: dict[str, float]) -> None:
        run = vals.get("running_reqs", 0.0)
        idle = vals.get("queue_reqs", 1.0) == 0 and vals.get("swapped_reqs", 0.0) == 0
        self.start_running = run if run >= 1 and idle else 0.0
        self.tokens = 0.0

    def feed(self, ts: float, line_no: int, vals: dict[str, float]) -> float | None:
        prev, self.last_ts = self.last_ts, ts
        if prev is None or ts <= prev or "gen_throughput_tps" not in vals or "prompt_tps" not in vals:
            self._start(vals)
            return None
        gap = ts - prev
        self.gaps.append(gap)
        if len(self.gaps) > 64:
            del self.gaps[0]
        if not self.start_running or vals["prompt_tps"] > 0:
            self._start(vals)  # a prompt was admitted (or nothing ran): the chain starts again here
            return None
        usual = sorted(self.gaps)[len(self.gaps) // 2]
        seconds = max(0.0, min(gap, usual) - (0.0 if ts % 1 else 1.0))
        self.tokens += max(0.0, vals["gen_throughput_tps"] - 0.05) * seconds
        out = self.tokens / self.start_running
        if vals.get("running_reqs", 0.0) < 1:  # every request of the chain finished: nothing can join it
            self._start(vals)
        return round(out, 1)


class VLLMLogParser:
    """Reads one vLLM log, line by line (:meth:`feed`)."""

    def __init__(self, sink: SignalSink, source_name: str) -> None:
        self.sink = sink
        self.source_name = source_name
        self.version = VersionRange()
        self.kinds: Counter[str] = Counter()
        self.untimed_lines = 0
        self.saw_date = False
        self.first_stamp: str | None = None  # not set: vLLM stamps carry no year (no date bound on the version)
        self.graph_labels: set[str] = set()
        self.dropped_values = 0
        self.status_codes: Counter[str] = Counter()
        self.access_paths: Counter[str] = Counter()
        self.access_last: tuple[float, int] | None = None
        self.last_ts: float | None = None
        self.year: int | None = None
        self.year_from = ""
        self._pending: list[LogEvent] = []
        self._finished = False
        self._shapes: set[str] = set()
        self._preempt_cum = 0  # the last total_num_cumulative_preemption read
        self._shutdown = False  # the server began to shut down ([shutdown] lines, uvicorn's Shutting down)
        self._floor: dict[str, OutputFloor] = {}  # per engine rank: the output floor's running chain
        self._file = ""  # the source file the current line's head names

    # events before the first stamped line get the first stamp (at finish)
    def emit_event(self, e: LogEvent) -> None:
        if self.last_ts is None:
            self._pending.append(e)
        else:
            self.sink.add_event(e)

    def _ts(self, line: str, m: re.Match[str]) -> float:
        if self.year is None:
            om = _OUTER_YEAR_RE.search(line, 0, m.start() + 1)
            if om:
                self.year, self.year_from = int(om.group(1)), "the collector's stamp in front of vLLM's"
            else:
                now = time.gmtime()
                y = now.tm_year
                if (int(m.group("mo")), int(m.group("d"))) > (now.tm_mon, now.tm_mday):
                    y -= 1
                self.year, self.year_from = y, "vLLM's stamps carry no year: the latest year the first stamp fits"
        mo, d, hh, mi, ss = (int(m.group(k)) for k in ("mo", "d", "h", "mi", "s"))
        if not (1 <= mo <= 12 and 1 <= d <= calendar.monthrange(2024, mo)[1] and hh < 24 and mi < 60 and ss < 61):
            raise BadLine("timestamp")
        y = self.year
        if mo == 2 and d == 29 and not calendar.isleap(y):
            y -= (y % 4) or 4  # a 29 February: the leap year before
        ts = float(calendar.timegm((y, mo, d, hh, mi, ss, 0, 0, 0)))
        if m.group("frac"):
            ts += float("0." + m.group("frac"))
        return ts

    def feed(self, line: str, line_no: int) -> bool:
        line = line.rstrip("\r\n")
        m = _HEAD_RE.search(line)
        if m is not None:
            ts = self._ts(line, m)
            if not self.saw_date:
                self.saw_date = True
                self.sink.set_config("log_year", self.year, f"{self.source_name}:{line_no} ({self.year_from})")
            first = self.last_ts is None
            self.last_ts = ts
            if first and self._pending:
                for e in self._pending:
                    self.sink.add_event(LogEvent(e.kind, ts, e.line_no, e.source, e.fields, e.rank))
                self._pending = []
            msg = line[m.end():]
            proc = m.group("proc") or ""
            self._file = m.group("file")
        else:
            ts = self.last_ts if self.last_ts is not None else 0.0
            pm = _PROC_ONLY_RE.match(line)
            msg = line[pm.end():] if pm else line.strip()
            proc = pm.group("proc") if pm else ""
            self._file = ""
            self.untimed_lines += 1
        return self._message(msg, ts, line_no, proc, timed=m is not None)

    def _message(self, msg: str, ts: float, line_no: int, proc: str, timed: bool) -> bool:
        src = f"{self.source_name}:{line_no}"
        sink = self.sink
        if "Avg prompt throughput" in msg or "Avg generation throughput" in msg:
            return self._stats(msg, ts, src)
        if msg.startswith("Prefix cache hit rate: GPU:"):  # V0 0.5–0.10: its own line after the stats line
            hm = _HIT_RE.search(msg)
            if hm:
                sink.add("cache_hit_rate", ts, float(hm.group(1)) / 100.0, src, "")
                return True
        if "INFO:" in msg and " HTTP/" in msg:
            am = _ACCESS_RE.search(msg)
            if am:
                method, path, code = am.group(1), am.group(2).split("?", 1)[0], am.group(3)
                if not (method == "GET" and code == "404" and path in _OWN_PROBES):
                    self.status_codes[code] += 1
                    self.access_paths[f"{method} {path}"] += 1
                self.access_last = (ts, line_no)
                return True
        if "is preempted by" in msg:
            pm = _PREEMPT_RE.search(msg)
            if pm:
                # V0 warns on the 1st, 51st, 101st… preemption (num_cumulative_preemption % 50 == 0 in
                # vllm/core/scheduler.py): the cumulative count says how many happened since the last warning
                cum = int(pm.group(2)) if pm.group(2) else None
                n = 1 if cum is None else max(1, cum - self._preempt_cum) if cum > self._preempt_cum else 1
                if cum is not None:
                    self._preempt_cum = cum
                fields: dict[str, Any] = {"requests": n, "mode": pm.group(1).lower()}
                if cum is not None:
                    fields["cumulative"] = cum
                self.emit_event(LogEvent("retraction", ts, int(src.rsplit(":", 1)[1]), src, fields, ""))
                sink.add("retracted_reqs", ts, float(n), src, "")
                if cum is not None:
                    sink.add("retractions_total", ts, float(cum), src, "")
                self.kinds["retraction"] += 1
                self.version.at_most((0, 10, 2), "the V0 scheduler's preemption warning (V1 logs none)")
                return True
        line_no = int(src.rsplit(":", 1)[1])
        if "blocks:" in msg:
            bm = _BLOCKS_RE.search(msg)
            if bm:
                if bm.group(1):
                    sink.set_config("num_gpu_blocks", int(bm.group(1)), src)
                    sink.set_config("num_cpu_blocks", int(bm.group(2)), src)
                else:
                    sink.set_config("num_cpu_blocks", int(bm.group(3)), src)
                self._pool_from_blocks(src)
                return True
        found = False
        if "KV cache size:" in msg:
            km = _KV_SIZE_RE.search(msg)
            if km:
                tokens = int(_num(km.group(2)))
                sink.set_config("kv_pool_tokens_log", tokens, src)
                sink.set_config("max_total_tokens", tokens, src)
                if km.group(1) == "CPU":
                    sink.set_config("device", "cpu", f"{src} (CPU KV cache size)", override=False)
                found = True
        if "Maximum concurrency for" in msg:
            cm = _CONC_RE.search(msg)
            if cm:
                sink.set_config("context_len", int(_num(cm.group(1))), src, override=False)
                sink.set_config("kv_max_concurrency", float(cm.group(2)), src)
                found = True
        if found:
            self._block_size_from_size(src)
            return True
        if "Available KV cache memory" in msg:
            am = _AVAIL_KV_RE.search(msg)
            if am:
                sink.set_config("kv_available_gib", float(am.group(1)), src)
                return True
        if "Overriding num_gpu_blocks" in msg:
            om = _OVERRIDE_RE.search(msg)
            if om:
                sink.set_config("num_gpu_blocks_profiled", int(om.group(1)), src)
                sink.set_config("num_gpu_blocks", int(om.group(2)), src)
                sink.set_config("num_gpu_blocks_override", int(om.group(2)), src)
                return True
        if msg.startswith("Chunked prefill is enabled"):
            # SchedulerConfig (vllm/config.py): "(EXPERIMENTAL)." at v0.4.3, "with max_num_batched_tokens=N." from v0.6.6
            sink.set_config("enable_chunked_prefill", True, src)
            cm2 = _CHUNKED_RE.search(msg)
            if cm2:
                sink.set_config("max_num_batched_tokens", int(cm2.group(1)), src, override=False)
            return True
        if "Using max model len" in msg:
            mm = _MAXLEN_RE.search(msg)
            if mm:
                sink.set_config("context_len", int(mm.group(1)), src)
                return True
        if "non-default args:" in msg:
            raw = msg.split("non-default args:", 1)[1].strip()
            args = _value(raw)
            if isinstance(args, dict):
                self._args(args, src)
                self.version.at_least((0, 8, 6), "the 'non-default args' startup line (0.8.5 logs 'args: Namespace(…)')")
                self.emit_event(LogEvent("server_args", ts, line_no, src, {"args": {k: v for k, v in args.items() if isinstance(k, str)}}))
                return True
        if msg.startswith("args: Namespace(") or "args: Namespace(" in msg[:40]:
            body = msg.split("Namespace(", 1)[1].rsplit(")", 1)[0]
            self._args({k: _value(v) for k, v in _NS_PAIR_RE.findall(body)}, src)
            return True
        if "LLM engine (v" in msg:
            im = _INIT_RE.search(msg)
            if im:
                self._version(im.group(2), src)
                self._shapes.add("v1" if im.group(1) == "V1" else "v0")
                engine_from_init(self.sink, im.group(1), im.group(2), src)
                cfg = im.group(3)
                pairs = {k: _value(v) for k, v in _NS_PAIR_RE.findall(cfg.split("compilation_config=", 1)[0])}
                self._args(pairs, src, override=False)
                if pairs.get("device_config") == "cpu":  # the CPU build (its KV blocks are 128 tokens, docs/vllm.md#memory)
                    sink.set_config("device", "cpu", f"{src} (device_config=cpu)", override=False)
                cs = _CAPTURE_SIZES_RE.search(cfg)
                if cs:
                    sizes = [int(x) for x in cs.group(1).replace(" ", "").split(",") if x]
                    sink.set_config("cuda_graph_bs", sizes, src)
                    if sizes:
                        sink.set_config("cuda_graph_max_bs_captured", max(sizes), src)
                    elif pairs.get("enforce_eager") is not True:
                        sink.set_config("cuda_graph_disabled_reason", "no CUDA-graph capture sizes (cudagraph_capture_sizes: [])", src)
                if pairs.get("enforce_eager") is True:
                    sink.set_config("disable_cuda_graph", True, f"{src} (enforce_eager=True)")
                return True
        if "version" in msg:
            vm = _BANNER_RE.search(msg)
            if vm:
                self._version(vm.group(1), src)
                return True
        if "took" in msg:
            wm = _WEIGHTS_RE.search(msg)
            if wm:
                sink.set_config("weight_mem_gb", float(wm.group(1)) * (1.073741824 if wm.group(2) == "GiB" else 1.0), src)
                return True
            gm = _GRAPH_DONE_RE.search(msg)
            if gm:
                if gm.group(2):
                    sink.set_config("graph_mem_gb", float(gm.group(2)) * 1.073741824, src)
                return True
            if "init engine (profile, create kv cache" in msg:
                self.emit_event(LogEvent("ready", ts, line_no, src, {"text": msg[:200]}))
                return True
        if "SpecDecoding metrics" in msg:
            sm = _SPEC_V1_RE.search(msg)
            if sm:
                sink.add("spec_accept_len", ts, float(sm.group(1)), src, "")
                if sm.group(2):
                    sink.add("spec_accept_rate", ts, float(sm.group(2)) / 100.0, src, "")
                return True
        if "Speculative metrics" in msg:
            sm = _SPEC_V0_RE.search(msg)
            if sm:
                sink.add("spec_accept_rate", ts, float(sm.group(1)), src, "")
                return True
        if "too long and exceeds" in msg:
            tm = _TOO_LONG_RE.search(msg)
            if tm:
                self.emit_event(LogEvent("request_too_long", ts, line_no, src, {
                    "input_tokens": int(tm.group(1)), "allowed_tokens": int(tm.group(2)) if tm.group(2) else None,
                    "limit": "context" if tm.group(2) else "pool_or_context", "auto_truncate_hint": False}))
                self.kinds["request_too_long"] += 1
                return True
        if "maximum context length is" in msg:
            xm = _CTX_RE.search(msg)
            if xm:
                self.emit_event(LogEvent("request_too_long", ts, line_no, src, {
                    "input_tokens": int(xm.group(2)), "allowed_tokens": int(xm.group(1)), "limit": "context", "auto_truncate_hint": False}))
                self.kinds["request_too_long"] += 1
                return True
        if "[shutdown]" in msg or msg.startswith("Shutting down") or msg.startswith("Waiting for application shutdown"):
            if not self._shutdown:
                self._shutdown = True
                self.emit_event(LogEvent("shutdown", ts, line_no, src, {"text": msg[:200]}))
            return True
        if self._shutdown and (msg.lstrip().startswith(("Traceback", "File \"", "^")) or "Error" in msg or "Exception" in msg
                               or not timed):
            return True  # the shutdown's own traceback (the engine core stopped first): not a crash
        got = False
        if "stored in KV cache" in msg:
            km2 = _KV_TOO_SMALL_RE.search(msg)
            if km2:
                sink.set_config("context_len", int(km2.group(1)), src)
                sink.set_config("kv_pool_tokens_log", int(km2.group(2)), src)
                sink.set_config("max_total_tokens", int(km2.group(2)), src)
                got = True
        for needle, what in _FATAL:
            if needle in msg:
                self.emit_event(LogEvent("fatal", ts, line_no, src, {"what": what, "text": msg[:200]}))
                self.kinds["fatal"] += 1
                got = True
                break
        if "Application startup complete" in msg:
            self.emit_event(LogEvent("ready", ts, line_no, src, {"text": msg[:200]}))
            return True
        if "Traceback (most recent" in msg or any(t in msg for t in logevents.TRIGGERS):
            got = logevents.read(self, msg, ts, "", src, line_no) or got
        if got:
            return True
        return timed  # any other line with vLLM's head is vLLM's (recognised, nothing to read)

    def _stats(self, msg: str, ts: float, src: str) -> bool:
        sink = self.sink
        em = _ENGINE_RE.search(msg)
        rank = f"dp{int(em.group(1))}" if em else ""
        got = False
        vals: dict[str, float] = {}
        for sig, pat in _STAT_FIELDS:
            fm = pat.search(msg)
            if fm:
                vals[sig] = v = float(fm.group(1))
                sink.add(sig, ts, v, src, rank)
                got = True
        v0 = "Swapped:" in msg or "Pending:" in msg
        usages = _KV_USAGE_RE.findall(msg)
        if usages:
            dev, pct = usages[0]
            sink.add("token_usage", ts, float(pct) / 100.0, src, rank)
            if v0 and len(usages) > 1:
                sink.add("cpu_cache_usage", ts, float(usages[1][1]) / 100.0, src, rank)
            if dev == "CPU" and not v0:
                sink.set_config("device", "cpu", f"{src} (CPU KV cache usage)", override=False)
            got = True
        hm = _HIT_RE.search(msg)
        if hm:
            sink.add("cache_hit_rate", ts, float(hm.group(1)) / 100.0, src, rank)
        pm = _PREEMPTIONS_RE.search(msg)
        if pm and int(pm.group(1)) > 0:
            n = int(pm.group(1))
            self.emit_event(LogEvent("retraction", ts, int(src.rsplit(":", 1)[1]), src, {"requests": n, "mode": "recompute"}, rank))
            sink.add("retracted_reqs", ts, float(n), src, rank)
            self.kinds["retraction"] += 1
        engine_from_stats(sink, v0, src)
        self._output_floor(vals, ts, src, rank)
        shape = "v0" if v0 else "v1"
        if shape not in self._shapes:
            self._shapes.add(shape)
            if v0:
                self.version.at_most((0, 10, 2), "the V0 stats line (Running / Swapped / Pending)")
                if self._file == "llm_engine.py":  # LLMEngine._log_system_stats at v0.2.7; vllm/engine/metrics.py at v0.3.3
                    self.version.at_most((0, 3, 2), "the stats line printed by vllm/engine/llm_engine.py (vllm/engine/metrics.py from 0.3.3)")
            else:
                self.version.at_least((0, 7, 0), "the V1 stats line (Running / Waiting; 0.6.6 has only V0's)")
        self.kinds["stats"] += 1
        return got

    def _output_floor(self, vals: dict[str, float], ts: float, src: str, rank: str) -> None:
        floor = self._floor.setdefault(rank, OutputFloor())
        got = floor.feed(ts, int(src.rsplit(":", 1)[1]), vals)
        if got is not None:
            self.sink.add("output_floor_tokens", ts, got, src, rank)

    def _version(self, text: str, src: str) -> None:
        pv = parse_version(text)
        if pv:
            self.version.set_exact(pv, f"{src}")
            self.sink.set_config("version", text.lstrip("v"), src, override=False)

    def _args(self, args: dict[str, Any], src: str, override: bool = True) -> None:
        for k, fact in ARG_FACTS.items():
            if k not in args:
                continue
            v = args[k]
            if isinstance(v, list) and k == "served_model_name":
                v = v[0] if v else None
            if v is None or v == "None":
                continue
            self.sink.set_config(fact, v, src, override=override)
        if "block_size" in args:
            self._pool_from_blocks(src)

    def _pool_from_blocks(self, src: str) -> None:
        cfg = getattr(self.sink, "config", {})
        blocks, bs = cfg.get("num_gpu_blocks"), cfg.get("block_size")
        if blocks is not None and bs is not None and "kv_pool_tokens_log" not in cfg:
            try:
                tokens = int(blocks.value) * int(bs.value)
            except (TypeError, ValueError):
                return
            self.sink.set_config("kv_pool_tokens_log", tokens, f"{blocks.source} × block_size {bs.value} ({bs.source})")

    def _block_size_from_size(self, src: str) -> None:
        """The block size behind the start-up line's "KV cache size: N tokens" when the log names the block
        count (``# GPU blocks`` or ``Overriding num_gpu_blocks``) but not ``block_size``: the one size (a power
        of two up to 1024) at which vLLM's own print (memory.capacity at the release) gives N tokens for that
        count and max_model_len. Nothing is set when no size or more than one fits."""
        from diagnoser.engines.vllm import memory

        cfg = getattr(self.sink, "config", {})
        blocks, tokens, length = (cfg.get(k) for k in ("num_gpu_blocks", "kv_pool_tokens_log", "context_len"))
        if "block_size" in cfg or blocks is None or tokens is None or length is None:
            return
        try:
            b, n, ln = int(blocks.value), int(tokens.value), int(length.value)
        except (TypeError, ValueError):
            return
        if b <= 0 or n <= 0 or ln <= 0:
            return
        versions = [self.version.exact] if self.version.exact else [(0, 11, 0), memory.SIZE_FROM_CONCURRENCY_SINCE]
        fits = {bs for bs in (2 ** i for i in range(11)) for v in versions if memory.capacity(b, bs, ln, v)[0] == n}
        if len(fits) == 1:
            bs = fits.pop()
            self.sink.set_config("block_size", bs, f"{src} (KV cache size {n:,} tokens over {b} blocks at max_model_len {ln})")

    def access_summary(self) -> dict[str, Any]:
        return {"requests": sum(self.status_codes.values()), "status": dict(sorted(self.status_codes.items())),
                "paths": dict(self.access_paths.most_common(10))}

    def finish(self) -> None:
        if self._pending:
            t0 = 0.0
            for e in self._pending:
                self.sink.add_event(LogEvent(e.kind, t0, e.line_no, e.source, e.fields, e.rank))
            self._pending = []
        if self.access_last is not None and not self._finished:
            self._finished = True
            ts, line_no = self.access_last
            self.sink.add_event(LogEvent("access_summary", ts, line_no, f"{self.source_name}:{line_no}", self.access_summary()))
