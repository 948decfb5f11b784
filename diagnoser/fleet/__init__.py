"""Fleet mode: diagnose many SGLang servers through an existing Prometheus (or Thanos, Mimir,
VictoriaMetrics) instead of scraping each one. ``collect_prometheus`` is called by ``diagnose
--prometheus URL``; see ``source.py`` for the query plan and ``capacity.py`` for the fleet summary."""

from __future__ import annotations

from diagnoser.fleet.source import FleetCollection, collect_prometheus

__all__ = ["FleetCollection", "collect_prometheus"]
