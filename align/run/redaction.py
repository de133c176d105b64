"""Redaction: credentials never reach the manifest, logs, the run dir's `.hydra/` or W&B.

A value is a credential when its NAME is a credential's name or when the value has a credential's
SHAPE. Names are compared as whole words after folding case and camelCase (`apiKey` is `api_key`):
exactly `password`, `secret`, `api_key`, `token`, `hf_token`, `wandb_api_key`, ... (`CREDENTIAL_NAMES`),
or ending in `_password`, `_secret`, `_api_key`, `_token`, ... (`CREDENTIAL_SUFFIXES`: `db_password`,
`HF_TOKEN`, `GITHUB_TOKEN`). A word merely containing KEY or TOKEN is configuration (`data.tokens_field`,
`sampler.max_tokens`, `cache_key`): redacting it would make the recorded config unable to replay the
run. A `*_token` that holds an integer id or a bracketed marker (`pad_token: "<pad>"`) is a tokenizer
setting, not a credential. Shapes (`CREDENTIAL_SHAPES`) catch a key under any name: `hf_...`,
`sk-...`, GitHub, Slack and AWS key ids, JWTs, and W&B's 40-hex API keys (a 40-hex value under a
name that says sha/commit/revision/hash is a digest, and kept).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

REDACTED = "<redacted>"

CREDENTIAL_NAMES = frozenset({
    "password", "passwd", "secret", "api_key", "apikey", "token", "access_token", "auth_token", "api_token",
    "bearer_token", "refresh_token", "hf_token", "wandb_api_key", "client_secret", "secret_key", "private_key",
    "access_key", "secret_access_key",
})
CREDENTIAL_SUFFIXES = ("_password", "_passwd", "_secret", "_api_key", "_apikey", "_secret_key", "_private_key",
                       "_access_key", "_token")
CREDENTIAL_SHAPES = re.compile("|".join((
    r"\bhf_[A-Za-z0-9]{30,}",                      # Hugging Face
    r"\bsk-[A-Za-z0-9_-]{20,}",                    # OpenAI / Anthropic style secret keys
    r"\bgh[pousr]_[A-Za-z0-9]{36,}|\bgithub_pat_[A-Za-z0-9_]{22,}",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",             # Slack
    r"\bAKIA[0-9A-Z]{16}\b",                       # AWS access key id
    r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]+",  # JWT: base64 '{"' header and payload
)))
_WANDB_KEY = re.compile(r"(local-)?[0-9a-f]{40}")
_DIGEST_NAME = re.compile(r"sha|commit|revision|hash|digest|fingerprint", re.IGNORECASE)
_MARKER = re.compile(r"<[^<>\s]{1,30}>|\[[^\[\]\s]{1,30}\]")


def _words(name: str) -> str:
    """`wandbApiKey` / `WANDB-API-KEY` / `wandb_api_key` -> `wandb_api_key`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name)).replace("-", "_").lower()


def _is_int_like(value: Any) -> bool:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return True
    return isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def secret_name(leaf: str, value: Any = None) -> bool:
    """Whether `leaf` (the last part of a dotted name) names a credential, given what it holds."""
    w = _words(leaf)
    if w in CREDENTIAL_NAMES:
        return True
    if not w.endswith(CREDENTIAL_SUFFIXES):
        return False
    if w.endswith("_token") and (_is_int_like(value) or (isinstance(value, str) and _MARKER.fullmatch(value))):
        return False  # a tokenizer's special token or its id
    return True


def secret_shape(value: Any, leaf: str = "") -> bool:
    """Whether a string value looks like a credential whatever its name."""
    if not isinstance(value, str):
        return False
    if CREDENTIAL_SHAPES.search(value):
        return True
    return bool(_WANDB_KEY.fullmatch(value)) and not _DIGEST_NAME.search(leaf)


def is_secret(name: str, value: Any = None) -> bool:
    """Whether a value stored under `name` must be redacted (a numeric password is still a password)."""
    leaf = str(name).rsplit(".", 1)[-1]
    return secret_name(leaf, value) or secret_shape(value, leaf)


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
    return REDACTED if not sep and secret_shape(override) else override


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
    """The environment variables that belong in the manifest (credentials redacted), and the names
    that were redacted."""
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
