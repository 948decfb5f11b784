"""What held the next waiting request back, per reading: one admission model every admission rule reads.

SGLang admits from the waiting queue in ``Scheduler.get_new_batch_prefill`` with a ``PrefillAdder``
(``python/sglang/srt/managers/scheduler.py`` and ``managers/schedule_policy.py`` at v0.5.23). For each
waiting request, in this order, it stops when:

* the pass's prefill budget is spent (``adder.budget_state() == OTHER``: ``--max-prefill-tokens``, or the
  chunk of ``--chunked-prefill-size``) -- **budget**;
* the running batch holds the effective ``max_running_requests`` (``get_num_allocatable_reqs``, which
  also counts the request-slot and Mamba state pools) -- **slots**, or **state** when the Mamba/SWA
  state pool is what is full;
* ``add_one_req`` finds that the request's uncached prompt + min(max_new_tokens, 4096) + a page is more
  than free + evictable KV minus what every running request still reserves (its remaining
  min(max_new_tokens - generated, 4096) x ``new_token_ratio``; ``NO_TOKEN``) -- **kv**;
* on a PD decode server, the request waits in the prealloc or transfer queue -- **transfer**.

Otherwise the request is admitted at the next prefill: a reading with a queue and none of those is
**none** (requests that just arrived, or prefill compute itself), and a reading without a queue is
**idle** (the client sends too little to wait).

A reading is a Decode batch line or a scrape where both the running count and the queue were read (a
Prefill line's ``#running-req`` is the batch beside that prefill, not the running batch: it is
``prefill_running_reqs``); a scrape's running gauge is the last batch report, so a scrape whose
interval decoded well more tokens per decode pass (``realtime_tokens_total{mode="decode"}`` /
``cuda_graph_passes_total{mode=decode_*}``, 0.5.7+) than the gauge says is such a report too. The KV
test uses the scheduler's own arithmetic when the inputs give the sizes: pool, usage, running, the mean prompt and output of the finished requests and the ratio
(``new_token_ratio`` when read, else its start min(0.7 x ``--schedule-conservativeness``, 1)). Without
finished requests the sizes are estimated from the readings: a running count held at one value below
the cap while requests keep waiting and no prefill budget binds is the reservation (inferred), and so it
is when the sizes are only estimated (the estimate takes each request halfway through its output and
reserving at ``new_token_ratio``; a cohort admitted together is early in it, and an ``ignore_eos`` request
reserves its whole remaining output). The fixed thresholds (usage >= 0.95, or >= 0.9 beyond 2,000
waiting) are the fallback for inputs without the numbers, never the first test.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from diagnoser.capacity.pool import pool_count
from diagnoser.capacity.serverstate import args_known, server_state
from diagnoser.mechanism import KVInputs
from diagnoser.rules.base import evidence, next_pow2, pool_tokens, slot_cap, tokens_per_request
from diagnoser.rules.columns import aligned, argmax_source, pairs, raw_arrays
from diagnoser.timeline.derived import window_rate

if TYPE_CHECKING:
    from diagnoser.rules.base import RuleContext

CLASSES = ("slots", "kv", "budget", "state", "transfer", "none", "idle")  # (and "report": not a running reading)
USAGE_FULL, USAGE_DEEP, DEEP_QUEUE = 0.95, 0.9, 2000  # the fallback thresholds


class _Read:
    """A number of the admission model read from its pass when first asked for (:meth:`Admission._read`):
    a window where nothing waited needs none of them. It can be set, as a field."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, a: Admission | None, owner: type | None = None) -> Any:
        return self if a is None else a._read(self.name)

    def __set__(self, a: Admission, value: Any) -> None:
        a.known[self.name] = value


