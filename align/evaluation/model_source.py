"""Where an eval's model comes from: an export dir or a training checkpoint, to (model, tokenizer).

- export: the HF layout `align.train` writes to <run>/export (config.json, *.safetensors, the
  tokenizer); loaded with `AutoModelForCausalLM.from_pretrained`, the way a user serves it.
- checkpoint: <run>/checkpoints/step_N (torch.distributed.checkpoint). The model is rebuilt from that
  run's resolved config (<run>/.hydra/config.yaml) with align's own build, its tensors read back
  through DCP (resharded to plain tensors) and LoRA merged, as export would have written it.

`resolve_source` only looks at files (no torch), so preflight refuses a bad path before any load: the
checkpoint file checks `align.train` runs on `model.pretrained` (config.json parses, safetensors files
whole) on an export, the run config and its base checkpoint's files and family on a training checkpoint.
`load` refuses a model whose tensors are not exactly its class's (align.models.checkpoint_fit).
`identity()` hashes file content, so the eval cache can be consulted without loading the model.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Optional

from align.core.hashing import canonical_json, sha256_file, sha256_files, tokenizer_hashes
from align.errors import ConfigError

ACCEPTED = ("an export dir (config.json, *.safetensors, tokenizer files) or a checkpoint dir "
            "(<run>/checkpoints/step_N with that run's .hydra/config.yaml)")


class SourceKind(StrEnum):
    export = "export"
    checkpoint = "checkpoint"


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    path: Path
    key: str
    """The config key that named it (model_dir, eval.compare_to): errors name it."""

    @property
    def run_dir(self) -> Path:
        return self.path.parents[1]

    def weight_files(self) -> list[Path]:
        if self.kind == SourceKind.export:
            return sorted([*self.path.glob("*.safetensors"), *self.path.glob("*.safetensors.index.json")])
        return sorted(p for p in (self.path / "model").iterdir() if p.is_file())

    def train_config(self) -> dict[str, Any]:
        """The checkpoint's run config (model and attention: what the build reads)."""
        from omegaconf import OmegaConf

        conf = OmegaConf.to_container(OmegaConf.load(self.run_dir / ".hydra" / "config.yaml"), resolve=False)
        return {k: conf.get(k) for k in ("model", "attention")}

    def tokenizer_dir(self) -> Path:
        if self.kind == SourceKind.export:
            return self.path
        model = self.train_config()["model"] or {}
        if model.get("pretrained"):
            return Path(model["pretrained"])
        from align.data.tokenizer import bundled_tokenizer_dir

        return bundled_tokenizer_dir()

    def identity(self) -> dict[str, Any]:
        """What the model IS, from file content: the eval cache key's model part and eval.json's record."""
        files = self.weight_files()
        if self.kind == SourceKind.export:
            config_sha = sha256_file(self.path / "config.json")
        else:
            config_sha = hashlib.sha256(canonical_json(self.train_config()).encode()).hexdigest()
        tok_dir = self.tokenizer_dir()
        tok_sha, template_sha, _ = tokenizer_hashes(tok_dir)
        return {
            "kind": self.kind.value,
            "path": str(self.path),
            "weights_sha256": sha256_files(files, files[0].parent),
            "weight_files": [p.name for p in files],
            "config_sha256": config_sha,
            "tokenizer_dir": str(tok_dir),
            "tokenizer_sha256": tok_sha,
            "chat_template_sha256": template_sha,
        }

    def load(self, device: Any, dtype: Any) -> tuple[Any, Any, dict[str, Any]]:
        """(model in eval mode on `device` in `dtype`, tokenizer, what the load put into the model:
        `align.models.checkpoint_fit.LoadReport.record`) of this source. A checkpoint whose tensors are
        not exactly the model's is refused (ConfigError naming `key`), never evaluated half random."""
        from align.config import ModelConfig
        from align.data.tokenizer import load_tokenizer
        from align.models.checkpoint_fit import load_checked

        if self.kind == SourceKind.export:
            from transformers import AutoModelForCausalLM

            tok = load_tokenizer(ModelConfig(pretrained=str(self.path)))
            model, report = load_checked(AutoModelForCausalLM, self.path, self.key, local_files_only=True, dtype=dtype)
        else:
            model, tok, report = self._load_checkpoint(device)
        return model.to(device=device, dtype=dtype).eval(), tok, report.record()

    def _load_checkpoint(self, device: Any) -> tuple[Any, Any, Any]:
        from omegaconf import OmegaConf
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        from align.config import TrainConfig
        from align.control.checkpoint import SafeReader, partition
        from align.data.tokenizer import load_tokenizer
        from align.models import build_model
        from align.models.checkpoint_fit import LoadReport, loading
        from align.models.export import merged

        conf = OmegaConf.merge(OmegaConf.structured(TrainConfig), self.train_config())
        cfg: TrainConfig = OmegaConf.to_object(conf)
        tok = load_tokenizer(cfg.model)
        try:
            model = build_model(cfg.model, cfg.attention, tok, device).model  # device: for the attention choice
        except ConfigError as e:  # the run's base checkpoint: named as the key that led here
            raise ConfigError(self.key, f"rebuilding {self.path}'s model from its run config: {e}") from None
        tensors, _ = partition(get_model_state_dict(model))
        reader = SafeReader(self.path / "model")
        with loading("checkpoint", self.path / "model", self.key), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP warns that no process group exists: one process reads it all
            held = set(reader.read_metadata().state_dict_metadata)
            _dcp_load(tensors, reader, self)
        # DCP refuses a tensor the model has and the checkpoint lacks, but skips one the model has no place for.
        report = LoadReport.of(model, {"missing_keys": set(), "unexpected_keys": held - set(tensors),
                                       "mismatched_keys": set()})
        why = report.problem()
        if why:
            raise ConfigError(self.key, f"the checkpoint {self.path / 'model'} {why}")
        set_model_state_dict(model, tensors)
        return merged(model), tok, report


