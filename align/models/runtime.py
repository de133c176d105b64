"""What a built model asks of the training loop: router losses per micro-batch, router telemetry and
the LoRA gate per optimizer step, plots at the end. A dense full fine-tune gets a runtime whose calls
do nothing, so the loop has no family branches.

    loss = ce + runtime.aux_loss(scale=loss_tokens / window_loss_tokens)  # per micro-batch
    metrics.update(runtime.on_step(step))                   # per optimizer step, every rank
    runtime.finish(run_dir)                                 # after the loop, rank 0 writes plots
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from align.models.lora import LoraGate


@dataclass
class ModelRuntime:
    moe: Optional[Any] = None
    """align.telemetry.moe.RouterTelemetry for MoE models."""
    lora_gate: Optional[LoraGate] = None

    @classmethod
    def build(cls, model: torch.nn.Module, cfg, spec, moe_shape) -> "ModelRuntime":
        moe = None
        if moe_shape is not None and spec.reads_routers:  # model=hf's generic MoE: routers align cannot read
            from align.telemetry.moe import RouterTelemetry

            taps = spec.router_taps(model)
            moe = RouterTelemetry(model, taps, moe_shape.num_experts, moe_shape.top_k,
                                  cfg.moe.lb_weight, cfg.moe.z_weight, record=cfg.moe.telemetry)
        gate = LoraGate(model, cfg.lora.gate_steps) if cfg.lora.enabled else None
        return cls(moe, gate)

    def before_forward(self, padding_mask: Optional[torch.Tensor]) -> None:
        """The micro-batch's real-token mask, for statistics when the model is given no mask."""
        if self.moe is not None:
            self.moe.padding_mask = padding_mask

    def aux_loss(self, scale: float = 1.0):
        return self.moe.aux_loss(scale) if self.moe is not None else 0.0

    def close_window(self) -> None:
        """The micro-batches of this optimizer step are done: start reading their statistics."""
        if self.moe is not None:
            self.moe.close_window()

    def on_step(self, step: int) -> dict[str, float]:
        metrics = self.moe.on_step(step) if self.moe is not None else {}
        if self.lora_gate is not None:
            self.lora_gate.check(step)
        return metrics

    def finish(self, run_dir: Path, is_main: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.moe is not None and is_main:
            png = self.moe.save_heatmap(Path(run_dir) / "plots" / "moe_expert_load.png")
            out["moe_heatmap"] = str(png) if png else None
        if self.lora_gate is not None:
            out["lora_gate_passed"] = self.lora_gate.passed
        return out
