"""apps/train: the CLI wiring (dry-run launch, the data command, errors, the local backend's placeholder)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import structlog

from tests.support.train_app import load_train_app

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "calculator.py"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The app configures structlog for the process (to the stream pytest captures); undo it after each test."""
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="module")
def app() -> ModuleType:
    return load_train_app("apps_train_main")


def test_dry_run_prints_the_openrlhf_command(
    app: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--backend", "openrlhf", "--recipe", str(RECIPE), "--pretrain", "Qwen/Qwen3-4B", "--algo", "grpo"]
    code = app.main([*argv, "--run-dir", str(tmp_path), "--dry-run", "--", "--ckpt.save_steps", "5"])
    out = capsys.readouterr().out
    assert code == 0
    assert "-m agent_train.openrlhf.main" in out and "--algo.advantage.estimator group_norm" in out
    assert out.rstrip().endswith("--ckpt.save_steps 5")
    assert len((tmp_path / "data" / "train.jsonl").read_text().splitlines()) == 2048


def test_a_flag_openrlhf_does_not_know_is_an_error(
    app: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--backend", "openrlhf", "--recipe", str(RECIPE), "--pretrain", "m", "--run-dir", str(tmp_path)]
    assert app.main([*argv, "--dry-run", "--", "--no.such_flag", "1"]) == 2
    assert "unrecognized arguments: --no.such_flag" in capsys.readouterr().err
    assert app.main(["--backend", "openrlhf", "--recipe", str(RECIPE)]) == 2
    assert "needs --recipe PATH and --pretrain MODEL" in capsys.readouterr().err


def test_data_command(app: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"q": "1+1?", "a": "2"}) + "\n" + json.dumps({"q": ""}) + "\n")
    out = tmp_path / "out.jsonl"
    assert app.main(["data", "--input", str(source), "--prompt-key", "q", "--output", str(out)]) == 2
    assert f"{source}:2: field 'prompt' is an empty string" in capsys.readouterr().err
    source.write_text(json.dumps({"q": "1+1?", "a": "2"}) + "\n")
    assert (
        app.main(["data", "--input", str(source), "--prompt-key", "q", "--label-key", "a", "--output", str(out)]) == 0
    )
    assert json.loads(out.read_text())["label"] == "2"
    assert app.main(["data", "--recipe", str(RECIPE), "--split", "test", "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 256


def test_openrlhf_options_with_the_local_backend_are_refused_not_ignored(
    app: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        app.main(["--seed", "3", "--lr", "1e-5"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--lr, --seed: for --backend openrlhf only" in err and "after `--`" in err


def test_the_local_trainer_reports_a_bad_option_of_its_own(app: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        app.main(["--", "--preset", "nope"])
    assert exited.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_the_directory_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "apps" / "train"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--backend {local,openrlhf}" in done.stdout and "REINFORCE++-baseline" in done.stdout


def test_importing_agent_train_stays_light() -> None:
    heavy = "('torch', 'transformers', 'vllm', 'ray', 'openrlhf.utils')"
    code = f"import sys, agent_train; print(sorted(m for m in {heavy} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
