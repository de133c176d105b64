"""The weights an engine generates with: the training model itself (shared) or its own copy, kept
current by `sync_from` and fingerprinted by `weights_hash` (align/generation/fingerprint.py)."""

from __future__ import annotations

import copy
from typing import Optional

import torch


class ModelWeights:
    """What every engine on a transformers model object does with its weights (and the vocabulary its
    prompts must stay in). The engine class sets `self.model` and `self.shares_weights` in its
    constructor, which takes `shares_weights=`."""

    model: torch.nn.Module
    shares_weights: bool

    @classmethod
    def copy_of(cls, model: torch.nn.Module, cfg, *, dtype: Optional[torch.dtype] = None,
                device: Optional[torch.device] = None, **kw):
        """An engine on its own copy of `model` (optionally cast/moved), kept current by `sync_from`."""
        twin = copy.deepcopy(model)
        twin.to(device=device, dtype=dtype)
        return cls(twin, cfg, shares_weights=False, **kw)

    def sync_from(self, model: torch.nn.Module) -> None:
        """Make this engine's weights `model`'s: nothing when it shares them, else a load of the state
        dict (a device-to-device copy, casting where the dtypes differ)."""
        if model is self.model:
            return
        self.model.load_state_dict(model.state_dict())

    def check_prompts(self, prompts) -> None:
        """Every prompt non-empty and inside the model's vocabulary, or one line naming the prompt."""
        from align.errors import ConfigError

        vocab = self.model.get_input_embeddings().num_embeddings
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ConfigError(f"prompts[{i}]", "is empty: a prompt needs at least one token")
            bad = [t for t in p if not 0 <= int(t) < vocab]
            if bad:
                raise ConfigError(f"prompts[{i}]", f"holds token ids outside [0, {vocab})", bad[:5])

    def weights_hash(self) -> str:
        from align.generation.fingerprint import fingerprint

        return fingerprint(self.model.state_dict().items())
