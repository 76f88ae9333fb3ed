"""Held-out evaluation by group, and the command that evaluates a saved demo model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_train.local.evaluate import success_by
from tests.support.tiny_demo import save_tiny_demo_model


def test_success_is_split_by_a_row_field() -> None:
    trajectories: Any = [SimpleNamespace(reward=r) for r in (1.0, 0.0, 1.0, 1.0, 0.5)]
    rows = [{"phrasing": "plain"}, {"phrasing": "plain"}, {"phrasing": "word"}, {}, {"phrasing": "word"}]
    assert success_by(trajectories, rows, "phrasing") == {"?": 1.0, "plain": 0.5, "word": 0.5}
    with pytest.raises(ValueError):
        success_by(trajectories, rows[:2], "phrasing")


def test_the_command_evaluates_a_saved_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from agent_train.local.evaluate import main

    save_tiny_demo_model(tmp_path)
    assert main([str(tmp_path), "--size", "6"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]  # (structlog's default logger prints to stdout too)
    # an untrained model solves nothing; the first six held-out problems hold both phrasings
    assert last == "held-out success (6 problems, greedy): 0.0% (plain 0.0%, word 0.0%)"


def test_the_command_refuses_a_directory_without_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agent_train.local.evaluate import main

    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path)])
    assert exited.value.code == 2
    assert f"{tmp_path} is not a model directory" in capsys.readouterr().err