@dataclass
class Admission:
    """The per-reading classification and the numbers it used; ``label`` is aligned with ``running``."""

    ts: Any
    running: Any
    queue: Any
    usage: Any
    label: Any
    sources: Any
    cap: int | None = None
    cap_src: str = ""
    cap_inferred: bool = False
    pool: int | None = None
    pool_src: str = ""
    kv_how: str = ""  # "arithmetic" | "inferred" | "usage"
    open: Any = None  # readings with a queue that no earlier limit (transfer, state, slots, budget) held
    kv_arith: Any = None  # readings where the reservation arithmetic (or the inference) says the next request does not fit
    core: str | None = None  # the engine core that admits (vLLM "V0" / "V1"; ctx.mech.engine_core)
    refusal: Any = None  # per reading: the engine's KV refusal ("kv_full" / "kv_watermark" / ""), None without such a test
    notes: list[str] = field(default_factory=list)
    # where the numbers below are read: the pass's context (a weak reference: the context holds this model
    # in its memo), else a context over the same timeline (the pass is over; its memo only caches)
    pass_ctx: Any = field(default=None, repr=False, compare=False)
    inputs: Any = field(default=None, repr=False, compare=False)  # RuleContext's arguments but the memo
    known: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # read when first asked for (_read)
    budget = _Read()  # tokens of one prefill batch's budget (prefill_budget), its name and source
    budget_name = _Read()
    budget_src = _Read()
    prompt = _Read()  # mean prompt (uncached share) of the finished requests
    output = _Read()  # mean output of the finished requests
    estimated = _Read()  # the sizes are estimated from the readings: no request finished (_estimated_sizes)
    ratio = _Read()  # the output-reservation ratio (_ratio)

    def _read(self, name: str) -> Any:
        got = self.known
        if name not in got:
            ctx = self.pass_ctx() if self.pass_ctx is not None else None
            if ctx is None:
                if self.inputs is None:
                    raise AttributeError(name)
                from diagnoser.rules.base import RuleContext

                ctx = RuleContext(*self.inputs, {})  # type: ignore[misc]
            if name in ("budget", "budget_name", "budget_src"):
                read = dict(zip(("budget", "budget_name", "budget_src"), prefill_budget(ctx), strict=True))
            elif name in ("prompt", "output", "estimated"):
                prompt, output = finished_sizes(ctx)
                read = {"prompt": prompt, "output": output, "estimated": bool(ctx.memo.get("sizes_estimated"))}
            elif name == "ratio":
                read = {"ratio": _ratio(ctx)}
            else:
                raise AttributeError(name)
            for k, v in read.items():
                got.setdefault(k, v)  # (a number set on the model stands)
        return got[name]

    @property
    def n_wait(self) -> int:
        """Readings with a queue (a batch report beside a prefill is no reading): counted once, as the
        labels are final when the model is built (several rules ask)."""
        hit = self.known.get("n_wait")
        if hit is None:
            wait = self.queue > 0
            hit = self.known["n_wait"] = int(np.count_nonzero(wait & (self.label != "report"))) if np.count_nonzero(wait) else 0
        return hit  # type: ignore[no-any-return]

    def share(self, cls: str) -> float:
        n = self.n_wait
        return float(np.count_nonzero(self.label == cls)) / n if n and cls != "idle" else 0.0

    def top(self) -> tuple[str, float]:
        """The class that held most readings with a queue, and its share ("" when none waited)."""
        if not self.n_wait:
            return "", 0.0
        best = max(CLASSES[:-1], key=self.share)
        return best, self.share(best)

    def first(self, cls: str) -> str:
        k = (self.label == cls).nonzero()[0]
        return str(self.sources[int(k[0])]) if len(k) else ""

    def full_length(self) -> float | None:
        return None if self.prompt is None or self.output is None else self.prompt + self.output

    def demand(self, pct: float | None = None) -> float:
        """Requests in flight (running + waiting) while busy, over the readings with work (idle stretches
        left out): median running + median waiting, or with ``pct`` that percentile of their sum. A
        closed-loop client keeps its concurrency in flight, but a reading taken between a request's end
        and the next one's arrival shows fewer, so the median under-counts the clients: a slot cap sized on
        it (15 for 16 clients on the real vLLM engine) left the cap binding. Slot proposals use the 90th
        percentile, which still ignores a brief spike; so do pool sizes (proposals.bounded_pool)."""
        busy = ((self.running > 0) | (self.queue > 0)) & (self.label != "report")
        if not np.any(busy):
            return 0.0
        if pct is None:
            return float(np.median(self.running[busy]) + np.median(self.queue[busy]))
        return float(np.percentile(self.running[busy] + self.queue[busy], pct))


def admission(ctx: RuleContext) -> Admission:
    """The model for this pass (memoised)."""
    hit = ctx.memo.get("admission")
    if hit is None:
        hit = ctx.memo["admission"] = _build(ctx)
    return hit  # type: ignore[no-any-return]


