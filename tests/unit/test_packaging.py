"""pyproject.toml lists align's packages by hand (conf/ is mapped into the wheel as align.conf, which
`packages.find` cannot add): a subpackage left out of the list would be missing from every install."""

from __future__ import annotations

import tomllib

from tests.conftest import REPO


def test_every_subpackage_of_align_and_the_configs_are_packaged():
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "align").rglob("__init__.py")}
    assert set(setup["packages"]) == on_disk | {"align.conf"}
    assert setup["package-dir"] == {"align.conf": "conf"}
    assert "**/*.yaml" in setup["package-data"]["align.conf"]
