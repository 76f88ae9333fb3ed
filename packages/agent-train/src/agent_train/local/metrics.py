"""Training metrics as JSONL: one JSON object per line, appended as the run goes, safe to read while it runs.

    writer = MetricsWriter(run_dir / "metrics.jsonl")
    writer.write("sft", step=12, loss=0.83)
    writer.write("eval", step=150, success=0.41, label="after_sft")
    records = read_metrics(run_dir / "metrics.jsonl")

Every record has ``kind`` (``sft``, ``rl`` or ``eval``), ``step`` (the global step: SFT steps first, then RL
steps counted on from there), ``time_s`` (seconds since the run started, across resumes) and its own numbers.
On resume the writer drops records past the checkpoint's step, so a resumed run's file reads like one run.
With `tensorboard_dir` it also mirrors every record into TensorBoard event files there
(`agent_train.local.tensorboard_events`: OpenRLHF's tags). This module knows files and JSON; nothing about
training.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

if TYPE_CHECKING:
    from agent_train.local.tensorboard_events import EventFiles

__all__ = ["MetricsWriter", "read_metrics"]

_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(dict[str, Any])


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a metrics file (an empty list when there is none); a torn last line is skipped."""
    file = Path(path)
    if not file.is_file():
        return []
    records: list[dict[str, Any]] = []
    for line in file.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            records.append(_decoder.decode(line))
        except msgspec.DecodeError:
            continue  # a line cut short by a crash; everything before it is intact
    return records


class MetricsWriter:
    """Appends metric records to `path`. `elapsed_s` is the time already spent before this process (resume).
    `tensorboard_dir`: also write them as TensorBoard event files in that directory (the kept records first);
    `close` closes those."""

    def __init__(
        self,
        path: str | Path,
        *,
        keep_until_step: int | None = None,
        elapsed_s: float = 0.0,
        tensorboard_dir: str | Path | None = None,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[dict[str, Any]] = []
        if keep_until_step is None:
            self.path.write_bytes(b"")
        else:
            kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= keep_until_step]
            self.path.write_bytes(b"".join(_encoder.encode(r) + b"\n" for r in kept))
        self._started = time.monotonic() - elapsed_s
        self.events: EventFiles | None = None
        if tensorboard_dir is not None:
            from agent_train.local.tensorboard_events import EventFiles

            self.events = EventFiles(tensorboard_dir, records=kept, started_at=time.time() - elapsed_s)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def write(self, kind: str, *, step: int, **values: Any) -> dict[str, Any]:
        record: dict[str, Any] = {"kind": kind, "step": step, "time_s": round(self.elapsed_s, 3), **values}
        with self.path.open("ab") as file:
            file.write(_encoder.encode(record) + b"\n")
        if self.events is not None:
            self.events.write(record)
        return record

    def close(self) -> None:
        """Close the TensorBoard event files (the JSONL needs no closing); records written later go to the JSONL
        only."""
        if self.events is not None:
            self.events.close()
            self.events = None
