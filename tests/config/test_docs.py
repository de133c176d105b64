"""docs/configuration.md is generated from the schemas; it must match what the code says now."""

from align.tools.docs import OUT, render


def test_configuration_reference_is_up_to_date():
    assert OUT.read_text() == render(), "run `python -m align.tools.docs` and commit docs/configuration.md"
