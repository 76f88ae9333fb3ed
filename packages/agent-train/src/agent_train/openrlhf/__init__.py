"""agent-train's OpenRLHF glue: everything here exists because OpenRLHF 0.11.2 trains the agent.

- `executor`: `AgentExecutor`, a recipe's agent as OpenRLHF's agent executor; `agent_func` is the file OpenRLHF
  loads by path (``--train.agent_func_path``, `agent_train.AGENT_FUNC_PATH`); `rollout_engine`: `OpenRLHFEngine`,
  OpenRLHF's vLLM rollout actor behind the `LLMEngine` interface.
- `launcher` (`LaunchConfig` -> `plan_launch` -> `check_plan` -> `run_plan`), `arguments` (OpenRLHF's own parser,
  run without starting anything), `presets` (the ``--algo`` presets), `dataset` (OpenRLHF's prompt JSONL).
- `main` (``python -m agent_train.openrlhf.main``): `train_ppo_ray` with `segments`, the extension that trains every
  segment of a compacted episode with the episode's advantage.
- ``--device cpu``: `cpu_bridges`, `cpu_weight_sync`, `cpu_checks`, and `optional_flash_attn` (OpenRLHF without
  flash-attn).

What the local trainer shares with this path lives beside it, one level up: `agent_train.task` (a dataset row on
its way to the executor) and `agent_train.sample` (a trajectory as OpenRLHF's training record). Importing this
package imports nothing; OpenRLHF, vLLM and torch come with `executor`, `agent_func`, `main` and the CPU modules.
"""