def _build(ctx: RuleContext) -> Admission:
    p = pairs(ctx, "running_reqs", "queue_reqs")
    run, q = np.asarray(p.a, dtype=float), np.asarray(p.b, dtype=float)
    u = _along(ctx, p, "token_usage")
    a = Admission(ts=p.ts, running=run, queue=q, usage=u, label=np.full(len(p), "idle", dtype=object),
                  sources=_Lazy(p),  # formatted when a finding cites one
                  pass_ctx=weakref.ref(ctx), inputs=(ctx.timeline, {}, ctx.adapter, ctx.version, ctx.extras))
    a.cap, a.cap_src = slot_cap(ctx)
    a.pool, a.pool_src = pool_tokens(ctx)
    # (the prefill budget, the request sizes and the reservation ratio are read when first asked for, _Read)
    wait = q > 0
    a.open, a.kv_arith = wait.copy(), np.zeros(len(p), dtype=bool)
    if not len(p):
        return a
    if not np.count_nonzero(wait):  # no reading with a queue: every test below labels waiting readings, so all stay idle
        a.core, a.refusal = _refusal(ctx, a)
        return a
    lab = a.label
    lab[wait] = "none"
    # (a signal the inputs lack reads NaN at every reading, which no test below passes: its test is skipped)
    series = ctx.series
    # a scrape's num_running_reqs holds the last batch report, and after a prefill report that is the batch
    # beside the prefill (metrics_reporter.py at v0.5.23, as a Prefill line's #running-req): a reading with
    # requests waiting and KV in use but nothing, or far fewer than the tokens held, running is such a report
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.add.reduce(u)
        u0 = u if total - total == 0 else np.nan_to_num(u)  # (every usage finite: nan_to_num would copy it as it is)
        snap = wait & (u0 > 0) & (run == 0)
        full = (a.prompt or 0) + (a.output or 0)
        if a.pool and full > 0:
            # (run has no NaN: pairs() joined the readings where both counts were read, so its max is nanmax's)
            snap |= wait & (u0 * a.pool / np.maximum(run, 1) > 3 * full) & (run < np.maximum.reduce(run))
        # the gauge is set at each batch report only (every --decode-log-interval steps), the decode counters
        # at every step: an interval whose mean decode batch (tokens decoded / decode passes, 0.5.7+) is well
        # above the gauge read the report beside a prefill, not the running batch
        if series("decode_passes") is not None:
            passes = _along(ctx, p, "decode_passes")
            batch = np.where(passes > 0, _along(ctx, p, "decode_tokens") / np.where(passes > 0, passes, 1.0), np.nan)
            snap |= wait & (batch > np.maximum(1.5 * run, run + 2))
    lab[snap] = "report"
    wait = wait & ~snap
    # in the scheduler's order: a PD decode server's prealloc/transfer queues, the state pool, the slots
    # (batch_is_full), the pass's prefill budget (budget_state), then the KV test of add_one_req
    for sig in ("pd_prealloc_reqs", "pd_transfer_reqs"):
        if series(sig) is not None:
            lab[wait & (np.nan_to_num(_along(ctx, p, sig)) > 0)] = "transfer"
    if series("mamba_usage") is not None:
        lab[wait & (lab == "none") & (np.nan_to_num(_along(ctx, p, "mamba_usage")) >= USAGE_FULL)] = "state"
    if a.cap:
        lab[wait & (lab == "none") & (run >= a.cap)] = "slots"
    if a.budget and ctx.mech.reserves_output:
        lab[wait & (lab == "none") & _budget_spent(ctx, a)] = "budget"
    elif a.budget and a.prompt is not None:
        # vLLM (v1/core/sched/scheduler.py): the running requests take their tokens first, one per decoder and
        # a chunk of the remaining budget per prompt still prefilling; a waiting request is admitted only with
        # budget left. With the mean prompt longer than what the decoders leave, a prompt mid-prefill takes
        # every token left in the step, so the step budget is what holds the queue
        lab[wait & (lab == "none") & (a.prompt > a.budget - run)] = "budget"
    a.open = wait & (lab == "none")
    a.kv_arith = np.zeros(len(p), dtype=bool)
    a.core, a.refusal = _refusal(ctx, a)
    arith = _reservation_full(ctx, a, _ratio_at(ctx, a))
    if arith is not None:
        a.kv_arith |= a.open & arith
    with np.errstate(invalid="ignore"):
        by_usage = (u >= USAGE_FULL) | ((u >= USAGE_DEEP) & (q > DEEP_QUEUE))  # (a comparison with NaN is False)
    if arith is not None and np.any(wait & (lab == "none") & arith):
        a.kv_how = "arithmetic"
        lab[wait & (lab == "none") & arith] = "kv"
    if a.refusal is not None:  # the engine's own KV refusal (vLLM: the next request's blocks against free less the watermark)
        ref = wait & (lab == "none") & (a.refusal != "")
        if np.any(ref):
            a.kv_how = a.kv_how or "refusal"
            lab[ref] = "kv"
            a.kv_arith |= a.open & ref
    if np.any(wait & (lab == "none") & by_usage):
        a.kv_how = a.kv_how or "usage"
        lab[wait & (lab == "none") & by_usage] = "kv"
    # sizes unknown: a running count held at one value while requests keep waiting is a limit; below a known
    # cap (and no budget binding) it is the reservation; with no cap in the inputs it is an implied cap
    held = _held(a) if not a.cap else _held(a, 0.8)
    if held is not None:
        at = wait & (lab == "none") & (run == held)
        # (estimated sizes, no request finished yet, do not overrule it: they assume each running request
        # halfway through its output and reserving at new_token_ratio, where a cohort admitted together is
        # early in it, and ignore_eos requests reserve their whole remaining output, at ratio 1.0)
        if (a.cap and held < a.cap and (arith is None or a.estimated) and not _usage_high(a)
                and ctx.mech.reserves_output):
            a.kv_how = a.kv_how or "inferred"
            lab[at] = "kv"
            a.kv_arith |= at
        elif not a.cap and not _usage_high(a):
            a.cap, a.cap_inferred, a.cap_src = int(held), True, a.sources[int(at.nonzero()[0][0])]
            lab[at] = "slots"
            a.open &= ~at
    return a


