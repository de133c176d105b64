"""Checks over every schema at once, before and after the dataclasses are built (see align/config/__init__.py)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from align.config.root import GROUP_SCHEMAS, OPTION_SCHEMAS, TrainConfig
from align.config.rules import _plain
from align.errors import ConfigError


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _unwrap(tp: Any) -> Any:
    """Optional[X] -> X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp


@functools.cache
def schema_fields(cls: type) -> dict[str, Any]:
    """A schema's fields and their types, in declaration order (Optional unwrapped)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _unwrap(hints[f.name]) for f in dataclasses.fields(cls)}


def _mapped_schema(tp: Any) -> Optional[type]:
    """The schema of the values of a `dict[str, Schema]` field; None for any other type (an open
    mapping such as `model.overrides` takes any key)."""
    if typing.get_origin(tp) is dict:
        value = _unwrap(typing.get_args(tp)[1])
        return value if dataclasses.is_dataclass(value) else None
    return None


FOREIGN_KEYS: dict[str, str] = {
    "learning_rate": "optimizer.lr",
    "per_device_train_batch_size": "sampler.micro_batch_size (rows per micro-batch, sampler=shuffle or bucket; "
                                   "the default sampler=budget sizes micro-batches by sampler.max_tokens)",
    "gradient_accumulation_steps": "trainer.grad_accum",
    "num_train_epochs": "trainer.epochs",
    "max_steps": "trainer.max_steps",
    "output_dir": "hydra.run.dir",
    "save_steps": "trainer.save_every",
    "max_length": "data.max_seq_len",
    "loss_type": "objective.loss (objective=dpo)",
    "warmup_ratio": "optimizer.warmup_ratio",
    "lr_scheduler_type": "optimizer.schedule",
    "logging_steps": "trainer.log_every",
    "seed": "trainer.seed",
    "beta": "objective.beta (objective=dpo)",
}
"""Names users bring from transformers' TrainingArguments and TRL's trainer configs, and align's key
for each: an unknown key that is one of them is answered with align's, wherever it was put."""


def _composed(node: Any, declared: type) -> type:
    """The schema a composed node was typed with: an option's own (a subclass of the group's, e.g.
    DPOConfig under `objective`), else the declared one."""
    tp = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) and issubclass(tp, declared) else declared


def _option_hint(cls: type, name: str) -> tuple[Optional[str], str]:
    """For a schema of a group whose options have schemas of their own (OPTION_SCHEMAS): the option it
    is (`objective=sft`) and which other options read `name`; (None, "") for any other schema."""
    for group, options in OPTION_SCHEMAS.items():
        readers = [f"{group}={o}" for o, c in options.items() if c is not cls and name in schema_fields(c)]
        mine = next((o for o, c in options.items() if c is cls), None)
        if mine is not None:
            return f"{group}={mine}", f" (a key of {', '.join(readers)})" if readers else ""
        if cls is GROUP_SCHEMAS[group]:  # an option of the user's own that names no schema
            example = next(iter(options))
            return None, (f" (this {group} option composes no schema: its defaults list names one first, e.g. "
                          f"- /schema/{group}/{example}@_here_)")
    return None, ""


def unknown_key(dotted: str, root: Optional[type] = None, node_type: Optional[type] = None) -> Optional[ConfigError]:
    """The error for a dotted key no schema declares, naming the schema it falls in, its keys and
    the closest one (for a transformers/TRL name, align's key for it; for a key of another option's
    schema, that option); None when the key is declared or lies inside an open mapping. `node_type`:
    the schema the key's parent node was composed with, where it is an option's own (`_composed`)."""
    parts, cls, i = dotted.split("."), root or TrainConfig, 0
    while i < len(parts):
        fields_ = schema_fields(cls)
        if parts[i] not in fields_:
            parent, bad = ".".join(parts[:i]), ".".join(parts[:i + 1])
            option, other = _option_hint(cls, parts[i])
            close = difflib.get_close_matches(parts[i], list(fields_), n=1)
            mean = f" (did you mean {_join(parent, close[0])}?)" if close else ""
            if parts[i] in FOREIGN_KEYS and (root or TrainConfig) is TrainConfig:
                mean = f" (transformers/TRL's {parts[i]}: align's key is {FOREIGN_KEYS[parts[i]]})"
            where = option or parent
            return ConfigError(bad, f"unknown key{' in ' + where if where else ''}{other or mean}; accepted keys: "
                                    f"{', '.join(fields_)}")
        tp, i = fields_[parts[i]], i + 1
        if dataclasses.is_dataclass(tp):
            cls = node_type if node_type is not None and issubclass(node_type, tp) else tp
        elif _mapped_schema(tp) is not None and i < len(parts):
            cls, i = _mapped_schema(tp), i + 1  # parts[i] names an entry of the mapping
        else:
            return None
    return None


def _check_finite(value: Any, key: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, "must be a finite number", value)
    if isinstance(value, (ListConfig, list)):
        for v in value:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(key, "every element must be a finite number", list(value))
            _check_finite(v, key)
    elif isinstance(value, (DictConfig, dict)):
        for k in value:
            _check_finite(value[k], _join(key, str(k)))


def check_composed(node: DictConfig, cls: Optional[type] = None, key: str = "") -> None:
    """Refuse what omegaconf lets through: a key the schema does not declare (`+group.key=value`
    adds one to a typed node, and `to_object` would drop it), and a non-finite float in any field
    (`lr=inf` passes `lr > 0`; `max_grad_norm=nan` fails `> 0` and turns clipping off)."""
    cls = cls or TrainConfig
    fields_ = schema_fields(cls)
    for name in node.keys():
        k = _join(key, str(name))
        if name not in fields_:
            raise unknown_key(k, node_type=cls) or ConfigError(k, "unknown key")
        if OmegaConf.is_missing(node, name):
            continue
        value, tp = node[name], fields_[name]
        if dataclasses.is_dataclass(tp) and isinstance(value, DictConfig):
            check_composed(value, _composed(value, tp), k)
        elif _mapped_schema(tp) is not None and isinstance(value, DictConfig):
            for entry in value.keys():
                check_composed(value[entry], _mapped_schema(tp), f"{k}.{entry}")
        else:
            _check_finite(value, k)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _first_set(value: Any, default: Any, key: str) -> Optional[tuple[str, Any]]:
    """The first (key, value) below `key` that differs from its default; None when none does."""
    if dataclasses.is_dataclass(value) and type(value) is type(default):
        for f in dataclasses.fields(value):
            hit = _first_set(getattr(value, f.name), getattr(default, f.name), f"{key}.{f.name}")
            if hit:
                return hit
        return None
    return None if value == default else (key, value)


def check_ignored(obj: Any, key: str = "") -> None:
    """Refuse a field set to anything but its default while the composed choice does not read it
    (`data.path=...` under data=gsm8k trained on GSM8K). Each schema's `ignored(key)` maps the
    fields its current choice leaves unread (dotted, for a reader in another group) to why."""
    for dotted, why in (obj.ignored(key) if hasattr(obj, "ignored") else {}).items():
        *up, name = dotted.split(".")
        owner = functools.reduce(getattr, up, obj)
        f = next(f for f in dataclasses.fields(owner) if f.name == name)
        hit = _first_set(getattr(owner, name), _default(f), _join(key, dotted))
        if hit:
            raise ConfigError(hit[0], why, _plain(hit[1]))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_ignored(value, _join(key, f.name))
        elif isinstance(value, dict):
            for entry, sub in value.items():
                if dataclasses.is_dataclass(sub):
                    check_ignored(sub, f"{_join(key, f.name)}.{entry}")
