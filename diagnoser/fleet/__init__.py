"""Fleet mode: diagnose many SGLang servers through an existing Prometheus (or Thanos, Mimir,
VictoriaMetrics) instead of scraping each one. ``collect_prometheus`` is called by ``diagnose
--prometheus URL``; see ``source.py`` for the query plan and ``capacity.py`` for the fleet summary.

The names are imported lazily: the fleet rules import ``diagnoser.fleet.capacity`` on every run, and
must not pull in the HTTP client (httpx) on the ``diagnose --once --log`` start-up path."""

from __future__ import annotations

from typing import Any

__all__ = ["FleetCollection", "collect_prometheus"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from diagnoser.fleet import source

        return getattr(source, name)
    raise AttributeError(f"module 'diagnoser.fleet' has no attribute {name!r}")
