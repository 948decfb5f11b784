"""The engine ran out of memory: prefill or decode allocation failures, or no room for the KV pool at startup.

What it detects:
    `Prefill out of memory. Try to lower your batch size.` / `Decode out of memory. Try to lower your
    batch size.` (and the older `{phase} out of memory` wording), startup failures `Not enough
    memory. Please try to increase --mem-fraction-static.` / `Loaded weights leave no GPU memory for
    the KV cache`, and HiCache's `Not enough host memory available`. Always critical: requests fail
    or the server does not start. (Retraction lines are not OOM; see `kv_retraction`.)

Why it matters:
    An allocation failure aborts the batch or the scheduler; clients see errors, and a crashed
    scheduler stops serving entirely.

Evidence:
    Each OOM line with its line number and phase; the batch sizes and token usage just before it.

Fix:
    The tuning guide: OOM in prefill → lower `--chunked-prefill-size` (e.g. 4096 or 2048); OOM in
    decode → lower `--max-running-requests`; no KV room at startup → raise `--mem-fraction-static`
    (or use a smaller model / more GPUs); host OOM for HiCache → lower `--hicache-size` to fit free
    RAM minus 10 GiB.

Known false positives:
    None known: these lines are printed only on a failure.

References:
    - How diagnoser reads SGLang: [OOM and capacity messages by version](docs/sglang.md#oom), [how the pool
      is sized](docs/sglang.md#kv-budget), [HiCache host memory](docs/sglang.md#hicache-flags), [SGLang's
      tuning guide on OOM](docs/sglang.md#tuning-guide).
    - SGLang's [hyperparameter tuning
      guide](https://docs.sglang.ai/advanced_features/hyperparameter_tuning.html).
    - No public real case with a whole log yet: tested on a constructed log in SGLang's 0.4.10–0.5.2 shapes.
"""

from __future__ import annotations

from typing import Any

from diagnoser.model import Evidence, Finding, LogEvent, Severity, Suggestion
from diagnoser.rules.base import Rule, RuleContext, fmt_int, suggest


def oom_detail(ctx: RuleContext, e: LogEvent) -> dict[str, Any]:
    """The KV allocator's state printed just under an out-of-memory message (``Try to allocate N
    tokens.``, ``Avaliable tokens: N``, ``evictable_size()=N``): requested, available, evictable."""
    out: dict[str, Any] = {}
    for d in ctx.events_of("oom_detail"):
        if e.line_no < d.line_no <= e.line_no + 8 and d.source.rsplit(":", 1)[0] == e.source.rsplit(":", 1)[0]:
            for k, v in d.fields.items():
                out.setdefault(k, v)
            out.setdefault("source", d.source)
    return out


def frames_before(ctx: RuleContext, line_no: int) -> list[LogEvent]:
    """The traceback frames just above a line (back to the previous exception line)."""
    prev = max((x.line_no for x in ctx.events_of("exception") if x.line_no < line_no), default=0)
    return sorted((f for f in ctx.events_of("frame") if prev < f.line_no < line_no), key=lambda f: f.line_no)


