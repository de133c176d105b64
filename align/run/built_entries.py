"""What `RunRecord.built()` (align/run/record.py) writes once the trainer is built: what the model, the
compile switches and the data RESOLVED to, read from the built components (`BuiltModel.info`, the
encoded dataset's own provenance), in place of what `start()` could only know from the config."""

from __future__ import annotations

from typing import Any

from align.config import TrainConfig
from align.run.manifest import Manifest
from align.run.start_entries import is_moe


def record_model(m: Manifest, cfg: TrainConfig, info: dict[str, Any]) -> None:
    """The model's resolved entries from `BuiltModel.info`; what no entry names goes to `model.extra`."""
    from align.models.family import family_of

    keys = {
        "model_class": "model.class",
        "attn_implementation_resolved": "model.attn_implementation_resolved",
        "experts_implementation_resolved": "model.experts_implementation_resolved",
        "dtype": "model.dtype",
        "params_total": "model.params_total",
    }
    for src, dst in keys.items():
        if src in info:
            m.set(dst, info[src], f"{src} is null in BuiltModel.info")
        else:
            m.null(dst, f"BuiltModel.info has no {src}")
    if m.data["model"]["experts_implementation_resolved"] is None and not is_moe(cfg):
        m.null(
            "model.experts_implementation_resolved",
            f"{family_of(cfg.model).value} is a dense family: no experts kernel",
        )
    known = set(keys) | {
        "family",
        "preset",
        "pretrained",
        "attn_implementation_requested",
        "experts_implementation_requested",
        "compile_choice",
        "sampler_budget",
        "run_length",
        "loss_chunk",
        "memory_budget",
    }
    m.set("model.extra", {k: v for k, v in info.items() if k not in known | {"weights"}})
    m.set("model.weights", info.get("weights"), "random init from a preset: no checkpoint loaded")


def record_compile(m: Manifest, choice: dict[str, Any]) -> None:
    """What the compile switches resolved to (the trainer's `compile_choice`); frames over the count: at the end."""
    for key in ("trainer", "optimizer", "loss", "expected_compiles_per_frame"):
        m.set(f"compile.{key}", choice.get(key), "dynamic=false compiles a graph per shape: no count to expect")
    m.set("compile.recompile_limit", choice.get("recompile_limit"),
          "the blocks do not compile and the optimizer step sets no limit")
    m.set("compile.inductor_cache", choice.get("inductor_cache"), "nothing compiles in this run")
    off = "nothing compiles in this run" if choice.get("inductor_cache") is None else \
        "trainer.compile_artifacts is null"
    m.set("compile.artifacts", choice.get("artifacts"), off)
    m.set("compile.memory_budget", choice.get("memory_budget"), "trainer.compile is off: no partitioner runs")
    m.null("compile.frames_over_expected", "pending: read at the end of the run")


def record_data(m: Manifest, data: dict[str, Any], sampler: dict[str, Any]) -> None:
    """The data as encoded (stats, the encoded dataset's own provenance, every file it read) and the sampler's stats."""
    m.set("data.encode_stats", data["stats"] or {}, "the encoded dataset reports no stats")
    # The encoded dataset's own provenance (align.data.encode_cache: `.meta`) is what the run actually
    # used, cache hit or miss: prefer it to what start() computed from the files.
    meta = data["meta"] or {}
    m.set("data.encode_meta", meta or None, "the encoded dataset carries no .meta (no encode cache in this build)")
    m.set("data.format", meta.get("formats"), "the encoded dataset does not say which record format it read")
    for src, key in (
        ("encode_cache_key", "data.encode_cache_key"),
        ("tokenizer_sha256", "data.tokenizer_sha256"),
        ("chat_template_sha256", "data.chat_template_sha256"),
    ):
        if meta.get(src) is not None:
            m.set(key, meta[src])
    aux = dict(m.data["data"]["aux_files"] or {})
    for f in [*meta.get("sources", []), *meta.get("aux_files", [])]:
        if isinstance(f, dict) and f.get("path") and f.get("sha256"):
            aux[str(f["path"])] = f["sha256"]
    m.set("data.aux_files", aux)
    m.set("sampler.stats", sampler)
