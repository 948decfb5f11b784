"""Decode runs without CUDA graphs: the batch is larger than the captured maximum, or graphs are off.

What it detects:
    Decode readings with `cuda graph: False` (or `sglang:is_cuda_graph` 0) while requests run. When
    graph and eager readings both occur and every eager batch is larger than every graph batch, the
    batch exceeded the captured maximum (which lies between the largest graph batch and the smallest
    eager one, unless the config names it). When no decode ran on a graph and the config says graphs
    are disabled, they are disabled. Warning when at least `eager_share` (20 %) of busy decode
    readings ran eagerly, else info. Skipped on CPU, where graph capture is not the lever. When nothing
    in the inputs names the device or says graphs are off (`/metrics` from Prometheus), eager decode
    cannot tell disabled graphs on a GPU from a CPU server, which captures none
    (`python/sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py` at v0.5.23): info, low
    confidence, no suggestion, naming what is missing.
    Before load (start-up lines or server args only, or fewer than a window of decode readings): the
    captured maximum (a full `Capture cuda graph bs [...]` list, `Capture target decode CUDA graph
    end. bs=[...]`, the size at step 0 of the `Capturing batches (bs=N …)` progress bar,
    `--cuda-graph-max-bs` or `--cuda-graph-bs`) at or below `startup_share` (25 %) of what the server can
    run — the smaller of the effective `max_running_requests` and the requests the pool holds at
    `startup_tokens_per_request` (2,048) tokens each. Warning when even requests of the full context
    length would outnumber the captured maximum (certain), or at half that share; info otherwise.

Why it matters:
    A captured graph replays a whole decode step with one launch; eager mode pays kernel-launch and
    Python overhead every step, which is a large share of the step time at moderate batch sizes.

Evidence:
    The eager share, the largest batch that ran on a graph, the smallest that ran eagerly, the p95
    batch, and the captured maximum from the config when known.

    On each engine. On SGLang: `cuda graph: True/False` in the Decode line or `sglang:is_cuda_graph`,
    against `--cuda-graph-max-bs` or the captured sizes. Cannot judge vLLM yet: vLLM reports no per-step
    graph use; its capture sizes (`cudagraph_capture_sizes` in the engine config line) and
    `--enforce-eager` are read as configuration only.

Fix:
    Raise the captured maximum to cover the operating batch: `--cuda-graph-max-bs` (0.3.5–0.5.13) or
    `--cuda-graph-max-bs-decode` (0.5.14+) set to the next power of two at or above the p95 batch
    (each captured size costs some memory). When graphs are disabled, re-enable them (remove
    `--disable-cuda-graph`, or `--cuda-graph-backend-decode` other than `disabled` from 0.5.14).

Known false positives:
    The end of a benchmark, when the batch drains through the threshold; large batches running eagerly
    for a few readings during a burst.

References:
    - How diagnoser reads SGLang: [the `cuda graph` field of the Decode batch
      line](docs/sglang.md#decode-line), [graph capture lines](docs/sglang.md#startup-lines), [graph flags
      by version and the automatic limit](docs/sglang.md#cuda-graph-flags), [from signals to a
      bottleneck](docs/sglang.md#bottlenecks).
    - Issue [#33483](https://github.com/sgl-project/sglang/issues/33483): an automatic graph limit of 32
      next to a `max_running_requests` of 4096.
    - Real case: PR [#13023](https://github.com/sgl-project/sglang/pull/13023), decode running eagerly above
      the captured maximum.
"""

from __future__ import annotations

from typing import Any

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import (
    WINDOW_READINGS,
    Rule,
    RuleContext,
    cap_name,
    evidence,
    fmt_int,
    next_pow2,
    pool_tokens,
    slot_cap,
    suggest,
)
from diagnoser.rules.columns import pairs
from diagnoser.timeline import quantile


