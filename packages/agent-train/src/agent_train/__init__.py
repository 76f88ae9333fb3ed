"""agent-train: the OpenRLHF glue. A recipe's agent, trained with OpenRLHF, is byte for byte the agent
`apps/serve` runs.

- `AgentExecutor` (`agent_train.executor`): the recipe's `AgentSession`, driven by `AgentRuntime` against
  OpenRLHF's vLLM rollout engine, returning the dict OpenRLHF trains on. `AGENT_FUNC_PATH` is the file to pass as
  ``--train.agent_func_path``; it reads the recipe from ``AGENT_RECIPE``.
- `LocalRolloutEngine`: OpenRLHF's rollout-engine contract served by any `LLMEngine` (the `hf` engine on CPU), for
  the local trainer and tests.
- Launcher: `LaunchConfig` -> `plan_launch` -> `prepare_data` / `check_plan` (OpenRLHF's own parser) ->
  `run_plan` (local Ray, or ``ray job submit``).
- Data: `prepare_recipe_dataset`, `prepare_jsonl_dataset` (OpenRLHF's prompt JSONL, errors name line and field).

Importing this package is light: OpenRLHF, vLLM and torch are imported only by `agent_train.executor`,
`agent_train.openrlhf_agent` and `agent_train.local_rollout_engine` (also reachable lazily from here).
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from agent_train.dataset import (
    INPUT_KEY,
    LABEL_KEY,
    openrlhf_record,
    prepare_jsonl_dataset,
    prepare_recipe_dataset,
    read_rows,
    recipe_rows,
    write_dataset,
)
from agent_train.errors import DatasetError, LaunchError, TrainError
from agent_train.launcher import (
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
from agent_train.openrlhf_args import CheckedArguments, build_parser, check_arguments
from agent_train.openrlhf_engine import OpenRLHFEngine
from agent_train.sample import ERROR_CODES, RolloutSample, extra_log_keys, extra_logs, mean_logs, sample_from_trajectory
from agent_train.task import AgentTask, decode_task, encode_task, label_of

if TYPE_CHECKING:
    from agent_train.executor import AgentExecutor, Rollout, as_tokenizer
    from agent_train.local_rollout_engine import LocalRolloutEngine

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
    "LocalRolloutEngine",
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
    "AgentExecutor": "agent_train.executor",
    "Rollout": "agent_train.executor",
    "as_tokenizer": "agent_train.executor",
    "LocalRolloutEngine": "agent_train.local_rollout_engine",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agent_train' has no attribute {name!r}")
