"""The trainer: `build()` wires the components from the typed config, `fit()` is the loop, and
`train_step()` is one optimizer step over an accumulation window."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from align.config import Precision, TrainConfig
from align.data.collate import Batch
from align.data.cache import load_dataset
from align.data.encode import EncodedDataset
from align.data.loader import BatchStream, build_stream
from align.data.tokenizer import load_tokenizer
from align.errors import EXIT_OK
from align.loss import ce_sum
from align.models import build_model
from align.models.export import export_hf
from align.models.runtime import ModelRuntime
from align.optim import build_optimizer, build_scheduler
from align.parallel.env import DistEnv, dist_env
from align.telemetry.history import History
from align.telemetry.progress import Progress
from align.telemetry.throughput import Throughput
from align.telemetry.wandb_logger import Logger, build_logger, wandb_init_kwargs

log = logging.getLogger("align")


@dataclass
class TrainState:
    step: int = 0
    """Optimizer steps taken."""
    clipped_steps: int = 0
    tokens: int = 0
    real_tokens: int = 0
    loss_tokens: int = 0


@dataclass
class Trainer:
    cfg: TrainConfig
    run_dir: Path
    env: DistEnv
    tokenizer: Any
    data: EncodedDataset
    stream: BatchStream
    model: torch.nn.Module
    model_info: dict[str, Any]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    logger: Logger
    history: History
    throughput: Throughput
    state: TrainState = field(default_factory=TrainState)
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = ce_sum
    """The loss of one micro-batch (summed over loss tokens); the probes wrap it to time it."""
    runtime: ModelRuntime = field(default_factory=ModelRuntime)
    """Router losses/telemetry and the LoRA gate of the built model (align.models.runtime)."""

    @classmethod
    def build(cls, cfg: TrainConfig, run_dir: Path, wandb_config: dict | None = None, group: str | None = None) -> "Trainer":
        env = dist_env(cfg.trainer.device)
        torch.manual_seed(cfg.trainer.seed)
        if cfg.trainer.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=False)

        tokenizer = load_tokenizer(cfg.model)
        data = load_dataset(cfg.data, cfg.model, tokenizer)
        stream = build_stream(cfg, data, tokenizer.pad_token_id, env.rank, env.world, pin_memory=env.device.type == "cuda")

        built = build_model(cfg.model, cfg.attention, tokenizer, env.device)
        model = built.model.to(env.device)
        if cfg.parallel.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()

        optimizer = build_optimizer(cfg.optimizer, [p for p in model.parameters() if p.requires_grad], env.device)
        scheduler = build_scheduler(cfg.optimizer, optimizer, cfg.trainer.max_steps)

        name = cfg.name or run_dir.name
        logger = build_logger(cfg.logger, env.is_main, wandb_init_kwargs(cfg.logger, run_dir, name, group, wandb_config or {}))
        history = History(run_dir / "history.jsonl")
        throughput = Throughput.build(model, env.device, measure=env.is_main)
        return cls(cfg, run_dir, env, tokenizer, data, stream, model, built.info, optimizer, scheduler, logger, history,
                   throughput, runtime=built.runtime)

    # ------------------------------------------------------------------------------------- loop

    def autocast(self) -> contextlib.AbstractContextManager:
        p = self.cfg.trainer.precision
        if p == Precision.bf16 or (p == Precision.auto and self.env.device.type == "cuda"):
            return torch.autocast(self.env.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def fit(self) -> int:
        cfg = self.cfg.trainer
        batches = iter(self.stream)
        progress = Progress(cfg.max_steps, self.state.step, self.env.is_main, cfg.log_every)
        try:
            while self.state.step < cfg.max_steps:
                metrics = self.train_step(batches)
                self.history.append(metrics)
                self.logger.log({k: v for k, v in metrics.items() if k != "step"}, step=metrics["step"])
                progress.update(metrics["step"], metrics["loss"], metrics["tokens_per_s"])
        finally:
            progress.close()
        self.model_info.update(self.runtime.finish(self.run_dir, self.env.is_main))
        if cfg.export and self.env.is_main:
            export_hf(self.model, self.tokenizer, self.run_dir / "export")
        self.logger.summary(self.summary())
        self.history.close()
        self.logger.finish(EXIT_OK)
        return EXIT_OK

    def forward_backward(self, b: Batch, denom: int) -> torch.Tensor:
        """One micro-batch: forward, loss / `denom` (the window's loss tokens), backward. The probes time this.
        Router losses (MoE, when weighted) weigh by the micro-batch's share of the window's loss tokens."""
        with self.autocast():
            logits = self.model(**b.model_inputs()).logits
        loss = self.loss_fn(logits, b.labels) / denom
        (loss + self.runtime.aux_loss(scale=b.loss_tokens / denom)).backward()
        return loss.detach()

    def train_step(self, batches: Iterator[Batch]) -> dict[str, Any]:
        t0 = time.perf_counter()
        window = [next(batches).to(self.env.device) for _ in range(self.cfg.trainer.grad_accum)]
        loss_tokens = sum(b.loss_tokens for b in window)
        denom = max(loss_tokens, 1)
        loss_sum = torch.zeros((), device=self.env.device)
        for b in window:
            loss_sum += self.forward_backward(b, denom)

        max_norm = self.cfg.optimizer.max_grad_norm
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf))
        clipped = max_norm > 0 and grad_norm > max_norm
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

        dt = time.perf_counter() - t0
        s = self.state
        s.step += 1
        s.clipped_steps += int(clipped)
        tokens, real = sum(b.tokens for b in window), sum(b.real_tokens for b in window)
        s.tokens, s.real_tokens, s.loss_tokens = s.tokens + tokens, s.real_tokens + real, s.loss_tokens + loss_tokens
        return {
            "step": s.step,
            "loss": float(loss_sum),
            "lr": lr,
            "grad_norm": grad_norm,
            "clipped": clipped,
            "clip_fraction": s.clipped_steps / s.step,
            "tokens": tokens,
            "real_tokens": real,
            "loss_tokens": loss_tokens,
            "step_time_s": dt,
            "tokens_per_s": tokens / dt,
            "real_tokens_per_s": real / dt,
            "epoch": self.stream.position.epoch,
            **self.throughput.step(window, dt),
            **self.runtime.on_step(s.step),
            **self.stream.stats.step(window),
        }

    def summary(self) -> dict[str, Any]:
        s = self.state
        return {"steps": s.step, "tokens": s.tokens, "real_tokens": s.real_tokens, "loss_tokens": s.loss_tokens,
                "clipped_steps": s.clipped_steps, **self.model_info, **self.throughput.summary(),
                **self.stream.stats.summary()}
