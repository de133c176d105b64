"""Typed configuration of `python -m align.eval`: the `eval` group (what is evaluated and how it is
scored) and the root (which model, on which device, logged where), registered as `eval_schema`.

`conf/eval.yaml` composes onto the root; every value is type-checked when Hydra composes and the
`__post_init__` checks run in `to_typed`, so a bad value is one line and exit 2 before any model load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from align.config import Device, LoggerConfig, LoggerKind
from align.config.eval_config import EvalConfig, EvalTask  # noqa: F401  (their home; imported from here too)
from align.config.rules import _require
from align.generation.engine import EngineConfig


@dataclass
class EvalRunConfig:
    """The root of `conf/eval.yaml`."""

    model_dir: Optional[str] = None
    """The model: an export dir (HF layout: config.json, *.safetensors, tokenizer) or a checkpoint dir
    (<run>/checkpoints/step_N, rebuilt from that run's .hydra/config.yaml). Not read by an oracle run."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """What is evaluated (the `eval` group)."""
    generation: EngineConfig = field(default_factory=EngineConfig)
    """The generation engine (align/generation: backend, cache/compile mode, batch size)."""
    device: Device = Device.auto
    """auto: CUDA when available, else CPU."""
    dtype: Optional[str] = None
    """Parameter dtype the model generates in; null: bfloat16 on CUDA, float32 on CPU."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(kind=LoggerKind.none))
    """W&B (`logger=wandb`: the summary and the report table) or none."""
    allow_dirty: bool = False
    """Start even when the git tree has uncommitted changes (eval.json then says dirty)."""
    name: Optional[str] = None
    """Run name for W&B and eval.json; null: the run dir's name."""

    def __post_init__(self) -> None:
        _require(self.dtype in (None, "float32", "bfloat16", "float16"), "dtype",
                 "must be one of: float32, bfloat16, float16 (or null)", self.dtype)
        _require(self.logger.kind in (LoggerKind.wandb, LoggerKind.none), "logger", "align.eval logs its summary and "
                 "report to W&B only: logger=wandb or logger=none", self.logger.kind.value)
        if not self.eval.oracle:
            _require(bool(self.model_dir), "model_dir", "is required: an export dir (config.json, *.safetensors, "
                     "tokenizer) or a checkpoint dir (<run>/checkpoints/step_N); or eval.oracle=true")


# Groups of conf/eval.yaml with a schema of their own (a bad key lists their accepted keys).
GROUP_SCHEMAS: dict[str, type] = {"eval": EvalConfig, "generation": EngineConfig, "logger": LoggerConfig}


def register() -> None:
    ConfigStore.instance().store(name="eval_schema", node=EvalRunConfig)


def to_typed(cfg: DictConfig) -> EvalRunConfig:
    """The seam from the composed config to objects; value errors surface as `ConfigError`."""
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, EvalRunConfig), type(obj)
    return obj


register()
