"""Settings: assets/default_config.toml, then the user's config.toml, then the
environment (RAPIDMOE_THEME, RAPIDMOE_MODEL, RAPIDMOE_CTX, RAPIDMOE_SYSTEM).
The TUI and `-p` read them alike; command-line flags win over them, and they win
over the model's own defaults (GGUF general.sampling.*).

Only keys the app changes on purpose (the theme, say) are ever written back, and
only into the user's file: values that came from the environment never leak
into it.
"""
from __future__ import annotations

import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..engine.errors import SettingError, UserError
from ..engine.paths import config_dir

if TYPE_CHECKING:
    from ..engine.sampling import SamplingParams

CONFIG_NAME = "config.toml"
SAMPLING_KEYS = {"temperature": float, "top_k": int, "top_p": float, "min_p": float,
                 "repeat_penalty": float, "seed": int, "max_tokens": int, "stop": list}
ENV = {"RAPIDMOE_THEME": ("ui", "theme"), "RAPIDMOE_MODEL": ("model", "default"),
       "RAPIDMOE_CTX": ("model", "ctx"), "RAPIDMOE_SYSTEM": ("chat", "system")}


def config_path() -> Path:
    return config_dir() / CONFIG_NAME


def default_text() -> str:
    return resources.files("rapidmoe.assets").joinpath("default_config.toml").read_text("utf-8")


@dataclass
class Config:
    theme: str = "textual-dark"
    refresh_hz: int = 25
    model: str = ""  # "" = last used, else the demo
    ctx: int = 0  # 0 = the model's default
    system: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams overrides
    keys: dict[str, str] = field(default_factory=dict)  # action -> "key1,key2"
    path: Path | None = None  # the user's file (may not exist)

    def sampling_overrides(self) -> dict[str, Any]:
        """[sampling] as SamplingParams.with_overrides keywords (lists become tuples)."""
        return {k: tuple(v) if isinstance(v, list) else v for k, v in self.sampling.items()}


def _parse(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{where}: not valid TOML ({e})") from None


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None


def _check_sampling(where: str, key: str, value: Any) -> None:
    """The ranges -p and the TUI enforce on flags, for a config value (one line naming the key)."""
    if key == "stop":
        return
    from ..engine.sampling import SamplingParams  # torch: only when the config sets sampling keys

    try:
        SamplingParams().with_overrides(**{key: value}).validate()
    except SettingError as e:
        raise UserError(f"{where}: sampling.{key} {e.rule}") from None


def _typed(where: str, key: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is list:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise UserError(f"{where}: {key} must be a list of strings")
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise UserError(f"{where}: {key} must be {kind.__name__}, not {type(value).__name__}")
    return value


def _apply(cfg: Config, data: Mapping[str, Any], where: str) -> None:
    ui, model, chat = data.get("ui", {}), data.get("model", {}), data.get("chat", {})
    for table, name in ((ui, "ui"), (model, "model"), (chat, "chat"),
                        (data.get("sampling", {}), "sampling"), (data.get("keys", {}), "keys")):
        if not isinstance(table, dict):
            raise UserError(f"{where}: [{name}] must be a table")
    if "theme" in ui:
        cfg.theme = _typed(where, "ui.theme", ui["theme"], str)
    if "refresh_hz" in ui:
        cfg.refresh_hz = max(1, min(120, _typed(where, "ui.refresh_hz", ui["refresh_hz"], int)))
    if "default" in model:
        cfg.model = _typed(where, "model.default", model["default"], str)
    if "ctx" in model:
        cfg.ctx = _typed(where, "model.ctx", model["ctx"], int)
        if cfg.ctx < 0:
            raise UserError(f"{where}: model.ctx must be >= 0")
    if "system" in chat:
        cfg.system = _typed(where, "chat.system", chat["system"], str)
    for k, v in data.get("sampling", {}).items():
        if k not in SAMPLING_KEYS:
            raise UserError(f"{where}: unknown sampling key {k!r} (known: {', '.join(SAMPLING_KEYS)})")
        cfg.sampling[k] = _typed(where, f"sampling.{k}", v, SAMPLING_KEYS[k])
        _check_sampling(where, k, cfg.sampling[k])
    for k, v in data.get("keys", {}).items():
        cfg.keys[k] = _typed(where, f"keys.{k}", v, str)


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    path = path or config_path()
    cfg = Config(path=path)
    _apply(cfg, _parse(default_text(), "default_config.toml"), "default_config.toml")
    if path.is_file():
        _apply(cfg, _parse(_read(path), str(path)), str(path))
    overrides: dict[str, dict[str, Any]] = {}
    for var, (table, key) in ENV.items():
        if var in env:
            val: Any = env[var]
            if key == "ctx":
                try:
                    val = int(val)
                except ValueError:
                    raise UserError(f"{var}={val!r}: expected an integer") from None
            overrides.setdefault(table, {})[key] = val
    _apply(cfg, overrides, "environment")
    return cfg


def update_config_file(updates: Mapping[str, Mapping[str, Any]], path: Path | None = None) -> Path:
    """Merge {table: {key: value}} into the user's config.toml (created if absent)."""
    path = path or config_path()
    data = _parse(_read(path), str(path)) if path.is_file() else {}
    for table, kv in updates.items():
        data.setdefault(table, {}).update(kv)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("# rapidmoe-chat settings (see `rapidmoe-chat paths`; defaults in the package's "
                   "default_config.toml)\n" + dumps_toml(data), "utf-8")
    os.replace(tmp, path)
    return path


# --- a small TOML writer: tables of scalars and lists, which is all we write ---

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else _str(k)


def _str(s: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes; DEL must be escaped too
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps_toml(data: Mapping[str, Any]) -> str:
    top = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    out = "\n".join(top) + ("\n" if top else "")
    for k, v in data.items():
        if isinstance(v, dict):
            if any(isinstance(x, dict) for x in v.values()):
                raise TypeError("nested tables are not written")
            out += f"\n[{_key(k)}]\n" + "".join(f"{_key(kk)} = {_value(vv)}\n" for kk, vv in v.items())
    return out


def to_params(base: SamplingParams | None, *layers: Mapping[str, Any]) -> SamplingParams:
    """Apply override layers in order; lists (from TOML/JSON) become tuples."""
    if base is None:
        from ..engine.sampling import SamplingParams  # torch: only when no model gave the defaults

        base = SamplingParams()
    p = base
    for layer in layers:
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in (layer or {}).items()}
        if "seed" in kw and kw["seed"] is None:  # an explicit "no seed" in a chat's settings
            p = replace(p, seed=None)
            kw.pop("seed")
        p = p.with_overrides(**kw)
    return p
