"""`TrajectoryLog`: the episodes of a local run as trajectory JSONL, the files the trajectory viewer opens
(``uv run apps/serve --trajectories runs/demo/trajectories``).

    log = TrajectoryLog(run_dir / "trajectories")
    log.rl_step(step, sampled, trained, advantages)   # step_00201.jsonl: every episode the step sampled
    log.evaluation(step, trajectories, label="after_sft")  # eval_after_sft.jsonl (unlabelled: eval_step_00050.jsonl)
    log.expert(trajectories, trained=[True, ...])       # sft_expert.jsonl: the expert episodes SFT learns from

One file per RL step, per evaluation and for SFT's expert episodes, each written whole (a scratch file renamed
over it, so a viewer reading the live directory never sees half a file, and a resumed run that redoes a step
replaces its file). Each record is the episode's `Trajectory` as its session wrote it, with what the trainer did
with it: the task gains ``step`` (the global step, as in ``metrics.jsonl``), and for an RL episode ``group``,
``episode``, ``advantage`` (its episode's, given to every action token of every segment; None when the loss never
saw it) and ``trained``; an evaluation's gains ``checkpoint`` (its label) when it has one. An RL episode's segments
carry the loss mask the update used: the transcript's, with summary turns zeroed under ``rl_mask_summaries`` and
all zeros for an episode the loss left out (``rl_mask_overlong``, a group dynamic filtering dropped). The token
ids, spans and logprobs are the transcript's. Writing reads no random state and reorders nothing, so a run's
figures are the same with the log or without it.

This module knows trajectories and files; nothing about models or losses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from agent_runtime import Trajectory
from agent_train.local.rollout import RolloutRecord

__all__ = ["TrajectoryLog"]

_encoder: Final = msgspec.json.Encoder()


class TrajectoryLog:
    """Writes a run's episodes under `directory` (created on first write); see the module docstring."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def write(self, name: str, trajectories: Sequence[Trajectory]) -> Path:
        """Write `trajectories` as ``<name>.jsonl``, replacing the file as a whole; its path."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"a trajectory file name is a plain name, got {name!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{name}.jsonl"
        scratch = self.directory / f".{name}.jsonl.tmp-{os.getpid()}"  # hidden, not *.jsonl: the viewer skips it
        scratch.write_bytes(b"".join(_encoder.encode(t) + b"\n" for t in trajectories))
        os.replace(scratch, path)
        return path

    def rl_step(
        self,
        step: int,
        sampled: Sequence[RolloutRecord],
        trained: Sequence[RolloutRecord],
        advantages: Sequence[float],
    ) -> Path:
        """``step_<step>.jsonl``: every episode of `sampled` once, in episode order, with the loss masks and
        advantages of `trained` (the records and advantages the update took, `trained_records`)."""
        if len(trained) != len(advantages):
            raise ValueError(f"got {len(advantages)} advantages for {len(trained)} trained records")
        masks = {(r.episode, r.segment): r.loss_mask for r in trained}
        advantage = {r.episode: a for r, a in zip(trained, advantages, strict=True)}
        episodes: dict[int, RolloutRecord] = {}
        for record in sampled:
            episodes.setdefault(record.episode, record)
        out = []
        for episode, record in sorted(episodes.items()):
            trajectory = record.trajectory
            if trajectory is None:
                raise ValueError(f"episode {episode}'s records carry no trajectory")
            segments = [
                msgspec.structs.replace(segment, loss_mask=list(masks.get((episode, index), [0] * len(segment.ids))))
                for index, segment in enumerate(trajectory.segments)
            ]
            task = {
                "step": step,
                "group": record.group,
                "episode": episode,
                "advantage": advantage.get(episode),
                "trained": episode in advantage,
            }
            out.append(_with_task(trajectory, task, segments=segments))
        return self.write(f"step_{step:05d}", out)

    def evaluation(self, step: int, trajectories: Sequence[Trajectory], *, label: str | None = None) -> Path:
        """``eval_<label>.jsonl`` (``eval_step_<step>.jsonl`` without one): a held-out evaluation's episodes."""
        fields: dict[str, Any] = {"step": step} if label is None else {"step": step, "checkpoint": label}
        name = f"eval_{label}" if label is not None else f"eval_step_{step:05d}"
        return self.write(name, [_with_task(t, fields) for t in trajectories])

    def expert(self, trajectories: Sequence[Trajectory], *, trained: Sequence[bool]) -> Path:
        """``sft_expert.jsonl``: the scripted expert's episodes, ``trained`` where SFT learns from them."""
        if len(trajectories) != len(trained):
            raise ValueError(f"got {len(trained)} flags for {len(trajectories)} expert episodes")
        return self.write(
            "sft_expert",
            [_with_task(t, {"step": 0, "trained": k}) for t, k in zip(trajectories, trained, strict=True)],
        )


def _with_task(trajectory: Trajectory, fields: Mapping[str, Any], **changes: Any) -> Trajectory:
    return msgspec.structs.replace(trajectory, task={**trajectory.task, **fields}, **changes)
