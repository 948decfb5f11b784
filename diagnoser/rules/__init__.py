"""The rule catalogue. ``REGISTRY`` is the explicit list of rule classes, in report order.

A finding's ``rule`` field takes exactly these names; ``diagnose rules`` lists them and
``diagnose explain NAME`` prints one rule's doc.

A rule's doc is its module docstring: a one-line summary, then the sections of ``base.DOC_HEADINGS`` (a
``Heading:`` line, the body indented under it), written in the Markdown subset of
:mod:`diagnoser.outputs.docmd` (single-backtick code, ``- `` lists, ``[text](target)`` links). References
link sections of ``docs/sglang.md`` (``docs/sglang.md#decode-line``), SGLang's docs, source files at a
release tag and public issues; ``tests/test_docs.py`` checks the format and every anchor.
"""

from __future__ import annotations

from diagnoser.rules.base import Rule, RuleContext
from diagnoser.rules.ca01_low_cache_hit import LowCacheHit
from diagnoser.rules.cg01_cuda_graph_disabled_or_exceeded import CudaGraphDisabledOrExceeded
from diagnoser.rules.dp01_dp_imbalance import DPImbalance
from diagnoser.rules.er01_oom import OOM
from diagnoser.rules.er02_engine_crash import EngineCrash
from diagnoser.rules.er03_engine_leak import EngineLeak
from diagnoser.rules.fl01_replica_imbalance import ReplicaImbalance
from diagnoser.rules.fl02_config_drift import ConfigDrift
from diagnoser.rules.in01_source_unreachable import SourceUnreachable
from diagnoser.rules.in02_metrics_disabled import MetricsDisabled
from diagnoser.rules.in03_insufficient_data import InsufficientData
from diagnoser.rules.kv01_kv_saturation import KVSaturation
from diagnoser.rules.kv02_kv_retraction import KVRetraction
from diagnoser.rules.kv03_kv_pool_too_small import KVPoolTooSmall
from diagnoser.rules.lt01_high_latency import HighLatency
from diagnoser.rules.oc01_low_batch_occupancy import LowBatchOccupancy
from diagnoser.rules.oc02_client_bound import ClientBound
from diagnoser.rules.pd01_pd_transfer import PDTransfer
from diagnoser.rules.pf01_prefill_stall import PrefillStall
from diagnoser.rules.pf02_prefill_decode_interference import PrefillDecodeInterference
from diagnoser.rules.qu01_queue_buildup import QueueBuildup
from diagnoser.rules.rg01_runaway_generation import RunawayGeneration
from diagnoser.rules.rq01_request_outcomes import RequestOutcomes
from diagnoser.rules.sl01_max_running_requests_cap import MaxRunningRequestsCap
from diagnoser.rules.sp01_low_spec_acceptance import LowSpecAcceptance

REGISTRY: list[type[Rule]] = [
    KVSaturation,
    KVRetraction,
    KVPoolTooSmall,
    QueueBuildup,
    LowBatchOccupancy,
    ClientBound,
    PrefillStall,
    MaxRunningRequestsCap,
    CudaGraphDisabledOrExceeded,
    LowSpecAcceptance,
    LowCacheHit,
    DPImbalance,
    PrefillDecodeInterference,
    PDTransfer,
    OOM,
    EngineCrash,
    EngineLeak,
    RunawayGeneration,
    RequestOutcomes,  # after the capacity causes: a queue-full 503 or a timeout is theirs when they are found
    HighLatency,  # the symptom the client feels, after every cause
    SourceUnreachable,
    MetricsDisabled,
    InsufficientData,
    ReplicaImbalance,
    ConfigDrift,
]


def by_name(name: str) -> type[Rule] | None:
    for r in REGISTRY:
        if r.name == name or r.code == name.upper():
            return r
    return None


__all__ = ["REGISTRY", "Rule", "RuleContext", "by_name"]
