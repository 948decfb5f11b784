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

import atexit
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, Self

from tests.helpers import free_port

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


def _lock(path: Path, exclusive: bool, blocking: bool = True) -> IO[str] | None:
    """An open file holding an ``flock`` on ``path`` (exclusive or shared); ``None`` when ``blocking`` is
    off and another process holds a clashing lock."""
    import fcntl  # POSIX only, like the engine recipe

    fh = open(path, "a")  # noqa: SIM115 - the caller keeps it open as long as it holds the lock
    try:
        fcntl.flock(fh, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        fh.close()
        return None
    return fh


_IN_USE: list[IO[str]] = []  # shared locks on the engine dirs this process uses (released at exit)


def build_venv(root: Path, installs: list[list[str]], timeout: float = 2400) -> Path:
    """Build ``root/venv`` once: a venv, then ``pip install`` with each argument list of ``installs`` in
    turn; return its python. ``root/venv.ok`` marks it built and keeps the build time (``built_s``). The
    build runs under an exclusive lock on ``root/build.lock`` (a second process waits for it, then reuses
    it); a half-built venv from an interrupted build is removed first. The caller's process then holds a
    shared lock on ``root/use.lock`` so :func:`prune_stale` never removes a venv in use."""
    py = root / "venv" / "bin" / "python"
    done = root / "venv.ok"
    root.mkdir(parents=True, exist_ok=True)
    if not (done.exists() and py.exists()):
        log = root / "build.log"
        lf = _lock(root / "build.lock", exclusive=True)
        try:
            if not (done.exists() and py.exists()):
                if (root / "venv").exists():
                    shutil.rmtree(root / "venv")
                t0 = time.time()
                _run([sys.executable, "-m", "venv", str(root / "venv")], log)
                pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-cache-dir"]
                for args in installs:
                    _run(pip + args, log, timeout=timeout)
                done.write_text(json.dumps({"built_s": round(time.time() - t0, 1), "at": time.time()}))
        finally:
            if lf is not None:
                lf.close()
    held = _lock(root / "use.lock", exclusive=False)
    if held is not None:
        _IN_USE.append(held)
    return py


def built_seconds(root: Path) -> float | None:
    """How long the venv under ``root`` took to build (``venv.ok``), or None when unknown."""
    try:
        return float(json.loads((root / "venv.ok").read_text())["built_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prune_stale(root: Path) -> list[Path]:
    """Remove the engine dirs beside ``root`` of the same kind (another requirement-list hash: an older pin)
    that no process is using or building; return them. Engine venvs are several GB each, and every change
    of a requirement list leaves one behind. Called only when the disk is short."""
    kind = root.name.rsplit("-", 1)[0] + "-" if "-" in root.name else ""
    removed = []
    for d in sorted(root.parent.iterdir()) if root.parent.is_dir() else []:
        same_kind = d.name.startswith(kind) if kind else "-" not in d.name
        if d == root or not d.is_dir() or not same_kind or not (d / "venv.ok").exists():
            continue
        use, build = _lock(d / "use.lock", exclusive=True, blocking=False), None
        try:
            build = _lock(d / "build.lock", exclusive=True, blocking=False) if use is not None else None
            if build is not None:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
        finally:
            for fh in (use, build):
                if fh is not None:
                    fh.close()
    return removed


def ensure_venv() -> Path:
    """Build the SGLang venv once per requirement-list hash; return its python."""
    # torchvision/torchaudio are not needed beyond import; the recipe keeps PyPI's CUDA torch 2.14.1
    return build_venv(engine_dir(), [[f"sglang=={SGLANG_VERSION}", "--no-deps"], ["-r", str(REQUIREMENTS)]], timeout=1800)


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


_STARTED: list[ServerProcess] = []  # every server this process started: stopped at exit if a test did not


def _stop_all() -> None:
    for srv in list(_STARTED):
        srv.stop()


atexit.register(_stop_all)

def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, which hold nothing, do not count: a
    worker whose parent died is reparented to a PID 1 that may never reap it)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """The pids of group ``pgid`` that still run (zombies left out), from ``/proc`` (Linux)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


PORT_IN_USE = (b"Address already in use", b"address already in use", b"Errno 98")


@dataclass
class ServerProcess:
    """A real engine's server on a loopback port, in a process group of its own; use as a context manager.

    Subclasses give the command, the environment and the readiness check. :meth:`start` waits up to
    ``timeout`` s (``$DIAGNOSER_ENGINE_START_TIMEOUT`` raises every engine's default, for a slow machine)
    and, when the server dies at start-up because its port was taken meanwhile (the port is free when
    chosen, but another process may bind it before the server does), starts it again on another port.
    :meth:`stop` ends the whole process group (the API server, the engine core, the workers): SIGTERM,
    then SIGKILL after a grace period, and it waits until no process of the group is left, so the next
    server starts on a free machine. Servers still running at interpreter exit are stopped too."""

    py: Path
    model: Path
    flags: list[str]
    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    startup_s: float = 0.0
    name: ClassVar[str] = "engine"
    start_timeout: ClassVar[float] = 240.0
    stop_grace: ClassVar[float] = 20.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        return env

    def ready(self) -> bool:
        raise NotImplementedError

    def _tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def start(self, timeout: float | None = None, port_tries: int = 3) -> Self:
        limit = max(timeout or self.start_timeout, float(os.environ.get("DIAGNOSER_ENGINE_START_TIMEOUT", 0) or 0))
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(port_tries):
            log = open(self.log_path, "wb")  # noqa: SIM115 - the child holds it; closed with the process
            t0 = time.time()
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                                         cwd=self.workdir, start_new_session=True)
            log.close()
            _STARTED.append(self)
            while time.time() < t0 + limit:
                if self.proc.poll() is not None:
                    break
                try:
                    if self.ready():
                        self.startup_s = time.time() - t0
                        self.after_ready()
                        return self
                except OSError:
                    pass
                time.sleep(1)
            else:
                self.stop()
                raise RuntimeError(f"{self.name} did not become ready in {limit:.0f} s; see {self.log_path}:\n" + self._tail())
            code = self.proc.returncode
            self.stop()
            if attempt + 1 < port_tries and any(m in self.log_path.read_bytes() for m in PORT_IN_USE):
                self.port = free_port()
                continue
            raise RuntimeError(f"{self.name} exited with {code} during start-up; see {self.log_path}:\n" + self._tail())
        raise AssertionError("unreachable")

    def after_ready(self) -> None:
        """Called once the server answers (an engine may place its processes here); nothing by default."""

    def stop(self) -> None:
        """End the server's whole process group (also when its first process has already exited and left
        workers behind) and wait until it is gone: SIGTERM, then SIGKILL after ``stop_grace`` s."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group's id is its first process's id
        for sig, grace in ((signal.SIGTERM, self.stop_grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + grace
            while (self.proc.poll() is None or group_alive(pgid)) and time.time() < deadline:
                time.sleep(0.2)
            if self.proc.poll() is not None and not group_alive(pgid):
                break
        self.proc = None
        _STARTED[:] = [x for x in _STARTED if x is not self]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Engine(ServerProcess):
    """A running SGLang server; use as a context manager."""

    name: ClassVar[str] = "SGLang"

    def command(self) -> list[str]:
        return [
            str(self.py), "-m", "sglang.launch_server", "--model-path", str(self.model), "--served-model-name", "tiny-llama",
            "--device", "cpu", "--host", "127.0.0.1", "--port", str(self.port), "--attention-backend", "torch_native",
            "--sampling-backend", "pytorch", "--enable-metrics", "--sleep-on-idle", "--log-level", "info", *self.flags,
        ]

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.update(SGLANG_USE_CPU_ENGINE="1", PYTHONPATH=str(ensure_stub()) + os.pathsep + env.get("PYTHONPATH", ""))
        return env

    def ready(self) -> bool:
        code, _ = http_get(self.url + "/model_info", timeout=2)
        return code == 200 and b"ready to roll" in self.log_path.read_bytes()


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    wall_s: float = 0.0
    completion_tokens: int = 0
    errors: list[str] = field(default_factory=list)


def bounded_load(n: int, concurrency: int, send: Callable[[int, float], int], timeout: float = 300,
                 stop: threading.Event | None = None, result: LoadResult | None = None) -> LoadResult:
    """Send requests ``0 … n-1`` with ``concurrency`` in flight: ``send(i, seconds_left)`` makes request
    ``i`` and returns its completion tokens (an exception counts it failed, and the load goes on). Bounded
    in count and time; ``stop`` ends the sending early; ``result`` (optional) is filled in place so a caller
    can read the counts while requests are still in flight."""
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
                res.sent += 1
            try:
                tokens = send(i, max(5.0, deadline - time.time()))
                with lock:
                    res.ok += 1
                    res.completion_tokens += tokens
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


def post_json(url: str, body: dict[str, Any], timeout: float) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_load(url: str, n: int, concurrency: int, max_new_tokens: int, prompt_reps: int = 4, ignore_eos: bool = False,
             timeout: float = 300, stop: threading.Event | None = None, result: LoadResult | None = None,
             shared_prefix: bool = False) -> LoadResult:
    """Send ``n`` SGLang ``/generate`` requests with ``concurrency`` in flight (:func:`bounded_load`). Each
    prompt has a unique line: first (no prefix is shared, the default) or, with ``shared_prefix``, last
    (every prompt shares the ``prompt_reps`` body)."""
    base = "def f(x):\n    return x + 1\n"

    def send(i: int, left: float) -> int:
        prompt = base * prompt_reps + f"# request {i}\n" if shared_prefix else f"# request {i}\n" + base * prompt_reps
        out = post_json(url + "/generate", {"text": prompt, "sampling_params": {
            "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos, "temperature": 1.0}}, left)
        return int(out.get("meta_info", {}).get("completion_tokens", 0))

    return bounded_load(n, concurrency, send, timeout, stop, result)


class RunRecorder:
    """Record a run the way tests/data/sglang-cpu-real/ holds one: ``metrics/metrics_<n>_<epoch>.prom``
    (a /metrics scrape every ``interval`` s, as served), ``get_server_info.json``, ``get_model_info.json``,
    and at :meth:`finish` the server log so far and ``load_summary.json``. ``diagnose --once --replay DIR``
    reads it; ``diagnose compare BEFORE AFTER`` compares two."""

    INFO: ClassVar[tuple[tuple[str, str], ...]] = (("/get_server_info", "get_server_info.json"),
                                                   ("/get_model_info", "get_model_info.json"))

    def __init__(self, engine: ServerProcess, out: Path, interval: float = 2.0) -> None:
        self.engine, self.out, self.interval = engine, out, interval
        (out / "metrics").mkdir(parents=True, exist_ok=True)
        for path, name in self.INFO:
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
