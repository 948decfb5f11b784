"""Replay recorded inputs through the same pipeline as a live run.

Two kinds of input are accepted everywhere (``diagnose --once --replay``, ``serve --replay``,
``replay-server``):

* a **bundle** written by ``diagnose record`` (see :mod:`diagnoser.bundle`, docs/bundle-format.md);
* a **directory** laid out like a recorded run: ``server.log``, ``metrics/*_<epoch>.prom`` (one raw
  scrape per file, the epoch in the name is its time), ``get_server_info.json`` /
  ``server_info.json``, ``get_model_info.json`` / ``model_info.json``, ``v1_loads.json``. A case
  folder with only ``server.log`` (or only ``metrics/``) works too.

Every scrape goes through :meth:`diagnoser.sources.metrics.MetricsTarget.ingest_text` with its
recorded timestamp, every log line through the engine's log parser via
:class:`diagnoser.sources.logs.LogReader`, server info through the adapter's ``ingest_*`` calls in
the order ``fetch_config`` uses — so the findings equal those of the live run over the same window.

API:
    collect_replay(path, adapter) -> Collection        the whole recording at once (``--once``)
    load_source(path) -> ReplaySource                  records in time order (+ problems)
    ReplayFeed(path, speed=1.0, loop=False)             records due by wall time (``serve --replay``)
    ReplayIngest(adapter, source)                       apply records one by one; .collection()
    write_source(source, path, every=1)                 write any recording as a clean bundle

Modules: ``source`` (bundles and directories as records), ``ingest`` (the live ingestion path),
``feed`` (wall-time playback).
"""

from __future__ import annotations

from diagnoser.bundle import BundleError
from diagnoser.replay.feed import ReplayFeed
from diagnoser.replay.ingest import ReplayIngest, collect_replay
from diagnoser.replay.source import (
    CONFIG_FILES,
    LOG_FILES,
    ReplaySource,
    line_time,
    load_source,
    write_source,
)

__all__ = ["BundleError", "CONFIG_FILES", "LOG_FILES", "ReplaySource", "ReplayFeed", "ReplayIngest", "collect_replay",
           "line_time", "load_source", "write_source"]
