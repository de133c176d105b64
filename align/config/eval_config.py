"""Schema of one evaluation (the `eval` group, conf/eval/<name>.yaml): read by `python -m align.eval`
(align/evaluation/config.py builds its root on it) and by the trainer's in-training eval
(`eval=gsm8k trainer.eval_every=N`). It lives here, with the other schemas, so the training config
needs no import of align.evaluation (which imports the generation stack)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from align.config.rules import _require


class EvalTask(StrEnum):
    gsm8k = "gsm8k"
    """Score each completion's answer against the record's reference with `eval.verifier`."""
    refusal = "refusal"
    """Classify each completion as a hard refusal, a deflection or compliance (align/evaluation/refusal.py)."""


@dataclass
class EvalConfig:
    """One evaluation (the `eval` group: conf/eval/<name>.yaml)."""

    task: EvalTask = EvalTask.gsm8k
    """What a completion is scored for: gsm8k (answer correctness) or refusal (three-way classification)."""
    prompts: Optional[str] = None
    """A local JSONL file, one JSON object per line holding `prompt_field` (and `reference_field` for
    gsm8k). null: the bundled GSM8K test split (task gsm8k only)."""
    prompt_field: str = "question"
    """Record field holding the prompt text."""
    reference_field: str = "answer"
    """Record field holding the reference answer (task gsm8k); the verifier must be able to read it."""
    id_field: Optional[str] = None
    """Record field holding a stable id; null: the line number."""
    template: str = "{prompt}"
    """The user message: `{prompt}` is replaced by the prompt text; the model's own chat template then
    renders the conversation with the assistant turn opened."""
    verifier: str = "gsm8k"
    """Verifier of task gsm8k, by its name in align/rewards (gsm8k, math, format, exact_int)."""
    limit: Optional[int] = None
    """Evaluate only the first N records (null: all)."""
    samples: int = 1
    """Completions per prompt (n). 1: greedy pass@1; n > 1: sampled, reporting pass@k and maj@k."""
    temperature: Optional[float] = None
    """Sampling temperature; null: 0 (greedy) when samples=1, else 1.0. 0 with samples > 1 is refused."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1 keeps every token); sampled runs only."""
    top_k: int = 0
    """Keep the top_k most probable tokens (0 keeps all); sampled runs only."""
    max_new_tokens: int = 512
    """Most tokens generated per completion."""
    seed: int = 0
    """Seed of the sampled draws (and of the shuffled oracle's pairing)."""
    oracle: bool = False
    """Score the references themselves as the completions, without any model: must score 100%; a
    run that cannot is a broken pipeline, not a weak model (task gsm8k only)."""
    oracle_shuffle: bool = False
    """With `oracle`: pair each record with another record's reference (a seeded derangement), the
    control that must score about the chance rate of equal answers."""
    compare_to: Optional[str] = None
    """A second model (export or checkpoint dir, e.g. the base of a tuned `model_dir`) run through the
    same code with the same settings; the report holds both columns."""
    cache: bool = True
    """Reuse a finished arm from `cache_dir` when everything that gives its results their meaning is
    unchanged (weights, tokenizer, generation settings, data, scorer, template)."""
    cache_dir: Optional[str] = None
    """Eval cache directory, one JSON file per key; null: `eval/` in align's cache directory
    ($ALIGN_CACHE_DIR, else $XDG_CACHE_HOME/align, else ~/.cache/align)."""

    def __post_init__(self) -> None:
        _require("{prompt}" in self.template, "eval.template", "must contain {prompt}", self.template)
        _require(self.limit is None or self.limit >= 1, "eval.limit", "must be >= 1 or null", self.limit)
        _require(self.samples >= 1, "eval.samples", "must be >= 1", self.samples)
        _require(self.max_new_tokens >= 1, "eval.max_new_tokens", "must be >= 1", self.max_new_tokens)
        _require(self.seed >= 0, "eval.seed", "must be >= 0", self.seed)
        if self.temperature is not None:
            _require(self.temperature >= 0, "eval.temperature", "must be >= 0 (0 decodes greedily)", self.temperature)
            _require(self.temperature > 0 or self.samples == 1, "eval.temperature",
                     f"0 decodes greedily: eval.samples={self.samples} would repeat one completion", self.temperature)
        _require(0 < self.top_p <= 1, "eval.top_p", "must be in (0, 1]", self.top_p)
        _require(self.top_k >= 0, "eval.top_k", "must be >= 0 (0 keeps every token)", self.top_k)
        if self.resolved_temperature == 0:
            _require(self.top_p == 1 and self.top_k == 0, "eval.top_p", "greedy decoding (samples=1, temperature "
                     "null or 0) takes no top_p/top_k; set eval.temperature > 0 to sample", (self.top_p, self.top_k))
        _require(not self.oracle_shuffle or self.oracle, "eval.oracle_shuffle", "needs eval.oracle=true", True)
        if self.task == EvalTask.refusal:
            _require(bool(self.prompts), "eval.prompts", "is required for eval=refusal: a JSONL file of prompts")
            _require(not self.oracle, "eval.oracle", "needs references to score: eval=refusal has none", True)
        if self.oracle:
            _require(self.compare_to is None, "eval.compare_to", "an oracle run scores references, not models")

    @property
    def resolved_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.0 if self.samples == 1 else 1.0
