"""Your own rewards: Python functions with TRL's reward-function signature, each named in config as
`pkg.module:fn` (imported) or `/path/my_reward.py:fn` (loaded from the file) and weighted by its name in
`reward.weights` beside the verifiers (docs/rewards.md): `reward.functions: {name: spec}` holds several,
`reward.function=spec` is the one-function shorthand, weighted as `python`.

    def fn(prompts, completions, **kwargs) -> list[float]

It is called by keyword, like TRL's GRPOTrainer calls a reward function, once per prompt with that
prompt's group of completions: `prompts` (the prompt as the model saw it, rendered through the chat
template, once per completion), `completions` (the decoded completions, strings), `completion_ids` (their
token ids) and one keyword per field of the prompt's data record (`reference`, `question`, ...: a list
holding the field's value once per completion). It returns one finite number per completion.

Loaded once per process (`load_function`): preflight imports each and checks its signature before any heavy
work, and the run reuses that import. The identity the manifest records, per function, is the import path,
the source file that defines the function and that file's sha256 at import.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any, Callable, Optional

from align.errors import ConfigError

NAME = "python"
"""The name `reward.function` (the one-function shorthand) is weighted by in `reward.weights`."""
ROW_STATISTICS = ("mean", "std", "zero_variance_frac", "zero_variance_first_round")
"""The step row's own `reward/<name>` statistics (align/objectives/grpo_metrics.py `rollout_row`): a function of
one of these names would overwrite them with its part."""
OWN_ARGUMENTS = ("prompts", "completions", "completion_ids")
"""The keywords the call itself passes: a data field of one of these names would collide with them."""
ACCEPTED = "pkg.module:fn, or /path/to/file.py:fn"


def function_key(name: str) -> str:
    """The config key that names the function weighted as `name`."""
    return "reward.function" if name == NAME else f"reward.functions.{name}"


def split_spec(spec: Any, key: str = "reward.function") -> tuple[str, str]:
    """(module or file, attribute path) of `spec`; ConfigError naming `key` when it has no such shape."""
    target, sep, attr = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
    if not (sep and target.strip() and attr and all(p.isidentifier() for p in attr.split("."))):
        raise ConfigError(key, f"must name a function as {ACCEPTED}", spec)
    return target.strip(), attr


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Group:
    """One prompt and its completions, as the reward function gets them."""

    prompt: str
    """The prompt rendered through the chat template, as the model saw it."""
    reference: str
    """The reference answer the verifiers score against."""
    columns: dict[str, Any]
    """The fields of the prompt's data record (empty when no python reward reads them)."""
    where: str
    """`<file>:<line>` of the prompt's record: what a failure names."""
    completions: list[str]
    completion_ids: list[list[int]]
    messages: list[dict[str, str]] = field(default_factory=list)
    """The prompt's messages (the record's turns before its reference): what a reward model renders through its
    own chat template, the completion as the assistant's turn."""


class PythonReward:
    """A loaded reward function: `__call__(group)` returns its values, checked, or raises ConfigError (exit 2)
    naming the prompt."""

    def __init__(self, spec: str, fn: Callable[..., Any], file: Optional[Path], fields: tuple[str, ...] = (),
                 key: str = "reward.function") -> None:
        self.spec, self.fn, self.file, self.key = spec, fn, file, key
        self.fields = fields
        """The record fields the function names as required parameters: every prompt's record must hold them."""
        self.sha256 = _sha256(file) if file is not None and file.is_file() else None

    def under(self, key: str) -> PythonReward:
        """The same import, its failures naming `key` (one spec can be configured under several names)."""
        other = copy.copy(self)
        other.key = key
        return other

    def identity(self) -> dict[str, Any]:
        return {"function": self.spec, "file": None if self.file is None else str(self.file), "sha256": self.sha256}

    def __call__(self, group: Group) -> list[float]:
        n = len(group.completions)
        kwargs = {k: [v] * n for k, v in group.columns.items()}
        try:
            out = self.fn(prompts=[group.prompt] * n, completions=list(group.completions),
                          completion_ids=[list(ids) for ids in group.completion_ids], **kwargs)
        except Exception as e:  # the user's code: any failure stops the run, naming the prompt
            raise self._failed(group, f"raised {type(e).__name__}: {_first(e)}") from None
        try:
            values = None if isinstance(out, (str, bytes, dict)) else list(out)
        except TypeError:
            values = None
        if values is None:
            raise self._failed(group, f"returned a {type(out).__name__}; accepted: a list of one number per completion")
        if len(values) != n:
            raise self._failed(group, f"returned {len(values)} value(s) for the prompt's {n} completions; "
                                      "accepted: one number per completion")
        for i, v in enumerate(values):
            if not isinstance(v, Real) or not math.isfinite(float(v)):
                got = repr(v)[:40] if isinstance(v, Real) or v is None else f"a {type(v).__name__}"
                raise self._failed(group, f"returned {got} for completion {i}; accepted: a finite number")
        return [float(v) for v in values]

    def _failed(self, group: Group, what: str) -> ConfigError:
        return ConfigError(group.where, f"{self.key} {self.spec} {what}")


