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


def describe(exc: BaseException) -> str:
    """One line for a composition, override or value error: the key, the problem, what is accepted."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    from align.config import unknown_key

    if isinstance(exc, AlignError):
        return str(exc)
    if isinstance(exc, MissingConfigException):
        missing = str(exc).split("Could not find '", 1)[-1].split("'", 1)[0]
        group, _, option = missing.rpartition("/")
        if group and (CONF_DIR / group).is_dir():
            return f"{group}={option}: no such option; accepted: {', '.join(_options(group))}"
        return str(exc).splitlines()[0]
    if isinstance(exc, OverrideParseException):
        return f"cannot parse override: {one_line(exc)}"
    cause = exc.__cause__ if isinstance(exc, ConfigCompositionException) and exc.__cause__ else exc
    if isinstance(cause, OmegaConfBaseException):
        key = _override_key(exc, getattr(cause, "full_key", None) or "config")
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            err = unknown_key(key)
            if err is not None:  # a typed schema: no `+` can add the key either
                return str(err)
            if cause is not exc:  # inside an open mapping (model.overrides): Hydra's hint says how to add it
                return f"{key}: {one_line(exc)}"
        msg = (getattr(cause, "msg", None) or str(cause)).splitlines()[0]
        return f"{key}: {msg}"
    if isinstance(exc, ConfigCompositionException):
        return one_line(exc)
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


def config_source(argv: Sequence[str], config_name: str) -> tuple[Path, str]:
    """The directory and primary config the command line composes (`--config-path`, `--config-name`)."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(list(argv))
    return Path(args.config_path) if args.config_path else CONF_DIR, args.config_name or config_name


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
        config_dir, config_name = config_source(absolute_config_path(argv), config_name)
        return [to_typed(compose(job, config_name=config_name, config_dir=config_dir)) for job in jobs]
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
