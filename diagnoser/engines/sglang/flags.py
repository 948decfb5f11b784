"""Flag spellings per SGLang version (docs/sglang.md#flags, docs/sglang.md#flag-spellings). Rules ask for a concept; this answers the spelling.

Examples: ``--cuda-graph-max-bs`` (0.3.5–0.5.13; a deprecated alias 0.5.14–0.5.19, removed 0.5.20) vs
``--cuda-graph-max-bs-decode`` (0.5.14+); ``--enable-dp-attention`` (0.3.6+, deprecated 0.5.22) vs
``--attn-dp-size N`` (0.5.22+); ``--disable-cuda-graph`` vs ``--cuda-graph-backend-decode=disabled``
(0.5.14+); ``--enable-hierarchical-cache`` (0.4.3+).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnoser.engines.sglang.versions import NEWEST_KNOWN, Version, fmt


@dataclass(frozen=True, slots=True)
class FlagSpelling:
    flag: str
    value_form: str  # how the value is written: "N", "F", "", "=disabled"…
    note: str = ""


def _v(version: Version | None) -> Version:
    return version or NEWEST_KNOWN


def flag(concept: str, version: Version | None = None) -> FlagSpelling:
    """The spelling of a concept's flag for a version (unknown → the newest known)."""
    v = _v(version)
    if concept == "cuda_graph_max_bs":
        if v >= (0, 5, 14):
            return FlagSpelling("--cuda-graph-max-bs-decode", "N", "--cuda-graph-max-bs is gone from 0.5.20")
        return FlagSpelling("--cuda-graph-max-bs", "N")
    if concept == "disable_cuda_graph":
        if v >= (0, 5, 14):
            return FlagSpelling("--cuda-graph-backend-decode", "disabled", "--disable-cuda-graph is deprecated from 0.5.14")
        return FlagSpelling("--disable-cuda-graph", "")
    if concept == "enable_cuda_graph":
        if v >= (0, 5, 14):
            return FlagSpelling("--cuda-graph-backend-decode", "<backend>", "remove '--cuda-graph-backend-decode=disabled'")
        return FlagSpelling("--disable-cuda-graph", "", "remove --disable-cuda-graph")
    if concept == "dp_attention":
        if v >= (0, 5, 22):
            return FlagSpelling("--attn-dp-size", "N", "replaces --dp-size N --enable-dp-attention (0.5.22+)")
        return FlagSpelling("--enable-dp-attention", "", "with --dp-size N")
    if concept == "hierarchical_cache":
        return FlagSpelling("--enable-hierarchical-cache", "")
    if concept == "prefill_graph_max_tokens":  # the token cap of prefill (piecewise) CUDA graphs
        if v >= (0, 5, 14):
            return FlagSpelling("--cuda-graph-max-bs-prefill", "N", "prefill graphs replaced piecewise graphs in 0.5.14")
        return FlagSpelling("--piecewise-cuda-graph-max-tokens", "N", "with --enable-piecewise-cuda-graph (0.5.6-0.5.13)")
    simple = {
        "mem_fraction_static": "--mem-fraction-static",
        "max_running_requests": "--max-running-requests",
        "max_queued_requests": "--max-queued-requests",
        "chunked_prefill_size": "--chunked-prefill-size",
        "max_prefill_tokens": "--max-prefill-tokens",
        "schedule_conservativeness": "--schedule-conservativeness",
        "kv_cache_dtype": "--kv-cache-dtype",
        "context_length": "--context-length",
        "tp_size": "--tp-size",
        "dp_size": "--dp-size",
        "hicache_size": "--hicache-size",
        "hicache_ratio": "--hicache-ratio",
        "enable_mixed_chunk": "--enable-mixed-chunk",
        "speculative_num_steps": "--speculative-num-steps",
        "speculative_eagle_topk": "--speculative-eagle-topk",
        "speculative_num_draft_tokens": "--speculative-num-draft-tokens",
        "swa_full_tokens_ratio": "--swa-full-tokens-ratio",
        "page_size": "--page-size",
        "disable_radix_cache": "--disable-radix-cache",
        "cuda_graph_bs": "--cuda-graph-bs",
        "enable_metrics": "--enable-metrics",
        "max_total_tokens": "--max-total-tokens",
        "decode_log_interval": "--decode-log-interval",
        "allow_auto_truncate": "--allow-auto-truncate",
        "disaggregation_ib_device": "--disaggregation-ib-device",
        "disaggregation_transfer_backend": "--disaggregation-transfer-backend",
    }
    if concept in simple:
        return FlagSpelling(simple[concept], "")
    raise KeyError(f"unknown flag concept {concept!r}")


