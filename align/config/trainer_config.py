"""Schemas of the optimizer, parallel, logger and trainer groups (the objective's: align/config/objective.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from align.config.rules import AUTO, _only, _read, _require, _switch, require_auto_resolved

SEED_LIMIT = 2**64
"""trainer.seed is below this: it seeds numpy's SeedSequence (non-negative integers) and torch.manual_seed
(at most 64 bits: a wider seed fails when the model is built)."""

# ------------------------------------------------------------------------------------- optimizer


class OptimizerName(StrEnum):
    adamw = "adamw"
    adamw8bit = "adamw8bit"


class Schedule(StrEnum):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"


@dataclass
class OptimizerConfig:
    name: OptimizerName = OptimizerName.adamw
    """adamw: torch.optim.AdamW (fused on CUDA). adamw8bit: 8-bit AdamW, bitsandbytes on plain
    tensors when installed (else torchao), torchao under parallel=fsdp/ep (bitsandbytes fails on
    DTensor parameters); the one that ran is recorded as `optimizer_impl`."""
    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay (>= 0)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam betas: two decay rates, each in [0, 1)."""
    eps: float = 1e-8
    """Adam epsilon (> 0: with 0, a parameter whose gradient stays zero divides 0 by 0)."""
    warmup_ratio: float = 0.05
    """Warm-up as a fraction of `trainer.max_steps`; converted to steps at the scheduler call site,
    so it survives a change of run length (docs/pitfalls.md#7)."""
    schedule: Schedule = Schedule.cosine
    """The learning rate after warm-up (which rises linearly from 0 to `lr`): cosine decays it to 0 at
    `trainer.max_steps`, linear decays it linearly to 0, constant holds it at `lr`. Each is transformers'
    schedule of the same name with warm-up, computed by align/optim/__init__.py."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; <= 0 disables clipping (the norm is still logged)."""
    compile: Any = AUTO
    """true, false or auto. auto: on where the device is CUDA with optimizer=adamw and parallel=single
    (the tested combinations), else off; the manifest's `compile.optimizer` says what it resolved to
    and why. true: torch.compile torch's own AdamW step (foreach, capturable; the learning rate is handed in as a
    device tensor so a schedule does not recompile, and the clip scale is applied inside the compiled
    step) instead of the fused kernel; its speed against fused AdamW is in docs/performance.md. The
    first step compiles. CUDA and optimizer=adamw only; on a CPU it resolves to off and the
    manifest's `optimizer_step` says why. A non-finite step is then skipped by the host. With
    `optimizer.overlap` each chunk steps through the compiled update (kind overlap+compiled; dynamo's
    recompile limit is raised to two graphs per chunk and recorded as `recompile_limit`)."""
    overlap: bool = False
    """Run each step's optimizer on a side CUDA stream, decoder block by block, while the next
    forward waits for a block's parameters only when it reaches that block (align.optim.step).
    Bit-identical to the plain step. parallel=single and eager blocks only; on a CPU it resolves
    to off, and the manifest's `optimizer_step` says why. Combines with `optimizer.compile`."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optimizer.lr", "must be > 0", self.lr)
        _require(0 <= self.warmup_ratio < 1, "optimizer.warmup_ratio", "must be in [0, 1)", self.warmup_ratio)
        _require(len(self.betas) == 2, "optimizer.betas", "must be a list of two floats", self.betas)
        # torch's AdamW checks these only when the optimizer is built, after the tokenizer, the encode and the model.
        _require(all(0 <= b < 1 for b in self.betas), "optimizer.betas", "each beta must be in [0, 1)", self.betas)
        _require(self.eps > 0, "optimizer.eps", "must be > 0", self.eps)
        self.compile = _switch("optimizer.compile", self.compile)
        _require(self.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", self.weight_decay)


# -------------------------------------------------------------------------------------- parallel


class ParallelKind(StrEnum):
    single = "single"
    fsdp = "fsdp"
    ep = "ep"


class ParamDtype(StrEnum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


@dataclass
class ParallelConfig:
    kind: ParallelKind = ParallelKind.single
    """single: one process, one device. fsdp: FSDP2 `fully_shard` per decoder block and at the root
    over every rank (launch with launchers/torchrun.sh). ep: experts sharded on dim 0 over an EP mesh
    dimension with tokens exchanged by all-to-all (transformers' expert parallel), dense parameters
    under FSDP2; MoE families only."""
    activation_checkpointing: bool = False
    """Recompute each decoder block in backward (transformers' activation checkpointing)."""
    activation_checkpointing_fraction: float = 1.0
    """With `activation_checkpointing`: the fraction f (0 < f <= 1) of the L decoder blocks to
    recompute; the others keep their activations (faster, more memory). k = max(1, floor(f*L + 0.5))
    blocks, spread evenly over depth: indices floor(i*L/k) for i < k (f=0.5, L=16: 0, 2, ..., 14).
    The manifest records the indices: model.extra.parallel.activation_checkpointing_blocks."""
    param_dtype: ParamDtype = ParamDtype.auto
    """Dtype FSDP2 gathers parameters in for compute (MixedPrecisionPolicy); gradients are always
    reduced in float32. auto: bfloat16 on CUDA, float32 on CPU."""
    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (re-gather in backward): less memory,
    one more all-gather per block."""
    ep_size: Optional[int] = None
    """Ranks that hold distinct experts (parallel=ep); null: all ranks. Must divide the world size
    and the number of experts; the remaining factor shards each expert with FSDP."""
    pg_timeout_s: int = 600
    """Process-group timeout: a collective that waits longer fails (with a flight-recorder dump on
    NCCL when `flight_recorder_entries` > 0) instead of hanging the job."""
    flight_recorder_entries: int = 2000
    """NCCL flight recorder ring size (TORCH_FR_BUFFER_SIZE); 0 disables it. On a collective
    timeout each rank dumps its recent collectives under <run_dir>/rank<r>/flight_recorder/."""

    def __post_init__(self) -> None:
        if self.ep_size is not None:
            _require(self.ep_size >= 1, "parallel.ep_size", "must be >= 1 or null", self.ep_size)
        _require(0 < self.activation_checkpointing_fraction <= 1, "parallel.activation_checkpointing_fraction",
                 "must be in (0, 1]: the fraction of decoder blocks to recompute",
                 self.activation_checkpointing_fraction)
        _require(self.activation_checkpointing or self.activation_checkpointing_fraction == 1,
                 "parallel.activation_checkpointing_fraction",
                 "has no effect unless parallel.activation_checkpointing=true; set both, or leave the fraction at 1.0",
                 self.activation_checkpointing_fraction)
        _require(self.pg_timeout_s >= 1, "parallel.pg_timeout_s", "must be >= 1", self.pg_timeout_s)
        _require(self.flight_recorder_entries >= 0, "parallel.flight_recorder_entries", "must be >= 0",
                 self.flight_recorder_entries)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        sharded = [ParallelKind.fsdp, ParallelKind.ep]
        return _read({"ep_size": _only(key, self.kind, [ParallelKind.ep]),
                      "param_dtype": _only(key, self.kind, sharded),
                      "reshard_after_forward": _only(key, self.kind, [ParallelKind.fsdp]),
                      "pg_timeout_s": _only(key, self.kind, sharded),
                      "flight_recorder_entries": _only(key, self.kind, sharded)})


# ---------------------------------------------------------------------------------------- logger


class LoggerKind(StrEnum):
    wandb = "wandb"
    tensorboard = "tensorboard"
    mlflow = "mlflow"
    none = "none"


class WandbMode(StrEnum):
    offline = "offline"
    online = "online"


DEFAULT_PROJECT = "align"
"""The W&B project (and MLflow experiment) when neither `logger.project` nor $WANDB_PROJECT names one."""


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.wandb
    """The tracker rank 0 logs each step's row to, beside history.jsonl: wandb (Weights & Biases),
    tensorboard (event files under `<run_dir>/tensorboard`, needs `pip install align[tensorboard]`),
    mlflow (a local file store under `<run_dir>/mlruns`, needs `pip install align[mlflow]`). none:
    history.jsonl only."""
    mode: Optional[WandbMode] = None
    """offline writes the run under the run dir with no network; online syncs. null: $WANDB_MODE where
    set (online or offline), else offline. The manifest's `logger.sources` says which it came from."""
    project: Optional[str] = None
    """W&B project; null: $WANDB_PROJECT where set, else DEFAULT_PROJECT. Under logger=mlflow the
    experiment's name (null: DEFAULT_PROJECT)."""
    entity: Optional[str] = None
    """W&B entity (team or user); null: $WANDB_ENTITY where set, else the logged-in user's default."""
    tags: list[str] = field(default_factory=list)
    """W&B tags."""
    log_model: bool = False
    """Log the exported model (`<run_dir>/export`, needs trainer.export=true) as a W&B model artifact
    `run-<id>-model` (aliases latest, step-<n>) when the run completes. Off: exports stay local."""

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        rules = {f: _only(key, self.kind, [LoggerKind.wandb]) for f in ("mode", "entity", "tags")}
        return _read({**rules, "project": _only(key, self.kind, [LoggerKind.wandb, LoggerKind.mlflow])})


# --------------------------------------------------------------------------------------- trainer


class Precision(StrEnum):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class ResumePolicy(StrEnum):
    auto = "auto"
    never = "never"
    must = "must"


DEFAULT_MAX_STEPS = 150
"""The run's length when neither trainer.max_steps nor trainer.epochs is set."""


@dataclass
class TrainerConfig:
    max_steps: Optional[int] = None
    """Optimizer steps to run; null: `trainer.epochs` decides, or without it DEFAULT_MAX_STEPS. Exactly one
    of the two may be set (an experiment's max_steps with trainer.epochs needs trainer.max_steps=null)."""
    epochs: Optional[int] = None
    """Passes over the data instead of `max_steps` (objective=sft and dpo): the run's optimizer steps are
    the micro-batches the sampler plans for these epochs (align.plan.run_length) over `grad_accum`, the
    last incomplete window left out. The manifest's `run_length` records the steps and which key decided."""
    grad_accum: int = 1
    """Micro-batches per optimizer step. The loss is averaged per loss token over the whole window."""
    seed: int = 0
    """Seed for model init, sampling and dropout: 0 to 2**64 - 1 (numpy's SeedSequence takes no negative
    integer, torch.manual_seed none wider than 64 bits)."""
    deterministic: bool = False
    """`torch.use_deterministic_algorithms(True)` (slower; needed for bit-exact reruns on GPU)."""
    precision: Precision = Precision.auto
    """auto: bf16 autocast on CUDA, fp32 on CPU."""
    device: Device = Device.auto
    """auto: CUDA when available, else CPU."""
    cuda_alloc_conf: Optional[str] = None
    """PYTORCH_CUDA_ALLOC_CONF for this run when the environment sets none, e.g.
    `expandable_segments:True` (ragged shapes fragment fixed segments; each allocator retry frees the
    cache and synchronises). Applied before CUDA starts; the value in force is recorded. null: as is."""
    log_every: int = 10
    """Console log line every N optimizer steps when stderr is not a TTY (history gets every step)."""
    export: bool = True
    """Write the trained model in HF layout (safetensors, config, tokenizer) to `export/` at the end;
    a LoRA run writes what `model.lora.export` names (merged, the peft adapter in `export/adapter/`, both)."""
    save_every: int = 0
    """Write a checkpoint (torch.distributed.checkpoint) every N optimizer steps; 0: only at a
    coordinated stop. A checkpoint counts only when complete (see docs/distributed.md)."""
    keep_last: int = 2
    """Complete checkpoints kept on disk (older ones are deleted, including those a previous attempt
    of this run left); 0 keeps all."""
    resume: ResumePolicy = ResumePolicy.auto
    """auto: resume from the newest complete checkpoint under <run_dir>/checkpoints when there is
    one. never: start fresh (existing checkpoints are left alone). must: refuse to start without one."""
    resume_from: Optional[str] = None
    """An explicit checkpoint directory to resume from (overrides the automatic pick)."""
    resume_despite_mismatch: bool = False
    """Resume even though world size, dataset fingerprint, sampler or model shape differ from the
    checkpoint's (refused by default, with the reason)."""
    compile: Any = AUTO
    """true, false or auto. auto: on where the device is CUDA and the configuration is one the tests
    cover (mistral, olmoe or gemma4_moe, sdpa or layered attention, parallel single or fsdp, no
    optimizer.overlap, under grpo only beside a generation copy), else off; the manifest's
    `compile.trainer` says what it resolved to and why. true:
    torch.compile each decoder block (inductor fuses the elementwise kernels around the GEMMs; what
    it was worth per model is in docs/performance.md). The first steps compile; inductor's disk cache
    shortens later runs. Recompiles, graph breaks and recompile-limit hits are in the manifest's
    dynamo counters."""
    compile_dynamic: Optional[bool] = True
    """torch.compile's `dynamic` for the blocks under trainer.compile. true: one graph with symbolic
    batch and sequence sizes from the first call (a one-row batch adds one more; docs/performance.md
    compares it with a graph compiled for one fixed shape). null: a block compiles for the first
    shape and turns dynamic at its first recompile. false: a graph per shape (bound the shapes with
    sampler.pad_to_multiple_of). Past dynamo's recompile limit (8) a block runs eager, which only the
    manifest's dynamo counters show (docs/pitfalls.md#8)."""
    compile_memory_budget: Any = AUTO
    """Under trainer.compile: the share (0 to 1) of a compiled block's saved activations, between what
    full activation checkpointing of the block would keep (0: its inputs) and what inductor's
    partitioner keeps by default (1), that the partitioner may keep; below 1 it recomputes the ops
    cheapest per byte (by its FLOP estimate) in backward instead of saving them
    (`torch._functorch.config.activation_memory_budget`, set for the run). A finer trade than
    parallel.activation_checkpointing, which recomputes whole blocks. null: torch's default. auto
    (align/plan/budget_auto.py): null, unless compiled blocks on CUDA cannot hold the longest record
    within the memory headroom; then the largest share in tenths that can. The memory estimate counts
    it; the manifest's `memory_budget` says what auto resolved to, `compile.memory_budget` what torch
    was set to."""
    compile_artifacts: Optional[str] = None
    """A file of torch.compiler's portable cache artifacts (align/parallel/compile_artifacts.py): where
    anything compiles, loaded before the first compile when it exists and written (rank 0, atomically)
    when the run ends. For machines that start with an empty disk each job: carry the file in and out
    and the next run skips the compiles it holds. null: off (the on-disk inductor cache still serves
    runs on the same machine). The manifest's `compile.artifacts` says what was loaded and saved."""
    loss_chunk_tokens: Any = AUTO
    """> 0: the LM head and cross-entropy over this many target tokens at a time, each chunk's
    gradients taken in its forward (align/objectives/ce.py), so logits memory stays bounded for large
    vocabularies; 0: all logits at once. auto: resolved where the device is known
    (align/plan/chunk_auto.py): 0 on a CPU; on CUDA 2048 where the full logits of a token
    would weigh at least half of what the decoder layers keep for it (large vocabularies: Gemma-4),
    else 0. The manifest's `loss_chunk` says what it resolved to and why."""
    compile_loss: Any = AUTO
    """true, false or auto. true: under a chunked loss (`loss_chunk_tokens` > 0, objective=sft) each
    chunk's elementwise passes (upcast, soft-cap, log-sum-exp, softmax, one-hot, the soft-cap's
    derivative, the cast back) run as one torch.compile'd function instead of about ten eager kernels
    over [chunk, vocab] fp32 (align/objectives/ce.py `chunk_terms`); the head's GEMMs stay eager. auto:
    as `trainer.compile` resolves. The manifest's `compile.loss` says what it resolved to and why; what
    it was worth is in docs/performance.md."""
    eval_every: int = 0
    """Run the `eval` group's eval on the model being trained every N optimizer steps and at the last
    step (docs/evaluation.md); 0: never. > 0 needs an eval (`eval=gsm8k`)."""
    max_consecutive_skipped_steps: int = 3
    """Optimizer steps with a non-finite loss or gradient norm (on any rank) are skipped on all
    ranks; more than this many in a row halt the run (exit 81, HALT.json)."""

    def __post_init__(self) -> None:
        if self.epochs is not None:
            _require(self.max_steps is None, "trainer.epochs", "cannot be set with trainer.max_steps (exactly one "
                     "decides the run's length): give trainer.max_steps=null with trainer.epochs", self.epochs)
            _require(self.epochs >= 1, "trainer.epochs", "must be >= 1 (null: trainer.max_steps decides)", self.epochs)
        elif self.max_steps is None:
            self.max_steps = DEFAULT_MAX_STEPS
        _require(self.max_steps is None or self.max_steps >= 1, "trainer.max_steps", "must be >= 1", self.max_steps)
        self.compile = _switch("trainer.compile", self.compile)
        self.compile_loss = _switch("trainer.compile_loss", self.compile_loss)
        _require(self.save_every >= 0, "trainer.save_every", "must be >= 0", self.save_every)
        _require(self.eval_every >= 0, "trainer.eval_every", "must be >= 0 (0: never)", self.eval_every)
        _require(self.keep_last >= 0, "trainer.keep_last", "must be >= 0", self.keep_last)
        _require(self.max_consecutive_skipped_steps >= 0, "trainer.max_consecutive_skipped_steps", "must be >= 0",
                 self.max_consecutive_skipped_steps)
        _require(self.grad_accum >= 1, "trainer.grad_accum", "must be >= 1", self.grad_accum)
        _require(0 <= self.seed < SEED_LIMIT, "trainer.seed", "must be from 0 to 2**64 - 1", self.seed)
        _require(self.log_every >= 1, "trainer.log_every", "must be >= 1", self.log_every)
        _require(self.loss_chunk_tokens == AUTO or (isinstance(self.loss_chunk_tokens, int)
                 and not isinstance(self.loss_chunk_tokens, bool) and self.loss_chunk_tokens >= 0),
                 "trainer.loss_chunk_tokens", "must be an int >= 0 or auto", self.loss_chunk_tokens)
        b = self.compile_memory_budget
        _require(b is None or b == AUTO or (isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b <= 1),
                 "trainer.compile_memory_budget", "must be null, auto or a number from 0 to 1", b)

    def ignored(self, key: str) -> dict[str, str]:
        """Fields this choice does not read, with why (see `check_ignored`)."""
        read = self.compile is not False
        why = f"ignored unless {key}.compile=true or auto"
        return {} if read else {"compile_dynamic": why, "compile_memory_budget": why}


def require_chunk_resolved(value: Any, where: str) -> None:
    """An unresolved `trainer.loss_chunk_tokens=auto` must not reach a loss or an estimate, which read a number."""
    require_auto_resolved("trainer.loss_chunk_tokens", value, where, "align.plan.chunk_auto.plan_loss_chunk")


def require_memory_budget_resolved(value: Any, where: str) -> None:
    """An unresolved `trainer.compile_memory_budget=auto` must not reach the compile or an estimate."""
    require_auto_resolved("trainer.compile_memory_budget", value, where, "align.plan.budget_auto.plan_memory_budget")
