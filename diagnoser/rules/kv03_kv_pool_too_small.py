"""The KV pool is too small for the requests it is meant to serve: it cannot hold one long request, or
one prefill batch. Read from start-up lines or a rejected request, before any load.

What it detects:
    (1) A request rejected because the pool cannot hold it: `Input length (N tokens) exceeds the
    maximum allowed length (M tokens)`. SGLang caps an input at `min(context_len, pool) - 6` tokens
    (`max_req_input_len`, from the TP worker), so M comes from the pool when the pool is known and M is
    about pool - 6, when the context length is known and larger, or — with neither known — when M + 6
    is not a round context length (a multiple of 1024): context lengths are round, pool sizes are not.
    (2) A pool sized at start-up (`max_total_num_tokens=`, `KV Cache is allocated. #tokens: N`,
    server info) smaller than one prefill batch (`max_prefill_tokens`, 16384 by default): warning,
    these numbers make the limit certain; or smaller than one request of the configured
    `context_len`: info (only requests that long meet it). Judged when the inputs hold less than a
    window of usage readings (with a window, `kv_saturation` judges the pool under the real load).
    A rejected request (1) is a warning.

Why it matters:
    A request longer than the pool can never be served: SGLang rejects it (or, in some versions,
    crashes on it). A pool smaller than one prefill batch caps every batch and the number of requests
    that can run at once, whatever the client sends: at 1,000 tokens per request an 8,000-token pool
    runs about 7 requests.

Evidence:
    The pool size and where it was read, the rejected request's length and the allowed length, the
    context length and the prefill budget when known.

Fix:
    Give the pool more memory or make tokens cheaper: raise `--mem-fraction-static` (the KV budget is
    the memory free after the weights minus the share kept for activations), `--kv-cache-dtype
    fp8_e4m3` (half the bytes per token), shrink what was captured before the pool was sized (prefill /
    piecewise CUDA graphs: `--piecewise-cuda-graph-max-tokens` up to 0.5.13,
    `--cuda-graph-max-bs-prefill` from 0.5.14), lift a `--max-total-tokens` cap, or spread the model
    over more GPUs (`--tp-size`: fewer weights per GPU). For a rejected request,
    `--allow-auto-truncate` serves it cut to fit. `--context-length` does not enlarge the pool.

Known false positives:
    A pool kept small on purpose (`--max-total-tokens` for a test); a context length set far above
    what the workload sends (then a pool below it limits nothing in practice, and the finding says
    which requests would not fit).

References:
    - How diagnoser reads SGLang: [the input-length limit and the pool](docs/sglang.md#oom), [start-up
      lines](docs/sglang.md#startup-lines), [how the pool is sized](docs/sglang.md#kv-budget), [bytes per
      token](docs/sglang.md#kv-bytes).
    - SGLang's source at v0.5.23: `python/sglang/srt/managers/tp_worker.py`
      (`max_req_len = min(context_len - 1, max_total_num_tokens - 1)`, `max_req_input_len = max_req_len - 5`),
      `python/sglang/srt/managers/utils.py` (the input-length check and its message),
      `python/sglang/srt/mem_cache/kv_cache_configurator.py` (the pool from the memory left after the
      weights).
    - Real cases: issue [#4048](https://github.com/sgl-project/sglang/issues/4048) (a 160k request against a
      59,868-token pool), PR [#13466](https://github.com/sgl-project/sglang/pull/13466) (an 8,050-token pool
      on an 8-GPU node).
"""

from __future__ import annotations

from typing import Any

from diagnoser.model import Evidence, Finding, Severity, Suggestion
from diagnoser.rules.base import (
    WINDOW_READINGS,
    Rule,
    RuleContext,
    evidence,
    fmt_int,
    readings_basis,
    suggest,
    tokens_per_request,
)

MARGIN = 6  # tokens SGLang keeps out of the longest input (max_req_len - 5, itself pool - 1)
DEFAULT_PREFILL_BUDGET = 16384  # --max-prefill-tokens default


def _pool(ctx: RuleContext) -> tuple[int | None, str]:
    v = ctx.cfg("max_total_tokens")
    if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
        return int(v), ctx.timeline.cfg_source("max_total_tokens")
    return None, ""


def _int(ctx: RuleContext, *names: str) -> tuple[int | None, str]:
    for n in names:
        v = ctx.cfg(n)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return int(v), ctx.timeline.cfg_source(n)
    return None, ""


