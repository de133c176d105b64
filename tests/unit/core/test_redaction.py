"""Credentials are redacted wherever align records or echoes config and environment: by their name
(a credential's name, not any word containing KEY or TOKEN) or by their shape."""

from __future__ import annotations

import pytest

from align.core.redaction import REDACTED, is_secret, recorded_env, redact, redact_argv
from align.errors import ConfigError

HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cD1eF3g"
SK = "sk-proj-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
WANDB = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("name", ["HF_TOKEN", "wandb_api_key", "WANDB_API_KEY", "db.password", "MY_SECRET", "apiKey",
                                  "access_token", "passwd", "logger.api_key", "GITHUB_TOKEN", "secret", "token",
                                  "client_secret", "HUGGING_FACE_HUB_TOKEN"])
def test_credential_names_are_secret(name):
    assert is_secret(name, "x") and is_secret(name, "123456")


@pytest.mark.parametrize("name", ["password", "db.password", "api_key"])
def test_a_numeric_password_is_still_a_password(name):
    assert is_secret(name, 123456)


@pytest.mark.parametrize("name,value", [
    ("data.tokens_field", "input_ids"), ("tokens_field", "tokens"), ("pad_token_id", 0), ("eos_token_ids", [1, 2]),
    ("bos_token_id", None), ("max_tokens", 4096), ("sampler.max_tokens", 4096), ("cache_key", "abc"),
    ("monkey_business", "x"), ("keep_last", 3), ("lr", "x"), ("pad_token", "<pad>"), ("eos_token", "<|end|>"),
    ("mask_token", "[MASK]"), ("image_token", 7), ("git.commit", WANDB), ("model.revision", WANDB),
    ("key", "value"), ("tokenizer", "/ckpt"), ("secret_santa_count", 3),
])
def test_configuration_whose_name_contains_a_credential_word_is_kept(name, value):
    assert not is_secret(name, value)


@pytest.mark.parametrize("value", [HF, SK, JWT, WANDB, "local-" + WANDB, "ghp_" + "a" * 36, "AKIA" + "ABCDEFGHIJKLMNOP",
                                   f"https://user:{HF}@example.com/repo"])
def test_credential_shaped_values_are_secret_under_any_name(value):
    assert is_secret("logger.notes", value) and is_secret("data.tokens_field", value)


def test_a_credential_in_a_token_slot_is_still_redacted():
    assert is_secret("pad_token_id", SK) and is_secret("pad_token", "sk-live-abc-not-a-marker")


def test_redact_nested_config_collects_names_never_values():
    found: list[str] = []
    out = redact({"logger": {"api_key": "sk-1", "project": "p"}, "model": {"overrides": {"pad_token_id": 0}},
                  "data": {"tokens_field": "input_ids"}, "xs": [{"token": "t"}, {"note": HF}]}, found=found)
    assert out["logger"] == {"api_key": REDACTED, "project": "p"}
    assert out["model"]["overrides"]["pad_token_id"] == 0 and out["data"]["tokens_field"] == "input_ids"
    assert out["xs"] == [{"token": REDACTED}, {"note": REDACTED}]
    assert sorted(found) == ["logger.api_key", "xs[0].token", "xs[1].note"]
    assert "sk-1" not in repr(found)


def test_redact_argv():
    assert redact_argv(["+logger.api_key=sk-1", "model=olmoe", "~x.password=1", "model.overrides.pad_token_id=3",
                        "data.tokens_field=ids", f"logger.project={HF}", HF]) == [
        f"+logger.api_key={REDACTED}", "model=olmoe", f"~x.password={REDACTED}", "model.overrides.pad_token_id=3",
        "data.tokens_field=ids", f"logger.project={REDACTED}", REDACTED]


def test_recorded_env_redacts_and_ignores_unrelated():
    env, found = recorded_env({"HF_TOKEN": "hf_abc", "CUDA_VISIBLE_DEVICES": "0", "WANDB_API_KEY": "w",
                               "MY_PASSWORD": "p", "HOME": "/root", "WANDB_NOTES": SK,
                               "TOKENIZERS_PARALLELISM": "false"})
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": REDACTED, "WANDB_API_KEY": REDACTED,
                   "WANDB_NOTES": REDACTED, "TOKENIZERS_PARALLELISM": "false"}
    assert found == ["HF_TOKEN", "WANDB_API_KEY", "WANDB_NOTES"]


def test_config_error_never_echoes_a_credential_value():
    assert "sk-live" not in str(ConfigError("logger.api_key", "bad", "sk-live-123"))
    assert "(got 3)" in str(ConfigError("trainer.max_steps", "bad", 3))
    assert "(got 'nope')" in str(ConfigError("data.tokens_field", "bad", "nope"))


def test_a_list_element_is_redacted_by_its_shape_and_a_rate_per_token_is_kept():
    found: list[str] = []
    out = redact({"logger": {"tags": ["baseline", HF]}, "throughput": {"flops_per_token": 1.5e9}}, found=found)
    assert out == {"logger": {"tags": ["baseline", REDACTED]}, "throughput": {"flops_per_token": 1.5e9}}
    assert found == ["logger.tags[1]"]
    assert is_secret("db_token", "x") and is_secret("password", 1.5)  # a string under *_token, any password


def test_a_record_as_written_names_what_was_redacted_beside_what_it_already_named():
    from align.core.redaction import redact_record

    out = redact_record({"run": {"name": HF}, "redacted": ["env:HF_TOKEN"], "seed": 0})
    assert out == {"run": {"name": REDACTED}, "redacted": ["env:HF_TOKEN", "run.name"], "seed": 0}


def test_every_log_handler_writes_a_line_with_the_credential_shapes_replaced():
    import io
    import logging

    from align.core.redaction import redact_logs, redact_text

    assert redact_text(f"resumed from /runs/{SK}/step_2 (commit {WANDB})") == \
        f"resumed from /runs/{REDACTED}/step_2 (commit {WANDB})"  # a 40-hex word in a line may be a commit
    logger, stream = logging.getLogger("test.redaction"), io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        redact_logs(logger)
        redact_logs(logger)  # once per handler
        assert len(handler.filters) == 1
        logger.warning("loading %s from %s", "weights", f"/ckpt/{HF}")
        assert stream.getvalue() == f"loading weights from /ckpt/{REDACTED}\n"
    finally:
        logger.removeHandler(handler)
