"""`rapidmoe-chat paths`: where config, chat history, cache, packs and models live."""
from __future__ import annotations

import json
from pathlib import Path

from ..engine.paths import cache_dir, config_dir, data_dir
from .cmd_list import packs_dir
from .config import config_path
from .store import db_path


def locations() -> dict[str, str]:
    from ..engine.hub.cache import hub_cache_dir  # deferred: loads huggingface_hub
    from ..engine.hub.demo import demo_cache_path  # deferred: loads gguf, numpy

    return {
        "config": str(config_path()),
        "config dir": str(config_dir()),
        "history": str(db_path()),
        "data dir": str(data_dir()),
        "cache dir": str(cache_dir()),
        "packs": str(packs_dir()),
        "demo model": str(demo_cache_path()),
        "hf cache": str(hub_cache_dir()),
    }


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON object")


def run(args) -> int:
    locs = locations()
    if args.json:
        print(json.dumps(locs))
        return 0
    width = max(map(len, locs))
    for k, v in locs.items():
        note = "" if Path(v).exists() else "  (not created yet)"
        print(f"{k.ljust(width)}  {v}{note}")
    print("\nenvironment overrides: RAPIDMOE_CONFIG_DIR, RAPIDMOE_DATA_DIR, RAPIDMOE_CACHE_DIR, "
          "HF_HOME / HF_HUB_CACHE")
    return 0
