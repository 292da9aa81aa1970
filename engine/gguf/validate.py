"""Every check a model file must pass before anything is sized from it, in one
place: the hyperparameters (hparams.py), each tensor the architecture needs
(presence, type, dimensions against the hyperparameters; engine/arch/<arch>.py
declares them) and the tokenizer's arrays. A failed check is one ModelFileError
naming the file, the tensor or key, what it has and what was expected.

Shapes compare as llama.cpp compares them: both padded to four dimensions with
1s, so a shared-expert gate stored as {n_embd, 1} is the {n_embd} vector it is.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from ..arch import ARCHS
from ..arch.spec import Need
from ..errors import ModelFileError, UserError
from ..hparams import ModelConfig, config_from_metadata
from ..text.pretokenize import pre_settings
from .reader import GGUFFile, TensorInfo

# the types the engine computes with (weights.py dequantizes them; the kernels multiply them)
SUPPORTED_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
                             T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K})
I8 = 24  # a pack's raw byte tensors
MAX_DIMS = 4


def padded(ne: tuple[int, ...]) -> tuple[int, ...]:
    """ne with trailing 1s up to four dimensions (ggml keeps every tensor 4-D)."""
    return tuple(ne) + (1,) * (MAX_DIMS - len(ne))


def same_shape(have: tuple[int, ...], want: tuple[int, ...]) -> bool:
    return len(have) <= MAX_DIMS and len(want) <= MAX_DIMS and padded(have) == padded(want)


def is_pack(meta: Mapping[str, Any]) -> bool:
    return "rapidmoe.pack.version" in meta


def _experts(c: ModelConfig, il: int, pack: bool) -> list[Need]:
    p, H, ff, E = f"blk.{il}.", c.n_embd, c.n_ff_exp, c.n_expert
    if not pack:
        return [Need(p + "ffn_gate_exps.weight", (H, ff, E)), Need(p + "ffn_up_exps.weight", (H, ff, E)),
                Need(p + "ffn_down_exps.weight", (ff, H, E))]
    from .. import kernels  # deferred: loads the compiled kernels

    out = []
    for kind, fmt in (("gate", "wq"), ("gate", "wr"), ("up", "wq"), ("up", "wr"), ("down", "wq"), ("down", "d4")):
        rows, n = (H, ff) if kind == "down" else (ff, H)
        out.append(Need(f"{p}ffn_{kind}_exps.{fmt}", (kernels.resplit_row_bytes(fmt, n), rows, E), ggml_type=I8))
    return out


def expected_tensors(c: ModelConfig, pack: bool = False) -> list[Need]:
    """Every tensor the engine reads for this configuration, with its ggml shape."""
    H, V = c.n_embd, c.n_vocab
    need = [Need("token_embd.weight", (H, V)), Need("output_norm.weight", (H,)), Need("output.weight", (H, V), False)]
    spec = ARCHS[c.arch]
    for il in range(c.n_layer):
        need += spec.layer_tensors(c, il)
        if spec.moe_layer(c, il):
            need += _experts(c, il, pack)
    return need


def check_tensors(g: GGUFFile, c: ModelConfig) -> None:
    path, pack = g.path, is_pack(g.metadata)
    for n in expected_tensors(c, pack):
        t: TensorInfo | None = g.tensors.get(n.name)
        if t is None:
            if n.required:
                raise ModelFileError(path, f"missing tensor {n.name} (expected shape {list(n.ne)}){_hint(g, n.name)}")
            continue
        if not same_shape(t.ne, n.ne):
            why = f" ({c.n_vocab} tokens in the vocabulary)" if n.name in ("token_embd.weight", "output.weight") else ""
            raise ModelFileError(path, f"tensor {n.name} has shape {list(t.ne)}, expected {list(n.ne)}{why}")
        ok = t.ggml_type == n.ggml_type if n.ggml_type is not None else t.ggml_type in SUPPORTED_TYPES
        if not ok:
            want = "I8" if n.ggml_type == I8 else "one of " + ", ".join(sorted(x.name for x in SUPPORTED_TYPES))
            raise ModelFileError(path, f"tensor {n.name} has unsupported type {t.type_name}, expected {want}")


def _hint(g: GGUFFile, name: str) -> str:
    fused = name.replace("ffn_gate_exps", "ffn_gate_up_exps").replace("ffn_up_exps", "ffn_gate_up_exps")
    if fused != name and fused in g.tensors:
        return f"; the file has the fused {fused}, which this version does not read"
    return ""


# ---- tokenizer metadata ----

def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _kind(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"an array of {v.dtype}"
    if isinstance(v, list):
        return "an array of strings"
    return {str: "a string", bool: "a bool", int: "an integer", float: "a float"}.get(type(v), type(v).__name__)


def check_tokenizer(meta: Mapping[str, Any], path: Any, n_vocab: int | None = None) -> None:
    """The tokenizer.* keys: types, lengths and ranges (as llama.cpp reads them)."""
    def bad(key: str, msg: str):
        raise ModelFileError(path, f"{key}: {msg}")

    p = "tokenizer.ggml."
    model = meta.get(p + "model")
    if not isinstance(model, str) or model not in ("gpt2", "llama"):
        has = repr(model) if isinstance(model, str) else _kind(model) if model is not None else "missing"
        bad(p + "model", f"is {has}, expected gpt2 (BPE) or llama (SentencePiece): the vocabularies this version reads")
    tokens = meta.get(p + "tokens")
    if not isinstance(tokens, list):
        bad(p + "tokens", f"is {_kind(tokens) if tokens is not None else 'missing'}, expected an array of strings")
    n = len(tokens)
    if n == 0:
        bad(p + "tokens", "is empty")
    if n_vocab is not None and n != n_vocab:
        bad(p + "tokens", f"has {n} tokens, expected {n_vocab} (the vocabulary size of the model's tensors)")
    for key, numeric in (("scores", np.floating), ("token_type", np.integer)):
        v = meta.get(p + key)
        if v is None:
            continue
        if not isinstance(v, np.ndarray) or not np.issubdtype(v.dtype, numeric):
            bad(p + key, f"is {_kind(v)}, expected an array of {'floats' if key == 'scores' else 'integers'}")
        if len(v) < n:  # (a type llama.cpp does not know just makes an undefined token, as there)
            bad(p + key, f"has {len(v)} entries, expected {n} (one per token)")
    names = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]  # llama.cpp's names for empty ones
    if len(set(names)) != n:  # llama.cpp asserts on these: an id per text, a text per id
        seen: set[str] = set()
        dup = next(t for t in names if t in seen or seen.add(t))
        bad(p + "tokens", f"holds {dup!r} more than once, expected each token once")
    merges = meta.get(p + "merges")
    if merges is not None and not isinstance(merges, list):
        bad(p + "merges", f"is {_kind(merges)}, expected an array of strings")
    pre = meta.get(p + "pre")
    if pre is not None and not isinstance(pre, str):
        bad(p + "pre", f"is {_kind(pre)}, expected a string")
    if model == "gpt2":
        if merges is None:
            bad(p + "merges", "is missing, expected the merges of the BPE vocabulary")

        try:
            pre_settings(pre)
        except UserError as e:
            raise ModelFileError(path, str(e)) from None
    for key in ("bos", "eos", "eot", "eom", "unknown", "padding", "sep", "cls", "mask", "fim_pre", "fim_suf",
                "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix", "middle"):
        v = meta.get(f"{p}{key}_token_id")
        if v is not None and not _is_int(v):
            bad(f"{p}{key}_token_id", f"is {_kind(v)}, expected an integer token id")
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix", "remove_extra_whitespaces"):
        v = meta.get(p + key)
        if v is not None and not isinstance(v, (bool, np.bool_)):
            bad(p + key, f"is {_kind(v)}, expected a bool")
    tmpl = meta.get("tokenizer.chat_template")
    if tmpl is not None and not isinstance(tmpl, str):
        bad("tokenizer.chat_template", f"is {_kind(tmpl)}, expected a string")


def check_model(g: GGUFFile, tokenizer: bool = True) -> ModelConfig:
    """A model file's configuration once every check has passed. tokenizer=False
    leaves the tokenizer out (planning and converting never read it)."""
    if tokenizer and isinstance(g.metadata.get("general.architecture"), str):
        check_tokenizer(g.metadata, g.path)
    cfg = config_from_metadata(g.metadata, str(g.path))
    check_tensors(g, cfg)
    if tokenizer:
        check_tokenizer(g.metadata, g.path, cfg.n_vocab)
    return cfg
