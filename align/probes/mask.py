"""Mask probe: materialise the attention masks the model actually receives and assert their band
structure. CPU, no weights, seconds.

transformers can skip mask creation and hand a layer `attention_mask=None` (the is_causal fast path);
on a sliding-window layer that silently turns windowed attention into full causal attention: a
different model from the one you serve. So we never infer the band from speed: a forward pre-hook on
every attention module records the mask it is called with, for an unpadded and a padded batch made
from real data by the trainer's own collate, and each mask is compared position by position against
what the config says the layer must see:

    full_attention      key k visible to query q  iff  k <= q and k is not padding
    sliding_attention   ... and q - k < sliding_window  (at most `sliding_window` positions per row)

A mask of None means "causal, nothing else" (SDPA's is_causal): correct for a full layer on an
unpadded batch, wrong for a sliding layer whose window binds. Flash attention takes the window as a
kernel argument instead of a mask: there the module's `sliding_window` is checked (weaker evidence,
reported as such).

    python -m align.tools.probe probe=mask model=gemma4      # report + mask.json in the probe's run dir
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

import numpy as np
import torch

from align.config import TrainConfig
from align.data.collate import Batch, collate
from align.data.encode import EncodedDataset
from align.errors import EXIT_CONFIG, EXIT_OK, ConfigError
from align.models.layered_attention import NAME as LAYERED
from align.models.layered_attention import observed_band

SLIDING, FULL = "sliding_attention", "full_attention"


def layer_types(config: Any, n_layers: int) -> list[str]:
    """What the CONFIG says each attention layer is (the expectation, not what the model did)."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    return [SLIDING if getattr(config, "sliding_window", None) else FULL] * n_layers


def attention_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """transformers' attention modules, in layer order: `*Attention` classes that know their layer_idx."""
    mods = [(n, m) for n, m in model.named_modules()
            if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]
    return sorted(mods, key=lambda nm: nm[1].layer_idx)


