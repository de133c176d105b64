"""Rewards from verifiers combined with weights: {"gsm8k": 1.0, "format": 0.1} scores a completion as
1.0 * gsm8k + 0.1 * format. A plain weighted sum, not normalised: a negative weight is a penalty, and
a zero weight keeps a verifier in the record without letting it move the reward. Your own functions
(align/rewards/function.py) are weighted the same way, beside the verifiers: each of `reward.functions` by
its name, `reward.function` (the one-function shorthand) as `python`; a trained reward model (`reward.path`,
align/rewards/model_reward.py) as `model`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Collection, Mapping, Optional, Sequence

from align.errors import ConfigError
from align.rewards.function import NAME, ROW_STATISTICS, Group, PythonReward, function_key, load_function, split_spec
from align.rewards.model_reward import MODEL, ModelReward, file_identity
from align.rewards.registry import VERIFIERS, accepted, get_verifier
from align.rewards.verifier import Score, Verifier


@dataclass(frozen=True)
class Reward:
    total: float
    """The weighted sum of the parts' values."""
    parts: Mapping[str, Score]
    """Each verifier's, each function's and the reward model's own score, by the name it is weighted by."""


def function_specs(function: Optional[str] = None, functions: Optional[Mapping[str, Any]] = None) -> dict[str, str]:
    """Your functions by the name `reward.weights` weighs each by: `reward.function` as `python`, then each of
    `reward.functions`. ConfigError naming the key for a name a weight cannot tell from a verifier or from
    the step row's own statistics, or a spec that names no function (config time: nothing is imported)."""
    if functions is not None and not isinstance(functions, Mapping):
        raise ConfigError("reward.functions", "must map names to functions, e.g. {correct: mypkg.rewards:correct}",
                          functions)
    specs = {} if function is None else {NAME: function}
    for name, spec in (functions or {}).items():
        key = f"reward.functions.{name}"
        if name == NAME:
            raise ConfigError(key, f"{NAME} is the name of reward.function (the one-function shorthand): name this "
                              "function otherwise", spec)
        if name == MODEL:
            raise ConfigError(key, f"{MODEL} is the name of the reward model (reward.path): name this function "
                              "otherwise", spec)
        if name in VERIFIERS:
            raise ConfigError(key, f"clashes with the verifier {name}: reward.weights.{name} would weigh both; "
                              "name the function otherwise", spec)
        if not (isinstance(name, str) and name.isidentifier()) or name in ROW_STATISTICS:
            raise ConfigError(key, "a function's name must be an identifier other than the step row's own reward/ "
                              f"statistics ({', '.join(ROW_STATISTICS)})", spec)
        specs[name] = spec
    for name, spec in specs.items():
        split_spec(spec, function_key(name))
    return specs


def check_weights(weights: Any, key: str = "reward.weights", function: Optional[str] = None,
                  functions: Optional[Mapping[str, Any]] = None, model: Optional[str] = None) -> dict[str, str]:
    """The checks of WeightedReward that import nothing (config time): names, weights, and each function and
    the reward model (`model`: reward.path) weighted exactly when it is set. The functions' specs by name
    (`function_specs`); ConfigError naming the key otherwise."""
    specs = function_specs(function, functions)
    if not isinstance(weights, Mapping) or not weights:
        raise ConfigError(key, "must map verifier names to weights, e.g. {gsm8k: 1.0, format: 0.1}", weights)
    for name, w in weights.items():
        if name == NAME and NAME not in specs:
            raise ConfigError("reward.function", f"{key} weighs {NAME}: name your function, e.g. "
                              "reward.function=mypkg.rewards:score (docs/rewards.md)")
        if name == MODEL and model is None:
            raise ConfigError("reward.path", f"{key} weighs {MODEL}: name the reward model's export dir, e.g. "
                              "reward.path=/runs/rm/export (docs/rewards.md)")
        if name not in specs and name not in VERIFIERS and name != MODEL:
            fns = (f"a function's name ({', '.join(specs)})" if specs
                   else f"a name of reward.functions, {NAME} with reward.function")
            raise ConfigError(f"{key}.{name}", f"unknown verifier or function; accepted: {accepted()}, {fns}, or "
                              f"{MODEL} with reward.path", name)
        if isinstance(w, bool) or not isinstance(w, Real) or not math.isfinite(w):
            raise ConfigError(f"{key}.{name}", "weight must be a finite number", w)
    if function is not None and NAME not in weights:
        raise ConfigError("reward.function", f"is read only when {key} weighs {NAME} (reward=python sets "
                          f"{key}.{NAME}: 1.0)", function)
    if model is not None and MODEL not in weights:
        raise ConfigError("reward.path", f"is read only when {key} weighs {MODEL} (reward=model sets "
                          f"{key}.{MODEL}: 1.0)", model)
    for name in specs:
        if name not in weights:
            raise ConfigError(function_key(name), f"has no weight: set {key}.{name} (0 keeps its part in the "
                              "record without moving the reward)", specs[name])
    return specs


