"""Where align's caches live: one user cache directory, never the working directory.

`$ALIGN_CACHE_DIR` when set, else `$XDG_CACHE_HOME/align`, else `~/.cache/align`; each cache is a
sub-directory of it (`encode/`, `reference/`, `eval/`, `signatures/`, `inductor/`) unless its own
setting names another (`data.cache_dir`, `eval.cache_dir`, `$ALIGN_SIGNATURE_CACHE`,
`$TORCHINDUCTOR_CACHE_DIR`). A run records the directory it used and where that came from. Standard
library only: preflight resolves these before torch is imported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

CACHE_ENV = "ALIGN_CACHE_DIR"
"""The directory of every align cache (beats XDG_CACHE_HOME)."""


def cache_home() -> tuple[Path, str]:
    """(align's cache directory, where it came from)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser(), f"${CACHE_ENV}"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "align", "$XDG_CACHE_HOME/align"
    return Path.home() / ".cache" / "align", "~/.cache/align"


def cache_location(sub: str, configured: Optional[str] = None, key: str = "") -> dict[str, str]:
    """{"dir", "source"} of one cache: `configured` (a config value, named by `key`) when set, else
    `<cache_home>/<sub>`."""
    if configured:
        return {"dir": str(Path(configured).expanduser()), "source": key}
    home, source = cache_home()
    return {"dir": str(home / sub), "source": f"{source}/{sub}"}


def encode_location(cache_dir: Optional[str]) -> dict[str, str]:
    """The encode cache's: `data.cache_dir`, else `encode/` (the DPO reference cache is its sibling)."""
    return cache_location("encode", cache_dir, "data.cache_dir")
