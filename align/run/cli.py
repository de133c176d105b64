"""What every `python -m align.<tool>` entry shares: finding conf/, composing, and turning bad
input into one line on stderr and exit 2 before any heavy work.

Hydra's own error path prints several lines and exits 1, which is indistinguishable from a crash.
`validate_command_line` composes every job of the command line (each point of a `-m` sweep) with
Hydra's compose API first, converts each to the typed config, and fails with one line naming the key.
"""

from __future__ import annotations

import itertools
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from align.errors import EXIT_CONFIG, AlignError, ConfigError


def conf_dir() -> Path:
    """Hydra's config dir: `align/conf/` where align is installed from a wheel (pyproject.toml maps the
    repo's conf/ there), else the checkout's `conf/` beside the package (editable install, PYTHONPATH).
    The packaged copy wins: an installed align sits among other distributions, one of which may ship
    a directory named conf."""
    package = Path(__file__).resolve().parents[1]  # align/
    packaged, checkout = package / "conf", package.parent / "conf"
    return packaged if (packaged / "train.yaml").is_file() else checkout


CONF_DIR = conf_dir()


def die(message: str, code: int = EXIT_CONFIG) -> NoReturn:
    print(f"align: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def one_line(text: str) -> str:
    """A multi-line library message as one line, hints kept (Hydra puts its advice on later lines)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    if not lines:
        return ""
    head, rest = lines[0], lines[1:]
    return head if not rest else f"{head}{'' if head.endswith(('.', ':')) else ':'} {'; '.join(rest)}"


def _override_key(exc: BaseException, key: str) -> str:
    """omegaconf names the key relative to the node it failed in (`a` for `+data.mixture.a={...}`);
    the override Hydra was merging names it in full."""
    text = str(exc)
    if not text.startswith("Error merging override "):
        return key
    full = text.removeprefix("Error merging override ").split("=", 1)[0].lstrip("+~")
    return full if full.endswith(f".{key}") else key


def quote_hint(override: str) -> str:
    """How to pass a value Hydra's grammar cannot read bare (a path with brackets, parentheses, quotes
    or `=`), or the rest of one the shell split at a space: quoted, as one word."""
    key, eq, value = override.partition("=")
    if not eq:
        return ("not key=value: if it is the rest of a value the shell split at a space, quote the whole "
                "override, e.g. 'data.path=\"/tmp/my data/x.jsonl\"'")
    inner = '"' if '"' not in value else "'"
    return f"if the value is one string (a path), quote it: {shlex.quote(f'{key}={inner}{value.strip()}{inner}')}"


def describe(exc: BaseException, root: Optional[type] = None) -> str:
    """One line for a composition, override or value error: the key, the problem, what is accepted.
    `root`: the schema the command composes onto (default: align.train's TrainConfig)."""
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    from align.config import unknown_key

    if isinstance(exc, AlignError):
        return str(exc)
    if isinstance(exc, MissingConfigException):
        missing = str(exc).split("Could not find '", 1)[-1].split("'", 1)[0]
        group, _, option = missing.rpartition("/")
        # Hydra lists the options of every directory on the search path (--config-dir's, hydra.searchpath's)
        text = str(exc).split(f"Available options in '{group}':", 1)
        listed = sorted(ln.strip() for ln in text[1].split("Config search path:")[0].splitlines() if ln.strip()) \
            if len(text) == 2 else []
        if group and (listed or (CONF_DIR / group).is_dir()):
            return f"{group}={option}: no such option; accepted: {', '.join(listed or _options(group))}"
        return str(exc).splitlines()[0]
    if isinstance(exc, OverrideParseException):
        # The message's later lines are a caret under the argument and a link to the grammar.
        return f"cannot parse override {exc.override!r}: {exc.message.splitlines()[0]}; {quote_hint(exc.override)}"
    inner = exc.__context__
    if isinstance(exc, ConfigCompositionException) and not exc.__cause__ and isinstance(
            inner, (ConfigKeyError, ConfigAttributeError)) and str(exc).startswith("In '"):
        # A config file's own key: Hydra raises it inside its except block (a context, no cause), naming the file.
        err = unknown_key(inner.full_key, root, getattr(inner, "object_type", None))
        if err is not None:
            return f"{str(exc).split(':', 1)[0]}: {err}"
    cause = exc.__cause__ if isinstance(exc, ConfigCompositionException) and exc.__cause__ else exc
    if isinstance(cause, OmegaConfBaseException):
        key = _override_key(exc, getattr(cause, "full_key", None) or "config")
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            err = unknown_key(key, root, getattr(cause, "object_type", None))
            if err is not None:  # a typed schema: no `+` can add the key either
                return str(err)
            if cause is not exc:  # inside an open mapping (model.overrides): Hydra's hint says how to add it
                return f"{key}: {one_line(exc)}"
        msg = (getattr(cause, "msg", None) or str(cause)).splitlines()[0]
        return f"{key}: {msg}"
    if isinstance(exc, ConfigCompositionException):
        return one_line(exc)
    if isinstance(exc, AssertionError) and "root: NoneType" in str(exc):  # omegaconf, a key under a null group
        return ("a key of a group that is not composed was set (e.g. eval.limit without eval=gsm8k): choose the "
                "group's option first")
    return f"{type(exc).__name__}: {one_line(exc)}"


def compose(overrides: Sequence[str] = (), config_name: str = "train", return_hydra_config: bool = False,
            config_dir: Path = CONF_DIR) -> DictConfig:
    """Compose conf/ (or `config_dir`, a run's .hydra/ when replaying) the way `@hydra.main` would
    (used by validation, tests and probes)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import align.config  # noqa: F401  (registers the schemas)

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


_CONFIG_PATH_FLAGS = ("--config-path", "-cp")


def absolute_config_path(argv: Sequence[str]) -> list[str]:
    """`--config-path` made absolute against the working directory: Hydra would read a relative one
    against the package's own directory, so `--config-path outputs/<run>/.hydra` would not be found."""
    out = list(argv)
    for i, a in enumerate(out):
        flag, eq, value = a.partition("=")
        if flag in _CONFIG_PATH_FLAGS and eq and value and not value.startswith("pkg://"):
            out[i] = f"{flag}={Path(value).absolute()}"
        elif a in _CONFIG_PATH_FLAGS and i + 1 < len(out) and not out[i + 1].startswith("pkg://"):
            out[i + 1] = str(Path(out[i + 1]).absolute())
    return out


# Hydra's flags that take a value (as `--flag value` or `--flag=value`); every other word that does
# not start with "-" is an override.
_VALUE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun",
                "--package", "-p")


