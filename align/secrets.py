"""Redaction: values whose NAME looks like a credential never reach the manifest, logs or W&B.

A name is secret when it contains KEY, TOKEN, SECRET or PASSWORD (any case, anywhere: `HF_TOKEN`,
`wandb_api_key`, `db.password`). The one exception is the tokenizer's integer ids (`pad_token_id`,
`eos_token_ids`, ...) and token counts (`max_tokens`): they match TOKEN but are configuration that
provenance must keep, and an int id or count is not a string credential. Everything else that matches is replaced by REDACTED,
whatever its type (a numeric password is still a password).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
_TOKEN_ID = re.compile(r"token_ids?$|tokens$", re.IGNORECASE)


def _is_int_like(value: Any) -> bool:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return True
    return isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def is_secret(name: str, value: Any = None) -> bool:
    """Whether a value stored under `name` must be redacted."""
    leaf = str(name).rsplit(".", 1)[-1]
    if not SECRET_NAME.search(leaf):
        return False
    return not (_TOKEN_ID.search(leaf) and _is_int_like(value))


def redact(obj: Any, path: str = "", found: list[str] | None = None) -> Any:
    """A copy of a nested dict/list with every secret-named value replaced; `found` collects the
    dotted names that were redacted (names only, never values)."""
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            key = f"{path}.{k}" if path else str(k)
            if is_secret(str(k), v):
                out[k] = REDACTED
                if found is not None:
                    found.append(key)
            else:
                out[k] = redact(v, key, found)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v, f"{path}[{i}]", found) for i, v in enumerate(obj))
    return obj


def redact_override(override: str) -> str:
    """`a.b.api_key=xyz` -> `a.b.api_key=<redacted>`; Hydra overrides are `[+~]key=value` strings."""
    key, sep, value = override.partition("=")
    if sep and is_secret(key.lstrip("+~"), _parse_scalar(value)):
        return f"{key}={REDACTED}"
    return override


def _parse_scalar(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def redact_argv(argv: list[str]) -> list[str]:
    return [redact_override(a) for a in argv]


# Environment variables worth recording: they change what runs (devices, threads, comms, caches).
ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "HF_", "TRANSFORMERS_", "WANDB_",
                "ALIGN_", "SLURM_", "MASTER_", "TORCHELASTIC_")
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TOKENIZERS_PARALLELISM")


def recorded_env(environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment variables that belong in the manifest (secret-named ones redacted), and the
    names that were redacted."""
    environ = os.environ if environ is None else environ
    found: list[str] = []
    env: dict[str, str] = {}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES:
            if is_secret(name, environ[name]):
                env[name] = REDACTED
                found.append(name)
            else:
                env[name] = environ[name]
    return env, found
