"""Is one MoE layer bit-reproducible? (docs/pitfalls.md#20: a combine by bf16 atomics makes the router
flip on near-ties, so identical runs report different gradient norms.)

One transformers MoE block (OLMoE's `OlmoeSparseMoeBlock` at OLMoE-1B-7B's shape by default: E=64,
top-8, d=2048, expert width 1024) is run forward and backward `repeats` times on the same bf16 input
and output-gradient, with the experts kernel transformers resolves by default (or the one asked for).
Every repeat is hashed: output, input gradient, every weight gradient, and the router's top-k ids.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

import torch

from align.config import Family, ModelConfig, Preset
from align.models.family_table import FAMILIES


def _digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    raw = t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def moe_layer(family: Family = Family.olmoe, experts: Optional[str] = None, device: str = "cuda",
              dtype: torch.dtype = torch.bfloat16, seed: int = 0, overrides: Optional[dict[str, Any]] = None):
    """Layer 0's MoE block of the family's `full` preset, built by transformers (one layer, small vocab)."""
    from align.config import AttnImpl, ExpertsImpl, MoEConfig
    from align.models.attention import AttentionChoice
    from align.models.build import load_kwargs, preset_kwargs

    if family != Family.olmoe:
        raise ValueError("the single-block check is written for OLMoE's OlmoeSparseMoeBlock "
                         "(router + experts in one module)")
    spec = FAMILIES[family]
    cfg = ModelConfig(family=family, preset=Preset.full,
                      moe=MoEConfig(experts=ExpertsImpl(experts) if experts else None))
    kw = {**preset_kwargs(cfg), "num_hidden_layers": 1, "vocab_size": 256, "pad_token_id": None,
          "bos_token_id": None, "eos_token_id": None, **(overrides or {})}
    config_cls, model_cls = spec.classes()
    torch.manual_seed(seed)
    config = config_cls(**kw)
    model = model_cls._from_config(
        config, **load_kwargs(cfg, AttentionChoice(AttnImpl.sdpa, AttnImpl.sdpa), spec.moe_shape(config)))
    block = model.model.layers[0].mlp
    return block.to(device=device, dtype=dtype), model.config, spec.router_taps(model)


def repeat_check(family: Family = Family.olmoe, experts: Optional[str] = None, tokens: int = 4096, repeats: int = 8,
                 device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 overrides: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """`overrides` shrink the shape for a CPU shake-out; the GPU evidence uses none."""
    block, config, taps = moe_layer(family, experts, device, dtype, seed, overrides)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    hidden = config.hidden_size
    x0 = torch.randn(1, tokens, hidden, generator=g).to(device=device, dtype=dtype)
    gy = torch.randn(1, tokens, hidden, generator=g).to(device=device, dtype=dtype)
    topk: dict[str, torch.Tensor] = {}
    tap = taps[0]
    handle = tap.index_module.register_forward_hook(lambda m, a, o: topk.__setitem__("ids", tap.index_of(o)))
    runs = []
    try:
        for _ in range(repeats):
            block.zero_grad(set_to_none=True)
            x = x0.clone().requires_grad_(True)
            y = block(x)
            y.backward(gy)
            if device == "cuda":
                torch.cuda.synchronize()
            h = {"output": _digest(y), "input_grad": _digest(x.grad), "router_topk": _digest(topk["ids"])}
            h.update({f"grad:{n}": _digest(p.grad) for n, p in block.named_parameters()})
            runs.append(h)
    finally:
        handle.remove()
    keys = list(runs[0])
    distinct = {k: len({r[k] for r in runs}) for k in keys}
    return {
        "family": family.value, "tokens": tokens, "repeats": repeats, "dtype": str(dtype).removeprefix("torch."),
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "num_experts": FAMILIES[family].moe_shape(config).num_experts,
        "top_k": FAMILIES[family].moe_shape(config).top_k,
        "hidden": hidden, "experts_requested": experts, "experts_resolved": config._experts_implementation,
        "intermediate": config.intermediate_size, "torch": torch.__version__, "distinct_hashes": distinct,
        "forward_bit_identical": distinct["output"] == 1 and distinct["router_topk"] == 1,
        "backward_bit_identical": all(v == 1 for k, v in distinct.items()
                                      if k == "input_grad" or k.startswith("grad:")),
    }