class _Lazy:
    """A join's reading sources, each formatted when a finding cites it (most are never read)."""

    def __init__(self, p: Any) -> None:
        self.p = p

    def __getitem__(self, k: int) -> str:
        return str(self.p.src(k))


def _along(ctx: RuleContext, p: Any, signal: str) -> Any:
    """``signal`` at the joined readings (NaN where it was not read at that moment)."""
    if ctx.series(signal) is None:
        return np.full(len(p), np.nan)
    col = aligned(ctx, "running_reqs", signal)
    return np.asarray(col if p.idx is None else col[p.idx], dtype=float)


def _usage_high(a: Admission) -> bool:
    u = a.usage[(a.queue > 0) & (a.label != "report")]
    u = u[~np.isnan(u)]
    return bool(len(u)) and float(np.percentile(u, 95)) >= USAGE_DEEP


def _held(a: Admission, share: float = 0.5) -> float | None:
    """The running count most readings with a queue show, never exceeded, in at least half of them and in
    at least 3 readings (a scrape between a completion and the next admission reads one less); ``share``
    is the least share of the readings with a queue it must hold in."""
    run = a.running[(a.queue > 0) & (a.label == "none")]
    allq = a.running[(a.queue > 0) & (a.label != "report")]
    if len(run) < 3:
        return None
    vals, counts = np.unique(run, return_counts=True)
    k = int(np.argmax(counts))
    v = float(vals[k])
    if v < 1 or counts[k] < share * len(allq) or float(allq.max()) > v or (len(allq) < 6 and counts[k] < len(allq)):
        return None
    return v


def _ratio_at(ctx: RuleContext, a: Admission) -> Any:
    """new_token_ratio at each reading: the latest reading of it at or before (the first one before any),
    else the window's value (:func:`_ratio`)."""
    s = ctx.series("new_token_ratio")
    if s is None or not len(s) or not len(a.ts):
        return a.ratio
    ts, vs = raw_arrays(ctx, "new_token_ratio")
    ok = ~np.isnan(vs)
    ts, vs = ts[ok], vs[ok]
    if not len(ts):
        return a.ratio
    order = np.argsort(ts, kind="stable")
    k = np.searchsorted(ts[order], a.ts, side="right") - 1
    return vs[order][np.maximum(k, 0)]


def _ratio(ctx: RuleContext) -> float | None:
    """The engine's output-reservation ratio (SGLang's new_token_ratio as read, else its start from
    --schedule-conservativeness; None on an engine that reserves nothing, such as vLLM)."""
    r = ctx.stats("new_token_ratio")
    c = ctx.cfg("schedule_conservativeness", ctx.cfg("arg.schedule_conservativeness"))
    read = float(r["p50"]) if r["n"] else None
    mech = ctx.mech
    if read is None and not mech.reserves_output:
        return None
    return mech.admission_ratio(c, read, args_known(ctx.cfg) if mech.reserves_output else False)


def _reservation_full(ctx: RuleContext, a: Admission, ratio: Any) -> Any:
    """Per reading, whether the next waiting request does not fit by the engine's admission arithmetic
    (``ctx.mech.kv_blocked``: SGLang's reservation test, vLLM's free-block test); None without the sizes."""
    if a.prompt is None or (ctx.mech.reserves_output and (a.output is None or a.ratio is None)):
        return None
    bs = ctx.cfg("block_size")
    return ctx.mech.kv_blocked(KVInputs(pool=float(a.pool or 0), usage=a.usage, running=a.running, prompt=a.prompt, output=a.output,
                                        ratio=ratio, block_size=int(bs) if isinstance(bs, int | float) and bs > 0 else None))


