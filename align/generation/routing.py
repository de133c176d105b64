"""The routing record of align's engine (`AlignEngine.record_routers`): which experts each MoE router picked
at the position that predicted each generated token, for GRPO's router flip record (align/objectives/
router_flips.py `flips`).

Forward hooks on the routers (align/models/family_table.py `RouterTap`: its `index_module` and `index_of`)
leave each layer's top-k ids of the forward that just ran in `seen`; the step that ran the forward reads
them at once and writes them beside its tokens (align/generation/align_engine.py `_State`). The reads and
writes are tensor ops of the step itself, so a CUDA graph of the step captures them and its replays need
no hook.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch


class Routing:
    def __init__(self, taps: Sequence[Any]) -> None:
        self.taps = list(taps)
        """The routers, in the order the trainer's record reads them."""
        self.seen: dict[int, torch.Tensor] = {}
        """Router i's [tokens, k] ids of the last forward."""

    def __len__(self) -> int:
        return len(self.taps)

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        """The routers' hooks for one engine call, removed after it."""
        self.seen.clear()
        handles = [t.index_module.register_forward_hook(self._keep(i, t.index_of)) for i, t in enumerate(self.taps)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _keep(self, i: int, index_of: Callable[[Any], torch.Tensor]):
        def hook(module, args, output):
            self.seen[i] = index_of(output)
        return hook

    def picked(self, pick: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """[rows, routers, k]: `pick` (the rows' positions) applied to each router's [tokens, k] ids."""
        return torch.stack([pick(ids.reshape(-1, ids.shape[-1])) for ids in (self.seen[i] for i in range(len(self)))],
                           1)
