"""Speculative decoding accepts too few draft tokens per verify step for its draft settings.

What it detects:
    The mean `accept len` (`sglang:spec_accept_length`) and `accept rate` over busy decode
    readings. Fires when the accept rate is below `min_accept_rate` (0.55), or, with no rate, the
    accept length is below `min_accept_len` (2.2 tokens per step), or the accept length is below
    `min_ratio` (50 %) of the draft length (`--speculative-num-steps` + 1) when that is known. The
    draft length is also inferred from accept len / accept rate on 0.5.4+ lines.

Why it matters:
    Each verify step costs the draft passes plus a wider target pass; the gain is the accepted tokens.
    Around 2 accepted tokens per step with a 4-token draft, most draft work is thrown away and the
    speed-up over plain decoding is small (EAGLE-3 on chat data usually accepts about 3 or more).

Evidence:
    Mean accept length and rate with the lines they come from, the draft length (configured or
    inferred), the batch size.

    On each engine. On SGLang: `accept len` in the Decode line, `sglang:spec_accept_length` and
    `spec_accept_rate`, against the draft settings. On vLLM: the `SpecDecoding metrics:` log line (V1:
    mean acceptance length and acceptance rate) or V0's `Speculative metrics:` acceptance rate.

Fix:
    First make the draft match the target (same chat template, domain, tokenizer): that is the usual
    cause. Then shorten the draft to what is accepted: `--speculative-num-steps` ≈ the accept length
    rounded up, `--speculative-eagle-topk 1` and `--speculative-num-draft-tokens` = steps + 1.

Known false positives:
    Warm-up readings; workloads unlike the draft's training data (code vs chat) accept less by nature;
    MTP heads on DeepSeek-style models accept 2.5–3 with 3 steps, which is fine (the server of
    PR #6081 stays silent).

References:
    - How diagnoser reads SGLang: [speculative metrics](docs/sglang.md#metrics-spec), [`accept len` and
      `accept rate` in the Decode batch line](docs/sglang.md#decode-line), [speculative flags and their
      automatic values](docs/sglang.md#speculative-flags).
    - Real cases: issue [#11948](https://github.com/sgl-project/sglang/issues/11948), EAGLE-3 with a low
      accept length (fires; `examples/eagle3-low-accept.dgb`), and PR
      [#6081](https://github.com/sgl-project/sglang/pull/6081), MTP accepting 2.5–3 tokens (silent).
"""

from __future__ import annotations

import math

from diagnoser.model import Finding, Severity
from diagnoser.rules.base import Rule, RuleContext, busy, evidence, suggest


class LowSpecAcceptance(Rule):
    name = "low_spec_acceptance"
    code = "SP01"
    title = "Low speculative acceptance"
    severity = Severity.WARNING
    reads = ("spec_accept_len",)
    defaults = {"min_accept_len": 2.2, "min_accept_rate": 0.55, "min_ratio": 0.5, "min_points": 1}
    threshold_help = {
        "min_accept_len": "mean accept length (tokens per verify step) below this is low when no rate is known",
        "min_accept_rate": "mean accept rate below this is low",
        "min_ratio": "accept length below this share of the draft length (steps + 1) is low",
        "min_points": "fewest non-zero accept readings needed (one reading judges, at low confidence)",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        al_s = ctx.series("spec_accept_len")
        if al_s is None:
            return None
        al = busy(al_s.values.tolist())
        if len(al) < t["min_points"]:
            return None
        mean_al = sum(al) / len(al)
        rate_s = ctx.series("spec_accept_rate")
        rates = busy(rate_s.values.tolist()) if rate_s is not None else []
        mean_rate = sum(rates) / len(rates) if rates else None
        steps = ctx.cfg("speculative_num_steps", ctx.cfg("arg.speculative_num_steps"))
        draft_len = (int(steps) + 1) if isinstance(steps, int | float) and steps else None
        inferred = False
        if draft_len is None and mean_rate:
            draft_len = round(mean_al / mean_rate)
            inferred = True
        low_rate = mean_rate is not None and mean_rate < t["min_accept_rate"]
        low_len = mean_rate is None and mean_al < t["min_accept_len"]
        low_ratio = draft_len is not None and not inferred and mean_al < t["min_ratio"] * draft_len
        if not (low_rate or low_len or low_ratio):
            return None
        src = al_s.sources[al_s.argmin()]
        evs = [evidence("spec_accept_len (mean)", round(mean_al, 2), t["min_accept_len"] if mean_rate is None else None, ctx.window_text(), src)]
        if mean_rate is not None and rate_s is not None:
            evs.append(evidence("spec_accept_rate (mean)", round(mean_rate, 2), t["min_accept_rate"], ctx.window_text(), rate_s.sources[rate_s.argmin()]))
        if draft_len:
            evs.append(evidence("draft length (steps + 1)" + (" inferred from accept len / rate" if inferred else ""), draft_len, None, "",
                                "" if inferred else ctx.timeline.cfg_source("speculative_num_steps")))
        algo = ctx.cfg("speculative_algorithm", ctx.cfg("arg.speculative_algorithm"))
        summary = (f"Speculative decoding{f' ({algo})' if algo else ''} accepted {mean_al:.2f} tokens per verify step on average"
                   + (f" (accept rate {mean_rate:.2f})" if mean_rate is not None else "")
                   + (f" with a draft of {draft_len} tokens{' (inferred)' if inferred else ''}" if draft_len else "") + ".")
        new_steps = max(1, math.ceil(mean_al))
        cur_steps = int(steps) if isinstance(steps, int | float) else (draft_len - 1 if inferred and draft_len else None)
        topk = ctx.cfg("speculative_eagle_topk", ctx.cfg("arg.speculative_eagle_topk"))
        ndt = ctx.cfg("speculative_num_draft_tokens", ctx.cfg("arg.speculative_num_draft_tokens"))
        cur_ndt = ndt if ndt is not None else (draft_len if inferred else None)
        note = " (inferred from accept len / accept rate)" if inferred else ("" if steps is not None else "; the current value is not in the inputs")
        assume = ("the draft model matches the target's chat template and data (check that first)",)
        sugg = [
            suggest(ctx, "speculative_num_steps", cur_steps, new_steps, f"only {mean_al:.2f} tokens are accepted per step, so draft steps beyond {new_steps} are mostly wasted{note}",
                    "less draft compute per verify step at about the same accepted tokens; a modest speed-up", assume),
            suggest(ctx, "speculative_eagle_topk", topk, 1, "a wider draft tree costs verify width without raising acceptance this low"
                    + ("" if topk is not None else "; the current value is not in the inputs"), "a narrower verify pass", assume),
            suggest(ctx, "speculative_num_draft_tokens", cur_ndt, new_steps + 1, "with topk 1 the draft tokens are steps + 1" + ("" if ndt is not None else (" (current inferred)" if inferred else "; the current value is not in the inputs")),
                    "matches the shorter draft", assume),
        ]
        if cur_steps is not None and cur_steps <= new_steps:
            sugg = sugg[1:2]
        return self.finding(ctx, summary, evs, sugg, confidence="medium" if len(al) >= 3 else "low",
                            notes=["Low acceptance usually means the draft does not match the target or the data; retune the draft before the flags."])
