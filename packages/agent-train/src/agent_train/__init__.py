"""agent-train: the OpenRLHF glue. A recipe's agent, trained with OpenRLHF, is byte for byte the agent
`apps/serve` runs.

- `AgentExecutor` (`agent_train.openrlhf.executor`): the recipe's `AgentSession`, driven by `AgentRuntime` against
  OpenRLHF's vLLM rollout engine, returning the dict OpenRLHF trains on. `AGENT_FUNC_PATH` is the file to pass as
  ``--train.agent_func_path``; it reads the recipe from ``AGENT_RECIPE``.
- Launcher (`agent_train.openrlhf.launcher`): `LaunchConfig` -> `plan_launch` -> `prepare_data` / `check_plan`
  (OpenRLHF's own parser) -> `run_plan` (local Ray, or ``ray job submit``).
- Data: `prepare_recipe_dataset`, `prepare_jsonl_dataset` (OpenRLHF's prompt JSONL, errors name line and field).

The OpenRLHF glue lives in `agent_train.openrlhf`; the local trainer in `agent_train.local`. Importing this package
is light: OpenRLHF, vLLM and torch are imported only by `agent_train.openrlhf.executor` and
`agent_train.openrlhf.agent_func` (the executor is also reachable lazily from here).
"""

from __future__ import annotations

import importlib
import warnings
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from agent_train.errors import DatasetError, LaunchError, TrainError
from agent_train.openrlhf.arguments import CheckedArguments, build_parser, check_arguments
from agent_train.openrlhf.dataset import (
    INPUT_KEY,
    LABEL_KEY,
    openrlhf_record,
    prepare_jsonl_dataset,
    prepare_recipe_dataset,
    read_rows,
    recipe_rows,
    write_dataset,
)
from agent_train.openrlhf.launcher import (
    AGENT_FUNC_PATH,
    ALGORITHMS,
    DEVICES,
    MODES,
    LaunchConfig,
    LaunchPlan,
    check_plan,
    format_command,
    plan_launch,
    prepare_data,
    run_plan,
)
from agent_train.openrlhf.rollout_engine import OpenRLHFEngine
from agent_train.sample import ERROR_CODES, RolloutSample, extra_log_keys, extra_logs, mean_logs, sample_from_trajectory
from agent_train.task import AgentTask, decode_task, encode_task, label_of

if TYPE_CHECKING:
    from agent_train.openrlhf.executor import AgentExecutor, Rollout, as_tokenizer

__all__ = [
    "AGENT_FUNC_PATH",
    "ALGORITHMS",
    "DEVICES",
    "ERROR_CODES",
    "INPUT_KEY",
    "LABEL_KEY",
    "MODES",
    "AgentExecutor",
    "AgentTask",
    "CheckedArguments",
    "DatasetError",
    "LaunchConfig",
    "LaunchError",
    "LaunchPlan",
    "OpenRLHFEngine",
    "Rollout",
    "RolloutSample",
    "TrainError",
    "__version__",
    "as_tokenizer",
    "build_parser",
    "check_arguments",
    "check_plan",
    "decode_task",
    "encode_task",
    "extra_log_keys",
    "extra_logs",
    "format_command",
    "label_of",
    "mean_logs",
    "openrlhf_record",
    "plan_launch",
    "prepare_data",
    "prepare_jsonl_dataset",
    "prepare_recipe_dataset",
    "read_rows",
    "recipe_rows",
    "run_plan",
    "sample_from_trajectory",
    "write_dataset",
]

__version__ = _version("agent-train")

_LAZY = {
    "AgentExecutor": "agent_train.openrlhf.executor",
    "Rollout": "agent_train.openrlhf.executor",
    "as_tokenizer": "agent_train.openrlhf.executor",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "LocalRolloutEngine":  # deprecated: a test-only engine, moved out of the package
        warnings.warn(
            "agent_train.LocalRolloutEngine is deprecated: it is a test fake, now "
            "tests.support.local_rollout_engine.LocalRolloutEngine in the repository",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("tests.support.local_rollout_engine").LocalRolloutEngine
    raise AttributeError(f"module 'agent_train' has no attribute {name!r}")
