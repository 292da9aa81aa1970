"""Where config, data (chat history), cache (packs, demo model) and models live.

platformdirs locations, each overridable by an environment variable so tests and
users can point them elsewhere: RAPIDMOE_CONFIG_DIR, RAPIDMOE_DATA_DIR,
RAPIDMOE_CACHE_DIR.
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "rapidmoe-chat"


def _dir(env: str, default: str) -> Path:
    p = Path(os.environ.get(env) or default)
    return p


def config_dir() -> Path:
    return _dir("RAPIDMOE_CONFIG_DIR", platformdirs.user_config_dir(APP))


def data_dir() -> Path:
    return _dir("RAPIDMOE_DATA_DIR", platformdirs.user_data_dir(APP))


def cache_dir() -> Path:
    return _dir("RAPIDMOE_CACHE_DIR", platformdirs.user_cache_dir(APP))


def fsync_dir(d: Path) -> None:
    """Make a rename in `d` durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
