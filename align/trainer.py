"""The trainer: `build()` wires the typed config's components, `fit()` loops, `train_step()` is one optimizer step.
Its side jobs around the steps (rows, eval, checkpoints, halts, plot, console) are callbacks: align/callbacks/."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from torch.profiler import record_function

from align.callbacks import Callbacks, check_parameters, for_run, hand_off, resume_decision
from align.config import ParallelKind, TrainConfig
from align.control.boundary import Verdict, agree
from align.control.nonfinite import SkipStats
from align.control.nonfinite import inject as inject_nan
from align.control.signals import StopSignals
from align.data.collate import Batch
from align.data.encode import EncodedDataset
from align.data.loader import BatchStream
from align.data.tokenizer import load_tokenizer
from align.errors import EXIT_OK, EXIT_SIGNAL, ConfigError
from align.evaluation.schedule import TrainingEval
from align.models import build_model
from align.models.attention import sdpa_priority
from align.models.build import token_id_tables
from align.models.family import family_of
from align.models.runtime import ModelRuntime
from align.objectives import Objective, build_objective
from align.objectives.ce import bypass_lm_head
from align.optim import build_optimizer, build_scheduler, optimizer_impl
from align.optim.step import CompiledStep, OverlappedStep, PlainStep, build_stepper
from align.parallel.compile import apply_compile, compile_blocks, compile_choice
from align.parallel.env import DistEnv, autocast_context, init_distributed
from align.parallel.grad import clip_grad_norm_
from align.parallel.launch import log_rank_to_file
from align.parallel.sharded_export import export_model
from align.parallel.wrap import parallelize
from align.plan import planner
from align.plan.run_length import plan_run_length
from align.telemetry.throughput import Throughput

log = logging.getLogger("align")


@dataclass
class TrainState:
    step: int = 0
    """Optimizer boundaries passed (a skipped non-finite step counts: its data was consumed)."""
    clipped_steps: int = 0
    tokens: int = 0
    real_tokens: int = 0
    loss_tokens: int = 0
    skips: SkipStats = field(default_factory=SkipStats)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainState":
        return cls(**{**d, "skips": SkipStats(**d["skips"])})


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
    """Resolved model, parallel layout and optimizer implementation: goes into the manifest."""
    optimizer: torch.optim.Optimizer
    stepper: OverlappedStep | CompiledStep | PlainStep
    """Steps `optimizer` at each boundary: as is, compiled (`optimizer.compile`) or on a side stream
    beside the next forward (`optimizer.overlap`); align.optim.step."""
    scheduler: Any
    throughput: Throughput
    identity: dict[str, Any]
    """What a checkpoint of this run records and a resume must match (align.control.resume)."""
    state: TrainState = field(default_factory=TrainState)
    stop: StopSignals = field(default_factory=StopSignals)
    objective: Optional[Objective] = None
    """What the loop asks for what varies between methods (align/objectives/interface.py); SFT by default."""
    runtime: ModelRuntime = field(default_factory=ModelRuntime)
    """Router losses/telemetry and the LoRA gate of the built model (align.models.runtime)."""
    t_start: float = 0.0
    """perf_counter() when fit() started: history's `elapsed_s` counts from here."""
    t_boundary: Optional[float] = None
    """perf_counter() at the last step boundary; None: the next step times from its own start."""
    evals: Optional[TrainingEval] = None
    """The in-training eval (`eval=... trainer.eval_every=N`, align/evaluation/schedule.py); None: none."""
    logger: Any = None
    """The tracker (align/telemetry/wandb_logger.py: W&B, TensorBoard, MLflow or none), from the start's
    acceptance on (align/callbacks/step_rows.py)."""
    history: Any = None
    """align.telemetry.history.History of history.jsonl on rank 0 (rows hold values reduced over ranks);
    None on the other ranks."""
    callbacks: Callbacks = field(default_factory=Callbacks)
    """fit()'s side jobs (align/callbacks/__init__.py: which, and why in that order)."""

    @classmethod
    def build(cls, cfg: TrainConfig, run_dir: Path, wandb_config: dict | None = None, group: str | None = None,
              stop: StopSignals | None = None, plan: "planner.Plan | None" = None) -> "Trainer":
        """The run's records (history trim, W&B, checkpoint leftovers) are touched only once the resume is
        decided and its checkpoint loaded: a refused start leaves an earlier run's history, checkpoints
        and W&B alone (a rank's own log is held until then: align.parallel.launch.Attempt)."""
        alloc_conf = apply_cuda_alloc_conf(cfg.trainer.cuda_alloc_conf)
        env = init_distributed(cfg.parallel, cfg.trainer.device, run_dir)
        cfg, sizes, compiling = (plan or planner.plan(cfg, env.device)).for_trainer(cfg, env.device)  # auto: resolved
        compiling.update(apply_compile(cfg))  # what the resolved compile switches set in this process
        log_rank_to_file(env, run_dir)
        torch.manual_seed(cfg.trainer.seed)
        if cfg.trainer.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=False)

        tokenizer = load_tokenizer(cfg.model)
        objective = build_objective(cfg)
        data, stream = objective.build_data(cfg, tokenizer, env)
        cfg, sizes["run_length"] = plan_run_length(cfg, stream)  # trainer.epochs: max_steps from the data's plan

        on_device = cfg.model.init_on_device and env.device.type == "cuda" and cfg.parallel.kind != ParallelKind.ep
        built = build_model(cfg.model, cfg.attention, tokenizer, env.device, init_on_device=on_device,
                            scalar_head=type(cfg.objective).scalar_head)
        # a checkpoint of another run is refused before any sharding or loading
        identity, resume = resume_decision(cfg, run_dir, env.world, data, built.model)
        extra = objective.prepare(built.model)  # e.g. a frozen reference: placed and sharded like the policy
        model = built.model.to(env.device)
        check_token_ids(data, model)
        compiled = compile_blocks(model, cfg.trainer.compile_dynamic) if cfg.trainer.compile else None
        parallel = parallelize(model, cfg.parallel, env)
        for module in extra:  # a frozen reference runs the policy's forward, so it compiles alike
            if cfg.trainer.compile:
                compile_blocks(module, cfg.trainer.compile_dynamic)
            parallelize(module.to(env.device), cfg.parallel, env)
        model.train()

        optimizer = build_optimizer(cfg.optimizer, [p for p in model.parameters() if p.requires_grad], env.device)
        scheduler = build_scheduler(cfg.optimizer, optimizer, cfg.trainer.max_steps)
        stepper = build_stepper(cfg.optimizer, optimizer, model, env.device)
        info = {**built.info, "parallel": parallel, "optimizer_impl": optimizer_impl(optimizer), "compile": compiled,
                "optimizer_step": stepper.info(), "cuda_alloc_conf": alloc_conf, **sizes,
                "compile_choice": {**compiling, **compile_choice(cfg, model, stepper.info().get("recompile_limit"),
                                                                  env.device.type)}}

        throughput = Throughput.build(model, env.device, measure=env.is_main)
        trainer = cls(cfg, run_dir, env, tokenizer, data, stream, model, info, optimizer, stepper, scheduler,
                      throughput, identity, stop=stop or StopSignals(), runtime=built.runtime, objective=objective)
        objective.bind(model, trainer.forward, resuming=bool(resume))
        info["loss"] = objective.describe()["loss"]
        trainer.evals = TrainingEval.build(cfg, env, tokenizer)
        hand_off(trainer, resume)  # the checkpoint loaded when resuming
        trainer.callbacks = for_run(trainer, wandb_config, group, resuming=bool(resume))  # history, tracker
        return trainer

    # ------------------------------------------------------------------------------------- loop

    @functools.cached_property
    def sdpa_kernels(self) -> Callable[[], contextlib.AbstractContextManager]:
        return sdpa_priority(self.cfg.attention, family_of(self.cfg.model))

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast_context(self.cfg.trainer.precision, self.env.device.type)()

    def fit(self) -> int:
        """Train to `trainer.max_steps`. Returns 0, or 143 after a coordinated stop (checkpoint
        written); raises NonFiniteHalt (exit 81, HALT.json) after too many non-finite steps in a row, or
        when the parameters hold nan/inf at a checkpoint or at the end (then nothing is written)."""
        cfg = self.cfg.trainer
        batches = iter(self.stream)
        self.t_start = time.perf_counter()
        self.callbacks.pre_train()  # the start block, then a bar or log lines of the objective's metrics
        with self.stop, contextlib.closing(self.callbacks):  # a signal only flags a stop; the boundary acts on it
            while self.state.step < cfg.max_steps:
                metrics, verdict = self.train_step(batches)
                self.callbacks.pre_log_metrics(metrics, verdict.stop)  # the in-training eval, into this row
                with record_function("align.log"):  # phases name the host's work in a profile (align.probes.gaps)
                    self.log(metrics)
                self.callbacks.post_step(self.state.step, verdict.stop)  # a halt, then a checkpoint
                if verdict.stop:
                    return self.finish(EXIT_SIGNAL)
        self.model_info.update(self.runtime.finish(self.run_dir, self.env.is_main))
        self.stepper.sync()
        check_parameters(self, "nothing was exported" if cfg.export else "the run cannot end as done")
        if cfg.export:
            export_model(self.model, self.tokenizer, self.run_dir / "export", self.env, self.cfg.model.lora.export)
        return self.finish(EXIT_OK)

    def forward(self, inputs: dict[str, Any], hidden_only: bool = False,
                module: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """The forward of the policy (or `module`, e.g. a frozen reference) under the run's autocast:
        logits, or (`hidden_only`, for a chunked loss that applies the head itself) the final hidden states."""
        module = self.model if module is None else module
        bypass = bypass_lm_head(module) if hidden_only else contextlib.nullcontext()
        with self.autocast(), bypass:
            return module(**inputs).logits

    def forward_backward(self, b: Batch, denom: float) -> torch.Tensor:
        """One micro-batch: the objective's forward and summed loss, / `denom`, backward. The probes
        time this. Router losses (MoE, when weighted) weigh by the micro-batch's share of the window."""
        self.runtime.before_forward(b.padding_mask)
        # The SDPA kernel choice spans backward too: activation checkpointing recomputes attention there.
        with self.sdpa_kernels():
            loss = self.objective.micro_loss(self.forward, b) / denom
            loss = inject_nan(loss, self.env.rank, self.state.step + 1)  # test-only hook
            (loss + self.runtime.aux_loss(scale=self.objective.weight(b) / denom)).backward()
        return loss.detach()

    def train_step(self, batches: Iterator[Batch]) -> tuple[dict[str, Any], Verdict]:
        t0 = time.perf_counter()
        with record_function("align.data"):
            window = self.objective.next_window(batches, self.cfg.trainer.grad_accum, self.env.device)
        # Every loss unit of the window (a target token for SFT) weighs the same on every rank: divide
        # by the GLOBAL count; grad_scale (the world size under FSDP) undoes FSDP2's mean over ranks.
        units, loss_tokens = sum(self.objective.weight(b) for b in window), sum(b.loss_tokens for b in window)
        if self.env.distributed:  # one process: no device round trip (it would stall the GPU every step)
            both = self.env.all_reduce_sum(torch.tensor([units, loss_tokens], device=self.env.device))
            units, loss_tokens = (int(x) for x in both.tolist())
        grad_scale = self.model_info["parallel"]["grad_scale"]
        denom = max(units, 1) / grad_scale
        loss_sum = torch.zeros((), device=self.env.device)
        with record_function("align.forward_backward"):
            for b in window:
                loss_sum += self.forward_backward(b, denom)

        with record_function("align.boundary"):
            # Statistics of the window start for the host now: read later, they would wait for the step.
            self.runtime.close_window()
            max_norm = self.cfg.optimizer.max_grad_norm
            grad_norm = clip_grad_norm_(self.model.parameters(), max_norm, self.optimizer, self.stepper.norms_of)
            # The one boundary collective: stop flags, non-finite flags and the logged sums, all ranks.
            v = agree(self.env, self.stop.requested, float(loss_sum / grad_scale), grad_norm,
                      sum(b.tokens for b in window), sum(b.real_tokens for b in window))
            # Step time runs from boundary to boundary (each waits for this step's loss and norm on the
            # device): it holds the previous step's optimizer kernels, which run after the host has moved
            # on. Timed from this step's start instead, a step whose optimizer is large reads fast.
            now = time.perf_counter()
            dt, self.t_boundary = now - (self.t_boundary or t0), now
            skip = v.skip_cause
            if skip is None:
                self.stepper.step()
            lr = float(self.scheduler.get_last_lr()[0])
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)

        s = self.state
        s.step += 1
        s.skips.record(skip)
        clipped = skip is None and max_norm > 0 and grad_norm > max_norm
        s.clipped_steps += int(clipped)
        s.tokens, s.real_tokens = s.tokens + v.tokens, s.real_tokens + v.real_tokens
        s.loss_tokens += loss_tokens
        with record_function("align.metrics"):
            return self.step_metrics(window, v, skip, grad_norm, clipped, lr, loss_tokens, dt), v

    def step_metrics(self, window: list[Batch], v: Verdict, skip: Optional[str], grad_norm: float, clipped: bool,
                     lr: float, loss_tokens: int, dt: float) -> dict[str, Any]:
        s = self.state
        return {
            "step": s.step,
            "loss": v.loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "clipped": clipped,
            "clip_fraction": s.clipped_steps / s.step,
            "skipped": skip is not None,
            "skip_cause": skip,
            "skipped_steps": s.skips.total,
            "tokens": v.tokens,
            "real_tokens": v.real_tokens,
            "loss_tokens": loss_tokens,
            "step_time_s": dt,
            "tokens_per_s": v.tokens / dt,
            "real_tokens_per_s": v.real_tokens / dt,
            "loss_tokens_per_s": loss_tokens / dt,
            "epoch": self.stream.position.epoch,
            "elapsed_s": time.perf_counter() - self.t_start,
            **memory_metrics(self.env.device),
            **self.throughput.step(window, dt),
            **self.runtime.on_step(s.step),
            **self.stream.stats.step(window),
            **self.objective.window_metrics(),
        }

    # ---------------------------------------------------------------------------------- endings

    def log(self, metrics: dict[str, Any]) -> None:
        """The step's row: history, tracker, progress (a probe that runs steps itself calls it too)."""
        self.callbacks.log_metrics(metrics)

    def finish(self, code: int) -> int:
        """However the run ends (0, 143, or 81 before NonFiniteHalt is raised): the callbacks' records."""
        self.callbacks.post_train(code)
        return code

    def summary(self) -> dict[str, Any]:
        s = self.state
        return {"steps": s.step, "tokens": s.tokens, "real_tokens": s.real_tokens, "loss_tokens": s.loss_tokens,
                "clipped_steps": s.clipped_steps, "skipped_steps": s.skips.total, **self.model_info,
                **self.throughput.summary(), **self.stream.stats.summary(),
                **(self.evals.summary(time.perf_counter() - self.t_start) if self.evals is not None else {})}


