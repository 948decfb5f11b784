"""Log backfill speed: ``read_log`` into a Timeline on a generated realistic SGLang log, next to ``grep -c``.

    .venv/bin/python bench/bench_log_backfill.py [--size-mb 1024] [--keep PATH] [--reference] [--workers N]

Generates the log in a temp dir (never in git): a busy server's mix of access lines, prefill and decode
lines (current 0.5.9+ and older 0.4.x/0.5.5-0.5.8 shapes, date/ms prefixes, DP/TP tags), plus the
rarer lines (retractions, hybrid SWA decode lines, Ray and docker-compose prefixes, warnings,
tracebacks, startup lines). Prints lines/s, the time of ``grep -c`` on the same file (baseline, same
run) and the ratio. ``--reference`` also times the line-by-line reference parser on the first 20 MB.
Exit 0 when backfill reaches 1 M lines/s (the issue's target).

Method: ``read_log`` as ``diagnose --log`` calls it: the compiled scanner when it is built (set
``DIAGNOSER_NO_SCAN=1`` to time the pure-Python regex path), the file memory-mapped. A file this big is
parsed by forked worker processes (one per other CPU, ``diagnoser.sources.logs._auto_workers``;
``--workers 0`` forces the single-process path) while the reading process applies their results in file
order, so CPU time is reported for the reading process and for the workers separately. On a shared machine wall time is noisy: the CPU figures (and
``valgrind --tool=callgrind`` instruction counts) are the steadier comparison.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET_LPS = 1_000_000

# share of lines per kind (sums to 1): a busy server logs one access line per request, one prefill line
# per prefill batch, and a decode line every 40 decode steps
MIX = (
    ("access", 0.42),
    ("prefill_current", 0.20),
    ("decode_current", 0.14),
    ("prefill_old", 0.05),
    ("decode_old", 0.05),
    ("decode_dp", 0.04),
    ("metrics_scrape", 0.04),
    ("other", 0.04),
    ("rare", 0.02),
)


def _stamp(t: float, ms: bool) -> str:
    s = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
    return f"{s}.{int((t % 1) * 1000):03d}" if ms else s


def _line(kind: str, rnd: random.Random, t: float) -> str:
    r = rnd.randint
    if kind == "access":
        path = rnd.choice(("/generate", "/v1/chat/completions", "/v1/completions"))
        code = 200 if rnd.random() < 0.98 else rnd.choice((400, 500, 503))
        reason = {200: "OK", 400: "Bad Request", 500: "Internal Server Error", 503: "Service Unavailable"}[code]
        return f'[{_stamp(t, False)}] INFO:     10.0.{r(0, 9)}.{r(1, 254)}:{r(1024, 65535)} - "POST {path} HTTP/1.1" {code} {reason}'
    if kind == "metrics_scrape":
        return f'[{_stamp(t, False)}] INFO:     127.0.0.1:{r(1024, 65535)} - "GET /metrics HTTP/1.1" 200 OK'
    if kind == "prefill_current":
        return (
            f"[{_stamp(t, False)}] Prefill batch, #new-seq: {r(1, 8)}, #new-token: {r(16, 16384)}, #cached-token: {r(0, 8192)}, "
            f"token usage: {rnd.random():.2f}, #running-req: {r(0, 256)}, #queue-req: {r(0, 400)}, #pending-token: {r(0, 99999)}, "
            f"cuda graph: False, input throughput (token/s): {rnd.random() * 20000:.2f}"
        )
    if kind == "decode_current":
        return (
            f"[{_stamp(t, False)}] Decode batch, #running-req: {r(1, 256)}, #token: {r(100, 999999)}, token usage: {rnd.random():.2f}, "
            f"cuda graph: {rnd.choice(('True', 'False'))}, gen throughput (token/s): {rnd.random() * 9000:.2f}, #queue-req: {r(0, 400)}"
        )
    if kind == "prefill_old":  # 0.4.3-era: TP tag, cumulative cache hit rate
        return (
            f"[{_stamp(t, False)} TP0] Prefill batch. #new-seq: {r(1, 8)}, #new-token: {r(16, 8192)}, #cached-token: {r(0, 4096)}, "
            f"cache hit rate: {rnd.random() * 100:.2f}%, token usage: {rnd.random():.2f}, #running-req: {r(0, 128)}, #queue-req: {r(0, 99)}"
        )
    if kind == "decode_old":  # 0.5.5-0.5.8: comma header, trailing comma, speculative fields
        return (
            f"[{_stamp(t, False)} TP0] Decode batch, #running-req: {r(1, 128)}, #token: {r(100, 99999)}, token usage: {rnd.random():.2f}, "
            f"accept len: {1 + rnd.random() * 3:.2f}, accept rate: {rnd.random():.2f}, cuda graph: True, "
            f"gen throughput (token/s): {rnd.random() * 4000:.2f}, #queue-req: {r(0, 50)}, "
        )
    if kind == "decode_dp":  # DP attention, milliseconds
        d = r(0, 3)
        return (
            f"[{_stamp(t, True)} DP{d} TP{d} EP{d}] Decode batch, #running-req: {r(1, 64)}, #token: {r(100, 99999)}, "
            f"token usage: {rnd.random():.2f}, cuda graph: True, gen throughput (token/s): {rnd.random() * 3000:.2f}, #queue-req: {r(0, 50)}"
        )
    if kind == "other":
        return rnd.choice((
            f"[{_stamp(t, False)}] Receive: obj=GenerateReqInput(rid='{r(0, 1 << 60):x}', ...)",
            f"[{_stamp(t, False)}] Cache flushed successfully!",
            "  warnings.warn(",
            f"[{_stamp(t, False)}] Finish: obj=GenerateReqInput(rid='{r(0, 1 << 60):x}'), out={{'meta_info': {{'completion_tokens': {r(1, 999)}}}}}",
        ))
    return rnd.choice((  # rare shapes: the reference parser reads these
        f"[{_stamp(t, False)}] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: {r(10, 900)}, #new_token_ratio: 0.2585 -> 0.8003",
        f"[{_stamp(t, False)} TP0] Decode batch, #running-req: 4, #full token: {r(1000, 99999)}, full token usage: {rnd.random():.2f}, #swa token: 14592, swa token usage: 0.06, cuda graph: True, gen throughput (token/s): 429.34, #queue-req: 3",
        f"(SGLangEngine pid={r(1000, 99999)}) [{_stamp(t, False)} TP0] Decode batch [{r(1, 99999)}], #running-req: 317, #token: 1094261, token usage: 0.67, cuda graph: True, gen throughput (token/s): 14806.57, #queue-req: 0,",
        f"sglang-1  | [{_stamp(t, False)}] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.01, #running-req: 3, #queue-req: 0",
        "Traceback (most recent call last):",
        f"[{_stamp(t, False)}] max_total_num_tokens=712400, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=256, context_len=32768, available_gpu_mem=13.50 GB",
    ))


def generate(path: str | os.PathLike[str], size_mb: float, seed: int = 7) -> int:
    """Write a realistic log of about ``size_mb`` MB; returns the number of lines."""
    rnd = random.Random(seed)
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    target = int(size_mb * 1024 * 1024)
    written = lines = 0
    t = 1_795_944_000.0
    with open(path, "w", encoding="ascii", newline="\n") as fh:
        while written < target:
            block = []
            for kind in rnd.choices(kinds, weights, k=5000):
                t += rnd.random() * 0.02
                block.append(_line(kind, rnd, t))
            text = "\n".join(block) + "\n"
            fh.write(text)
            written += len(text)
            lines += len(block)
    return lines


def _time(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=float, default=1024.0)
    ap.add_argument("--keep", help="write the generated log here instead of a temp dir")
    ap.add_argument("--reference", action="store_true", help="also time the line-by-line parser on 20 MB")
    ap.add_argument("--workers", type=int, help="worker processes (default: as diagnose picks; 0 = none)")
    args = ap.parse_args()
    if args.workers is not None:
        os.environ["DIAGNOSER_LOG_WORKERS"] = str(args.workers)

    from diagnoser.engines.sglang import ADAPTER, logfast
    from diagnoser.sources.logs import _auto_workers, read_log
    from diagnoser.timeline import Timeline

    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or os.path.join(tmp, "server.log")
        t0 = time.perf_counter()
        n = generate(path, args.size_mb)
        size = os.path.getsize(path)
        print(f"generated {size / 1e6:.0f} MB, {n:,} lines in {time.perf_counter() - t0:.1f} s ({path})")

        grep_s = _time(lambda: subprocess.run(["grep", "-c", "", path], check=True, capture_output=True))
        grep_s = min(grep_s, _time(lambda: subprocess.run(["grep", "-c", "", path], check=True, capture_output=True)))
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["grep", "-c", "", path], check=True, capture_output=True)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        grep_cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        with open(path, "rb") as fh:
            workers = _auto_workers(fh)
        tl = Timeline(target="bench")
        box: dict[str, object] = {}
        cpu0 = time.process_time()
        ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        ours_s = _time(lambda: box.setdefault("r", read_log(ADAPTER, tl, path)))
        ours_cpu = time.process_time() - cpu0
        ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        workers_cpu = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rep = box["r"].report  # type: ignore[attr-defined]
        lps = rep.lines_read / ours_s
        points = sum(len(s) for s in tl.series.values())
        print(f"line scanner: {'compiled (C) + regex path for the rest' if logfast.scanner() else 'regex path only (pure Python)'}; "
              f"{workers} worker process(es)")
        print(f"grep -c          {grep_s:8.2f} s   {n / grep_s:14,.0f} lines/s   (baseline)")
        print(f"diagnoser read   {ours_s:8.2f} s   {lps:14,.0f} lines/s   ratio to grep {ours_s / grep_s:.1f}x slower")
        print(f"  lines read {rep.lines_read:,}, recognised {rep.lines_recognized:,}, points {points:,}, errors {rep.errors}")
        total_cpu = ours_cpu + workers_cpu
        print(f"CPU time (steadier on a shared machine): grep {grep_cpu:.2f} s, diagnoser {total_cpu:.2f} s "
              f"(reading process {ours_cpu:.2f} s + {workers} worker process(es) {workers_cpu:.2f} s) "
              f"= {rep.lines_read / max(total_cpu, 1e-9):,.0f} lines per CPU-second, ratio {total_cpu / max(grep_cpu, 1e-9):.0f}x")
        print(f"peak memory of the reading process: {rss_mb:,.0f} MB (timeline of {points:,} points included)")
        if args.reference:
            ref_path = os.path.join(tmp, "ref.log")
            with open(path, "rb") as src, open(ref_path, "wb") as dst:
                dst.write(src.read(20 * 1024 * 1024).rsplit(b"\n", 1)[0] + b"\n")
            from diagnoser.sources.logs import open_log_reader

            rd = open_log_reader(ADAPTER, Timeline(target="ref"), ref_path)
            with open(ref_path, "rb") as fh:
                c0 = time.process_time()
                ref_s = _time(lambda: rd.feed_lines(fh))
                ref_cpu = time.process_time() - c0
            rl = rd.report.lines_read / ref_s
            print(f"line-by-line reference parser (20 MB): {rl:,.0f} lines/s; bulk path is {lps / rl:.1f}x faster "
                  f"(CPU: {rd.report.lines_read / ref_cpu:,.0f} lines per CPU-second, bulk "
                  f"{(rep.lines_read / ours_cpu) / (rd.report.lines_read / ref_cpu):.1f}x)")
        ok = lps >= TARGET_LPS
        print(f"target >= {TARGET_LPS:,} lines/s: {'met' if ok else 'NOT met'}")
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
