"""`trainer.compile_artifacts`: torch.compiler's portable cache artifacts of this run, saved when it
ends for the next run to load (align/parallel/compile_artifacts.py)."""

from __future__ import annotations

from align.callbacks.callback import Callback
from align.parallel import compile_artifacts


class CompileArtifacts(Callback):
    def post_train(self, code: int) -> None:
        compile_artifacts.save_at_end(self.trainer.model_info["compile_choice"], self.trainer.env.is_main)
