"""The run manifest, `provenance.json`: what the run RESOLVED to, never only what it requested.

Written at start with EVERY key of `SCHEMA` present (present-and-null: a null leaf always carries a
reason in `null_reasons`), updated once the components are built, completed in a `finally` with the
exit code, then made read-only and never edited: corrections go in PROVENANCE-NOTE.md beside it
(`python -m align.tools.annotate`). docs/provenance.md.

This module imports neither torch nor transformers at import time: preflight uses its git and
hashing helpers (align/core/hashing.py) before anything heavy is loaded.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from align.core.hashing import canonical_json, config_hash
from align.core.provenance import MANIFEST, GitState, now

SCHEMA_VERSION = 3
PENDING = "pending: not known yet when this was written"

# Every key a manifest has, nested as written; a leaf's value here documents it. docs/provenance.md
# quotes this table. Adding a key: add it here (and set it where it becomes known); tests compare
# every manifest's key set against this.
SCHEMA: dict[str, Any] = {
    "schema_version": "integer version of this schema; bumped when a key changes meaning",
    "status": "started (written before any heavy work), built (components resolved) or complete (final, read-only)",
    "run": {
        "name": "run name (config `name`, else the run dir's name)",
        "run_dir": "absolute run dir",
        "argv": "command line (secret-named overrides redacted)",
        "hydra_overrides": "Hydra task overrides of this job (redacted)",
        "host": "hostname",
        "pid": "process id of rank 0",
        "start_time": "UTC ISO time the manifest was started",
        "end_time": "UTC ISO time the run ended",
        "exit_code": ("process exit code: 0 done, 2 config/preflight refused, 81 non-finite, 143 signal "
                      "(docs/architecture.md#exit-codes)"),
        "exit_reason": "one line: why the run ended",
    },
    "config": {
        "hash": "sha256 of the canonical JSON of the resolved (redacted) config",
        "resolved": "the resolved config, secret-named values redacted",
    },
    "git": {
        "root": "top of the git checkout the align code ran from",
        "commit": "HEAD commit",
        "describe": "`git describe --always --dirty`",
        "branch": "current branch (null when detached)",
        "dirty": "tracked or staged changes present",
        "diff_sha256": "sha256 of `git diff HEAD --binary` when dirty",
        "allow_dirty": "whether the run was allowed to start dirty",
    },
    "versions": {
        "python": "", "align": "", "torch": "", "cuda": "CUDA runtime torch was built with", "cudnn": "",
        "transformers": "", "hydra": "", "omegaconf": "", "bitsandbytes": "", "torchao": "", "peft": "",
        "wandb": "", "safetensors": "", "tokenizers": "", "numpy": "", "huggingface_hub": "",
    },
    "device": {
        "type": "cpu or cuda",
        "name": "device name (GPU model or CPU)",
        "capability": "CUDA compute capability, e.g. [9, 0]",
        "count": "visible devices of this type",
    },
    "parallel": {
        "kind": "config parallel.kind",
        "world_size": "processes in the job",
    },
    "model": {
        "family": "the family built (model=hf: the one its checkpoint's model_type picks, else hf)",
        "class": "transformers class built", "preset": "", "pretrained": "local checkpoint dir",
        "attn_implementation_requested": "what the config asked for",
        "attn_implementation_resolved": "model.config._attn_implementation after build",
        "experts_implementation_requested": "",
        "experts_implementation_resolved": "model.config._experts_implementation",
        "sdpa_kernel_family": "flash, efficient, cudnn or math: from profiler kernel names of one forward (GPU)",
        "sdpa_kernels": "attention kernel symbols seen by the profiler (their sm suffix is the generation)",
        "dtype": "parameter dtype", "autocast_dtype": "compute dtype under autocast (null: none)",
        "params_total": "", "extra": "other fields the model build reported (BuiltModel.info)",
        "weights": "model.pretrained's load (align.models.checkpoint_fit): tensors loaded, missing, unexpected, "
        "mismatched (each 0 once accepted), allowed_missing (tied: name -> the tensor it is; non_persistent_buffers)",
    },
    "data": {
        "source": "", "path": "data file read",
        "sha256": "sha256 of the data file content",
        "format": "{source: {format, chosen_by (detected or the key that named it), file kind}} (docs/data.md)",
        "aux_files": "{path: sha256} of every auxiliary file that shapes the data (content, not path)",
        "tokenizer_sha256": "sha256 over the tokenizer files' content",
        "chat_template_sha256": "sha256 of the chat template text",
        "encode_cache_key": "key of the encode cache entry used",
        "encode_cache_dir": "the encode cache's directory and its source (data.cache_dir, $ALIGN_CACHE_DIR, ...)",
        "encode_meta": "the encoded dataset's own provenance (.meta): cache hit, entry, encode version, "
        "per-source hashes",
        "encode_stats": "records in/kept/dropped/truncated, tokens, loss tokens",
    },
    "sampler": {
        "kind": "",
        "stats": "padding waste and zero-pad micro-batches of epoch 0, micro-batches per epoch",
    },
    "sampler_budget": "sampler.max_tokens under sampler=budget: requested (an int or auto), resolved (int) and why; "
    "null when the sampler takes no budget",
    "run_length": "the run's optimizer steps: max_steps, the key that decided it (trainer.max_steps or epochs), "
    "and under epochs each epoch's micro-batches per rank from the sampler's plan",
    "loss_chunk": "trainer.loss_chunk_tokens: requested (an int or auto), resolved (int) and why",
    "memory_budget": "trainer.compile_memory_budget: requested (null, auto or 0..1), resolved (null or 0..1) and why",
    "seed": "trainer.seed",
    "objective": "what the objective resolved to: kind, loss, reference strategy and identity (weights sha256, "
    "cache key and hit), the step-0 gate's report (null with a reason where it cannot apply)",
    "reward": "each python reward by the name reward.weights weighs it (reward.function: python; objective=grpo): "
    "its import path, the file that defines it, that file's sha256; the reward model (reward.path) as model: its "
    "dir, class, weight files' sha256, tokenizer's and chat template's sha256",
    "logger": "the tracker rank 0 logged to (logger=wandb, tensorboard, mlflow): where it wrote, its version",
    "mask_probe": "per layer type: mask None (fast path) or tensor, padded vs unpadded, band check result",
    "compile": {
        "trainer": "trainer.compile: requested (true, false, auto), resolved (bool) and why",
        "optimizer": "optimizer.compile: requested, resolved and why",
        "loss": "trainer.compile_loss: requested, resolved (bool: the chunked loss's elementwise passes compiled) "
        "and why",
        "inductor_cache": "the inductor/autotune cache directory this run used and where that came from",
        "artifacts": "trainer.compile_artifacts: the file, what was loaded from it before the first compile and "
        "what the run's end saved to it (artifact kinds and counts, bytes)",
        "memory_budget": "trainer.compile_memory_budget: requested (null or 0..1) and the value torch's partitioner "
        "was set to (read back), and why",
        "expected_compiles_per_frame": "graphs one frame may compile before the run warns (null: no bound)",
        "recompile_limit": "dynamo's per-frame recompile limit in force (raised to the expected count where lower)",
        "frames_over_expected": "compile counts of the frames that compiled more graphs than expected",
    },
    "dynamo": "torch._dynamo counters at the end: frames, unique graphs, graph breaks, recompiles, "
    "recompile-limit hits (frames left eager)",
    "throughput": "trainer.summary() at the end: steps, tokens, real tokens, ...",
    "preflight": "the pre-launch checklist as run for this config",
    "serving": "how the export can be served (align.run.serving): verdict, whether vLLM's class was read (`checked`, "
    "null fields beside `why`), and the training-memory estimate against the device (`viability`)",
    "env": "recorded environment variables (CUDA_*, NCCL_*, TORCH_*, HF_*, WANDB_*, ...; secret-named redacted)",
    "redacted": "names (never values) of config keys, overrides and env vars that were redacted",
    "null_reasons": "{dotted key: why it is null}; every null leaf has one",
}

# Leaves whose value is a mapping of arbitrary keys (not a nested group of the schema).
_GROUPS = {k for k, v in SCHEMA.items() if isinstance(v, dict)}


def key_paths(schema: Mapping[str, Any] = SCHEMA, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf of the schema."""
    out: list[str] = []
    for k, v in schema.items():
        p = f"{prefix}{k}"
        out.extend(key_paths(v, p + ".") if isinstance(v, dict) else [p])
    return out


