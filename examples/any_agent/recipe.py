"""Recipe: the plain OpenAI-client agent of `agent.py`, trained on the demo's calculator task.

    uv run apps/train --backend openrlhf --recipe examples/any_agent/recipe.py --pretrain Qwen/Qwen3-4B --dry-run

The agent is the program (`AgentProgram(calculator_agent)`): in rollouts it runs against a per-episode endpoint of
the policy, and its answer is scored by the demo's reward (the number after "The answer is"). Everything else is
the demo recipe's (`agent_demo.recipe`): its chat format, budgets and dataset, and its environment, whose
calculator has the same schema as the program's, so that the local trainer's evaluation and SFT (which run the
recipe's own session) and the program's rollouts show the model the same prompt. `make_recipe("subprocess")` runs
the same loop as a separate Python process per episode (`AgentProgram.command`), reached through the gateway.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Literal

from agent_demo.recipe import make_recipe as demo_recipe
from agent_env import CalculatorTool, FunctionCallEnvironment
from agent_protocol import ToolSpec
from agent_runtime import Recipe
from agent_runtime.agent_program import AgentProgram

try:
    from examples.any_agent.agent import calculator_agent
    from examples.any_agent.sdk_agent import sdk_calculator_agent, sdk_responses_calculator_agent
except ModuleNotFoundError:  # loaded by path (`apps/train --recipe examples/any_agent/recipe.py`): the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples.any_agent.agent import calculator_agent
    from examples.any_agent.sdk_agent import sdk_calculator_agent, sdk_responses_calculator_agent

__all__ = ["SUBPROCESS_AGENT", "make_recipe", "recipe"]


SUBPROCESS_AGENT = Path(__file__).resolve().parent / "subprocess_agent.py"
_NAMES = {"loop": "any-agent-calculator", "sdk": "any-agent-sdk", "subprocess": "any-agent-subprocess"}
_NAMES["sdk-responses"] = "any-agent-sdk-responses"
_FUNCTIONS = {"loop": calculator_agent, "sdk": sdk_calculator_agent, "sdk-responses": sdk_responses_calculator_agent}


class SDKListedCalculator(CalculatorTool):
    """The demo's calculator as the Agents SDK lists it: its function tool carries ``"strict": false`` (after the
    name, description and parameters), which the chat template prints as it prints any key of a tool. The SDK
    recipes' environment has it, so that the warm start's SFT and evaluation (the recipe's own session) show the
    model the prompt the SDK's rollouts show it; with the plain calculator the demo model, trained on the other
    listing, never called the tool from the SDK's prompt (held-out 0.000 before and after RL)."""

    @property
    def spec(self) -> ToolSpec:
        function = {"name": self.name, "description": self.description, "parameters": self.parameters, "strict": False}
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=self.parameters,
            source={"type": "function", "function": function},
        )


def sdk_environment() -> FunctionCallEnvironment:
    """The demo's environment (`agent_demo.recipe.demo_environment`) with the SDK's listing of its calculator."""
    return FunctionCallEnvironment(tools=[SDKListedCalculator(timeout_s=5.0)], max_steps=3)


def make_recipe(agent: Literal["loop", "sdk", "sdk-responses", "subprocess"] = "loop") -> Recipe:
    """The demo recipe with the plain loop (`agent.py`), the OpenAI Agents SDK agent (`sdk_agent.py`), or the plain
    loop as a script of its own run per episode through the gateway (`subprocess_agent.py`); ``"sdk-responses"`` is
    the SDK agent on its default, Responses API model."""
    demo = demo_recipe()
    if agent == "subprocess":
        argv = [sys.executable, str(SUBPROCESS_AGENT)]
        program = AgentProgram.command(argv, timeout_s=120.0, max_episode_tokens=256, model_name=demo.name)
    else:
        function = _FUNCTIONS[agent]
        program = AgentProgram(function, timeout_s=120.0, max_episode_tokens=256, model_name=demo.name)
    if agent in ("sdk", "sdk-responses"):
        return dataclasses.replace(demo, name=_NAMES[agent], agent=program, environment=sdk_environment)
    return dataclasses.replace(demo, name=_NAMES[agent], agent=program)


recipe = make_recipe()