def _refusal(ctx: RuleContext, a: Admission) -> tuple[str | None, Any]:
    """(the engine core, per reading its KV refusal by ``ctx.mech.kv_refusal``: the pool cannot take one more
    request of the running ones' mean size beside what admission keeps free; None on an engine without it)."""
    core = ctx.mech.engine_core(ctx.cfg, ctx.version)
    if not ctx.mech.has_kv_refusal:
        return core, None  # (its kv_refusal answers None: no inputs to read for it)
    bs, wm = ctx.cfg("block_size"), ctx.cfg("kv_watermark")
    # per pool: the running series sums the DP ranks, the usage is their mean, and each rank admits into its own pool
    got = ctx.mech.kv_refusal(KVInputs(pool=float(a.pool or 0), usage=a.usage, running=a.running / dp_ranks(ctx), prompt=a.prompt, output=a.output,
                                       block_size=int(bs) if isinstance(bs, int | float) and not isinstance(bs, bool) and bs > 0 else None,
                                       core=core, watermark=float(wm) if isinstance(wm, int | float) and not isinstance(wm, bool) else None))
    if got is not None:
        got = np.where(a.label == "report", "", got)
    return core, got


def _budget_spent(ctx: RuleContext, a: Admission) -> Any:
    """Per reading: the last prefill batch at or before it computed the whole budget."""
    pts, _ = raw_arrays(ctx, "prefill_new_tokens")
    pv = per_pass(ctx)
    if not len(pts) or len(pv) != len(pts) or not a.budget:
        return np.zeros(len(a.ts), dtype=bool)
    order = np.argsort(pts, kind="stable")
    k = np.searchsorted(pts[order], a.ts, side="right") - 1
    with np.errstate(invalid="ignore"):
        at = pv[order] >= 0.98 * a.budget
    return (k >= 0) & at[np.maximum(k, 0)]


# -- the sizes ---------------------------------------------------------------------------------------
def finished_sizes(ctx: RuleContext) -> tuple[float | None, float | None]:
    """(mean uncached prompt, mean output) of the requests that finished in the window, from the token and
    request counters (a cached prefix sits in the pool once, shared); (None, None) when none finished."""
    tl = ctx.timeline
    rate = window_rate(tl, "request_rate").value
    out_tps, in_tps = window_rate(tl, "output_tps", decoded=False).value, window_rate(tl, "prompt_tps").value
    if not rate or out_tps is None or in_tps is None:
        return _estimated_sizes(ctx)
    hit = ctx.stats("cache_hit_rate")["mean"]
    shared = min(max(float(hit), 0.0), 1.0) if hit is not None else 0.0
    return in_tps * (1.0 - shared) / rate, out_tps / rate


def _estimated_sizes(ctx: RuleContext) -> tuple[float | None, float | None]:
    """No request finished: the prompt from the Prefill lines (uncached tokens per admitted request, when no
    batch computed a whole chunk), the output from the tokens a running request holds at the decode
    readings (on average halfway through its output: output = 2 x (held - prompt))."""
    new, seqs = ctx.series("prefill_new_tokens"), ctx.series("prefill_new_seqs")
    tpr, _ = tokens_per_request(ctx)
    budget = prefill_budget(ctx)[0]
    if new is None or seqs is None or not tpr or not len(new):
        return None, None
    if budget and float(np.nanmax(new.values)) >= 0.98 * budget:
        return None, None  # a prompt longer than the chunk is admitted once per chunk: the lines do not tell its length
    n = float(np.nansum(seqs.values))
    prompt = float(np.nansum(new.values)) / n if n > 0 else 0.0
    if not 0 < prompt < tpr:
        return None, None
    ctx.memo["sizes_estimated"] = True
    return prompt, 2.0 * (tpr - prompt)


def fit_at_full_length(ctx: RuleContext) -> tuple[float | None, float | None]:
    """(mean tokens per request at full length, requests the pool holds at that length, all DP ranks)."""
    a = admission(ctx)
    foot = a.full_length()
    if not foot or foot <= 0 or not a.pool:
        return None, None
    return foot, a.pool * dp_ranks(ctx) / foot


