"""SGLang's mechanism for the engine-neutral rules (:class:`diagnoser.mechanism.Mechanism`): the
``PrefillAdder`` reservation test, the vetting of :mod:`diagnoser.engines.sglang.scheduler_model` and the
memory hook's automatic fraction, at the release tag that module cites (v0.5.23)."""

from __future__ import annotations

from typing import Any

import numpy as np

from diagnoser.engines.sglang import scheduler_model as SM
from diagnoser.engines.sglang.versions import NEWEST_KNOWN
from diagnoser.mechanism import KVInputs, StepModel, Verdict

FIT_SHARE = 0.8  # running at this share of what the pool holds at full length fills it


class SGLangMechanism:
    name = "sglang"
    words = {"engine": "SGLang", "preemption": "retraction", "preempted": "retracted", "preempt": "retract"}
    newest_known = NEWEST_KNOWN
    no_events: frozenset[str] = frozenset()
    reserves_output = True
    has_kv_refusal = False  # kv_refusal answers None: the reservation (kv_blocked) is SGLang's KV test
    chunked_prefill_default = True

    def admission_ratio(self, conservativeness: Any, ratio_read: float | None, args_known: bool) -> float | None:
        """new_token_ratio: as read, else its start min(0.7 x --schedule-conservativeness, 1)."""
        if ratio_read is not None:
            return ratio_read
        if isinstance(conservativeness, int | float) and not isinstance(conservativeness, bool):
            return SM.new_token_ratio(float(conservativeness)).init
        return SM.INIT_NEW_TOKEN_RATIO if args_known else None

    def kv_blocked(self, kv: KVInputs) -> Any:
        """Per reading, whether free + evictable KV is below the next request's need after the running
        requests' reservations (``PrefillAdder.add_one_req`` -> ``NO_TOKEN``, managers/schedule_policy.py)."""
        if not kv.pool or kv.prompt is None or kv.output is None or kv.ratio is None or not len(kv.usage):
            return None
        u = np.nan_to_num(kv.usage, nan=0.0)
        free = kv.pool * (1.0 - u)
        held = kv.pool * u / np.maximum(kv.running, 1.0)  # tokens per running request
        generated = np.clip(held - kv.prompt, 0.0, kv.output)
        reserved = kv.running * np.minimum(kv.output - generated, SM.CLIP_MAX_NEW_TOKENS) * kv.ratio
        need = kv.prompt + min(kv.output, SM.CLIP_MAX_NEW_TOKENS) + 1
        # or the running batch already fills the pool at its full length: the ratio has decayed (it falls each
        # decode step), and these requests are retracted when they grow (the footprint test)
        full = kv.running >= FIT_SHARE * kv.pool / max(kv.prompt + kv.output, 1.0)
        return ((free - reserved) < need) | full

    def kv_refusal(self, kv: KVInputs) -> Any:
        return None  # SGLang's KV test is the reservation (kv_blocked)

    def engine_core(self, cfg: Any, version: Any = None) -> str | None:
        return None  # one scheduler

    def queues_at_full_pool(self, core: str | None) -> bool:
        return True  # PrefillAdder holds the waiting requests back (NO_TOKEN) before the pool runs out

    def memory_what_if(self, cfg: Any, flag: str, current: Any, proposed: Any, version: Any = None) -> dict[str, Any] | None:
        return None  # SGLang's memory what-ifs are the capacity planner's (advice.py)

    def state_of(self, cfg: Any, version: Any = None) -> Any:
        return None  # capacity/serverstate.py builds SGLang's ServerState (it reads signals too)

    def vet(self, flag: str, current: Any, proposed: Any, state: Any) -> Verdict:
        return SM.vet(flag, current, proposed, state)

    def prefill_only_steps(self, state: Any) -> StepModel | None:
        return None  # SGLang's Prefill / Decode batch lines show its steps: PF02 reads them directly

    def chunked_prefill_budget(self, state: Any) -> tuple[int, str] | None:
        return None  # --chunked-prefill-size is SGLang's (rules read it from the config)

    def state_after(self, state: Any, flag: str, value: Any) -> Any:
        return state  # SGLang's ServerState is vetted as read (scheduler_model.vet sizes its own chains)

    def startup_fraction_fix(self, cfg: Any, cur: Any) -> tuple[float, str] | None:
        """A start-up whose automatic --mem-fraction-static came out at or below zero because chunked prefill is
        off (``--chunked-prefill-size -1``): SGLang reserved 1.5 x --max-prefill-tokens MB of activations
        (memory_hook.py at v0.5.23). The memory it saw follows from the fraction it logged; the fix is the
        fraction the same formula gives with its default chunk, which leaves a KV pool and starts."""
        chunk = cfg("chunked_prefill_size", cfg("arg.chunked_prefill_size"))
        if not isinstance(cur, int | float) or cur > 0.05 or not isinstance(chunk, int | float) or chunk > 0:
            return None
        mpt = cfg("max_prefill_tokens", cfg("arg.max_prefill_tokens"))
        mpt = int(mpt) if isinstance(mpt, int | float) and mpt > 0 else 16384
        tp = cfg("arg.tp_size")
        tp = int(tp) if isinstance(tp, int | float) and tp > 0 else 1
        reserved = 512 + max(mpt, 2048) * 1.5 + tp / 8 * 1024
        memory = reserved / (1.0 - float(cur))  # fraction = (memory - reserved) / memory
        fixed = SM.auto_mem_fraction(memory, SM.CPU_DEFAULT_CHUNK, tp=tp)
        prop = round(int(fixed * 20) / 20, 2)  # down to a multiple of 0.05: the activations keep their reserve
        if prop <= 0:
            return None
        return prop, (f"chunked prefill is off (--chunked-prefill-size {int(chunk)}), so SGLang reserved 1.5 x --max-prefill-tokens {mpt:,} = "
                      f"{reserved / 1024:.1f} GB for activations of about {memory / 1024:.1f} GB and set the automatic fraction to {float(cur):g} "
                      f"(python/sglang/srt/arg_groups/memory_hook.py at v0.5.23): no KV pool fits. With its default {SM.CPU_DEFAULT_CHUNK:,}-token chunk "
                      f"the same formula gives {fixed:.3f}; an explicit {prop:g} starts with a KV pool (or set --chunked-prefill-size {SM.CPU_DEFAULT_CHUNK} "
                      "and let SGLang size it)")


MECHANISM = SGLangMechanism()
