"""Where config, data (chat history), cache (packs, demo model) and models live.

platformdirs locations, each overridable by an environment variable so tests and
users can point them elsewhere: RAPIDMOE_CONFIG_DIR, RAPIDMOE_DATA_DIR,
RAPIDMOE_CACHE_DIR.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import platformdirs

APP = "rapidmoe-chat"
_KILL_AT = int(os.environ.get("RAPIDMOE_FAULT_KILL_AT") or 0)
_points = 0


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


def fault_point() -> None:
    """Called before every write, fsync, rename and unlink of a conversion or a
    calibration record. The crash tests set RAPIDMOE_FAULT_KILL_AT=N to SIGKILL
    the process before the N-th: a kill -9 at an exact point, repeatable."""
    global _points
    _points += 1
    if _points == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
