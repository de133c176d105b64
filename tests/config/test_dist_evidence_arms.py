"""scripts/dist_evidence.py's runs compose and pass the config checks (a GPU run of the script found its
one-process reference refused for a sharded layout's key, and every parity then compared nothing)."""

from __future__ import annotations

import importlib.util

import pytest

from align.config import to_typed
from tests.conftest import REPO


def _script():
    spec = importlib.util.spec_from_file_location("dist_evidence", REPO / "scripts" / "dist_evidence.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ranks", [1, 2])
def test_every_parity_arm_composes_and_passes_the_config_checks(compose, ranks):
    script = _script()
    base = [*script.OLMOE_SHAPE, "trainer.device=cuda", *script.COMMON]
    arms = script.parity_arms(base, ranks)
    assert set(arms) == ({"single", "fsdp", "ep"} if ranks >= 2 else {"single", "fsdp"})
    for overrides in arms.values():
        to_typed(compose(overrides))  # a refusal raises ConfigError naming the key
