"""What a model needs, in bytes, from its GGUF metadata and tensor index alone
(never its weights): non-expert tensors by layer and source type, each routed
expert's residual-split parts as the pack stores them, KV cache per token, and
the engine's working memory. The planner (plan.py) places these.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError
from ..gguf.reader import GGUFFile
from ..gguf.validate import check_model
from ..gpu.formats import vram_bytes
from ..hparams import ModelConfig
from ..kv_types import kv_bytes, kv_row_dims, kv_values_per_token
from ..paths import cache_dir

GLOBAL_TENSORS = ("token_embd.weight", "output.weight", "output_norm.weight")
PREFILL_CHUNK = 256  # tokens per forward in prefill (generate.py's chunk)
# The parsed metadata (~235 B) and the tokenizer's tables (~345-375 B) per vocabulary
# entry, measured alone on two vocabularies: SmolLM2's 49K entries (611 B) and Qwen2's
# 152K (584 B, with as many merges).
TOKENIZER_BYTES_PER_TOKEN = 600
# Library code (torch's, ours) that a run pages in after import, whatever the model:
# the same run measured 14 MB in one installation and 38 MB in a fresh one on the same
# machine (how the libraries' pages lie in the page cache). 16 MiB keeps both ends
# within 9% of the plan on the two models tests/test_plan.py runs.
RUNTIME_CODE_BYTES = 16 << 20
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def use_planned_allocator(threshold: int = 1 << 20) -> bool:
    """Make peak memory what the plan counts: glibc serves buffers above
    `threshold` with their own mappings and returns them on free. Its default
    (a threshold that grows with each freed buffer, per-thread arenas that keep
    them) made the demo's peak RSS vary by ±20% from run to run on the same
    input. (A prompt's buffers then fault their pages in on every forward: at
    8 MB prefill was a quarter faster, but the peak grew past what the plan
    counts.) Call once, early; False where it does not apply (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class ModelSizes:
    name: str
    arch: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_head: int
    n_vocab: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    head_dim: int
    expert_layers: tuple[int, ...]
    # one expert's parts in one MoE layer (all MoE layers are alike)
    wq_bytes: int  # gate + up + down at WQ
    wr_bytes: int  # gate + up residuals
    d4_bytes: int  # down's CPU copy
    layer_bytes: tuple[int, ...]  # per layer: every non-routed-expert tensor (attention, norms, router, shared/dense FFN)
    gpu_layer_bytes: tuple[int, ...]  # the same tensors as the GPU step places them (engine/gpu/formats.py)
    embd_bytes: int  # token_embd (rows are looked up: it stays in DRAM)
    head_bytes: int  # output (+ output_norm); 0 when tied to the embedding besides the norm
    tied_head: bool
    gpu_head_bytes: int  # the output head (+ norm) as placed on a GPU; tied: the embedding table's
    f32_bytes: int  # F32 tensors the engine copies out of the mapping (norms, routers)
    nonexpert_types: tuple[tuple[str, int], ...]  # (source type, bytes), largest first
    kv_values_per_token: int  # cache values per token over all layers (engine/kv_types.py)
    kv_row_dims: tuple[int, ...]  # the lengths of the cache's rows (q8_0 needs whole blocks)
    source_bytes: int  # the GGUF itself
    # one expert's gate + up + down as the source file stores them (mean over its MoE layers);
    # 0 where a critical expert cannot run from them (a type without an int8 GEMV, or a pack)
    src_expert_bytes: int = 0
    prefers_pack: bool = False  # the file asks for the pack's critical path (rapidmoe.critical_from = "pack")

    @property
    def n_moe_layers(self) -> int:
        return len(self.expert_layers)

    @property
    def expert_bytes(self) -> int:
        return self.wq_bytes + self.wr_bytes + self.d4_bytes

    @property
    def nonexpert_bytes(self) -> int:
        return sum(self.layer_bytes) + self.embd_bytes + self.head_bytes

    def kv_bytes_per_token(self, kv_type: str) -> int:
        return kv_bytes(self.kv_values_per_token, kv_type)


def expert_part_bytes(cfg: ModelConfig) -> tuple[int, int, int]:
    """(WQ gate+up+down, WR gate+up, D4 down) bytes of one expert, as the pack lays them out."""
    from .. import kernels  # deferred: loads the compiled kernels

    H, F = cfg.n_embd, cfg.n_ff_exp
    wq = 2 * F * kernels.resplit_row_bytes("wq", H) + H * kernels.resplit_row_bytes("wq", F)
    wr = 2 * F * kernels.resplit_row_bytes("wr", H)
    d4 = H * kernels.resplit_row_bytes("d4", F)
    return wq, wr, d4


def _layer_of(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    try:
        return int(name.split(".")[1])
    except (IndexError, ValueError):
        return None


def sizes_from_gguf(g: GGUFFile, name: str | None = None) -> ModelSizes:
    """Sizes from an open GGUF (a source model or a pack): only the header is read."""
    cfg = check_model(g, tokenizer=False)  # every count below is checked against the file's tensors first
    if not cfg.n_expert:
        raise ModelFileError(g.path, "no routed experts: nothing to split or place (plan is for MoE models)")

    from .. import kernels  # deferred: loads the compiled kernels

    per_layer = [0] * cfg.n_layer
    src_exps, src_ok = 0, True
    gpu_layer = [0] * cfg.n_layer
    types: dict[str, int] = defaultdict(int)
    moe_layers = set()
    f32 = 0
    for t in g.tensors.values():
        il = _layer_of(t.name)
        if il is not None and il >= cfg.n_layer:
            continue  # MTP blocks after the trunk: never loaded
        if "_exps." in t.name:
            moe_layers.add(il)
            src_exps += t.nbytes
            src_ok = src_ok and kernels.ggml_int8_gemv(t.ggml_type, t.ne[0])  # a pack's U8 parts: False
            continue
        if il is None and t.name not in GLOBAL_TENSORS:
            continue  # e.g. rope_freqs: not used by the engine
        if il is not None:
            per_layer[il] += t.nbytes
            gpu_layer[il] += vram_bytes(t.name, t.ggml_type, t.ne, t.nbytes)
        types[t.type_name] += t.nbytes
        if t.type_name == "F32":
            f32 += t.nbytes
    if "token_embd.weight" not in g.tensors:
        raise ModelFileError(g.path, "missing tensor token_embd.weight")
    embd = g.tensors["token_embd.weight"].nbytes
    tied = "output.weight" not in g.tensors
    head = sum(g.tensors[n].nbytes for n in ("output.weight", "output_norm.weight") if n in g.tensors)
    gpu_head = sum(vram_bytes(t.name, t.ggml_type, t.ne, t.nbytes) for n in
                   ("token_embd.weight" if tied else "output.weight", "output_norm.weight")
                   if (t := g.tensors.get(n)) is not None)
    wq, wr, d4 = expert_part_bytes(cfg)
    return ModelSizes(
        name=name or Path(g.path).name, arch=cfg.arch, n_layer=cfg.n_layer, n_ctx_train=cfg.n_ctx_train,
        n_embd=cfg.n_embd, n_head=cfg.n_head, n_vocab=cfg.n_vocab, n_expert=cfg.n_expert,
        n_expert_used=cfg.n_expert_used, n_ff_exp=cfg.n_ff_exp, head_dim=max(cfg.head_dim, cfg.head_dim_v),
        expert_layers=tuple(sorted(moe_layers)), wq_bytes=wq, wr_bytes=wr, d4_bytes=d4,
        layer_bytes=tuple(per_layer), gpu_layer_bytes=tuple(gpu_layer), embd_bytes=embd, head_bytes=head,
        tied_head=tied, gpu_head_bytes=gpu_head, f32_bytes=f32,
        nonexpert_types=tuple(sorted(types.items(), key=lambda kv: -kv[1])),
        kv_values_per_token=kv_values_per_token(cfg), kv_row_dims=kv_row_dims(cfg),
        source_bytes=g.size_bytes,
        src_expert_bytes=src_exps // (len(moe_layers) * cfg.n_expert) if src_ok and moe_layers else 0,
        prefers_pack=g.metadata.get("rapidmoe.critical_from") == "pack")


def cpu_workspace_bytes(s: ModelSizes, n_ctx: int, chunk: int = PREFILL_CHUNK) -> int:
    """Peak transient memory of one forward of `chunk` prompt tokens at the end
    of a full context on the CPU engine (f32), plus the tokenizer: the chunk's
    attention output [T, n_head, head_dim] and each thread's tiles (the kernel
    never holds a score matrix), the routed experts' per-slot activations [T*k, H]
    (~3 copies), hidden states, RoPE tables, and the code a run pages in. Checked
    against peak RSS on two models (tests/test_plan.py)."""
    T = min(chunk, n_ctx)
    attn = T * s.n_head * s.head_dim * 4 + 256 * s.n_head * (s.head_dim + 32) * 4
    moe = 3 * T * s.n_expert_used * s.n_embd * 4 + 2 * T * s.n_expert_used * s.n_ff_exp * 4
    hidden = 8 * T * max(s.n_embd, s.n_head * s.head_dim) * 4 + s.n_vocab * 4
    rope = 3 * n_ctx * s.head_dim * 4  # cos/sin tables, built in float64
    return attn + moe + hidden + rope + s.n_vocab * TOKENIZER_BYTES_PER_TOKEN + RUNTIME_CODE_BYTES


def host_workspace_bytes(s: ModelSizes, chunk: int = PREFILL_CHUNK) -> int:
    """DRAM the host side needs beside the weights when attention runs on a GPU:
    tokenizer, runtime code, the CPU experts' per-slot activations."""
    T = chunk
    moe = 3 * T * s.n_expert_used * s.n_embd * 4 + 2 * T * s.n_expert_used * s.n_ff_exp * 4
    return moe + s.n_vocab * TOKENIZER_BYTES_PER_TOKEN + RUNTIME_CODE_BYTES


def gpu_workspace_bytes(s: ModelSizes, n_ctx: int, chunk: int = 512) -> int:
    """Activation buffers of a GPU forward (f16 attention in blocks, f32 hidden
    states): at least 256 MiB, as llama.cpp's compute buffers run."""
    T = min(chunk, n_ctx)
    est = 4 * T * (8 * s.n_embd + 2 * s.n_expert_used * s.n_ff_exp) + T * s.n_vocab * 4 // max(1, T)
    est += 2 * s.n_head * T * min(n_ctx, 4096) * 2
    return max(256 << 20, est)


# ---- expert activation frequencies (calibrate writes them; optional) ----

def load_expert_frequencies(file: Path, s: ModelSizes) -> dict[int, list[float]] | None:
    """A calibration record's "expert_frequency" (one list of E counts per layer,
    or {"<layer>": [...]}) -> {MoE layer: counts}. None when absent; a malformed
    file is ignored: it only orders the cache."""
    try:
        raw = json.loads(Path(file).read_text(encoding="utf-8"))["expert_frequency"]
        items = raw.items() if isinstance(raw, dict) else enumerate(raw)
        out = {}
        for k, v in items:
            il = int(k)
            if il in s.expert_layers and isinstance(v, list) and len(v) == s.n_expert:
                vals = [float(x) for x in v]
                if all(math.isfinite(x) and x >= 0 for x in vals) and any(vals):
                    out[il] = vals
        return out or None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def calibrated_frequencies(model_path: Path, s: ModelSizes, gguf=None) -> dict[int, list[float]] | None:
    """Expert activation counts from this model's calibration on this machine, when
    there is one (they order the W_Q cache: hottest first). gguf: the source, open."""
    d = cache_dir() / "calibration"
    if not d.is_dir() or not any(d.glob("*.json")):
        return None  # nothing to read: spare the import of the calibration code (torch)
    from .calibration import calibration_path  # deferred: loads torch, the compiled kernels

    return load_expert_frequencies(calibration_path(model_path, gguf), s)
