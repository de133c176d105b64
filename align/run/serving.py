"""How the artifact of a config can be served, and whether its base fits the device: stated by
`python -m align.tools.preflight` (two lines after the checklist) and recorded as the manifest's
`serving` entry. Statements, not checks: nothing here refuses a run (the memory refusal is
`align.run.model_checks`' "params and memory" check).

The export (`align.models.export`) holds full weights unless `model.lora.export=adapter`: a LoRA
run's adapters are merged into the base, so such an export serves as is, and with adapter or both
peft's adapter files are in `export/adapter/`. The question is whether the ADAPTER could be
hot-swapped instead, which depends on the serving stack's class for the architecture. Where vLLM is importable,
its registry gives that class and its MRO is read for the two attributes vLLM's LoRA loader relies
on: `supports_lora` (True on `vllm.model_executor.models.interfaces.SupportsLoRA`) and, for an MoE
model, `get_expert_mapping` (`vllm.lora.utils.process_packed_modules_mapping` raises "To support LoRA
for MoE model, 'get_expert_mapping' must be implemented" without it). Where vLLM is not
importable (or its registry fails), the verdict comes from align's family table and says so
(`checked: false`, `why`, `basis`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any, Callable, Optional

from align.config import LoraExport, TrainConfig
from align.models.family import family_spec

if TYPE_CHECKING:
    from align.plan.planner import Plan

VLLM_NOT_INSTALLED = "not checked: vllm not installed"
STRUCTURAL = "structural: from align's family table, not the serving stack"
MERGED = "merged weights (align.models.export merges LoRA into the base)"
EXPORT_LORA = {LoraExport.merged: f"{MERGED}; no separate adapter is written",
               LoraExport.adapter: "the PEFT adapter alone, in export/adapter/ (no merged weights)",
               LoraExport.both: f"{MERGED}, and the PEFT adapter in export/adapter/"}
"""The manifest's `serving.export` per model.lora.export."""
GiB = 1024**3

Lookup = Callable[[str], Optional[type]]
"""An architecture name (e.g. "MistralForCausalLM") -> the serving stack's model class, or None."""


class Verdict(StrEnum):
    as_is = "serve the export as is"
    merged = "merged weights required"
    hot_swap = "adapter hot-swap possible"
    unknown = "unknown"


def architecture(cfg: TrainConfig) -> str:
    """The class name the export's config.json lists under `architectures` (the class align builds: under a
    scalar-head objective the family's sequence-classification class, align/models/scalar_head.py)."""
    spec = family_spec(cfg.model)
    if type(cfg.objective).scalar_head:
        from align.models.scalar_head import head_class_name

        return head_class_name(spec) or spec.architecture
    return spec.architecture


def vllm_lookup() -> Optional[Lookup]:
    """vLLM's registry as a Lookup; None when vllm is not importable. `_try_load_model_cls(arch)` is
    the registry's own lazy loader (it needs no model config, unlike `resolve_model_cls`)."""
    try:
        from vllm import ModelRegistry
    except ImportError:
        return None

    def lookup(arch: str) -> Optional[type]:
        if arch not in ModelRegistry.get_supported_archs():
            return None
        return ModelRegistry._try_load_model_cls(arch)

    return lookup


def _owner(cls: type, attr: str) -> Optional[type]:
    """The first class of `cls`'s MRO that defines `attr` (the one `getattr` reads)."""
    return next((k for k in cls.__mro__ if attr in vars(k)), None)


def inspect_class(cls: type) -> dict[str, Any]:
    """What vLLM's LoRA loader reads off a model class, and which class of its MRO provides it."""
    lora = _owner(cls, "supports_lora")
    mapping = _owner(cls, "get_expert_mapping")
    return {"class": f"{cls.__module__}.{cls.__qualname__}",
            "supports_lora": lora.__qualname__ if lora is not None and vars(lora)["supports_lora"] is True else None,
            "get_expert_mapping": mapping.__qualname__ if mapping is not None else None}


def structural(lora: bool, moe: bool) -> tuple[Verdict, str]:
    """align's own knowledge, without a serving stack."""
    if not lora:
        return Verdict.as_is, "full fine-tune: the export is the trained weights"
    if moe:
        return Verdict.merged, "LoRA on an MoE family: serving an adapter needs an expert mapping"
    return Verdict.hot_swap, "LoRA on a dense family: adapters on nn.Linear only"


