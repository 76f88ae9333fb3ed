"""The ablation of a compacting run: RL again from the same SFT model, on the same prompts, with the summary turns'
tokens masked from the loss (`rl_mask_summaries`), so that the two final models differ only in whether summaries
were trained.

    result = train_local(config, "runs/compaction")                 # before, after SFT, after RL, compaction off
    result = run_ablation(result)                                   # + after_rl_masked, from runs/compaction/ablation

The ablation is a branch of the run (`train_local(..., branch_from=run_dir)`): it starts from the run's
``rl_start`` checkpoint (the SFT model, the optimizer-free trainer state and the RNG state at the start of RL) in
``run_dir/ablation``, and resumes there if interrupted. Its final held-out success is added to the run's figures
as ``after_rl_masked``: an evaluation record in the run's ``metrics.jsonl`` (and its TensorBoard event files, when
it has them; the ablation's own go to ``<run's event directory>/ablation``, its episodes to the run's
``trajectories/ablation`` when the run logs them), the mark on its learning curve, and
the figure in its ``summary.json``. This module wires two runs together; the training is `trainer.py`'s.
"""

from __future__ import annotations

import json
from dataclasses import replace

import msgspec

from agent_train.local.demos import get_demo
from agent_train.local.metrics import read_metrics
from agent_train.local.plot import plot_metrics
from agent_train.local.tensorboard_events import rewrite_event_files
from agent_train.local.trainer import TrainResult, train_local

__all__ = ["ABLATION_DIR", "run_ablation"]

ABLATION_DIR = "ablation"


def run_ablation(result: TrainResult, *, progress: bool = True) -> TrainResult:
    """Train the ablation of the finished run `result` (see the module docstring); returns `result` with
    ``after_rl_masked`` in its figures and its summary, metrics and plot updated."""
    config = msgspec.structs.replace(result.config, rl_mask_summaries=True)
    events = result.files.get("tensorboard")
    trajectories = result.files.get("trajectories")
    masked = train_local(
        config,
        result.run_dir / ABLATION_DIR,
        branch_from=result.run_dir,
        resume=True,
        progress=progress,
        tensorboard_dir=None if events is None else events / ABLATION_DIR,
        trajectories=False if trajectories is None else trajectories / ABLATION_DIR,
    )
    records = read_metrics(masked.files["metrics"])
    final = next(r for r in reversed(records) if r.get("label") == "after_rl")
    branched_at = next(r for r in records if r.get("label") == "after_sft")["time_s"]  # the source run's time
    own_s = masked.elapsed_s - branched_at
    record = {**final, "label": "after_rl_masked", "run_dir": str(masked.run_dir)}
    metrics = result.files["metrics"]
    kept = [r for r in read_metrics(metrics) if r.get("label") != "after_rl_masked"]
    metrics.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in [*kept, record]))
    if events is not None:
        rewrite_event_files(events, read_metrics(metrics))
    plot_metrics(read_metrics(metrics), result.files["plot"], title=get_demo(result.config.demo).plot_title)
    figures = {**result.figures, "after_rl_masked": masked.figures["after_rl"]}
    summary = json.loads(result.files["summary"].read_text(encoding="utf-8"))
    summary["figures"] = figures
    summary["ablation"] = {"run_dir": str(masked.run_dir), "elapsed_s": round(own_s, 1)}
    summary["elapsed_s"] = round(result.elapsed_s + own_s, 1)
    result.files["summary"].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return replace(result, figures=figures, elapsed_s=result.elapsed_s + own_s)
