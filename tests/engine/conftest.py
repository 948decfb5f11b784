"""Fixtures for the live tests against real engines on CPU (marker ``engine``): SGLang 0.5.23
(``support``) and vLLM 0.32.0 (``vllm_support``, the ``vllm_*`` fixtures).

In CI (``CI=true``) these tests must run: a missing prerequisite is a failure there. On a
contributor's machine without the disk space they skip with a loud message naming the cause.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.engine import support, vllm_support

MIN_FREE_GB = 12.0


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


@pytest.fixture(scope="session")
def engine_python() -> Path:
    if sys.platform != "linux":
        _unavailable("the CPU engine recipe is Linux-only")
    if not support.engine_dir().joinpath("venv.ok").exists():
        free = support.free_disk_gb(support.cache_root())
        if free < MIN_FREE_GB:
            _unavailable(f"only {free:.1f} GiB free under {support.cache_root()}; the engine venv needs about 7 GiB (set DIAGNOSER_ENGINE_CACHE elsewhere)")
    t0 = time.time()
    try:
        py = support.ensure_venv()
    except Exception as e:  # noqa: BLE001 - report the build failure as the reason
        _unavailable(f"building the engine venv failed ({e}); see {support.engine_dir() / 'build.log'}")
    print(f"[engine] venv ready in {time.time() - t0:.1f} s at {py}", file=sys.stderr)
    return py


@pytest.fixture(scope="session")
def tiny_model(engine_python: Path) -> Path:
    return support.ensure_model(engine_python)


@pytest.fixture
def engine_factory(engine_python: Path, tiny_model: Path, tmp_path: Path) -> Iterator[object]:
    started: list[support.Engine] = []

    def make(flags: list[str], name: str = "engine") -> support.Engine:
        eng = support.Engine(engine_python, tiny_model, flags, tmp_path / name)
        started.append(eng)
        eng.start()
        print(f"[engine] {name}: SGLang ready in {eng.startup_s:.1f} s on {eng.url}", file=sys.stderr)
        return eng

    try:
        yield make
    finally:
        for eng in started:
            eng.stop()


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    if sys.platform != "linux":
        _unavailable("the CPU engine recipe is Linux-only", "VLLM")
    if not vllm_support.engine_dir().joinpath("venv.ok").exists():
        free = support.free_disk_gb(support.cache_root())
        if free < MIN_FREE_GB:
            _unavailable(f"only {free:.1f} GiB free under {support.cache_root()}; the vLLM venv needs about 4 GiB "
                         "(set DIAGNOSER_ENGINE_CACHE elsewhere)", "VLLM")
    t0 = time.time()
    try:
        py = vllm_support.ensure_vllm_venv()
    except Exception as e:  # noqa: BLE001 - report the build failure as the reason
        _unavailable(f"building the vLLM venv failed ({e}); see {vllm_support.engine_dir() / 'build.log'}", "VLLM")
    print(f"[vllm] venv ready in {time.time() - t0:.1f} s at {py}", file=sys.stderr)
    return py


@pytest.fixture(scope="session")
def vllm_model(vllm_python: Path) -> Path:
    return vllm_support.ensure_model(vllm_python)


@pytest.fixture
def vllm_factory(vllm_python: Path, vllm_model: Path, tmp_path: Path) -> Iterator[object]:
    """Start vLLM servers (one at a time: each earlier one is stopped first); all stopped at the end."""
    started: list[vllm_support.VllmEngine] = []

    def make(flags: list[str], name: str = "vllm") -> vllm_support.VllmEngine:
        for old in started:
            old.stop()
        eng = vllm_support.VllmEngine(vllm_python, vllm_model, flags, tmp_path / name)
        started.append(eng)
        eng.start()
        print(f"[vllm] {name}: vLLM ready in {eng.startup_s:.1f} s on {eng.url}", file=sys.stderr)
        return eng

    try:
        yield make
    finally:
        for eng in started:
            eng.stop()


def diagnose_bin() -> str:
    exe = Path(sys.executable).with_name("diagnose")
    return str(exe) if exe.exists() else "diagnose"


@pytest.fixture
def ci_env() -> dict[str, str]:
    return dict(os.environ)