def from_class(lora: bool, moe: bool, arch: str, info: Optional[dict[str, Any]]) -> tuple[Verdict, str]:
    """The verdict from the serving stack's class for `arch` (None: it registers none)."""
    if info is None:
        return (Verdict.as_is if not lora else Verdict.unknown), f"vLLM registers no class for {arch}"
    name = info["class"]
    if not lora:
        return Verdict.as_is, f"full fine-tune; vLLM class {name}"
    if info["supports_lora"] is None:
        return Verdict.merged, f"vLLM class {name} does not set supports_lora"
    if moe and info["get_expert_mapping"] is None:
        return Verdict.merged, f"vLLM class {name} (MoE) defines no get_expert_mapping"
    mapping = f", get_expert_mapping from {info['get_expert_mapping']}" if moe else ""
    return Verdict.hot_swap, f"vLLM class {name}: supports_lora from {info['supports_lora']}{mapping}"


def serving_path(cfg: TrainConfig, plan: Optional["Plan"] = None) -> dict[str, Any]:
    """The manifest's `serving` entry: every key always present, each null beside its `why`. `plan`: the
    job's (align/plan/planner.py), whose estimate the viability holds against its device."""
    lora, moe, arch = cfg.model.lora.enabled, family_spec(cfg.model).is_moe, architecture(cfg)
    entry: dict[str, Any] = {"architecture": arch, "lora": lora, "moe": moe,
                             "export": EXPORT_LORA[cfg.model.lora.export] if lora else "full weights",
                             "checked": False, "why": VLLM_NOT_INSTALLED, "basis": STRUCTURAL, "vllm": None}
    verdict, reason = structural(lora, moe)
    lookup = vllm_lookup()
    if lookup is not None:
        try:
            cls = lookup(arch)
        except Exception as e:  # a registry API that moved, a model module that fails to import
            entry["why"] = f"not checked: vLLM's registry could not load {arch}: {type(e).__name__}: {e}"
        else:
            entry.update(checked=True, why=None, basis="vllm: the registry's class and its MRO")
            entry["vllm"] = None if cls is None else inspect_class(cls)
            verdict, reason = from_class(lora, moe, arch, entry["vllm"])
            if cls is None:
                entry["why"] = reason
    entry.update(verdict=verdict.value, reason=reason, viability=viability(plan))
    return entry


def viability(plan: Optional["Plan"]) -> dict[str, Any]:
    """The job's training-memory estimate (its plan's: the one preflight's memory check held against the
    device) against the device's memory; on CPU `fits` and `device_bytes` are null: host RAM is no
    accelerator budget. Without a plan (a record started with no preflight report) every value is null."""
    if plan is None:
        return {"estimate_bytes": None, "device": None, "device_bytes": None, "fits": None,
                "why": "no plan: the record was started without the job's preflight report"}
    device, est = plan.device, plan.estimate
    out = {"estimate_bytes": est.total, "device": str(device), "device_bytes": est.device_bytes,
           "fits": est.fits, "why": None}
    if device.type == "cpu":
        out.update(device_bytes=None, fits=None, why=f"trainer device is {device}: no accelerator memory to hold "
                   "the estimate against")
    elif est.device_bytes is None:
        out["why"] = f"the memory of {device} cannot be read"
    return out


def lines(entry: dict[str, Any]) -> list[str]:
    """The two lines preflight prints."""
    checked = "" if entry["checked"] else f" [{entry['why']}; {entry['basis']}]"
    v = entry["viability"]
    est = "no estimate" if v["estimate_bytes"] is None else f"estimate {v['estimate_bytes'] / GiB:.1f} GiB"
    if v["fits"] is None:
        base = f"unknown: {est}; {v['why']}"
    else:
        base = f"{'fits' if v['fits'] else 'does not fit'}: {est} of {v['device_bytes'] / GiB:.1f} GiB ({v['device']})"
    return [f"serving: {entry['verdict']}: {entry['reason']}; export: {entry['export']}{checked}",
            f"base viability: {base}"]
