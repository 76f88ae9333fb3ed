"""Replace a directory as a whole: write the new one beside it, then swap it in, so a reader (a resuming run, a
server looking for the demo model) sees the old directory or the new one, never a half-written one.

    with replacing_dir(run_dir / "checkpoint") as scratch:    # scratch does not exist yet: create or copy it
        save_model_dir(model, tokenizer, scratch)
        (scratch / "trainer_state.json").write_bytes(state)

This module knows directories; nothing about what goes in them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replacing_dir"]


@contextlib.contextmanager
def replacing_dir(target: str | Path) -> Iterator[Path]:
    """A scratch path beside `target` (its parent is created); when the block ends, the scratch directory takes
    `target`'s place. When the block raises, `target` is left as it was and the scratch is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)  # left by a process of the same pid that died mid-write
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        os.replace(target, old)
    os.replace(scratch, target)
    shutil.rmtree(old, ignore_errors=True)
