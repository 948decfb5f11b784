"""vLLM versions: the range type is the one the SGLang adapter defines (it is engine-neutral: a low/high
bound narrowed by hints, or an exact version), so the collection layer merges either engine's evidence
the same way. vLLM's own bounds come from its startup lines, ``/version`` and metric names."""

from __future__ import annotations

from diagnoser.engines.sglang.versions import Version, VersionRange, fmt, parse_version

NEWEST_KNOWN: Version = (0, 33, 0)

__all__ = ["NEWEST_KNOWN", "Version", "VersionRange", "fmt", "parse_version"]
