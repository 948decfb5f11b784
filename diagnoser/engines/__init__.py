"""Engine adapters. Only SGLang today; vLLM can be added as another adapter without touching the rules."""

from __future__ import annotations

from typing import Any


def get_adapter(name: str = "sglang") -> Any:
    if name == "sglang":
        from diagnoser.engines.sglang import ADAPTER

        return ADAPTER
    raise ValueError(f"unknown engine {name!r}; supported: sglang")
