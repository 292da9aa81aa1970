"""Write llama.cpp reference files for the parity tests (tests/refs/parity_*.json).

Run where llama-cpp-python 0.3.36 is installed (built with the flags in the
README); CI only reads the committed JSON files. For every synthetic fixture
and the demo model: token ids of a fixed text, the top-20 log-softmax values at
a few positions, and a 16-token greedy continuation, with llama.cpp's KV cache
in f32 (its f16 default alone moves logits by ~2e-3).

The quantized cases (parity_cases.QUANT_CASES) are made here first: llama.cpp's
quantizer turns the widened f32 synthetic file into Q8_0 / Q4_K_M / Q6_K (with
token_embd and output kept F32), the part CI cannot rebuild is written to
tests/refs/quant_<name>.gguf, and the reference is taken on the file the test
assembles from it, after checking that file's tensors are llama.cpp's bytes.

    python scripts/make_parity_refs.py [name ...]
"""
from __future__ import annotations

import ctypes
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from parity_cases import (CASES, FTYPES, QUANT_CASES, PROMPT, REFS, build_case,  # noqa: E402
                          quant_base, strip_quantized, tensor_rows)

TOP = 20
N_GREEDY = 16


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def reference(path: Path) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, logits_all=True,
                          type_k=0, type_v=0, n_threads=2, verbose=False)
    tokens = llm.tokenize(PROMPT.encode("utf-8"), add_bos=True, special=False)
    llm.eval(tokens)
    scores = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    T = len(tokens)
    positions = sorted({0, 1, T // 2, T - 1})
    top = []
    for p in positions:
        ls = log_softmax(scores[p])
        idx = np.argsort(-ls)[:TOP]
        top.append([[int(i), float(ls[i])] for i in idx])
    greedy = []
    last = scores[T - 1]
    for _ in range(N_GREEDY):
        nxt = int(np.argmax(last))
        greedy.append(nxt)
        llm.eval([nxt])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return {"tokens": [int(t) for t in tokens], "positions": positions, "top": top, "greedy": greedy,
            "llama_cpp_version": llama_cpp.__version__}


def quantize(name: str, tmp: Path) -> dict:
    """llama.cpp's quantized file for a QUANT_CASES entry -> tests/refs/quant_<name>.gguf;
    returns how many tensors of each type it has."""
    import llama_cpp
    from gguf import GGUFReader

    preset, ftype = QUANT_CASES[name]
    src = quant_base(preset, tmp)
    full = tmp / f"{name}.llama.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.token_embedding_type = 0  # GGML_TYPE_F32
    params.output_tensor_type = 0
    if llama_cpp.llama_model_quantize(str(src).encode(), str(full).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"{name}: llama_model_quantize failed")
    strip_quantized(full, REFS / f"quant_{name}.gguf")
    test_file = build_case(name, tmp)
    want = {t[0]: (t[1], t[2], bytes(t[3])) for t in tensor_rows(GGUFReader(full))}
    got = {t[0]: (t[1], t[2], bytes(t[3])) for t in tensor_rows(GGUFReader(test_file))}
    assert got == want, f"{name}: the assembled file's tensors differ from llama.cpp's"
    types: dict[str, int] = {}
    for _, qtype, _ in want.values():
        types[qtype.name] = types.get(qtype.name, 0) + 1
    return types


def main(names: list[str]) -> None:
    out_dir = ROOT / "tests" / "refs"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names or list(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            extra = {"tensor_types": quantize(name, Path(tmp))} if name in QUANT_CASES else {}
            path = build_case(name, Path(tmp))
            ref = {"case": name, "prompt": PROMPT, **extra, **reference(path)}
        (out_dir / f"parity_{name}.json").write_text(json.dumps(ref, indent=1) + "\n")
        print(f"{name}: {len(ref['tokens'])} tokens, greedy {ref['greedy'][:4]}...")


if __name__ == "__main__":
    main(sys.argv[1:])
