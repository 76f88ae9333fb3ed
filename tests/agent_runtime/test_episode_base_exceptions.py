"""An episode is a boundary for every `BaseException`: whatever a component raises, `GeneratorExit`, a custom
`BaseException` subclass, a `CancelledError` of its own, a `BaseExceptionGroup`, an exception whose ``__str__``
raises, ends only its own episode with a coded error; `AgentRuntime.run_many` gets every result back.

Each fault is raised by a real component of one episode among `N` (its environment's step or reset, its reward
pipeline's result or process scoring, a result reward strategy inside agent-env's `RewardPipeline`, a parser
through a protocol subclass, the engine); the rest is the real Qwen3 tokenizer, the real calculator tool and
`ScriptedEngine`. Only `KeyboardInterrupt` and a real cancellation of the episode's task from outside propagate,
and a tool raising a `BaseException` whose ``__str__`` raises is answered at once. The module prints its figure
(``uv run pytest tests/agent_runtime/test_episode_base_exceptions.py -s``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent_env import (
    CalculatorTool,
    EpisodeRecord,
    FunctionCallEnvironment,
    FunctionTool,
    MatchingReward,
    RewardBreakdown,
    RewardPipeline,
    StepRecord,
    StepReward,
    ToolCallReward,
    ToolRunner,
)
from agent_protocol import Action, HFTokenizer, ToolCall, get_protocol
from agent_protocol.protocols.qwen3 import Qwen3Protocol
from agent_runtime import AgentRuntime, AgentSession, RunResult, ScriptedEngine
from tests.support.calculator_episode import qwen3_answer as answer
from tests.support.calculator_episode import qwen3_call as call

N = 6
BAD = 2  # the episode whose component raises
MARK = "the faulty one"  # in the bad episode's prompt and in the text its engine generates


class PluginAbort(BaseException):
    """A `BaseException` subclass of a plug-in's own."""


