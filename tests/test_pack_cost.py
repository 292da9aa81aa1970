"""What a model's first use costs, said before it starts: `plan`, the model
picker, the first-use note and the loading panel give the conversion's time
(from the converter's rate measured on this machine) and disk."""
from __future__ import annotations

import json

import pytest
from rapidmoe.app.cli import main
from rapidmoe.app.tui.screens.chat_loading import ConversionClock
from rapidmoe.app.catalog import available_models, recommended_models
from rapidmoe.engine.hub.demo import demo_cache_path
from rapidmoe.engine.pack import cost as pack_cost
from rapidmoe.engine.pack.convert import convert
from rapidmoe.engine.synth.model import write_synthetic


@pytest.fixture()
def src(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path / "cache"))  # no pack, no recorded rate
    return write_synthetic(tmp_path / "m.gguf", "qwen3moe", seed=21, dtype="q8_0", n_layer=2)


def test_plan_and_the_first_use_note_say_time_and_disk_before_converting(src, capsys):
    assert main(["plan", "-m", str(src), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    c = d["conversion"]
    assert c["weights_per_s"] > 0 and c["seconds"] == pytest.approx(c["weights"] / c["weights_per_s"])
    assert c["rate_from"] == "a test conversion of its first experts"
    assert "first use converts" in d["disk_note"] and "M weights/s" in d["disk_note"] and "of disk" in d["disk_note"]
    notes = []
    out = convert(src, log=notes.append)
    assert notes[0].startswith("first use of this model: converting") and "of disk in" in notes[0]
    assert out.stat().st_size == c["pack_bytes"]  # the pack's layout was planned, not guessed
    assert main(["plan", "-m", str(src), "--json"]) == 0
    assert "conversion" not in json.loads(capsys.readouterr().out)  # converted: nothing more to say


def test_converter_rate_is_measured_once_then_recorded(src):
    rate, how = pack_cost.converter_rate()
    assert rate > 0 and how == "a quick measurement"
    assert pack_cost.converter_rate() == (rate, how)  # read back, not measured again
    pack_cost.record_rate(30_000_000, 3.0)
    assert pack_cost.converter_rate() == (10_000_000, "the last conversion")
    pack_cost.record_rate(1000, 0.01)  # too short to say anything: kept as it was
    assert pack_cost.converter_rate()[0] == 10_000_000


def test_the_picker_says_what_first_use_costs_until_the_pack_is_made(src):
    demo = demo_cache_path()
    demo.parent.mkdir(parents=True)
    demo.write_bytes(src.read_bytes())
    label = dict(available_models())["demo"]
    assert "first use: about" in label and "to convert" in label and "of disk" in label
    convert(demo)
    assert "first use" not in dict(available_models())["demo"]
    assert all("to convert" in label for spec, label in recommended_models() if spec)


def test_the_loading_panel_counts_down_the_conversion(src):
    pack_cost.record_rate(100_000_000, 5.0)  # 20 M weights/s
    clock = ConversionClock()
    assert clock.left(0, 600_000_000) == " · about 30 s left"
    assert clock.left(600_000_000, 600_000_000) == ""


def test_without_a_recorded_rate_the_panel_waits_for_the_conversion_s_own(tmp_path, monkeypatch):
    """No rate is timed on the UI thread while a conversion keeps the CPU busy (it would
    be recorded slow): the panel says nothing until the conversion has measured itself."""
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path))
    clock = ConversionClock()
    assert clock.left(0, 600_000_000) == "" and pack_cost.last_rate() is None
