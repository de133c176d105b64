"""The plan's tests build the same tiny models and bundled tokenizer as the model-family tests."""

from tests.unit.models.conftest import build, tokenizer  # noqa: F401
