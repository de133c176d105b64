"""What a completion is scored for, per task: answers by a verifier (gsm8k), or the refusal classifier.

A scorer turns (item, completion text) into the fields a sample carries, and per-prompt samples into
the arm's metrics; its identity goes into the eval cache key.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import align.evaluation.refusal as refusal
from align.evaluation.config import EvalConfig, EvalTask
from align.evaluation.datasets import Item
from align.evaluation.metrics import accuracy_metrics
from align.rewards import Verifier, get_verifier


class Scorer(Protocol):
    kind: str

    def identity(self) -> dict[str, Any]: ...

    def score(self, item: Item, text: str) -> dict[str, Any]: ...

    def metrics(self, samples: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
        """From each prompt's list of scored samples (all prompts hold the same number)."""
        ...


class AnswerScorer:
    kind = "verifier"

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier

    def identity(self) -> dict[str, Any]:
        return self.verifier.identity()

    def score(self, item: Item, text: str) -> dict[str, Any]:
        s = self.verifier.score(text, item.reference)
        return {"value": s.value, "extracted": s.extracted, "reference": s.reference}

    def metrics(self, samples: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
        return accuracy_metrics([[s["extracted"] for s in per] for per in samples],
                                [[s["value"] == 1.0 for s in per] for per in samples])


class RefusalScorer:
    kind = "classifier"

    def identity(self) -> dict[str, Any]:
        return refusal.identity()

    def score(self, item: Item, text: str) -> dict[str, Any]:
        c = refusal.classify(text)
        return {"verdict": c.verdict.value, "matched": c.matched, "empty": c.empty}

    def metrics(self, samples: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
        flat = [refusal.Classification(refusal.Verdict(s["verdict"]), s["matched"], s["empty"])
                for per in samples for s in per]
        return refusal.counts(flat)


def build_scorer(cfg: EvalConfig) -> Scorer:
    if cfg.task == EvalTask.refusal:
        return RefusalScorer()
    return AnswerScorer(get_verifier(cfg.verifier, "eval.verifier"))