def manifest_paths(manifest: Mapping[str, Any]) -> list[str]:
    """Dotted paths of a manifest, descending only into the schema's groups (leaf values may be dicts)."""
    out: list[str] = []
    for k, v in manifest.items():
        if k in _GROUPS and isinstance(v, dict):
            out.extend(f"{k}.{kk}" for kk in v)
        else:
            out.append(k)
    return out


def _get(m: Mapping[str, Any], path: str) -> Any:
    cur: Any = m
    for part in path.split("."):
        cur = cur[part]
    return cur


def _set(m: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur = m
    for part in parts[:-1]:
        cur = cur[part]
    if parts[-1] not in cur:
        raise KeyError(f"{path} is not a manifest key (add it to provenance.SCHEMA)")
    cur[parts[-1]] = value


def skeleton() -> dict[str, Any]:
    """A manifest with every key present and null, each null marked pending."""
    def empty(schema: Mapping[str, Any]) -> dict[str, Any]:
        return {k: empty(v) if isinstance(v, dict) else None for k, v in schema.items()}

    m = empty(SCHEMA)
    m["schema_version"] = SCHEMA_VERSION
    m["null_reasons"] = {p: PENDING for p in key_paths() if p not in ("schema_version", "null_reasons")}
    return m


def dynamo_counters() -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """torch._dynamo's counters: best effort, nullable, never raises. `recompiles` counts the compiles of
    a frame beyond its first; `graph_breaks` every break dynamo recorded (tests/unit/run/test_manifest.py
    forces one of each)."""
    try:
        if "torch._dynamo" not in sys.modules:
            return None, "torch._dynamo was never imported: nothing was compiled"
        from torch._dynamo.utils import counters

        breaks = counters.get("graph_break", {})
        out: dict[str, Any] = {
            "frames_total": int(counters["frames"].get("total", 0)),
            "frames_ok": int(counters["frames"].get("ok", 0)),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": {str(k).splitlines()[0][:200]: int(v) for k, v in list(breaks.items())[:20]},
            "recompiles": None,
            # A frame past dynamo's recompile limit runs eager from then on, silently but for a log line:
            # compiled blocks whose caches had filled ran as eager ones (docs/pitfalls.md#8).
            "recompile_limit_hits": int(sum(v for k, v in counters.get("unimplemented", {}).items()
                                            if str(k).startswith("Dynamo recompile limit exceeded"))),
        }
        try:  # per-frame compile counts: compiles beyond the first of a frame are recompiles
            from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER

            out["recompiles"] = int(sum(max(n - 1, 0) for n in FRAME_COMPILE_COUNTER.values()))
        except Exception:  # an internal that may move between torch releases
            pass
        return out, None
    except Exception as e:  # never let bookkeeping kill a run
        return None, f"could not read dynamo counters: {type(e).__name__}: {e}"


# ------------------------------------------------------------------------------------ manifest


class Manifest:
    """provenance.json of one run. Only the process that owns it (rank 0) writes; each write is
    atomic (tmp + rename); after `complete()` the file is read-only and this object refuses writes."""

    def __init__(self, run_dir: Path, enabled: bool = True, staging: Optional[Path] = None) -> None:
        self.run_dir = Path(run_dir)
        self.path = Path(staging or run_dir) / MANIFEST  # in `staging` until unstage() (align.run.record)
        self.enabled = enabled
        self.data = skeleton()
        self.closed = False

    # values
    def set(self, path: str, value: Any, reason: Optional[str] = None) -> None:
        """Set a leaf; a null needs a reason (present-and-null is a statement, not an accident)."""
        _set(self.data, path, value)
        if value is None:
            self.data["null_reasons"][path] = reason or PENDING
        else:
            self.data["null_reasons"].pop(path, None)

    def update(self, values: Mapping[str, Any], reasons: Mapping[str, str] | None = None) -> None:
        reasons = reasons or {}
        for path, value in values.items():
            self.set(path, value, reasons.get(path))

    def null(self, path: str, reason: str) -> None:
        self.set(path, None, reason)

    # files
    def write(self, status: str) -> None:
        if self.closed:
            raise RuntimeError(f"{self.path} is complete and read-only; annotate it instead "
                               "(python -m align.tools.annotate)")
        self.data["status"] = status
        self.data["null_reasons"].pop("status", None)
        if not self.enabled:
            return
        from align.core.redaction import redact_record

        data = redact_record(self.data)  # the rule of every written value, `run.name` too (align.core.redaction)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str, sort_keys=False) + "\n")
        os.replace(tmp, self.path)

    def start(self, name: str, argv: list[str], overrides: list[str], resolved: Mapping[str, Any],
              git: GitState, allow_dirty: bool, redacted: list[str], env: Mapping[str, str],
              preflight: list[dict]) -> None:
        self.update({
            "run.name": name, "run.run_dir": str(self.run_dir.resolve()), "run.argv": argv,
            "run.hydra_overrides": overrides, "run.host": socket.gethostname(), "run.pid": os.getpid(),
            "run.start_time": now(), "config.resolved": dict(resolved), "config.hash": config_hash(resolved),
            "env": dict(env), "redacted": list(redacted), "preflight": preflight,
        })
        self.record_git(git, allow_dirty)
        for path in ("run.end_time", "run.exit_code", "run.exit_reason"):
            self.null(path, "pending: the run has not ended")
        self.write("started")

    def record_git(self, git: GitState, allow_dirty: bool) -> None:
        self.set("git.allow_dirty", allow_dirty)
        for f in ("root", "commit", "describe", "branch", "dirty", "diff_sha256"):
            value = getattr(git, f)
            if value is None:
                why = {"branch": "detached HEAD", "diff_sha256": "tree is clean: no diff"}.get(f, "unknown")
                reason = git.reason or why
                self.null(f"git.{f}", reason)
            else:
                self.set(f"git.{f}", value)

    def unstage(self) -> None:
        """Move the manifest from its staging dir into the run dir (replacing an earlier attempt's)."""
        final = self.run_dir / MANIFEST
        if self.enabled and self.path != final and self.path.is_file():
            os.replace(self.path, final)
        self.path = final

    def complete(self, exit_code: int, reason: str) -> None:
        """Final write: exit code and reason, and every still-pending null says the run never got there."""
        self.update({"run.end_time": now(), "run.exit_code": int(exit_code), "run.exit_reason": reason})
        for path, why in list(self.data["null_reasons"].items()):
            if why.startswith("pending"):
                self.data["null_reasons"][path] = (f"not reached: the run ended (exit {exit_code}) "
                                                   "before this was recorded")
        self.write("complete")
        self.closed = True
        if self.enabled:
            os.chmod(self.path, 0o444)  # a gentle guard: corrections go in PROVENANCE-NOTE.md


def load(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / MANIFEST).read_text())


def flat(manifest: Mapping[str, Any], prefix: str = "provenance/") -> dict[str, Any]:
    """Scalar leaves as `provenance/<group>/<key>` for W&B's summary (dict/list leaves as JSON)."""
    out: dict[str, Any] = {}
    for path in manifest_paths(manifest):
        if path in ("config.resolved", "null_reasons", "env", "preflight"):
            continue
        v = _get(manifest, path)
        key = prefix + path.replace(".", "/")
        out[key] = v if v is None or isinstance(v, (str, int, float, bool)) else canonical_json(v)
    return out


def null_leaves(manifest: Mapping[str, Any]) -> Iterator[str]:
    for path in manifest_paths(manifest):
        if _get(manifest, path) is None:
            yield path


def gitstate_dict(g: GitState) -> dict[str, Any]:
    return asdict(g)


__all__ = ["SCHEMA", "SCHEMA_VERSION", "Manifest", "key_paths", "manifest_paths", "skeleton"]