def full_length(ctx: RuleContext) -> float | None:
    """Tokens a request holds at its full length: the finished requests' prompt + output, else from the
    decode lines' held tokens per running request (halfway through its output on average: 2 x held -
    prompt), else the held tokens."""
    foot, _ = fit_at_full_length(ctx)
    if foot:
        return foot
    tpr, _ = tokens_per_request(ctx)
    if not tpr:
        return None
    prompt = server_state_of(ctx).prompt_tokens
    return 2 * tpr - prompt if prompt and 0 < prompt < tpr else tpr


def dp_ranks(ctx: RuleContext) -> int:
    """Independent pools of ``max_total_tokens`` (one per DP rank under DP), memoised."""
    if "pools" not in ctx.memo:
        ctx.memo["pools"] = pool_count(ctx.timeline)
    return ctx.memo["pools"]  # type: ignore[no-any-return]


def server_state_of(ctx: RuleContext) -> Any:
    """SGLang's scheduler/memory model of this target (capacity/serverstate.py), memoised."""
    if "server_state" not in ctx.memo:
        ctx.memo["server_state"] = server_state(ctx.timeline, ctx.extras)
    return ctx.memo["server_state"]


# -- the prefill budget ------------------------------------------------------------------------------
def per_pass(ctx: RuleContext) -> np.ndarray:
    """Tokens of one prefill batch per ``prefill_new_tokens`` point (timeline/derived.py), memoised."""
    if "prefill_per_pass" not in ctx.memo:
        from diagnoser.timeline.derived import prefill_per_pass

        got = prefill_per_pass(ctx.timeline)
        ctx.memo["prefill_per_pass"] = got if got is not None else np.zeros(0)
    return ctx.memo["prefill_per_pass"]  # type: ignore[no-any-return]


def prefill_budget(ctx: RuleContext) -> tuple[int | None, str, str]:
    """(tokens, name, source) of one prefill batch's budget: the smaller of --chunked-prefill-size and
    --max-prefill-tokens when set (a chunk <= 0 turns chunking off); else the largest power of two (>= 64)
    in half the batches (smaller ones are chunk tails), or that a scrape interval's mean per batch sits
    within 2 % below; else a batch size repeating exactly in half the batches while one more request of
    that size would have passed the power of two above it ("budget")."""
    hit = ctx.memo.get("prefill_budget")
    if hit is None:
        hit = ctx.memo["prefill_budget"] = _prefill_budget(ctx)
    return hit  # type: ignore[no-any-return]


def _prefill_budget(ctx: RuleContext) -> tuple[int | None, str, str]:
    if not ctx.mech.reserves_output:  # vLLM: one step's token budget, decode and prefill tokens together
        v = ctx.cfg("max_num_batched_tokens")
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return int(v), "max_num_batched_tokens", ctx.timeline.cfg_source("max_num_batched_tokens")
        return None, "", ""
    known = []
    for name in ("chunked_prefill_size", "max_prefill_tokens"):
        v = ctx.cfg(name, ctx.cfg(f"arg.{name}"))
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            known.append((int(v), name, ctx.timeline.cfg_source(name) or ctx.timeline.cfg_source(f"arg.{name}")))
    if known:
        return min(known)
    per = per_pass(ctx)
    per = per[~np.isnan(per)] if len(per) else per
    if not len(per):
        return None, "", ""
    half = 0.5 * len(per)
    uniq, counts = np.unique(per.astype(int), return_counts=True)
    common = [(int(u), int(c)) for u, c in zip(uniq.tolist(), counts.tolist(), strict=True) if c >= half]
    pow2 = [u for u, _c in common if u >= 64 and u & (u - 1) == 0]
    if pow2:
        return max(pow2), "inferred", "the most common prefill batch size"
    p2 = np.exp2(np.ceil(np.log2(np.maximum(per, 1.0))))
    near = per >= 0.98 * p2
    if near.any():
        u2, c2 = np.unique(p2[near].astype(int), return_counts=True)
        k = int(np.argmax(c2))
        if int(c2[k]) >= half and int(u2[k]) >= 64:
            return int(u2[k]), "inferred", "the most common prefill batch size"
    seqs = aligned(ctx, "prefill_new_tokens", "prefill_new_seqs")
    vals = raw_arrays(ctx, "prefill_new_tokens")[1]
    for u, c in sorted(common, key=lambda uc: -uc[1]):
        if c < 2 or u < 64 or not len(seqs):
            continue
        sel = seqs[vals == u]
        sel = sel[~np.isnan(sel)]
        n = float(np.median(sel)) if len(sel) else 0.0
        budget = next_pow2(u + 1)
        if n >= 2 and u + u / n > budget:
            return budget, "budget", f"{u:,} tokens in {c} batches of about {n:.0f} requests: one more would pass {budget:,}"
    return None, "", ""