class KVPoolTooSmall(Rule):
    name = "kv_pool_too_small"
    code = "KV03"
    title = "KV pool too small"
    severity = Severity.WARNING
    for_seconds = 0.0
    events = ("request_too_long",)
    defaults = {"prefill_budget": DEFAULT_PREFILL_BUDGET, "mem_step": 0.03}
    threshold_help = {
        "prefill_budget": "prefill tokens of one batch when --max-prefill-tokens is not in the inputs (SGLang's default)",
        "mem_step": "--mem-fraction-static step proposed when the memory split is not in the inputs",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        pool, pool_src = _pool(ctx)
        ctx_len, ctx_src = _int(ctx, "context_len", "arg.context_length")
        rejected = self._rejected(ctx, pool, ctx_len)
        evs: list[Evidence] = []
        parts: list[str] = []
        conf = "high"
        if rejected is not None:
            e, implied, why = rejected
            f = e.fields
            evs.append(evidence("rejected request (input tokens)", f["input_tokens"], None, "", e.source))
            evs.append(evidence("longest input allowed", f["allowed_tokens"], None, "", e.source))
            shown = pool or implied
            parts.append(f"A request of {fmt_int(f['input_tokens'])} tokens was rejected: the server accepts at most "
                         f"{fmt_int(f['allowed_tokens'])}, and that limit is the KV pool ({why}), so no request that long can run")
            if not pool:
                evs.append(evidence("KV pool implied by the limit (allowed + 6)", implied, None, "", e.source))
                conf = "medium"
            pool = shown
        elif pool and ctx.stats("token_usage")["n"] < WINDOW_READINGS:
            # from start-up lines: with a window of usage readings, kv_saturation judges the pool under the real load
            vllm = not ctx.mech.reserves_output  # vLLM: the step budget is --max-num-batched-tokens, no default assumed
            name = "max_num_batched_tokens" if vllm else "max_prefill_tokens"
            budget, b_src = _int(ctx, name, f"arg.{name}")
            budget_known = budget is not None
            budget = budget or (0 if vllm else int(ctx.thresholds["prefill_budget"]))
            flag = ctx.flag(name)
            sev = Severity.WARNING
            if budget and pool < budget:
                parts.append(f"The KV pool holds {fmt_int(pool)} tokens, less than one prefill batch "
                             f"({fmt_int(budget)}, {flag if budget_known else f'the {flag} default'})")
                if budget_known:
                    evs.append(evidence(name, budget, None, "", b_src))
            elif ctx_len and pool < ctx_len:
                # certain for a request that long, but only a workload that sends such requests meets it: info
                sev = Severity.INFO
                parts.append(f"The KV pool holds {fmt_int(pool)} tokens, less than one request of the configured context length "
                             f"({fmt_int(ctx_len)}): requests longer than about {fmt_int(pool - MARGIN)} tokens are rejected")
            else:
                return None
            if ctx_len:
                evs.append(evidence("context_len", ctx_len, None, "", ctx_src))
            tpr, how = tokens_per_request(ctx)
            if tpr:  # what the running requests hold, when a reading shows it
                parts.append(f"at the {fmt_int(tpr)} tokens a running request holds ({how}) about "
                             f"{max(1, int(0.9 * pool / tpr))} requests fit at once, whatever the client sends")
            else:
                parts.append(f"at 1,000 tokens per request (an example: no reading shows the real figure) about "
                             f"{max(1, int(0.9 * pool / 1000))} requests fit at once, whatever the client sends")
        else:
            return None
        if pool_src:
            evs.insert(0, evidence("max_total_tokens (KV pool)", pool, None, "", pool_src))
        summary = "; ".join(parts) + "."
        notes = []
        if rejected is None and ctx.stats("token_usage")["n"] == 0:
            notes.append("No load reading is in the inputs: this will limit the server under load (judged from start-up lines).")
        sugg = self._suggestions(ctx, pool, rejected is not None)
        basis: dict[str, Any] = {"events": 1, "kind": "request rejected"} if rejected is not None else {"startup": True}
        if rejected is None and ctx.stats("token_usage")["n"]:  # start-up sizing beside a few load readings
            basis = dict(readings_basis(ctx, "token_usage") or basis, uncapped=True)  # the sizing is certain either way
        return self.finding(ctx, summary, evs, sugg, confidence=conf, severity=Severity.WARNING if rejected is not None else sev,
                            notes=notes, basis=basis)

    @staticmethod
    def _rejected(ctx: RuleContext, pool: int | None, ctx_len: int | None) -> tuple[Any, int, str] | None:
        """The first request rejected by the pool's limit (not by the context length), the pool that
        limit implies and why the limit is the pool's."""
        for e in ctx.events_of("request_too_long"):
            if e.fields.get("limit") != "pool_or_context":
                continue
            allowed = int(e.fields["allowed_tokens"])
            implied = allowed + MARGIN
            if pool:
                if abs(pool - implied) <= 64 and not (ctx_len and abs(ctx_len - implied) <= 1):
                    return e, implied, f"the pool is {fmt_int(pool)} tokens"
                continue
            if ctx_len:
                if implied < ctx_len - 1:
                    return e, implied, f"the context length is {fmt_int(ctx_len)}, so the smaller limit is the pool's"
                continue
            if implied % 1024 and implied & (implied - 1):
                return e, implied, f"{fmt_int(allowed)} + 6 = {fmt_int(implied)} is not a round context length; SGLang allows min(context, pool) - 6"
        return None

    def _suggestions(self, ctx: RuleContext, pool: int, rejected: bool) -> list[Suggestion]:
        out: list[Suggestion] = []
        cap = ctx.cfg("arg.max_total_tokens")
        if isinstance(cap, int | float) and cap <= pool * 1.01:
            out.append(suggest(ctx, "max_total_tokens", int(cap), int(cap) * 4, "the pool is capped by --max-total-tokens, not by memory",
                               "about 4x the KV slots", ("the GPU has memory free for the larger pool",)))
            return out
        mfs = ctx.cfg("mem_fraction_static", ctx.cfg("arg.mem_fraction_static"))
        avail = ctx.cfg("available_gpu_mem_gb")
        if not (isinstance(avail, int | float) and avail <= 6):
            step = float(ctx.thresholds["mem_step"])
            out.append(suggest(ctx, "mem_fraction_static", mfs if isinstance(mfs, int | float) else None,
                               round(min(float(mfs) + step, 0.95), 2) if isinstance(mfs, int | float) else f"current + {step:.2f} to {step + 0.02:.2f}",
                               "the pool gets the static memory left after the weights: a larger fraction grows it",
                               "each +0.01 adds about 1 % of the GPU's memory to the pool",
                               ("keep 5–8 GB free for activations and graphs (available_gpu_mem in the summary line)",)))
        dtype = ctx.cfg("kv_cache_dtype") or ctx.cfg("arg.kv_cache_dtype")
        logged = str(ctx.cfg("kv_cache_dtype_log") or "")
        if dtype in (None, "auto", "bf16", "float16", "bfloat16", "fp16") and "fp8" not in logged and "fp4" not in logged:
            out.append(suggest(ctx, "kv_cache_dtype", dtype, "fp8_e4m3", "an 8-bit KV cache holds twice the tokens in the same memory",
                               "about 2x the pool", ("the model tolerates fp8 KV (check quality on your evals)",)))
        graph = ctx.cfg("arg.piecewise_cuda_graph_max_tokens") or ctx.cfg("arg.cuda_graph_max_bs_prefill")
        if ctx.version is None or ctx.version >= (0, 5, 6):
            out.append(suggest(ctx, "prefill_graph_max_tokens", graph, max(1024, int(graph) // 2) if isinstance(graph, int | float) else "half the current (or disable prefill graphs)",
                               "prefill (piecewise) CUDA graphs are captured before the pool is sized, and their memory comes out of it"
                               + ("" if graph else "; whether they are on is not in the inputs (they are when the start-up log shows 'Capture piecewise CUDA graph' or 'Capture target prefill CUDA graph')"),
                               "the memory those graphs hold goes back to the pool", ("prefill graphs are enabled",)))
        tp = ctx.cfg("arg.tp_size") or ctx.cfg("tp_size")
        out.append(suggest(ctx, "tp_size", tp, int(tp) * 2 if isinstance(tp, int | float) else "2 x the current (more GPUs)",
                           "each GPU then holds a smaller share of the weights, so more of its memory goes to the pool",
                           "the pool grows by the weight memory freed on each GPU", ("the GPUs are there",)))
        if rejected:
            auto = ctx.cfg("arg.allow_auto_truncate")
            if auto is not True:
                out.append(suggest(ctx, "allow_auto_truncate", auto, True, "the server then cuts an over-long input to the longest it can hold "
                                   "instead of rejecting it", "such requests are served, on the end of their input only",
                                   ("losing the start of the input is acceptable for this workload",)))
        return out
