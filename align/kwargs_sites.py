"""The kwargs call sites preflight checks by name (playbook 4.2), one function per library call.

Each function builds the kwargs with the SAME builder the call site uses, and names the installed
callable it goes to; it returns None when this config does not make that call. Values are
placeholders only where the real value needs heavy work (the tokenizer's vocab size): the names are
what is checked. Listed in `align.preflight.KWARGS_SITES`.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

from align.config import LoggerKind, TrainConfig
from align.preflight import KwargsSite


class TokenizerShape:
    """Stands in for the tokenizer where only the NAMES of the kwargs built from it matter."""

    pad_token_id = bos_token_id = eos_token_id = 0

    def __len__(self) -> int:
        return 0


def _device(cfg: TrainConfig):
    from align.parallel.env import resolve_device

    return resolve_device(cfg.trainer.device)


def wandb_init(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.logger.kind != LoggerKind.wandb:
        return None
    from align.telemetry.wandb_logger import wandb_init_kwargs

    return KwargsSite("wandb:init", wandb_init_kwargs(cfg.logger, Path("."), "preflight", None, {}), "logger")


def data_loader(cfg: TrainConfig) -> KwargsSite:
    from align.data.loader import BatchStream, loader_kwargs

    # Mirrors Trainer.build: BatchStream's worker count and pin_memory on CUDA.
    workers = inspect.signature(BatchStream).parameters["num_workers"].default
    return KwargsSite("torch.utils.data:DataLoader", loader_kwargs(workers, _device(cfg).type == "cuda"), "data")


def optimizer(cfg: TrainConfig) -> KwargsSite:
    from align.optim import optimizer_class, optimizer_kwargs

    return KwargsSite(optimizer_class(cfg.optimizer), optimizer_kwargs(cfg.optimizer, _device(cfg)), "optimizer")


def scheduler(cfg: TrainConfig) -> KwargsSite:
    from align.optim import scheduler_factory, scheduler_kwargs

    return KwargsSite(scheduler_factory(), scheduler_kwargs(cfg.optimizer, cfg.trainer.max_steps), "optimizer")


def model_config(cfg: TrainConfig) -> Optional[KwargsSite]:
    if cfg.model.pretrained:
        return None  # the checkpoint's config.json is loaded, not built from kwargs
    from align.models.build import config_kwargs
    from align.models.registry import FAMILIES

    config_cls, _ = FAMILIES[cfg.model.family].classes()
    # A config class's own __post_init__ may consume names its signature lacks (Gemma4TextConfig:
    # global_head_dim, num_global_key_value_heads): the names its installed source reads count too.
    post = (config_cls.__post_init__,) if "__post_init__" in vars(config_cls) else ()
    return KwargsSite(config_cls, config_kwargs(cfg.model, TokenizerShape()), "model.overrides", also=post)


def model_load(cfg: TrainConfig) -> KwargsSite:
    from align.models.build import load_kwargs
    from align.models.registry import FAMILIES

    config_cls, model_cls = FAMILIES[cfg.model.family].classes()
    kw = load_kwargs(cfg.model, cfg.attention)
    if cfg.model.pretrained:
        # from_pretrained hands leftover kwargs to the config class: its names count too.
        return KwargsSite(model_cls.from_pretrained, {**kw, "local_files_only": True}, "model", also=(config_cls,))
    return KwargsSite(model_cls._from_config, kw, "model", also=(model_cls,))


def activation_checkpointing(cfg: TrainConfig) -> Optional[KwargsSite]:
    if not cfg.parallel.activation_checkpointing:
        return None
    from align.models.registry import FAMILIES
    from align.parallel.wrap import activation_checkpointing_call

    _, model_cls = FAMILIES[cfg.model.family].classes()
    method, kwargs = activation_checkpointing_call(model_cls)  # the call parallelize() makes
    return KwargsSite(getattr(model_cls, method), kwargs, "parallel.activation_checkpointing")
