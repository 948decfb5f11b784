"""SGLang's start-up memory arithmetic per release, reproducing real start-up logs (issue 25, item 3).

* The pool: ``profile_max_num_token`` is (free after the weights - free before them x (1 - fraction)) x 2^30
  // bytes per token at v0.4.6, v0.5.2, v0.5.10 and v0.5.23 (``scheduler_model.profiled_pool_tokens``). The
  real SGLang 0.5.23 CPU runs that left the pool to SGLang (tests/data/sglang-cpu-issue25: aborts, context
  length, queue full; their READMEs give the runs) log the free memory, the automatic fraction and the
  pool it made: the formula must give that pool.
* The automatic fraction: from v0.5.3 chunking off (``--chunked-prefill-size -1``) reserves 1.5 x
  ``--max-prefill-tokens`` (``server_args.py`` at v0.5.3 and v0.5.10, ``memory_hook.py`` at v0.5.23); up to
  v0.5.2 the fraction follows memory tiers alone. The failed start-up in
  tests/data/sglang-cpu-issue25/chunked-prefill-off logged -0.049: inverting the formula must give the
  machine's memory that the other runs' 0.716 (default chunk) implies, and the fix must start by the pool
  formula at the failed log's own free memory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diagnoser.capacity.gpus import auto_mem_fraction
from diagnoser.collect import collect_logs
from diagnoser.engines import get_adapter
from diagnoser.engines.sglang.scheduler_model import least_fraction, profiled_pool_tokens
from diagnoser.evaluate import evaluate
from tests.conftest import DATA

RUNS = DATA / "sglang-cpu-issue25"
TINY_CELL = 2 * 2 * 32 * 2 * 2  # tiny random Llama (tests/engine/README.md): 2 layers x 2 KV heads x head dim 32 x (K, V) x bf16


def _startup(log: Path) -> dict[str, float]:
    text = log.read_text(errors="replace")
    got = {
        "before": float(re.search(r"Load weight begin\. avail mem=([\d.]+) GB", text).group(1)),  # type: ignore[union-attr]
        "after": float(re.search(r"Load weight end\..*?avail mem=([\d.]+) GB", text).group(1)),  # type: ignore[union-attr]
        "fraction": float(re.search(r"'mem_fraction_static': (-?[\d.]+)", text).group(1)),  # type: ignore[union-attr]
    }
    kv = re.search(r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+), K size: ([\d.]+) GB", text)
    if kv:
        got["tokens"], got["k_gb"] = float(kv.group(1)), float(kv.group(2))
    return got


@pytest.mark.parametrize("run", ["aborts-half-disconnect", "context-length-400", "queue-full-503"])
def test_the_pool_formula_gives_the_pool_sglang_made(run: str) -> None:
    s = _startup(RUNS / run / "server.log")
    assert "max_total_tokens': None" in (RUNS / run / "server.log").read_text()  # the pool was SGLang's to size
    assert s["k_gb"] == pytest.approx(s["tokens"] * TINY_CELL / 2 / 2**30, abs=0.006)  # the bytes per token are the model's
    got = profiled_pool_tokens(s["before"], s["after"], s["fraction"], TINY_CELL)
    # SGLang measures the free memory again just before sizing, and on CPU it is the host's available RAM,
    # which the machine's other processes move (these runs shared 2 CPUs with other work): the free memory
    # the logged pool implies is within 0.15 GB of the logged one (0.02-0.8 % of the pool)
    implied_after = s["tokens"] * TINY_CELL / 2**30 + s["before"] * (1 - s["fraction"])
    assert abs(implied_after - s["after"]) <= 0.15, (run, got, s, implied_after)
    assert got == pytest.approx(s["tokens"], rel=0.01), (run, got, s)
    assert least_fraction(s["before"], s["after"]) < 0.01 < s["fraction"]


def test_the_automatic_fraction_per_release_and_chunking_off() -> None:
    """One machine (24,105 MiB host RAM, test_capacity_gpus.py) gives 0.716 with the default chunk and the
    failed start-up's -0.049 with chunking off, at v0.5.23; the 0.5.3-0.5.13 formula adds the decode-graph
    reserve (on CPU 2 x --torch-compile-max-bs 32 from v0.5.10); up to v0.5.2 the chunk changes nothing."""
    failed = _startup(RUNS / "chunked-prefill-off" / "server.log")
    assert failed["fraction"] == -0.049 and "'chunked_prefill_size': -1" in (RUNS / "chunked-prefill-off" / "server.log").read_text()
    assert auto_mem_fraction(24105, 1, (0, 5, 23), platform="cpu", chunked_prefill_size=-1).fraction == failed["fraction"]
    assert auto_mem_fraction(24105, 1, (0, 5, 23), platform="cpu").fraction == 0.716
    at_0510 = auto_mem_fraction(24105, 1, (0, 5, 10), platform="cpu", chunked_prefill_size=-1)
    assert at_0510.fraction < 0 and at_0510.cuda_graph_max_bs == 32
    assert auto_mem_fraction(24105, 1, (0, 5, 10), platform="cpu", chunked_prefill_size=-1, max_prefill_tokens=4096).fraction > 0.6
    old = auto_mem_fraction(24105, 1, (0, 5, 2), platform="cpu", chunked_prefill_size=-1)
    assert old.fraction == auto_mem_fraction(24105, 1, (0, 5, 2), platform="cpu").fraction > 0  # tiers: the chunk is not in it


def test_the_failed_startups_fix_starts_by_the_same_arithmetic() -> None:
    log = RUNS / "chunked-prefill-off" / "server.log"
    col = collect_logs(get_adapter(), [str(log)])
    report = evaluate(col.timelines, get_adapter())
    fixes = [s for f in report.findings if f.rule == "oom" for s in f.suggestions if s.flag == "--mem-fraction-static"]
    assert len(fixes) == 1, [(f.rule, [(s.flag, s.proposed) for s in f.suggestions]) for f in report.findings]
    fix = fixes[0]
    assert isinstance(fix.proposed, float) and 0 < fix.proposed <= 0.716, fix.proposed  # at most what the default chunk gives
    # the inverted formula found the machine's memory: about 23.5 GB (24,105 MiB)
    mem = float(re.search(r"of about ([\d.]+) GB", fix.why).group(1))  # type: ignore[union-attr]
    assert mem == pytest.approx(24105 / 1024, abs=0.15), fix.why
    s = _startup(log)
    assert profiled_pool_tokens(s["before"], s["after"], fix.proposed, TINY_CELL) > 1_000_000  # it starts, with a pool
    assert profiled_pool_tokens(s["before"], s["after"], s["fraction"], TINY_CELL) == 0  # as the failed start-up found
