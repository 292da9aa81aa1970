"""Values at the edges of what a flag, a config file, a calibration record or a
model's own sampling defaults can hold: each is one line and exit status 2
before anything is loaded (or, for a model's defaults, ignored), never a
traceback, an OverflowError or an OpenMP allocation of hundreds of GB."""
from __future__ import annotations

import json

import pytest

from fuzz_corpus import F32, KV, encode, synth_doc
from rapidmoe.app.cli import main


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("bounds") / "q3.gguf"
    path.write_bytes(encode(synth_doc("qwen3moe")))
    return path


def one_line(capsys, *fragments):
    err = capsys.readouterr().err  # (notes such as the first-use conversion may come before it)
    lines = [ln for ln in err.splitlines() if ln.startswith("rapidmoe-chat: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], err
    return lines[0]


@pytest.mark.parametrize("flag, value, fragment", [
    ("--temp", "nan", "--temp must be >= 0 and finite"),
    ("--temp", "inf", "--temp must be >= 0 and finite"),
    ("--repeat-penalty", "nan", "--repeat-penalty must be > 0 and finite"),
    ("--seed", str(2**70), "--seed must be in"),
    ("--seed", str(-2**70), "--seed must be in"),
    ("--threads", str(2**40), "--threads: must be in 1..1024"),
    ("--threads", str(10**9), "--threads: must be in 1..1024"),
    ("--threads", "0", "--threads: must be in 1..1024"),
])
def test_chat_flags(model, capsys, flag, value, fragment):
    assert main(["-m", str(model), "-p", "hi", "-n", "1", "--no-history", flag, value]) == 2
    one_line(capsys, fragment)


@pytest.mark.parametrize("argv", [["convert", "-m", "{m}"], ["bench", "-m", "{m}"], ["calibrate", "-m", "{m}"],
                                  ["eval", "-m", "{m}", "--prompt", "hello there"]])
def test_threads_bound_in_every_subcommand(model, capsys, argv):
    assert main([a.format(m=model) for a in argv] + ["--threads", str(10**9)]) == 2
    one_line(capsys, "--threads: must be in 1..1024")


@pytest.mark.parametrize("flag", ["--dram-budget", "--vram-budget"])
@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "-1"])
def test_plan_budgets(model, capsys, flag, value):
    assert main(["plan", "-m", str(model), flag, value]) == 2
    one_line(capsys, flag)


def test_seed_at_the_edges_still_runs(model, capsys):
    for seed in (str(2**64 - 1), str(-2**63)):
        assert main(["-m", str(model), "-p", "hi", "-n", "1", "--no-history", "--seed", seed]) == 0


def test_config_file_that_is_not_utf8(model, capsys):
    from rapidmoe.app.config import config_path

    p = config_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b'[chat]\nsystem = "caf\xe9"\n')
    try:
        assert main(["-m", str(model), "-p", "hi", "-n", "1", "--no-history"]) == 2
        one_line(capsys, str(p), "not UTF-8")
    finally:
        p.unlink()


def test_calibrate_show_on_a_damaged_record(model, capsys):
    from rapidmoe.engine.plan.calibration import CALIB_VERSION, calibration_path

    rec = calibration_path(model)
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_text(json.dumps({"version": CALIB_VERSION, "model": "q3", "k": 4}))
    try:
        assert main(["calibrate", "-m", str(model), "--show"]) == 2
        line = one_line(capsys, str(rec), "damaged calibration record")
        assert "latency" in line
        assert capsys.readouterr().out == ""  # no half-printed table
    finally:
        rec.unlink()


def test_a_model_files_bad_sampling_defaults_are_ignored(tmp_path, capsys):
    """general.sampling.* come from the file: a NaN temperature must not reach the sampler."""
    from rapidmoe.engine.sampling import SamplingParams

    doc = synth_doc("qwen3moe").copy("sampling")
    doc.kvs += [KV("general.sampling.temp", F32, float("nan")), KV("general.sampling.top_p", F32, 0.5)]
    path = tmp_path / "s.gguf"
    path.write_bytes(encode(doc))
    assert main(["-m", str(path), "-p", "hi", "-n", "2", "--no-history"]) == 0
    p = SamplingParams.from_metadata({"general.sampling.temp": float("nan"), "general.sampling.top_p": 0.5})
    assert p.temperature == SamplingParams().temperature and p.top_p == 0.5


@pytest.mark.parametrize("temp", ["0", "0.8"])
def test_nan_logits_are_one_line(tmp_path, capsys, temp):
    """An output head of NaNs (a damaged file): greedy used to answer garbage, sampling a RuntimeError."""
    import dataclasses

    import numpy as np

    doc = synth_doc("qwen3moe").copy("nan")
    doc.tensors = [dataclasses.replace(t, data=np.full(len(t.data) // 4, np.nan, np.float32).tobytes())
                   if t.name == "output.weight" else t for t in doc.tensors]
    path = tmp_path / "nan.gguf"
    path.write_bytes(encode(doc))
    for precision in ("full", "split"):
        assert main(["-m", str(path), "-p", "hi", "-n", "2", "--no-history", "--temp", temp,
                     "--precision", precision]) == 2
        one_line(capsys, "NaN or infinite logits")


def test_the_engine_names_a_setting_its_own_way_and_the_app_names_the_flag():
    """SamplingParams speaks of its fields (a server or the TUI's /set show that); the CLI
    turns the field into the flag its user typed."""
    from rapidmoe.app.args import FLAG_OF, check_sampling
    from rapidmoe.engine.errors import SettingError, UserError
    from rapidmoe.engine.sampling import SamplingParams

    for field, bad in (("temperature", -1.0), ("top_p", 0.0), ("min_p", 2.0), ("top_k", -1),
                       ("repeat_penalty", float("nan")), ("max_tokens", 0), ("seed", 2**70)):
        p = SamplingParams(**{field: bad})
        with pytest.raises(SettingError) as e:
            p.validate()
        assert e.value.field == field and str(e.value) == f"{field} {e.value.rule}" and "--" not in str(e.value)
        with pytest.raises(UserError) as e2:
            check_sampling(p)
        assert str(e2.value) == f"{FLAG_OF[field]} {e.value.rule}"