def _dcp_load(tensors: dict[str, Any], reader: Any, source: ModelSource) -> None:
    """DCP raises CheckpointException, a BaseException holding each rank's error: refused as one line."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(tensors, storage_reader=reader, no_dist=True)
    except CheckpointException as e:
        errors = [exc for exc, _ in e.failures.values()]  # (exception, its stack summary) per rank
        why = "; ".join(f"{type(x).__name__}: {' '.join(str(x).split()) or 'no message'}" for x in errors)
        raise ConfigError(source.key, f"cannot load the checkpoint {source.path / 'model'}: {why}") from None


def _export_problem(path: Path) -> Optional[str]:
    from align.models.checkpoint_files import checkpoint_problem

    if not (path / "config.json").is_file():
        return f"{path} has no config.json"
    if not any(path.glob("*.safetensors")):
        return f"{path} has no *.safetensors weights"
    if tokenizer_hashes(path)[0] is None:
        return f"{path} has no tokenizer files"
    return checkpoint_problem(path)  # the file checks align.train runs on model.pretrained


def _checkpoint_problem(path: Path) -> Optional[str]:
    import yaml

    from align.config import Family
    from align.control.ckpt_index import problem
    from align.models.checkpoint_files import checkpoint_problem
    from align.models.checkpoint_fit import family_problem

    why = problem(path)
    if why:
        return why
    run_config = path.parents[1] / ".hydra" / "config.yaml"
    if not run_config.is_file():
        return f"{path.parents[1]} (the checkpoint's run dir) has no .hydra/config.yaml to rebuild the model from"
    try:
        model = ModelSource(SourceKind.checkpoint, path, "").train_config()["model"] or {}
        base, family = model.get("pretrained"), Family(model.get("family", Family.mistral.value))
    except (OSError, ValueError, yaml.YAMLError) as e:
        return f"{run_config} (the model is rebuilt from it) is not a readable run config: {' '.join(str(e).split())}"
    if base:
        why = checkpoint_problem(Path(base)) or family_problem(family, base)
        if why:
            return f"its run's model.pretrained (the base the model is rebuilt on): {why}"
    return None


def resolve_source(path: Optional[str], key: str) -> ModelSource:
    """The source at `path`, or ConfigError naming `key` and what is accepted."""
    if not path:
        raise ConfigError(key, f"is required: {ACCEPTED}")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ConfigError(key, f"no such directory: {p}; expected {ACCEPTED}")
    p = p.resolve()
    if (p / "meta.json").is_file() or (p / "model" / ".metadata").is_file():
        kind, why = SourceKind.checkpoint, _checkpoint_problem(p)
    else:
        kind, why = SourceKind.export, _export_problem(p)
    if why:
        hint = f" (a run dir: did you mean {p / 'export'}?)" if (p / "export" / "config.json").is_file() else ""
        raise ConfigError(key, f"{why}{hint}; expected {ACCEPTED}")
    return ModelSource(kind=kind, path=p, key=key)


def model_record(model: Any) -> dict[str, Any]:
    """What the loaded model resolved to, read from the object."""
    cfg = model.config
    return {
        "class": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": getattr(cfg, "vocab_size", None),
        "model_type": getattr(cfg, "model_type", None),
    }


__all__ = ["ModelSource", "SourceKind", "model_record", "resolve_source"]
