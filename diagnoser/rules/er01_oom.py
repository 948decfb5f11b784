"""The engine ran out of memory: prefill or decode allocation failures, or no room for the KV pool at startup.

What it detects:
    ``Prefill out of memory. Try to lower your batch size.`` / ``Decode out of memory. Try to lower your
    batch size.`` (and the older ``{phase} out of memory`` wording), startup failures ``Not enough
    memory. Please try to increase --mem-fraction-static.`` / ``Loaded weights leave no GPU memory for
    the KV cache``, and HiCache's ``Not enough host memory available``. Always critical: requests fail
    or the server does not start. (Retraction lines are not OOM; see ``kv_retraction``.)

Why it matters:
    An allocation failure aborts the batch or the scheduler; clients see errors, and a crashed
    scheduler stops serving entirely.

Evidence:
    Each OOM line with its line number and phase; the batch sizes and token usage just before it.

Fix:
    The tuning guide: OOM in prefill → lower ``--chunked-prefill-size`` (e.g. 4096 or 2048); OOM in
    decode → lower ``--max-running-requests``; no KV room at startup → raise ``--mem-fraction-static``
    (or use a smaller model / more GPUs); host OOM for HiCache → lower ``--hicache-size`` to fit free
    RAM minus 10 GiB.

Known false positives:
    None known: these lines are printed only on a failure.

References:
    ../shared/reference/sglang.md §3.4 (OOM and startup messages per version), §3.5 (HiCache host
    memory), §5.5, §7 (tuning guide on OOM); hand-built case oom-prefill (no public real case yet).
"""

from __future__ import annotations

from diagnoser.model import Evidence, Finding, Severity, Suggestion
from diagnoser.rules.base import Rule, RuleContext, suggest


class OOM(Rule):
    name = "oom"
    code = "ER01"
    title = "Out of memory"
    severity = Severity.CRITICAL
    for_seconds = 0.0
    defaults = {"decode_cut": 0.75}
    threshold_help = {"decode_cut": "proposed max_running_requests as a share of the current (decode OOM)"}

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        evs_in = ctx.events_of("oom", "startup_oom", "hicache_host_oom")
        if not evs_in:
            return None
        phases: dict[str, int] = {}
        evs: list[Evidence] = []
        for e in evs_in:
            phase = e.fields.get("phase") or ("startup" if e.kind == "startup_oom" else "host" if e.kind == "hicache_host_oom" else "unknown")
            phases[phase] = phases.get(phase, 0) + 1
            if phases[phase] == 1:
                evs.append(Evidence(f"{phase} out of memory", e.fields.get("text", e.kind)[:120], None, "", e.source))
        sugg: list[Suggestion] = []
        if "prefill" in phases:
            cur = ctx.cfg("chunked_prefill_size", ctx.cfg("arg.chunked_prefill_size"))
            prop = max(1024, int(cur) // 2) if isinstance(cur, int | float) and cur > 0 else 2048
            sugg.append(suggest(ctx, "chunked_prefill_size", cur if isinstance(cur, int | float) else None, prop,
                                "prefill ran out of memory: a smaller chunk needs fewer activation bytes per step",
                                "prefill steps fit in memory; long prompts take more steps", ("activations, not the KV pool, ran out",)))
        if "decode" in phases:
            cur = ctx.cfg("max_running_requests", ctx.cfg("arg.max_running_requests"))
            running = ctx.stats("running_reqs")
            base = cur if isinstance(cur, int | float) else running["max"]
            if base:
                sugg.append(suggest(ctx, "max_running_requests", cur if isinstance(cur, int | float) else None, max(1, int(base * ctx.thresholds["decode_cut"])),
                                    "decode ran out of memory: fewer concurrent requests need fewer decode buffers"
                                    + ("" if isinstance(cur, int | float) else f"; current cap unknown, based on the {base:.0f} observed running"),
                                    "decode fits; fewer requests run at once", ("the failure scales with the batch",)))
        if "startup" in phases:
            cur = ctx.cfg("mem_fraction_static", ctx.cfg("arg.mem_fraction_static"))
            sugg.append(suggest(ctx, "mem_fraction_static", cur if isinstance(cur, int | float) else None,
                                round(min(cur + 0.05, 0.95), 2) if isinstance(cur, int | float) else "current + 0.05",
                                "the weights left no room for the KV pool at this fraction", "the server can allocate a KV pool and start",
                                ("the GPU has memory left beyond the weights; otherwise add GPUs (--tp-size) or quantize",)))
        if "host" in phases:
            e = next(x for x in evs_in if x.kind == "hicache_host_oom")
            free = e.fields.get("free_gb")
            cur = ctx.cfg("hicache_size", ctx.cfg("arg.hicache_size"))
            if free is not None:
                sugg.append(suggest(ctx, "hicache_size", cur, max(1, int(free - 10)), f"the host pool asked for {e.fields.get('requested_gb')} GB with {free} GB free",
                                    "the host pool fits in RAM with the 10 GiB reserve SGLang keeps", ("other processes' RAM use stays as it is",)))
        total = sum(phases.values())
        summary = f"{total} out-of-memory event(s): " + ", ".join(f"{n} in {p}" for p, n in phases.items()) + "."
        return self.finding(ctx, summary, evs, sugg, confidence="high")
