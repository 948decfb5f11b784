"""The :class:`~diagnoser.engines.sglang.scheduler_model.ServerState` of one target: its config facts,
plus what the signals say that the config does not (a sliding-window pool in use, the prompt length)
and what the user told us about the workload (``--ignore-eos``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from diagnoser.engines.sglang.scheduler_model import ServerState, args_known
from diagnoser.engines.sglang.versions import parse_version
from diagnoser.timeline import Timeline


def _version(tl: Timeline) -> tuple[int, int, int] | None:
    v = tl.meta.get("version_best")
    if v:
        return tuple(v)  # type: ignore[return-value]
    return parse_version(tl.version) if tl.version and tl.version[0].isdigit() else None


def _max(tl: Timeline, signal: str) -> float | None:
    s = tl.get(signal)
    if s is None or not len(s):
        return None
    v = s.values[~np.isnan(s.values)]
    return float(v.max()) if len(v) else None


def prompt_tokens(tl: Timeline, chunk: int | None = None) -> float | None:
    """Mean prompt length (uncached + cached tokens) per request: the finished requests' prompt tokens
    over their count, else the prefill lines' tokens over the requests they admitted. A prompt longer than
    the chunk is admitted once per chunk (each chunk's line counts it in ``#new-seq``), so once a line
    computed a whole chunk the lines no longer tell the prompt length: None."""
    from diagnoser.timeline.derived import window_rate

    p, r = window_rate(tl, "prompt_tps").value, window_rate(tl, "request_rate").value
    if p is not None and r:
        return p / r
    new, cached, seqs = (tl.get(s) for s in ("prefill_new_tokens", "prefill_cached_tokens", "prefill_new_seqs"))
    if new is None or seqs is None:
        return None
    if chunk and len(new) and float(np.nanmax(new.values)) >= 0.98 * chunk:
        return None
    n = float(np.nansum(seqs.values))
    if n <= 0:
        return None
    return (float(np.nansum(new.values)) + (float(np.nansum(cached.values)) if cached is not None else 0.0)) / n


def server_state(tl: Timeline, extras: dict[str, Any] | None = None) -> ServerState:
    s = ServerState.from_config(tl.cfg, _version(tl))
    if s.hybrid_swa is None:
        swa, full = _max(tl, "swa_token_usage"), _max(tl, "full_token_usage")
        if swa is not None and swa > 0:
            s.hybrid_swa = True
        elif swa is not None and full is not None and full > 0.05:
            s.hybrid_swa = False  # every request of a hybrid model also fills its sliding-window pool
    s.prompt_tokens = prompt_tokens(tl, s.chunked_prefill_size if s.chunked_prefill_size and s.chunked_prefill_size > 0 else None)
    ie = (extras or {}).get("ignore_eos")
    if ie is not None:
        s.ignore_eos = bool(ie)
    return s


__all__ = ["args_known", "prompt_tokens", "server_state"]
