"""The engine mechanism the rules consume: admission arithmetic, vetting and wording, without importing an engine.

The rules judge canonical signals (running and waiting requests, KV usage, token counts). *Why* a waiting
request was not admitted, and whether a flag change would do anything, is the engine's own arithmetic:
SGLang's ``PrefillAdder`` reserves the running requests' remaining output, vLLM's V1 scheduler admits into
the KV pool block by block and preempts when a running request cannot get a block. Each engine package
provides one object of the :class:`Mechanism` protocol (``ADAPTER.mechanism``):

* ``diagnoser/engines/sglang/mechanism.py`` wraps ``engines/sglang/scheduler_model.py``;
* ``diagnoser/engines/vllm/scheduler_model.py`` is vLLM's.

:mod:`diagnoser.evaluate` builds each target's :class:`~diagnoser.rules.base.RuleContext` with its
engine's adapter, and the rules read ``ctx.mech``. A third engine plugs in the same way: an adapter under
``diagnoser/engines/<name>/`` with a ``mechanism`` attribute implementing this protocol, and an entry in
``engines/auto.py``. This module sits in the model layer, so engines implement it and rules read it
without either importing the other (tests/test_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the engine's own code makes of one proposed flag change."""

    kind: str  # "ok" | "noop" | "capped" | "rewrite"
    reason: str = ""
    flag: str | None = None  # capped / rewrite: the flag to propose
    current: Any = None
    proposed: Any = None
    cites: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


OK = Verdict("ok")


@dataclass(frozen=True, slots=True)
class StepModel:
    """The engine's answer to "does a step that admits prompts leave the running requests without a token?"."""

    prefill_only: bool
    why: str  # the engine and configuration that make it so
    cites: str = ""  # the engine's source at a release


@dataclass(frozen=True, slots=True)
class KVInputs:
    """What the KV admission test reads, per reading (numpy arrays) or for the window (numbers)."""

    pool: float  # KV tokens of the pool (one DP rank)
    usage: Any  # usage 0-1 per reading (NaN unread)
    running: Any  # running requests per reading
    prompt: float | None  # mean uncached prompt of a request (tokens)
    output: float | None  # mean output of a request (tokens)
    ratio: Any = None  # SGLang's new_token_ratio per reading (None elsewhere)
    block_size: int | None = None  # vLLM: tokens per KV block
    core: str | None = None  # the engine core that admits ("V0" / "V1" on vLLM; None: unknown or one core only)
    watermark: float | None = None  # share of the blocks admission keeps free (None: the core's default)


