"""Whether a checkpoint fits the model it is loaded into. Without these checks a checkpoint of another
architecture, or one whose tensors were renamed or dropped, loads with a logged warning, and whatever
did not land trains (or is evaluated) from random init.

- `family_problem` (files only, no torch: preflight, and the build again): config.json's `model_type`
  and `architectures` against the composed family, before any weight is read. Under `model=hf` the
  family the model_type picks (align.models.family), or the class transformers maps it to: knowing
  that one imports transformers.
- `load_checked`: `from_pretrained(..., output_loading_info=True)` and transformers' own report of the
  load: every parameter and persistent buffer of the model read from the checkpoint, every checkpoint
  tensor placed, every shape as the model's; else one line naming the config key. Allowed to be
  absent (`LoadReport.tied`, `.non_persistent`): a tensor tied to another (`all_tied_weights_keys`: an LM
  head tied to the input embedding is that embedding) and the non-persistent buffers (never saved:
  rotary tables computed at init). transformers leaves out of its report the keys a class declares
  ignorable (`_keys_to_ignore_on_load_missing` / `_unexpected`).
- `loading`: a checkpoint that cannot be read is bad input (exit 2, one line naming the key), not a crash.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from align.config import Family
from align.core.quiet import library_progress_bars
from align.errors import ConfigError
from align.models.family import align_family, causal_lm_classes, checkpoint_config
from align.models.family_table import FAMILIES
from align.models.kwargs import REPORT_KWARGS

SHOWN = 3
"""Tensor names quoted per kind in a refusal."""

# --------------------------------------------------------------------------- before the load


def _families_line() -> str:
    by_type: dict[str, list[str]] = {}
    for family, spec in FAMILIES.items():
        by_type.setdefault(spec.model_type, []).append(f"model={family.value}")
    return "; ".join(f"{t}: {', '.join(opts)}" for t, opts in by_type.items())


def family_problem(family: Family, pretrained: str | Path) -> Optional[str]:
    """Why the checkpoint at `pretrained` is not one `model=<family>` loads, from its config.json; None
    when it is (or when config.json does not parse: the file checks report that). Under `model=hf`: any
    causal-LM model_type transformers knows, and one of align's families held to that family's rules."""
    config = checkpoint_config(pretrained)
    if config is None:
        return None
    path = Path(pretrained) / "config.json"
    archs = config.get("architectures") or []
    what = f"model_type {config.get('model_type')!r}" + (f" ({', '.join(map(str, archs))})" if archs else "")
    if family == Family.hf:
        return _hf_problem(config, pretrained, path, what)
    spec = FAMILIES[family]
    if "model_type" not in config:
        return f"{path} has no model_type; model={family.value} loads model_type {spec.model_type!r} checkpoints"
    if not spec.fits(config):
        fits = [f"model={f.value}" for f, s in FAMILIES.items() if s.fits(config)]
        if fits:
            return f"{path} gives {what}: that checkpoint loads with {' or '.join(fits)}, not model={family.value}"
        return (f"{path} gives {what}, which is not one of align's families ({_families_line()}): "
                "model=hf loads any causal-LM checkpoint transformers knows")
    return _architectures_problem(path, archs, f"model={family.value}", spec.architecture)


def _architectures_problem(path: Path, archs: list, option: str, architecture: str) -> Optional[str]:
    wrong = [a for a in archs if a != architecture]
    if wrong:
        return (f"{path} lists architectures {', '.join(map(str, wrong))}; {option} builds "
                f"{architecture}, which does not hold that model's tensors")
    return None


def _hf_problem(config: dict[str, Any], pretrained: str | Path, path: Path, what: str) -> Optional[str]:
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return f"{path} has no model_type; model=hf builds the class transformers maps it to"
    family = align_family(config)
    if family is not None:  # the run model=<family> would make, refusals included
        return family_problem(family, pretrained)
    names = causal_lm_classes(model_type)
    if names is None:
        return (f"{path} gives {what}, which transformers' AutoModelForCausalLM maps to no class: model=hf "
                "trains causal LMs only")
    return _architectures_problem(path, config.get("architectures") or [], "model=hf", names[1])


def pickle_problem(d: str | Path) -> Optional[str]:
    """Why a `pytorch_model*.bin` in `d` would be refused by torch's weights-only loader (the only way
    align reads a torch pickle), from the pickle's list of globals alone: no tensor is read. None when
    none would be, or when the file is not in torch's zip format (then the load itself decides)."""
    import torch

    for f in sorted(Path(d).glob("pytorch_model*.bin")):
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(f)
        except (OSError, ValueError, RuntimeError):
            continue
        if unsafe:
            return (f"{f} is refused by torch's weights-only loader: its pickle names {', '.join(unsafe[:SHOWN])}, "
                    "not plain tensors; align never unpickles objects: save the weights as safetensors (accepted)")
    return None


# ------------------------------------------------------------------------------- the load


