"""pass@k and maj@k over n scored samples per prompt.

pass@k is the unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models Trained on
Code": with n samples of which c are correct, the probability that k of them drawn without
replacement hold at least one correct one, 1 - C(n-c, k) / C(n, k), computed as a product so large
n does not overflow. Averaged over prompts.

maj@k is majority voting over the answers the verifier extracted from the first k samples of a prompt:
the most frequent extracted answer wins (a tie goes to the answer seen first); samples with no
extracted answer do not vote, and a prompt where none has one counts as wrong. The prompt is correct
when the winning answer's samples were scored correct (the verdict of the first of them: a verifier
gives one extracted answer one verdict against one reference).
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_correct(extracted: Sequence[Optional[str]], correct: Sequence[bool]) -> bool:
    """Whether the majority answer among these samples is a correct one."""
    votes = Counter(a for a in extracted if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(a for a in extracted if a is not None and votes[a] == top)  # first seen among the tied
    return bool(correct[list(extracted).index(winner)])


def ks_for(n: int) -> list[int]:
    """The k reported for n samples: 1, the powers of two below n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def accuracy_metrics(extracted: Sequence[Sequence[Optional[str]]], correct: Sequence[Sequence[bool]]) -> dict:
    """pass@k for every k of `ks_for(n)`, maj@k for k > 1, and the per-sample extraction failure rate,
    from per-prompt lists of n extracted answers and verdicts."""
    if not correct:
        raise ValueError("no prompts to score")
    n = len(correct[0])
    if any(len(c) != n for c in correct) or len(extracted) != len(correct):
        raise ValueError("every prompt needs the same number of samples")
    out: dict[str, float] = {}
    for k in ks_for(n):
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(c), k) for c in correct) / len(correct)
        if k > 1:
            out[f"maj@{k}"] = sum(majority_correct(e[:k], c[:k]) for e, c in zip(extracted, correct)) / len(correct)
    out["accuracy"] = sum(sum(c) for c in correct) / (n * len(correct))
    out["extraction_failed"] = sum(a is None for e in extracted for a in e) / (n * len(extracted))
    return out
