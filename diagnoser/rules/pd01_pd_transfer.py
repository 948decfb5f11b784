"""Prefill/decode disaggregation: requests wait on, or fail in, the hand-over between the prefill and decode servers.

What it detects:
    On a PD prefill server, requests go through a bootstrap queue (the decode side must reserve KV for
    them), then the waiting queue and prefill, then the in-flight queue until their KV has been sent.
    (1) Readings where the bootstrap and in-flight queues (`#unbootstrapped-req` / `#bootstrap-req` /
    `#prealloc-req`, `#transferring-req` / `#inflight-req`) hold at least `min_waiting` (16)
    requests and `backlog_ratio` (2) times what runs or waits for prefill: the prefill GPU waits on
    the hand-over, not on compute. On a decode server, the transfer queue (`#transfer-req`) doing the
    same against the running batch. (2) Requests failing in the hand-over: `Prefill bootstrap failed for
    request …` / `Decode transfer failed …` (counted once per request, however many ranks print it),
    with the reasons (timeouts in `KVPoll.Bootstrapping`, aborts, failures on another rank). (3) The
    transfer engine's own rate (Mooncake `Transfer Engine Throughput: X MB/s`) below `slow_mb_s`
    (1000 MB/s, far below an RDMA link) while transfers are queued.

Why it matters:
    A request's time to first token on a PD deployment includes the bootstrap and the KV transfer. When
    they are the slow part, adding prefill or decode compute does nothing: the queues keep growing while
    the GPUs idle, and requests time out.

Evidence:
    The bootstrap / in-flight queues against running and waiting requests, per rank when ranks print
    them; failed requests and their reasons; the transfer rates.

    On each engine. On SGLang: the PD bootstrap, in-flight and transfer queues, transfer failures and KV
    transfer rates of a disaggregated deployment. Cannot judge vLLM yet: its disaggregated prefill (KV
    connectors) is not read.

Fix:
    A transfer rate in MB/s means the KV goes over TCP or a wrong NIC: point the transfer engine at the
    RDMA devices (`--disaggregation-ib-device`, e.g. `mlx5_0,mlx5_1`) and use an RDMA backend
    (`--disaggregation-transfer-backend mooncake` or `nixl`). A bootstrap queue that does not drain,
    or bootstrap timeouts, mean the decode side is not accepting: check its pool and request slots
    (`#prealloc-req` / pre-allocated usage on its Decode lines) and its health; too many requests
    routed at once (lower the router's concurrency) or a slot leak on the decode side keep it full.

Known false positives:
    A burst at the start of a run fills the bootstrap queue for a moment; aborts sent by clients that
    gave up are failures of the clients' patience, not of the link (the reasons tell them apart).

References:
    - How diagnoser reads SGLang: [PD disaggregation lines](docs/sglang.md#pd-logs), [the queues in the
      Prefill batch line](docs/sglang.md#prefill-line), [PD metrics](docs/sglang.md#metrics-pd).
    - SGLang's source at v0.5.23: `python/sglang/srt/disaggregation/prefill.py` and `decode.py` (bootstrap,
      waiting and in-flight queues, `Prefill bootstrap failed for request`),
      `python/sglang/srt/disaggregation/common/conn.py` (the `KVPoll` states); SGLang's PD disaggregation
      docs (`--disaggregation-ib-device`, `--disaggregation-transfer-backend`).
    - Real cases: issue [#5450](https://github.com/sgl-project/sglang/issues/5450) (MB/s transfers, 300+
      unbootstrapped requests per rank), issue [#9266](https://github.com/sgl-project/sglang/issues/9266)
      (bootstrap timeouts and aborts under high concurrency).
"""

from __future__ import annotations

import numpy as np

from diagnoser.model import Evidence, Finding, Severity, Suggestion
from diagnoser.rules.base import Rule, RuleContext, evidence, fmt_int, readings_basis, suggest
from diagnoser.rules.columns import aligned, raw_arrays