class CudaGraphDisabledOrExceeded(Rule):
    name = "cuda_graph_disabled_or_exceeded"
    code = "CG01"
    title = "Decode without CUDA graphs"
    severity = Severity.WARNING
    reads = ("cuda_graph",)
    defaults = {"eager_share": 0.2, "min_points": 1, "startup_share": 0.25, "startup_tokens_per_request": 2048}
    threshold_help = {
        "eager_share": "share of busy decode readings run eagerly that makes it a warning",
        "min_points": "fewest busy decode readings needed (one reading judges, at low confidence)",
        "startup_share": "captured maximum at or below this share of what the server can run is far below it (start-up path)",
        "startup_tokens_per_request": "tokens per request assumed to count the requests the pool holds (start-up path)",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        if ctx.cfg("device") == "cpu" or str(ctx.cfg("arg.device", "")).lower() == "cpu":
            return None
        pr = pairs(ctx, "cuda_graph", "running_reqs")
        # (time, graph flag, batch, position in the join): a source is formatted only for the readings cited
        pts: list[tuple[float, float, float, int]] = []
        if len(pr):  # (no graph reading: no point to join)
            busy = (pr.b > 0).nonzero()[0]
            pts = list(zip(pr.ts[busy].tolist(), pr.a[busy].tolist(), pr.b[busy].tolist(), busy.tolist(), strict=True))
        disabled_cfg = ctx.cfg("disable_cuda_graph", ctx.cfg("arg.disable_cuda_graph")) is True
        if len(pts) < t["min_points"]:
            if disabled_cfg:
                return self._disabled(ctx, None)
            return self._startup(ctx)
        eager = [p for p in pts if p[1] < 0.5]
        graph = [p for p in pts if p[1] >= 0.5]
        if not eager:
            return self._startup(ctx) if len(pts) < WINDOW_READINGS else None
        eshare = len(eager) / len(pts)
        sev = Severity.WARNING if eshare >= t["eager_share"] else Severity.INFO
        if not graph:
            if not disabled_cfg and len(eager) < 3:
                sev = Severity.INFO  # one or two eager readings cannot tell graphs off from a batch above the captured maximum
            return self._disabled(ctx, (eshare, eager), sev, pr.src)
        max_on = max(p[2] for p in graph)
        min_off = min(p[2] for p in eager)
        batches = sorted(p[2] for p in pts)
        p95 = quantile(batches, 0.95)
        cap, _ = slot_cap(ctx)
        proposed = next_pow2(p95)
        if cap:
            proposed = min(proposed, max(cap, 1))
        captured = ctx.cfg("cuda_graph_max_bs_captured") or ctx.cfg("arg.cuda_graph_max_bs") or ctx.cfg("arg.cuda_graph_max_bs_decode")
        best_off = next(p for p in eager if p[2] == min_off)
        best_on = next(p for p in graph if p[2] == max_on)
        evs = [evidence("share of busy decode readings without a graph", round(eshare, 2), t["eager_share"], ctx.window_text(), pr.src(eager[0][3])),
               evidence("largest batch on a graph", max_on, None, "", pr.src(best_on[3])),
               evidence("smallest batch run eagerly", min_off, None, "", pr.src(best_off[3])),
               evidence("running_reqs p95", round(p95, 1), None, ctx.window_text(), "")]
        if min_off > max_on:
            range_txt = f"between {max_on:.0f} and {min_off - 1:.0f}"
            summary = (f"{len(eager)} of {len(pts)} busy decode readings ran without a CUDA graph, every one with more requests "
                       f"({min_off:.0f}+) than the largest graph batch ({max_on:.0f}): the captured maximum is {captured if captured else range_txt}.")
            why = f"decode batches up to {p95:.0f} (p95) exceed the captured maximum" + ("" if captured else f" (not in the inputs; {range_txt} from the log)")
            sugg = []
            if not captured or proposed > int(captured):
                sugg.append(suggest(ctx, "cuda_graph_max_bs", captured if captured else None, proposed, why,
                                    "the operating batch replays a captured graph instead of launching kernels one by one; "
                                    "decode step time falls by the launch overhead (largest at moderate batch sizes)",
                                    ("enough free memory for the extra captured sizes (a few hundred MB at this size)",
                                     "this batch size is the normal operating point, not an end-of-run drain")))
            return self.finding(ctx, summary, evs, sugg, confidence="medium" if not captured else "high", severity=sev)
        summary = (f"{len(eager)} of {len(pts)} busy decode readings ran without a CUDA graph at batch sizes that also ran on a graph "
                   f"({min_off:.0f}–{max(p[2] for p in eager):.0f}); the cause is not the captured maximum.")
        return self.finding(ctx, summary, evs, [], confidence="low", severity=Severity.INFO)

    def _startup(self, ctx: RuleContext) -> Finding | None:
        """Before any (or much) load: the captured maximum (a full ``Capture cuda graph bs [...]`` list, a
        ``... CUDA graph end. bs=[...]`` line, or the server args) far below both the slot cap and what the
        pool holds means every batch above it will run without a graph once load arrives."""
        t = ctx.thresholds
        captured = ctx.cfg("cuda_graph_max_bs_captured") or ctx.cfg("arg.cuda_graph_max_bs") or ctx.cfg("arg.cuda_graph_max_bs_decode")
        listed = ctx.cfg("arg.cuda_graph_bs")
        if not captured and isinstance(listed, list | tuple) and listed and all(isinstance(x, int) for x in listed):
            captured = max(listed)  # --cuda-graph-bs names the sizes themselves
        if not isinstance(captured, int | float) or isinstance(captured, bool) or captured <= 0:
            return None
        cap, cap_src = slot_cap(ctx)
        pool, pool_src = pool_tokens(ctx)
        if not cap or not pool:
            return None
        per = int(t["startup_tokens_per_request"])
        fit = int(pool / per)
        reach = min(cap, fit)
        if captured > t["startup_share"] * reach:
            return None
        ctx_len = ctx.cfg("context_len")
        certain = isinstance(ctx_len, int | float) and ctx_len > 0 and captured < min(cap, pool / ctx_len)
        src = ctx.timeline.cfg_source("cuda_graph_max_bs_captured") or ctx.timeline.cfg_source("arg.cuda_graph_max_bs") or ctx.timeline.cfg_source("arg.cuda_graph_max_bs_decode")
        evs = [evidence("largest captured decode batch", int(captured), f"<= {t['startup_share']:.0%} of {reach}", "", src),
               evidence(f"{cap_name(ctx)} (effective)", cap, None, "", cap_src),
               evidence(f"requests the pool holds at {per:,} tokens each", fit, None, "", pool_src)]
        proposed = min(512, next_pow2(reach))
        summary = (f"CUDA graphs are captured only up to batch {int(captured)}, while the server admits up to {cap} requests and the pool "
                   f"holds about {fmt_int(fit)} at {per:,} tokens each: under load every decode batch above {int(captured)} runs without a graph.")
        sugg = []
        if proposed > captured:
            sugg.append(suggest(ctx, "cuda_graph_max_bs", int(captured), proposed,
                                f"the captured maximum ({int(captured)}) is far below the batches the server can run ({reach})",
                                "batches up to the new maximum replay a captured graph instead of launching kernels one by one",
                                (f"requests average about {per:,} KV tokens (prompt + output); the operating batch reaches this size",
                                 "enough free memory for the extra captured sizes (each costs some; SGLang's own auto maximum goes up to 512)")))
        notes = ["Judged from start-up lines: no decode reading shows the batch yet. This will limit decode speed under load."]
        return self.finding(ctx, summary, evs, sugg, confidence="medium" if certain else "low",
                            severity=Severity.WARNING if certain or captured <= t["startup_share"] / 2 * reach else Severity.INFO,
                            notes=notes, basis={"startup": True})

    def _disabled(self, ctx: RuleContext, eager: tuple[float, list] | None, sev: Severity = Severity.WARNING,  # type: ignore[type-arg]
                  src_of: Any = None) -> Finding:
        """``eager``: (share of busy readings run eagerly, those readings); ``src_of`` gives the source of a
        reading's position in the join (its last item)."""
        reason = ctx.cfg("cuda_graph_disabled_reason")
        src = ctx.timeline.cfg_source("disable_cuda_graph") or ctx.timeline.cfg_source("arg.disable_cuda_graph") or ctx.timeline.cfg_source("cuda_graph_disabled_reason")
        if not src and ctx.cfg("device") is None and ctx.cfg("arg.device") is None:
            # nothing says graphs are off or that this is a GPU: a CPU server runs no CUDA graph at all
            # (cuda_graph_setup.py at v0.5.23), so eager decode alone cannot tell the two apart
            summary = ("No decode reading ran on a CUDA graph" + (f" ({len(eager[1])} busy readings)" if eager else "")
                       + "; the inputs do not say whether graphs are disabled on a GPU or the server runs on a CPU, which has none.")
            evs = [evidence("share of busy decode readings without a graph", round(eager[0], 2), ctx.thresholds["eager_share"],
                            ctx.window_text(), _source(eager[1][0][3], src_of))] if eager else []
            return self.finding(ctx, summary, evs, [], confidence="low", severity=Severity.INFO,
                                notes=["Missing: the server args (server info from --url, or the startup log's server_args line) "
                                       "name the device and the graph settings."])
        evs = [evidence("disable_cuda_graph", True if ctx.cfg("disable_cuda_graph", ctx.cfg("arg.disable_cuda_graph")) else "not set", None, "", src)]
        if eager:
            evs.append(evidence("share of busy decode readings without a graph", round(eager[0], 2), ctx.thresholds["eager_share"], ctx.window_text(), _source(eager[1][0][3], src_of)))
        summary = "Decode ran without CUDA graphs" + (f" in every busy reading ({len(eager[1])})" if eager else "") + (f"; the engine logged that graphs are disabled ({reason})" if reason else "") + "."
        sugg = []
        if reason and "backend" in str(reason):
            notes = [f"Graphs are off because of the attention backend ({reason}); pick a backend that supports graphs to re-enable them."]
        else:
            notes = []
            concept = "enable_cuda_graph"
            flag = ctx.flag(concept)
            sugg.append(suggest(ctx, concept, "disabled", "enabled (remove the disabling flag)" if flag == "--disable-cuda-graph" else "a graph backend (not 'disabled')",
                                "graphs are disabled, so every decode step pays kernel-launch overhead",
                                "shorter decode steps, most at small and moderate batch sizes",
                                ("the model and backend support graph capture",)))
        return self.finding(ctx, summary, evs, sugg, confidence="high" if reason or src else "medium", severity=sev, notes=notes)


def _source(pos: Any, src_of: Any) -> str:
    """A reading's source text from its position in the join (a bare position is no source: "")."""
    if src_of is not None:
        return str(src_of(pos) or "")
    return pos if isinstance(pos, str) else ""