def kv_reason(ctx: RuleContext, a: Admission, wshare: float, n_wait: int, evs: list[Any]) -> str:
    """kv_saturation's sentence for readings the reservation arithmetic (or the inference) calls full, with
    its evidence appended to ``evs``."""
    foot, fit = fit_at_full_length(ctx)
    if foot and fit:
        evs.append(evidence("tokens per request at full length (mean prompt + output)", round(foot), None, ctx.window_text(),
                            "prompt and generation token counters / finished requests" if not a.estimated
                            else "Prefill lines' tokens per request and Decode lines' tokens per running request (estimated)"))
        evs.append(evidence("requests the pool holds at full length", round(fit, 1), None, "", a.pool_src))
        return (f"at {foot:,.0f} tokens per request (mean prompt + output) the pool holds about {fit:.1f} requests at full length, and in "
                f"{wshare:.0%} of the {n_wait} readings with a queue the next request did not fit beside what the running ones still reserve "
                f"(remaining output x new_token_ratio {a.ratio:.2f}, or x 1.0 for an ignore_eos request, docs/sglang.md#batching-flags), "
                "although usage reads lower")
    return (f"the running batch held at one count below the slot cap in {wshare:.0%} of the {n_wait} readings with a queue, with no prefill "
            "budget binding: admission reserves room for the running requests' remaining output (new_token_ratio), so no more fit "
            "although usage reads lower (inferred: the request sizes are not in the inputs)")


# -- the engine's KV refusal (vLLM) ------------------------------------------------------------------
@dataclass
class FullPool:
    """Where the engine's own KV test (``ctx.mech.kv_refusal``) says the pool takes no further request of the
    running requests' mean size, and whether that is kv_saturation's finding."""

    full: Any  # per reading (bool): refused
    n_full: int
    n_high: int  # busy readings at usage >= the test's floor
    n_busy: int
    kinds: dict[str, int]
    admits_full: bool  # the core admits into a full pool and preempts (no queue needed)
    now_full: bool  # the latest busy reading is refused
    n_queued: int  # readings with a queue (and a usage reading)
    n_over: int  # of those, the requests in flight exceed what the pool holds at the running ones' size
    fit: float | None  # requests one pool (one DP rank) holds at the running ones' size, the median over the refused readings
    fit_src: str
    holds: bool
    floor: float

    def sentence(self, ctx: RuleContext, evs: list[Any], why_no_queue: bool = True) -> str:
        """The finding's words for the refusal, with its evidence appended to ``evs`` (``why_no_queue``: say
        why a core that admits into a full pool shows no queue; not needed when the queue showed it)."""
        k = int(self.full.nonzero()[0][0]) if self.n_full else 0
        src = admission(ctx).sources[k]
        evs.append(evidence(f"readings at usage >= {self.floor:.2f} where the pool took no further request of the running ones' size",
                            self.n_full, None, ctx.window_text(), src))
        why = "; ".join(f"{n} with {ctx.word(kind)}" for kind, n in self.kinds.items() if n)
        cites = ctx.word("kv_refusal_cites")
        txt = (f"by {ctx.word('engine')}'s own admission test the pool could not take one more request of the running requests' mean size in "
               f"{self.n_full} of the {self.n_high} reading(s) at usage >= {self.floor:.2f}: {why}" + (f" ({cites})" if cites != "kv_refusal_cites" else ""))
        if self.fit:
            evs.append(evidence("requests the pool holds at the running requests' size (running / usage)", round(self.fit, 1), None, "", self.fit_src))
            txt += f"; at their size the pool holds about {self.fit:,.1f} requests"
        if self.n_over:
            evs.append(evidence("readings with a queue where the requests in flight exceed what the pool holds", self.n_over, None,
                                ctx.window_text(), ""))
            txt += (f", fewer than were in flight (running + waiting) in {self.n_over} of the {self.n_queued} reading(s) with a queue"
                    + (", and it refused at the latest reading" if self.now_full else ""))
        if self.admits_full and why_no_queue:
            txt += f" — {ctx.word('admits_full')}"
        return txt


