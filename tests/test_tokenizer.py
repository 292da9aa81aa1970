"""Tokenizer against llama.cpp's own output (tests/refs/tokenizer_*.json, written by
scripts/make_tokenizer_refs.py) on SmolLM2's and a Qwen2-family vocabulary under
several pre-tokenizers, and on a small SentencePiece vocabulary."""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np
import pytest

from rapidmoe.engine.errors import UserError
from rapidmoe.engine.gguf.reader import read_metadata
from rapidmoe.engine.synth.tokenizer import QWEN_DIST, QWEN_FILE, SMOLLM2_DIST, SMOLLM2_FILE, locate
from rapidmoe.engine.text.tokenizer import Tokenizer

REFS = Path(__file__).parent / "refs"
CASES = sorted(p.stem[len("tokenizer_"):] for p in REFS.glob("tokenizer_*.json")
               if p.stem != "tokenizer_spm_vocab")


@functools.lru_cache(maxsize=None)
def real_metadata(vocab: str) -> dict:
    """GGUF key/values of a real vocabulary: 'smollm2', 'qwen', or 'spm' (committed)."""
    if vocab == "smollm2":
        return read_metadata(locate(SMOLLM2_DIST, SMOLLM2_FILE))
    if vocab == "qwen":
        return read_metadata(locate(QWEN_DIST, QWEN_FILE))
    v = json.loads((REFS / "tokenizer_spm_vocab.json").read_text(encoding="utf-8"))
    return {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": v["tokens"],
        "tokenizer.ggml.scores": np.array(v["scores"], np.float32),
        "tokenizer.ggml.token_type": np.array(v["token_type"], np.int32),
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def make_tokenizer(vocab: str, **overrides) -> Tokenizer:
    """A Tokenizer from one of the real vocabularies, with metadata keys overridden
    (None removes a key); `extra_merges` appends merges and the normal tokens they make."""
    meta = dict(real_metadata(vocab))
    extra = overrides.pop("extra_merges", None)
    if extra:
        new = [m.replace(" ", "") for m in extra]
        meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"]) + new
        meta["tokenizer.ggml.merges"] = list(meta["tokenizer.ggml.merges"]) + list(extra)
        meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [1] * len(new)
    meta.update(overrides)
    return Tokenizer.from_metadata({k: v for k, v in meta.items() if v is not None})


@functools.lru_cache(maxsize=None)
def case(name: str) -> tuple[dict, Tokenizer]:
    ref = json.loads((REFS / f"tokenizer_{name}.json").read_text(encoding="utf-8"))
    return ref, make_tokenizer(ref["vocab"], **dict(ref["overrides"]))


@pytest.mark.parametrize("name", CASES)
def test_ids_equal_llama_cpp(name):
    ref, tok = case(name)
    bad = []
    for e in ref["encode"]:
        got = tok.encode(e["text"], add_special=e["add_special"], parse_special=e["parse_special"])
        if got != e["ids"]:
            bad.append((e["text"], e["add_special"], e["parse_special"], got, e["ids"]))
    assert not bad, f"{len(bad)} of {len(ref['encode'])} differ; first: {bad[0]}"


@pytest.mark.parametrize("name", CASES)
def test_specials_equal_llama_cpp(name):
    ref, tok = case(name)
    assert tok.n_vocab == ref["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (ref["bos"], ref["eos"], ref["add_bos"])
    assert tok.eog_ids == frozenset(ref["eog"])
    assert [i for i in range(tok.n_vocab) if tok.is_control(i)] == ref["hidden"]


@pytest.mark.parametrize("name", CASES)
def test_pieces_equal_llama_cpp(name):
    ref, tok = case(name)
    for sid, (plain, special) in ref["pieces"].items():
        i = int(sid)
        assert tok.piece(i).hex() == plain, (i, tok.token_text(i))
        assert tok.piece(i, special=True).hex() == special, (i, tok.token_text(i))
        assert tok.token_bytes(i).hex() == special


@pytest.mark.parametrize("name", ["spm", "spm_noprefix", "qwen", "qwen_deepseek3"])
def test_decode_equals_llama_detokenize(name):
    # these vocabularies have llama.cpp's space clean-up off, so its detokenizer is our decode
    ref, tok = case(name)
    for e in ref["encode"]:
        assert tok.decode(e["ids"]) == bytes.fromhex(e["detok"]).decode("utf-8", "replace"), e["text"]


def test_bpe_round_trip_is_exact():
    _, tok = case("qwen")
    for text in ["x\x00y \U0001F9D1\u200d\U0001F52C ok", "  \n\t spaces ", "日本語 ½ 𝕄"]:
        assert tok.decode(tok.encode(text, add_special=False)) == text


def test_a_piece_outside_the_byte_alphabet_renders_as_llama_cpp_does():
    from rapidmoe.engine.text.bpe import byte_decode

    # a byte that was not UTF-8 in the file (kept as a surrogate escape) reads as U+FFFD
    raw = b"ab\xe9"
    text = raw.decode("utf-8", "surrogateescape")
    assert byte_decode(text) == b"ab[UNK_BYTE_0xefbfbd" + raw + b"]"
    # a real character outside the alphabet shows its own UTF-8
    assert byte_decode("\u4e2d") == b"[UNK_BYTE_0xe4b8ad\xe4\xb8\xad]"


def test_stream_decoder_never_splits_characters():
    _, tok = case("smollm2")
    text = "Emoji 👨‍👩‍👧‍👦 and CJK 东京 and é\u0301 done"
    ids = tok.encode(text, add_special=False)
    # SmolLM2 has no token for most of these characters: they arrive byte by byte
    assert len(ids) > len(text.split())
    dec = tok.stream_decoder()
    parts = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(parts) == text
    assert all("\ufffd" not in p for p in parts)
    # a cut-off character only becomes a replacement character at flush
    dec = tok.stream_decoder()
    first = tok.encode("😀", add_special=False)[0]
    assert tok.token_bytes(first) != "😀".encode()  # only part of the character
    assert dec.push(first) == ""
    assert dec.flush() == "\ufffd"


def test_stream_hides_control_tokens_unless_asked():
    _, tok = case("qwen")
    text = "<｜User｜><think>hi</think><｜end▁of▁sentence｜>"
    ids = tok.encode(text, add_special=False, parse_special=True)
    assert len(ids) == 5 and tok.is_control(ids[0]) and not tok.is_control(ids[1])
    assert ids[-1] in tok.eog_ids
    dec = tok.stream_decoder()
    # <think> is user-defined: rendered; <｜User｜> and the end token are control: hidden
    assert "".join(dec.push(i) for i in ids) + dec.flush() == "<think>hi</think>"
    assert tok.decode(ids) == "<think>hi</think>"
    dec = tok.stream_decoder(special=True)
    assert "".join(dec.push(i) for i in ids) + dec.flush() == text


def test_spm_leading_space_is_dropped_once():
    _, tok = case("spm")
    ids = tok.encode("Hello world", add_special=False)
    assert tok.token_text(ids[0]).startswith("\u2581")
    assert tok.decode(ids) == "Hello world"
    assert tok.decode([tok.bos_id] + ids) == " Hello world"  # as llama.cpp: BOS consumes the strip
    dec = tok.stream_decoder()
    assert "".join(dec.push(i) for i in ids) == " Hello world"


def test_encode_round_trips_a_long_mixed_text():
    """10k characters of mixed scripts, numbers and emoji through a fresh tokenizer
    (nothing cached). Its time is printed, not asserted: speed is for benchmarks."""
    tok = make_tokenizer("qwen")
    words = ("The router sends each token to a few experts, and 12,345 tokens/s is a nice "
             "rate — 东京 café 🚀.\n").split(" ")
    rng = np.random.default_rng(0)
    text = " ".join(words[i] for i in rng.integers(0, len(words), 2500))[:10_000]
    t = time.perf_counter()
    ids = tok.encode(text)
    print(f"encode: {time.perf_counter() - t:.3f} s for 10k characters, {len(ids)} tokens")
    assert tok.decode(ids[1:]) == text


def test_bad_metadata_is_a_user_error():
    with pytest.raises(UserError, match="tokenizer.ggml.pre"):
        make_tokenizer("smollm2", **{"tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(UserError, match="tokenizer model"):
        make_tokenizer("smollm2", **{"tokenizer.ggml.model": "bert"})
    with pytest.raises(UserError, match="tokens"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2"})
    _, tok = case("smollm2")
    with pytest.raises(ValueError):
        tok.token_bytes(tok.n_vocab)
