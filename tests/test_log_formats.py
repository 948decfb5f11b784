"""Every log-line format that SGLang printed (docs/sglang.md), at every version, read to the right values.

Each case is one line. ``src`` names where it comes from: a file under tests/data (the line is used
verbatim, and ``test_real_lines_are_verbatim`` proves it is in that file), or ``docs/sglang.md#… format``
when SGLang's source gives only the format for that release and the line was built from it.
Each case asserts the values read, the config facts, the events and the version range the shape implies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagnoser.engines.sglang.logs import SGLangLogParser
from diagnoser.timeline import Timeline

# fmt: off
CASES: list[dict[str, Any]] = [
    # ---- docs/sglang.md#decode-line decode lines -------------------------------------------------------------------------
    dict(id="decode-0.3-docs", src="sglang/logs/log_lines_quoted_in_docs.log",
         line="Decode batch. #running-req: 233, #token: 370959, token usage: 0.82, gen throughput (token/s): 4594.01, #queue-req: 417",
         sig={"running_reqs": 233, "used_tokens": 370959, "token_usage": 0.82, "gen_throughput_tps": 4594.01, "queue_reqs": 417},
         ver="<=0.4.9"),
    dict(id="decode-0.4.9-docs-cuda-graph", src="sglang/logs/log_lines_quoted_in_docs.log",
         line="Decode batch. #running-req: 233, #token: 370959, token usage: 0.82, cuda graph: True, gen throughput (token/s): 4594.01, #queue-req: 317",
         sig={"running_reqs": 233, "queue_reqs": 317, "cuda_graph": 1.0}, ver=">=0.4.7,<=0.4.9"),
    dict(id="decode-0.1-no-header", src="sglang/logs/lines_from_issue_threads.txt",
         line="#running-req: 5, #token: 1938, token usage: 0.24, #queue-req: 0",
         sig={"running_reqs": 5, "used_tokens": 1938, "token_usage": 0.24, "queue_reqs": 0}, ver="<=0.2.99"),
    dict(id="decode-0.4.8-lmcache", src="sglang/logs/lines_from_issue_threads.txt",
         line="[2025-06-26 02:16:20 TP0] Decode batch. #running-req: 1, #token: 2102, token usage: 0.51, cuda graph: True, gen throughput (token/s): 93.51, #queue-req: 0",
         sig={"running_reqs": 1, "used_tokens": 2102, "token_usage": 0.51, "cuda_graph": 1.0, "gen_throughput_tps": 93.51}, ver=">=0.4.7,<=0.4.9"),
    dict(id="decode-0.4.2-accept-len", src="docs/sglang.md#decode-line format (v0.4.2-0.4.3)",
         line="[2025-01-10 10:00:00 TP0] Decode batch. #running-req: 16, #token: 9000, token usage: 0.20, accept len: 2.75, gen throughput (token/s): 950.00, #queue-req: 2",
         sig={"spec_accept_len": 2.75, "running_reqs": 16}, ver=">=0.4.2,<=0.4.9"),
    dict(id="decode-0.4.4-largest-len", src="docs/sglang.md#decode-line format (v0.4.4)",
         line="[2025-03-01 10:00:00 TP0] Decode batch. #running-req: 12, #token: 5000, token usage: 0.30, accept len: 2.50, gen throughput (token/s): 800.00, largest-len: 1024, #queue-req: 3, ",
         sig={"running_reqs": 12, "queue_reqs": 3, "spec_accept_len": 2.5}, ver="0.4.4"),
    dict(id="decode-0.4.6-pd-preallocated", src="docs/sglang.md#decode-line format (v0.4.6)",
         line="[2025-05-01 10:00:00 TP0] Decode batch. #running-req: 20, #token: 30000, token usage: 0.40, pre-allocated usage: 0.20, gen throughput (token/s): 700.00, #queue-req: 0",
         sig={"running_reqs": 20, "token_usage": 0.4}, ver=">=0.4.6,<=0.4.9"),
    dict(id="decode-0.4.6-mtp-dp", src="cases/010-sglang-pr6081-mtp-dp-attention-healthy/server.log",
         line="[2025-05-31 18:31:21 DP6 TP6] Decode batch. #running-req: 8, #token: 36267, token usage: 0.12, accept len: 2.86, cuda graph: True, gen throughput (token/s): 168.28, #queue-req: 0",
         sig={("running_reqs", "dp6"): 8, ("spec_accept_len", "dp6"): 2.86}, ver=">=0.4.7,<=0.4.9"),
    dict(id="decode-0.4.8-pd-retracted", src="docs/sglang.md#decode-line format (v0.4.8-0.4.9)",
         line="[2025-07-01 10:00:00 TP0] Decode batch. #running-req: 20, #token: 30000, token usage: 0.40, pre-allocated usage: 0.10, #retracted-req: 1, cuda graph: True, gen throughput (token/s): 700.00, #queue-req: 0",
         sig={"running_reqs": 20}, ver=">=0.4.8,<=0.4.9"),
    dict(id="decode-0.4.10-hybrid-swa-trailing", src="docs/sglang.md#decode-line format (v0.4.10-0.5.2)",
         line="[2025-08-20 10:00:00 TP0] Decode batch. #running-req: 4, #full token: 100, full token usage: 0.50, #swa token: 10, swa token usage: 0.10, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0, ",
         sig={"used_tokens": 100, "full_token_usage": 0.5, "swa_token_usage": 0.1, "token_usage": 0.5}, ver=">=0.4.10,<=0.5.3"),
    dict(id="decode-0.5.2-cpu-graph", src="docs/sglang.md#decode-line format (v0.5.2)",
         line="[2025-09-20 10:00:00] Decode batch. #running-req: 2, #token: 300, token usage: 0.05, cpu graph: False, gen throughput (token/s): 25.00, #queue-req: 0, ",
         sig={"cuda_graph": 0.0, "gen_throughput_tps": 25.0}, ver=">=0.5.2,<=0.5.3"),
    dict(id="decode-0.5.3-pd", src="docs/sglang.md#decode-line format (v0.5.3)",
         line="[2025-10-01 10:00:00 TP0] Decode batch. #running-req: 10, #token: 4000, token usage: 0.90, pre-allocated usage: 0.51, #prealloc-req: 1, #transfer-req: 12, #retracted-req: 0, cuda graph: True, gen throughput (token/s): 259.82, #queue-req: 0, ",
         sig={"running_reqs": 10, "token_usage": 0.9}, ver="0.5.3"),
    dict(id="decode-0.5.4-eagle-dev", src="cases/012-sglang-11948-eagle3-low-accept-len/server.log",
         line="[2025-10-22 10:27:57 TP0] Decode batch. #running-req: 1, #token: 108, token usage: 0.00, accept len: 2.17, accept rate: 0.54, cuda graph: True, gen throughput (token/s): 0.39, #queue-req: 0, ",
         sig={"spec_accept_len": 2.17, "spec_accept_rate": 0.54, "gen_throughput_tps": 0.39}, ver=">=0.5.3,<=0.5.4"),
    dict(id="decode-0.5.4-iter-mamba", src="docs/sglang.md#decode-line format (v0.5.4)",
         line="[2025-10-25 10:00:00 TP0] Decode batch [77], #running-req: 3, #full token: 100, full token usage: 0.40, mamba num: 3, mamba usage: 0.20, accept len: 3.10, accept rate: 0.70, cuda graph: True, gen throughput (token/s): 99.00, #queue-req: 0, ",
         sig={"mamba_usage": 0.2, "token_usage": 0.4, "spec_accept_rate": 0.7}, ver=">=0.5.4,<=0.5.8"),
    dict(id="decode-0.5.5-ray", src="sglang/logs/log_decode_lines_test_log_parser_2025-11.log",
         line="(SGLangEngine pid=35555) [2025-10-31 03:45:20 TP0] Decode batch [51341], #running-req: 317, #token: 1094261, token usage: 0.67, cuda graph: True, gen throughput (token/s): 14806.57, #queue-req: 0,",
         sig={"running_reqs": 317, "used_tokens": 1094261, "token_usage": 0.67, "gen_throughput_tps": 14806.57}, ver=">=0.5.4,<=0.5.8"),
    dict(id="decode-0.5.5-ray-ip", src="sglang/logs/log_decode_lines_test_log_parser_2025-11.log",
         line="(SGLangEngine pid=111711, ip=10.15.36.1) [2025-10-31 03:45:20 TP0] Decode batch [39913], #running-req: 78, #token: 432100, token usage: 0.27, cuda graph: True, gen throughput (token/s): 7269.16, #queue-req: 0,",
         sig={"running_reqs": 78, "gen_throughput_tps": 7269.16}, ver=">=0.5.4,<=0.5.8"),
    dict(id="decode-0.5.5-dp-tp-ep", src="sglang/logs/log_decode_lines_test_log_parser_2025-11.log",
         line="[2025-11-03 14:31:10 DP6 TP6 EP6] Decode batch, #running-req: 251, #token: 2811200, token usage: 1.00, cuda graph: True, gen throughput (token/s): 2055.94, #queue-req: 655,",
         sig={("running_reqs", "dp6"): 251, ("queue_reqs", "dp6"): 655, ("token_usage", "dp6"): 1.0}, ver=">=0.5.5,<=0.5.8"),
    dict(id="decode-0.5.5-untagged-trailing", src="cases/009-sglang-pr13023-cuda-graph-off-above-max-bs/server.log",
         line="[2025-11-11 04:06:27] Decode batch, #running-req: 46, #token: 34901, token usage: 0.19, cuda graph: False, gen throughput (token/s): 1447.08, #queue-req: 0, ",
         sig={"running_reqs": 46, "cuda_graph": 0.0}, ver=">=0.5.5,<=0.5.8"),
    dict(id="decode-0.5.9-npu-pd", src="sglang/logs/log_lines_quoted_in_docs.log",
         line="[2026-04-07 13:24:13 TP0] Decode batch, #running-req: 10, #token: 485248, token usage: 0.94, pre-allocated usage: 0.51, #prealloc-req: 1, #transfer-req: 12, #retracted-req: 0, npu graph: True, gen throughput (token/s): 259.82, #queue-req: 0",
         sig={"running_reqs": 10, "used_tokens": 485248, "token_usage": 0.94, "cuda_graph": 1.0, "gen_throughput_tps": 259.82, "queue_reqs": 0}, ver=">=0.5.9"),
    dict(id="decode-0.5.9-hybrid-swa", src="sglang/logs/lines_from_issue_threads.txt",
         line="[2026-05-24 03:51:45 TP0] Decode batch, #running-req: 4, #full token: 2642688, full token usage: 1.00, #swa token: 14592, swa token usage: 0.06, cuda graph: True, gen throughput (token/s): 429.52, #queue-req: 3",
         sig={"running_reqs": 4, "used_tokens": 2642688, "full_token_usage": 1.0, "swa_token_usage": 0.06, "token_usage": 1.0, "queue_reqs": 3}, ver=">=0.5.9"),
    dict(id="decode-0.5.23-cpu", src="sglang-cpu-real/kv-full-retract/server.log",
         line="[2026-11-29 09:32:08] Decode batch, #running-req: 5, #token: 739, token usage: 0.36, cpu graph: False, gen throughput (token/s): 100.12, #queue-req: 35",
         sig={"running_reqs": 5, "used_tokens": 739, "token_usage": 0.36, "cuda_graph": 0.0, "gen_throughput_tps": 100.12, "queue_reqs": 35}, ver=">=0.5.9"),
    dict(id="decode-0.5.10-mfu-suffix", src="docs/sglang.md#decode-line format (v0.5.10+)",
         line="[2026-02-01 10:00:00 TP0] Decode batch, #running-req: 64, #token: 90000, token usage: 0.55, cuda graph: True, gen throughput (token/s): 3000.00, #queue-req: 2, est. decode TFLOPS/s (per GPU): 120.50, est. read BW (GB/s per GPU): 1800.00, est. write BW (GB/s per GPU): 20.00",
         sig={"running_reqs": 64, "queue_reqs": 2, "gen_throughput_tps": 3000.0}, ver=">=0.5.10"),
    dict(id="decode-0.5.11-fwd-occupancy", src="docs/sglang.md#decode-line format (v0.5.11+)",
         line="[2026-02-15 10:00:00 TP0] Decode batch, #running-req: 64, #token: 90000, token usage: 0.55, cuda graph: True, gen throughput (token/s): 3000.00, #queue-req: 2, fwd occupancy: 87.50%",
         sig={"running_reqs": 64, "token_usage": 0.55}, ver=">=0.5.11"),
    dict(id="decode-0.5.16-dspark", src="docs/sglang.md#decode-line format (v0.5.16+)",
         line="[2026-06-01 10:00:00 TP0] Decode batch, #running-req: 8, #token: 9000, token usage: 0.10, accept len: 3.40, accept rate: 0.80, cap len: 4.00, block accept len: 3.10, cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 0",
         sig={"spec_accept_len": 3.4, "spec_accept_rate": 0.8}, ver=">=0.5.16"),
    dict(id="decode-0.5.21-hisparse-host-receive", src="docs/sglang.md#decode-line format (v0.5.21+)",
         line="[2026-09-01 10:00:00 TP0] Decode batch, #running-req: 8, #token: 9000, token usage: 0.10, #gpu token: 5000, gpu token usage: 0.30, #cpu token: 4000, cpu token usage: 0.05, pre-allocated usage: 0.10, #prealloc-req: 0, #transfer-req: 1, #host-receive-req: 2, #retracted-req: 0, cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 0",
         sig={"running_reqs": 8, "token_usage": 0.1}, ver=">=0.5.21"),
    dict(id="decode-ragged-time-only", src="cases/022-sglang-26248-swa-retraction-throughput-collapse/server.log",
         line="[03:51:54] Decode batch, #running-req: 6, #full token: 2435072, full token usage: 0.92, swa token usage: 0.09, gen throughput (token/s): 24.33",
         sig={"running_reqs": 6, "used_tokens": 2435072, "full_token_usage": 0.92, "gen_throughput_tps": 24.33, "token_usage": 0.92}, ver=">=0.5.5"),
    dict(id="decode-missing-bracket", src="cases/022-sglang-26248-swa-retraction-throughput-collapse/server.log",
         line="2026-05-24 03:51:44 TP0] Decode batch, #running-req: 4, #full token: 2642688, full token usage: 1.00, #swa token: 14592, swa token usage: 0.06, cuda graph: True, gen throughput (token/s): 429.34, #queue-req: 3",
         sig={"running_reqs": 4, "gen_throughput_tps": 429.34}, ts="2026-05-24T03:51:44Z", ver=">=0.5.9"),
    # ---- docs/sglang.md#prefill-line prefill lines ------------------------------------------------------------------------
    dict(id="fill-0.1", src="sglang/logs/lines_from_issue_threads.txt",
         line="new fill batch. #seq: 1. #cached_token: 757. #new_token: 1. #remaining_req: 4. #running_req: 2. tree_cache_hit_rate: 80.83%.",
         sig={"prefill_new_seqs": 1, "prefill_cached_tokens": 757, "prefill_new_tokens": 1, "queue_reqs": 4, "running_reqs": 2, "cache_hit_rate": 0.8083}, ver="<=0.2.99"),
    dict(id="prefill-0.3-time-only", src="sglang/logs/lines_from_issue_threads.txt",
         line="[16:43:29 TP0] Prefill batch. #new-seq: 4, #new-token: 8192, #cached-token: 291, cache hit rate: 2.76%, token usage: 0.04, #running-req: 1, #queue-req: 38",
         sig={"prefill_new_seqs": 4, "prefill_new_tokens": 8192, "prefill_cached_tokens": 291, "cache_hit_rate": 0.0276, "token_usage": 0.04, "prefill_running_reqs": 1, "queue_reqs": 38}, ver="<=0.3.3"),
    dict(id="prefill-0.3-mixed", src="docs/sglang.md#prefill-line format (v0.3.0-0.3.5, mixed chunk)",
         line="[2024-10-01 10:00:00 TP0] Prefill batch(mixed #running-req: 7). #new-seq: 1, #new-token: 100, #cached-token: 0, cache hit rate: 0.00%, token usage: 0.10, #queue-req: 2",
         sig={"running_reqs": 7, "prefill_new_tokens": 100, "queue_reqs": 2}, ver="<=0.4.3"),
    dict(id="prefill-0.4.3-k8s", src="sglang/logs/log_startup_tail_tp8_k8s_2025-02.log",
         line="[2025-02-17 05:27:25 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, cache hit rate: 0.00%, token usage: 0.00, #running-req: 0, #queue-req: 0",
         sig={"prefill_new_tokens": 7, "cache_hit_rate": 0.0}, ver="<=0.4.3"),
    dict(id="prefill-0.4.4-trailing", src="docs/sglang.md#prefill-line format (v0.4.4-0.4.5)",
         line="[2025-03-05 10:00:00 TP0] Prefill batch. #new-seq: 2, #new-token: 4096, #cached-token: 128, token usage: 0.12, #running-req: 10, #queue-req: 5, ",
         sig={"prefill_new_tokens": 4096, "prefill_cached_tokens": 128, "queue_reqs": 5}, ver=">=0.4.4,<=0.5.3"),
    dict(id="prefill-0.4.7-mi300", src="sglang/logs/lines_from_issue_threads.txt",
         line="[2025-06-12 11:41:56 TP0] Prefill batch. #new-seq: 8, #new-token: 16384, #cached-token: 0, token usage: 0.19, #running-req: 370, #queue-req: 646",
         sig={"prefill_running_reqs": 370, "queue_reqs": 646, "prefill_new_tokens": 16384}, ver=">=0.4.4,<=0.4.9"),
    dict(id="prefill-0.4.7-pd-time", src="docs/sglang.md#prefill-line format (v0.4.7 PD prefill)",
         line="[2025-06-20 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 500, #cached-token: 0, token usage: 0.10, #running-req: 2, #unbootstrapped-req: 1, #queue-req: 3, #transferring-req: 4, time: 0.52",
         sig={"queue_reqs": 3, "prefill_running_reqs": 2}, ver="0.4.7"),
    dict(id="prefill-0.4.8-pd-input-throughput", src="docs/sglang.md#prefill-line format (v0.4.8-0.4.9 PD prefill)",
         line="[2025-07-10 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 500, #cached-token: 0, token usage: 0.10, #unbootstrapped-req: 1, #queue-req: 3, #transferring-req: 4, input throughput (token/s): 12000.00",
         sig={"queue_reqs": 3, "input_throughput_tps": 12000.0}, ver=">=0.4.8,<=0.4.9"),
    dict(id="prefill-0.5.3-pd", src="docs/sglang.md#prefill-line format (v0.5.3 PD prefill)",
         line="[2025-10-01 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 500, #cached-token: 0, token usage: 0.10, #running-req: 2, #queue-req: 3, #prealloc-req: 2, #inflight-req: 1, ",
         sig={"queue_reqs": 3}, ver="0.5.3"),
    dict(id="prefill-0.5.4-iter-mamba-pd", src="docs/sglang.md#prefill-line format (v0.5.4)",
         line="[2025-10-25 10:00:00 TP0] Prefill batch [1234], #new-seq: 1, #new-token: 500, #cached-token: 0, full token usage: 0.30, mamba usage: 0.60, #running-req: 2, #queue-req: 3, #prealloc-req: 2, #inflight-req: 1, input throughput (token/s): 900.00, ",
         sig={"token_usage": 0.6, "mamba_usage": 0.6, "input_throughput_tps": 900.0}, ver=">=0.5.4,<=0.5.8"),
    dict(id="prefill-0.5.5-bare-trailing", src="cases/029-sglang-pr14050-back-to-back-prefills-starve-decode/server.log",
         line="Prefill batch, #new-seq: 2, #new-token: 34560, #cached-token: 0, token usage: 0.19, #running-req: 45, #queue-req: 17,",
         sig={"prefill_new_seqs": 2, "prefill_new_tokens": 34560, "token_usage": 0.19, "prefill_running_reqs": 45, "queue_reqs": 17}, ver=">=0.5.5,<=0.5.8"),
    dict(id="prefill-0.5.9-throughput-first", src="docs/sglang.md#prefill-line format (v0.5.9 order)",
         line="[2026-01-10 10:00:00 TP0] Prefill batch, #new-seq: 3, #new-token: 8192, #cached-token: 512, token usage: 0.41, #running-req: 120, #queue-req: 37, input throughput (token/s): 15234.10, cuda graph: False",
         sig={"input_throughput_tps": 15234.1, "queue_reqs": 37}, ver=">=0.5.9"),
    dict(id="prefill-0.5.10-mfu", src="docs/sglang.md#prefill-line format (v0.5.10)",
         line="[2026-01-20 10:00:00 TP0] Prefill batch, #new-seq: 3, #new-token: 8192, #cached-token: 512, token usage: 0.41, #running-req: 120, #queue-req: 37, waiting-image-req: 0, cuda graph: False, input throughput (token/s): 15234.10, est. prefill TFLOPS/s (per GPU): 210.00",
         sig={"input_throughput_tps": 15234.1, "prefill_cached_tokens": 512}, ver=">=0.5.10"),
    dict(id="prefill-0.5.11-pending-occupancy", src="docs/sglang.md#prefill-line format (v0.5.11)",
         line="[2026-02-15 10:00:00 TP0] Prefill batch, #new-seq: 3, #new-token: 8192, #cached-token: 512, token usage: 0.41, #running-req: 120, #queue-req: 37, #pending-token: 90112, cuda graph: False, input throughput (token/s): 15234.10, fwd occupancy: 91.20%",
         sig={"pending_tokens": 90112, "queue_reqs": 37}, ver=">=0.5.11"),
    dict(id="prefill-0.5.12-pd-bootstrap", src="docs/sglang.md#prefill-line format (v0.5.12-0.5.15 PD prefill)",
         line="[2026-03-15 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, token usage: 0.10, #running-req: 1, #queue-req: 0, #pending-token: 0, #bootstrap-req: 2, #inflight-req: 1, cuda graph: False, input throughput (token/s): 50.00",
         sig={"prefill_new_tokens": 100}, ver=">=0.5.12"),
    dict(id="prefill-0.5.16-optimistic", src="docs/sglang.md#prefill-line format (v0.5.16-0.5.20 PD prefill)",
         line="[2026-06-15 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, token usage: 0.10, #running-req: 1, #queue-req: 0, #pending-token: 0, #bootstrap-req: 2, #inflight-req: 1, #optimistic-req: 1, cuda graph: False, input throughput (token/s): 50.00",
         sig={"prefill_new_tokens": 100}, ver=">=0.5.16"),
    dict(id="prefill-0.5.21-replay", src="docs/sglang.md#prefill-line format (v0.5.21-0.5.23)",
         line="[2026-10-30 10:00:00 TP0] Prefill batch, #new-seq: 3, #new-token: 8192, #cached-token: 512, token usage: 0.41, #running-req: 120, #queue-req: 37, #pending-token: 90112, #replay-token: 64, cuda graph: False, input throughput (token/s): 15234.10",
         sig={"prefill_running_reqs": 120, "pending_tokens": 90112, "input_throughput_tps": 15234.1}, ver=">=0.5.21"),
    dict(id="prefill-0.5.23-cpu", src="sglang-cpu-real/kv-full-retract/server.log",
         line="[2026-11-29 09:32:06] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cpu graph: False, input throughput (token/s): 5.30",
         sig={"prefill_new_seqs": 1, "prefill_new_tokens": 1, "pending_tokens": 0, "input_throughput_tps": 5.3}, ver=">=0.5.11"),
    # ---- docs/sglang.md#log-prefix prefixes -----------------------------------------------------------------------------
    dict(id="prefix-ms", src="docs/sglang.md#log-prefix format (v0.5.6+, SGLANG_LOG_MS=1)",
         line="[2026-01-01 12:00:00.123 TP0] Decode batch, #running-req: 3, #token: 30, token usage: 0.01, cuda graph: True, gen throughput (token/s): 9.00, #queue-req: 0",
         sig={"running_reqs": 3}, ts="2026-01-01T12:00:00.123000Z", ver=">=0.5.9"),
    dict(id="prefix-dp-pp-tp", src="docs/sglang.md#log-prefix format (v0.5.6-0.5.8 tag order)",
         line="[2025-12-01 10:00:00 DP0 PP1 TP3] Decode batch, #running-req: 9, #token: 30, token usage: 0.01, cuda graph: True, gen throughput (token/s): 9.00, #queue-req: 0, ",
         sig={("running_reqs", "dp0/pp1"): 9}, ver=">=0.5.6,<=0.5.8"),
    dict(id="prefix-dp-tp-ep-pp", src="docs/sglang.md#log-prefix format (v0.4.10-0.5.5 tag order)",
         line="[2025-09-01 10:00:00 DP1 TP1 EP1 PP1] Decode batch. #running-req: 9, #token: 30, token usage: 0.01, cuda graph: True, gen throughput (token/s): 9.00, #queue-req: 0, ",
         sig={("running_reqs", "dp1/pp1"): 9}, ver=">=0.4.10,<=0.5.3"),
    dict(id="prefix-attn-cp-moe-dp", src="docs/sglang.md#log-prefix format (v0.5.9+ tag order)",
         line="[2026-03-01 10:00:00 DP2 PP0 ATTN_CP2 MOE_DP2 TP2 EP2] Decode batch, #running-req: 9, #token: 30, token usage: 0.01, cuda graph: True, gen throughput (token/s): 9.00, #queue-req: 0",
         sig={("running_reqs", "dp2"): 9}, ver=">=0.5.9"),
    dict(id="prefix-time-only-missing-bracket", src="docs/sglang.md#log-prefix format (v0.3 time-only, pasted without '[')",
         line="16:43:30 TP0] Prefill batch. #new-seq: 6, #new-token: 8192, #cached-token: 2753, cache hit rate: 14.16%, token usage: 0.18, #running-req: 4, #queue-req: 34",
         sig={"prefill_cached_tokens": 2753, "cache_hit_rate": 0.1416, "queue_reqs": 34}, ts="1970-01-01T16:43:30Z", ver="<=0.3.3"),
    dict(id="prefix-compose", src="docs/sglang.md#log-prefix format (docker compose)",
         line="sglang-1  | [2026-03-01 10:00:00] Decode batch, #running-req: 9, #token: 30, token usage: 0.01, cuda graph: True, gen throughput (token/s): 9.00, #queue-req: 0",
         sig={"running_reqs": 9}, ts="2026-03-01T10:00:00Z", ver=">=0.5.9"),
    dict(id="prefix-rfc3339", src="docs/sglang.md#log-prefix format (container RFC3339 stamp)",
         line="2026-03-01T10:00:00.123456789Z [2026-03-01 10:00:00 TP0] Decode batch, #running-req: 9, #token: 30, token usage: 0.01, cuda graph: True, gen throughput (token/s): 9.00, #queue-req: 0",
         sig={"running_reqs": 9}, ts="2026-03-01T10:00:00Z", ver=">=0.5.9"),
    dict(id="prefix-compose-rfc3339-ray", src="docs/sglang.md#log-prefix format (compose + stamp + Ray)",
         line="engine_1  | 2026-03-01T10:00:00Z (SGLangEngine pid=7, ip=10.0.0.2) [2026-03-01 10:00:00 TP0] Decode batch, #running-req: 9, #token: 30, token usage: 0.01, cuda graph: True, gen throughput (token/s): 9.00, #queue-req: 0",
         sig={"running_reqs": 9}, ver=">=0.5.9"),
    # ---- docs/sglang.md#oom retraction and OOM -------------------------------------------------------------------
    dict(id="retract-0.3", src="cases/007-sglang-2746-runaway-output-kv-full-retract/server.log",
         line="[2025-01-06 02:58:44 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.0980 -> 0.9446",
         sig={"retracted_reqs": 1, "new_token_ratio": 0.9446}, ev={"retraction": {"retracted_reqs": 1, "new_token_ratio_before": 0.098}}, ver="<=0.4.6"),
    dict(id="retract-0.4.7-docs", src="sglang/logs/log_lines_quoted_in_docs.log",
         line="KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.9998 -> 1.0000",
         sig={"retracted_reqs": 1, "new_token_ratio": 1.0}, ev={"retraction": {"retracted_reqs": 1}}, ver=">=0.4.7,<=0.5.6"),
    dict(id="retract-0.5.7", src="sglang-cpu-real/kv-full-retract/server.log",
         line="[2026-11-29 09:32:10] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 185, #new_token_ratio: 0.2585 -> 0.8003",
         sig={"retracted_reqs": 1, "new_token_ratio": 0.8003}, ev={"retraction": {"new_tokens_gained": 185}}, ver=">=0.5.7"),
    dict(id="retract-0.5.7-mamba", src="docs/sglang.md#retraction format (v0.5.7+, hybrid SSM)",
         line="[2026-01-01 10:00:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 900, #mamba_num_gained: 3, #new_token_ratio: 0.4000 -> 0.9000",
         sig={"retracted_reqs": 3}, ev={"retraction": {"mamba_num_gained": 3}}, ver=">=0.5.7"),
    dict(id="retract-testing", src="docs/sglang.md#retraction format (test mode)",
         line="[2026-01-01 10:00:00 TP0] Testing retraction. #retracted_reqs: 2, #new_tokens_gained: 10, #new_token_ratio: 0.4000 -> 0.5000",
         sig={"retracted_reqs": 2}, ev={"retraction": {"test_mode": True}}, ver=">=0.5.7"),
    dict(id="retract-beam", src="docs/sglang.md#retraction format (v0.5.19+ beam search)",
         line="[2026-07-01 10:00:00 TP0] Beam search group aborted: KV cache pool is full. Retract requests. #retracted_reqs: 4, #new_tokens_gained: 10, #new_token_ratio: 0.4000 -> 0.5000",
         sig={"retracted_reqs": 4}, ev={"retraction": {"beam_search": True}}, ver=">=0.5.19"),
    dict(id="oom-prefill", src="docs/sglang.md#oom format", line="[2025-01-01 10:00:00 TP0] Prefill out of memory. Try to lower your batch size.",
         ev={"oom": {"phase": "prefill"}}),
    dict(id="oom-startup-0.5.14", src="docs/sglang.md#oom format (v0.5.14+)",
         line="[2026-04-01 10:00:00 TP0] Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.85. Raise --mem-fraction-static above 0.90.",
         cfg={"mem_fraction_static": 0.85}, ev={"startup_oom": {}}, ver=">=0.5.14"),
    dict(id="oom-startup-old", src="docs/sglang.md#oom format", line="[2024-10-01 10:00:00 TP0] Not enough memory. Please try to increase --mem-fraction-static.",
         ev={"startup_oom": {}}),
    dict(id="auto-mem-fraction", src="docs/sglang.md#oom format (v0.4.2-0.4.8)",
         line="[2025-02-01 10:00:00 TP0] Automatically reduce --mem-fraction-static to 0.800 because this is a multimodal model.",
         cfg={"mem_fraction_static": 0.8}, ver=">=0.4.2,<=0.4.8"),
    dict(id="reduced-mrr", src="cases/035-sglang-30160-max-running-requests-reduced-to-50/server.log",
         line="max_running_requests was reduced from requested 128 to 50",
         cfg={"max_running_requests": 50, "max_running_requests_requested": 128}, ev={"max_running_requests_reduced": {"effective": 50}}),
    dict(id="max-num-reqs", src="cases/035-sglang-30160-max-running-requests-reduced-to-50/server.log",
         line="max_num_reqs = 50", cfg={"req_pool_size": 50, "max_running_requests": 50}),
    dict(id="spec-reset", src="docs/sglang.md#oom format (v0.5.5+)",
         line="[2026-01-01 10:00:00] Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests.",
         cfg={"max_running_requests": 48}, ev={"max_running_requests_reduced": {"reason": "speculative decoding"}}, ver=">=0.5.5"),
    dict(id="profiled", src="docs/sglang.md#oom format", line="[2025-01-01 10:00:00 TP0] max_total_tokens=100000 is larger than the profiled value 80000. Use the profiled value instead.",
         cfg={"max_total_tokens_requested": 100000}),
    dict(id="leak", src="docs/sglang.md#oom format", line="[2025-01-01 10:00:00 TP0] token_to_kv_pool_allocator memory leak detected! available_size=10", ev={"kv_leak": {}}),
    dict(id="health", src="docs/sglang.md#startup-lines format", line="[2025-01-01 10:00:00] Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.", ev={"health_failed": {}}),
    # ---- docs/sglang.md#startup-lines startup lines ------------------------------------------------------------------------
    dict(id="summary-0.3", src="docs/sglang.md#startup-lines format (v0.3.0-0.4.1)",
         line="[2024-09-01 10:00:00 TP0] max_total_num_tokens=400000, max_prefill_tokens=16384, max_running_requests=2048, context_len=8192",
         cfg={"max_total_tokens": 400000, "max_prefill_tokens": 16384, "max_running_requests": 2048, "context_len": 8192}, sig={"max_total_tokens": 400000}, ver="<=0.4.1"),
    dict(id="summary-0.4.3-k8s", src="sglang/logs/log_startup_tail_tp8_k8s_2025-02.log",
         line="[2025-02-17 05:27:24 TP6] max_total_num_tokens=712400, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=50, context_len=163840",
         cfg={"max_total_tokens": 712400, "chunked_prefill_size": 8192, "max_running_requests": 50, "context_len": 163840}, ver=">=0.4.2,<=0.4.6"),
    dict(id="summary-0.5-docs", src="sglang/logs/log_lines_quoted_in_docs.log",
         line="[2025-08-11 17:17:03] max_total_num_tokens=665690, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=65536, available_gpu_mem=13.50 GB",
         cfg={"max_total_tokens": 665690, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384, "max_running_requests": 4096, "context_len": 65536, "available_gpu_mem_gb": 13.5}, ver=">=0.4.7"),
    dict(id="summary-0.5.23-cpu", src="sglang-cpu-real/kv-full-retract/server.log",
         line="[2026-11-29 09:32:06] max_total_num_tokens=2048, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=64, context_len=2048, available_cpu_mem=21.30 GB",
         cfg={"max_total_tokens": 2048, "chunked_prefill_size": 4096, "max_running_requests": 64, "device": "cpu", "available_gpu_mem_gb": 21.3}, ver=">=0.5.2"),
    dict(id="kv-0.4.2", src="docs/sglang.md#startup-lines format (v0.4.2)", line="[2025-01-01 10:00:00 TP0] KV Cache is allocated. K size: 10.50 GB, V size: 10.50 GB.",
         cfg={"kv_cache_gb": 21.0, "attention_kind_hint": "mha"}, ver="<=0.4.3"),
    dict(id="kv-0.4.6-mla", src="docs/sglang.md#startup-lines format (v0.4.6+ MLA)", line="[2025-05-01 10:00:00 TP0] KV Cache is allocated. #tokens: 500000, KV size: 32.40 GB",
         cfg={"kv_pool_tokens_log": 500000, "kv_cache_gb": 32.4, "attention_kind_hint": "mla"}, ver=">=0.4.6"),
    dict(id="kv-0.5.13-dtype", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log",
         line="[2026-05-24 00:52:54] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1707904, K size: 117.28 GB, V size: 117.28 GB",
         cfg={"kv_pool_tokens_log": 1707904, "kv_cache_gb": 234.56, "kv_cache_dtype_log": "torch.bfloat16"}, ver=">=0.5.13"),
    dict(id="kv-post-capture", src="docs/sglang.md#startup-lines format (recent, post-capture sizing)",
         line="[2026-10-01 10:00:00 TP0] Post-capture KV sizing: KV cache allocated. dtype: torch.float8_e4m3fn, #tokens: 900000, KV size: 40.00 GB, avail mem=5.00 GB",
         cfg={"kv_pool_tokens_log": 900000, "kv_cache_gb": 40.0, "kv_post_capture_sizing": True, "avail_mem_after_pool_gb": 5.0}, ver=">=0.5.13"),
    dict(id="load-begin", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log", line="[2026-05-24 00:52:51] Load weight begin. avail mem=275.75 GB",
         cfg={"avail_mem_before_weights_gb": 275.75}),
    dict(id="load-end-0.5.9", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log",
         line="[2026-05-24 00:52:54] Load weight end. elapsed=2.62 s, type=Qwen3ForCausalLM, avail mem=260.48 GB, mem usage=15.28 GB.",
         cfg={"avail_mem_after_weights_gb": 260.48, "weight_mem_gb": 15.28}, ver=">=0.5.9"),
    dict(id="load-end-old", src="docs/sglang.md#startup-lines format (< 0.5.9)",
         line="[2025-01-01 10:00:00 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.00 GB, mem usage=15.00 GB.",
         cfg={"avail_mem_after_weights_gb": 60.0, "weight_mem_gb": 15.0}),
    dict(id="load-end-0.3", src="docs/sglang.md#startup-lines format (v0.3.0, no mem usage)",
         line="[2024-09-01 10:00:00 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.00 GB",
         cfg={"avail_mem_after_weights_gb": 60.0}),
    dict(id="mempool", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log", line="[2026-05-24 00:52:54] Memory pool end. avail mem=25.28 GB",
         cfg={"avail_mem_after_pool_gb": 25.28}),
    dict(id="graph-bs", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log", line="[2026-05-24 00:52:54] Capture cuda graph bs [1, 2, 4, ...]",
         no_cfg=["cuda_graph_max_bs_captured"], ver=">=0.4.7"),
    dict(id="graph-end-old", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log",
         line="[2026-05-24 00:53:00] Capture cuda graph end. Time elapsed: 5.38 s. mem usage=0.60 GB. avail mem=23.56 GB.",
         cfg={"graph_mem_gb": 0.6, "avail_mem_after_graph_gb": 23.56}, ver=">=0.4.4,<=0.5.13"),
    dict(id="graph-end-0.4.0", src="sglang/logs/log_startup_tail_tp8_k8s_2025-02.log", line="[2025-02-17 05:27:24 TP1] Capture cuda graph end. Time elapsed: 84.89 s",
         ver="<=0.5.13"),
    dict(id="graph-cpu-begin", src="docs/sglang.md#startup-lines format (v0.5.2+ device label)",
         line="[2025-10-01 10:00:00] Capture cpu graph begin. This can take up to several minutes. avail mem=20.00 GB", ver=">=0.5.2,<=0.5.13"),
    dict(id="graph-0.5.14", src="docs/sglang.md#startup-lines format (v0.5.14+)",
         line="[2026-04-01 10:00:00 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16], elapsed=5.00 s, mem usage=0.60 GB, avail mem=20.00 GB.",
         cfg={"cuda_graph_max_bs_captured": 16, "avail_mem_after_graph_gb": 20.0, "graph_mem_gb": 0.6}, ver=">=0.5.14"),
    dict(id="graph-piecewise", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log",
         line="[2026-05-24 00:53:00] Capture piecewise CUDA graph begin. avail mem=23.56 GB", ver=">=0.5.6,<=0.5.13"),
    dict(id="hicache-old", src="docs/sglang.md#startup-lines format (v0.4.2-0.5.16)", line="[2025-06-01 10:00:00 TP0] Allocating 100.00 GB host memory for hierarchical KV cache.",
         cfg={"hicache_host_gb": 100.0, "enable_hierarchical_cache": True}, ver="<=0.5.16"),
    dict(id="hicache-new", src="docs/sglang.md#startup-lines format (v0.5.17+)", line="[2026-07-01 10:00:00 TP0] Allocating MHA hierarchical KV host pool: 200000 tokens, 50.00 GB host memory.",
         cfg={"hicache_host_gb": 50.0, "hicache_host_tokens": 200000}, ver=">=0.5.17"),
    dict(id="hicache-auto", src="docs/sglang.md#startup-lines format (v0.5.21+)",
         line="[2026-09-01 10:00:00 TP0] HiCache auto-sizing: ratio 2.0 -> 1.5; 64.0 GiB host memory per rank (fraction 0.8, 8 ranks on this host), host pools 60.0 GiB.",
         cfg={"hicache_ratio": 1.5, "hicache_host_pools_gib": 60.0}, ver=">=0.5.21"),
    dict(id="hicache-error", src="docs/sglang.md#startup-lines format",
         line="[2026-01-01 10:00:00 TP0] Not enough host memory available. Requesting 300.00 GB but only have 120.00 GB free. Please reduce the size of the hierarchical cache.",
         ev={"hicache_host_oom": {"requested_gb": 300.0, "free_gb": 120.0}}),
    dict(id="server-args-repr", src="docs/sglang.md#startup-lines format (ServerArgs repr)",
         line="[2025-03-01 10:00:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B', tp_size=2, dp_size=1, api_key='sk-secret-123', mem_fraction_static=0.88, max_running_requests=None, chunked_prefill_size=8192, kv_cache_dtype='auto')",
         cfg={"tp_size": 2, "mem_fraction_static": 0.88, "chunked_prefill_size": 8192}, ev={"server_args": {}}),
    dict(id="server-args-dict", src="docs/sglang.md#startup-lines format (0.5.2x dict)",
         line="[2026-11-29 09:31:57] server_args={'model_path': 'models/tiny-llama', 'mem_fraction_static': 0.716, 'max_running_requests': 64, 'max_total_tokens': 2048, 'chunked_prefill_size': 4096, 'tp_size': 1, 'admin_api_key': 'adm1n-s3cret'}",
         cfg={"max_running_requests": 64, "chunked_prefill_size": 4096, "mem_fraction_static": 0.716}),
    dict(id="cuda-graph-disabled", src="sglang-cpu-real/kv-full-retract/server.log",
         line="[2026-11-29 09:31:55] Cuda graph is disabled because of using torch native attention backend", cfg={"disable_cuda_graph": True}),
    dict(id="ready", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log", line="[2026-05-24 00:53:21] The server is fired up and ready to roll!", ev={"ready": {}}),
    dict(id="exception", src="sglang/logs/lines_from_issue_threads.txt", line="[2025-06-26 02:16:20 TP0] Scheduler hit an exception: Traceback (most recent call last):",
         ev={"crash_notice": {"process": "Scheduler"}, "traceback": {}}),
    # ---- issue 15: what people paste -----------------------------------------------------------------
    dict(id="v0.1-new-fill-batch", src="cases/103-sglang-444-v01-fill-batch-seq1-queue/server.log",
         line="new fill batch. #seq: 1. #cached_token: 330. #new_token: 2172. #remaining_req: 57. #running_req: 9. tree_cache_hit_rate: 69.16%",
         sig={"prefill_new_tokens": 2172, "queue_reqs": 57, "running_reqs": 9, "cache_hit_rate": 0.6916}, ver="<=0.2.99"),
    dict(id="outer-collector-stamp", src="cases/127-sglang-4305-qwq32b-five-requests-53k-tokens-each/server.log",
         line="[2025-03-11 16:44:27] [2025-03-11 01:44:27 TP0] Decode batch. #running-req: 5, #token: 266623, token usage: 0.61, gen throughput (token/s): 136.00, #queue-req: 0",
         sig={"running_reqs": 5, "used_tokens": 266623}, ts="2025-03-11T01:44:27Z"),
    dict(id="markdown-quote", src="docs/sglang.md#decode-line format (a line of lines_from_issue_threads.txt pasted as a GitHub quote)",
         line="> [2025-06-26 02:16:20 TP0] Decode batch. #running-req: 1, #token: 2102, token usage: 0.51, cuda graph: True, gen throughput (token/s): 93.51, #queue-req: 0",
         sig={"running_reqs": 1, "used_tokens": 2102, "cuda_graph": 1.0}, ver=">=0.4.7,<=0.4.9"),
    dict(id="markdown-backticks-backslash", src="docs/sglang.md#decode-line format (pasted in backticks, with a trailing line-continuation backslash)",
         line="`[2025-06-26 02:16:20 TP0] Decode batch. #running-req: 3, #token: 2102, token usage: 0.51, gen throughput (token/s): 93.51, #queue-req: 7` \\",
         sig={"running_reqs": 3, "queue_reqs": 7}),
    dict(id="markdown-bullet-br", src="docs/sglang.md#prefill-line format (a bullet of a GitHub list, with <br>)",
         line="- [2026-03-01 10:00:00 TP0] Prefill batch, #new-seq: 2, #new-token: 4096, #cached-token: 0, token usage: 0.20, #running-req: 8, #queue-req: 3, #pending-token: 9000, cuda graph: False, input throughput (token/s): 900.00<br>",
         sig={"prefill_new_tokens": 4096, "queue_reqs": 3, "pending_tokens": 9000}),
    dict(id="kubectl-prefix", src="docs/sglang.md#decode-line format (kubectl logs --prefix)",
         line="[pod/sglang-7d9f6c-x2v4k/sglang] [2026-03-01 10:00:00 TP0] Decode batch, #running-req: 12, #token: 9000, token usage: 0.30, cuda graph: True, gen throughput (token/s): 800.00, #queue-req: 4",
         sig={"running_reqs": 12, "queue_reqs": 4}, ts="2026-03-01T10:00:00Z"),
    dict(id="kubectl-timestamps", src="docs/sglang.md#decode-line format (kubectl logs --timestamps: an RFC3339 stamp with nanoseconds)",
         line="2026-03-01T10:00:00.123456789Z [2026-03-01 10:00:00 TP0] Decode batch, #running-req: 12, #token: 9000, token usage: 0.30, cuda graph: True, gen throughput (token/s): 800.00, #queue-req: 4",
         sig={"running_reqs": 12}),
    dict(id="journald", src="docs/sglang.md#decode-line format (journalctl -u sglang)",
         line="Mar 01 10:00:00 gpu-node-3 python3[48211]: [2026-03-01 10:00:00 TP0] Decode batch, #running-req: 12, #token: 9000, token usage: 0.30, cuda graph: True, gen throughput (token/s): 800.00, #queue-req: 4",
         sig={"running_reqs": 12, "token_usage": 0.3}),
    dict(id="rocm-decode", src="cases/123-sglang-3243-rx7900xtx-rocm-single-stream-healthy/server.log",
         line="[2025-02-01 10:12:49 TP0] Decode batch. #running-req: 1, #token: 91, token usage: 0.00, gen throughput (token/s): 28.11, #queue-req: 0",
         sig={"running_reqs": 1, "gen_throughput_tps": 28.11}),
    dict(id="npu-hybrid-spec-decode", src="cases/125-sglang-pr30047-npu-qwen-hybrid-high-prefix-reuse/server.log",
         line="[2026-07-04 05:00:30 TP0] Decode batch, #running-req: 40, #full token: 356096, full token usage: 0.76, mamba num: 159, mamba usage: 0.80, accept len: 3.84, accept rate: 0.95, npu graph: True, gen throughput (token/s): 1847.75, #queue-req: 0",
         sig={"running_reqs": 40, "used_tokens": 356096, "full_token_usage": 0.76, "mamba_usage": 0.8, "token_usage": 0.8, "cuda_graph": 1.0, "spec_accept_rate": 0.95}),
    dict(id="pd-prefill-0.4.6", src="cases/116-sglang-5450-pd-prefill-kv-transfer-mb-per-s/server.log",
         line="[2025-05-18 08:57:07 DP14 TP14] Prefill batch. #new-seq: 7, #new-token: 200, #cached-token: 0, token usage: 0.07, #running-req: 0, #unbootstrapped-req: 341, #queue-req: 0, #transferring-req: 155 ",
         sig={("pd_bootstrap_reqs", "dp14"): 341, ("pd_inflight_reqs", "dp14"): 155, ("queue_reqs", "dp14"): 0}, ver=">=0.4.6,<=0.4.9"),
    dict(id="pd-decode-0.5.3", src="docs/sglang.md#decode-line format (v0.5.3 PD decode)",
         line="[2025-10-10 10:00:00 TP0] Decode batch. #running-req: 30, #token: 90000, token usage: 0.40, pre-allocated usage: 0.51, #prealloc-req: 12, #transfer-req: 40, #retracted-req: 0, cuda graph: True, gen throughput (token/s): 1200.00, #queue-req: 0, ",
         sig={"pd_prealloc_usage": 0.51, "pd_prealloc_reqs": 12, "pd_transfer_reqs": 40, "running_reqs": 30}),
    dict(id="mooncake-glog-rate", src="cases/116-sglang-5450-pd-prefill-kv-transfer-mb-per-s/server.log",
         line="I0518 08:57:10.155643 104603 transfer_engine.cpp:364] [Metrics] Transfer Engine Throughput: 4.44 MB/s (over last 5s)",
         ev={"kv_transfer_rate": {"mb_s": 4.44}}),
    dict(id="pd-bootstrap-failed", src="cases/126-sglang-9266-pd-bootstrap-failures-high-concurrency/server.log",
         line="[2025-08-26 01:43:25 TP12] Prefill bootstrap failed for request rank=12 req.rid='5e5fc41a6eb740379f092d975f47d6cd' req.bootstrap_room=1609004377667269480 with exception KVTransferError(bootstrap_room=1609004377667269480): Request 1609004377667269480 timed out after 300.0s in KVPoll.Bootstrapping",
         ev={"pd_failure": {"side": "prefill", "stage": "bootstrap", "rid": "5e5fc41a6eb740379f092d975f47d6cd", "error": "KVTransferError"}}),
    dict(id="mamba-cap", src="cases/131-sglang-38846-mamba-state-cache-caps-running-9-of-32/server.log",
         line="max_running_requests is capped to 9 by the mamba state cache (max_mamba_cache_size=47, 5 state slots per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16.",
         cfg={"max_running_requests": 9},
         ev={"max_running_requests_reduced": {"effective": 9, "reason": "mamba state cache",
                                              "levers": [("--mamba-full-memory-ratio", None), ("--max-mamba-cache-size", None), ("--mamba-ssm-dtype", "bfloat16")]}}),
    dict(id="input-too-long", src="cases/109-sglang-4048-request-longer-than-kv-pool/server.log",
         line="[2025-03-03 06:49:28 TP5] Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens). Use a shorter input or enable --allow-auto-truncate.",
         ev={"request_too_long": {"input_tokens": 160062, "allowed_tokens": 59862, "limit": "pool_or_context"}}),
    dict(id="exception-line", src="cases/109-sglang-4048-request-longer-than-kv-pool/server.log",
         line="TypeError: '>' not supported between instances of 'NoneType' and 'int'",
         ev={"exception": {"type": "TypeError", "message": "'>' not supported between instances of 'NoneType' and 'int'"}}),
    dict(id="decode-oom-raised", src="cases/113-sglang-4602-paged-kv-decode-oom-page64/server.log",
         line="RuntimeError: Decode out of memory. Try to lower your batch size.",
         ev={"exception": {"type": "RuntimeError"}, "oom": {"phase": "decode"}}),
    dict(id="allocator-state", src="cases/113-sglang-4602-paged-kv-decode-oom-page64/server.log",
         line="Avaliable tokens: 2048", ev={"oom_detail": {"available": 2048}}),
    dict(id="cuda-oom", src="docs/sglang.md#oom format (torch's device out-of-memory error)",
         line="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.",
         ev={"exception": {"type": "torch.OutOfMemoryError"}, "oom": {"device_memory": True, "phase": "unknown"}}),
    dict(id="traceback-frame", src="sglang-cpu-real/kv-full-retract/server.log",
         line='  File "venv/lib/python3.11/site-packages/sglang/srt/entrypoints/http_server.py", line 2561, in _freeze_gc_after_server_warmup',
         ev={"frame": {"file": "srt/entrypoints/http_server.py", "func": "_freeze_gc_after_server_warmup"}}),
    dict(id="capture-progress-bar", src="docs/sglang.md#startup-lines format (tqdm's bar with carriage returns, largest size first)",
         line="Capturing batches (bs=256 avail_mem=20.13 GB):   0%|          | 0/35 [00:00<?, ?it/s]\rCapturing batches (bs=248 avail_mem=20.01 GB):   3%|3         | 1/35 [00:00<00:20,  1.65it/s]",
         cfg={"cuda_graph_max_bs_captured": 256}),
    dict(id="capture-progress-bar-last-step", src="sglang/logs/log_startup_qwen3_8b_tp1_2026-05.log",
         line="Capturing batches (bs=1 avail_mem=23.56 GB): 100% | 52/52 [00:05<00:00, 10.36it/s]", no_cfg=["cuda_graph_max_bs_captured"]),
    dict(id="sigquit", src="docs/sglang.md#crashes format (the launcher's SIGQUIT handler)",
         line="[2026-03-01 10:00:00] Received sigquit from a child process. It usually means the child failed.",
         ev={"fatal": {}}),
]
# fmt: on

ACCESS_CASES = [
    ("sglang-cpu-real/kv-full-retract/server.log", '[2026-11-29 09:32:09] INFO:     127.0.0.1:42046 - "POST /generate HTTP/1.1" 200 OK', "200", "POST /generate"),
    ("sglang/logs/log_lines_quoted_in_docs.log", '[2026-04-07 13:24:13] INFO:      127.0.0.1:59272 - "POST /v1/chat/completions HTTP/1.1" 200 OK', "200", "POST /v1/chat/completions"),
    ("docs/sglang.md#startup-lines format (error status)", '[2026-01-01 10:00:00] INFO:     10.1.2.3:5555 - "POST /generate HTTP/1.1" 503 Service Unavailable', "503", "POST /generate"),
]


def _parse(line: str) -> tuple[Timeline, SGLangLogParser, bool]:
    tl = Timeline(target="t")
    p = SGLangLogParser(tl, "server.log")
    ok = p.feed(line, 1)
    p.finish()
    return tl, p, ok


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_format(case: dict[str, Any]) -> None:
    tl, p, ok = _parse(case["line"])
    assert ok, f"not recognised: {case['line']}"
    for key, want in case.get("sig", {}).items():
        name, rank = key if isinstance(key, tuple) else (key, "")
        s = tl.get(name, rank)
        assert s is not None, f"signal {name}[{rank}] missing"
        assert s.values.tolist() == [pytest.approx(float(want))], f"{name}[{rank}]"
        assert s.sources == ["server.log:1"]
        if "ts" in case:
            from diagnoser.model import iso

            assert iso(s.ts[0]).replace(".123000Z", ".123000Z") == case["ts"] or iso(s.ts[0]) == case["ts"]
    for name, want in case.get("cfg", {}).items():
        assert name in tl.config, f"config {name} missing"
        got = tl.config[name].value
        assert got == (pytest.approx(want) if isinstance(want, float) else want), name
        assert tl.config[name].source.startswith("server.log:1")
    for name in case.get("no_cfg", []):
        assert name not in tl.config, name
    for kind, fields in case.get("ev", {}).items():
        evs = tl.events_of(kind)
        assert len(evs) == 1, f"event {kind}"
        for k, v in fields.items():
            assert evs[0].fields[k] == (pytest.approx(v) if isinstance(v, float) else v), k
    if "ver" in case:
        assert p.version.text() == case["ver"], p.version.reasons
    text = repr(tl.config)
    assert "sk-secret-123" not in text and "adm1n-s3cret" not in text


def test_time_only_keeps_the_day_of_the_last_dated_line() -> None:
    tl = Timeline(target="t")
    p = SGLangLogParser(tl, "server.log")
    for i, line in enumerate((
        "[2026-05-24 23:59:50 TP0] Decode batch, #running-req: 4, #token: 9, token usage: 0.10, cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 3",
        "[00:00:10] Decode batch, #running-req: 6, #full token: 2435072, full token usage: 0.92, swa token usage: 0.09, gen throughput (token/s): 24.33",
    ), 1):
        assert p.feed(line, i)
    s = tl.get("running_reqs")
    assert s is not None and s.ts[1] - s.ts[0] == 20.0  # crossed midnight into 2026-05-25
    assert p.version.text() == ">=0.5.9"  # an abbreviated time-only paste is not read as <= 0.3.3


@pytest.mark.parametrize(("src", "line", "code", "path"), ACCESS_CASES, ids=[c[2] + "-" + c[0][:20] for c in ACCESS_CASES])
def test_access_lines_are_counted(src: str, line: str, code: str, path: str) -> None:
    tl, p, ok = _parse(line)
    assert ok
    assert p.status_codes == {code: 1} and p.access_paths == {path: 1}
    (ev,) = tl.events_of("access_summary")
    assert ev.fields["requests"] == 1 and ev.fields["status"] == {code: 1}


@pytest.mark.parametrize("line", [
    "",
    "Multi-thread loading shards: 100% Completed | 5/5 [00:01<00:00,  2.62it/s]",
    "[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0",
    "[2026-05-24 00:52:39] Attention backend not specified. Use trtllm_mha backend by default.",
    "Decode batch, ",
])
def test_unrecognised_lines_leave_no_trace(line: str) -> None:
    tl, p, ok = _parse(line)
    assert not ok
    assert not tl.series and not tl.events and not tl.config and not p.version.known


def test_the_tail_of_a_wrapped_line_is_read_for_its_fields() -> None:
    """Issue 24: a field list that begins mid-message (here the tail of a wrapped decode line) is read for
    the fields it carries, untimed (in order after the last stamp), with no version hint."""
    tl, p, ok = _parse("42688, token usage: 1.00, gen throughput (token/s): 429.34")
    assert ok
    assert {k: s.values.tolist() for k, s in tl.series.items()} == {("token_usage", ""): [1.0], ("gen_throughput_tps", ""): [429.34]}
    assert not p.version.known


def test_real_lines_are_verbatim(data_dir: Path) -> None:
    """Every case labelled with a data file is a line of that file, as posted."""
    checked = 0
    for src, line in [(c["src"], c["line"]) for c in CASES] + [(a[0], a[1]) for a in ACCESS_CASES]:
        if src.startswith("docs/sglang.md#"):
            continue
        text = (data_dir / src).read_text(encoding="utf-8")
        assert line in text.splitlines(), f"{line[:60]}… is not verbatim in {src}"
        checked += 1
    assert checked >= 35


def test_epoch_day_matches_calendar() -> None:
    import calendar
    import random

    from diagnoser.engines.sglang.logs import epoch_day

    rnd = random.Random(3)
    for _ in range(20000):
        y, m, d = rnd.randint(1970, 2100), rnd.randint(1, 12), rnd.randint(1, 28)
        assert epoch_day(y, m, d) == calendar.timegm((y, m, d, 0, 0, 0, 0, 0, 0))
    assert epoch_day(2024, 2, 29) == calendar.timegm((2024, 2, 29, 0, 0, 0, 0, 0, 0))