def probe_batches(data: EncodedDataset, pad_id: int, length: int, rows: int = 2) -> dict[str, Batch]:
    """An unpadded and a right-padded batch of real tokens (the data's stream, tiled to `length`),
    through the trainer's collate: the unpadded one carries no mask, exactly as in training."""
    def tiled(lengths: list[int]) -> EncodedDataset:
        total = sum(lengths)
        idx = np.arange(total) % len(data.tokens)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return EncodedDataset(tokens=data.tokens[idx], loss_mask=data.loss_mask[idx], offsets=offsets,
                              ids=[f"mask-probe:{i}" for i in range(len(lengths))], roots=["mask-probe"] * len(lengths))

    full = [length] * rows
    short = [length] + [max(length // 2, 1)] * (rows - 1)
    return {"unpadded": collate(tiled(full), np.arange(rows), pad_id),
            "padded": collate(tiled(short), np.arange(rows), pad_id)}


def _allowed(mask: Any, batch: int, q_len: int, k_len: int) -> Optional[torch.Tensor]:
    """Boolean [B, Q, K] 'query may see key' from a materialised mask; None for a None mask
    (the caller treats None as plain causal)."""
    if mask is None:
        return None
    if type(mask).__name__ == "BlockMask":  # flex attention: evaluate its mask_mod on the full grid
        from torch.nn.attention.flex_attention import create_mask

        dense = create_mask(mask.mask_mod, batch, 1, q_len, k_len, device=mask.kv_num_blocks.device)
        return dense[:, 0].bool().cpu()
    t = mask.detach().cpu()
    if t.dim() == 4:
        t = t[:, 0]
    if t.dtype != torch.bool:  # additive float mask: 0 where attended, large negative where masked
        t = t == 0
    return t.expand(batch, q_len, k_len)


def expected(valid: torch.Tensor, window: Optional[int]) -> torch.Tensor:
    """[B, Q, K] what the config says: causal, no padding keys, and the window on sliding layers."""
    L = valid.shape[1]
    q = torch.arange(L)[:, None]
    k = torch.arange(L)[None, :]
    band = k <= q
    if window is not None:
        band &= (q - k) < window
    return band[None] & valid[:, None, :]


def _describe(mask: Any) -> str:
    if mask is None:
        return "None (is_causal fast path)"
    dtype = str(getattr(mask, "dtype", "")).removeprefix("torch.")
    return f"{type(mask).__name__} {dtype} {list(getattr(mask, 'shape', []))}".replace("  ", " ")


def check_layer(name: str, kind: str, window: Optional[int], mask: Any, module: torch.nn.Module, valid: torch.Tensor,
                impl: Optional[str]) -> dict[str, Any]:
    """Compare one layer's mask with the band the config prescribes, on real (non-padding) query rows."""
    B, L = valid.shape
    want_window = window if kind == SLIDING else None
    out: dict[str, Any] = {"layer": name, "type": kind, "window": want_window, "mask": _describe(mask)}
    if (impl or "").startswith("flash") or (mask is not None and getattr(mask, "dim", lambda: 0)() == 2):
        # flash takes a 2D padding mask (or None) and the window as a kernel argument: check the module carries it
        attr = getattr(module, "sliding_window", None)
        ok = attr == want_window
        out.update(evidence="module.sliding_window (the kernel enforces the window; no mask to count)", ok=ok,
                   detail=f"module.sliding_window={attr}, config wants {want_window}")
        return out
    got = _allowed(mask, B, L, L)
    out["evidence"] = "materialised mask"
    if got is None and impl == LAYERED:  # the kernel takes the window: read the band from its output
        got = observed_band(module, L).expand(B, L, L)
        out["evidence"] = "the kernel's own output (one-hot values)"
    elif got is None:
        got = torch.ones(B, L, L, dtype=torch.bool).tril()  # None means is_causal and nothing else
    real_q = valid[:, :, None]  # only real query rows: padding rows' outputs never reach the loss
    counts = (got & real_q).sum(-1)
    max_allowed = int(counts.max())
    sat = int((counts == max_allowed).float().argmax(-1).min())
    diff = (got != expected(valid, want_window)) & real_q
    ok = not bool(diff.any())
    out.update(max_allowed_per_row=max_allowed, saturates_at_row=sat, ok=ok)
    if ok:
        out["detail"] = f"max {max_allowed} allowed/row, saturates at row {sat}"
    else:
        b, q, k = (int(x) for x in diff.nonzero()[0])
        extra = bool(got[b, q, k])
        rule = f"window {want_window}" if want_window else "causal"
        out["detail"] = (f"query {q} (batch row {b}) {'sees' if extra else 'misses'} key {k}, which the config "
                         f"({rule}{', key is padding' if not valid[b, k] else ''}) {'forbids' if extra else 'allows'}; "
                         f"max {max_allowed} allowed/row (a {kind} layer must allow at most {want_window or L})")
    return out


def mask_report(model: torch.nn.Module, batches: dict[str, Batch],
                autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> dict[str, Any]:
    """Run one forward per batch with hooks that record each attention module's mask; check them.
    `autocast`: the training forward's autocast context (the trainer's), under which the forwards
    run and a maskless layer's band is read from its kernel (which kernel runs depends on the dtype)."""
    mods = attention_modules(model)
    if not mods:
        raise ConfigError("model", f"mask probe: found no attention modules in {type(model).__name__}")
    types = layer_types(model.config, len(mods))
    window = getattr(model.config, "sliding_window", None)
    device = next(model.parameters()).device
    seen: dict[str, Any] = {}
    hooks = []
    for name, mod in mods:
        def grab(module, args, kwargs, name=name):
            seen[name] = kwargs.get("attention_mask")
        hooks.append(mod.register_forward_pre_hook(grab, with_kwargs=True))
    impl = getattr(model.config, "_attn_implementation", None)
    report: dict[str, Any] = {"attn_implementation": impl, "sliding_window": window, "batches": {}}
    try:
        with autocast():
            for label, b in batches.items():
                seen.clear()
                inputs = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in b.model_inputs().items()}
                # Eager even when the blocks are compiled (trainer.compile): traced, these no-grad forwards
                # and this hook's dict filled the blocks' compile caches up to dynamo's recompile limit,
                # and training then ran eager (docs/pitfalls.md#8).
                with torch.no_grad(), torch.compiler.set_stance("force_eager"):
                    model(**inputs)
                B, L = b.input_ids.shape
                valid = b.attention_mask.bool() if b.attention_mask is not None else torch.ones(B, L, dtype=torch.bool)
                layers = []
                for (name, mod), kind in zip(mods, types):
                    if name not in seen:
                        layers.append({"layer": name, "type": kind, "ok": False, "mask": "not called",
                                       "detail": "the attention module was never called with attention_mask"})
                        continue
                    layers.append(check_layer(name, kind, window, seen[name], mod, valid, impl))
                report["batches"][label] = {"shape": [B, L], "padded": b.attention_mask is not None, "layers": layers}
    finally:
        for h in hooks:
            h.remove()
    report["by_type"] = summarise(report)
    report["ok"] = all(lay["ok"] for bt in report["batches"].values() for lay in bt["layers"])
    return report


def summarise(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per layer type and batch: the mask kinds seen, the worst allowed/row and the verdict."""
    out: dict[str, dict[str, Any]] = {}
    for label, bt in report["batches"].items():
        for lay in bt["layers"]:
            s = out.setdefault(lay["type"], {}).setdefault(label, {"mask": set(), "ok": True, "max_allowed_per_row": 0})
            s["mask"].add(lay["mask"])
            s["ok"] &= lay["ok"]
            s["max_allowed_per_row"] = max(s["max_allowed_per_row"], lay.get("max_allowed_per_row", 0))
    for per in out.values():
        for s in per.values():
            s["mask"] = sorted(s["mask"])
    return out


def probe_length(model: torch.nn.Module, requested: Optional[int] = None) -> int:
    """Long enough that the window binds (a band check shorter than the window proves nothing)."""
    if requested:
        return requested
    window = getattr(model.config, "sliding_window", None)
    return max(64, window + 16) if window else 64


def render(report: dict[str, Any]) -> str:
    lines = [f"mask probe: attn_implementation={report['attn_implementation']} "
             f"sliding_window={report['sliding_window']}"]
    for kind, per in report["by_type"].items():
        for label, s in per.items():
            shape = report["batches"][label]["shape"]
            lines.append(f"  {kind:<18} {label:<9} {shape}  mask: {', '.join(s['mask']):<44} "
                         f"max {s['max_allowed_per_row']} allowed/row  {'PASS' if s['ok'] else 'FAIL'}")
    for label, bt in report["batches"].items():
        for lay in bt["layers"]:
            if not lay["ok"]:
                lines.append(f"  FAIL {label} {lay['layer']} ({lay['type']}): {lay['detail']}")
    lines.append(f"mask probe {'PASS' if report['ok'] else 'FAIL'}")
    return "\n".join(lines)


def assert_masks(model: torch.nn.Module, data: EncodedDataset, pad_id: int, length: Optional[int] = None,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> dict[str, Any]:
    """The gate `align.train` runs before step 1: raise ConfigError (exit 2) on a wrong band."""
    report = mask_report(model, probe_batches(data, pad_id, probe_length(model, length)), autocast)
    if not report["ok"]:
        bad = next(lay for bt in report["batches"].values() for lay in bt["layers"] if not lay["ok"])
        raise ConfigError("attention",
                          f"mask probe: {bad['type']} layer {bad['layer']} has the wrong band: {bad['detail']}")
    return report


def run(cfg: TrainConfig, out_dir: Path) -> int:
    """`python -m align.tools.probe probe=mask`: build the composed model from config (random init; on the
    run's device, so CPU here) and a few real records, print the report, write mask.json; exit 2 when
    a band is wrong."""
    from align.data.encode import encode_records
    from align.data.sources import load_records
    from align.data.tokenizer import load_tokenizer
    from align.models import build_model

    data_cfg = dataclasses.replace(
        cfg.data, max_records=min(cfg.data.max_records or cfg.probe.mask.records, cfg.probe.mask.records))
    tok = load_tokenizer(cfg.model)
    data = encode_records(load_records(data_cfg), tok, data_cfg)
    from align.parallel.env import autocast_context, resolve_device

    torch.manual_seed(cfg.trainer.seed)
    built = build_model(cfg.model, cfg.attention, tok)
    device = resolve_device(cfg.trainer.device)
    built.model.to(device)
    report = mask_report(built.model,
                         probe_batches(data, tok.pad_token_id, probe_length(built.model, cfg.probe.mask.length)),
                         autocast_context(cfg.trainer.precision, device.type))
    report["model"] = built.info
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mask.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(render(report), flush=True)
    print(f"wrote {out_dir / 'mask.json'}", file=sys.stderr)
    return EXIT_OK if report["ok"] else EXIT_CONFIG