class Mechanism(Protocol):
    """One engine's scheduler and memory behaviour, as the rules need it."""

    name: str  # "sglang" | "vllm"
    # the words a report uses for the engine's behaviours: "preemption" (vLLM) / "retraction" (SGLang), etc.
    words: dict[str, str]
    no_events: frozenset[str]  # event kinds the engine never logs (not named as "absent" to a reader)
    newest_known: tuple[int, int, int] | None  # newest release whose source was read (config drift)
    reserves_output: bool  # admission holds room for the running requests' remaining output (SGLang)
    has_kv_refusal: bool  # kv_refusal tests the pool (vLLM); False: it always answers None (SGLang's test is kv_blocked)
    chunked_prefill_default: bool  # prompts longer than the step budget are split by default

    def admission_ratio(self, conservativeness: Any, ratio_read: float | None, args_known: bool) -> float | None:
        """The output-reservation ratio the KV admission test uses (None: the engine reserves none, or unknown)."""
        ...

    def kv_blocked(self, kv: KVInputs) -> Any:
        """Per reading, whether the next waiting request does not fit the pool by the engine's admission
        arithmetic (a bool array), or None when the inputs lack the sizes."""
        ...

    def kv_refusal(self, kv: KVInputs) -> Any:
        """Per reading, why the pool takes no further request of the running ones' mean size, in the engine's
        own KV terms: ``"kv_full"`` (fewer free blocks than that request needs), ``"kv_watermark"`` (it fits,
        but not beside the blocks admission keeps free) or ``""`` (an object array); None when the engine
        has no such test (SGLang's is :meth:`kv_blocked`, its reservation)."""
        ...

    def engine_core(self, cfg: Any, version: tuple[int, int, int] | None = None) -> str | None:
        """Which of the engine's schedulers runs this server (vLLM: "V0" / "V1"), from the config facts and
        the version; None when one core only, or unknown."""
        ...

    def queues_at_full_pool(self, core: str | None) -> bool:
        """Whether a full pool shows as waiting requests (admission holds them back). False where the
        scheduler admits into a nearly full pool and preempts running requests instead (vLLM V1), so a rule
        must not demand a queue to call the pool full."""
        ...

    def memory_what_if(self, cfg: Any, flag: str, current: Any, proposed: Any,
                       version: tuple[int, int, int] | None = None) -> dict[str, Any] | None:
        """What a memory flag change does to the KV pool by the engine's memory arithmetic, from the
        start-up facts: ``{"tokens_now", "tokens_gained", "bound", "how", "assumptions", "cites"}``; None
        when the facts do not give it."""
        ...

    def state_of(self, cfg: Any, version: tuple[int, int, int] | None = None) -> Any:
        """The server state :meth:`vet` reads, from the timeline's config facts; None: the shared
        :func:`diagnoser.capacity.serverstate.server_state` (SGLang's)."""
        ...

    def vet(self, flag: str, current: Any, proposed: Any, state: Any) -> Verdict:
        """Whether the engine's own code makes this change do anything on this server."""
        ...

    def startup_fraction_fix(self, cfg: Any, cur: Any) -> tuple[float, str] | None:
        """A start-up whose automatically sized memory share left no KV pool: the share that starts, and why."""
        ...

    def prefill_only_steps(self, state: Any) -> StepModel | None:
        """Whether the scheduler runs a step that admits prompts with no decode in it (so the running
        requests get no token while prompts are computed), and why; None when the engine or its config
        does not say (the rule then has nothing to judge by)."""
        ...

    def chunked_prefill_budget(self, state: Any) -> tuple[int, str] | None:
        """The per-step token budget with chunked prefill on (configured, else the release's default) and
        where it comes from; None when the engine has no such budget or it is unknown."""
        ...

    def state_after(self, state: Any, flag: str, value: Any) -> Any:
        """The server state with one flag changed (to vet a change on the state the finding's other
        changes leave); the state itself when the engine does not model the flag."""
        ...


class NullMechanism:
    """No engine known (a context built without an adapter): no arithmetic, nothing vetted, neutral words."""

    name = ""
    words = {"engine": "the engine", "preemption": "preemption", "preempted": "preempted", "preempt": "preempt"}
    newest_known = None
    no_events: frozenset[str] = frozenset()
    reserves_output = False
    has_kv_refusal = False
    chunked_prefill_default = False

    def admission_ratio(self, conservativeness: Any, ratio_read: float | None, args_known: bool) -> float | None:
        return None

    def kv_blocked(self, kv: KVInputs) -> Any:
        return None

    def kv_refusal(self, kv: KVInputs) -> Any:
        return None

    def engine_core(self, cfg: Any, version: tuple[int, int, int] | None = None) -> str | None:
        return None

    def queues_at_full_pool(self, core: str | None) -> bool:
        return True

    def memory_what_if(self, cfg: Any, flag: str, current: Any, proposed: Any,
                       version: tuple[int, int, int] | None = None) -> dict[str, Any] | None:
        return None

    def state_of(self, cfg: Any, version: tuple[int, int, int] | None = None) -> Any:
        return None

    def vet(self, flag: str, current: Any, proposed: Any, state: Any) -> Verdict:
        return OK

    def startup_fraction_fix(self, cfg: Any, cur: Any) -> tuple[float, str] | None:
        return None

    def prefill_only_steps(self, state: Any) -> StepModel | None:
        return None

    def chunked_prefill_budget(self, state: Any) -> tuple[int, str] | None:
        return None

    def state_after(self, state: Any, flag: str, value: Any) -> Any:
        return state


NULL = NullMechanism()


def mechanism_of(adapter: Any) -> Mechanism:
    """The adapter's mechanism, or :data:`NULL`."""
    return getattr(adapter, "mechanism", None) or NULL  # type: ignore[no-any-return]


__all__ = ["KVInputs", "Mechanism", "NULL", "NullMechanism", "OK", "StepModel", "Verdict", "mechanism_of"]
