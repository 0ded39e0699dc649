"""Progress bars for long conversion steps: tqdm, quiet when stderr is not a terminal."""

from __future__ import annotations

import sys

__all__ = ["progress_bar"]


def progress_bar(total: int | None, desc: str, enabled: bool | None):
    """A tqdm bar counting rows; ``enabled`` None means: only on a terminal."""
    from tqdm import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(total=total, desc=desc, unit="row", unit_scale=True, disable=disable, leave=False)