@dataclass
class CommandLine:
    """What `python -m align.<entry> [flags] [overrides]` asks for, read the way Hydra reads it."""

    overrides: list[str]
    multirun: bool = False
    config_path: Optional[str] = None
    config_name: Optional[str] = None
    config_dir: Optional[str] = None


def parse_command_line(argv: Sequence[str]) -> CommandLine:
    out = CommandLine([])
    words = list(argv)
    i = 0
    while i < len(words):
        w = words[i]
        flag, eq, value = w.partition("=")
        if w in ("-m", "--multirun"):
            out.multirun = True
        elif flag in _VALUE_FLAGS:
            if not eq:
                i += 1
                value = words[i] if i < len(words) else ""
            if flag in ("--config-path", "-cp"):
                out.config_path = value
            elif flag in ("--config-name", "-cn"):
                out.config_name = value
            elif flag in ("--config-dir", "-cd"):
                out.config_dir = value
        elif not w.startswith("-"):
            out.overrides.append(w)
        i += 1
    return out


def config_source(argv: Sequence[str], config_name: str) -> tuple[Path, str]:
    """The directory and primary config the command line composes (`--config-path`, `--config-name`)."""
    args = parse_command_line(argv)
    return Path(args.config_path) if args.config_path else CONF_DIR, args.config_name or config_name


