"""The objective seam: what varies between post-training methods, asked for by the loop in
align/trainer.py, which stays the same for all of them.

An objective decides
- how records become micro-batches (`build_data`), what it needs of the built model (`bind`), and how
  the next accumulation window is drawn (`next_window`: SFT and DPO read the stream; GRPO generates a
  rollout and replays it for several optimizer steps);
- the forward and loss of one micro-batch (`micro_loss`, a SUM over the micro-batch's loss units)
  and the unit the window normalises by (`weight`: loss tokens for SFT, pairs for DPO), so a window
  cut into micro-batches any way weighs every unit the same;
- the metrics it adds to a step's row (`window_metrics`), and which of the row's metrics a person
  watches (`console_metrics`: the progress line, the end summary, the loss plot);
- the extra state a checkpoint must hold: `state_dict` / `load_state_dict` what all ranks share (a
  reference's identity, a rollout count), `rank_state_dict` / `load_rank_state_dict` what is this
  rank's own (a rollout buffer: each rank generates its own completions);
- what the manifest records about it (`describe`) and the check it runs before the first update
  (`gate`, e.g. DPO's "the policy equals its reference at step 0");
- what one item of its data trains on, as `python -m align.tools.inspect` prints it (`view`, a static
  method: it needs the config and the tokenizer, not a built objective).
- what it adds to the job's plan, read from the config before any objective is built: its terms of
  the memory estimate and the auto rules that hold only for it (`terms`: a subclass of
  align/objectives/plan_terms.py's `PlanTerms` beside it).
An objective's module registers its class with `align.objectives.register`, under its `name`: the
`kind` its schema declares in align/config/.

The loop owns everything else: devices, autocast and the SDPA kernel choice (`Forward`), the
backward, router losses, clipping, the optimizer boundary, logging, checkpoints and stops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol

if TYPE_CHECKING:
    import torch

    from align.config import TrainConfig
    from align.data.collate import Batch
    from align.data.loader import BatchStream
    from align.parallel.env import DistEnv

Forward = Callable[..., "torch.Tensor"]
"""`forward(inputs, hidden_only=False, module=None) -> logits` of the policy (or `module`) (or final
hidden states when `hidden_only`): the trainer's model forward under its autocast; `hidden_only`
bypasses the LM head for a chunked loss."""


@dataclass
class View:
    """What a run trains on for one item of its data (align/objectives/views.py builds them)."""

    header: list[str]
    """Lines above the sequences: which item, its counts, the tokenizer and encode cache."""
    legend: str
    """What a marked run of tokens is for this objective, and what the unmarked ones are."""
    sequences: list[tuple[str, list[int], list[bool]]]
    """(label, token ids, loss mask) of each sequence the item becomes, exactly as the run encodes it;
    an empty label for an item that is one sequence."""
    footer: list[str] = field(default_factory=list)
    """Lines below the sequences: what the loss reads that is not one of their tokens."""


class Objective(Protocol):
    name: str
    console_metrics: tuple[tuple[str, str], ...]
    """(label, history key) of the metrics the progress line, the end summary and plots/loss.png show
    (align/telemetry/console.py), most telling first."""

    @staticmethod
    def view(cfg: "TrainConfig", tokenizer: Any, index: int) -> View:
        """Item `index` of the data a run composed from `cfg` trains on (IndexError past the end)."""
        ...

    def build_data(self, cfg: "TrainConfig", tokenizer: Any, env: "DistEnv") -> tuple[Any, "BatchStream"]:
        """The encoded records and the resumable micro-batch stream over them (this rank's share)."""
        ...

    def prepare(self, model: "torch.nn.Module") -> list["torch.nn.Module"]:
        """Before placement, on the unsharded starting model: extra modules (a frozen reference) that
        the trainer places and shards like the policy, and identities read from the starting weights."""
        ...

    def bind(self, model: "torch.nn.Module", forward: Forward, resuming: bool = False) -> None:
        """Attach to the model once placed and parallelized (its head, a reference, an engine);
        `resuming`: a checkpoint will be restored next (the starting policy is not the model's)."""
        ...

    def next_window(self, batches: Iterator["Batch"], n: int, device: "torch.device") -> list["Batch"]:
        """The micro-batches of the next optimizer step, on `device`."""
        ...

    def weight(self, batch: "Batch") -> int:
        """The number of loss units in `batch`; the window's loss is divided by their global sum."""
        ...

    def micro_loss(self, forward: Forward, batch: "Batch") -> "torch.Tensor":
        """The summed loss of one micro-batch (a scalar with grad); the trainer divides and backwards."""
        ...

    def window_metrics(self) -> dict[str, Any]:
        """Metrics of the window just closed (objective-specific); the accumulator is reset."""
        ...

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's own part of the state; the checkpoint keeps it in rank<r>.json beside the stream."""
        ...

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        ...

    def gate(self, batch: "Batch") -> Optional[dict[str, Any]]:
        """The check before the first update on this rank's first micro-batch (None: none applies);
        raises an AlignError when it fails."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the manifest records about the objective (every key present, null with a reason)."""
        ...
