"""Engine adapters: SGLang and vLLM, and ``auto``, which picks one per input (:mod:`diagnoser.engines.auto`).
The rules read canonical signals only; an adapter maps an engine's names and formats into them."""

from __future__ import annotations

from typing import Any

ENGINES = ("auto", "sglang", "vllm")


def get_adapter(name: str = "sglang") -> Any:
    if name == "sglang":
        from diagnoser.engines.sglang import ADAPTER

        return ADAPTER
    if name == "vllm":
        from diagnoser.engines.vllm import ADAPTER as VLLM

        return VLLM
    if name == "auto":
        from diagnoser.engines.auto import AutoAdapter

        return AutoAdapter()
    raise ValueError(f"unknown engine {name!r}; supported: {', '.join(ENGINES)}")
