"""Credential-named values are redacted wherever align records or echoes config and environment."""

from __future__ import annotations

import pytest

from align.errors import ConfigError
from align.secrets import REDACTED, is_secret, recorded_env, redact, redact_argv


@pytest.mark.parametrize("name", ["HF_TOKEN", "wandb_api_key", "db.password", "MY_SECRET", "apiKey", "access_token", "passwd"])
def test_credential_names_are_secret(name):
    assert is_secret(name, "x")
    assert is_secret(name, 123456)  # a numeric password is still a password


@pytest.mark.parametrize("name,value", [("pad_token_id", 0), ("eos_token_ids", [1, 2]), ("bos_token_id", None),
                                        ("max_tokens", 4096), ("lr", "x"), ("monkey_business", None)])
def test_configuration_that_only_looks_like_a_credential_is_kept(name, value):
    # `monkey` contains KEY: over-redaction is the safe side, so only the int token ids/counts are exempt
    assert is_secret(name, value) == (name == "monkey_business")


def test_string_valued_token_id_is_still_redacted():
    assert is_secret("pad_token_id", "sk-live-abc")


def test_redact_nested_config_collects_names_never_values():
    found: list[str] = []
    out = redact({"logger": {"api_key": "sk-1", "project": "p"}, "model": {"overrides": {"pad_token_id": 0}},
                  "xs": [{"token": "t"}]}, found=found)
    assert out["logger"] == {"api_key": REDACTED, "project": "p"}
    assert out["model"]["overrides"]["pad_token_id"] == 0
    assert out["xs"][0]["token"] == REDACTED
    assert sorted(found) == ["logger.api_key", "xs[0].token"]
    assert "sk-1" not in repr(found)


def test_redact_argv():
    assert redact_argv(["+logger.api_key=sk-1", "model=olmoe", "~x.password=1", "model.overrides.pad_token_id=3"]) == [
        f"+logger.api_key={REDACTED}", "model=olmoe", f"~x.password={REDACTED}", "model.overrides.pad_token_id=3"]


def test_recorded_env_redacts_and_ignores_unrelated():
    env, found = recorded_env({"HF_TOKEN": "hf_abc", "CUDA_VISIBLE_DEVICES": "0", "WANDB_API_KEY": "w",
                               "MY_PASSWORD": "p", "HOME": "/root"})
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": REDACTED, "WANDB_API_KEY": REDACTED}
    assert found == ["HF_TOKEN", "WANDB_API_KEY"]


def test_config_error_never_echoes_a_credential_value():
    assert "sk-live" not in str(ConfigError("logger.api_key", "bad", "sk-live-123"))
    assert "(got 3)" in str(ConfigError("trainer.max_steps", "bad", 3))