def spelling(concept: str, version: Version | None = None) -> str:
    return flag(concept, version).flag


def version_note(version: Version | None) -> str:
    return f"spelling for SGLang {fmt(version)}" if version else f"spelling for SGLang {fmt(NEWEST_KNOWN)} (version unknown)"


# first release that has the flag (docs/sglang.md#flags); a suggestion must not name a flag the server lacks
SINCE: dict[str, Version] = {
    "enable_metrics": (0, 3, 5),
    "decode_log_interval": (0, 3, 5),
    "cuda_graph_max_bs": (0, 3, 5),
    "dp_attention": (0, 3, 6),
    "hierarchical_cache": (0, 4, 3),
    "hicache_ratio": (0, 4, 5),
    "hicache_size": (0, 4, 6),
    "cpu_offload_gb": (0, 4, 0),
}


def available(concept: str, version: Version | None = None) -> bool:
    """False when the detected version predates the flag (unknown versions count as the newest), or when
    that release's ServerArgs (the catalogue) has no such setting under any spelling."""
    since = SINCE.get(concept)
    if since is not None and _v(version) < since:
        return False
    if version is None:
        return True
    sp = spelling(concept, version)
    return not known_flag(sp) or respell(sp, version) is not None



# -- the catalogue: every release's own ServerArgs (diagnoser/engines/sglang/catalogue, docs/catalogue.md) ----------
@dataclass(frozen=True, slots=True)
class ReleaseFlag:
    """A CLI flag as one SGLang release has it: its ServerArgs field, default, and whether that release
    marks the spelling deprecated (``type`` is in the catalogue's server_args.json.gz, not read here)."""

    flag: str
    field: str | None
    type: str | None
    default: Any
    deprecated: bool
    release: str


def _rows_at(version: Version | None) -> tuple[str, list[tuple[str, str | None, bool, Any]]]:
    from diagnoser.engines.sglang import catalogue

    idx = catalogue.indices_for(version)[-1]
    rows = [(f, fld, dep, d) for f, fld, dep, d, rng in catalogue.flag_rows() if any(a <= idx <= b for a, b in rng)]
    return catalogue.releases()[idx], rows


def at_release(flag_name: str, version: Version | None = None) -> ReleaseFlag | None:
    """The flag as the release of ``version`` has it (the newest release when None), from the catalogue;
    None when that release has no such flag."""
    rel, rows = _rows_at(version)
    for f, fld, dep, default in rows:
        if f == flag_name:
            return ReleaseFlag(flag_name, fld, None, default, dep, rel)
    return None


def _field_of(flag_name: str) -> str | None:
    """The ServerArgs field a flag sets, in any release (its newest)."""
    from diagnoser.engines.sglang import catalogue

    best: tuple[int, str] | None = None
    for f, fld, _dep, _d, rng in catalogue.flag_rows():
        if f == flag_name and fld and (best is None or rng[-1][1] > best[0]):
            best = (rng[-1][1], fld)
    return best[1] if best else None


def respell(flag_name: str, version: Version | None = None) -> ReleaseFlag | None:
    """The flag as a release spells it: itself when the release has it, else the release's spelling of the
    same ServerArgs field (a rename), else None (the release has no such setting)."""
    here = at_release(flag_name, version)
    if here is not None:
        return here
    field_name = _field_of(flag_name)
    if field_name is None:
        return None
    rel, rows = _rows_at(version)
    same = [r for r in rows if r[1] == field_name]
    if not same:
        return None
    f, fld, dep, default = next((r for r in same if not r[2]), same[0])
    return ReleaseFlag(f, fld, None, default, dep, rel)


def known_flag(flag_name: str) -> bool:
    """True when some release in the catalogue has the flag (a flag of a newer SGLang than the catalogue,
    or not SGLang's, is not judged)."""
    from diagnoser.engines.sglang import catalogue

    return any(r[0] == flag_name for r in catalogue.flag_rows())
