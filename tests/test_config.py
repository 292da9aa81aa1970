"""Config: defaults, the user's TOML, environment overrides, and the writer round trip."""
from __future__ import annotations

import tomllib

import pytest

from rapidmoe.app.config import dumps_toml, load_config, update_config_file
from rapidmoe.engine.errors import UserError


def test_defaults_come_from_the_packaged_file(tmp_path):
    cfg = load_config(tmp_path / "none.toml", env={})
    assert cfg.theme == "textual-dark" and cfg.model == "" and cfg.ctx == 0
    assert cfg.keys["send"] == "enter" and "ctrl+j" in cfg.keys["newline"]
    assert cfg.sampling == {}


def test_user_file_then_env(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text('[ui]\ntheme = "nord"\n[model]\nctx = 2048\n[sampling]\ntemperature = 1\nstop = "END"\n'
                 '[keys]\nregenerate = "f5"\n')
    cfg = load_config(p, env={})
    assert (cfg.theme, cfg.ctx, cfg.keys["regenerate"]) == ("nord", 2048, "f5")
    assert cfg.sampling == {"temperature": 1.0, "stop": ["END"]}
    assert isinstance(cfg.sampling["temperature"], float)
    cfg = load_config(p, env={"RAPIDMOE_THEME": "gruvbox", "RAPIDMOE_CTX": "512", "RAPIDMOE_MODEL": "x.gguf"})
    assert (cfg.theme, cfg.ctx, cfg.model) == ("gruvbox", 512, "x.gguf")


@pytest.mark.parametrize("text,msg", [
    ("[ui\ntheme=1", "not valid TOML"),
    ("[ui]\ntheme = 3\n", "ui.theme must be str"),
    ("[model]\nctx = -1\n", "ctx must be >= 0"),
    ("[sampling]\ntemprature = 0.5\n", "unknown sampling key 'temprature'"),
    ("[sampling]\ntop_k = true\n", "sampling.top_k must be int"),
    ("ui = 3\n", r"\[ui\] must be a table"),
    ("[sampling]\ntop_p = 1.5\n", r"sampling.top_p must be in \(0, 1\]"),
    ("[sampling]\nmax_tokens = 0\n", "sampling.max_tokens must be > 0"),
    ("[sampling]\ntemperature = -1\n", "sampling.temperature must be >= 0"),
    ('[chat]\nsystem = "caf\xe9"\n'.encode("latin-1"), "not UTF-8 text"),
])
def test_bad_config_is_one_clear_line(tmp_path, text, msg):
    p = tmp_path / "config.toml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UserError, match=msg) as e:
        load_config(p, env={})
    assert str(p) in str(e.value) and "\n" not in str(e.value).strip()


def test_a_bad_file_is_not_rewritten(tmp_path):
    p = tmp_path / "config.toml"
    p.write_bytes(b'[ui]\ntheme = "\xff"\n')
    with pytest.raises(UserError, match="not UTF-8"):
        update_config_file({"ui": {"theme": "nord"}}, p)
    assert p.read_bytes() == b'[ui]\ntheme = "\xff"\n'


def test_sampling_overrides_are_sampling_params_keywords(tmp_path):
    from rapidmoe.engine.sampling import SamplingParams

    p = tmp_path / "config.toml"
    p.write_text('[sampling]\nmax_tokens = 3\nstop = ["END", "##"]\ntop_k = 5\n')
    got = SamplingParams(top_k=40).with_overrides(**load_config(p, env={}).sampling_overrides())
    assert (got.max_tokens, got.stop, got.top_k, got.temperature) == (3, ("END", "##"), 5, 0.7)


def test_bad_env_ctx(tmp_path):
    with pytest.raises(UserError, match="RAPIDMOE_CTX"):
        load_config(tmp_path / "c.toml", env={"RAPIDMOE_CTX": "big"})


def test_update_keeps_other_keys_and_round_trips(tmp_path):
    p = tmp_path / "sub" / "config.toml"
    update_config_file({"ui": {"theme": "nord"}}, p)
    p.write_text(p.read_text() + '[keys]\nquit = "ctrl+x"\n')
    update_config_file({"ui": {"theme": "dracula"}, "chat": {"system": 'say "hi"\n\ttab \\ \x7f ü'}}, p)
    cfg = load_config(p, env={"RAPIDMOE_SYSTEM": "from env"})
    assert cfg.theme == "dracula" and cfg.keys["quit"] == "ctrl+x"
    assert cfg.system == "from env"  # env wins on load...
    assert tomllib.loads(p.read_text())["chat"]["system"] == 'say "hi"\n\ttab \\ \x7f ü'  # ...but is never written


def test_writer_values_parse_back():
    data = {"a": 1, "b": -2.5, "c": True, "d": ["x", "y z"], "e": float("inf"),
            "t": {"weird key": "v", "n": 0.1, "l": []}}
    assert tomllib.loads(dumps_toml(data)) == data
