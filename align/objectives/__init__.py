"""Training objectives: how records become batches and how a micro-batch becomes a loss.
The interface the loop relies on is `Objective` (align/objectives/interface.py).

An objective's module registers its class (`@register`) under the kind its config names (the class's
`name`, the `kind` of its schema in align/config/), with its plan terms beside it (the class's `terms`,
align/objectives/plan_terms.py). `objective_classes()` imports every module of this package once, so no
table lists the objectives: a new one is its module, its schema, its conf/objective/<kind>.yaml and its
tests."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import TYPE_CHECKING, TypeVar

from align.errors import ConfigError
from align.objectives.interface import Objective, View

if TYPE_CHECKING:
    from align.config import TrainConfig

T = TypeVar("T", bound=type)

_REGISTERED: dict[str, type] = {}


def register(cls: T) -> T:
    """Class decorator of an objective's module: `cls` is the objective of kind `cls.name`."""
    if _REGISTERED.get(cls.name, cls) is not cls:
        raise TypeError(f"objective kind {cls.name!r} is registered by {_REGISTERED[cls.name].__qualname__} "
                        f"and {cls.__qualname__}")
    _REGISTERED[cls.name] = cls
    return cls


@functools.cache
def objective_classes() -> dict[str, type]:
    """Every registered objective by kind, after importing each module of align/objectives/ (an objective's
    module imports the config, so this runs when first asked, not when the package is imported)."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return _REGISTERED


def objective_class(cfg: "TrainConfig") -> type:
    """The class of the objective the config names (its static `view` needs no built objective)."""
    classes = objective_classes()
    kind = cfg.objective.kind
    if kind not in classes:
        raise ConfigError("objective.kind", f"no objective module registers this kind (accepted: "
                          f"{', '.join(classes)})", kind)
    return classes[kind]


def build_objective(cfg: "TrainConfig") -> Objective:
    """The objective the config names; `bind(model)` attaches it to the model once parallelized."""
    from align.config.trainer_config import require_chunk_resolved

    require_chunk_resolved(cfg.trainer.loss_chunk_tokens, "the objective")
    return objective_class(cfg)(cfg)


__all__ = ["Objective", "View", "build_objective", "objective_class", "objective_classes", "register"]
