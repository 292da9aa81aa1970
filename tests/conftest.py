"""Every test runs with its own user cache, config and data dirs, and an HF cache
that is empty unless a test fills it."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("userdirs")
    env = {
        "RAPIDMOE_CACHE_DIR": str(root / "cache"),
        "RAPIDMOE_CONFIG_DIR": str(root / "config"),
        "RAPIDMOE_DATA_DIR": str(root / "data"),
        "HF_HOME": str(root / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield root
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