_LOADED: dict[str, PythonReward] = {}


def load_function(spec: str, key: str = "reward.function") -> PythonReward:
    """The function `spec` names, imported once per process, its signature checked; ConfigError (exit 2,
    one line naming `key`) for a missing module, file or attribute, a non-callable, an async function or a
    signature TRL's keyword call does not fit."""
    if spec in _LOADED:
        return _LOADED[spec] if _LOADED[spec].key == key else _LOADED[spec].under(key)
    fn, module = import_spec(spec, key)
    fields = _check_signature(fn, key, spec)
    _LOADED[spec] = loaded = PythonReward(spec, fn, source_file(fn, module), fields, key)
    return loaded


def import_spec(spec: str, key: str) -> tuple[Any, Any]:
    """(the object `spec` names, its module), imported or loaded from its file; ConfigError naming `key` for a
    missing module, file or attribute (the tools of align/rewards/tool_calls.py are named the same way)."""
    target, attr = split_spec(spec, key)
    if _is_file(target):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(key, f"no such file: {path} (accepted: {ACCEPTED})", spec)
        name = f"align_reward_{hashlib.sha256(str(path).encode()).hexdigest()[:16]}"
        module = _exec_file(path, name, key, spec)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise ConfigError(key, f"cannot import {target}: {e} (accepted: {ACCEPTED}, importable from here)",
                              spec) from None
        except Exception as e:
            raise ConfigError(key, f"importing {target} raised {type(e).__name__}: {_first(e)}", spec) from None
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ConfigError(key, f"{target} has no attribute {attr!r}", spec)
        fn = getattr(fn, part)
    return fn, module


def source_file(fn: Any, module: Any) -> Optional[Path]:
    """The file that defines `fn`: what the manifest records and hashes."""
    try:
        return Path(inspect.getsourcefile(fn) or module.__file__).resolve()
    except TypeError:  # a callable instance or a builtin: the module's own file
        return Path(module.__file__).resolve() if getattr(module, "__file__", None) else None


def _first(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else "no message"


def _exec_file(path: Path, name: str, key: str, spec: str) -> Any:
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(key, f"{path} cannot be loaded as a Python module (accepted: {ACCEPTED})", spec)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look a module up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise ConfigError(key, f"loading {path} raised {type(e).__name__}: {_first(e)}", spec) from None
    return module


def _check_signature(fn: Any, key: str, spec: str) -> tuple[str, ...]:
    """The fields the function requires by name besides its own arguments (checked against each prompt's
    record when the prompts load); ConfigError when TRL's keyword call cannot fit it."""
    if not callable(fn):
        raise ConfigError(key, f"names a {type(fn).__name__}, not a function", spec)
    call = fn if inspect.isroutine(fn) or inspect.isclass(fn) else type(fn).__call__  # a callable instance
    if inspect.iscoroutinefunction(call):
        raise ConfigError(key, "is an async function; accepted: a plain function fn(prompts, completions, **kwargs)",
                          spec)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ()  # no signature to read (some builtins): the first call tells
    params = sig.parameters.values()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    fields = tuple(p.name for p in params if p.kind in keyword and p.default is p.empty and p.name not in OWN_ARGUMENTS)
    # TRL passes its own extra keywords to every reward function: one without **kwargs fails there too.
    takes_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    try:
        sig.bind(**{a: [] for a in (*OWN_ARGUMENTS, *fields)})
        why = ""
    except TypeError as e:
        why = f" ({e})"
    if why or not takes_kwargs:
        raise ConfigError(key, f"has signature {sig}; accepted: TRL's reward-function signature "
                          f"fn(prompts, completions, **kwargs), called by keyword{why}", spec)
    return fields