@contextlib.contextmanager
def loading(what: str, path: str | Path, key: str = "model.pretrained") -> Iterator[None]:
    """A checkpoint that cannot be read is bad input (exit 2, one line naming `key`), not a crash: the
    file checks (align.models.checkpoint_files.checkpoint_problem) catch what the files show, this the rest.
    Running out of memory is not the checkpoint's fault and stays an error of its own."""
    import torch
    from safetensors import SafetensorError

    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except pickle.UnpicklingError as e:  # a weights-only loader refused a pickle (never retried unsafely)
        text = str(e).splitlines()[0] if str(e).strip() else "no message"
        why = pickle_problem(path) or (f"cannot load the {what} from {path}: a pickle in it is refused by the "
                                       f"weights-only loader ({text}); align never unpickles objects: safetensors "
                                       "is accepted")
        raise ConfigError(key, why) from None
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        text = " ".join(str(e).split()) or "no message"
        raise ConfigError(key, f"cannot load the {what} from {path}: {type(e).__name__}: {text}") from None


@contextlib.contextmanager
def _load_report_held() -> Iterator[None]:
    """transformers logs its load report (a table of MISSING / UNEXPECTED / MISMATCH rows) as a warning
    and goes on; `load_checked` reads the same report and refuses in one line, so the table is held
    back, and logged only if the load raises (a weight-conversion error is described only there)."""
    logger = logging.getLogger("transformers.modeling_utils")
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in str(record.msg):
            held.append(record)
            return False
        return True

    logger.addFilter(hold)
    try:
        yield
    except BaseException:
        logger.removeFilter(hold)
        for record in held:
            logger.handle(record)
        raise
    finally:
        logger.removeFilter(hold)


@dataclass(frozen=True)
class LoadReport:
    """What a `from_pretrained` put into the model, from transformers' loading info."""

    model_class: str
    expected: list[str]
    """The model's parameters (each tensor once) and persistent buffers: what the checkpoint must hold."""
    missing: list[str]
    unexpected: list[str]
    mismatched: list[tuple[str, list[int], list[int]]]
    """(name, shape in the checkpoint, shape in the model)."""
    tied: dict[str, str]
    """Tensors tied to another (name -> the one it is), not read on their own: allowed to be absent."""
    non_persistent: list[str]
    """Buffers computed at init and never saved (rotary tables): allowed to be absent."""

    @classmethod
    def of(cls, model: Any, info: dict[str, Any]) -> "LoadReport":
        expected, non_persistent = [n for n, _ in model.named_parameters()], []
        for prefix, module in model.named_modules():
            for b, value in module._buffers.items():
                name = f"{prefix}.{b}" if prefix else b
                if b in module._non_persistent_buffers_set:
                    non_persistent.append(name)
                elif value is not None:
                    expected.append(name)
        return cls(model_class=type(model).__name__, expected=expected, missing=sorted(info["missing_keys"]),
                   unexpected=sorted(info["unexpected_keys"]),
                   mismatched=sorted((k, list(a), list(b)) for k, a, b in info["mismatched_keys"]),
                   tied=dict(sorted((getattr(model, "all_tied_weights_keys", None) or {}).items())),
                   non_persistent=sorted(non_persistent))

    @property
    def loaded(self) -> int:
        absent = set(self.missing) | {k for k, _, _ in self.mismatched}
        return sum(1 for n in self.expected if n not in absent)

    def record(self) -> dict[str, Any]:
        """The manifest's (and eval.json's) account of the load."""
        return {"loaded": self.loaded, "missing": len(self.missing), "unexpected": len(self.unexpected),
                "mismatched": len(self.mismatched),
                "allowed_missing": {"tied": self.tied, "non_persistent_buffers": self.non_persistent}}

    def problem(self) -> Optional[str]:
        """Why the checkpoint does not fit the model, in one line; None when every tensor landed."""
        if not (self.missing or self.unexpected or self.mismatched):
            return None

        def names(keys: list[str]) -> str:
            return ", ".join(keys[:SHOWN]) + (", ..." if len(keys) > SHOWN else "")

        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} of the model's {len(self.expected)} tensors missing from it "
                         f"({names(self.missing)}): they would start from random init")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} of its tensors with no place in the model "
                         f"({names(self.unexpected)}): they would be dropped")
        if self.mismatched:
            shown = [f"{k} {a} vs the model's {b}" for k, a, b in self.mismatched]
            parts.append(f"{len(self.mismatched)} of another shape ({names(shown)})")
        return f"does not fit {self.model_class}: " + "; ".join(parts)


def load_checked(model_cls: Any, path: str | Path, key: str, **kwargs: Any) -> tuple[Any, LoadReport]:
    """`model_cls.from_pretrained(path, **kwargs)`, refused (ConfigError naming `key`) unless every
    tensor landed (`LoadReport.problem`)."""
    with loading("weights", path, key), _load_report_held(), library_progress_bars():
        model, info = model_cls.from_pretrained(Path(path), **kwargs, **REPORT_KWARGS)
    report = LoadReport.of(model, info)
    why = report.problem()
    if why:
        raise ConfigError(key, f"the checkpoint {path} {why}; accepted: a checkpoint holding exactly the model's "
                          "tensors (tied ones and non-persistent buffers aside)")
    return model, report