class PDTransfer(Rule):
    name = "pd_transfer"
    code = "PD01"
    title = "PD hand-over is the bottleneck"
    severity = Severity.WARNING
    reads = ("pd_bootstrap_reqs", "pd_inflight_reqs", "pd_transfer_reqs")
    events = ("pd_failure", "kv_transfer_rate")
    defaults = {"min_waiting": 16, "backlog_ratio": 2.0, "slow_mb_s": 1000.0}
    threshold_help = {
        "min_waiting": "requests in the bootstrap + in-flight (or decode transfer) queues that count as a backlog",
        "backlog_ratio": "the hand-over queues must hold this many times the requests running or waiting for prefill",
        "slow_mb_s": "transfer-engine rate (MB/s) below which transfers are slow while some are queued",
    }

    def evaluate(self, ctx: RuleContext) -> Finding | None:
        t = ctx.thresholds
        evs: list[Evidence] = []
        parts: list[str] = []
        backlog = self._backlog(ctx, evs, parts)
        queued_transfers = backlog is not None and backlog[1] > 0
        fails = self._failures(ctx, evs, parts)
        rates = [float(e.fields["mb_s"]) for e in ctx.events_of("kv_transfer_rate")]
        slow = False
        if rates and max(rates) < t["slow_mb_s"] and (queued_transfers or fails):
            slow = True
            ev_src = ctx.events_of("kv_transfer_rate")
            evs.append(evidence("transfer engine rate (MB/s), max", round(max(rates), 2), f"< {t['slow_mb_s']:.0f}", "", ev_src[int(np.argmax(rates))].source))
            parts.append(f"the transfer engine moved {min(rates):.1f}–{max(rates):.1f} MB/s per worker, orders of magnitude below an RDMA link")
        if backlog is None and not fails and not slow:
            return None
        summary = "PD hand-over: " + "; ".join(parts) + "."
        sugg: list[Suggestion] = []
        if slow or (backlog is not None and backlog[1] >= backlog[0] and backlog[1] > 0):
            dev = ctx.cfg("arg.disaggregation_ib_device")
            sugg.append(suggest(ctx, "disaggregation_ib_device", dev, "the RDMA NICs of the node, e.g. mlx5_0,mlx5_1",
                                "KV transfers are slow" + (" (MB/s: TCP-class, not RDMA)" if slow else "") + "; the transfer engine must use the RDMA devices",
                                "transfers at the link's speed (GB/s): the in-flight queue drains and TTFT drops",
                                ("the nodes have RDMA NICs (InfiniBand or RoCE)",)))
            be = ctx.cfg("arg.disaggregation_transfer_backend")
            if be is None and ctx.events_of("kv_transfer_rate"):
                be = "mooncake"  # the rate lines are Mooncake's transfer engine's
            if be == "mooncake":
                sugg.append(suggest(ctx, "disaggregation_transfer_backend", "mooncake", "nixl",
                                    "Mooncake moves the KV at TCP speed here; NIXL (UCX) is the other RDMA-capable backend, if Mooncake "
                                    "cannot be pointed at the RDMA devices", "KV transfers at RDMA speed",
                                    ("--disaggregation-ib-device did not fix Mooncake's rate", "NIXL and UCX are installed on both sides")))
            elif be != "nixl":
                sugg.append(suggest(ctx, "disaggregation_transfer_backend", be, "mooncake (or nixl)",
                                    "an RDMA-capable transfer backend moves KV without the CPU path",
                                    "KV transfers at RDMA speed", ("the backend's library is installed on both sides",)))
        notes = []
        if backlog is not None and backlog[0] > backlog[1] and backlog[2] == "prefill":
            notes.append("Most waiting requests are in the bootstrap queue: the decode side is not accepting them. Check its pool and "
                         "request slots (#prealloc-req and pre-allocated usage on its Decode lines) and lower the router's concurrency.")
        elif backlog is not None and backlog[0] > backlog[1]:
            notes.append("Most waiting requests wait for KV space on this decode server: its pool or request slots are taken (by running "
                         "requests and by pre-allocations for transfers in flight). A larger decode pool (--mem-fraction-static, "
                         "--kv-cache-dtype) or fewer requests routed at once drains it.")
        if fails and not slow and backlog is None:
            notes.append("Requests fail in the bootstrap: the decode side did not reserve KV for them in time (its pool or request "
                         "slots are full, or leak), or clients aborted them. The decode server's log shows which.")
        basis = readings_basis(ctx, "pd_bootstrap_reqs") or readings_basis(ctx, "pd_transfer_reqs") or \
            {"events": len(ctx.events_of("pd_failure")) + len(rates), "kind": "PD"}
        conf = "medium" if backlog is not None or slow else "low"
        return self.finding(ctx, summary, evs, sugg, confidence=conf, severity=Severity.WARNING, notes=notes, basis=basis)

    def _backlog(self, ctx: RuleContext, evs: list[Evidence], parts: list[str]) -> tuple[float, float, str] | None:
        """(bootstrap or pre-allocation, in-flight or transfer, "prefill"/"decode") at the worst reading where
        the hand-over queues hold the backlog."""
        t = ctx.thresholds
        for kind, boot_sig, fly_sig in (("prefill", "pd_bootstrap_reqs", "pd_inflight_reqs"), ("decode", "pd_prealloc_reqs", "pd_transfer_reqs")):
            base = boot_sig if ctx.series(boot_sig) is not None else fly_sig if ctx.series(fly_sig) is not None else None
            if base is None:
                continue
            _, bv = raw_arrays(ctx, base)
            other = fly_sig if base == boot_sig else boot_sig
            ov = aligned(ctx, base, other)
            boot = bv if base == boot_sig else np.nan_to_num(ov)
            fly = np.nan_to_num(ov) if base == boot_sig else bv
            run = np.nan_to_num(aligned(ctx, base, "running_reqs"))
            que = np.nan_to_num(aligned(ctx, base, "queue_reqs"))
            hand = np.nan_to_num(boot) + np.nan_to_num(fly)
            busy = run + (que if kind == "prefill" else 0)
            ok = (hand >= t["min_waiting"]) & (hand >= t["backlog_ratio"] * (busy + 1))
            if not ok.any():
                continue
            k = int(np.argmax(np.where(ok, hand, -1)))
            s = ctx.series(base)
            src = s.sources[k] if s is not None else ""
            share = float(np.count_nonzero(ok)) / len(ok)
            b, f_ = float(np.nan_to_num(boot)[k]), float(np.nan_to_num(fly)[k])
            if kind == "prefill":
                evs.append(evidence("PD bootstrap queue (waiting for the decode side)", b, f">= {t['min_waiting']} with the in-flight queue", ctx.window_text(), src))
                evs.append(evidence("PD in-flight queue (KV being sent)", f_, None, ctx.window_text(), src))
                evs.append(evidence("running + waiting for prefill", float(busy[k]), f"<= 1/{t['backlog_ratio']:.0f} of the hand-over queues", "", src))
                ranks = [r for r in ctx.ranks(base)]
                where = f" (summed over {len(ranks)} ranks)" if len(ranks) > 1 else ""
                parts.append(f"{fmt_int(b + f_)} requests wait in the hand-over{where} — {fmt_int(b)} for the decode side's bootstrap and "
                             f"{fmt_int(f_)} with their KV in flight — while {float(run[k]):.0f} run and {float(que[k]):.0f} wait for prefill, "
                             f"in {share:.0%} of {len(ok)} reading(s)")
            else:
                evs.append(evidence("PD decode transfer queue (waiting for KV)", f_, f">= {t['min_waiting']}", ctx.window_text(), src))
                evs.append(evidence("PD decode pre-allocation queue", b, None, ctx.window_text(), src))
                pre_use = aligned(ctx, base, "pd_prealloc_usage")
                held = float(pre_use[k]) if len(pre_use) and pre_use[k] == pre_use[k] else None
                if held is not None:
                    evs.append(evidence("pre-allocated usage (pool reserved for incoming transfers)", held, None, ctx.window_text(), src))
                parts.append(f"{fmt_int(f_)} requests wait for their KV to arrive and {fmt_int(b)} for KV to be reserved while "
                             f"{float(run[k]):.0f} decode, in {share:.0%} of {len(ok)} reading(s)"
                             + (f"; {held:.0%} of the decode pool is reserved for incoming transfers" if held is not None else ""))
            return b, f_, kind
        return None

    @staticmethod
    def _failures(ctx: RuleContext, evs: list[Evidence], parts: list[str]) -> int:
        fails = ctx.events_of("pd_failure")
        if not fails:
            return 0
        by_req: dict[str, list] = {}  # type: ignore[type-arg]
        for e in fails:
            by_req.setdefault(e.fields.get("rid") or e.source, []).append(e)
        reasons: dict[str, int] = {}
        for group in by_req.values():
            r = _reason(group)
            reasons[r] = reasons.get(r, 0) + 1
        first = fails[0]
        evs.append(Evidence("requests that failed in the PD hand-over", len(by_req), None, "", first.source))
        for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3]:
            src = next(e.source for g in by_req.values() if _reason(g) == r for e in g)
            evs.append(Evidence(f"reason: {r}", n, None, "", src))
        stage = {e.fields.get("side", "") + " " + e.fields.get("stage", "") for e in fails}
        parts.append(f"{len(by_req)} request(s) failed in the {' / '.join(sorted(stage))} (" +
                     ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])) + ")")
        return len(by_req)


def _reason(group: list) -> str:  # type: ignore[type-arg]
    texts = " ".join(str(e.fields.get("reason", "")) for e in group).lower()
    if "timed out" in texts and "bootstrapping" in texts:
        return "timed out waiting for the decode side (KVPoll.Bootstrapping)"
    if "timed out" in texts:
        return "timed out"
    if "abort" in texts:
        return "aborted (by the client or router)"
    if "another rank" in texts:
        return "failed on another rank"
    return (str(group[0].fields.get("error") or "failed")).strip() or "failed"
