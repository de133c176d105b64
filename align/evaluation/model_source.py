"""Where an eval's model comes from: an export dir or a training checkpoint, to (model, tokenizer).

- export: the HF layout `align.train` writes to <run>/export (config.json, *.safetensors, the
  tokenizer); loaded with `AutoModelForCausalLM.from_pretrained`, the way a user serves it.
- checkpoint: <run>/checkpoints/step_N (torch.distributed.checkpoint). The model is rebuilt from that
  run's resolved config (<run>/.hydra/config.yaml) with align's own build, its tensors read back
  through DCP (resharded to plain tensors) and LoRA merged, as export would have written it.

`resolve_source` only looks at files (no torch), so preflight refuses a bad path before any load.
`identity()` hashes file content, so the eval cache can be consulted without loading the model.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Optional

from align.errors import ConfigError
from align.run.manifest import canonical_json, sha256_file, sha256_files, tokenizer_hashes

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

    def load(self, device: Any, dtype: Any) -> tuple[Any, Any]:
        """(model in eval mode on `device` in `dtype`, tokenizer) of this source."""
        from align.config import ModelConfig
        from align.data.tokenizer import load_tokenizer

        if self.kind == SourceKind.export:
            from transformers import AutoModelForCausalLM

            tok = load_tokenizer(ModelConfig(pretrained=str(self.path)))
            from align.run.quiet import library_progress_bars

            with library_progress_bars():
                model = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True, dtype=dtype)
        else:
            model, tok = self._load_checkpoint(device)
        return model.to(device=device, dtype=dtype).eval(), tok

    def _load_checkpoint(self, device: Any) -> tuple[Any, Any]:
        import torch.distributed.checkpoint as dcp
        from omegaconf import OmegaConf
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        from align.config import TrainConfig
        from align.control.checkpoint import SafeReader, partition
        from align.data.tokenizer import load_tokenizer
        from align.models import build_model
        from align.models.export import merged

        conf = OmegaConf.merge(OmegaConf.structured(TrainConfig), self.train_config())
        cfg: TrainConfig = OmegaConf.to_object(conf)
        tok = load_tokenizer(cfg.model)
        model = build_model(cfg.model, cfg.attention, tok, device).model  # device: for the attention choice
        tensors, _ = partition(get_model_state_dict(model))
        with warnings.catch_warnings():  # DCP warns that no process group exists: one process reads it all
            warnings.simplefilter("ignore")
            dcp.load(tensors, storage_reader=SafeReader(self.path / "model"), no_dist=True)
        set_model_state_dict(model, tensors)
        return merged(model), tok


def _export_problem(path: Path) -> Optional[str]:
    if not (path / "config.json").is_file():
        return f"{path} has no config.json"
    if not any(path.glob("*.safetensors")):
        return f"{path} has no *.safetensors weights"
    if tokenizer_hashes(path)[0] is None:
        return f"{path} has no tokenizer files"
    return None


def _checkpoint_problem(path: Path) -> Optional[str]:
    from align.control.ckpt_index import problem

    why = problem(path)
    if why:
        return why
    if not (path.parents[1] / ".hydra" / "config.yaml").is_file():
        return f"{path.parents[1]} (the checkpoint's run dir) has no .hydra/config.yaml to rebuild the model from"
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
