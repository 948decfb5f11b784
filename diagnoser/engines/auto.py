"""The engine picked per input: SGLang or vLLM, from what each input shows (:mod:`diagnoser.engines.detect`).

:class:`AutoAdapter` has the adapter interface. Each target's metrics state remembers the engine its
first exposition named; a log is read by the parser of the engine its first lines name; an endpoint's
answer (``/server_info`` holding ``vllm_config``, ``/v1/models`` owned by ``vllm``, a ``/version``
answer, which SGLang does not serve) names it too. The choice is written on the timeline
(``Timeline.engine`` and the ``engine`` config fact, with the evidence as its source), and the rules get
that engine's adapter (:meth:`for_timeline`), so a mixed fleet is judged target by target. An input that
names no engine is SGLang's, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnoser.engines import detect
from diagnoser.model import SignalSink

DEFAULT = "sglang"


def _adapters() -> dict[str, Any]:
    from diagnoser.engines.sglang import ADAPTER as SGLANG
    from diagnoser.engines.vllm import ADAPTER as VLLM

    return {"sglang": SGLANG, "vllm": VLLM}


def mark(sink: SignalSink, engine: str, why: str) -> None:
    """Write the engine on the timeline (a sink without ``engine`` just gets the config fact)."""
    if hasattr(sink, "engine"):
        sink.engine = engine  # type: ignore[attr-defined]
    sink.set_config("engine", engine, why)


class _Tagged(list):  # type: ignore[type-arg]
    """Samples with the engine that read them."""

    engine: str = DEFAULT


@dataclass(slots=True)
class AutoState:
    """One target's metrics state: the engine decided by its first exposition, and that engine's state."""

    engine: str | None = None
    inner: Any = None
    why: str = ""
    _states: dict[str, Any] = field(default_factory=dict)

    def use(self, engine: str, adapters: dict[str, Any]) -> Any:
        if engine not in self._states:
            self._states[engine] = adapters[engine].new_metrics_state()
        self.engine = engine
        self.inner = self._states[engine]
        return self.inner

    # what the sources read of a metrics state
    @property
    def version(self) -> Any:
        if self.inner is None:
            from diagnoser.engines.sglang.versions import VersionRange

            return VersionRange()
        return self.inner.version

    @property
    def model_names(self) -> set[str]:
        return set(getattr(self.inner, "model_names", set()))

    @property
    def dropped(self) -> int:
        return int(getattr(self.inner, "dropped", 0))

    @property
    def cut_series(self) -> int:
        return int(getattr(self.inner, "cut_series", 0))

    @property
    def drop_examples(self) -> list[str]:
        return list(getattr(self.inner, "drop_examples", []))


class AutoAdapter:
    name = "auto"

    def __init__(self) -> None:
        self.adapters = _adapters()
        self.default = self.adapters[DEFAULT]
        sgl, vl = self.adapters["sglang"], self.adapters["vllm"]
        self.server_info_paths = tuple(dict.fromkeys(sgl.server_info_paths + vl.server_info_paths))
        self.model_info_paths = sgl.model_info_paths
        self.models_path = sgl.models_path
        self.loads_path = sgl.loads_path
        self.metrics_path = sgl.metrics_path
        self.version_path = vl.version_path
        self.expected_log_formats = (*sgl.expected_log_formats, *("vLLM: " + f for f in vl.expected_log_formats))

    def __getattr__(self, name: str) -> Any:  # anything else an SGLang-only caller asks: SGLang's, as before
        if name in ("default", "adapters") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.default, name)

    def get(self, engine: str | None) -> Any:
        return self.adapters.get(engine or DEFAULT, self.default)

    def for_timeline(self, tl: Any) -> Any:
        """The adapter the rules use for a timeline (its flags are that engine's)."""
        return self.get(getattr(tl, "engine", None))

    # logs: the parser of the engine the log's first lines name
    def for_log(self, head: bytes | None, sink: SignalSink) -> Any:
        got = detect.log_engine(head) if head else None
        if got is None:  # nothing to tell from (a replayed or followed log): the target's engine so far
            return self.get(getattr(sink, "engine", None))
        engine, why = got
        if engine != DEFAULT or getattr(sink, "engine", DEFAULT) != DEFAULT:
            mark(sink, engine, why)
        return self.adapters[engine]

    def log_parser(self, sink: SignalSink, source_name: str) -> Any:
        return self.default.log_parser(sink, source_name)

    # metrics
    def new_metrics_state(self) -> AutoState:
        return AutoState()

    def _tag(self, engine: str, samples: list[Any]) -> _Tagged:
        out = _Tagged(samples)
        out.engine = engine
        return out

    def fast_samples(self, text: str, limit: int | None = None) -> list[Any]:
        got = detect.exposition_engine(text)
        engine = got[0] if got else DEFAULT
        out = self._tag(engine, self.adapters[engine].fast_samples(text, limit))
        if got:
            out.why = got[1]  # type: ignore[attr-defined]
        return out

    def samples_from_families(self, families: Any) -> list[Any]:
        fams = list(families)
        got = detect.families_engine(fams)
        engine = got[0] if got else DEFAULT
        out = self._tag(engine, self.adapters[engine].samples_from_families(fams))
        if got:
            out.why = got[1]  # type: ignore[attr-defined]
        return out

    def is_engine_exposition(self, families: list[Any]) -> bool:
        return any(a.is_engine_exposition(families) for a in self.adapters.values())

    def foreign_exposition(self, families: Any) -> str | None:
        if self.adapters["vllm"].is_engine_exposition(families):
            return None
        return self.default.foreign_exposition(families)  # type: ignore[no-any-return]

    def ingest_samples(self, samples: Any, ts: float, sink: SignalSink, state: AutoState, source: str) -> int:
        engine = getattr(samples, "engine", None) or state.engine or DEFAULT
        if state.engine != engine:
            why = getattr(samples, "why", "")
            if engine != DEFAULT or state.engine is not None:
                mark(sink, engine, f"{source}: {why}" if why else source)
            state.why = why
        inner = state.use(engine, self.adapters)
        return int(self.adapters[engine].ingest_samples(list(samples), ts, sink, inner, source))

    def ingest_families(self, families: Any, ts: float, sink: SignalSink, state: AutoState, source: str) -> int:
        return self.ingest_samples(self.samples_from_families(families), ts, sink, state, source)

    def window_quantiles(self, state: AutoState) -> dict[str, float]:
        if state.inner is None:
            return {}
        return self.get(state.engine).window_quantiles(state.inner)  # type: ignore[no-any-return]

    # endpoints
    def ingest_server_info(self, info: dict[str, Any], sink: SignalSink, source: str, version: Any) -> None:
        from diagnoser.engines.vllm.config import is_vllm_server_info

        if is_vllm_server_info(info):
            mark(sink, "vllm", f"{source} holds vllm_config")
            self.adapters["vllm"].ingest_server_info(info, sink, source, version)
            return
        self.default.ingest_server_info(info, sink, source, version)

    def ingest_model_info(self, info: dict[str, Any], sink: SignalSink, source: str) -> None:
        self.default.ingest_model_info(info, sink, source)

    def ingest_models(self, data: dict[str, Any], sink: SignalSink, source: str) -> None:
        from diagnoser.engines.vllm.config import models_owner

        if models_owner(data) == "vllm":
            mark(sink, "vllm", f"{source}: owned_by vllm")
            self.adapters["vllm"].ingest_models(data, sink, source)
            return
        self.default.ingest_models(data, sink, source)

    def ingest_version(self, data: dict[str, Any], sink: SignalSink, source: str, version: Any) -> None:
        """``/version``: vLLM serves it, SGLang does not."""
        if getattr(sink, "engine", DEFAULT) == DEFAULT:
            mark(sink, "vllm", f"{source} answered (SGLang serves no /version)")
        self.adapters["vllm"].ingest_version(data, sink, source, version)

    def ingest_loads(self, data: dict[str, Any], sink: SignalSink, source: str) -> None:
        self.default.ingest_loads(data, sink, source)

    # flags: SGLang's when asked without a timeline (the rules get their timeline's adapter)
    def flag(self, concept: str, version: tuple[int, int, int] | None = None) -> str:
        return str(self.default.flag(concept, version))

    def flag_available(self, concept: str, version: tuple[int, int, int] | None = None) -> bool:
        return bool(self.default.flag_available(concept, version))


ADAPTER = AutoAdapter()
