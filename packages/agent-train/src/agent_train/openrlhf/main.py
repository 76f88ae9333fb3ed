"""``python -m agent_train.openrlhf.main ARGS``: OpenRLHF's ``train_ppo_ray`` with the segment extension.

It installs `agent_train.openrlhf.segments` here (which fails before anything starts when the installed OpenRLHF
is not the pinned one), sets ``RAY_RUNTIME_ENV_HOOK`` so that the `ray.init` OpenRLHF calls gives every Ray worker
of the job the extension as its `worker_process_setup_hook`, and runs OpenRLHF's own ``__main__`` block with the
same arguments. With ``AGENT_OPENRLHF_DEVICE=cpu`` (the launcher's ``--device cpu``) it applies the CPU bridges
(`cpu_bridges`), starts Ray itself with the GPUs the job asks for as resources (nothing uses a GPU), and after the
job prints the verdict of the checks its processes recorded (`cpu_checks`; in async mode the vLLM-vs-actor gap is
not bounded: a step trains on rollouts older weights sampled), exiting 1 when one failed. Ray
ignores the hook for a driver started by ``uv run`` unless ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0``,
which the launcher sets for a local run. The same works as the entry point of a ``ray job submit`` job: Ray
merges the job's runtime env with the driver's before the hook adds the setup hook. The launcher runs this module.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any, Final

from agent_train.openrlhf import cpu_bridges, cpu_checks
from agent_train.openrlhf.segments import install

__all__ = ["RUNTIME_ENV_HOOK", "TRAIN_MODULE", "main"]

TRAIN_MODULE: Final = "openrlhf.cli.train_ppo_ray"
RUNTIME_ENV_HOOK: Final = "agent_train.openrlhf.segments.runtime_env_hook"


def main() -> None:
    """Install the extension, then run OpenRLHF's ``train_ppo_ray`` main block on ``sys.argv[1:]``."""
    # Ray ignores the worker setup hook for a driver under `uv run` unless this is 0 (read when Ray is imported)
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    constants: Any = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    install()
    hook = os.environ.setdefault("RAY_RUNTIME_ENV_HOOK", RUNTIME_ENV_HOOK)
    if hook != RUNTIME_ENV_HOOK:
        raise SystemExit(
            f"RAY_RUNTIME_ENV_HOOK is set to {hook!r}; the segment extension installs itself in Ray's workers through "
            f"{RUNTIME_ENV_HOOK!r}: unset it, or call that hook from yours"
        )
    if cpu_bridges.cpu_requested():
        start_ray_on_cpu(sys.argv[1:])
    runpy.run_module(TRAIN_MODULE, run_name="__main__", alter_sys=True)
    if cpu_bridges.cpu_requested() and cpu_checks.enabled():
        on_policy = "--train.async_enable" not in sys.argv[1:]  # async steps train on older weights' rollouts
        report = cpu_checks.verdict(os.environ[cpu_checks.CHECKS_ENV], on_policy=on_policy)
        print(f"\n== --device cpu checks ({os.environ[cpu_checks.CHECKS_ENV]})\n{report.summary()}", flush=True)
        if not report.ok:
            raise SystemExit(1)


def _flag(argv: list[str], name: str, default: int) -> int:
    """The value of `name` in `argv` as OpenRLHF's parser reads it: the last one given (the launcher appends a
    user's overrides after its own flags)."""
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == name]
    return int(values[-1]) if values else default


def start_ray_on_cpu(argv: list[str]) -> None:
    """Start a local Ray that has the GPUs the job asks for as resources (the most any placement asks for, at
    least one per vLLM engine), with the environment OpenRLHF's own `ray.init` would give its workers."""
    import ray

    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return
    actor = _flag(argv, "--actor.num_nodes", 1) * _flag(argv, "--actor.num_gpus_per_node", 8)
    critic = _flag(argv, "--critic.num_nodes", 1) * _flag(argv, "--critic.num_gpus_per_node", 8)
    engines = _flag(argv, "--vllm.num_engines", 1) * _flag(argv, "--vllm.tensor_parallel_size", 1)
    gpus = actor + (critic if "--critic.model_name_or_path" in argv else 0) + engines
    ray.init(
        num_gpus=gpus,
        num_cpus=max(16, 2 * gpus),
        include_dashboard=False,
        runtime_env={
            "env_vars": {
                "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
                "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
            }
        },
    )


if __name__ == "__main__":
    main()