def _searchpath_override(config_dir: str, overrides: Sequence[str]) -> list[str]:
    """`overrides` with `--config-dir`'s directory put first in `hydra.searchpath`. Hydra's own
    `@hydra.main` adds the flag's directory to the search path before the `hydra.searchpath` entries;
    the compose API align validates with has no such flag, but honours `hydra.searchpath`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = Path(config_dir).absolute()
    if not path.is_dir():
        raise ConfigError("--config-dir", "no such directory; accepted: a directory of config groups "
                          "(e.g. <dir>/experiment/mine.yaml for experiment=mine)", str(path))
    given = [o for o in overrides if o.lstrip("+").startswith("hydra.searchpath=")]
    rest = [o for o in overrides if o not in given]
    entries = []
    if given:
        value = OverridesParser.create().parse_override(given[-1].lstrip("+")).value()
        entries = list(value) if isinstance(value, list) else [value]
    quoted = ",".join("'" + str(e).replace("\\", "\\\\").replace("'", "\\'") + "'"
                      for e in [f"file://{path}", *entries])
    return [*rest, f"hydra.searchpath=[{quoted}]"]


def job_override_lists(argv: Sequence[str]) -> tuple[list[list[str]], bool]:
    """The override list of every job the command line would run (the cartesian product of its sweep
    overrides, as Hydra's basic sweeper runs them), and whether it is a multirun. A `--config-dir`
    is carried as the first entry of `hydra.searchpath`, so that align's own compose finds it too."""
    args = parse_command_line(argv)
    if args.config_dir is not None:
        args.overrides = _searchpath_override(args.config_dir, args.overrides)
    return _jobs(args)


def _jobs(args: CommandLine) -> tuple[list[list[str]], bool]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not args.multirun:
        return [list(args.overrides)], False
    axes: dict[str, list[str]] = {}  # by key, the last one given winning, in Hydra's basic sweeper's order
    for o in OverridesParser.create().parse_overrides(args.overrides):
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise ConfigError(key, "the basic sweeper sweeps lists and ranges only (an interval needs a plugin)")
        axes[key] = ([f"{key}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
                     else [f"{key}={o.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*axes.values())], True


def job_key(overrides: Sequence[str]) -> tuple[str, ...]:
    """A job's identity across the pre-Hydra pass and the job itself: its task overrides, sorted."""
    return tuple(sorted(o for o in overrides if not o.lstrip("+~").startswith("hydra.")))


def validate_command_line(argv: Sequence[str], config_name: str = "train") -> list:
    """Compose and type-check every job of `argv`; exit 2 with one line on the first bad one.
    Returns the typed config of each job."""
    from align.config import to_typed

    try:
        jobs, _ = job_override_lists(argv)
        config_dir, config_name = config_source(absolute_config_path(argv), config_name)
        return [to_typed(compose(job, config_name=config_name, config_dir=config_dir)) for job in jobs]
    except SystemExit:
        raise
    except Exception as exc:  # every composition/value error becomes one line
        die(describe(exc))


PREFLIGHTED: dict[tuple[str, ...], Any] = {}
"""Each job's preflight report from the pass before Hydra, by `job_key`: the job records it in its
manifest instead of running the checks a second time (a job run in another process has none here)."""


def preflight_command_line(argv: Sequence[str], config_name: str = "train") -> list[Optional[Path]]:
    """Compose, type and preflight every job of `argv` before Hydra creates a run dir: a refusal
    leaves nothing behind, and a cheap failure (values, run dirs, git, files) exits before any library
    import. Returns the run dir each job will write (align.run.run_dir; None: not known before Hydra)."""
    from align.run.preflight_checks import run_preflight

    typed_jobs = validate_command_line(argv, config_name)  # first: it refuses a bad command line in one line
    jobs, _ = job_override_lists(argv)
    run_dirs = checked_run_dirs(argv, config_name)
    for job, typed in zip(jobs, typed_jobs):
        try:
            PREFLIGHTED[job_key(job)] = run_preflight(typed)
        except AlignError as e:
            die(str(e), e.exit_code)
    return run_dirs


def checked_run_dirs(argv: Sequence[str], config_name: str = "train", resumes: bool = True) -> list[Optional[Path]]:
    """The run dir each job of `argv` will write, each refused in one line (exit 2) before Hydra creates
    it when this command may not write there (align.run.run_dir.check_run_dirs); None: not known before
    Hydra runs. `config_name` is also Hydra's job name: the entry modules are named after their config."""
    from align.run.run_dir import check_run_dirs, planned_run_dirs

    jobs, multirun = job_override_lists(argv)
    config_dir, name = config_source(argv, config_name)
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("hydra.run.dir=")]
    planned = planned_run_dirs(jobs, multirun, config_dir, name, config_name, Path(given[-1]) if given else None)
    try:
        check_run_dirs(planned, resumes)
    except AlignError as e:
        die(str(e), e.exit_code)
    return [d for _, d in planned]


def job_preflight(cfg: Any, task_overrides: Sequence[str]) -> Any:
    """This job's preflight report: the one taken before Hydra started, else run now."""
    from align.run.preflight_checks import run_preflight

    return PREFLIGHTED.pop(job_key(task_overrides), None) or run_preflight(cfg)


def wants_hydra_only(argv: Sequence[str]) -> bool:
    """--help, --cfg, --info and shell completion are Hydra's business: do not pre-validate them."""
    return any(a in ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "--shell-completion", "-sc")
               or a.startswith("--cfg") for a in argv)


__all__ = ["CONF_DIR", "compose", "describe", "die", "validate_command_line", "ConfigError"]