def constant_reward(weights: Mapping[str, float], functions: Collection[str] = ()) -> Optional[float]:
    """The reward every completion gets whatever it says, where the weights fix it (each verifier weighted
    0 or able to give one value only, `Verifier.VALUES`; each of `functions`, the names your functions are
    weighted by, and the reward model, weighted 0); None where it can vary. Reads the verifiers' declared
    values only: your functions are not imported nor the reward model loaded, and any of them weighted other
    than 0 may vary."""
    functions = {*functions, MODEL}  # check_weights holds `model` to a reward model (reward.path)
    if any(w != 0 and (n in functions or len(set(get_verifier(n).VALUES)) > 1) for n, w in weights.items()):
        return None
    return sum(w * get_verifier(n).VALUES[0] for n, w in weights.items() if n not in functions)


class WeightedReward:
    """Weighted verifiers, your own functions and a reward model, each by its name: validated when built
    (before any generation), scored together."""

    model_path: Optional[str] = None
    """The reward model's export dir (`reward.path`); None: the reward has none."""
    model: Optional[ModelReward] = None
    """The reward model, once loaded on the training device (align/objectives/scoring_model.py; GRPO's bind)."""

    def __init__(self, weights: Mapping[str, float], key: str = "reward.weights",
                 function: Optional[str] = None, functions: Optional[Mapping[str, str]] = None,
                 model: Optional[str] = None, model_batch_size: int = 1) -> None:
        specs = check_weights(weights, key, function, functions, model)
        self.weights: dict[str, float] = {n: float(w) for n, w in weights.items()}
        self.verifiers: dict[str, Verifier] = {n: get_verifier(n, key=f"{key}.{n}") for n in weights
                                               if n not in specs and n != MODEL}
        self.functions: dict[str, PythonReward] = {n: load_function(s, function_key(n)) for n, s in specs.items()}
        """Your functions, loaded, by the name they are weighted by (`python`: reward.function)."""
        self.model_path, self.model_batch_size = model, model_batch_size

    @classmethod
    def of(cls, reward_cfg: Any) -> WeightedReward:
        """The reward group's (`RewardConfig`) reward."""
        return cls(reward_cfg.weights, function=reward_cfg.function, functions=reward_cfg.functions,
                   model=reward_cfg.path, model_batch_size=reward_cfg.model_batch_size)

    def identity(self) -> dict[str, Any]:
        out: dict[str, Any] = {"weights": dict(self.weights),
                               "verifiers": {n: v.identity() for n, v in self.verifiers.items()}}
        if self.functions:
            out["functions"] = self.function_identities()
        if self.model_path is not None:
            out[MODEL] = self.model.identity() if self.model is not None else file_identity(self.model_path)
        return out

    def function_identities(self) -> dict[str, dict[str, Any]]:
        """Each function's identity (import path, file, sha256) by the name it is weighted by."""
        return {n: f.identity() for n, f in self.functions.items()}

    def constant(self) -> Optional[float]:
        """The reward every completion gets whatever it says, where the weights fix it (`constant_reward`)."""
        return constant_reward(self.weights, self.functions)

    def check_reference(self, reference: str) -> None:
        """BadReference when any weighted verifier cannot read `reference`."""
        for v in self.verifiers.values():
            v.normalize_reference(reference)

    def score(self, completion: str, reference: str) -> Reward:
        """The verifiers' weighted sum for one completion (functions score whole groups: `score_group`)."""
        parts = {n: v.score(completion, reference) for n, v in self.verifiers.items()}
        return Reward(total=sum(self.weights[n] * s.value for n, s in parts.items()), parts=parts)

    def score_group(self, group: Group) -> list[Reward]:
        """Every completion of one prompt (`score_groups` of the one group)."""
        return self.score_groups([group])[0]

    def score_groups(self, groups: Sequence[Group]) -> list[list[Reward]]:
        """Every completion of each prompt: the reward model over all the groups' completions at once (in its
        batches), then per group the verifiers one by one and each function once for the group (in the order
        configured: the first that fails stops the scoring, naming itself and the prompt)."""
        model = self._model_values(groups)
        return [self._score_group(g, m) for g, m in zip(groups, model)]

    def _model_values(self, groups: Sequence[Group]) -> list[Optional[list[float]]]:
        if self.model_path is None:
            return [None] * len(groups)
        if self.model is None:
            raise RuntimeError("the reward model (reward.path) is scored before it was loaded on a device")
        values = iter(self.model.score([g.messages for g in groups for _ in g.completions],
                                       [c for g in groups for c in g.completions]))
        return [[next(values) for _ in g.completions] for g in groups]

    def _score_group(self, group: Group, model: Optional[list[float]]) -> list[Reward]:
        rewards = [self.score(c, group.reference) for c in group.completions]
        named = [(name, lambda fn=fn: fn(group)) for name, fn in self.functions.items()]
        if model is not None:
            named.append((MODEL, lambda: model))
        for name, values in named:
            w = self.weights[name]
            rewards = [Reward(total=r.total + w * v, parts={**r.parts, name: Score(value=v, extracted=None,
                                                                                   reference="")})
                       for r, v in zip(rewards, values())]
        return rewards
