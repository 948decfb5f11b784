"""Version ranges (conflicting hints are reported, not applied) and flag spellings per version."""

from __future__ import annotations

from diagnoser.engines.sglang import flags
from diagnoser.engines.sglang.versions import VersionRange, parse_version


def test_range_narrows_and_reports_conflicts() -> None:
    vr = VersionRange()
    vr.at_most((0, 4, 3), "no engine_type label")
    vr.at_least((0, 3, 5), "metrics exist")
    vr.at_least((0, 5, 13), "spec_num_steps")  # contradicts: reported, not applied
    assert vr.text() == ">=0.3.5,<=0.4.3"
    assert vr.conflicts == [">= 0.5.13: spec_num_steps"]
    assert vr.best() == (0, 4, 3)
    other = VersionRange()
    other.set_exact((0, 4, 1), "server info")
    vr.merge(other)
    assert vr.text() == "0.4.1" and vr.best() == (0, 4, 1)


def test_parse_version() -> None:
    assert parse_version("0.5.23") == (0, 5, 23)
    assert parse_version("v0.3.5.post1") == (0, 3, 5)
    assert parse_version("0.4") == (0, 4, 0)
    assert parse_version(None) is None and parse_version("dev") is None


def test_flag_spellings_follow_the_version() -> None:
    assert flags.spelling("cuda_graph_max_bs", (0, 5, 13)) == "--cuda-graph-max-bs"
    assert flags.spelling("cuda_graph_max_bs", (0, 5, 14)) == "--cuda-graph-max-bs-decode"
    assert flags.spelling("cuda_graph_max_bs") == "--cuda-graph-max-bs-decode"  # unknown → newest
    assert flags.spelling("dp_attention", (0, 5, 21)) == "--enable-dp-attention"
    assert flags.spelling("dp_attention", (0, 5, 22)) == "--attn-dp-size"
    off = flags.flag("disable_cuda_graph", (0, 5, 20))
    assert off.flag == "--cuda-graph-backend-decode" and off.value_form == "disabled"
    assert flags.spelling("disable_cuda_graph", (0, 4, 9)) == "--disable-cuda-graph"


def test_flag_availability() -> None:
    assert not flags.available("hicache_size", (0, 4, 5)) and flags.available("hicache_size", (0, 4, 6))
    assert not flags.available("hierarchical_cache", (0, 4, 2))
    assert not flags.available("dp_attention", (0, 3, 5))
    assert flags.available("mem_fraction_static", (0, 3, 0)) and flags.available("hicache_size", None)
