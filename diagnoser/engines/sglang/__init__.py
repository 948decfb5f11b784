"""The SGLang engine adapter: everything SGLang-specific (metric names, log formats, flag spellings,
version detection) lives under this package. A second engine is another adapter with the same shape."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diagnoser.engines.sglang import config, flags
from diagnoser.engines.sglang.logs import SGLangLogParser
from diagnoser.engines.sglang.mechanism import MECHANISM
from diagnoser.engines.sglang.versions import VersionRange, parse_version
from diagnoser.model import SignalSink

if TYPE_CHECKING:
    from diagnoser.engines.sglang import metrics

NAME = "sglang"

# endpoints, in the order tried (docs/sglang.md#endpoints)
SERVER_INFO_PATHS = ("/server_info", "/get_server_info", "/get_server_args")
MODEL_INFO_PATHS = ("/model_info", "/get_model_info")
LOADS_PATH = "/v1/loads"
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"

# formats a log is expected to contain, for the "no recognised line" message
EXPECTED_LOG_FORMATS = (
    "'Decode batch' / 'Prefill batch' scheduler lines (any version 0.1–0.5.23)",
    "'KV cache pool is full. Retract requests.' / 'Decode out of memory happened.'",
    "startup lines such as 'max_total_num_tokens=…' or 'server_args=ServerArgs(…)'",
)


class SGLangAdapter:
    name = NAME
    server_info_paths = SERVER_INFO_PATHS
    model_info_paths = MODEL_INFO_PATHS
    loads_path = LOADS_PATH
    models_path = MODELS_PATH
    metrics_path = METRICS_PATH
    expected_log_formats = EXPECTED_LOG_FORMATS
    mechanism = MECHANISM  # the admission arithmetic, vetting and wording the rules read (diagnoser/mechanism.py)

    def log_parser(self, sink: SignalSink, source_name: str) -> SGLangLogParser:
        return SGLangLogParser(sink, source_name)

    # the metrics module is imported in each method that needs it: a --log run never scrapes (start-up time)
    def new_metrics_state(self) -> metrics.MetricsState:
        from diagnoser.engines.sglang import metrics

        return metrics.MetricsState()

    def ingest_families(self, families: Any, ts: float, sink: SignalSink, state: metrics.MetricsState, source: str) -> int:
        from diagnoser.engines.sglang import metrics

        return metrics.ingest_families(families, ts, sink, state, source)

    def is_engine_exposition(self, families: list[Any]) -> bool:
        from diagnoser.engines.sglang import metrics

        return metrics.has_sglang_family(families)

    def foreign_exposition(self, families: Any) -> str | None:
        from diagnoser.engines.sglang import metrics

        return metrics.foreign_exposition(families)

    def fast_samples(self, text: str, limit: int | None = None) -> list[metrics.Sample]:
        from diagnoser.engines.sglang import metrics

        return metrics.fast_samples(text, limit)

    def samples_from_families(self, families: Any) -> list[metrics.Sample]:
        from diagnoser.engines.sglang import metrics

        return metrics.samples_from_families(families)

    def ingest_samples(self, samples: list[metrics.Sample], ts: float, sink: SignalSink, state: metrics.MetricsState, source: str) -> int:
        from diagnoser.engines.sglang import metrics

        return metrics.ingest_samples(samples, ts, sink, state, source)

    def window_quantiles(self, state: metrics.MetricsState) -> dict[str, float]:
        from diagnoser.engines.sglang import metrics

        return metrics.window_quantiles(state)

    def ingest_server_info(self, info: dict[str, Any], sink: SignalSink, source: str, version: VersionRange) -> None:
        config.facts_from_server_info(info, sink, source, version)

    def ingest_model_info(self, info: dict[str, Any], sink: SignalSink, source: str) -> None:
        config.facts_from_model_info(info, sink, source)

    def ingest_loads(self, data: dict[str, Any], sink: SignalSink, source: str) -> None:
        config.facts_from_loads(data, sink, source)

    def ingest_models(self, data: dict[str, Any], sink: SignalSink, source: str) -> None:
        config.facts_from_models(data, sink, source)

    def flag(self, concept: str, version: tuple[int, int, int] | None = None) -> str:
        return flags.spelling(concept, version)

    def flag_available(self, concept: str, version: tuple[int, int, int] | None = None) -> bool:
        return flags.available(concept, version)


ADAPTER = SGLangAdapter()

__all__ = ["ADAPTER", "SGLangAdapter", "VersionRange", "parse_version", "flags"]
