"""Config source: ``/server_info`` (falling back to ``/get_server_info``, then ``/get_server_args``),
``/model_info`` (or ``/get_model_info``) and ``/v1/loads``. Everything is redacted on ingestion."""

from __future__ import annotations

import time
from typing import Any

from diagnoser.jsonout import loads
from diagnoser.model import InputReport, SignalSink
from diagnoser.redact import redact
from diagnoser.sources.http import Fetched, client_timeout, display_url, too_slow
from diagnoser.sources.http import fetch as _fetch

# the most each answer may hold, after decompression (README: "Bounded input")
SERVER_INFO_MAX_BYTES = 8 * 1024 * 1024
MODEL_INFO_MAX_BYTES = 1024 * 1024  # /model_info and /v1/models
LOADS_MAX_BYTES = 4 * 1024 * 1024


def _json(text: str) -> Any:
    try:
        return loads(text)  # lone surrogates replaced
    except (ValueError, RecursionError):
        return None


def fetch_config(client: Any, base: str, adapter: Any, sink: SignalSink, version: Any,
                 deadline: float | None = None) -> tuple[InputReport, dict[str, Any]]:
    """Fetch what config endpoints exist; returns the input report and the raw (redacted) payloads.
    ``deadline`` (``time.monotonic()``) bounds all the requests together: past it, no further endpoint
    is asked and what was read is kept."""
    report = InputReport(kind="server_info", source=display_url(base))
    raw: dict[str, Any] = {}

    def fetch(client: Any, url: str, max_bytes: int, what: str) -> Any:
        if deadline is None:
            return _fetch(client, url, max_bytes, what)
        if time.monotonic() >= deadline:
            return Fetched(url, False, status=-1, error=too_slow(display_url(base), 0))
        return _fetch(client, url, max_bytes, what, min(deadline, time.monotonic() + client_timeout(client)))

    for path in adapter.server_info_paths:
        f = fetch(client, base + path, SERVER_INFO_MAX_BYTES, "server info")
        if f.ok:
            data = _json(f.text)
            if isinstance(data, dict):
                data = redact(data)
                raw[path] = data
                adapter.ingest_server_info(data, sink, path.lstrip("/"), version)
                report.scrapes += 1
                report.lines_recognized += 1
                break
        elif f.status == 0:  # unreachable: the metrics source reports it; stop here
            report.errors += 1
            return report, raw
        elif f.status in (401, 403):  # the other endpoints will say the same
            report.errors += 1
            report.messages.append(f.error)
            return report, raw
    for path in adapter.model_info_paths:
        f = fetch(client, base + path, MODEL_INFO_MAX_BYTES, "model info")
        if f.ok:
            data = _json(f.text)
            if isinstance(data, dict):
                data = redact(data)
                raw[path] = data
                adapter.ingest_model_info(data, sink, path.lstrip("/"))
                report.scrapes += 1
                break
    models_path = getattr(adapter, "models_path", None)
    if models_path:
        f = fetch(client, base + models_path, MODEL_INFO_MAX_BYTES, "models")
        data = _json(f.text) if f.ok else None
        if isinstance(data, dict):
            raw[models_path] = redact(data)
            adapter.ingest_models(raw[models_path], sink, models_path.lstrip("/"))
            report.scrapes += 1
    version_path = getattr(adapter, "version_path", None)  # vLLM's /version (SGLang's version is in its server info)
    if version_path and not any(p in raw for p in getattr(adapter, "server_info_paths", ()) if p != "/server_info") \
            and not (isinstance(raw.get("/server_info"), dict) and "version" in raw["/server_info"]):
        f = fetch(client, base + version_path, 64 * 1024, "version")
        data = _json(f.text) if f.ok else None
        if isinstance(data, dict) and isinstance(data.get("version"), str):
            raw[version_path] = redact(data)
            adapter.ingest_version(raw[version_path], sink, version_path.lstrip("/"), version)
            report.scrapes += 1
    f = fetch(client, base + adapter.loads_path, LOADS_MAX_BYTES, "loads")
    if f.ok:
        data = _json(f.text)
        if isinstance(data, dict):
            raw[adapter.loads_path] = redact(data)
            if hasattr(adapter, "ingest_loads"):
                adapter.ingest_loads(raw[adapter.loads_path], sink, adapter.loads_path.lstrip("/"))
            report.scrapes += 1
    if not raw:
        report.messages.append(f"{display_url(base)} has no server-info endpoint; config facts come from logs and metrics only.")
    return report, raw