class Unreadable(BaseException):
    """An exception whose message cannot be read."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


FAULTS: dict[str, Callable[[], BaseException]] = {
    "GeneratorExit": lambda: GeneratorExit("a plug-in closed itself"),
    "custom BaseException": lambda: PluginAbort("a plug-in aborted"),
    "own CancelledError": lambda: asyncio.CancelledError("a plug-in cancelled itself"),
    "BaseExceptionGroup": lambda: BaseExceptionGroup("a plug-in's task group", [SystemExit(3), ValueError("inner")]),
    "unreadable __str__": Unreadable,
}
NAMED = {  # what the recorded message must name
    "GeneratorExit": "GeneratorExit",
    "custom BaseException": "PluginAbort",
    "own CancelledError": "CancelledError",
    "BaseExceptionGroup": "BaseExceptionGroup",
    "unreadable __str__": "could not be read",
}


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[dict[str, list[int]]]:
    """'episodes': [back, run]; 'faults': [contained, thrown]; printed once the module ran."""
    counts = {"episodes": [0, 0], "faults": [0, 0]}
    yield counts
    (back, run), (contained, thrown) = counts["episodes"], counts["faults"]
    print(f"\nany BaseException from one component of one episode: {back} / {run} episodes back, "
          f"{contained} / {thrown} faults contained (ended only their episode, coded by stage)")  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def _bad(task: Any) -> bool:
    return isinstance(task, dict) and bool(task.get("bad"))


def _components(fault: Callable[[], BaseException]) -> dict[str, Callable[[HFTokenizer], AgentSession]]:
    """component -> a session definition whose component raises `fault()` in the episode marked bad."""

    class StepRaises(FunctionCallEnvironment):
        async def reset(self, task: Any = None) -> None:
            await super().reset(task)
            self.bad = _bad(task)

        async def step(self, action: Action) -> Any:
            if self.bad:
                raise fault()
            return await super().step(action)

    class ResetRaises(FunctionCallEnvironment):
        async def reset(self, task: Any = None) -> None:
            if _bad(task):
                raise fault()
            await super().reset(task)

    class ResultRaises(RewardPipeline):
        async def score(self, episode: EpisodeRecord) -> RewardBreakdown:
            if episode.metadata.get("bad"):
                raise fault()
            return await super().score(episode)

    class ProcessRaises(RewardPipeline):
        async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> StepReward:
            if episode.metadata.get("bad"):
                raise fault()
            return await super().score_step(step, episode)

    class StrategyRaises(MatchingReward):
        async def score(self, episode: EpisodeRecord) -> float:
            if episode.metadata.get("bad"):
                raise fault()
            return await super().score(episode)

    class ParseRaises(Qwen3Protocol):
        def parse_assistant_text(self, text: str, *, call_id_prefix: str = "call") -> Action:
            if MARK in text:
                raise fault()
            return super().parse_assistant_text(text, call_id_prefix=call_id_prefix)

    def session(
        tokenizer: HFTokenizer,
        *,
        environment: type[FunctionCallEnvironment] = FunctionCallEnvironment,
        pipeline: type[RewardPipeline] = RewardPipeline,
        matching: type[MatchingReward] = MatchingReward,
        protocol: type[Qwen3Protocol] | None = None,
    ) -> AgentSession:
        qwen3 = get_protocol("qwen3")
        assert isinstance(qwen3, Qwen3Protocol)
        return AgentSession(
            protocol=qwen3 if protocol is None else protocol(qwen3.name, qwen3.mode),
            environment=lambda: environment(tools=[CalculatorTool()], max_steps=4),
            rewards=pipeline(result=[matching()], process=[ToolCallReward()]),
            tokenizer=tokenizer,
        )

    return {
        "environment step": lambda tok: session(tok, environment=StepRaises),
        "environment reset": lambda tok: session(tok, environment=ResetRaises),
        "result reward": lambda tok: session(tok, pipeline=ResultRaises),
        "process reward": lambda tok: session(tok, pipeline=ProcessRaises),
        "reward strategy": lambda tok: session(tok, matching=StrategyRaises),
        "parser": lambda tok: session(tok, protocol=ParseRaises),
        "engine": session,  # the engine's policy raises (below)
    }


# component -> (the bad episode's stop reason, the code it records; None: a code on its reward breakdown)
EXPECTED: dict[str, tuple[str, str | None]] = {
    "environment step": ("environment_error", "environment_error"),
    "environment reset": ("environment_error", "environment_error"),
    "result reward": ("final_answer", "reward_error"),  # it finished; only its score failed
    "process reward": ("reward_error", "reward_error"),
    "reward strategy": ("final_answer", None),  # agent-env's pipeline codes the strategy, the episode is scored
    "parser": ("parse_error", "parse_error"),
    "engine": ("engine_error", "engine_error"),
}


def _policy(tokenizer: HFTokenizer, component: str, fault: Callable[[], BaseException]) -> Any:
    def policy(prompt: Sequence[int]) -> str | BaseException:
        text = tokenizer.decode(prompt)
        if MARK in text and component == "engine":
            return fault()
        if "<tool_response>" in text:
            return answer(f"391, {MARK}" if MARK in text else "391")
        return call("17 * 23")

    return policy


def _run(tokenizer: HFTokenizer, component: str, fault: Callable[[], BaseException]) -> list[RunResult]:
    definition = _components(fault)[component](tokenizer)
    runtime = AgentRuntime(ScriptedEngine(tokenizer, policy=_policy(tokenizer, component, fault)), definition)
    prompts = [f"What is 17 * 23, episode {i}{', ' + MARK if i == BAD else ''}?" for i in range(N)]
    tasks = [{"answer": "391", "bad": i == BAD} for i in range(N)]

    async def main() -> list[RunResult]:
        async with asyncio.timeout(10):
            return await runtime.run_many(prompts, tasks=tasks)

    try:
        return asyncio.run(main())
    except BaseException as e:  # the point of the test: nothing gets out
        pytest.fail(f"{type(e).__name__} escaped run_many: {e!r}")


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("component", sorted(EXPECTED))
def test_any_base_exception_ends_only_its_episode_with_a_coded_error(
    tokenizer: HFTokenizer, component: str, fault: str, tally: dict[str, list[int]]
) -> None:
    tally["episodes"][1] += N
    tally["faults"][1] += 1
    results = _run(tokenizer, component, FAULTS[fault])
    tally["episodes"][0] += len(results)

    assert len(results) == N
    healthy = [r for i, r in enumerate(results) if i != BAD]
    for result in healthy:  # intact: answered, scored, nothing recorded against them
        assert result.stop_reason == "final_answer" and result.reward > 0, result.trajectory.errors
        assert result.trajectory.errors == [] and result.final_answer == "391"
    bad = results[BAD]
    stop, code = EXPECTED[component]
    assert bad.stop_reason == stop, bad.trajectory.errors
    if code is None:
        assert bad.trajectory.breakdown is not None
        assert bad.trajectory.breakdown.codes == {"matching": "reward_error"}
        assert bad.trajectory.breakdown.result["matching"] == 0.0  # its fallback; the process reward still counts
    else:
        errors = [e for e in bad.trajectory.errors if e.code == code]
        assert errors, bad.trajectory.errors
        assert NAMED[fault] in errors[0].message, errors[0].message
    tally["faults"][0] += 1


# -- what still propagates --------------------------------------------------------------------------------


class Waiting(FunctionCallEnvironment):
    """An environment whose step waits (for a cancellation to arrive while the episode is inside it)."""

    async def step(self, action: Action) -> Any:
        await asyncio.sleep(30)
        raise AssertionError("not cancelled")


class Interrupting(FunctionCallEnvironment):
    async def step(self, action: Action) -> Any:
        raise KeyboardInterrupt


class SlowReward(MatchingReward):
    async def score(self, episode: EpisodeRecord) -> float:
        await asyncio.sleep(30)
        return 1.0


def _plain(
    tokenizer: HFTokenizer,
    environment: type[FunctionCallEnvironment] = FunctionCallEnvironment,
    matching: type[MatchingReward] = MatchingReward,
) -> AgentRuntime:
    session = AgentSession(
        protocol="qwen3",
        environment=lambda: environment(tools=[CalculatorTool()], max_steps=4),
        rewards=RewardPipeline(result=[matching()], process=[ToolCallReward()]),
        tokenizer=tokenizer,
    )

    def policy(prompt: Sequence[int]) -> str:
        return answer("391") if "<tool_response>" in tokenizer.decode(prompt) else call("17 * 23")

    return AgentRuntime(ScriptedEngine(tokenizer, policy=policy), session)


def test_keyboard_interrupt_still_propagates(tokenizer: HFTokenizer) -> None:
    runtime = _plain(tokenizer, environment=Interrupting)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(runtime.run_many(["What is 17 * 23?"] * 3, tasks=[{"answer": "391"}] * 3))


@pytest.mark.parametrize("inside", ["environment step", "reward strategy"])
def test_a_cancellation_from_outside_still_cancels_every_episode(tokenizer: HFTokenizer, inside: str) -> None:
    runtime = (
        _plain(tokenizer, environment=Waiting)
        if inside == "environment step"
        else _plain(tokenizer, matching=SlowReward)
    )

    async def main() -> tuple[bool, float]:
        batch = asyncio.create_task(runtime.run_many(["What is 17 * 23?"] * 4, tasks=[{"answer": "391"}] * 4))
        await asyncio.sleep(0.3)  # every episode is waiting inside the component
        t0 = time.perf_counter()
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        return batch.cancelled(), time.perf_counter() - t0

    cancelled, took = asyncio.run(main())
    assert cancelled and took < 1.0


def test_closing_an_episode_stream_early_closes_it_cleanly(tokenizer: HFTokenizer) -> None:
    """The `GeneratorExit` a consumer's ``aclose()`` throws in at the stream's yield is not a component's: it
    propagates (no 'async generator ignored GeneratorExit', no error recorded)."""
    runtime = _plain(tokenizer)
    session = runtime.new_session()

    async def main() -> None:
        stream = runtime.stream("What is 17 * 23?", task={"answer": "391"}, session=session)
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    assert session.errors == []


# -- agent-env's worker threads ---------------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async tool", "sync tool"])
def test_a_tool_raising_an_unreadable_base_exception_is_answered_at_once(asynchronous: bool) -> None:
    """The worker thread builds the caller's error defensively: it always delivers, so the call does not wait
    for its timeout (or forever, without one)."""

    async def raise_async() -> str:
        raise Unreadable

    def raise_sync() -> str:
        raise Unreadable

    fn: Callable[[], Any] = raise_async if asynchronous else raise_sync
    runner = ToolRunner([FunctionTool(fn, name="boom", timeout_s=5.0)])

    async def main() -> tuple[Any, float]:
        t0 = time.perf_counter()
        async with asyncio.timeout(8):
            [observation] = await runner.run([ToolCall(id="c1", name="boom", arguments={})])
        return observation, time.perf_counter() - t0

    observation, took = asyncio.run(main())
    message = json.loads(observation.content)["error"]["message"]
    assert observation.code == "tool_error" and "Unreadable" in message and "could not be read" in message
    assert took < 2.0
