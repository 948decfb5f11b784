"""Fixtures for the live tests against real engines on CPU (marker ``engine``): SGLang 0.5.23
(``support``) and vLLM 0.32.0 (``vllm_support``, the ``vllm_*`` fixtures).

In CI (``CI=true``) these tests must run: a missing prerequisite is a failure there. On a
contributor's machine without the disk space they skip with a loud message naming the cause.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.engine import support, vllm_support

# disk each venv takes once built (measured here: SGLang 6.4 GiB, vLLM 3.5 GiB), and what a build needs
# free beyond it (pip unpacks each wheel before it installs it; the runs' logs and recordings)
VENV_GB = {"SGLANG": 7.0, "VLLM": 4.0}
MARGIN_GB = 3.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.engine)


def _unavailable(reason: str, engine: str = "SGLANG") -> None:
    msg = f"{engine} ENGINE TESTS NOT RUN: {reason}"
    print("\n" + "!" * 78 + f"\n{msg}\n" + "!" * 78, file=sys.stderr)
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


def engine_venv(engine: str, root: Path, build: Callable[[], Path]) -> Path:
    """The engine's cached venv, built the first time (its build time said): a loud skip, or under CI a
    failure, when it cannot be. Before a build, stale venvs of the same engine (older requirement lists)
    are removed when the disk is short of what the build needs."""
    if sys.platform != "linux":
        _unavailable("the CPU engine recipe is Linux-only", engine)
    fresh = not root.joinpath("venv.ok").exists()
    if fresh:
        need = VENV_GB[engine] + MARGIN_GB
        free = support.free_disk_gb(support.cache_root())
        if free < need:
            for d in support.prune_stale(root):
                print(f"[{engine.lower()}] removed the stale engine venv {d} (disk short)", file=sys.stderr)
            free = support.free_disk_gb(support.cache_root())
        if free < need:
            _unavailable(f"only {free:.1f} GiB free under {support.cache_root()}; the {engine.lower()} venv needs about "
                         f"{need:.0f} GiB to build (set DIAGNOSER_ENGINE_CACHE elsewhere)", engine)
    t0 = time.time()
    try:
        py = build()
    except Exception as e:  # noqa: BLE001 - report the build failure as the reason
        _unavailable(f"building the {engine.lower()} venv failed ({e}); see {root / 'build.log'}", engine)
    took = time.time() - t0
    print(f"[{engine.lower()}] venv ready in {took:.1f} s at {py}" + (f" (built now: {support.built_seconds(root)} s)" if fresh else
          f" (cached; it took {support.built_seconds(root)} s to build)"), file=sys.stderr)
    return py


@pytest.fixture(scope="session")
def engine_python() -> Path:
    return engine_venv("SGLANG", support.engine_dir(), support.ensure_venv)


@pytest.fixture(scope="session")
def tiny_model(engine_python: Path) -> Path:
    return support.ensure_model(engine_python)


def servers(cls: type[support.ServerProcess], py: Path, model: Path, tmp_path: Path, one_at_a_time: bool) -> Iterator[object]:
    """A factory ``make(flags, name)`` that starts ``cls`` servers (with ``one_at_a_time``, each earlier one is
    stopped first, to spare the memory); every one is stopped at the end, also when the test fails."""
    started: list[support.ServerProcess] = []
    tag = cls.name.lower()

    def make(flags: list[str], name: str = tag) -> support.ServerProcess:
        if one_at_a_time:
            for old in started:
                old.stop()
        eng = cls(py, model, flags, tmp_path / name)
        started.append(eng)
        eng.start()
        print(f"[{tag}] {name}: {cls.name} ready in {eng.startup_s:.1f} s on {eng.url}", file=sys.stderr)
        return eng

    try:
        yield make
    finally:
        for eng in started:
            eng.stop()


@pytest.fixture
def engine_factory(engine_python: Path, tiny_model: Path, tmp_path: Path) -> Iterator[object]:
    yield from servers(support.Engine, engine_python, tiny_model, tmp_path, one_at_a_time=False)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return engine_venv("VLLM", vllm_support.engine_dir(), vllm_support.ensure_vllm_venv)


@pytest.fixture(scope="session")
def vllm_model(vllm_python: Path) -> Path:
    return vllm_support.ensure_model(vllm_python)


@pytest.fixture
def vllm_factory(vllm_python: Path, vllm_model: Path, tmp_path: Path) -> Iterator[object]:
    """Start vLLM servers (one at a time: each earlier one is stopped first); all stopped at the end."""
    yield from servers(vllm_support.VllmEngine, vllm_python, vllm_model, tmp_path, one_at_a_time=True)


def diagnose_bin() -> str:
    exe = Path(sys.executable).with_name("diagnose")
    return str(exe) if exe.exists() else "diagnose"


@pytest.fixture
def ci_env() -> dict[str, str]:
    return dict(os.environ)
