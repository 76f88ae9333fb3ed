"""OpenRLHF's own `generate_responses` gathers 8 episodes with a bare `asyncio.gather`: one environment raising
any `BaseException` (`GeneratorExit`, a custom subclass, its own `CancelledError`, a `BaseExceptionGroup`, one
whose ``__str__`` raises) must end only its episode, coded, and the other 7 come back scored. The local trainer's
`Rollouts.collect` gets the same environment. Driven as in `test_rollout_batch_boundary.py`; the module prints its
figure (``uv run pytest tests/agent_train/test_rollout_base_exceptions.py -s``)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline, ToolCallReward
from agent_protocol import Action, HFTokenizer
from agent_runtime import Recipe, ScriptedEngine
from agent_train.local.rollout import Rollouts
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.task import encode_task
from tests.agent_runtime.test_episode_base_exceptions import FAULTS
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.test_executor import openrlhf_params
from tests.agent_train.test_rollout_batch_boundary import ActorStandIn

SAMPLES = 8


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[dict[str, list[int]]]:
    counts = {"samples": [0, 0], "faults": [0, 0]}
    yield counts
    (back, run), (contained, thrown) = counts["samples"], counts["faults"]
    print(f"\nOpenRLHF's generate_responses and the local collect, 1 environment raising a BaseException per batch: "
          f"{back} / {run} samples back, {contained} / {thrown} faults contained")  # fmt: skip


def one_bad_environment(fault: Callable[[], BaseException], *, bad: int) -> Callable[[], FunctionCallEnvironment]:
    """An environment factory: the `bad`-th episode to be reset gets an environment whose step raises `fault()`."""
    resets = itertools.count(1)

    class OneBad(FunctionCallEnvironment):
        async def reset(self, task: Any = None) -> None:
            await super().reset(task)
            self.bad = next(resets) == bad

        async def step(self, action: Action) -> Any:
            if self.bad:
                raise fault()
            return await super().step(action)

    return lambda: OneBad(tools=[CalculatorTool()], max_steps=4)


def recipe_with(environment: Callable[[], FunctionCallEnvironment]) -> Recipe:
    """`conftest.calculator_recipe` with `environment`."""
    return Recipe(
        name="calc",
        protocol="qwen3",
        environment=environment,
        rewards=RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()]),
        max_new_tokens=64,
    )


def policy(tokenizer: HFTokenizer) -> Callable[[Any], str]:
    return lambda prompt: answer("391") if "<tool_response>" in tokenizer.decode(prompt) else call("17 * 23")


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_openrlhf_generate_responses_keeps_7_of_8_when_one_environment_raises(
    tokenizer: HFTokenizer, hf_tokenizer: Any, fault: str, tally: dict[str, list[int]]
) -> None:
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    generate_responses = RolloutRayActor.__ray_metadata__.modified_class.generate_responses  # OpenRLHF's code
    recipe = recipe_with(one_bad_environment(FAULTS[fault], bad=4))
    actor = ActorStandIn(ScriptedEngine(tokenizer, policy=policy(tokenizer)), AgentExecutor(recipe))
    prompt = encode_task({"prompt": QUESTION, "answer": "391"})
    tally["samples"][1] += SAMPLES
    tally["faults"][1] += 1

    async def main() -> list[dict[str, Any]]:
        params = openrlhf_params(logprobs=True)
        async with asyncio.timeout(20):
            samples: list[dict[str, Any]] = await generate_responses(
                actor, prompt, "391", params, 4096, hf_tokenizer, num_samples=SAMPLES, images=None
            )
        return samples

    try:
        samples = asyncio.run(main())
    except BaseException as e:  # the point of the test: one episode must not end the training step
        pytest.fail(f"{type(e).__name__} escaped generate_responses: {e!r}")
    tally["samples"][0] += len(samples)

    assert len(samples) == SAMPLES
    logs = [s["extra_logs"] for s in samples]
    assert sum(log["agent_error_environment_error"] for log in logs) == 1
    assert sum(s["reward"] > 0 for s in samples) == SAMPLES - 1
    tally["faults"][0] += 1


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_local_rollouts_keep_every_other_episode_when_one_environment_raises(
    tokenizer: HFTokenizer, fault: str, tally: dict[str, list[int]]
) -> None:
    recipe = recipe_with(one_bad_environment(FAULTS[fault], bad=2))
    rollouts = Rollouts(recipe, ScriptedEngine(tokenizer, policy=policy(tokenizer)), max_length=4096)
    rows: list[dict[str, Any]] = [{"prompt": QUESTION, "answer": "391"}] * 2
    tally["samples"][1] += 6
    tally["faults"][1] += 1
    try:
        records = asyncio.run(rollouts.collect(rows, group_size=3, temperature=1.0, seed=0))
    except BaseException as e:
        pytest.fail(f"{type(e).__name__} escaped collect: {e!r}")
    tally["samples"][0] += len(records)

    assert len(records) == 6
    assert sum(r.extra_logs["agent_error_environment_error"] for r in records) == 1
    assert sum(r.reward > 0 for r in records) == 5
    tally["faults"][0] += 1
