"""The root schema a run composes onto, and the one table group -> schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore

from align.config.data import DataConfig, SamplerConfig, SamplerKind, Truncation
from align.config.eval_config import EvalConfig
from align.config.model import AttentionConfig, ModelConfig
from align.config.objective import (
    OBJECTIVE_SCHEMAS,
    GenerationDtype,
    ObjectiveConfig,
    RewardConfig,
)
from align.config.probe_config import ProbeConfig
from align.config.rules import AUTO, _require
from align.config.trainer_config import (
    LoggerConfig,
    LoggerKind,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    ParallelKind,
    TrainerConfig,
)
from align.errors import ConfigError
from align.generation.engine import EngineConfig

# ------------------------------------------------------------------------------------------ root


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    allow_dirty: bool = False
    """Start even when the git tree has uncommitted changes (the manifest then says dirty)."""
    name: Optional[str] = None
    """Run name for W&B and the manifest; null: the run dir's name."""
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    """Probe options, composed only by `conf/probe.yaml` (`python -m align.tools.probe probe=<name>`)."""
    eval: Optional[EvalConfig] = None
    """The in-training eval: `eval=gsm8k` composes the same conf/eval/<name>.yaml as `python -m align.eval`,
    run on the model being trained every `trainer.eval_every` steps (docs/evaluation.md); null: none."""
    eval_generation: EngineConfig = field(default_factory=EngineConfig)
    """The generation engine of the in-training eval (align/generation: backend, mode, batch size). Its
    `lockstep` is the trainer's to set: on whenever the run has several ranks (sharded weights)."""

    def __post_init__(self) -> None:
        if type(self.objective) is ObjectiveConfig:  # built without an option (TrainConfig()): only `kind` is set
            self.objective = OBJECTIVE_SCHEMAS[self.objective.kind]()
        if self.optimizer.overlap:  # FSDP2 runs its own streams; a compiled block would trace the waits
            _require(
                self.parallel.kind == ParallelKind.single,
                "optimizer.overlap",
                f"needs parallel=single (got parallel={self.parallel.kind.value})",
                True,
            )
            # auto resolves off beside overlap (align.parallel.compile): only an explicit true is refused
            _require(self.trainer.compile is not True, "optimizer.overlap", "needs trainer.compile=false", True)
        if self.logger.log_model:
            _require(
                self.logger.kind == LoggerKind.wandb and self.trainer.export,
                "logger.log_model",
                "needs logger=wandb and trainer.export=true (the artifact is the export)",
                True,
            )
        if self.optimizer.compile is True:  # auto resolves off with another optimizer
            _require(
                self.optimizer.name == OptimizerName.adamw,
                "optimizer.compile",
                f"needs optimizer=adamw (got {self.optimizer.name.value})",
                True,
            )
        pairs = type(self.objective).reads_pairs
        readers = " or ".join(f"objective={k}" for k, c in OBJECTIVE_SCHEMAS.items() if c.reads_pairs)
        _require(
            self.data.holds_pairs == pairs,
            "data",
            f"objective={self.objective.kind} trains on "
            + (
                "preference pairs: use data=gsm8k_pairs or data=preference"
                if pairs
                else f"records, not preference pairs: use {readers} with this data"
            ),
            self.data.source.value,
        )

        kind = self.objective.kind
        if type(self.objective).samples_prompts:
            _require(self.trainer.epochs is None, "trainer.epochs", f"is for objective=sft and dpo; objective={kind} "
                     "steps through prompts as rollouts ask: set trainer.max_steps", self.trainer.epochs)
        if type(self.objective).reads_reward:
            self._check_grpo()
        else:
            scorers = " or ".join(f"objective={k}" for k, c in OBJECTIVE_SCHEMAS.items() if c.reads_reward)
            _require(self.reward.function is None, "reward.function", f"is read by {scorers} only; "
                     f"objective={kind} ignores it", self.reward.function)
            _require(not self.reward.functions, "reward.functions", f"is read by {scorers} only; "
                     f"objective={kind} ignores it", dict(self.reward.functions))
            _require(self.reward.path is None, "reward.path", f"is read by {scorers} only; "
                     f"objective={kind} ignores it", self.reward.path)
            _require(
                not self.reward.weights,
                "reward.weights",
                f"is read by {scorers} only; objective={kind} ignores it "
                "(leave the reward group at none)",
                dict(self.reward.weights),
            )
        if type(self.objective).samples_prompts:
            self._check_rollouts()

        self._check_eval()

    def _check_eval(self) -> None:
        every = self.trainer.eval_every
        _require(every == 0 or self.eval is not None, "trainer.eval_every",
                 "needs an eval to run: add eval=gsm8k (or another conf/eval option), or leave eval_every at 0", every)
        # An unread group, like an unread key (`ignored`), is refused; here so the line names the option,
        # not the whole group's value.
        _require(self.eval is None or every > 0, "eval", "is read only when trainer.eval_every > 0 (an eval "
                 "every N steps): set trainer.eval_every, or drop the eval group",
                 f"eval.task={self.eval.task.value}" if self.eval is not None else None)

    def _check_grpo(self) -> None:
        _require(
            bool(self.reward.weights),
            "reward.weights",
            "objective=grpo needs a reward: e.g. reward=exact_int or reward=gsm8k (docs/rewards.md)",
        )
        from align.rewards.combine import check_weights

        # Unknown names, bad weights, a function without a weight or a weight without its function: one line,
        # exit 2. The functions themselves are imported by preflight (align/run/preflight_checks.py), not at every
        # conversion.
        functions = check_weights(self.reward.weights, function=self.reward.function, functions=self.reward.functions,
                                  model=self.reward.path)
        from align.objectives.advantages import no_signal
        from align.rewards.combine import constant_reward

        # Compositions whose every advantage is 0 by construction (the rules live beside the estimators).
        why = no_signal(self.objective.advantage, self.objective.group_size,
                        constant_reward(self.reward.weights, functions), self.reward.weights)
        if why is not None:
            raise ConfigError(*why)

    def _check_rollouts(self) -> None:
        kind = self.objective.kind
        _require(
            self.data.truncation != Truncation.truncate,
            "data.truncation",
            f"objective={kind} refuses to cut prompts (a cut question has another answer): use drop or fail",
            self.data.truncation.value,
        )
        _require(
            self.data.max_seq_len > self.objective.max_new_tokens,
            "data.max_seq_len",
            f"must exceed objective.max_new_tokens ({self.objective.max_new_tokens}): a prompt gets "
            "max_seq_len - max_new_tokens tokens",
            self.data.max_seq_len,
        )
        _require(
            self.objective.generation_dtype in (GenerationDtype.same, GenerationDtype.auto)
            or self.parallel.kind == ParallelKind.single,
            "objective.generation_dtype",
            f"a generation copy needs parallel=single (got parallel="
            f"{self.parallel.kind.value}): sharded weights generate in place (auto resolves to same there)",
            self.objective.generation_dtype.value,
        )
        budget = self.sampler.kind == SamplerKind.budget
        _require(
            self.sampler.kind == SamplerKind.shuffle or budget,
            "sampler.kind",
            f"objective={kind} cuts each step's completions itself: sampler=shuffle (trainer.grad_accum "
            "micro-batches) or sampler=budget (micro-batches within sampler.max_tokens)",
            self.sampler.kind.value,
        )
        if budget and self.sampler.max_tokens != AUTO:  # auto resolves to at least the longest record
            longest = -(-self.data.max_seq_len // self.sampler.pad_to_multiple_of) * self.sampler.pad_to_multiple_of
            _require(
                self.sampler.max_tokens >= longest,
                "sampler.max_tokens",
                f"must hold the longest prompt + completion under objective={kind}: data.max_seq_len "
                f"({longest} tokens after padding to a multiple of {self.sampler.pad_to_multiple_of})",
                self.sampler.max_tokens,
            )
        need = (1 if budget else self.trainer.grad_accum) * self.objective.updates_per_rollout
        sequences = self.objective.prompts_per_rollout * self.objective.group_size
        _require(
            sequences >= need,
            "objective.prompts_per_rollout",
            f"a rollout of prompts_per_rollout x group_size completions must fill updates_per_rollout x "
            f"trainer.grad_accum = {need} micro-batches",
            self.objective.prompts_per_rollout,
        )

    def ignored(self, key: str) -> dict[str, str]:
        """Fields of several groups whose reader depends on another group (see `check_ignored`)."""
        out = {}
        if self.sampler.kind == SamplerKind.budget and self.probe.name is None:
            out["sampler.micro_batch_size"] = (
                "ignored by sampler=budget (rows per micro-batch follow "
                "sampler.max_tokens); it is read by sampler=shuffle, sampler=bucket"
            )
        rollouts, kind = type(self.objective).samples_prompts, self.objective.kind
        if rollouts and self.probe.name is None:
            out["sampler.micro_batch_size"] = (
                f"ignored by objective={kind} (a step's completions are cut into trainer.grad_accum micro-batches, "
                "or by sampler.max_tokens under sampler=budget; objective.prompts_per_rollout prompts per rollout)"
            )
        if self.sampler.kind == SamplerKind.budget and rollouts:
            why = f"ignored by objective={kind} with sampler=budget"
            out["trainer.grad_accum"] = (f"{why} (micro-batches per step follow sampler.max_tokens); "
                                         "it is read by sampler=shuffle")
            out["sampler.bucket_size"] = f"{why} (a step's completions are sorted by length as one bucket)"
        if self.parallel.kind == ParallelKind.ep and not self.model.pretrained:
            out["model.init_on_device"] = "ignored by parallel=ep; it is read by parallel=single, parallel=fsdp"
        return {**out, **self._eval_ignored()}

    def _eval_ignored(self) -> dict[str, str]:
        if self.eval is None or self.trainer.eval_every == 0:
            return {"eval_generation": "is read only by the in-training eval (eval=gsm8k trainer.eval_every=N)"}
        job = "belongs to `python -m align.eval`: the in-training eval scores the weights being trained"
        return {"eval.oracle": f"{job}, not references", "eval.oracle_shuffle": f"{job}, not references",
                "eval.compare_to": f"{job}, no second model", "eval.cache": f"{job}, which change every call",
                "eval.cache_dir": f"{job}, which change every call (nothing is cached)",
                "eval_generation.lockstep": "is set by the trainer: on when the run has several ranks"}


# The one table: config group -> schema. conf/<group>/*.yaml files are validated against these.
GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "sampler": SamplerConfig,
    "attention": AttentionConfig,
    "optimizer": OptimizerConfig,
    "parallel": ParallelConfig,
    "logger": LoggerConfig,
    "trainer": TrainerConfig,
    "objective": ObjectiveConfig,
    "reward": RewardConfig,
    "probe": ProbeConfig,
    "eval": EvalConfig,
}


OPTION_SCHEMAS: dict[str, dict[str, type]] = {"objective": OBJECTIVE_SCHEMAS}
"""Groups whose options each have a schema of their own (a subclass of the group's): option -> schema. The
option's yaml names it first in its defaults list, `- /schema/<group>/<option>@_here_` (`@<group>` from
a `# @package _global_` file), so Hydra composes and types the option's keys against it; an option is
named after the value of its schema's `kind`."""


def schema_defaults(values: dict) -> list[str]:
    """The defaults list that types a resolved config again (a run's replayable .hydra/config.yaml):
    the root schema, then the schema of each group's option, named by its `kind`."""
    out = ["train_schema"]
    for group, options in OPTION_SCHEMAS.items():
        kind = (values.get(group) or {}).get("kind")
        if kind in options:
            out.append(f"/schema/{group}/{kind}@{group}")
    return [*out, "_self_"]


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for group, options in OPTION_SCHEMAS.items():
        for option, schema in options.items():
            cs.store(group=f"schema/{group}", name=option, node=schema)
