"""Config source: /server_info → /get_server_info → /get_server_args, /model_info or /get_model_info,
/v1/loads; each value keeps its source. Payloads are the real /get_server_info and /get_model_info of
the five cpu-real SGLang 0.5.23 runs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from diagnoser.engines.sglang import ADAPTER
from diagnoser.engines.sglang.versions import VersionRange
from diagnoser.sources.http import make_client
from diagnoser.sources.serverinfo import fetch_config
from diagnoser.timeline import Timeline
from tests.conftest import DATA

CPU_REAL = DATA / "sglang-cpu-real"
# run → (effective max running requests, KV pool tokens, chunked prefill size) from each run's README/flags
EXPECTED = {
    "client-bound-low-occupancy": (64, 65536, 4096),
    "kv-full-retract": (64, 2048, 4096),
    "long-queue": (4, 65536, 4096),
    "medium-engine-bound-kv-full": (16, 2048, 4096),
    "prefill-capped": (64, 65536, 128),
}


def fetch(routes: dict[str, bytes]) -> tuple[Timeline, VersionRange, object, dict, list[str]]:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        body = routes.get(request.url.path)
        if body is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    tl, vr = Timeline(target="t"), VersionRange()
    with make_client(transport=httpx.MockTransport(handler)) as c:
        rep, raw = fetch_config(c, "http://127.0.0.1:30000", ADAPTER, tl, vr)
    return tl, vr, rep, raw, asked


@pytest.mark.parametrize("run", sorted(EXPECTED))
def test_real_server_info_facts(run: str, data_dir: Path) -> None:
    info = (CPU_REAL / run / "get_server_info.json").read_bytes()
    model = (CPU_REAL / run / "get_model_info.json").read_bytes()
    models = (CPU_REAL / run / "v1_models.json").read_bytes()
    tl, vr, rep, raw, asked = fetch({"/get_server_info": info, "/get_model_info": model, "/v1/models": models})
    mrr, pool, chunk = EXPECTED[run]
    # the fallback order of docs/sglang.md#endpoints: /server_info first, then /get_server_info
    assert asked[:2] == ["/server_info", "/get_server_info"] and "/get_server_args" not in asked
    assert asked[2:5] == ["/model_info", "/get_model_info", "/v1/models"] and "/v1/loads" in asked
    assert tl.cfg("max_running_requests") == mrr
    assert tl.cfg_source("max_running_requests") == "get_server_info internal_states[0].effective_max_running_requests_per_dp"
    assert tl.cfg("max_total_tokens") == pool
    assert tl.cfg("chunked_prefill_size") == chunk
    assert tl.cfg_source("chunked_prefill_size") == "get_server_info chunked_prefill_size"
    assert tl.cfg("max_prefill_tokens") == (128 if run == "prefill-capped" else 16384)
    # auto value: the reserve grows with chunked_prefill_size (docs/sglang.md#mem-fraction-default), so the 128-token run differs
    assert tl.cfg("mem_fraction_static") == pytest.approx(0.843 if run == "prefill-capped" else 0.716)
    assert tl.cfg("page_size") == 1 and tl.cfg("tp_size") == 1 and tl.cfg("dp_size") == 1
    assert tl.cfg("dp_attention") is False
    assert tl.cfg("kv_cache_dtype") == "auto"
    assert tl.cfg("hicache") is False and tl.cfg("hicache_ratio") == 2.0
    assert tl.cfg("cuda_graph_max_bs") == 32 and tl.cfg_source("cuda_graph_max_bs").endswith("cuda_graph_config.decode.max_bs")
    assert tl.cfg("cuda_graph_disabled") is True  # CPU run: decode backend "disabled"
    assert tl.cfg("speculative") is False
    assert tl.cfg("schedule_conservativeness") == 1.0
    assert tl.cfg("version") == "0.5.23" and vr.text() == "0.5.23"
    # context_length is null in server info (the model's own length): /v1/models gives it
    assert tl.cfg("context_len") == 2048 and tl.cfg_source("context_len") == "v1/models data[0].max_model_len"
    assert tl.cfg("model.served_model_name") == "tiny-llama" and tl.cfg("model.architectures") == ["LlamaForCausalLM"]
    assert rep.scrapes == 3 and rep.errors == 0
    assert set(raw) == {"/get_server_info", "/get_model_info", "/v1/models"}


def test_server_info_preferred_and_old_get_server_args(data_dir: Path) -> None:
    info = json.loads((CPU_REAL / "long-queue" / "get_server_info.json").read_text())
    tl, _, _, _, asked = fetch({"/server_info": json.dumps(info).encode()})
    assert asked[0] == "/server_info" and "/get_server_info" not in asked
    assert tl.cfg_source("chunked_prefill_size") == "server_info chunked_prefill_size"
    # a 0.3.x server: only /get_server_args, the bare argument dict (no version, no internal states)
    args = {k: v for k, v in info.items() if not isinstance(v, dict | list) and k != "version"}
    tl, vr, rep, _, asked = fetch({"/get_server_args": json.dumps(args).encode()})
    assert asked[:3] == ["/server_info", "/get_server_info", "/get_server_args"]
    assert tl.cfg("max_running_requests") == 4 and tl.cfg_source("max_running_requests") == "get_server_args max_running_requests"
    assert tl.cfg("version") is None and not vr.known


def test_v1_loads_fills_gaps_only(data_dir: Path) -> None:
    info = (CPU_REAL / "long-queue" / "get_server_info.json").read_bytes()
    loads = {"timestamp": 1.0, "version": "0.5.23", "accelerator": "NVIDIA H100 80GB HBM3", "num_accelerators": 2,
             "loads": [{"dp_rank": 0, "max_running_requests": 99, "max_total_num_tokens": 123},
                       {"dp_rank": 1, "max_running_requests": 99, "max_total_num_tokens": 123}]}
    tl, *_ = fetch({"/get_server_info": info, "/v1/loads": json.dumps(loads).encode()})
    assert tl.cfg("accelerator") == "NVIDIA H100 80GB HBM3" and tl.cfg_source("accelerator") == "v1/loads accelerator"
    assert tl.cfg("max_running_requests") == 4  # server info's effective value wins
    tl, *_ = fetch({"/v1/loads": json.dumps(loads).encode()})
    assert tl.cfg("max_running_requests") == 198 and tl.cfg_source("max_running_requests") == "v1/loads loads[*].max_running_requests"


def test_no_endpoint_and_bad_json() -> None:
    tl, _, rep, raw, _ = fetch({"/server_info": b"<html>not json</html>"})
    assert not raw and not tl.config and rep.scrapes == 0
    assert any("no server-info endpoint" in m for m in rep.messages)


def test_dp_ranks_effective_max_running_sum(data_dir: Path) -> None:
    info = json.loads((CPU_REAL / "long-queue" / "get_server_info.json").read_text())
    info["dp_size"] = 2
    info["enable_dp_attention"] = True
    info["internal_states"] = [info["internal_states"][0], dict(info["internal_states"][0])]
    tl, *_ = fetch({"/server_info": json.dumps(info).encode()})
    assert tl.cfg("max_running_requests") == 8 and tl.cfg("max_running_requests_per_dp") == 4
    assert tl.cfg("dp_attention") is True and tl.cfg("dp_ranks_reporting") == 2
