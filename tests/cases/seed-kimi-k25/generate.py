"""Writes server.log for the seed case from the issue's numbers (run: python generate.py).

Not a test. The log is ours, not a capture: startup lines in SGLang 0.5.6–0.5.8 shapes (docs/sglang.md#logs)
with the memory split chosen so that SGLang's own sizing rule gives the issue's pool
(avail_after − pre × (1 − 0.85) = 116,171 × 70,272 B), then a 10-minute excerpt of a saturated server:
47–56 running, 90+ queued, token usage about 0.99, 780–890 tok/s. The decode step time is drawn as
42.8 ms + 0.379 ms × batch with 0.5 % noise, which is what puts 47 running at about 785 tok/s and
56 at about 885; completions arrive at gen throughput / 4,116 output tokens per request.
"""

from __future__ import annotations

import random
from pathlib import Path

POOL = 116171
CLIENT = 150
OUT_TOKENS = 4116


def stamp(t: float) -> str:
    s = int(t)
    return f"2026-03-02 {s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def main() -> None:
    rnd = random.Random(4)
    lines: list[str] = []
    t0 = 7 * 3600 + 58 * 60 + 12
    args = ("server_args=ServerArgs(model_path='/models/Kimi-K2.5', tokenizer_path='/models/Kimi-K2.5', tokenizer_mode='auto', "
            "load_format='auto', trust_remote_code=True, dtype='auto', kv_cache_dtype='auto', quantization=None, context_length=None, "
            "device='cuda', served_model_name='kimi-k2.5', chat_template=None, is_embedding=False, host='0.0.0.0', port=30000, "
            "mem_fraction_static=0.85, max_running_requests=None, max_total_tokens=None, chunked_prefill_size=8192, "
            "max_prefill_tokens=16384, schedule_policy='fcfs', schedule_conservativeness=1.0, cpu_offload_gb=0, page_size=1, "
            "tp_size=8, pp_size=1, stream_interval=1, random_seed=42, log_level='info', log_requests=False, api_key=None, "
            "enable_metrics=False, decode_log_interval=40, dp_size=1, load_balance_method='round_robin', ep_size=1, "
            "attention_backend='flashmla', enable_dp_attention=False, enable_hierarchical_cache=False, hicache_ratio=2.0, "
            "hicache_size=0, cuda_graph_max_bs=None, disable_cuda_graph=False, disable_radix_cache=False, enable_mixed_chunk=False, "
            "speculative_algorithm=None, reasoning_parser='kimi_k2', tool_call_parser='kimi_k2')")
    lines.append(f"[{stamp(t0)}] {args}")
    lines.append(f"[{stamp(t0 + 9)} TP0] Init torch distributed begin.")
    lines.append(f"[{stamp(t0 + 14)} TP0] Init torch distributed ends. mem usage=1.06 GB")
    for r in range(8):
        lines.append(f"[{stamp(t0 + 15)} TP{r}] Load weight begin. avail mem=94.52 GB")
    for r in range(8):
        lines.append(f"[{stamp(t0 + 331)} TP{r}] Load weight end. type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, "
                     "avail mem=21.78 GB, mem usage=72.74 GB.")
    lines.append(f"[{stamp(t0 + 332)} TP0] KV Cache is allocated. #tokens: {POOL}, KV size: 7.60 GB")
    lines.append(f"[{stamp(t0 + 332)} TP0] Memory pool end. avail mem=14.17 GB")
    lines.append(f"[{stamp(t0 + 333)} TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=14.05 GB")
    bs = [1, 2, 4, 8, 12, 16, 24, 32] + list(range(40, 257, 8))
    lines.append(f"[{stamp(t0 + 333)} TP0] Capture cuda graph bs {bs}")
    lines.append(f"[{stamp(t0 + 430)} TP0] Capture cuda graph end. Time elapsed: 97.41 s. mem usage=2.63 GB. avail mem=11.42 GB.")
    lines.append(f"[{stamp(t0 + 431)} TP0] max_total_num_tokens={POOL}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                 "max_running_requests=2048, context_len=262144, available_gpu_mem=11.42 GB")
    lines.append(f"[{stamp(t0 + 433)}] INFO:     Started server process [7]")
    lines.append(f"[{stamp(t0 + 433)}] INFO:     Waiting for application startup.")
    lines.append(f"[{stamp(t0 + 433)}] INFO:     Application startup complete.")
    lines.append(f"[{stamp(t0 + 433)}] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)")
    lines.append(f"[{stamp(t0 + 434)}] INFO:     127.0.0.1:40112 - \"GET /get_model_info HTTP/1.1\" 200 OK")
    lines.append(f"[{stamp(t0 + 441)}] The server is fired up and ready to roll!")

    # the excerpt: 10 minutes of a saturated server, about an hour into the job
    t = 9 * 3600 + 12 * 60 + 0.0
    end = t + 600
    running = 52
    next_done = t + rnd.expovariate(0.2)
    while t < end:
        step = (0.0428 + 0.000379 * running) * rnd.gauss(1.0, 0.005)
        t_next = t + 40 * step
        while next_done < t_next:
            port = rnd.randint(30000, 65000)
            lines.append(f"[{stamp(next_done)}] INFO:     10.0.3.17:{port} - \"POST /v1/chat/completions HTTP/1.1\" 200 OK")
            drift = rnd.choice((-2, -1, 0, 1, 2)) + (1 if running < 50 else 0) - (1 if running > 54 else 0)
            running = max(47, min(56, running + drift))
            queue = CLIENT - running - rnd.randint(0, 3)
            usage = rnd.choice((0.97, 0.98, 0.98, 0.99, 0.99, 0.99, 0.99))
            new = max(40, int(rnd.gauss(180, 45)))
            cached = rnd.choice((0, 0, 64, 128))
            lines.append(f"[{stamp(next_done + 0.3)} TP0] Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached}, "
                         f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queue}, ")
            rate = running / step / OUT_TOKENS
            next_done += rnd.expovariate(rate)
        t = t_next
        usage = rnd.choice((0.98, 0.99, 0.99, 0.99, 1.00))
        tokens = int(POOL * usage) - rnd.randint(0, 600)
        tps = running / step * rnd.gauss(1.0, 0.005)
        queue = CLIENT - running - rnd.randint(0, 3)
        lines.append(f"[{stamp(t)} TP0] Decode batch, #running-req: {running}, #token: {tokens}, token usage: {tokens / POOL:.2f}, "
                     f"cuda graph: True, gen throughput (token/s): {tps:.2f}, #queue-req: {queue}, ")
    Path(__file__).with_name("server.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
