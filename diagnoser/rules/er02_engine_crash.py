"""The engine crashed: a scheduler or worker process died with an exception, or a fatal error stopped it.

What it detects:
    SGLang's own crash notices — `Scheduler hit an exception: Traceback …` (and `TpModelWorkerClient`,
    `DataParallelController`, `DetokenizerManager` … `hit an exception`), after which the process sends
    SIGQUIT to the server and everything stops — and the fatal errors that kill it even when the notice was
    not captured: a SIGQUIT received from a child, a child process that exited, a segmentation fault, an
    NCCL error or watchdog timeout, a CUDA error, a device out-of-memory exception (`torch.OutOfMemoryError:
    CUDA out of memory` / HIP / NPU), the KV allocator's `Decode/Prefill out of memory` raised as an
    exception, a start-up failure (no memory for the KV pool), the scheduler watchdog's timeout; and,
    without any of those, a failed health check (the server stopped answering: hung, or dead without its
    traceback in the lines). A traceback counts when its frames run through the engine
    (`sglang/srt/managers`, `model_executor`, `layers`, `mem_cache`, `disaggregation` …) or when a crash
    notice is in the log; a truncated paste (an exception line without its frames, or the notice without its
    traceback) is enough. Tracebacks of helper code that the server survives (the HTTP server's post-warm-up
    `freeze_gc` call, a client library) are not crashes, nor a request that ends with a front-end error
    (`CancelledError` when a client disconnects, a validation error; frames of the tokenizer manager or the
    HTTP server only). Always critical.

Why it matters:
    A scheduler that dies takes the whole server with it (the other processes are killed): every
    running and queued request fails and nothing is served until a restart. It is not a throughput
    bottleneck to tune; it is the first thing to fix.

Evidence:
    The exception (type and message) and the line it is on, the process and rank that reported it,
    where it happened (prefill/extend, decode, CUDA-graph capture, start-up, request handling) from the
    message and the innermost engine frames, and what the log said just before (a request rejected as
    too long, an out-of-memory message).

    On each engine. On SGLang: scheduler and detokenizer exceptions, crash notices, fatal lines and failed
    health checks. On vLLM: tracebacks (same reader) and vLLM's fatal lines (an engine core that died, a
    failed start-up).

Fix:
    Depends on the cause, named in the finding: out of memory → see `oom` (lower
    `--chunked-prefill-size` for prefill, `--max-running-requests` for decode, leave activation room
    with a lower `--mem-fraction-static` for a device OOM); NCCL or CUDA errors → a GPU, the
    interconnect or another rank failed (check every rank's log and `dmesg`; `NCCL_DEBUG=INFO`);
    any other exception is an engine bug or an input it does not handle: upgrade SGLang, and report the
    full traceback with the server arguments. No flag is proposed by this rule.

Known false positives:
    A traceback pasted from a client or another program that happens to run SGLang code in-process
    (offline `Engine`): then the "server" is that program. An exception logged and handled by a
    subsystem that keeps running (the frames decide; a handled one usually has no crash notice).

References:
    - How diagnoser reads SGLang: [crash notices](docs/sglang.md#crashes), [OOM and capacity
      messages](docs/sglang.md#oom).
    - SGLang's source at v0.5.23: `python/sglang/srt/managers/scheduler.py` (`run_scheduler_process` logs
      `Scheduler hit an exception` and sends SIGQUIT to the parent),
      `python/sglang/srt/entrypoints/engine.py` (the SIGQUIT handler kills the process tree),
      `python/sglang/srt/mem_cache/allocation.py` (`Prefill/Decode out of memory. Try to lower your batch
      size.`).
    - Real cases: issue [#4048](https://github.com/sgl-project/sglang/issues/4048) (a TypeError after an
      over-long input), issue [#4602](https://github.com/sgl-project/sglang/issues/4602) (decode out of
      memory with page size 64), InferenceX issue
      [#2128](https://github.com/SemiAnalysisAI/InferenceX/issues/2128) (no memory for the KV pool at
      start-up).
"""

from __future__ import annotations

from typing import Any

from diagnoser.model import Evidence, Finding, LogEvent, Severity
from diagnoser.rules.base import Rule, RuleContext, fmt_int

# directories under sglang/srt whose frames are the engine's own work (not the HTTP front end or a client)
ENGINE_DIRS = {"managers", "model_executor", "layers", "mem_cache", "disaggregation", "speculative", "distributed",
               "models", "sampling", "model_loader", "lora", "constrained", "batch_overlap", "compilation", "eplb",
               "two_batch_overlap", "attention", "moe", "quantization", "hardware_backend", "dllm", "multimodal"}
