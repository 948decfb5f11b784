"""The vLLM engine adapter: vLLM's metric names, log formats, endpoints and flag spellings, mapped into the
canonical signals the rules read (the same ones SGLang's adapter writes). Same shape as
:mod:`diagnoser.engines.sglang`; :mod:`diagnoser.engines.auto` picks between them per input."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diagnoser.engines.vllm import config, flags
from diagnoser.engines.vllm.logs import VLLMLogParser
from diagnoser.engines.vllm.scheduler_model import MECHANISM
from diagnoser.engines.vllm.versions import VersionRange, parse_version
from diagnoser.model import SignalSink

if TYPE_CHECKING:
    from diagnoser.engines.vllm import metrics

NAME = "vllm"

SERVER_INFO_PATHS = ("/server_info",)  # only with VLLM_SERVER_DEV_MODE=1
MODEL_INFO_PATHS: tuple[str, ...] = ()
VERSION_PATH = "/version"
MODELS_PATH = "/v1/models"
LOADS_PATH = "/load"
METRICS_PATH = "/metrics"

EXPECTED_LOG_FORMATS = (
    "the periodic stats line 'Avg prompt throughput: … Running: N reqs, Waiting/Pending: M reqs, GPU KV cache usage: X%'",
    "startup lines such as 'KV cache size: N tokens' / '# GPU blocks: N' or 'non-default args: {…}'",
)


class VLLMAdapter:
    name = NAME
    server_info_paths = SERVER_INFO_PATHS
    model_info_paths = MODEL_INFO_PATHS
    version_path = VERSION_PATH
    loads_path = LOADS_PATH
    models_path = MODELS_PATH
    metrics_path = METRICS_PATH
    expected_log_formats = EXPECTED_LOG_FORMATS
    mechanism = MECHANISM  # vLLM's admission arithmetic, vetting and wording (engines/vllm/scheduler_model.py)

    def log_parser(self, sink: SignalSink, source_name: str) -> VLLMLogParser:
        return VLLMLogParser(sink, source_name)

    def new_metrics_state(self) -> metrics.MetricsState:
        from diagnoser.engines.vllm import metrics

        return metrics.MetricsState()

    def ingest_families(self, families: Any, ts: float, sink: SignalSink, state: metrics.MetricsState, source: str) -> int:
        from diagnoser.engines.vllm import metrics

        return metrics.ingest_families(families, ts, sink, state, source)

    def is_engine_exposition(self, families: list[Any]) -> bool:
        from diagnoser.engines.vllm import metrics

        return metrics.has_vllm_family(families)

    def foreign_exposition(self, families: Any) -> str | None:
        return None

    def fast_samples(self, text: str, limit: int | None = None) -> list[metrics.Sample]:
        from diagnoser.engines.vllm import metrics

        return metrics.fast_samples(text, limit)

    def samples_from_families(self, families: Any) -> list[metrics.Sample]:
        from diagnoser.engines.vllm import metrics

        return metrics.samples_from_families(families)

    def ingest_samples(self, samples: Any, ts: float, sink: SignalSink, state: metrics.MetricsState, source: str) -> int:
        from diagnoser.engines.vllm import metrics

        return metrics.ingest_samples(samples, ts, sink, state, source)

    def window_quantiles(self, state: metrics.MetricsState) -> dict[str, float]:
        from diagnoser.engines.vllm import metrics

        return metrics.window_quantiles(state)

    def ingest_server_info(self, info: dict[str, Any], sink: SignalSink, source: str, version: VersionRange) -> None:
        config.facts_from_server_info(info, sink, source, version)

    def ingest_model_info(self, info: dict[str, Any], sink: SignalSink, source: str) -> None:
        return None

    def ingest_version(self, data: dict[str, Any], sink: SignalSink, source: str, version: VersionRange) -> None:
        config.facts_from_version(data, sink, source, version)

    def ingest_loads(self, data: dict[str, Any], sink: SignalSink, source: str) -> None:
        return None

    def ingest_models(self, data: dict[str, Any], sink: SignalSink, source: str) -> None:
        config.facts_from_models(data, sink, source)

    def flag(self, concept: str, version: tuple[int, int, int] | None = None) -> str:
        return flags.spelling(concept, version)

    def flag_available(self, concept: str, version: tuple[int, int, int] | None = None) -> bool:
        return flags.available(concept, version)


ADAPTER = VLLMAdapter()

__all__ = ["ADAPTER", "VLLMAdapter", "VersionRange", "parse_version", "flags"]
