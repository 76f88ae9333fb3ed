"""The local trainer's TensorBoard event files, read back with TensorBoard's own `EventAccumulator`: every record of
``metrics.jsonl`` is there as scalars tagged as OpenRLHF tags its own (``train/``, ``eval/``; ``sft/`` for the
SFT phase), at the record's global step, through a pause and resume, the compaction demo's ablation (a branch) and
the figure it adds to its source run; and the command line's ``--tensorboard-dir`` / ``--no-tensorboard``."""

from __future__ import annotations

import logging
import struct
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent_train.local.cli import main, tensorboard_events_dir
from agent_train.local.metrics import MetricsWriter, read_metrics
from agent_train.local.tensorboard_events import EVENT_FILE_PREFIX, tensorboard_scalars

TINY = ["--preset", "ci", "--sft-steps", "4", "--rl-steps", "3", "--eval-size", "2", "--no-progress", "--no-install"]


@pytest.fixture(autouse=True)
def _quiet_rollouts() -> Iterator[None]:
    """Warnings only, as apps/train logs the local trainer (a log line per rollout otherwise); undone after."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.reset_defaults()


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in `log_dir`'s event files, by tag: (step, value) in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every event
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def float32(value: float) -> float:
    """`value` as TensorBoard stores a scalar (a 32-bit float)."""
    stored: float = struct.unpack("f", struct.pack("f", value))[0]
    return stored


def expected_scalars(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    expected: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for record in records:
        for tag, value in tensorboard_scalars(record).items():
            expected[tag].append((record["step"], float32(value)))
    return dict(expected)


def test_tags_follow_openrlhf_and_keep_the_phases_and_the_marks_apart() -> None:
    assert tensorboard_scalars({"kind": "rl", "step": 7, "time_s": 1.5, "reward": 0.5, "loss": -0.1}) == {
        "train/reward": 0.5,
        "train/loss": -0.1,
    }
    assert tensorboard_scalars({"kind": "sft", "step": 3, "time_s": 1.0, "loss": 2.0}) == {"sft/loss": 2.0}
    curve = {"kind": "eval", "step": 9, "time_s": 2.0, "label": "after_rl", "episodes": 4, "success": 0.25}
    assert tensorboard_scalars(curve) == {"eval/episodes": 4.0, "eval/success": 0.25}
    assert tensorboard_scalars({**curve, "label": None}) == {"eval/episodes": 4.0, "eval/success": 0.25}
    mark = {**curve, "label": "compaction_off", "run_dir": "/runs/x", "flag": True}
    assert tensorboard_scalars(mark) == {"eval/compaction_off/episodes": 4.0, "eval/compaction_off/success": 0.25}


def test_the_event_files_mirror_the_metrics_file_through_a_resume(tmp_path: Path) -> None:
    events = tmp_path / "tensorboard" / "run"
    writer = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard_dir=events)
    writer.write("eval", step=0, label="before", success=0.0, episodes=2)
    for step in range(1, 5):
        writer.write("sft", step=step, loss=1.0 / step)
    writer.close()
    assert read_scalars(events)["sft/loss"] == [(s, float32(1.0 / s)) for s in range(1, 5)]
    resumed = MetricsWriter(tmp_path / "metrics.jsonl", keep_until_step=2, elapsed_s=10.0, tensorboard_dir=events)
    resumed.write("sft", step=3, loss=0.7)
    resumed.write("rl", step=4, reward=0.5, loss=-0.25)
    resumed.close()
    assert len(list(events.glob(f"{EVENT_FILE_PREFIX}*"))) == 1  # the first run's file replaced, not added to
    scalars = read_scalars(events)
    assert scalars == expected_scalars(read_metrics(tmp_path / "metrics.jsonl"))
    assert scalars["sft/loss"] == [(1, 1.0), (2, 0.5), (3, float32(0.7))]  # steps 3 and 4 of the first run gone
    assert scalars["train/reward"] == [(4, 0.5)] and scalars["eval/success"] == [(0, 0.0)]


def test_a_paused_resumed_compaction_run_and_its_ablation_write_what_their_metrics_hold(tmp_path: Path) -> None:
    run_dir, shared = tmp_path / "compaction", tmp_path / "tb"
    argv = ["--demo", "compaction", *TINY, "--run-dir", str(run_dir), "--tensorboard-dir", str(shared)]
    assert main([*argv, "--stop-after", "5"]) == 0
    assert main([*argv, "--resume"]) == 0
    ablation = run_dir / "ablation"
    for metrics, events in [(run_dir, shared / "compaction"), (ablation, shared / "compaction" / "ablation")]:
        records = read_metrics(metrics / "metrics.jsonl")
        scalars = read_scalars(events)
        assert scalars == expected_scalars(records), events
        final = max(r["step"] for r in records)
        assert scalars["eval/success"][-1] == (final, float32(records_labelled(records, "after_rl")["success"]))
        assert {"sft/loss", "train/reward", "train/segments", "eval/compaction_off/success"} <= set(scalars)
    main_records = read_metrics(run_dir / "metrics.jsonl")
    masked = records_labelled(main_records, "after_rl_masked")
    assert read_scalars(shared / "compaction")["eval/after_rl_masked/success"] == [
        (masked["step"], float32(masked["success"]))
    ]
    assert not (run_dir / "tensorboard").exists()  # --tensorboard-dir moved them


def records_labelled(records: list[dict[str, Any]], label: str) -> dict[str, Any]:
    return next(r for r in reversed(records) if r.get("label") == label)


def test_the_default_directory_and_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tensorboard_events_dir("runs/demo", None) == Path("runs/demo").resolve() / "tensorboard" / "demo"
    assert tensorboard_events_dir("runs/seed1", "runs/tb") == Path("runs/tb/seed1")
    assert tensorboard_events_dir(".", None).name == Path.cwd().name
    assert main(["--no-tensorboard", "--tensorboard-dir", str(tmp_path), "--run-dir", str(tmp_path)]) == 2
    assert "contradict" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["--tensorboard-dir", str(tmp_path / "file"), "--run-dir", str(tmp_path / "run")]) == 2
    assert "--tensorboard-dir: cannot create" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_openrlhf_launcher_points_openrlhf_where_the_local_trainer_writes(tmp_path: Path) -> None:
    """`apps/train --backend openrlhf` passes ``--logger.tensorboard_dir RUN_DIR/tensorboard`` (OpenRLHF adds its run
    name below it): the directory a local run's event files go under by default."""
    from agent_runtime.recipe import load_recipe
    from agent_train import LaunchConfig, plan_launch

    recipe_file = Path(__file__).resolve().parents[2] / "recipes" / "calculator.py"
    config = LaunchConfig(recipe=str(recipe_file), pretrain="Qwen/Qwen3-4B", run_dir=str(tmp_path / "calculator"))
    args = plan_launch(config, load_recipe(recipe_file)).train_args
    given = Path(args[args.index("--logger.tensorboard_dir") + 1])
    assert given == tensorboard_events_dir(tmp_path / "calculator", None).parent
