"""The round-trip gate: what we export is the function we trained.

Reference outputs are taken from the in-memory model (LoRA unmerged, if any) in fp32; the export is
then loaded back with transformers' own `from_pretrained` (no align code, no peft) in fp32 and run on
the same tokens. The gate (fp32, where two correct implementations differ only by accumulation order):

- max |logit difference| < 1e-5
- top-1 agreement 100%
- router top-k SET agreement 100% on every MoE layer (same layers on both sides)

fp32 only: bf16 differences between two correct models are a noise floor, not a gate. Porting bugs
(experts permuted against their router rows, a wrong RoPE base, norms in the wrong place) move
logits by orders of magnitude more than 1e-5 (tests/unit/models/test_roundtrip.py injects each).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import torch

from align.config import Family
from align.core.quiet import library_progress_bars
from align.models.family import as_spec
from align.models.family_table import FamilySpec

MAX_ABS = 1e-5


@dataclass
class Outputs:
    logits: torch.Tensor  # fp32 [B, S, V]
    topk: dict[int, torch.Tensor]  # layer -> [tokens, k] expert ids


@dataclass
class RoundTripReport:
    max_abs_diff: float
    top1_agreement: float
    router_agreement: dict[int, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def line(self) -> str:
        routers = min(self.router_agreement.values()) if self.router_agreement else None
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(self.failures)
        return (f"round trip: max |dlogit| {self.max_abs_diff:.2e}, top-1 {self.top1_agreement:.2%}"
                + (f", router top-k sets (min over layers) {routers:.2%}" if routers is not None else "")
                + f" -> {verdict}")


@contextlib.contextmanager
def capture_topk(model: torch.nn.Module, family: Family | FamilySpec) -> Iterator[dict[int, torch.Tensor]]:
    taps = as_spec(family).router_taps(model)
    got: dict[int, torch.Tensor] = {}
    handles = [t.index_module.register_forward_hook(
        lambda m, a, o, t=t: got.__setitem__(
            t.layer, t.index_of(o).reshape(-1, t.index_of(o).shape[-1]).detach().cpu()))
        for t in taps]
    try:
        yield got
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def outputs(model: torch.nn.Module, family: Family | FamilySpec, input_ids: torch.Tensor) -> Outputs:
    """fp32 logits and router choices of `model` (a fp32 copy when its weights are not fp32)."""
    if any(p.dtype != torch.float32 for p in model.parameters()):
        model = copy.deepcopy(model).float()
    was_training = model.training
    model.eval()
    try:
        with capture_topk(model, family) as topk:
            dev = next(model.parameters()).device
            logits = model(input_ids=input_ids.to(dev), use_cache=False).logits.float().cpu()
    finally:
        model.train(was_training)
    return Outputs(logits, dict(topk))


def load_export(export_dir: Path, family: Family | FamilySpec, like: Optional[torch.nn.Module] = None
                ) -> torch.nn.Module:
    """The export as transformers loads it: fp32, and the same kernels as `like` so that only the
    weights and config can differ. `family`: a family, or the spec `model=hf` resolved to."""
    spec = as_spec(family)
    _, model_cls = spec.classes()
    kw: dict = {"dtype": torch.float32, "local_files_only": True}
    if like is not None:
        kw["attn_implementation"] = like.config._attn_implementation
        experts = getattr(like.config, "_experts_implementation", None)
        if experts and spec.moe_shape(like.config) is not None:
            kw["experts_implementation"] = experts
    with library_progress_bars():
        return model_cls.from_pretrained(Path(export_dir), **kw)


def compare(ref: Outputs, got: Outputs, max_abs: float = MAX_ABS) -> RoundTripReport:
    if ref.logits.shape != got.logits.shape:
        return RoundTripReport(float("inf"), 0.0,
                               failures=[f"logits shape {tuple(got.logits.shape)} != {tuple(ref.logits.shape)}"])
    diff = float((ref.logits - got.logits).abs().max())
    top1 = float((ref.logits.argmax(-1) == got.logits.argmax(-1)).float().mean())
    rep = RoundTripReport(diff, top1)
    if not diff < max_abs:  # also catches NaN
        rep.failures.append(f"max |dlogit| {diff:.3e} >= {max_abs:.0e}")
    if top1 < 1.0:
        rep.failures.append(f"top-1 agreement {top1:.2%} < 100%")
    if set(ref.topk) != set(got.topk):
        rep.failures.append(f"MoE layers differ: {sorted(ref.topk)} vs {sorted(got.topk)}")
    for layer in sorted(set(ref.topk) & set(got.topk)):
        a, b = ref.topk[layer].sort(-1).values, got.topk[layer].sort(-1).values
        agree = float((a == b).all(-1).float().mean()) if a.shape == b.shape else 0.0
        rep.router_agreement[layer] = agree
        if agree < 1.0:
            rep.failures.append(f"layer {layer} router top-k set agreement {agree:.2%} < 100%")
    return rep


def verify_export(model: torch.nn.Module, tokenizer, out: Path, family: Family | FamilySpec,
                  input_ids: torch.Tensor) -> RoundTripReport:
    """Reference outputs, export (merging LoRA), load with transformers, compare."""
    from align.models.export import export_hf

    like = model.get_base_model() if hasattr(model, "get_base_model") else model
    ref = outputs(model, family, input_ids)
    export_hf(model, tokenizer, out)
    loaded = load_export(out, family, like=like)
    return compare(ref, outputs(loaded, family, input_ids))
