"""What every `python -m align.<tool>` entry shares: finding conf/, composing, and turning bad
input into one line on stderr and exit 2 before any heavy work.

Hydra's own error path prints several lines and exits 1, which is indistinguishable from a crash.
`validate_command_line` composes every job of the command line (each point of a `-m` sweep) with
Hydra's compose API first, converts each to the typed config, and fails with one line naming the key.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn, Sequence

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from align.errors import EXIT_CONFIG, AlignError, ConfigError


def conf_dir() -> Path:
    """Hydra's config dir: `align/conf/` where align is installed from a wheel (pyproject.toml maps the
    repo's conf/ there), else the checkout's `conf/` beside the package (editable install, PYTHONPATH).
    The packaged copy wins: an installed align sits among other distributions, one of which may ship
    a directory named conf."""
    here = Path(__file__).resolve().parent
    packaged, checkout = here / "conf", here.parent / "conf"
    return packaged if (packaged / "train.yaml").is_file() else checkout


CONF_DIR = conf_dir()


def die(message: str, code: int = EXIT_CONFIG) -> NoReturn:
    print(f"align: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def describe(exc: BaseException) -> str:
    """One line for a composition, override or value error: the key, the problem, what is accepted."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    if isinstance(exc, AlignError):
        return str(exc)
    if isinstance(exc, MissingConfigException):
        missing = str(exc).split("Could not find '", 1)[-1].split("'", 1)[0]
        group, _, option = missing.rpartition("/")
        if group and (CONF_DIR / group).is_dir():
            return f"{group}={option}: no such option; accepted: {', '.join(_options(group))}"
        return str(exc).splitlines()[0]
    if isinstance(exc, OverrideParseException):
        return f"cannot parse override: {str(exc).splitlines()[0]}"
    cause = exc.__cause__ if isinstance(exc, ConfigCompositionException) and exc.__cause__ else exc
    if isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or "config"
        msg = (getattr(cause, "msg", None) or str(cause)).splitlines()[0]
        if "not in" in msg or "Could not" in msg or "Key '" in msg:
            group = key.split(".")[0]
            schema = _schema_fields(group)
            hint = f"; accepted keys: {', '.join(schema)}" if schema else ""
            return f"{key}: unknown key{hint}"
        return f"{key}: {msg}"
    if isinstance(exc, ConfigCompositionException):
        return str(exc).splitlines()[0]
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _schema_fields(group: str) -> list[str]:
    import dataclasses

    from align.config import GROUP_SCHEMAS

    schema = GROUP_SCHEMAS.get(group)
    return [f.name for f in dataclasses.fields(schema)] if schema else []


def compose(overrides: Sequence[str] = (), config_name: str = "train", return_hydra_config: bool = False) -> DictConfig:
    """Compose conf/ the way `@hydra.main` would (used by validation, tests and probes)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import align.config  # noqa: F401  (registers the schemas)

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


def job_override_lists(argv: Sequence[str]) -> tuple[list[list[str]], bool]:
    """The override list of every job the command line would run, and whether it is a multirun."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = get_args_parser().parse_args(list(argv))
    parsed = OverridesParser.create().parse_overrides(args.overrides)
    if not args.multirun:
        return [list(args.overrides)], False
    batches = BasicSweeper.split_arguments(parsed, None)
    return [job for batch in batches for job in batch], True


def validate_command_line(argv: Sequence[str], config_name: str = "train") -> list:
    """Compose and type-check every job of `argv`; exit 2 with one line on the first bad one.
    Returns the typed config of each job."""
    from align.config import to_typed

    try:
        jobs, _ = job_override_lists(argv)
        return [to_typed(compose(job, config_name=config_name)) for job in jobs]
    except SystemExit:
        raise
    except Exception as exc:  # every composition/value error becomes one line
        die(describe(exc))


def preflight_command_line(argv: Sequence[str], config_name: str = "train") -> None:
    """Compose, type and preflight every job of `argv` before Hydra creates a run dir: a refusal
    leaves nothing behind, and a cheap failure (values, git, files) exits before any library import."""
    from align.preflight import run_preflight

    for typed in validate_command_line(argv, config_name):
        try:
            run_preflight(typed)
        except AlignError as e:
            die(str(e), e.exit_code)


def wants_hydra_only(argv: Sequence[str]) -> bool:
    """--help, --cfg, --info and shell completion are Hydra's business: do not pre-validate them."""
    return any(a in ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "--shell-completion", "-sc") or a.startswith("--cfg") for a in argv)


__all__ = ["CONF_DIR", "compose", "describe", "die", "validate_command_line", "ConfigError"]
