"""`calibrate`: fit UMIA's profile to one model on one machine (DESIGN.md §2).

1. Latency model R(r) on this machine (engine/tune/latency.py).
2. Reference logits at r = k over the shipped calibration text, cut into
   segments whose first half runs as prefill and second half as decode (one
   chunk each, the policy told which phase), so both β's act and prompt errors
   reach later tokens through the KV cache as they do in a chat.
3. Each MoE layer's sensitivity: a pass with only that layer (or group of
   layers) at r = k/2 gives its KL against r = k. With a non-critical expert's
   harm ≈ s_layer · w², the best rule under a budget keeps the experts with the
   largest s·w², i.e. α ∝ √s: measured α's join the smooth ones below.
4. Candidate profiles — α a smooth function of depth or the measured one, θ set so the predicted
   decode time meets the budget (default 1.25 × the r = 1 time), β_prefill so
   prefill spends at most 1.25 × what the decode profile would there — each
   scored by a full pass: mean KL and top-1 flip rate against
   r = k. The fixed r that fits the budget is a candidate too, so the pick is
   never worse than it on this text. Every layer sees the choices of the
   layers before it, which one recorded pass could not give.
The result (profile, latency model, candidates, expert activation counts) is
cached per (model, machine) at calibration_path(model) and read by `auto`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..loader import load_model
from ..moe.umia import UmiaProfile, critical_sizes, smooth_alpha
from ..plan.calibration import CALIB_VERSION, calibration_path, machine_fingerprint, write_record
from ..plan.planner import PlanRequest
from .evaluate import log_softmax
from .latency import LatencyModel, measure

DEFAULT_BUDGET = 1.25  # decode time <= this x the r = 1 time
ALPHA_SLOPES = (0.0, 1.4, 2.8, 4.2)  # log(α_first / α_last): shallow layers weigh more
PREFILL_SLACK = 1.25  # prefill may cost this x what the decode profile would cost there
SENSITIVITY_GROUPS = 8  # at most this many sensitivity passes (contiguous groups of MoE layers)
SENSITIVITY_POWERS = (0.5, 1.0)  # α = (√s)^p: p = 1 is the quadratic model's rule, 0.5 hedges it


def calibration_text() -> str:
    return resources.files("rapidmoe.assets").joinpath("calibration.txt").read_text(encoding="utf-8")


# ---- passes over the text ----

@dataclass(frozen=True)
class Result:
    kl_mean: float
    flip_rate: float
    r_decode: dict  # layer -> r [N] chosen in decode-phase chunks
    r_prefill: dict


class _PhasePolicy:
    """Runs `choose(w, layer, prefill)` with the phase forced; records r (and w) per layer."""

    def __init__(self, choose, prefill: bool, rec_r: dict, rec_w: dict | None):
        self.choose, self.prefill, self.rec_r, self.rec_w = choose, prefill, rec_r, rec_w

    def __call__(self, w: torch.Tensor, layer: int, prefill: bool) -> np.ndarray:
        r = np.asarray(self.choose(w, layer, self.prefill), dtype=np.int32)
        self.rec_r.setdefault(layer, []).append(r)
        if self.rec_w is not None:
            self.rec_w.setdefault(layer, []).append(w.detach().numpy().copy())
        return r


class Calibrator:
    def __init__(self, model, tokens: list[int], seg_len: int):
        self.model, self.seg_len = model, seg_len
        n = len(tokens) // seg_len * seg_len
        if n < seg_len:
            raise UserError(f"the calibration text is shorter than one segment ({seg_len} tokens)")
        self.tokens = tokens[:n]
        self.layers = [f.layer for f in model.net.moe_layers()]
        self.base: list[np.ndarray] = []  # per segment: log-softmax [S, V] at r = k
        self.base_top: list[np.ndarray] = []

    def run(self, choose, record: bool = False, progress=None, step: str = "pass"):
        """One pass: choose(w, layer, prefill) -> r [T]. Returns (Result, recorded (w, ids)
        per MoE layer when `record`, expert activation counts per MoE layer)."""
        rec = {"prefill": {}, "decode": {}}
        rec_w: dict | None = {} if record else None
        rec_ids: dict = {}
        counts = {il: np.zeros(self.model.cfg.n_expert, np.int64) for il in self.layers}
        half = self.seg_len // 2
        kl_sum, flips, n = 0.0, 0, 0
        n_seg = len(self.tokens) // self.seg_len
        for s in range(n_seg):
            seg = self.tokens[s * self.seg_len:(s + 1) * self.seg_len]
            run = self.model.runner
            cache = run.new_cache(self.seg_len)
            outs = []
            for lo, hi, phase in ((0, half, "prefill"), (half, self.seg_len, "decode")):
                pol = _PhasePolicy(choose, phase == "prefill", rec[phase], rec_w)
                logits, trace = run.prefill(seg[lo:hi], lo, cache, policy=pol)
                outs.append(logits.numpy())
                for il, ids in trace.ids.items():
                    counts[il] += np.bincount(ids.reshape(-1), minlength=len(counts[il]))
                    if record:
                        rec_ids.setdefault(il, []).append(ids.astype(np.int32))
            lp = log_softmax(np.concatenate(outs)).astype(np.float32)  # [S, V]
            if len(self.base) < n_seg:
                self.base.append(lp)
                self.base_top.append(lp.argmax(-1))
            b = self.base[s]
            kl_sum += float((np.exp(b) * (b - lp)).sum())
            flips += int((lp.argmax(-1) != self.base_top[s]).sum())
            n += len(seg)
            if progress:
                progress(step, s + 1, n_seg)
        cat = lambda d: {il: np.concatenate(v) for il, v in d.items()}  # noqa: E731
        res = Result(kl_sum / n, flips / n, cat(rec["decode"]), cat(rec["prefill"]))
        return res, ((cat(rec_w), cat(rec_ids)) if record else None), counts


def umia_choose(profile: UmiaProfile, k: int):
    return lambda w, layer, prefill: critical_sizes(profile, w.numpy(), layer, prefill, k)


def fixed_choose(r: int):
    return lambda w, layer, prefill: np.full(w.shape[0], min(r, w.shape[1]), np.int32)


def layer_sensitivity(cal: "Calibrator", w_by_layer: dict, k: int, progress=None,
                      groups: int = SENSITIVITY_GROUPS) -> dict:
    """MoE layer -> s: the KL against r = k per unit of dropped router weight²
    when only that layer's group runs at r = k/2. Contiguous layers share one
    pass when there are more than `groups` of them."""
    layers = sorted(w_by_layer)
    parts = [list(g) for g in np.array_split(np.asarray(layers), min(groups, len(layers))) if len(g)]
    r_probe = k // 2
    out = {}
    for i, part in enumerate(parts):
        members = set(int(il) for il in part)
        choose = lambda w, layer, prefill, m=members: np.full(  # noqa: E731
            w.shape[0], r_probe if layer in m else w.shape[1], np.int32)
        res, _, _ = cal.run(choose, progress=progress, step=f"sensitivity {i + 1}/{len(parts)}")
        dropped = sum(float((np.asarray(w_by_layer[il], np.float64)[:, r_probe:] ** 2).sum(1).mean())
                      for il in members)
        for il in members:
            out[il] = res.kl_mean / max(dropped, 1e-12)
    return out


def _per_layer(values, moe_layers: list, n_layer: int) -> list[float]:
    """One value per MoE layer -> one per layer index: a layer without routed
    experts takes the next MoE layer's value (the last one's past the end)."""
    return [float(values[int(np.searchsorted(moe_layers, il).clip(0, len(moe_layers) - 1))]) for il in range(n_layer)]


def sensitivity_alphas(sens: dict, n_layer: int, powers=SENSITIVITY_POWERS) -> list[tuple[str, list[float]]]:
    """(name, α per layer index) from measured sensitivities: α = (√s / max √s)^p."""
    layers = sorted(sens)
    if not layers:
        return []
    root = np.sqrt(np.maximum([sens[il] for il in layers], 1e-12))
    root /= root.max()
    return [(f"sensitivity^{p:g}", _per_layer(root ** p, layers, n_layer)) for p in powers]


# ---- the search ----

def _predicted(lat: LatencyModel, profile: UmiaProfile, w_by_layer: dict, k: int, prefill: bool) -> float:
    return lat.token_time([critical_sizes(profile, w, il, prefill, k) for il, w in w_by_layer.items()], prefill)


def _fit_threshold(lat, base: UmiaProfile, w_by_layer, k, prefill: bool, budget_s: float) -> float:
    """Smallest θ (most critical experts) whose predicted time meets the budget.
    Time only falls as θ rises, so a bisection in log θ finds it."""
    def t(theta):
        p = UmiaProfile(base.alpha, 1.0, 1.0, theta, base.r_min, base.r_max)
        return _predicted(lat, p, w_by_layer, k, prefill)

    top = max(float(np.max(w)) for w in w_by_layer.values()) * max(base.alpha) * 1.01 + 1e-12
    # just under the smallest score: every expert critical (when even that fits, stop there)
    floor = min(float(np.min(w)) * base.alpha[il] for il, w in w_by_layer.items()) * 0.99
    lo, hi = max(floor, top * 1e-9), top
    if t(lo) <= budget_s:
        return lo
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if t(mid) <= budget_s else (mid, hi)
    return hi


def candidate_profiles(lat: LatencyModel, w_by_layer: dict, n_layer: int, k: int, budget: float,
                       slopes=ALPHA_SLOPES, alphas: list | None = None):
    """(name, UmiaProfile) pairs whose predicted decode time meets the budget:
    one per α (the smooth `slopes`, then the given (name, α) `alphas`) and r_min.
    Prefill, the more sensitive phase, may spend PREFILL_SLACK x what the decode
    profile would cost there: β_prefill >= β_decode, fitted to that."""
    moe_layers = sorted(w_by_layer)
    dec_budget = budget * lat.fixed_time(1, False)
    shapes = []
    for slope in slopes:  # α falls geometrically over the MoE layers' depth
        a_moe = smooth_alpha(len(moe_layers), math.exp(slope / 2), math.exp(-slope / 2))
        shapes.append((f"slope={slope:g}", _per_layer(a_moe, moe_layers, n_layer)))
    shapes += list(alphas or [])
    out = []
    for r_min in (0, 1):
        for label, alpha in shapes:
            base = UmiaProfile(tuple(alpha), 1.0, 1.0, 1.0, r_min, k)
            th_d = _fit_threshold(lat, base, w_by_layer, k, False, dec_budget)
            pre_budget = PREFILL_SLACK * _predicted(lat, UmiaProfile(base.alpha, 1.0, 1.0, th_d, r_min, k),
                                                    w_by_layer, k, True)
            th_p = min(th_d, _fit_threshold(lat, base, w_by_layer, k, True, pre_budget))
            prof = UmiaProfile(tuple(alpha), th_d / th_p, 1.0, th_d, r_min, k, "calibrated")
            out.append((f"umia {label} r_min={r_min}", prof))
    return out


def fixed_fit(lat: LatencyModel, k: int, budget: float) -> int:
    """The largest fixed r whose decode time meets the budget."""
    return max([r for r in range(k + 1) if lat.fixed_time(r, False) <= budget * lat.fixed_time(1, False)] or [0])


def calibrate(model_path, n_tokens: int = 256, seg_len: int = 128, budget: float = DEFAULT_BUDGET,
              progress=None, log=None, slopes=ALPHA_SLOPES, placement=None) -> dict:
    """Fit, cache and return the calibration record of this model on this machine,
    timed on the step that `placement`'s plan runs (default: the plan chat loads)."""
    if budget < 1.0:
        raise UserError("the latency budget must be >= 1 (a multiple of the r = 1 time)")
    if seg_len < 4 or seg_len % 2:
        raise UserError("the segment length must be an even number >= 4")
    t_start = time.perf_counter()
    model = load_model(model_path, n_ctx=seg_len, critical="k", progress=progress, log=log,
                       placement=placement or PlanRequest())
    if model.critical is None:
        raise UserError(f"{Path(model_path).name} has no routed experts: nothing to calibrate")
    k, cfg = model.cfg.n_expert_used, model.cfg
    tokens = model.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)[:n_tokens]
    cal = Calibrator(model, tokens, seg_len)

    ref, (w_rec, ids_rec), counts = cal.run(fixed_choose(k), record=True, progress=progress, step="reference")
    # ids are in selection order, w sorted by weight: which of a token's k experts
    # is critical does not change the kernel's cost, only how many are
    lat = measure(model, {il: np.ascontiguousarray(v) for il, v in ids_rec.items()},
                  {il: np.ascontiguousarray(w, np.float32) for il, w in w_rec.items()}, progress=progress)

    sens = layer_sensitivity(cal, w_rec, k, progress=progress)
    cands = candidate_profiles(lat, w_rec, cfg.n_layer, k, budget, slopes, sensitivity_alphas(sens, cfg.n_layer))
    r_fit = fixed_fit(lat, k, budget)
    rows = []
    best = None
    for i, (name, prof) in enumerate([*cands, (f"fixed r={r_fit}", r_fit)]):
        choose = fixed_choose(prof) if isinstance(prof, int) else umia_choose(prof, k)
        res, _, _ = cal.run(choose, progress=progress, step=f"search {i + 1}/{len(cands) + 1}")
        row = {"name": name, "kl_mean": res.kl_mean, "flip_rate": res.flip_rate,
               "mean_r_decode": _mean_r(res.r_decode), "mean_r_prefill": _mean_r(res.r_prefill),
               "decode_s": lat.token_time(list(res.r_decode.values()), False),
               "prefill_s": lat.token_time(list(res.r_prefill.values()), True)}
        if isinstance(prof, int):
            prof = UmiaProfile(tuple([1.0] * cfg.n_layer), 1.0, 1.0, 0.0, prof, prof, "calibrated")
        row["profile"] = prof.to_json()
        rows.append(row)
        # a pass may pick a little more than predicted: 3% grace, then the lowest KL
        if row["decode_s"] <= 1.03 * budget * lat.fixed_time(1, False) and (best is None or row["kl_mean"] < best["kl_mean"]):
            best = row
    if best is None:
        best = min(rows, key=lambda r: r["decode_s"])
    freq = [counts[il].tolist() if il in counts else [0] * cfg.n_expert for il in range(cfg.n_layer)]
    record = {
        "version": CALIB_VERSION, "model": Path(model.path).name, "machine": machine_fingerprint(),
        "created_unix": int(time.time()), "seconds": round(time.perf_counter() - t_start, 1),
        "n_tokens": len(cal.tokens), "segment": seg_len, "budget": budget, "k": k,
        "mode": model.plan.mode, "critical_from": model.plan.critical_from, "placement": model.placement,
        "profile": best["profile"], "chosen": best["name"], "latency": lat.to_json(),
        "reference": {"mean_r": float(k), "decode_s": lat.fixed_time(k, False), "prefill_s": lat.fixed_time(k, True),
                      "kl_mean": ref.kl_mean},
        "fixed": [{"r": r, "decode_s": lat.fixed_time(r, False), "prefill_s": lat.fixed_time(r, True)}
                  for r in range(k + 1)],
        "sensitivity": {str(il): v for il, v in sorted(sens.items())},
        "candidates": rows, "expert_frequency": freq,
    }
    write_record(calibration_path(model.path), record)
    return record


def _mean_r(r_by_layer: dict) -> float:
    return float(np.mean([v.mean() for v in r_by_layer.values()])) if r_by_layer else 0.0


