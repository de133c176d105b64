"""Typed configuration: one dataclass per config group, registered in Hydra's ConfigStore.

`conf/train.yaml` composes the groups onto the `train_schema` node below, so every YAML value is
type-checked by omegaconf when Hydra composes, and `to_typed()` (the one seam from config to
objects: `OmegaConf.to_object`) runs each `__post_init__` for value checks. Choices are `Enum`s
(omegaconf rejects `typing.Literal`, docs/pitfalls.md#9). Every field carries a docstring; the
configuration reference in docs/configuration.md is generated from these. A group whose options
read different keys has one schema per option (`OPTION_SCHEMAS`: each objective's), each
stored as `schema/<group>/<option>` and named first in that option's defaults list, so Hydra types
the option's keys against its own class and a key another option reads is an unknown key. An
objective's schema registers itself where it is defined; `discover()` imports every module of this
package before the store is filled, so a new objective's schema module is found without a list.

`to_typed` also refuses, for every schema at once: a key the schema does not declare (omegaconf
lets `+group.key=value` add one to a typed node), a non-finite float anywhere, and a key set to
anything but its default while the composed option does not read it (each schema's `ignored()`
says which of its fields the current choice leaves unread, and who reads them).

Values are checked here; kwargs NAMES are checked against the installed libraries in
`align.run.preflight_checks`. A `ConfigError` names the dotted key and what is accepted, and becomes exit 2.
"""

from __future__ import annotations

import importlib
import pkgutil

from omegaconf import DictConfig, OmegaConf

from align.config.checks import check_composed, check_ignored, schema_fields, unknown_key  # noqa: F401
from align.config.data import *  # noqa: F403
from align.config.eval_config import EvalConfig, EvalTask  # noqa: F401
from align.config.model import *  # noqa: F403
from align.config.objective import *  # noqa: F403
from align.config.objective import OBJECTIVE_SCHEMAS
from align.config.probe_config import *  # noqa: F403
from align.config.root import GROUP_SCHEMAS, OPTION_SCHEMAS, TrainConfig, register, schema_defaults  # noqa: F401
from align.config.rules import _choices, _only, _plain, _read, _require  # noqa: F401
from align.config.trainer_config import *  # noqa: F403


def discover() -> None:
    """Import every module of align/config/: an objective's schema in a module of its own registers itself
    (`OBJECTIVE_SCHEMAS`) when imported, and `register()` then stores it for Hydra."""
    for info in pkgutil.iter_modules(__path__):  # noqa: F405 (the package's own, not a star import's)
        importlib.import_module(f"{__name__}.{info.name}")


discover()
SCHEMA_MODULES = ("align.config.model", "align.config.data", "align.config.trainer_config", "align.config.objective",
                  "align.config.probe_config", "align.config.eval_config", "align.config.root")
SCHEMA_MODULES += tuple(dict.fromkeys(c.__module__ for c in OBJECTIVE_SCHEMAS.values()
                                      if c.__module__ not in SCHEMA_MODULES))
"""The modules that hold the schema dataclasses (the docs generator and the docstring test read them): the
groups', then any objective's schema module of its own."""


def to_typed(cfg: DictConfig) -> TrainConfig:
    """The seam from composed config to objects; every refusal surfaces as `ConfigError`: keys and
    non-finite floats first (`check_composed`), then each `__post_init__`, then `check_ignored`."""
    check_composed(cfg)
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, TrainConfig), type(obj)
    check_ignored(obj)
    return obj


register()
