"""`replacing_dir`: the new directory takes the old one's place only when it was written completely."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_train.atomic_dir import replacing_dir


def test_a_finished_block_replaces_the_directory_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "nested" / "checkpoint"
    with replacing_dir(target) as scratch:  # the parent is created
        scratch.mkdir()
        (scratch / "a.txt").write_text("first")
    with replacing_dir(target) as scratch:
        assert (target / "a.txt").read_text() == "first"  # the old one is still whole while the new one is written
        scratch.mkdir()
        (scratch / "b.txt").write_text("second")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in target.parent.iterdir()] == ["checkpoint"]


def test_a_failed_block_leaves_the_old_directory_and_removes_the_scratch(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with replacing_dir(target) as scratch:
        scratch.mkdir()
        (scratch / "weights").write_text("good")
    with pytest.raises(OSError, match="disk full"), replacing_dir(target) as scratch:
        scratch.mkdir()
        (scratch / "weights").write_text("half")
        raise OSError("disk full")
    assert (target / "weights").read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
