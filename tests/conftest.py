from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DIAGNOSER_SHARED", ROOT.parent / "shared"))
DATA = SHARED / "data"
ARTIFACTS = ROOT / "test-artifacts"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need_shared() -> None:
    if not DATA.exists():
        if IN_CI:
            pytest.fail(f"shared data not found at {DATA}; CI must have ../shared beside the clone")
        pytest.skip(f"shared data not found at {DATA} (set DIAGNOSER_SHARED)")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    need_shared()
    return DATA


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
