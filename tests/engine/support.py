"""A real SGLang 0.5.23 engine on CPU for the live end-to-end tests.

Recipe: README.md beside this file. This module:

* builds (or reuses) a cached virtualenv with ``sglang==0.5.23 --no-deps`` plus the CPU requirement
  list (``requirements-sglang-cpu.txt`` beside this file). The cache lives outside the clone
  (``$DIAGNOSER_ENGINE_CACHE`` or ``~/.cache/diagnoser-engine``) and is keyed by the list's hash;
* supplies the ``sgl_kernel`` stand-in the recipe describes (every name raises ``NotImplementedError``
  naming itself, except ``assign_req_to_token_pool_cpu`` which is implemented in plain torch);
* builds the tiny Llama model and its tokenizer offline (a byte-level BPE trained on the standard
  library's own ``.py`` files);
* launches the server on a free loopback port with ``--enable-metrics`` and a scenario's flags, waits
  for it to be ready and stops it by PID (process group) at the end, even when a test fails;
* gives a bounded load generator (request count, concurrency, max tokens, prompt length, ignore_eos).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import free_port  # noqa: E402

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-sglang-cpu.txt"
SGLANG_VERSION = "0.5.23"


def cache_root() -> Path:
    return Path(os.environ.get("DIAGNOSER_ENGINE_CACHE", Path.home() / ".cache" / "diagnoser-engine"))


def requirements_hash() -> str:
    h = hashlib.sha256()
    h.update(f"sglang=={SGLANG_VERSION}\n".encode())
    h.update(REQUIREMENTS.read_bytes())
    h.update(f"python{sys.version_info[0]}.{sys.version_info[1]}".encode())
    return h.hexdigest()[:16]


def engine_dir() -> Path:
    return cache_root() / requirements_hash()


def free_disk_gb(path: Path) -> float:
    path.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(path).free / 2**30


def _run(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 1800) -> None:
    with open(log, "ab") as fh:
        fh.write(("\n$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=True, env=env, timeout=timeout)


def ensure_venv() -> Path:
    """Build the engine venv once per requirement-list hash; return its python."""
    root = engine_dir()
    py = root / "venv" / "bin" / "python"
    done = root / "venv.ok"
    if done.exists() and py.exists():
        return py
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    lock = root / "build.lock"
    with open(lock, "w") as lf:
        import fcntl

        fcntl.flock(lf, fcntl.LOCK_EX)
        if done.exists() and py.exists():
            return py
        if (root / "venv").exists():
            shutil.rmtree(root / "venv")
        t0 = time.time()
        _run([sys.executable, "-m", "venv", str(root / "venv")], log)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run(pip + [f"sglang=={SGLANG_VERSION}", "--no-deps"], log)
        _run(pip + ["-r", str(REQUIREMENTS)], log)
        # torchvision/torchaudio are not needed beyond import; the recipe keeps PyPI's CUDA torch 2.14.1
        done.write_text(json.dumps({"built_s": round(time.time() - t0, 1), "at": time.time()}))
    return py


SGL_KERNEL_STUB = '''"""Stand-in for sgl_kernel on CPU (see the engine recipe). Any name is a function that raises."""
import torch


class _Missing:
    def __init__(self, name):
        self.__name__ = name

    def __call__(self, *a, **k):
        raise NotImplementedError(f"sgl_kernel stand-in: {self.__name__} is not implemented on CPU")

    def __getattr__(self, name):
        return _Missing(self.__name__ + "." + name)


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    pos = 0
    for i in range(len(req_pool_indices)):
        s = int(start_offset[i])
        e = int(end_offset[i])
        n = e - s
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[pos:pos + n]
        pos += n


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)
'''


def ensure_stub() -> Path:
    """A directory to put on PYTHONPATH that provides ``sgl_kernel`` and its submodules."""
    d = engine_dir() / "stub"
    pkg = d / "sgl_kernel"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(SGL_KERNEL_STUB)
    # submodules imported by name (``from sgl_kernel.xxx import y``) resolve through a meta path finder
    (d / "sitecustomize.py").write_text(
        '''import importlib.abc, importlib.machinery, sys, types


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        import sgl_kernel
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = sgl_kernel.__getattr__
        m.assign_req_to_token_pool_cpu = sgl_kernel.assign_req_to_token_pool_cpu
        return m

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
'''
    )
    return d


BUILD_MODEL = r'''
import glob, json, os, sys, sysconfig
out = sys.argv[1]
hidden, layers, heads, kv = (int(x) for x in sys.argv[2:6])
os.makedirs(out, exist_ok=True)
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import PreTrainedTokenizerFast, LlamaConfig, LlamaForCausalLM
import torch
files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:200]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=["<s>", "</s>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train(files, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
fast.save_pretrained(out)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=fast.vocab_size if fast.vocab_size >= 2048 else 2048, hidden_size=hidden, intermediate_size=hidden * 2,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
                  bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, torch_dtype="bfloat16")
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
print("ok", sum(p.numel() for p in model.parameters()))
'''


def ensure_model(py: Path, name: str = "tiny-llama", hidden: int = 64, layers: int = 2, heads: int = 2, kv_heads: int = 2) -> Path:
    d = engine_dir() / "models" / name
    if (d / "config.json").exists() and (d / "tokenizer.json").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    script = engine_dir() / "build_model.py"
    script.write_text(BUILD_MODEL)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    _run([str(py), str(script), str(d), str(hidden), str(layers), str(heads), str(kv_heads)], engine_dir() / "build.log", env=env, timeout=600)
    return d




def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass
class Engine:
    """A running SGLang server; use as a context manager."""

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

    def start(self, timeout: float = 240) -> Engine:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            SGLANG_USE_CPU_ENGINE="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONPATH=str(ensure_stub()) + os.pathsep + env.get("PYTHONPATH", ""),
            PYTHONUNBUFFERED="1",
        )
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        cmd = [
            str(self.py), "-m", "sglang.launch_server", "--model-path", str(self.model), "--served-model-name", "tiny-llama",
            "--device", "cpu", "--host", "127.0.0.1", "--port", str(self.port), "--attention-backend", "torch_native",
            "--sampling-backend", "pytorch", "--enable-metrics", "--sleep-on-idle", "--log-level", "info", *self.flags,
        ]
        log = open(self.log_path, "wb")
        t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir, start_new_session=True)
        deadline = t0 + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang exited with {self.proc.returncode} during start-up; see {self.log_path}:\n" + self.log_path.read_text()[-3000:])
            try:
                code, _ = http_get(self.url + "/model_info", timeout=2)
                if code == 200 and b"ready to roll" in self.log_path.read_bytes():
                    self.startup_s = time.time() - t0
                    return self
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"SGLang did not become ready in {timeout} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    wall_s: float = 0.0
    completion_tokens: int = 0
    errors: list[str] = field(default_factory=list)


def run_load(url: str, n: int, concurrency: int, max_new_tokens: int, prompt_reps: int = 4, ignore_eos: bool = False,
             timeout: float = 300, stop: threading.Event | None = None, result: LoadResult | None = None,
             shared_prefix: bool = False) -> LoadResult:
    """Send ``n`` /generate requests with ``concurrency`` in flight; bounded in count and time.

    ``stop`` ends the sending early; ``result`` (optional) is filled in place so a caller can read the
    counts while requests are still in flight. Each prompt has a unique line: first (no prefix is shared,
    the default) or, with ``shared_prefix``, last (every prompt shares the ``prompt_reps`` body)."""
    base = "def f(x):\n    return x + 1\n"
    res = result if result is not None else LoadResult()
    lock = threading.Lock()
    counter = iter(range(n))
    deadline = time.time() + timeout

    def worker() -> None:
        while time.time() < deadline and not (stop and stop.is_set()):
            with lock:
                i = next(counter, None)
            if i is None:
                return
            prompt = base * prompt_reps + f"# request {i}\n" if shared_prefix else f"# request {i}\n" + base * prompt_reps
            body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos, "temperature": 1.0}}).encode()
            req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
            with lock:
                res.sent += 1
            try:
                with urllib.request.urlopen(req, timeout=max(5.0, deadline - time.time())) as r:
                    out = json.loads(r.read())
                with lock:
                    res.ok += 1
                    res.completion_tokens += int(out.get("meta_info", {}).get("completion_tokens", 0))
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


class RunRecorder:
    """Record a run the way tests/data/sglang-cpu-real/ holds one: ``metrics/metrics_<n>_<epoch>.prom``
    (a /metrics scrape every ``interval`` s, as served), ``get_server_info.json``, ``get_model_info.json``,
    and at :meth:`finish` the server log so far and ``load_summary.json``. ``diagnose --once --replay DIR``
    reads it; ``diagnose compare BEFORE AFTER`` compares two."""

    def __init__(self, engine: Engine, out: Path, interval: float = 2.0) -> None:
        self.engine, self.out, self.interval = engine, out, interval
        (out / "metrics").mkdir(parents=True, exist_ok=True)
        for path, name in (("/get_server_info", "get_server_info.json"), ("/get_model_info", "get_model_info.json")):
            code, body = http_get(engine.url + path)
            if code == 200:
                (out / name).write_bytes(body)
        self._stop = threading.Event()
        self.scrapes = 0
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.time()
            try:
                code, body = http_get(self.engine.url + "/metrics")
            except OSError:
                code, body = 0, b""
            if code == 200:
                self.scrapes += 1
                (self.out / "metrics" / f"metrics_{self.scrapes:04d}_{t0:.3f}.prom").write_bytes(body)
            self._stop.wait(max(0.0, self.interval - (time.time() - t0)))

    def stop(self) -> None:
        """Stop scraping (the window ends); :meth:`finish` writes the rest."""
        self._stop.set()
        self._t.join(timeout=10)

    def finish(self, load: LoadResult | None = None, flags: list[str] | None = None, note: str = "") -> Path:
        self.stop()
        shutil.copy(self.engine.log_path, self.out / "server.log")
        if load is not None:
            (self.out / "load_summary.json").write_text(json.dumps({
                "sent": load.sent, "ok": load.ok, "failed": load.failed, "wall_s": round(load.wall_s, 2),
                "completion_tokens_total": load.completion_tokens, "flags": flags or [], "note": note}, indent=1) + "\n")
        return self.out
