"""Which SDPA kernel family a forward ran (flash, efficient, cudnn or math), read from the device
kernels' names under torch.profiler: what the manifest records as `model.sdpa_kernel_family`."""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

# cuDNN first: its SDPA kernels are named like `cudnn_generated_fort_native_sdpa_sm90_flash_fprop...`.
_FAMILIES = (
    ("cudnn", re.compile(r"cudnn.*(sdpa|mha|attn|flash)|(sdpa|mha).*cudnn", re.I)),
    ("flash", re.compile(r"flash", re.I)),
    ("efficient", re.compile(r"fmha_cutlass|efficient_attention|mem_eff", re.I)),
)


def classify_kernels(names: list[str]) -> Optional[str]:
    """SDPA kernel family from device-kernel symbols; None when no fused attention kernel ran."""
    for family, rx in _FAMILIES:
        if any(rx.search(n) for n in names):
            return family
    return None


def sdpa_kernel_family(
    model: Any, batch: Any, autocast: Callable[[], Any], resolved: Optional[str]
) -> tuple[Optional[str], Optional[list[str]], Optional[str]]:
    """(family, kernel symbols, reason when null): one no-grad forward of `batch` (the run's first
    micro-batch) under torch.profiler, on GPU only. A symbol's `smNN` suffix is the kernel generation."""
    if resolved != "sdpa":
        return None, None, f"attention resolved to {resolved}, not sdpa"
    if batch.input_ids.device.type != "cuda":
        return (
            None,
            None,
            "CPU: SDPA runs ATen CPU kernels; the kernel family is told from CUDA kernel names (GPU only)",
        )
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        # Eager, as the mask check: under trainer.compile a traced no-grad forward costs every block a
        # second compile at startup (grad mode is in dynamo's guards); SDPA's choice is the same.
        with (
            torch.no_grad(),
            torch.compiler.set_stance("force_eager"),
            autocast(),
            profile(activities=[ProfilerActivity.CUDA]) as prof,
        ):
            model(**batch.model_inputs())
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    except Exception as e:  # never let bookkeeping kill a run
        return None, None, f"profiling failed: {type(e).__name__}: {e}"
    attn = [n for n in names if any(rx.search(n) for _, rx in _FAMILIES)]
    # No fused attention kernel in an SDPA forward means SDPA took its math path (matmul + softmax).
    return classify_kernels(attn) or "math", attn, None