MEMORY_WORDS = ("out of memory", "outofmemory", "no gpu memory", "not enough memory")
# the HTTP / tokenizer front end handles per-request errors (a client that disconnected, a bad request):
# its frames are not the engine's, and these exception types are a request's end, not a process's
FRONT_END = ("tokenizer_manager.py", "io_struct.py", "template_manager.py", "serving_chat.py", "serving_completions.py")
BENIGN_TYPES = ("CancelledError", "ConnectionResetError", "BrokenPipeError", "ClientDisconnect", "ClientDisconnected",
                "GeneratorExit", "StopIteration", "StopAsyncIteration", "ValidationError", "HTTPException", "JSONDecodeError")


def _engine_frame(frame: LogEvent) -> bool:
    parts = str(frame.fields.get("file", "")).split("/")
    return len(parts) >= 2 and parts[-2] in ENGINE_DIRS and parts[-1] not in FRONT_END


def _phase(text: str, frames: list[LogEvent]) -> str:
    low = text.lower()
    if "decode out of memory" in low:
        return "decode"
    if "prefill out of memory" in low or "extend out of memory" in low:
        return "prefill (extend)"
    for fr in reversed(frames):  # innermost first
        func = str(fr.fields.get("func", "")).lower()
        file = str(fr.fields.get("file", "")).lower()
        if "capture" in func or "cuda_graph_runner" in file and "replay" not in func:
            return "CUDA-graph capture (start-up)"
        if "decode" in func:
            return "decode"
        if "extend" in func or "prefill" in func or "chunked" in func:
            return "prefill (extend)"
        if func in ("load_model", "init_memory_pool", "init_cublas", "init_torch_distributed", "load_weights") or "model_loader" in file:
            return "start-up (model load)"
        if "handle_generate_request" in func or "process_input_requests" in func or "validate" in func or "tokenizer_manager" in file:
            return "request handling"
    return ""