def full_pool(ctx: RuleContext, a: Admission, n_wait: int, n_retract: int, min_share: float | None = None) -> FullPool | None:
    """kv_saturation's path on the engine's own KV refusal (None when the engine has none). It holds when the
    refusal covers ``min_share`` of the busy readings at usage >= ``waiting_usage`` (the mechanism confirms
    the high usage is a pool that takes no more, not many small requests) and either

    * the core admits into a full pool and preempts instead of queueing (vLLM V1,
      ``ctx.mech.queues_at_full_pool``), and requests waited, were preempted, or the refusal covers
      ``min_share`` of the busy readings; or
    * the pool refuses at the latest busy reading and, in ``min_share`` of the readings with a queue, the
      requests in flight (running + waiting) are more than the pool holds at the running requests' size
      (running / usage: a lower bound of their footprint, since they still grow), so the queue cannot be
      admitted into it."""
    if a.refusal is None or not len(a.running):
        return None
    t = ctx.thresholds
    share = t.get("min_share", 0.6) if min_share is None else min_share
    floor = float(t.get("waiting_usage", 0.9))
    valid = a.label != "report"
    u = np.nan_to_num(a.usage)
    busy = valid & (a.running > 0)
    full = busy & (a.refusal != "")
    high = busy & (u >= floor)
    n_full, n_high, n_busy = int(np.count_nonzero(full)), int(np.count_nonzero(high)), int(np.count_nonzero(busy))
    kinds = {k: int(np.count_nonzero(full & (a.refusal == k))) for k in ("kv_full", "kv_watermark")}
    idx = busy.nonzero()[0]
    now_full = bool(len(idx)) and bool(full[idx[-1]])
    with np.errstate(invalid="ignore", divide="ignore"):
        fits = np.where(u > 0, a.running / np.where(u > 0, u, 1.0), np.inf)
    queued = valid & (a.queue > 0) & (u > 0)
    over = queued & ((a.running + a.queue) > fits)
    n_q, n_over = int(np.count_nonzero(queued)), int(np.count_nonzero(over))
    admits_full = not ctx.mech.queues_at_full_pool(a.core)
    fit, fit_src = None, ""
    if n_full:
        # the median over the refused readings (a few grown requests at one reading do not set it alone)
        on = full.nonzero()[0]
        k = int(on[np.argsort(fits[on], kind="stable")[(len(on) - 1) // 2]])
        ranks = dp_ranks(ctx)
        fit, fit_src = float(fits[k]) / ranks, f"{a.sources[k]} (running / usage" + (f" / {ranks} DP ranks)" if ranks > 1 else ")")
    confirmed = n_full > 0 and n_high > 0 and n_full >= share * n_high
    holds = confirmed and (
        (admits_full and (n_wait > 0 or n_retract > 0 or n_full >= share * n_busy))
        or (now_full and n_q > 0 and n_over >= share * n_q))
    return FullPool(full, n_full, n_high, n_busy, kinds, admits_full, now_full, n_q, n_over, fit, fit_src, holds, floor)


# -- retractions -------------------------------------------------------------------------------------
def retractions(ctx: RuleContext) -> tuple[int, int, str]:
    """(retraction events, retracted requests, source of the first event); memoised for the pass. The
    parser's events (copies that TP ranks of one DP group print are already dropped; later pipeline stages
    repeat stage 0's), else the counter's increase, else the points of the retracted-requests gauge."""
    hit = ctx.memo.get("retractions")
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    evs = ctx.events_of("retraction")
    if evs and any("pp" not in e.rank for e in evs):
        evs = [e for e in evs if "pp" not in e.rank]
    reqs = sum(int(e.fields.get("retracted_reqs", 1) or 1) for e in evs)
    tot = ctx.series("retractions_total")
    counted = int(float(tot.values[-1]) - float(tot.values[0])) if tot is not None and len(tot) >= 2 and tot.values[-1] > tot.values[0] else 0
    out: tuple[int, int, str] = (0, 0, "")
    if evs and reqs >= counted:
        out = (len(evs), reqs, evs[0].source)
    elif counted:
        out = (counted, counted, tot.source_at(-1))  # type: ignore[union-attr]  # the counter counts requests
    else:
        rr = ctx.series("retracted_reqs")
        pos = [v for v in rr.values.tolist() if v > 0] if rr is not None else []
        if pos:
            out = (len(pos), int(sum(pos)), argmax_source(ctx, "retracted_reqs"))
    ctx.memo["retractions"] = out
    return out


def retraction_count(ctx: RuleContext) -> tuple[int, str]:
    """Retraction events and the source of the first (:func:`retractions`)."""
    n, _reqs, src = retractions(ctx)
    return n, src


__all__ = ["Admission", "CLASSES", "FullPool", "admission", "dp_ranks", "finished_sizes", "fit_at_full_length",
           "full_length", "full_pool", "kv_reason", "per_pass", "prefill_budget", "retraction_count", "retractions", "server_state_of"]
