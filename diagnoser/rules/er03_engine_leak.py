"""SGLang's own leak check fired: KV slots or request slots were not given back when requests ended.

What it detects:
    The scheduler's idle self-check lines `KV cache pool leak detected!` (older releases),
    `token_to_kv_pool_allocator memory leak detected!` and `req_to_token_pool memory leak
    detected!`: when nothing runs, every token slot and request slot must be free or evictable, and
    SGLang says so when some are not. Each line is SGLang's own statement; one is enough. Warning.

Why it matters:
    Leaked slots are lost until a restart: the pool (or the request-slot pool) shrinks with every leak,
    so fewer requests fit over time, queues grow and, on a PD decode server, bootstraps time out when
    no slot is left to reserve. Flags do not bring them back.

Evidence:
    The leak lines (with the pool state they print) and how many there were.

    On each engine. On SGLang: its own leak check's message (KV or request slots not freed). Cannot judge
    vLLM: vLLM has no such self-check, so there is nothing to read.

Fix:
    Restart the server to get the slots back, then upgrade SGLang (leaks are engine bugs, often in
    retraction, abort, PD or speculative paths): report the line with the server arguments and the
    workload (aborts, PD, speculative decoding) that leads to it.

Known false positives:
    None known: the check runs only when the scheduler is idle and prints only on a mismatch. (Some
    debug builds run it more often.)

References:
    - How diagnoser reads SGLang: [the leak-check lines](docs/sglang.md#oom).
    - SGLang's source at v0.5.23: `python/sglang/srt/managers/scheduler_components/invariant_checker.py`
      (the idle check and its `… memory leak detected!` lines).
    - Issue [#9266](https://github.com/sgl-project/sglang/issues/9266): `req_to_token_pool` entries leaking
      on the PD decode path. No public log quotes the leak line yet: tested on a constructed log in SGLang's
      format.
"""

from __future__ import annotations

from diagnoser.model import Evidence, Finding, Severity
from diagnoser.rules.base import Rule, RuleContext


class EngineLeak(Rule):
    name = "engine_leak"
    code = "ER03"
    title = "Slots leak"
    severity = Severity.WARNING
    for_seconds = 0.0
    events = ("kv_leak",)

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        leaks = ctx.events_of("kv_leak")
        if not leaks:
            return None
        kinds: dict[str, int] = {}
        for e in leaks:
            text = str(e.fields.get("text", ""))
            what = "request slots (req_to_token_pool)" if "req_to_token" in text else "KV token slots"
            kinds[what] = kinds.get(what, 0) + 1
        evs = [Evidence("leak check", str(leaks[0].fields.get("text", ""))[:160], None, "", leaks[0].source)]
        if len(leaks) > 1:
            evs.append(Evidence("leak lines", len(leaks), None, "", leaks[-1].source))
        summary = ("SGLang's idle self-check found slots that were not given back: "
                   + ", ".join(f"{what} ({n} line{'s' if n > 1 else ''})" for what, n in kinds.items())
                   + ". Leaked slots stay lost until a restart, so fewer requests fit over time.")
        return self.finding(ctx, summary, evs, [], confidence="high", severity=Severity.WARNING,
                            notes=["Restart to get the slots back, then upgrade SGLang; report the line with the server arguments "
                                   "and the workload (aborts, PD, speculative decoding) that leads to it."],
                            basis={"events": len(leaks), "kind": "leak check"})