class EngineCrash(Rule):
    name = "engine_crash"
    code = "ER02"
    title = "Engine crashed"
    severity = Severity.CRITICAL
    for_seconds = 0.0
    events = ("crash_notice", "fatal", "exception", "startup_oom", "health_failed")

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        notices = ctx.events_of("crash_notice")
        fatals = ctx.events_of("fatal")
        startup = ctx.events_of("startup_oom")
        excs = ctx.events_of("exception")
        frames = sorted(ctx.events_of("frame"), key=lambda e: e.line_no)
        ooms = [e for e in ctx.events_of("oom")]
        crash_excs: list[tuple[LogEvent, list[LogEvent]]] = []
        prev = 0
        for e in sorted(excs, key=lambda e: e.line_no):
            own = [f for f in frames if prev < f.line_no < e.line_no]
            prev = e.line_no
            text = f"{e.fields.get('type', '')}: {e.fields.get('message', '')}".lower()
            if str(e.fields.get("type", "")).rsplit(".", 1)[-1] in BENIGN_TYPES:
                continue  # a request that ended (client gone, bad input), not a process that died
            fatal_type = any(w in text for w in MEMORY_WORDS) or "nccl" in text or "cuda error" in text
            engine = any(_engine_frame(f) for f in own)
            benign = bool(own) and not engine
            if engine or (fatal_type and not benign) or (notices and not benign):
                crash_excs.append((e, own))
        health = ctx.events_of("health_failed")
        if not (notices or fatals or startup or crash_excs):
            if health:
                return self._hung(ctx, health)
            return None
        # the exception to report: the one nearest before the first notice, else the last engine one
        main: tuple[LogEvent, list[LogEvent]] | None = None
        if crash_excs:
            main = crash_excs[-1]
            if notices:
                before = [c for c in crash_excs if c[0].line_no <= notices[0].line_no]
                main = before[-1] if before else crash_excs[0]
        evs: list[Evidence] = []
        what = ""
        phase = ""
        if main is not None:
            e, own = main
            what = f"{e.fields.get('type')}: {e.fields.get('message')}".rstrip(": .")
            evs.append(Evidence("exception", what[:160], None, "", e.source))
            phase = _phase(what, own)
            eng = [f for f in own if _engine_frame(f)]
            if eng:
                inner = eng[-1]
                evs.append(Evidence("innermost engine frame", f"{inner.fields.get('file')} in {inner.fields.get('func')}", None, "", inner.source))
        elif startup:
            what = str(startup[0].fields.get("text", "")).rstrip(" .")
            evs.append(Evidence("start-up failure", what[:160], None, "", startup[0].source))
            phase = "start-up (KV pool sizing)"
        elif fatals:
            what = str(fatals[0].fields.get("text", fatals[0].fields.get("what", "")))
        if notices:
            n = notices[0]
            evs.append(Evidence("crash notice", f"{n.fields.get('process')} hit an exception" + (f" ({n.rank})" if n.rank else ""), None, "", n.source))
        for f in fatals[:2]:
            evs.append(Evidence("fatal", str(f.fields.get("what")), None, "", f.source))
        if startup and main is not None and main[0].source != startup[0].source:
            evs.append(Evidence("start-up failure", str(startup[0].fields.get("text", ""))[:160], None, "", startup[0].source))
        if not phase:
            phase = next((f"{e.fields.get('phase')}" for e in ooms if e.fields.get("phase") in ("prefill", "decode")), "")
        process = str(notices[0].fields.get("process")) if notices else ""
        ranks = sorted({e.rank for e in notices if e.rank})
        before = self._context(ctx, notices[0].line_no if notices else (main[0].line_no if main else 0))
        memory = bool(startup) or any(w in what.lower() for w in MEMORY_WORDS) or bool(ooms)
        nccl = "nccl" in what.lower() or any("NCCL" in str(f.fields.get("what")) for f in fatals)
        who = f"The {process} process" if process else "The engine"
        summary = f"{who} crashed" + (f" in {phase}" if phase else "") + (f": {what[:160]}" if what else "") + "."
        if before:
            summary += f" Just before: {before}."
        notes: list[str] = []
        if memory:
            notes.append("The cause is memory: see the oom finding for the flag to change.")
        elif nccl:
            notes.append("A collective (NCCL) failed: a GPU, the interconnect or another rank failed first. Check every rank's log "
                         "and the kernel log (dmesg); NCCL_DEBUG=INFO shows which peer.")
        else:
            notes.append("Not a tuning problem: an engine bug or an input it does not handle. Upgrade SGLang, or report the full "
                         "traceback with the server arguments.")
        if main is not None and not main[1]:
            notes.append("The traceback is cut in the inputs (no frames): where it happened is taken from the message and notice.")
        if ranks and len(ranks) > 1:
            notes.append(f"Reported by {len(ranks)} ranks ({', '.join(ranks[:6])}).")
        conf = "high" if notices or fatals or startup or (main is not None and any(_engine_frame(f) for f in main[1])) else "medium"
        n_events = len(notices) + len(fatals) + len(startup) + len(crash_excs)
        return self.finding(ctx, summary, evs, [], confidence=conf, severity=Severity.CRITICAL, notes=notes,
                            basis={"events": n_events, "kind": "crash"})

    def _hung(self, ctx: RuleContext, health: list[LogEvent]) -> Finding:
        """No exception in the inputs, but the server's health check failed: the scheduler or the
        detokenizer stopped answering (hung, or died without its traceback in the lines)."""
        e = health[0]
        evs = [Evidence("health check failed", str(e.fields.get("text", ""))[:160], None, "", e.source)]
        if len(health) > 1:
            evs.append(Evidence("health check failures", len(health), None, "", health[-1].source))
        summary = (f"The server stopped answering: its health check failed {len(health)} time(s) — the scheduler or the "
                   "detokenizer is hung or died (no traceback is in the inputs).")
        return self.finding(ctx, summary, evs, [], confidence="medium", severity=Severity.CRITICAL,
                            notes=["Look for a traceback or 'hit an exception' just before in every process's log; a hang in a collective "
                                   "(NCCL) shows as no progress on all ranks."],
                            basis={"events": len(health), "kind": "health check"})

    @staticmethod
    def _context(ctx: RuleContext, line_no: int) -> str:
        """What the log said just before the crash: a request rejected as too long."""
        long_ = [e for e in ctx.events_of("request_too_long") if e.line_no <= line_no or not line_no]
        if long_:
            e = long_[-1]
            f: dict[str, Any] = e.fields
            return (f"a request of {fmt_int(f.get('input_tokens'))} tokens was rejected as longer than the "
                    f"{fmt_int(f.get('allowed_tokens'))} allowed ({e.source})")
        return ""
