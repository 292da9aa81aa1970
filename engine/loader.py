"""Open a model by path or name: GGUF -> config -> weights -> architecture."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import ModelFileError, SettingNote, UserError
from .gguf.reader import GGUFFile
from .gguf.validate import check_model
from .gpu import cuda_kernels as gk
from .gpu import device as gd
from .gpu.executor import attach_plan, layer_devices
from .hparams import ModelConfig
from .hub.demo import demo_model_path
from .hub.resolve import looks_local
from .kv_types import DEFAULT_KV_TYPE, check_kv_type, kv_row_dims
from .models import arch_module
from .moe.resplit import FixedCritical
from .moe.umia import UmiaPolicy
from .pack.convert import open_pack
from .plan.calibration import load_profile
from .plan.full import check_full_precision
from .plan.hardware import detect
from .plan.planner import PlanRequest, plan_model
from .plan.sizes import calibrated_frequencies, sizes_from_gguf
from .runner import Runner
from .text.tokenizer import Tokenizer
from .weights import Weights


@dataclass
class Model:
    path: Path
    cfg: ModelConfig
    metadata: dict[str, Any]
    net: Any  # models.base.Transformer
    n_ctx: int
    tokenizer: Any = None
    file_bytes: int = 0
    critical: int | str | None = None  # None: full precision; r: residual split with r critical experts; "auto": UMIA
    weights: Any = None  # weights.Weights: which tensors the model uses
    runner: Any = None  # runner.Runner: the one door to the forward pass
    plan: Any = None  # plan.Plan the model was placed by (None: full precision, on the CPU)
    placement: str = "CPU"  # one line: where each part runs

    @property
    def policy(self):
        return self.runner.policy


def resolve_model_path(spec: str | os.PathLike | None, progress=None, download_progress=None) -> Path:
    """'demo' (or None) -> the built-in demo model; a local GGUF path; or a Hub
    `REPO[:QUANT]`, pulled into the Hugging Face cache when it is not there yet."""
    if spec is None or str(spec) == "demo":
        demo_progress = (lambda frac, _what: progress("demo", int(frac * 1000), 1000)) if progress else None
        return demo_model_path(progress=demo_progress)

    if isinstance(spec, Path) or looks_local(str(spec)):
        p = Path(spec).expanduser()
        if not p.exists():
            raise ModelFileError(p, "no such file")
        return p
    from .hub.pull import pull  # deferred: loads huggingface_hub, httpx2

    return pull(str(spec), progress=download_progress)[0]


def load_model(spec: str | os.PathLike | None, n_ctx: int | None = None, progress=None,
               download_progress=None, critical: int | str | None = None, log=None,
               placement: PlanRequest | None = None) -> Model:
    """critical: None runs the source weights (full precision, on the CPU); an
    integer r or "k" (all routed experts) runs the residual-split pack (converted
    on first use) with r critical experts per token; "auto" lets UMIA pick r per
    token and layer (the calibrated profile of this model and machine, else the
    default). The split path is placed by the plan (engine/plan/planner.py) of this
    machine and `placement` (budgets, mode, W_Q cache fraction): a GPU plan runs
    the GPU step, a `cpu` plan the CPU step; a plan that does not fit is refused
    before anything is converted. progress(step: str, done: int, total: int) is
    called during conversion and loading; download_progress(DownloadProgress)
    while a Hub model is pulled; log(str) gets one-off notes."""
    path = resolve_model_path(spec, progress=progress, download_progress=download_progress)
    gguf = GGUFFile(path)
    cfg = check_model(gguf)  # every key, tensor and tokenizer array, before anything is sized from them
    ctx = n_ctx or min(cfg.n_ctx_train, 4096)
    if ctx <= 0:
        raise UserError(f"bad context size {ctx}")
    if ctx > cfg.n_ctx_train:
        raise UserError(f"context {ctx} exceeds the model's trained context {cfg.n_ctx_train}")
    kv_type = check_kv_type(placement.kv_type if placement else DEFAULT_KV_TYPE, kv_row_dims(cfg))
    p = hw = None
    if critical is not None and cfg.n_expert:  # the plan first: one that does not fit is refused before all else
        p, hw = _plan(gguf, path, ctx, placement or PlanRequest())
    else:  # full precision allocates too (KV cache, f32 copies): the same refusal before any of it
        check_full_precision(gguf, cfg, ctx, kv_type, placement.dram_budget if placement else None)
    policy = _split_policy(cfg, critical, log, path, p, gguf) if critical is not None else None
    source = None
    if policy is not None:
        pack = open_pack(gguf, progress=progress, log=log)  # the source stays open once, for all of it
        if p.mode == "cpu" and p.critical_from == "source":
            source = Weights(gguf)  # the critical experts run from the file's own tensors
        else:
            gguf.close()
        gguf = pack
    elif placement is not None and placement.mode not in (None, "cpu"):
        raise UserError(f"a {placement.mode} plan places the residual split: it needs a critical-set policy, "
                        "not full precision")
    W = Weights(gguf, is_pack=policy is not None, source=source)

    def layer_progress(done, total):
        if progress:
            progress("load", done, total)

    net = arch_module(cfg.arch).build(cfg, W, ctx, layer_progress)

    runner = Runner(net, policy, kv_type=kv_type)
    where = "full precision · CPU" if policy is None else p.describe()
    if p is not None and p.mode != "cpu":
        runner, where = _gpu_step(net, policy, p, hw, progress, kv_type)

    tok = Tokenizer.from_metadata(gguf.metadata)
    if tok.n_vocab != cfg.n_vocab:
        raise ModelFileError(path, f"tokenizer has {tok.n_vocab} tokens, model {cfg.n_vocab}")
    return Model(path=path, cfg=cfg, metadata=gguf.metadata, net=net, n_ctx=ctx, tokenizer=tok,
                 file_bytes=gguf.size_bytes, critical=policy.r if policy is not None else None,
                 weights=W, runner=runner, plan=p, placement=where)


def _plan(gguf: GGUFFile, path: Path, ctx: int, req: PlanRequest):
    """This machine's plan for the split path; refuse one that does not fit,
    before anything is converted or uploaded."""
    hw = detect(amx=False)
    sizes = sizes_from_gguf(gguf)
    p = plan_model(sizes, hw, ctx, req, calibrated_frequencies(path, sizes, gguf))
    if not p.fits:
        raise UserError(f"{p.reason}" + (f"; nearest plan that fits: {p.suggestion}" if p.suggestion else "")
                        + " (see `rapidmoe-chat plan`)")
    return p, hw


def _gpu_step(net, policy, p, hw, progress, kv_type: str):
    """Place net as the GPU plan p says -> (Runner of the GPU step, placement line)."""
    standin = hw.gpu_source == "standin"
    names = [d for d, _, _ in p.gpu_layers]
    if standin:
        devices = {d: gd.StandInDevice() for d in names}
    else:
        for i, d in enumerate(names):  # compile (or load the cached) kernels: a visible step
            if progress:
                progress("CUDA kernels", i, len(names))
            gk.load(torch.device(d))
        if progress:
            progress("CUDA kernels", len(names), len(names))
        devices = {d: gd.CudaDevice(d) for d in names}
    if progress:
        progress("place", 0, 1)
    attach_plan(net, p, devices)
    if progress:
        progress("place", 1, 1)

    owner = layer_devices(p, len(net.blocks))
    runner = Runner(net, policy, where="+".join(names), devices=tuple(devices.values()),
                    layer_devices=[devices[d].torch_device for d in owner], kv_type=kv_type)
    return runner, p.describe(standin)


def _split_policy(cfg: ModelConfig, critical: int | str, log, path: Path, p, gguf):
    if not cfg.n_expert:
        if log:
            log("this model has no routed experts: running it in full precision")
        return None
    if critical == "auto":
        profile = load_profile(path, cfg, p.mode if p else None, log, gguf, p.critical_from if p else "pack")
        if log and profile.source != "calibrated":
            log("UMIA: default profile (`rapidmoe-chat calibrate` fits one to this model and machine)")
        return UmiaPolicy(profile, cfg.n_expert_used)
    if critical == "k":
        critical = cfg.n_expert_used
    if not isinstance(critical, int) or critical < 0:
        raise UserError(f"the critical-set size must be a whole number >= 0, not {critical!r}")
    if critical > cfg.n_expert_used:
        if log:
            log(SettingNote("critical", "a critical-set size of", critical,
                            f"is more than the {cfg.n_expert_used} routed experts per token: using {cfg.n_expert_used}"))
        critical = cfg.n_expert_used
    return FixedCritical(critical)
