"""Where the demo model lives, and how it gets there: `find_demo_model()` and `ensure_demo_model()`, which
`apps/serve` calls when no model is named.

    path = find_demo_model()                  # the installed demo model directory, or None
    path = ensure_demo_model(progress=True)   # ... or train it first (about 8 minutes on two CPU cores)

Cache location (the first that applies):

1. ``$OPENRLHF_AGENT_HOME/demo/`` when ``OPENRLHF_AGENT_HOME`` is set;
2. ``$XDG_CACHE_HOME/openrlhf-agent/demo/`` when ``XDG_CACHE_HOME`` is set;
3. ``~/.cache/openrlhf-agent/demo/``.

Inside it, ``model/`` is the installed Hugging Face model directory of the calculator demo (with
``demo_build.json``: the build version and the held-out figures of the run that made it), ``build/`` the run
directory of the last build (metrics, plot, checkpoints; an interrupted build resumes from there) and
``build.log`` its log. `uv run apps/train` installs its final model here too. The compaction demo's has the same
layout in ``compaction/`` (``compaction/model/``, ``compaction/build/``). A model whose ``demo_build.json``
names another `DEMO_BUILD` is stale and is rebuilt.

`ensure_demo_model` trains in a child process (``python -m agent_train.local.cli``): the caller's process does
not import vLLM or OpenRLHF, its logging is untouched (the child's log goes to ``build.log``), and the progress
bar is drawn on the caller's stderr. Concurrent callers wait on a file lock; only one builds.
This module knows paths and processes; the training itself is `agent_train.local`'s.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import structlog

from agent_train.atomic_dir import replacing_dir
from agent_train.demo.model import is_model_dir
from agent_train.errors import TrainError

__all__ = [
    "DEMO_BUILD",
    "demo_home",
    "demo_model_dir",
    "ensure_demo_model",
    "find_demo_model",
    "install_demo_model",
]

logger = structlog.get_logger(__name__)

DEMO_BUILD: Final = 2  # 2: the expert states its plan before the call
"""The version of the demo's definition (task, tokenizer, model shape, trainer); bump it when a change makes a
previously installed demo model wrong for this code, and it is rebuilt on next use."""

_STAMP: Final = "demo_build.json"


def demo_home() -> Path:
    """The demo's cache directory (see the module docstring); not created here."""
    if home := os.environ.get("OPENRLHF_AGENT_HOME"):
        return Path(home).expanduser() / "demo"
    if cache := os.environ.get("XDG_CACHE_HOME"):
        return Path(cache).expanduser() / "openrlhf-agent" / "demo"
    return Path.home() / ".cache" / "openrlhf-agent" / "demo"


def _demo_dir(demo: str) -> Path:
    return demo_home() if demo == "calculator" else demo_home() / demo


def demo_model_dir(demo: str = "calculator") -> Path:
    """Where the installed model of `demo` (``calculator`` or ``compaction``) is (or would be)."""
    return _demo_dir(demo) / "model"


def _stamp(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / _STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def find_demo_model(demo: str = "calculator") -> Path | None:
    """The installed model directory of `demo` when it is complete and of the current `DEMO_BUILD`, else None."""
    path = demo_model_dir(demo)
    if not is_model_dir(path):
        return None
    stamp = _stamp(path)
    if stamp is None or stamp.get("build") != DEMO_BUILD:
        return None
    return path


def install_demo_model(model_dir: str | Path, *, summary: str | Path | None = None, demo: str = "calculator") -> Path:
    """Copy a trained model directory into the cache as the model of `demo` (atomically: a reader sees the old one
    or the new one, never a half-copied one). `summary` is the run's ``summary.json``, kept in the stamp."""
    source = Path(model_dir)
    if not is_model_dir(source):
        raise TrainError(f"{source} is not a complete model directory; nothing installed")
    target = demo_model_dir(demo)
    run = json.loads(Path(summary).read_text(encoding="utf-8")) if summary is not None else {}
    stamp = {"build": DEMO_BUILD, "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "source": str(source)}
    stamp.update({k: run[k] for k in ("figures", "eval_episodes", "seed", "elapsed_s") if k in run})
    with replacing_dir(target) as scratch:
        shutil.copytree(source, scratch)
        (scratch / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    logger.info("demo_model_installed", path=str(target), figures=stamp.get("figures"))
    return target


def ensure_demo_model(progress: bool = True, demo: str = "calculator") -> Path:
    """The model directory of `demo`, trained and installed first when missing or stale (see the module
    docstring). Raises `TrainError` naming the build log when the build fails."""
    found = find_demo_model(demo)
    if found is not None:
        return found
    home = _demo_dir(demo)
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building; wait for it
        found = find_demo_model(demo)
        if found is not None:
            return found
        return _build(home, progress, demo)


def _build(home: Path, progress: bool, demo: str = "calculator") -> Path:
    log_path = home / "build.log"
    command = [sys.executable, "-m", "agent_train.local.cli", "--run-dir", str(home / "build"), "--resume"]
    if demo != "calculator":  # the ablation is a measurement, not part of the model
        command += ["--demo", demo, "--no-ablation"]
    if not progress:
        command.append("--no-progress")
    logger.info("demo_model_building", run_dir=str(home / "build"), log=str(log_path))
    if progress:
        print(f"Building the {demo} demo model (minutes on 2 CPU cores, once); log: {log_path}", file=sys.stderr)
    started = time.monotonic()
    with log_path.open("ab") as log:
        code = subprocess.run(command, stdout=log, stderr=None if progress else log, check=False).returncode
    found = find_demo_model(demo)
    if code != 0 or found is None:
        raise TrainError(f"building the demo model failed (exit code {code}); see {log_path}")
    logger.info("demo_model_built", path=str(found), seconds=round(time.monotonic() - started, 1))
    return found
