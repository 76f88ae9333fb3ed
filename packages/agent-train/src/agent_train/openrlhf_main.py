"""``python -m agent_train.openrlhf_main ARGS``: OpenRLHF's ``train_ppo_ray`` with the segment extension.

It installs `agent_train.openrlhf_segments` here (which fails before anything starts when the installed OpenRLHF
is not the pinned one), sets ``RAY_RUNTIME_ENV_HOOK`` so that the `ray.init` OpenRLHF calls gives every Ray worker
of the job the extension as its `worker_process_setup_hook`, and runs OpenRLHF's own ``__main__`` block with the
same arguments. Ray ignores the hook for a driver started by ``uv run`` unless ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0``,
which the launcher sets for a local run. The same works as the entry point of a ``ray job submit`` job: Ray
merges the job's runtime env with the driver's before the hook adds the setup hook. The launcher runs this module.
"""

from __future__ import annotations

import os
import runpy
from typing import Final

from agent_train.openrlhf_segments import install

__all__ = ["RUNTIME_ENV_HOOK", "TRAIN_MODULE", "main"]

TRAIN_MODULE: Final = "openrlhf.cli.train_ppo_ray"
RUNTIME_ENV_HOOK: Final = "agent_train.openrlhf_segments.runtime_env_hook"


def main() -> None:
    """Install the extension, then run OpenRLHF's ``train_ppo_ray`` main block on ``sys.argv[1:]``."""
    install()
    hook = os.environ.setdefault("RAY_RUNTIME_ENV_HOOK", RUNTIME_ENV_HOOK)
    if hook != RUNTIME_ENV_HOOK:
        raise SystemExit(
            f"RAY_RUNTIME_ENV_HOOK is set to {hook!r}; the segment extension installs itself in Ray's workers through "
            f"{RUNTIME_ENV_HOOK!r}: unset it, or call that hook from yours"
        )
    runpy.run_module(TRAIN_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
