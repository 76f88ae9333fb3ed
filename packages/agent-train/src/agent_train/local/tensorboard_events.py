"""TensorBoard event files of a local run: the metrics JSONL's records as scalars, tagged as OpenRLHF tags its own.

    events = EventFiles(run_dir / "tensorboard" / "demo", records=kept)   # old event files replaced by `kept`
    events.write({"kind": "rl", "step": 201, "time_s": 95.2, "reward": 0.41, "loss": -0.02})
    events.close()
    tensorboard_scalars(record)      # {"train/reward": 0.41, "train/loss": -0.02}: what one record becomes

OpenRLHF's PPO trainer writes ``train/<name>`` per global step and ``eval/<name>`` per evaluation, into
``--logger.tensorboard_dir``/``<run name>`` (torch's `SummaryWriter`). The local trainer's records map the same
way, at the record's global ``step``: an RL step's numbers are ``train/<name>`` (``train/reward`` lines up with
OpenRLHF's), an SFT step's are ``sft/<name>`` (OpenRLHF trains SFT in a run of its own; here SFT steps come
first on the same axis, and its loss is not the RL loss), a held-out evaluation on the learning curve is
``eval/<name>``, and one off the curve, labelled (``compaction_off``: the final model with compaction off;
``after_rl_masked``: the ablation's final figure) is ``eval/<label>/<name>``. ``step``, ``time_s`` (the event's
wall time instead) and text are not scalars.

The files mirror the JSONL: opening replaces the directory's event files with the records kept so far (what a
resumed or branched run's metrics file holds), and each record is flushed as it is written, so TensorBoard reads
a running job. This module knows TensorBoard's writer and the tag rule; nothing about training.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

__all__ = ["CURVE_LABELS", "EVENT_FILE_PREFIX", "TAG_PREFIXES", "EventFiles", "rewrite_event_files",
           "tensorboard_scalars"]  # fmt: skip

TAG_PREFIXES: Final[dict[str, str]] = {"rl": "train", "sft": "sft", "eval": "eval"}
"""A record's ``kind`` -> its tags' prefix (a kind not listed is its own prefix)."""
CURVE_LABELS: Final = frozenset({None, "before", "after_sft", "after_rl"})
"""The evaluation labels on the learning curve (``eval/<name>``); any other label is ``eval/<label>/<name>``."""
EVENT_FILE_PREFIX: Final = "events.out.tfevents."
_NOT_SCALARS: Final = frozenset({"kind", "step", "time_s"})


def tensorboard_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The scalars one metrics record becomes, by tag (see the module docstring); text and booleans are left out."""
    kind = str(record.get("kind", "metrics"))
    prefix = TAG_PREFIXES.get(kind, kind)
    label = record.get("label")
    if kind == "eval" and label not in CURVE_LABELS:
        prefix = f"{prefix}/{label}"
    return {
        f"{prefix}/{name}": float(value)
        for name, value in record.items()
        if name not in _NOT_SCALARS and isinstance(value, int | float) and not isinstance(value, bool)
    }


class EventFiles:
    """TensorBoard event files in `log_dir` (the run's own directory: ``<tensorboard dir>/<run name>``).

    Opening deletes the event files already there (an earlier run of the same name, or this run before a resume)
    and writes `records` again; `started_at` is the run's start as a Unix time (each record's wall time is
    ``started_at + time_s``; default: now minus the last record's ``time_s``)."""

    def __init__(
        self, log_dir: str | Path, *, records: Iterable[Mapping[str, Any]] = (), started_at: float | None = None
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter  # torch and tensorboard load here, not on import

        self.log_dir = Path(log_dir)
        if self.log_dir.exists() and not self.log_dir.is_dir():
            raise NotADirectoryError(f"TensorBoard directory {self.log_dir} is a file")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for old in self.log_dir.glob(f"{EVENT_FILE_PREFIX}*"):
            if old.is_file():
                old.unlink()
        records = list(records)
        if started_at is None:
            started_at = time.time() - max((float(r.get("time_s", 0.0)) for r in records), default=0.0)
        self.started_at = started_at
        self._writer = SummaryWriter(log_dir=str(self.log_dir))
        for record in records:
            self._add(record)
        self._writer.flush()

    def _add(self, record: Mapping[str, Any]) -> None:
        step = int(record.get("step", 0))
        walltime = self.started_at + float(record.get("time_s", 0.0))
        for tag, value in tensorboard_scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=step, walltime=walltime)

    def write(self, record: Mapping[str, Any]) -> None:
        """Add one record's scalars and flush them to disk."""
        self._add(record)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def rewrite_event_files(log_dir: str | Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Replace `log_dir`'s event files with `records` (a metrics file changed after its run closed); returns
    `log_dir`."""
    events = EventFiles(log_dir, records=records)
    events.close()
    return events.log_dir
