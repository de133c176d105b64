"""What every verifier returns and promises: a Score per (completion, reference), a VERSION."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Optional


class BadReference(ValueError):
    """A reference answer the verifier cannot read: a data error, not a wrong completion. Callers check
    references up front (`Verifier.normalize_reference`) and refuse the data before any generation."""


@dataclass(frozen=True)
class Score:
    value: float
    """A verifier's: in [0, 1], 1.0 when the completion's answer matches the reference. A python reward's
    (the Reward's part by the function's name): the finite number the function returned."""
    extracted: Optional[str]
    """The answer read from the completion, as compared (what an eval report shows); None: none found."""
    reference: str
    """The reference as compared, after the verifier's normalisation."""

    @property
    def extraction_failed(self) -> bool:
        return self.extracted is None

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "extracted": self.extracted, "reference": self.reference,
                "extraction_failed": self.extraction_failed}


class Verifier(ABC):
    """Scores one completion against one reference. Stateless: one instance serves every caller."""

    name: ClassVar[str]
    VERSION: ClassVar[int]
    """Bumped whenever a verdict, an extracted answer or a normalised reference can change; it goes into
    the keys of anything cached from scores (tests/unit/rewards/test_versions.py pins it to behaviour)."""
    VALUES: ClassVar[tuple[float, ...]] = (0.0, 1.0)
    """Every `Score.value` this verifier can return: a reward of verifiers that can give one value only
    is the same for every completion, which the config refuses under GRPO (align/objectives/advantages.py)."""

    def identity(self) -> dict[str, Any]:
        """What a cache key must hold so that a cached score means the same thing."""
        return {"name": self.name, "version": self.VERSION}

    @abstractmethod
    def normalize_reference(self, reference: str) -> str:
        """The reference as this verifier compares it; BadReference when it cannot be read."""

    @abstractmethod
    def score(self, completion: str, reference: str) -> Score:
        """Score `completion` against `reference`; BadReference when the reference cannot be read."""
