"""What `RunRecord.start()` (align/run/record.py) writes before any heavy work: what the config requests
(seed, parallel, model family and kernels, preset or checkpoint), the files the run will read by content
hash, and the reward's identity. Known from the config and the disk alone."""

from __future__ import annotations

import os

from align.config import TrainConfig
from align.core.hashing import tokenizer_hashes
from align.run.manifest import Manifest


def is_moe(cfg: TrainConfig) -> bool:
    from align.models.family import family_spec

    return family_spec(cfg.model).is_moe


def record_request(m: Manifest, cfg: TrainConfig) -> None:
    """What the config asks of the run, before anything resolves it."""
    from align.models.family import family_of

    m.update(
        {
            "seed": cfg.trainer.seed,
            "parallel.kind": cfg.parallel.kind.value,
            "parallel.world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "model.family": family_of(cfg.model).value,
            "model.attn_implementation_requested": cfg.attention.implementation.hf_name,
            "model.experts_implementation_requested": cfg.model.moe.experts.value
            if cfg.model.moe.experts
            else None,
            "sampler.kind": cfg.sampler.kind.value,
        },
        {
            "model.experts_implementation_requested": "not requested: the library default applies "
            "(resolved value recorded)"
            if is_moe(cfg)
            else f"{family_of(cfg.model).value} is a dense family: no experts kernel"
        },
    )
    if cfg.model.pretrained:
        m.update({"model.pretrained": cfg.model.pretrained})
        m.null("model.preset", "built from a checkpoint, not a preset")
    else:
        m.update({"model.preset": cfg.model.preset.value})
        m.null("model.pretrained", "random init from a preset: no checkpoint")


def record_files(m: Manifest, cfg: TrainConfig) -> None:
    """The data and tokenizer files the run will read, by content hash; the encode cache's key and place."""
    from align.data.sources import content_sha256, source_path
    from align.data.tokenizer import tokenizer_dir

    path = source_path(cfg.data)
    m.update({"data.source": cfg.data.source.value, "data.path": str(path), "data.sha256": content_sha256(path)})
    tok_sha, tmpl_sha, files = tokenizer_hashes(tokenizer_dir(cfg.model))
    m.set("data.tokenizer_sha256", tok_sha, "no tokenizer files found")
    m.set("data.chat_template_sha256", tmpl_sha, "the tokenizer has no chat template file or field")
    m.set("data.aux_files", {str(path): m.data["data"]["sha256"], **files})
    from align.run.preflight_checks import encode_cache_key

    m.set(
        "data.encode_cache_key",
        encode_cache_key(cfg),
        "this build has no encode cache: every run encodes from scratch",
    )
    from align.core.caches import encode_location

    m.set("data.encode_cache_dir", encode_location(cfg.data.cache_dir) if cfg.data.cache else None,
          "data.cache=false: nothing read or written")
    m.null("data.encode_meta", "pending: read from the encoded dataset after build")
    m.null("data.format", "pending: detected from the records when they are read")


def record_reward(m: Manifest, cfg: TrainConfig) -> None:
    """The python reward functions' identities (imported as preflight did) and the reward model's (from its
    files), or why there are none."""
    from align.objectives import objective_class

    if cfg.reward.function is None and not cfg.reward.functions and cfg.reward.path is None:
        weights = dict(cfg.reward.weights)
        m.null("reward", f"no python reward or reward model: reward.weights is {weights}" if weights
                           else f"objective={objective_class(cfg).name} reads no reward")
        return
    from align.rewards.combine import function_specs
    from align.rewards.function import function_key, load_function
    from align.rewards.model_reward import MODEL, file_identity

    specs = function_specs(cfg.reward.function, cfg.reward.functions)  # preflight's imports, reused
    record = {n: load_function(s, function_key(n)).identity() for n, s in specs.items()}
    if cfg.reward.path is not None:
        record[MODEL] = file_identity(cfg.reward.path)
    m.set("reward", record)
