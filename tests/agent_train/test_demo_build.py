"""Where the demo model is cached, how it is found and installed, and what `ensure_demo_model` does when it is
there, stale, or cannot be built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_train.demo.build import (
    DEMO_BUILD,
    demo_home,
    demo_model_dir,
    ensure_demo_model,
    find_demo_model,
    install_demo_model,
)
from agent_train.errors import TrainError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OPENRLHF_AGENT_HOME", str(tmp_path / "agent-home"))
    return tmp_path / "agent-home" / "demo"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from tests.support.tiny_demo import save_tiny_demo_model

    return save_tiny_demo_model(tmp_path_factory.mktemp("trained"))


def test_the_cache_location_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENRLHF_AGENT_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert demo_home() == tmp_path / ".cache" / "openrlhf-agent" / "demo"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo_home() == tmp_path / "xdg" / "openrlhf-agent" / "demo"
    monkeypatch.setenv("OPENRLHF_AGENT_HOME", str(tmp_path / "home"))
    assert demo_home() == tmp_path / "home" / "demo"
    assert demo_model_dir() == tmp_path / "home" / "demo" / "model"


def test_install_then_find(home: Path, model_dir: Path, tmp_path: Path) -> None:
    assert find_demo_model() is None
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"figures": {"before": 0.0, "after_sft": 0.5, "after_rl": 0.7}, "seed": 3}))
    installed = install_demo_model(model_dir, summary=summary)
    assert installed == home / "model" == find_demo_model()
    stamp = json.loads((installed / "demo_build.json").read_text())
    assert stamp["build"] == DEMO_BUILD and stamp["figures"]["after_rl"] == 0.7 and stamp["seed"] == 3
    assert ensure_demo_model(progress=False) == installed  # found: nothing is built
    again = install_demo_model(model_dir)  # replacing an installed model leaves no debris
    assert again == installed and sorted(p.name for p in home.iterdir()) == ["model"]


def test_a_model_of_another_build_or_an_incomplete_one_is_not_found(home: Path, model_dir: Path) -> None:
    installed = install_demo_model(model_dir)
    stamp = json.loads((installed / "demo_build.json").read_text())
    (installed / "demo_build.json").write_text(json.dumps({**stamp, "build": DEMO_BUILD + 1}))
    assert find_demo_model() is None
    install_demo_model(model_dir)
    (installed / "model.safetensors").unlink()
    assert find_demo_model() is None
    with pytest.raises(TrainError, match="not a complete model directory"):
        install_demo_model(home / "nowhere")


@pytest.fixture
def build_that_fails(home: Path, model_dir: Path) -> Path:
    """A cache whose build directory holds a checkpoint of another configuration: a real child build stops at once."""
    pytest.importorskip("torch")
    from tokenizers import Tokenizer

    from agent_train.demo.model import load_demo_model
    from agent_train.local.checkpoint import TrainerState, save_checkpoint
    from agent_train.local.config import LocalTrainConfig

    save_checkpoint(
        home / "build" / "checkpoint",
        model=load_demo_model(model_dir),
        tokenizer=Tokenizer.from_file(str(model_dir / "tokenizer.json")),
        state=TrainerState(config=LocalTrainConfig(seed=987654)),
        optimizer=None,
        rng={},
    )
    return home


def test_a_failed_build_raises_and_names_its_log(build_that_fails: Path) -> None:
    with pytest.raises(TrainError, match=r"build\.log"):
        ensure_demo_model(progress=False)
    assert "different configuration" in (build_that_fails / "build.log").read_text()
    assert find_demo_model() is None


def test_apps_serve_exits_with_the_build_log_when_the_demo_build_fails(build_that_fails: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.support.serve_process import APP, ROOT, free_port

    done = subprocess.run(
        [sys.executable, str(APP), "--port", str(free_port())],
        cwd=ROOT,
        env={**os.environ, "OPENRLHF_AGENT_HOME": str(build_that_fails.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "apps/serve: the demo model could not be built" in done.stderr
    assert str(build_that_fails / "build.log") in done.stderr and "Traceback" not in done.stderr
