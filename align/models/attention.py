"""Which attention backend a run gets, decided before anything heavy runs.

A backend the family's transformers class does not support (OLMoE has no flex attention), or that
this machine cannot run (flash attention needs the flash-attn package and CUDA), fails preflight
with the reason, unless `attention.fallback=allow`: then the run uses sdpa, says so loudly, and the
manifest records requested, resolved and why. The resolved backend is read back from the built model
too (`config._attn_implementation`) and recorded as such (align.models.build.describe_model).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Union

from align.config import AttentionConfig, AttnImpl, Fallback, Family
from align.errors import ConfigError

if TYPE_CHECKING:
    from align.models.family_table import FamilySpec

log = logging.getLogger("align")

FALLBACK = AttnImpl.sdpa


@dataclass(frozen=True)
class AttentionChoice:
    requested: AttnImpl
    resolved: AttnImpl
    reason: Optional[str] = None
    """Why `resolved` differs from `requested` (None when it does not)."""

    @property
    def hf_name(self) -> str:
        return self.resolved.hf_name


def unsupported_reason(family: Union[Family, "FamilySpec"], impl: AttnImpl,
                       device_type: Union[str, Callable[[], str]]) -> Optional[str]:
    """Why `impl` cannot run for `family` (a family, or the spec `align.models.family.family_spec` resolved)
    on `device_type`, or None when it can. `device_type` may be a function, called only when the rule
    needs the device (resolving trainer.device=auto imports torch)."""
    from align.models.family import as_spec

    spec = as_spec(family)
    if impl not in spec.attention:
        ok = ", ".join(sorted(a.value for a in spec.attention))
        who = spec.architecture if spec.name == Family.hf else f"{spec.name.value}'s transformers class"
        return f"{who} does not support {impl.hf_name} (it supports: {ok})"
    if impl == AttnImpl.flash:
        if importlib.util.find_spec("flash_attn") is None:
            return ("flash_attention_2 needs the flash-attn package, which is not installed (transformers raises "
                    "ImportError; its hub-kernel fallback needs the `kernels` package and network)")
        device = device_type() if callable(device_type) else device_type
        if device != "cuda":
            return f"flash_attention_2 runs on CUDA only (device is {device})"
    if impl == AttnImpl.flex and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return "flex_attention needs torch.nn.attention.flex_attention, absent from this torch"
    return None


def resolve_attention(family: Union[Family, "FamilySpec"], cfg: AttentionConfig, device_type: str) -> AttentionChoice:
    """The backend to build with (auto: the family's choice); ConfigError (exit 2) when refused."""
    from align.models.family import as_spec

    spec = as_spec(family)
    impl = cfg.chosen(spec.name)
    reason = unsupported_reason(spec, impl, device_type)
    if reason is None:
        return AttentionChoice(cfg.implementation, impl)
    if cfg.fallback == Fallback.refuse:
        raise ConfigError("attention.implementation", f"{reason}; choose another backend or set "
                          f"attention.fallback=allow to run on {FALLBACK.value}", cfg.implementation.value)
    log.warning("!" * 100)
    log.warning("ATTENTION FALLBACK: requested %s, running %s: %s (attention.fallback=allow)",
                impl.hf_name, FALLBACK.hf_name, reason)
    log.warning("!" * 100)
    return AttentionChoice(cfg.implementation, FALLBACK, reason)


def sdpa_priority(cfg: AttentionConfig, family: Family) -> Callable[[], contextlib.AbstractContextManager]:
    """A context factory for every forward: torch's SDPA kernel choice restricted to, and ordered by,
    `attention.sdpa_kernels` (the backward follows the forward's kernel; under attention=layered, the
    layers that run sdpa). Nothing when empty."""
    if not cfg.sdpa_kernels or cfg.chosen(family) not in (AttnImpl.sdpa, AttnImpl.layered):
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, k.torch_name) for k in cfg.sdpa_kernels]
    return functools.partial(sdpa_kernel, backends, set_priority=True)
