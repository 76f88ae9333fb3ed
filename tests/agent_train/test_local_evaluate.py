"""Held-out evaluation by group, and the command that evaluates a saved demo model."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from agent_train.local.evaluate import success_by
from tests.support.tiny_demo import save_tiny_demo_model


def test_success_is_split_by_a_row_field() -> None:
    trajectories: Any = [SimpleNamespace(reward=r) for r in (1.0, 0.0, 1.0, 1.0, 0.5)]
    rows = [{"phrasing": "plain"}, {"phrasing": "plain"}, {"phrasing": "word"}, {}, {"phrasing": "word"}]
    assert success_by(trajectories, rows, "phrasing") == {"?": 1.0, "plain": 0.5, "word": 0.5}
    with pytest.raises(ValueError):
        success_by(trajectories, rows[:2], "phrasing")


def _logging_state() -> tuple[Any, ...]:
    """What a library must leave alone: structlog's configuration, the root logger, transformers' progress bars."""
    from transformers.utils import logging as hf_logging

    root = logging.getLogger()
    return dict(structlog.get_config()), list(root.handlers), root.level, hf_logging.is_progress_bar_enabled()


def test_the_command_evaluates_a_saved_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from agent_train.local.evaluate import main

    save_tiny_demo_model(tmp_path)
    before = _logging_state()
    assert main([str(tmp_path), "--size", "6"]) == 0
    assert _logging_state() == before  # called as a library, it configures no logging (its __main__ block does)
    last = capsys.readouterr().out.strip().splitlines()[-1]  # (structlog's default logger prints to stdout too)
    # an untrained model solves nothing; the first six held-out problems hold both phrasings
    assert last == "held-out success (6 problems, greedy): 0.0% (plain 0.0%, word 0.0%)"


def test_the_command_refuses_a_directory_without_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agent_train.local.evaluate import main

    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path)])
    assert exited.value.code == 2
    assert f"{tmp_path} is not a model directory" in capsys.readouterr().err
