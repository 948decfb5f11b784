"""The GPU table and SGLang's automatic --mem-fraction-static, by hand from SGLang v0.5.23's
``handle_gpu_memory_settings`` and against the fractions a real SGLang 0.5.23 engine chose (tests/data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.capacity.gpus import auto_mem_fraction, find_gpu, prefill_graph_sizes
from diagnoser.capacity.kvbytes import CapacityInputError


def test_gpu_names_and_aliases() -> None:
    assert find_gpu("h100").usable_mib == 81559
    assert find_gpu("H100 SXM").name == "H100"
    assert find_gpu("a100_80gb").name == "A100-80GB"
    assert find_gpu("MI300X").platform == "rocm"
    with pytest.raises(CapacityInputError, match="unknown --gpu 'TPU-v5'.*H200.*--gpu-mem-gb") as e:
        find_gpu("TPU-v5")
    assert "\n" not in str(e.value)


def test_prefill_graph_count_matches_a_real_capture() -> None:
    """The Qwen3-8B start-up (chunk 16384) captured 74 prefill graphs: 'Capturing num tokens … 74/74'."""
    assert prefill_graph_sizes(16384) == 74
    assert prefill_graph_sizes(8192) == 58


def test_h100_tp1_by_hand() -> None:
    """80 GB class (< 90 GiB): chunk 8192, decode graphs up to 256 (TP < 4), 58 prefill graphs of 8 MiB."""
    reserved = 512 + 1.5 * 8192 + 1024 * 1 / 8 + 2 * 256 + 8 * 58
    a = auto_mem_fraction(81559, tp=1)
    assert a.reserved_mib == reserved == 13904
    assert a.fraction == round((81559 - reserved) / 81559, 3) == 0.83
    assert (a.chunked_prefill_size, a.cuda_graph_max_bs) == (8192, 256)


def test_h200_tp8_mla_by_hand() -> None:
    """TP 8 on 141 GB: decode graphs up to 512, MLA prefill graphs reserve 1.5 GiB, TP adds 1 GiB."""
    reserved = 512 + 1.5 * 8192 + 1024 * 8 / 8 + 2 * 512 + 1536
    a = auto_mem_fraction(143771, tp=8, mla=True)
    assert a.fraction == round((143771 - reserved) / 143771, 3) == 0.886
    dp = auto_mem_fraction(143771, tp=8, mla=True, attn_dp=8)  # DP attention pads: 3 × bs × dp, 1.5 × more above bs 300
    assert dp.reserved_mib == reserved + 512 * 8 * 3 + 512 * 8 * 1.5


def test_the_10_gib_floor_and_small_gpus() -> None:
    assert auto_mem_fraction(81559, tp=1, chunked_prefill_size=2048).reserved_mib == 10 * 1024  # 4,560 MiB → the floor
    a40 = auto_mem_fraction(40960, tp=1)  # < 60 GiB: chunk 4096, bs 32, no floor
    assert a40.reserved_mib == 512 + 1.5 * 4096 + 128 + 2 * 32 + 8 * 50
    rocm = auto_mem_fraction(196592, tp=8, platform="rocm")  # no prefill graphs by default off CUDA
    assert rocm.reserved_mib == 512 + 1.5 * 16384 + 1024 + 2 * 512


def test_older_versions() -> None:
    assert auto_mem_fraction(81559, 1, (0, 5, 2)).fraction == round((81559 / 1024 - 10) / (81559 / 1024), 3)
    assert auto_mem_fraction(81559, 8, (0, 4, 0)).fraction == 0.81
    assert auto_mem_fraction(81559, 8, (0, 3, 6)).fraction == 0.82
    assert auto_mem_fraction(143771, 1, (0, 4, 7)).fraction == round((143771 / 1024 - 13) / (143771 / 1024), 3)
    assert auto_mem_fraction(81559, 1, (0, 5, 8)).reserved_mib == 512 + 1.5 * 8192 + 128 + 2 * 256  # no graph reserve yet


@pytest.mark.parametrize(("run", "chunk"), [("kv-full-retract", None), ("medium-engine-bound-kv-full", None), ("prefill-capped", 128)])
def test_the_real_engine_fraction_on_cpu(data_dir: Path, run: str, chunk: int | None) -> None:
    """SGLang 0.5.23 on CPU sizes by the host's RAM (psutil total: 24,105 MiB on the 2-core, 24 GiB machines
    these runs were recorded on) with graph capture off: 512 + 1.5 × max(chunk, 2048) + 128 + 2 × 32 MiB.
    One memory figure gives both recorded fractions (0.716 at chunk 4096 and 0.843 at chunk 128)."""
    info = json.loads((data_dir / "sglang-cpu-real" / run / "get_server_info.json").read_text())
    assert info["chunked_prefill_size"] == (chunk or 4096)
    a = auto_mem_fraction(24105, 1, (0, 5, 23), platform="cpu", chunked_prefill_size=chunk)
    assert a.fraction == info["mem_fraction_static"]
