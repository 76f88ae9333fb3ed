"""An agent program's episode is a boundary: whatever one program does ends only its own episode, coded.

OpenRLHF's vLLM actor gathers `num_samples` executor calls with a bare `asyncio.gather` (`generate_responses`), so
anything that escapes one episode ends the whole group. Here OpenRLHF's own `generate_responses` (taken from its Ray
actor class, unchanged) gathers 8 episodes of a program that is healthy 7 times and hostile once, through our
`AgentExecutor` and the `LocalRolloutEngine` stand-in on a `ScriptedEngine` that replays real Qwen3 ids. Every
hostile kind must leave 8 of 8 samples: the 7 healthy ones exactly as a clean batch gives them, the bad one with its
code. A heartbeat on the actor's event loop measures how long the batch's loop was stalled (printed under ``-s``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_runtime.agent_program import AgentProgram, ProgramTask
from agent_runtime.recipe import Recipe
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.openrlhf.segments import SEGMENTS_KEY
from agent_train.task import encode_task
from examples.any_agent.agent import CALCULATOR_TOOL, calculator_agent
from tests.agent_runtime.test_session import QUESTION
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import TASK, openrlhf_params
from tests.agent_train.test_rollout_batch_boundary import ActorStandIn
from tests.support.calculator_policy import calculator_policy

Agent = Callable[[Any, ProgramTask], Awaitable[Any]]
BEAT_S = 0.005  # the heartbeat's period on the actor's loop


class TimedExecutor(AgentExecutor):
    """The executor OpenRLHF calls, with each call's duration noted beside the sample it returned."""

    durations: dict[int, float]

    async def execute(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        started = time.perf_counter()
        out = await super().execute(*args, **kwargs)
        self.durations = {**getattr(self, "durations", {}), id(out): time.perf_counter() - started}
        return out


class Bomb(BaseException):
    """A `BaseException` that is not an `Exception`, SystemExit or KeyboardInterrupt."""


async def first_turn(client: Any, task: ProgramTask) -> None:
    await client.chat.completions.create(model=task.model, messages=task.messages, tools=[CALCULATOR_TOOL])


async def raises_base_exception(client: Any, task: ProgramTask) -> str | None:
    await first_turn(client, task)
    raise Bomb("a BaseException of the program's own")


async def raises_generator_exit(client: Any, task: ProgramTask) -> str | None:
    await first_turn(client, task)
    raise GeneratorExit


async def raises_own_cancelled_error(client: Any, task: ProgramTask) -> str | None:
    await first_turn(client, task)
    raise asyncio.CancelledError("nobody cancelled this program: it raised this itself")


async def task_group_base_exception_group(client: Any, task: ProgramTask) -> str | None:
    async def blows_up() -> None:
        raise Bomb("inside the program's own task group")

    await first_turn(client, task)
    async with asyncio.TaskGroup() as group:  # ends with a BaseExceptionGroup holding the Bomb
        group.create_task(blows_up())
    return "unreachable"


BLOCK_S, BLOCKED_TIMEOUT_S = 8.0, 3.0  # the budget leaves the healthy episodes room on a loaded two-core machine


class Unreadable(Exception):
    def __str__(self) -> str:
        raise Bomb("even its message is hostile")


async def raises_an_unreadable_exception(client: Any, task: ProgramTask) -> str | None:
    await first_turn(client, task)
    raise Unreadable


async def blocks(client: Any, task: ProgramTask) -> str | None:
    await first_turn(client, task)
    time.sleep(BLOCK_S)  # blocking code inside async def: what an async program must never do
    return None


async def thousand_conversations(client: Any, task: ProgramTask) -> str | None:
    for i in range(1000):
        question = [{"role": "user", "content": f"What is {i} * 2?"}]
        await client.chat.completions.create(model=task.model, messages=question, tools=[CALCULATOR_TOOL])
    return "The answer is 391."


async def retries_forever(client: Any, task: ProgramTask) -> str | None:
    import openai

    await first_turn(client, task)
    for _ in range(1000):  # a retry loop that never gives up (bounded here so that the base commit ends)
        try:
            await client.chat.completions.create(model=task.model, messages=[], tools=[CALCULATOR_TOOL])
        except openai.APIError:
            continue
    return "The answer is 391."


def one_bad(bad: Agent) -> Agent:
    """A program that runs `bad` in the first of its episodes to start and the example's agent in all others."""
    lock, started = threading.Lock(), [0]

    async def agent(client: Any, task: ProgramTask) -> str | None:
        with lock:
            started[0] += 1
            mine = started[0]
        return await (bad if mine == 1 else calculator_agent)(client, task)

    return agent


def recipe_of(agent: Agent, **program: Any) -> Recipe:
    return dataclasses.replace(calculator_recipe(), agent=AgentProgram(agent, **program))


def gather(recipe: Recipe, tokenizer: HFTokenizer, hf_tokenizer: Any) -> tuple[list[dict[str, Any]], float, float]:
    """OpenRLHF's `generate_responses` for 8 samples of one prompt; the samples (each with its episode's duration
    under ``"_duration_s"``), the longest stall of the actor's event loop (beyond the heartbeat's own period) once
    the episodes run, and the gather's wall time, in seconds.

    The stall counts the gaps that end after the batch's first generation: the executor's synchronous set-up of
    the 8 episodes (OpenRLHF's tokenizer adapted, the engine made) is not the program's doing. It held the loop for
    about a second on a loaded two-core machine until `HFTokenizer.vocab_size` was kept (it counted the whole
    vocabulary, about 40 ms, twice an episode)."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    generate_responses = RolloutRayActor.__ray_metadata__.modified_class.generate_responses  # OpenRLHF's code
    policy, running = calculator_policy(tokenizer), asyncio.Event()

    def watched(prompt_ids: Any) -> str:
        running.set()  # called on the actor's loop, by the engine
        return policy(prompt_ids)

    engine = ScriptedEngine(tokenizer, policy=watched, delay_s=0.002)
    executor = TimedExecutor(recipe)
    actor = ActorStandIn(engine, executor)
    prompt = encode_task({"prompt": QUESTION, "answer": "391"})

    async def main() -> tuple[list[dict[str, Any]], float, float]:
        loop, worst, done = asyncio.get_running_loop(), [0.0], asyncio.Event()

        async def heartbeat() -> None:
            last = loop.time()
            while not done.is_set():
                await asyncio.sleep(BEAT_S)
                now = loop.time()
                if running.is_set():  # a gap that ends before the first generation is the episodes' set-up
                    worst[0] = max(worst[0], now - last - BEAT_S)
                last = now

        beat = asyncio.create_task(heartbeat())
        started = time.perf_counter()
        try:
            samples = await generate_responses(
                actor, prompt, "391", openrlhf_params(logprobs=True), 4096, hf_tokenizer, num_samples=8, images=None
            )
        finally:
            wall = time.perf_counter() - started
            done.set()
            await beat
        return samples, worst[0], wall

    escaped = None
    try:
        samples, stall, wall = asyncio.run(main())
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # what OpenRLHF's gather let through: every episode of the group is lost
        escaped = type(e).__name__
    if escaped is not None:  # failed outside the handler: the escaped exception may not even print
        pytest.fail(f"the gather raised {escaped}: 0 of 8 samples came back", pytrace=False)
    return [{**s, "_duration_s": executor.durations[id(s)]} for s in samples], stall, wall


@pytest.fixture(scope="module")
def clean(tokenizer: HFTokenizer, hf_tokenizer: Any) -> dict[str, Any]:
    """One sample of a batch where every episode is healthy: what each healthy sample must be."""
    samples, _, _ = gather(recipe_of(calculator_agent), tokenizer, hf_tokenizer)
    assert len({tuple(s["observation_tokens"]) for s in samples}) == 1
    return samples[0]


def program_code(sample: dict[str, Any]) -> str | None:
    codes = [k.removeprefix("agent_program_") for k, v in sample["extra_logs"].items() if "program_" in k and v]
    codes = [c for c in codes if c != "requests"]
    assert len(codes) <= 1, codes
    return codes[0] if codes else None


def check_batch(samples: list[dict[str, Any]], clean: dict[str, Any], code: str) -> dict[str, Any]:
    """8 of 8 samples; 7 exactly the clean one; the bad one coded `code`. Returns the bad one."""
    assert len(samples) == 8
    bad = [s for s in samples if program_code(s) is not None]
    healthy = [s for s in samples if program_code(s) is None]
    assert len(bad) == 1 and program_code(bad[0]) == code, [program_code(s) for s in samples]
    assert len(healthy) == 7
    for sample in healthy:
        assert sample["observation_tokens"] == clean["observation_tokens"]
        assert sample["action_ranges"] == clean["action_ranges"]
        assert sample["rollout_log_probs"] == clean["rollout_log_probs"]
        assert sample["reward"] == clean["reward"] == pytest.approx(1.1)
        assert sample["extra_logs"] == clean["extra_logs"]
        assert sample.keys() == clean.keys()
    return bad[0]


RAISING = {
    "BaseException subclass": (raises_base_exception, "Bomb"),
    "GeneratorExit": (raises_generator_exit, "GeneratorExit"),
    "its own CancelledError": (raises_own_cancelled_error, "CancelledError"),
    "BaseExceptionGroup of its own TaskGroup": (task_group_base_exception_group, "BaseExceptionGroup"),
    "an exception whose message raises": (raises_an_unreadable_exception, "Unreadable"),
}


@pytest.mark.parametrize("kind", list(RAISING))
def test_a_program_that_raises_any_base_exception_ends_only_its_episode(
    kind: str, clean: dict[str, Any], tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    bad, name = RAISING[kind]
    with capture_logs() as logs:
        samples, stall, wall = gather(recipe_of(one_bad(bad)), tokenizer, hf_tokenizer)
    print(f"\n[{kind}] 8 of {len(samples)} samples back; actor loop stalled {stall * 1000:.0f} ms; {wall:.2f} s")
    out = check_batch(samples, clean, "program_error")
    assert len(out["action_ranges"]) == 1  # the turn the model generated before the program raised is trained
    assert out["extra_logs"]["agent_program_requests"] == 1 and out["reward"] == 0.0
    (failed,) = [e for e in logs if e["event"] == "agent_program_failed"]
    assert failed["code"] == "program_error" and failed["error"].startswith(name)  # what it raised, by its own name
    assert stall < 1.0


def test_a_blocking_program_times_out_on_time_and_stalls_no_neighbour(
    clean: dict[str, Any], tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    recipe = recipe_of(one_bad(blocks), timeout_s=BLOCKED_TIMEOUT_S)
    samples, stall, wall = gather(recipe, tokenizer, hf_tokenizer)
    slowest = max(s["_duration_s"] for s in samples)
    print(
        f"\n[time.sleep({BLOCK_S:.0f}) after one turn, timeout_s={BLOCKED_TIMEOUT_S:.0f}] actor loop stalled "
        f"{stall * 1000:.0f} ms; the slowest episode took {slowest:.2f} s; the batch {wall:.2f} s"
    )
    out = check_batch(samples, clean, "program_timeout")
    assert len(out["action_ranges"]) == 1  # the turn before the block is kept
    assert stall < 1.0  # was the whole sleep: the program's time.sleep ran on the actor's own loop
    assert out["_duration_s"] < BLOCKED_TIMEOUT_S + 1.5  # cut off at about timeout_s, not when the sleep ended


def test_a_thousand_conversations_are_capped(clean: dict[str, Any], tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    samples, stall, _ = gather(recipe_of(one_bad(thousand_conversations)), tokenizer, hf_tokenizer)
    records = max(1 + len(s.get(SEGMENTS_KEY, [])) for s in samples)
    print(f"\n[1,000 conversations] {records} training records of one episode; loop stalled {stall * 1000:.0f} ms")
    cap = AgentProgram(calculator_agent).max_conversations
    out = check_batch(samples, clean, "too_many_conversations")
    assert records == out["extra_logs"]["agent_segments"] == cap  # was 1,000
    assert out["extra_logs"]["agent_program_requests"] == cap + 1  # the one past the cap ended the episode
    assert stall < 1.0


def test_too_many_requests_are_capped(clean: dict[str, Any], tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    samples, stall, _ = gather(recipe_of(one_bad(retries_forever)), tokenizer, hf_tokenizer)
    requests = max(s["extra_logs"]["agent_program_requests"] for s in samples)
    print(f"\n[a retry loop] {requests:.0f} requests served to one episode; loop stalled {stall * 1000:.0f} ms")
    cap = AgentProgram(calculator_agent).max_requests
    out = check_batch(samples, clean, "too_many_requests")
    assert requests == out["extra_logs"]["agent_program_requests"] == cap  # was 1,001: every one of them served
    assert len(out["action_ranges"]) == 1 and out["extra_logs"]["agent_segments"] == 1
    assert stall < 1.0


def test_the_caps_are_configurable_and_checked() -> None:
    program = AgentProgram(calculator_agent, max_requests=3, max_conversations=2)
    assert (program.max_requests, program.max_conversations) == (3, 2)
    unbounded = AgentProgram(calculator_agent, max_requests=None, max_conversations=None)
    assert unbounded.max_requests is None and unbounded.max_conversations is None
    for bad in ({"max_requests": 0}, {"max_conversations": 0}, {"max_concurrent": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AgentProgram(calculator_agent, **bad)


def test_cancelling_the_episode_from_outside_still_cancels_it_and_its_program(tokenizer: HFTokenizer) -> None:
    """The one thing the boundary lets through: the rollout's own cancellation (a shutdown, an aborted step)."""
    served, program_cancelled = asyncio.Event(), threading.Event()
    policy = calculator_policy(tokenizer)

    def watched(prompt_ids: Any) -> str:
        served.set()
        return policy(prompt_ids)

    async def waits(client: Any, task: ProgramTask) -> str | None:
        await first_turn(client, task)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            program_cancelled.set()
            raise
        return None

    async def main() -> None:
        executor = AgentExecutor(recipe_of(waits))
        rollout = asyncio.create_task(executor.rollout(TASK, "391", ScriptedEngine(tokenizer, policy=watched)))
        await served.wait()
        await asyncio.sleep(0.05)  # the program is now in its sleep
        rollout.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rollout

    asyncio.run(main())
    assert program_cancelled.wait(2.0)  # on its own loop, in its own thread


def test_at_most_max_concurrent_programs_run_at_once_and_the_rest_wait(tokenizer: HFTokenizer) -> None:
    lock, running, most = threading.Lock(), [0], [0]

    async def counted(client: Any, task: ProgramTask) -> str | None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return await calculator_agent(client, task)
        finally:
            with lock:
                running[0] -= 1

    executor = AgentExecutor(recipe_of(counted, max_concurrent=2))
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), delay_s=0.01)

    async def six() -> list[Any]:
        return await asyncio.gather(*(executor.rollout(TASK, "391", engine) for _ in range(6)))

    outs = asyncio.run(six())
    assert most[0] == 2 and [o.sample.reward for o in outs] == [pytest.approx(1.1)] * 6


def test_an_agent_that_is_an_unhashable_callable_runs(tokenizer: HFTokenizer) -> None:
    @dataclasses.dataclass
    class Agent:  # eq=True makes it unhashable, as dataclass instances are
        turns: int = 3

        async def __call__(self, client: Any, task: ProgramTask) -> str | None:
            return await calculator_agent(client, task)

    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer))
    out = asyncio.run(AgentExecutor(recipe_of(Agent())).rollout(TASK, "391", engine))
    assert out.trajectory.final_answer == "The answer is 391." and out.sample.reward == pytest.approx(1.1)


def test_a_program_writes_only_its_own_copy_of_the_task(tokenizer: HFTokenizer) -> None:
    """A program cut off at its timeout may still run on its thread while its episode is recorded: what it does to
    the task must not reach the record (a dict changing size while the trajectory reads it would raise there)."""

    async def scribbles(client: Any, task: ProgramTask) -> str | None:
        task.row["scribbled"] = True
        assert isinstance(task.prompt, str)
        return await calculator_agent(client, task)

    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer))
    out = asyncio.run(AgentExecutor(recipe_of(scribbles)).rollout(TASK, "391", engine))
    assert "scribbled" not in out.trajectory.task and out.sample.reward == pytest.approx(1.1)
