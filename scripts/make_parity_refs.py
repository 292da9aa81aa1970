"""Write llama.cpp reference files for the parity tests (tests/refs/parity_*.json).

Run where llama-cpp-python 0.3.36 is installed (built with the flags in the
README); CI only reads the committed JSON files. For every synthetic fixture
and the demo model: token ids of a fixed text, the top-20 log-softmax values at
a few positions, and a 16-token greedy continuation, with llama.cpp's KV cache
in f32 (its f16 default alone moves logits by ~2e-3).

    python scripts/make_parity_refs.py [name ...]
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from parity_cases import CASES, PROMPT, build_case  # noqa: E402

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


def main(names: list[str]) -> None:
    out_dir = ROOT / "tests" / "refs"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names or list(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            path = build_case(name, Path(tmp))
            ref = {"case": name, "prompt": PROMPT, **reference(path)}
        (out_dir / f"parity_{name}.json").write_text(json.dumps(ref, indent=1) + "\n")
        print(f"{name}: {len(ref['tokens'])} tokens, greedy {ref['greedy'][:4]}...")


if __name__ == "__main__":
    main(sys.argv[1:])
