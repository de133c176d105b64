"""Router telemetry and the router losses, read from the model's own routers through forward hooks.

No model code is re-implemented: each MoE layer's router logits and the top-k ids it actually chose
are read from transformers' router modules (`align.models.family_table.RouterTap`). Per optimizer step
(one accumulation window, summed over ranks with one all_reduce) and per layer we report:

- `max_vio`: (max expert load - mean load) / mean load (0 = balanced)
- `utilization`: sum_i min(f_i, 1/E), f_i the fraction of routed slots that went to expert i (1 = balanced)
- `dead_frac`: fraction of experts whose load is below 0.1x the mean load
- `entropy`: mean per-token entropy of the router's softmax (nats; log E = uniform)
- `lb_loss`: the load-balancing loss value, transformers' definition (E * sum_i f_i P_i with f_i
  counted per token, so a perfectly balanced router gives top_k), whether or not it is applied
- `z_loss`: the router z-loss value, mean over tokens of logsumexp(logits)^2, whether or not applied

Padding tokens (attention_mask == 0) are excluded from every statistic and from the applied losses.
Hooks record only inside the outermost model's forward while it is in train mode: activation
checkpointing re-runs the routers during backward, outside that forward, and is not counted twice.

Why batched: launch count. The per-layer hooks only stash each layer's logits and chosen ids (no
op); the statistics of ALL layers of one forward are computed in one pass when the outermost forward
returns (`window_stats` on [L, T, E]: one float cast, one log_softmax, one fp64 reduction over tokens,
one histc over ids offset by layer), so the ops per forward do not grow with the layer count.
Computed per layer in the hooks, the op count grew with the depth; batched, it is a fixed number
of kernels per forward (tests/unit/models/test_moe_telemetry.py counts them;
tests/gpu/test_moe_telemetry_gpu.py times them). `on_step` used to wait for the optimizer to read the
window; `close_window` starts that read at the boundary instead (what each cost:
docs/benchmarks/log.md#e-2026-11-30-moe-levers). A forward that raises accumulates nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("align")

# Where a router hook leaves its layer's logits and chosen ids for `_finish` (plain attributes).
_LOGITS, _IDS = "_align_router_logits", "_align_router_ids"

# One row of the per-layer window accumulator: [counts(E) | prob_sum(E) | tokens, entropy_sum, z_sum].
_TOKENS, _ENT, _Z = 0, 1, 2


def router_metrics(counts: np.ndarray, prob_sum: np.ndarray, tokens: float, entropy_sum: float, z_sum: float,
                   top_k: int) -> dict[str, float]:
    """Metrics of one layer over one window, from summed statistics (so ranks can be reduced first)."""
    E = counts.shape[-1]
    total = float(counts.sum())
    if total <= 0 or tokens <= 0:
        return {k: float("nan") for k in ("max_vio", "utilization", "dead_frac", "entropy", "lb_loss", "z_loss")}
    mean = total / E
    f = counts / total
    return {
        "max_vio": float((counts.max() - mean) / mean),
        "utilization": float(np.minimum(f, 1.0 / E).sum()),
        "dead_frac": float((counts < 0.1 * mean).mean()),
        "entropy": float(entropy_sum / tokens),
        "lb_loss": float(E * np.sum((counts / tokens) * (prob_sum / tokens))),
        "z_loss": float(z_sum / tokens),
    }


@torch.no_grad()
def window_stats(logits: torch.Tensor, ids: torch.Tensor, mask: Optional[torch.Tensor],
                 num_experts: int) -> torch.Tensor:
    """Window rows [G, 2E+3] (float64, layout of `RouterTelemetry`'s window) of G layers that saw the
    same T tokens, in one batched pass: `logits` [G, T, E] (any float dtype), `ids` [G, T, k] the
    chosen experts, `mask` [T] bool (True = real token) or None."""
    E = num_experts
    G = logits.shape[0]
    lg = logits.float()
    logp = F.log_softmax(lg, dim=-1)
    p = logp.exp()
    # [p (E) | 1 | entropy | z] per token, summed over (real) tokens in fp64: the sums do not depend
    # on how a kernel splits the reduction, so one layer's rows equal its own per-layer computation.
    per_token = torch.cat([p, torch.ones_like(p[..., :1]), -(p * logp).sum(-1, keepdim=True),
                           torch.logsumexp(lg, -1, keepdim=True).square()], dim=-1)
    if mask is not None:
        per_token = per_token * mask.to(per_token.dtype)[None, :, None]
    sums = per_token.sum(1, dtype=torch.float64)
    # One histc for all layers: layer g's expert i goes to bin g*(E+1)+i and padding to its extra bin
    # g*(E+1)+E, dropped. No boolean indexing and, unlike bincount, no host sync. histc wants float
    # on CPU/MPS and int on CUDA for determinism (as transformers does); float values sit at bin
    # centres (+0.5) because float histc misbins integers at bin edges beyond ~4096 bins.
    slot = ids if mask is None else torch.where(mask[None, :, None], ids, E)
    slot = slot + torch.arange(0, G * (E + 1), E + 1, device=ids.device, dtype=ids.dtype)[:, None, None]
    slot = slot.reshape(-1)
    slot = slot.float() + 0.5 if slot.device.type in ("cpu", "mps") else slot.int()
    nb = G * (E + 1)
    counts = torch.histc(slot, bins=nb, min=0, max=nb).view(G, E + 1)[:, :E].to(torch.float64)
    return torch.cat([counts, sums], dim=1)


def z_loss(logits: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Router z-loss (ST-MoE): mean over (unmasked) tokens of logsumexp(logits)^2."""
    z = torch.logsumexp(logits.float(), dim=-1).square()
    if mask is None:
        return z.mean()
    m = mask.to(z.dtype)
    return (z * m).sum() / m.sum().clamp_min(1)


def lb_loss(logits: torch.Tensor, num_experts: int, top_k: int, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """transformers' load-balancing loss for one layer's logits [tokens, E] (padding excluded)."""
    from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func

    return load_balancing_loss_func((logits,), num_experts, top_k, attention_mask)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _read_on_host(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Start copying `t` to the host; the returned call waits for that copy only, not for the work
    queued after it on the stream (a plain `.cpu()` later would wait for the optimizer step too, and
    the host would then start the next step with an empty device queue)."""
    if t.device.type != "cuda":
        host = t.detach().clone() if t.device.type == "cpu" else t.detach().cpu()  # .cpu() of a CPU tensor is itself
        return lambda: host
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    buf.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def wait() -> torch.Tensor:
        done.synchronize()
        return buf
    return wait


class RouterTelemetry:
    """Hooks on every router of `model`; window statistics, the applied router losses, the heatmap."""

    def __init__(self, model: torch.nn.Module, taps: Sequence[Any], num_experts: int, top_k: int,
                 lb_weight: float = 0.0, z_weight: float = 0.0, record: bool = True) -> None:
        self.layers = [t.layer for t in taps]
        self.E, self.k = num_experts, top_k
        self.lb_weight, self.z_weight = float(lb_weight), float(z_weight)
        self.record = record
        self._taps = list(taps)
        self._armed = False
        self._mask: Optional[torch.Tensor] = None  # [B, S] as given to the model, or None
        self.padding_mask: Optional[torch.Tensor] = None
        """The micro-batch's real-token mask when the model gets none (sampler.mask_padding=false)."""
        self._pending: list[tuple[torch.Tensor, Optional[torch.Tensor]]] = []  # (logits with graph, mask)
        self._window: Optional[torch.Tensor] = None
        self._read: Optional[Any] = None  # the window's copy to the host, started by close_window()
        self.loads: list[np.ndarray] = []  # per optimizer step: [L, E] expert loads (all ranks)
        self.steps: list[int] = []
        # `_finish` before `_disarm`, and only `_disarm` drops what a forward left on the routers:
        # torch runs an always_call hook after the hooks before it, and also when the forward or one
        # of those hooks (`_finish` included) raises an Exception. `_arm` clears as well: a
        # KeyboardInterrupt skips that except path, and with it `_disarm`.
        self._handles = [
            model.register_forward_pre_hook(self._arm, with_kwargs=True),
            model.register_forward_hook(self._finish),
            model.register_forward_hook(self._disarm, always_call=True),
        ]
        if taps:
            on_logits, on_ids = self._router_hooks(taps)
            for t in taps:
                self._handles.append(t.logits_module.register_forward_hook(on_logits))
                self._handles.append(t.index_module.register_forward_hook(on_ids))

    @property
    def applies_loss(self) -> bool:
        return self.lb_weight > 0 or self.z_weight > 0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ------------------------------------------------------------------------------ hooks

    def _arm(self, module, args, kwargs):
        self._armed = module.training
        mask = kwargs.get("attention_mask")
        if mask is None:
            mask = self.padding_mask  # sampler.mask_padding=false: the trainer hands it over
        self._mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        self._clear_routers()

    def _finish(self, module, args, output):
        """The forward returned: what every router left, statistics batched over layers, the losses'
        logits kept with their graph."""
        seen = [(row, t.logits_module.__dict__.get(_LOGITS), t.index_module.__dict__.get(_IDS))
                for row, t in enumerate(self._taps)]
        seen = [(row, logits, ids) for row, logits, ids in seen if logits is not None and ids is not None]
        if not seen:  # no MoE layer ran, or not in train mode
            return
        if self.applies_loss and torch.is_grad_enabled():
            for _, logits, _ in seen:
                logits = logits.reshape(-1, logits.shape[-1])
                mask = self._flat_mask(logits.shape[0])
                self._pending.append((logits, self._mask if mask is not None else None))
        if self.record:
            with torch.no_grad():  # also detaches the logits, once per group rather than once per layer
                self._accumulate(seen)

    def _accumulate(self, seen: list[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        groups: dict[tuple, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
        for row, logits, idx in seen:  # one group in practice: every layer sees the same tokens
            key = (logits.shape, logits.dtype, idx.shape, idx.dtype, logits.device)
            groups.setdefault(key, []).append((row, logits, idx))
        for members in groups.values():
            rows = [m[0] for m in members]
            G, E = len(members), members[0][1].shape[-1]
            logits = torch.stack([m[1] for m in members]).reshape(G, -1, E)
            ids = torch.stack([m[2] for m in members]).reshape(G, logits.shape[1], -1)
            stats = window_stats(logits, ids, self._flat_mask(logits.shape[1]), self.E)
            if self._window is None:
                self._window = torch.zeros(len(self.layers), 2 * self.E + 3, dtype=torch.float64,
                                           device=logits.device)
            if rows == list(range(rows[0], rows[0] + len(rows))):
                self._window[rows[0]:rows[0] + len(rows)] += stats
            else:  # some layers did not route (a partial forward)
                for i, row in enumerate(rows):
                    self._window[row] += stats[i]

    def _disarm(self, module, args, output):
        self._armed = False
        self._clear_routers()

    def _clear_routers(self) -> None:
        for t in self._taps:
            t.logits_module.__dict__.pop(_LOGITS, None)
            t.index_module.__dict__.pop(_IDS, None)

    def _flat_mask(self, n_tokens: int) -> Optional[torch.Tensor]:
        if self._mask is None or self._mask.numel() != n_tokens:
            return None
        return self._mask.reshape(-1).bool()

    # The router hooks run inside the decoder blocks, which trainer.compile compiles, so they are
    # written to be traced: one function of each kind shared by every layer, no Python state read
    # that differs between layers, and what they read left on the router module itself (a
    # compiled block's guards include its hooks and what they read: a hook per layer, or a layer
    # number read, recompiles the block for every layer until dynamo's recompile limit sends it back
    # to eager, docs/pitfalls.md#8). Eager islands (`torch.compiler.disable`) were the earlier
    # answer; inside an activation-checkpointed block a graph break sends the whole block to eager.
    def _router_hooks(self, taps: Sequence[Any]) -> tuple[Callable, Callable]:
        logits_of, index_of = taps[0].logits_of, taps[0].index_of
        for t in taps:
            if t.logits_of.__code__ is not logits_of.__code__ or t.index_of.__code__ is not index_of.__code__:
                raise ValueError("router taps of one model must read every layer alike")

        def on_logits(module, args, output):
            if self._armed:
                setattr(module, _LOGITS, logits_of(output))

        def on_ids(module, args, output):
            if self._armed:
                setattr(module, _IDS, index_of(output))
        return on_logits, on_ids

    # ---------------------------------------------------------------------- loss and steps

    def aux_loss(self, scale: float = 1.0):
        """The router losses to add to this micro-batch's loss: lb_weight * mean-over-layers lb +
        z_weight * mean-over-layers z, times `scale` (the trainer passes the micro-batch's share of the
        window's loss tokens, so the window applies a token-weighted mean).
        A Python 0.0 when both weights are 0 (nothing is kept for it then)."""
        pending, self._pending = self._pending, []
        if not self.applies_loss or not pending:
            return 0.0
        total = 0.0
        if self.lb_weight > 0:
            total = total + self.lb_weight * torch.stack([lb_loss(lg, self.E, self.k, m) for lg, m in pending]).mean()
        if self.z_weight > 0:
            total = total + self.z_weight * torch.stack(
                [z_loss(lg, None if m is None else m.reshape(-1)) for lg, m in pending]).mean()
        return scale * total

    def close_window(self) -> None:
        """One process: start copying the window to the host now, before the optimizer step is queued
        behind it. `on_step` reads that copy instead of waiting for the step (the wait left the device
        queue empty while the host caught up; its cost: docs/benchmarks/log.md#e-2026-11-30-moe-levers).
        With ranks the window is reduced in `on_step` first."""
        self._read = None
        if self.record and self._window is not None and not _distributed():
            self._read = _read_on_host(self._window)

    def on_step(self, step: int) -> dict[str, float]:
        """Close the window of optimizer step `step`: reduce over ranks, return `moe/...` metrics."""
        w, self._window = self._window, None
        read, self._read = self._read, None
        self._pending.clear()
        if not self.record:
            return {}
        if read is not None:
            a = read().numpy()
        else:
            if w is None:  # no MoE forward in this window (all ranks still take part in the reduce)
                w = torch.zeros(len(self.layers), 2 * self.E + 3, dtype=torch.float64, device=self._device_hint())
            if _distributed():
                torch.distributed.all_reduce(w, op=torch.distributed.ReduceOp.SUM)
            a = w.cpu().numpy()
        E = self.E
        out: dict[str, float] = {}
        per: dict[str, list[float]] = {}
        for row, layer in enumerate(self.layers):
            m = router_metrics(a[row, :E], a[row, E:2 * E], *a[row, 2 * E:], top_k=self.k)
            for key, v in m.items():
                out[f"moe/l{layer}/{key}"] = v
                per.setdefault(key, []).append(v)
        if per:
            out["moe/max_vio_mean"] = float(np.mean(per["max_vio"]))
            out["moe/max_vio_max"] = float(np.max(per["max_vio"]))
            out["moe/utilization_min"] = float(np.min(per["utilization"]))
            out["moe/dead_frac_max"] = float(np.max(per["dead_frac"]))
            out["moe/entropy_mean"] = float(np.mean(per["entropy"]))
            out["moe/lb_loss"] = float(np.mean(per["lb_loss"]))
            out["moe/z_loss"] = float(np.mean(per["z_loss"]))
            out["moe/aux_applied"] = self.lb_weight * out["moe/lb_loss"] + self.z_weight * out["moe/z_loss"]
        self.loads.append(a[:, :E].copy())
        self.steps.append(step)
        return out

    def _device_hint(self) -> torch.device:
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # ------------------------------------------------------------------------------ plots

    def save_heatmap(self, path: Path) -> Optional[Path]:
        """One panel per MoE layer: expert (y) x optimizer step (x), colour = load / fair share."""
        if not self.loads:
            return None
        loads = np.stack(self.loads)  # [steps, L, E]
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path.with_suffix(".npz"), loads=loads, steps=np.asarray(self.steps),
                            layers=np.asarray(self.layers))
        try:
            import matplotlib
        except ImportError:
            log.warning("matplotlib is not installed: expert loads saved to %s, no heatmap", path.with_suffix(".npz"))
            return None

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        mean = loads.sum(-1, keepdims=True) / self.E
        rel = np.divide(loads, mean, out=np.zeros_like(loads), where=mean > 0)
        L = loads.shape[1]
        cols = min(4, L)
        rows = -(-L // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows + 0.6), squeeze=False,
                                 layout="constrained")
        vmax = max(2.0, float(np.percentile(rel, 99)))
        im = None
        for i, ax in enumerate(axes.flat):
            if i >= L:
                ax.axis("off")
                continue
            im = ax.imshow(rel[:, i, :].T, aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=vmax,
                           extent=(self.steps[0] - 0.5, self.steps[-1] + 0.5, -0.5, self.E - 0.5))
            ax.set_title(f"layer {self.layers[i]}", fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.set_ylabel("expert", fontsize=8)
        fig.colorbar(im, ax=axes.ravel().tolist(), label="load / fair share")
        fig.suptitle(f"expert load per MoE layer (E={self.E}, top-{self.k})")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