class OOM(Rule):
    name = "oom"
    code = "ER01"
    title = "Out of memory"
    severity = Severity.CRITICAL
    for_seconds = 0.0
    events = ("oom", "startup_oom", "hicache_host_oom")
    defaults = {"decode_cut": 0.75}
    threshold_help = {"decode_cut": "proposed max_running_requests as a share of the current (decode OOM)"}

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        evs_in = ctx.events_of("oom", "startup_oom", "hicache_host_oom")
        if not evs_in:
            return None
        from diagnoser.rules.er02_engine_crash import _phase

        phases: dict[str, int] = {}
        evs: list[Evidence] = []
        device: dict[str, int] = {}  # device-memory (CUDA/HIP/NPU) OOMs by phase, outside the KV pool
        for e in evs_in:
            phase = e.fields.get("phase") or ("startup" if e.kind == "startup_oom" else "host" if e.kind == "hicache_host_oom" else "unknown")
            if e.fields.get("device_memory"):
                where = _phase(str(e.fields.get("text", "")), frames_before(ctx, e.line_no)) or "unknown"
                where = {"prefill (extend)": "prefill", "CUDA-graph capture (start-up)": "graph capture", "start-up (model load)": "model load"}.get(where, where)
                device[where] = device.get(where, 0) + 1
                phase = f"device ({where})" if where != "unknown" else "device"
            phases[phase] = phases.get(phase, 0) + 1
            if phases[phase] == 1:
                evs.append(Evidence(f"{phase} out of memory", e.fields.get("text", e.kind)[:120], None, "", e.source))
                if e.kind == "oom":
                    detail = oom_detail(ctx, e)
                    if detail.get("available") is not None:
                        evs.append(Evidence("free / evictable / requested KV tokens at the failure",
                                            f"{fmt_int(detail['available'])} / {fmt_int(detail.get('evictable', '?'))} / {fmt_int(detail.get('requested', '?'))}",
                                            None, "", detail.get("source", "")))
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
            dec = next(e for e in evs_in if e.fields.get("phase") == "decode" and not e.fields.get("device_memory"))
            detail = oom_detail(ctx, dec) if dec.kind == "oom" else {}
            if not base and detail.get("requested"):
                base = detail["requested"]  # one new token per running request: the batch at the failure
            if base:
                sugg.append(suggest(ctx, "max_running_requests", cur if isinstance(cur, int | float) else None, max(1, int(base * ctx.thresholds["decode_cut"])),
                                    "decode ran out of memory: fewer concurrent requests need fewer decode buffers"
                                    + ("" if isinstance(cur, int | float) else f"; current cap unknown, based on the {base:.0f} requests running at the failure"),
                                    "decode fits; fewer requests run at once", ("the failure scales with the batch",)))
            else:
                sugg.append(suggest(ctx, "max_running_requests", None, f"about {ctx.thresholds['decode_cut']:.2f} x the current cap",
                                    "decode ran out of memory: fewer concurrent requests need fewer KV slots per step; the current cap and "
                                    "the batch at the failure are not in the inputs", "decode fits; fewer requests run at once",
                                    ("the failure scales with the batch",)))
            avail, req = detail.get("available"), detail.get("requested")
            page = ctx.cfg("page_size", ctx.cfg("arg.page_size"))
            if isinstance(avail, int) and isinstance(req, int) and avail >= req > 0 and page != 1:
                # free tokens >= requested and still no room: allocation is in pages (a request that crosses a
                # page boundary needs a whole new page), so the page size is above 1
                low = max(2, -(-avail // req) if req else 2)
                sugg.append(suggest(ctx, "page_size", page if isinstance(page, int) else None, 1,
                                    f"{fmt_int(avail)} KV tokens were free for {fmt_int(req)} requested, yet decode failed: it allocates whole "
                                    f"pages (page size above 1, at least {low} here), and every request that crosses a page boundary needs a new one",
                                    "decode allocates single tokens, so it fails only when the pool is really full; retraction frees room before that",
                                    ("the attention backend allows page size 1 (FlashMLA needs 64: then upgrade to a version with page-aware retraction, PR #9989)",)))
        if "startup" in phases:
            cur = ctx.cfg("mem_fraction_static", ctx.cfg("arg.mem_fraction_static"))
            after = ctx.cfg("avail_mem_after_weights_gb")
            before = ctx.cfg("avail_mem_before_weights_gb")
            if before is None and after is not None and ctx.cfg("weight_mem_gb") is not None:
                before = float(after) + float(ctx.cfg("weight_mem_gb"))  # free memory before the weights loaded
            why = "the weights left no room for the KV pool at this fraction"
            prop: Any = round(min(cur + 0.05, 0.95), 2) if isinstance(cur, int | float) else "current + 0.05"
            if isinstance(after, int | float) and isinstance(before, int | float) and before > 0:
                # KV budget = free after weights - free before weights x (1 - fraction) (SGLang's sizing): >= 0 needs
                # fraction >= 1 - after / before; a little more gives the pool some room
                need = 1.0 - float(after) / float(before)
                prop = round(min(need + 0.02, 0.95), 2)
                why = (f"the KV budget is the {float(after):.2f} GB free after the weights minus {float(before):.2f} GB x (1 - fraction): "
                       f"it is positive only above {need:.3f}")
            auto = _auto_fraction_fix(ctx, cur)
            if auto is not None:
                prop, why = auto
            sugg.append(suggest(ctx, "mem_fraction_static", cur if isinstance(cur, int | float) else None, prop,
                                why, "the server can allocate a KV pool and start",
                                ("the GPU has memory left beyond the weights; otherwise add GPUs (--tp-size) or quantize",
                                 "above about 0.93 little is left for activations and graphs: more GPUs are the safer fix")))
        if "host" in phases:
            e = next(x for x in evs_in if x.kind == "hicache_host_oom")
            free = e.fields.get("free_gb")
            cur = ctx.cfg("hicache_size", ctx.cfg("arg.hicache_size"))
            if free is not None:
                sugg.append(suggest(ctx, "hicache_size", cur, max(1, int(free - 10)), f"the host pool asked for {e.fields.get('requested_gb')} GB with {free} GB free",
                                    "the host pool fits in RAM with the 10 GiB reserve SGLang keeps", ("other processes' RAM use stays as it is",)))
        if device:
            sugg.extend(self._device(ctx, device, sugg))
        total = sum(phases.values())
        summary = f"{total} out-of-memory event(s): " + ", ".join(f"{n} in {p}" for p, n in phases.items()) + "."
        if device:
            summary += " A device out-of-memory error is memory outside the KV pool (activations, CUDA graphs, buffers)."
        return self.finding(ctx, summary, evs, sugg, confidence="high", basis={"events": total, "kind": "out of memory"})

    def _device(self, ctx: RuleContext, device: dict[str, int], have: list[Suggestion]) -> list[Suggestion]:
        """A device OOM (``torch.OutOfMemoryError: CUDA out of memory``): the memory the static fraction
        leaves for activations and graphs ran out, so lower the fraction (or what used it)."""
        out: list[Suggestion] = []
        flags = {s.flag for s in have}
        if "prefill" in device and ctx.flag("chunked_prefill_size") not in flags:
            cur = ctx.cfg("chunked_prefill_size", ctx.cfg("arg.chunked_prefill_size"))
            out.append(suggest(ctx, "chunked_prefill_size", cur if isinstance(cur, int | float) else None,
                               max(1024, int(cur) // 2) if isinstance(cur, int | float) and cur > 0 else 2048,
                               "prefill ran out of device memory: a smaller chunk needs fewer activation bytes per step",
                               "prefill steps fit in memory; long prompts take more steps", ("activations of the prefill step ran out",)))
        if "graph capture" in device:
            cur = ctx.cfg("cuda_graph_max_bs_captured") or ctx.cfg("arg.cuda_graph_max_bs")
            out.append(suggest(ctx, "cuda_graph_max_bs", cur, max(8, int(cur) // 2) if isinstance(cur, int | float) else "half the current",
                               "capturing CUDA graphs ran out of device memory: fewer captured batch sizes need less",
                               "the server starts; batches above the new maximum run without graphs", ("graph memory, not the weights, ran out",)))
        if "model load" not in device or len(device) > 1:
            mfs = ctx.cfg("mem_fraction_static", ctx.cfg("arg.mem_fraction_static"))
            if not any(s.flag == ctx.flag("mem_fraction_static") for s in have):
                out.append(suggest(ctx, "mem_fraction_static", mfs if isinstance(mfs, int | float) else None,
                                   round(max(float(mfs) - 0.05, 0.5), 2) if isinstance(mfs, int | float) else "current - 0.05",
                                   "device memory outside the static pool (activations, graphs) ran out: a lower static fraction leaves it more",
                                   "the step fits; the KV pool shrinks by about the same share", ("the pool can spare the memory",)))
        return out


def _auto_fraction_fix(ctx: RuleContext, cur: Any) -> tuple[float, str] | None:
    """A start-up whose automatic --mem-fraction-static came out at or below zero because chunked prefill is
    off (``--chunked-prefill-size -1``): SGLang reserved 1.5 x --max-prefill-tokens MB of activations
    (memory_hook.py at v0.5.23). The memory it saw follows from the fraction it logged; the fix is the
    fraction the same formula gives with its default chunk, which leaves a KV pool and starts."""
    return ctx.mech.startup_fraction_fix(ctx.cfg, cur)
