"""Providers from config.toml:

    [providers.cluster]
    base_url = "http://gpu-node:8000/v1"
    api_key_env = "CLUSTER_API_KEY"   # the key is read from this variable, else the OS keyring
    model = "deepseek-ai/DeepSeek-R1"  # optional default

`-m NAME:MODEL` (or NAME alone, with its default model) names one; `--endpoint
URL` (MODEL@URL as one spec) needs no config. Keys are never written anywhere."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Mapping

from ...engine.errors import UserError
from .client import Endpoint


def _key(name: str, env_var: str | None, env: Mapping[str, str]) -> str | None:
    if env_var and env.get(env_var):
        return env[env_var]
    try:
        import keyring  # optional: the OS keyring, service "rapidmoe-chat", user = provider name
    except ImportError:
        return None
    try:
        return keyring.get_password("rapidmoe-chat", name)
    except Exception:  # noqa: BLE001 - no keyring backend: no key
        return None


def provider_table(path: Path | None = None) -> dict[str, dict]:
    """config.toml's [providers], checked: name -> its keys."""
    from ..config import config_path  # deferred: loads platformdirs

    path = path or config_path()
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"{path}: cannot read providers ({e})") from None
    table = data.get("providers", {})
    if not isinstance(table, dict):
        raise UserError(f"{path}: [providers] must be a table")
    for name, p in table.items():
        where = f"{path}: providers.{name}"
        if not isinstance(p, dict) or not isinstance(p.get("base_url"), str):
            raise UserError(f"{where} needs base_url = \"http://HOST:PORT/v1\"")
        for k in ("api_key_env", "model"):
            if k in p and not isinstance(p[k], str):
                raise UserError(f"{where}.{k} must be a string")
        if "api_key" in p:
            raise UserError(f"{where}: put the key in an environment variable and name it in api_key_env")
    return table


def provider_endpoint(name: str, p: dict, env: Mapping[str, str] | None = None) -> Endpoint:
    """One entry of provider_table() with its key (looked up now: the keyring may be slow)."""
    env = os.environ if env is None else env
    return Endpoint(p["base_url"], _key(name, p.get("api_key_env"), env), p.get("model"), name)


def load_providers(path: Path | None = None, env: Mapping[str, str] | None = None) -> dict[str, Endpoint]:
    env = os.environ if env is None else env
    return {name: provider_endpoint(name, p, env) for name, p in provider_table(path).items()}


def endpoint_spec(model: str | None, url: str) -> str:
    """`--endpoint URL -m MODEL` as one model spec, MODEL@URL: what the TUI loads, lists and
    keeps as its last model (the key stays in RAPIDMOE_ENDPOINT_KEY)."""
    return f"{model or ''}@{url}"


def _endpoint_of_spec(spec: str) -> tuple[str | None, str] | None:
    for scheme in ("@http://", "@https://"):
        at = spec.find(scheme)
        if at >= 0:
            return spec[:at] or None, spec[at + 1:]
    return None


def resolve(spec: str | None, endpoint: str | None = None, providers: dict[str, Endpoint] | None = None,
            env: Mapping[str, str] | None = None) -> Endpoint | None:
    """`--endpoint URL` (with -m as the model; no model: the server's own), MODEL@URL, or
    `-m NAME[:MODEL]` naming a provider; None: a local model."""
    env = os.environ if env is None else env
    if not endpoint and spec and (at := _endpoint_of_spec(spec)):
        spec, endpoint = at
    if endpoint:
        return Endpoint(endpoint, env.get("RAPIDMOE_ENDPOINT_KEY") or None, spec or None)
    if not spec:
        return None
    name, _, model = spec.partition(":")
    if providers is None:  # only the named provider's key is looked up (the keyring may be slow)
        table = provider_table()
        if name not in table:
            return None
        ep = provider_endpoint(name, table[name], env)
    elif name in providers:
        ep = providers[name]
    else:
        return None
    model = model or ep.model
    if not model:
        raise UserError(f"provider {name} has no default model: use -m {name}:MODEL")
    return Endpoint(ep.base_url, ep.api_key, model, name)