# ------------------------------------------------------------------------------------ build helpers


def apply_cuda_alloc_conf(conf: Optional[str]) -> Optional[str]:
    """Set PYTORCH_CUDA_ALLOC_CONF from `trainer.cuda_alloc_conf` unless the environment already sets
    it (the user's wins) or CUDA already started (a second job of an in-process sweep: too late, said
    so). Returns the value in force, for the manifest."""
    key = "PYTORCH_CUDA_ALLOC_CONF"
    if conf and key not in os.environ:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            log.warning("trainer.cuda_alloc_conf=%s not applied: CUDA already started in this process", conf)
        else:
            os.environ[key] = conf
    return os.environ.get(key)


def memory_metrics(device: torch.device) -> dict[str, Any]:
    """Peak allocated memory and cumulative cudaMalloc retries (each frees the allocator's cache and
    synchronises: a step-time spike with a rising count is fragmentation, not the model), from one
    read of the allocator's statistics."""
    if device.type != "cuda":
        return {"mem_peak_gib": None, "mem_alloc_retries": None}
    stats = torch.cuda.memory_stats(device)
    return {"mem_peak_gib": stats.get("allocated_bytes.all.peak", 0) / 2**30,
            "mem_alloc_retries": int(stats.get("num_alloc_retries", 0))}


def check_token_ids(data: EncodedDataset, model: torch.nn.Module) -> None:
    """A pre-tokenized source can hold ids the model has no embedding for: refuse before step 1
    (on CUDA an out-of-range id is a device-side assert, not an error message)."""
    top = int(data.tokens.max()) if len(data.tokens) else -1
    for what, vocab in token_id_tables(model).items():
        if top >= vocab:
            raise ConfigError("data", f"token id {top} is out of the model's vocabulary (size {vocab}, {what}); "
                              "set the model's vocabulary to match or use matching data")
