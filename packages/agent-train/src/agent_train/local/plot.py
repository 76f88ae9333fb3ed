"""The learning curve of a local run as a PNG: held-out success and RL reward against steps, SFT loss below.

    plot_metrics(read_metrics(run_dir / "metrics.jsonl"), run_dir / "learning_curve.png")

Top panel: held-out success (greedy, one point per evaluation) and the mean reward of each RL step's sampled
episodes (faint) with its 10-step moving average; a dashed line marks where SFT ends and RL begins. A compacting
run's extra figures are single marks at the last step: the final model with compaction off (``compaction_off``)
and, for a run that has one, the ablation's final model (``after_rl_masked``, from `plot_metrics`'s `extra`).
Bottom panel:
the SFT loss. Uses matplotlib's Agg backend (no display needed). This module knows metric records and matplotlib;
nothing about training.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

__all__ = ["plot_metrics"]


def _moving_average(values: Sequence[float], window: int) -> list[float]:
    out: list[float] = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


_MARKS: Final = {
    "compaction_off": ("x", "tab:red", "final model, compaction off"),
    "after_rl_masked": ("s", "tab:purple", "after RL with summary tokens masked (ablation)"),
}


def plot_metrics(
    records: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    title: str = "demo agent",
    extra: Sequence[dict[str, Any]] = (),
) -> Path:
    """Draw the records of a metrics file into `path` (PNG); returns the path. `extra` are evaluation records of
    another run drawn as marks (the ablation's ``after_rl_masked``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = [r for r in records if r.get("kind") == "eval" and r.get("label") not in _MARKS]
    marks = [r for r in [*records, *extra] if r.get("kind") == "eval" and r.get("label") in _MARKS]
    rl = [r for r in records if r.get("kind") == "rl"]
    sft = [r for r in records if r.get("kind") == "sft"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[2, 1])
    if rl:
        steps, rewards = [r["step"] for r in rl], [r["reward"] for r in rl]
        top.plot(steps, rewards, color="tab:orange", alpha=0.25, lw=1)
        top.plot(steps, _moving_average(rewards, 10), color="tab:orange", lw=1.5,
                 label="RL: mean reward of sampled episodes (10-step average)")  # fmt: skip
    if evals:
        top.plot([r["step"] for r in evals], [r["success"] for r in evals], "o-", color="tab:blue", lw=2,
                 label=f"held-out success (greedy, {evals[-1].get('episodes', '?')} problems)")  # fmt: skip
        for record in evals:
            if record.get("label") in ("before", "after_sft", "after_rl"):
                top.annotate(f"{record['success']:.0%}", (record["step"], record["success"]),
                             textcoords="offset points", xytext=(0, 8), ha="center", fontsize=9)  # fmt: skip
    for record in marks:
        marker, color, text = _MARKS[record["label"]]
        label = f"{text}: {record['success']:.0%}"
        top.plot([record["step"]], [record["success"]], marker, color=color, ms=8, label=label)
    if sft:
        bottom.plot([r["step"] for r in sft], [r["loss"] for r in sft], color="tab:green", lw=1, label="SFT loss")
        boundary = max(r["step"] for r in sft)
        for axis in (top, bottom):
            axis.axvline(boundary, color="grey", ls="--", lw=1)
        top.text(boundary, 1.02, " SFT | RL", color="grey", fontsize=9, va="bottom")
    top.set_ylim(-0.02, 1.08)
    top.set_ylabel("success / reward")
    top.legend(loc="upper left", fontsize=8)
    top.grid(alpha=0.3)
    top.set_title(title)
    bottom.set_ylabel("SFT loss")
    bottom.set_xlabel("step (SFT steps, then RL steps)")
    bottom.grid(alpha=0.3)
    if sft:
        bottom.set_yscale("log")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
