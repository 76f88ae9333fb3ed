"""One episode boundary: an exception from the protocol, the tokenizer, the environment, a reward, the feedback
render or the engine ends only its own episode, with a coded error on its trajectory, and `run_many` keeps
every other episode.

Each fault is injected by a real component that raises at one point (a protocol whose parser raises, an
environment whose step raises, a reward that raises...); the rest is the real Qwen3 tokenizer, the real
calculator tool and `ScriptedEngine` replaying real token ids. Each fault's end is tallied: the module prints
how many ended only their episode, coded (``uv run pytest tests/agent_runtime/test_episode_boundary.py -s``), and
the batch of 100 prints what came back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent_env import (
    CalculatorTool,
    EpisodeRecord,
    FunctionCallEnvironment,
    MatchingReward,
    RewardBreakdown,
    RewardPipeline,
    StepRecord,
    StepReward,
    ToolCallReward,
)
from agent_protocol import Action, HFTokenizer, MessageError, MessageLike, coerce_messages, coerce_tools, get_protocol
from agent_protocol.protocols.qwen3 import Qwen3Protocol
from agent_runtime import (
    AgentRuntime,
    AgentSession,
    CompactionPolicy,
    ErrorEvent,
    FinalEvent,
    Generation,
    LLMEngine,
    SamplingParams,
    ScriptedEngine,
    read_trajectories,
)
from agent_runtime.boundary import Stage, boundary
from agent_runtime.errors import EngineTimeout
from agent_runtime.recipe import Recipe
from agent_runtime.serving import ServeConfig
from agent_runtime.serving.api_error import ApiError
from agent_runtime.serving.backend import ServingBackend
from agent_runtime.serving.openai_wire import decode_request
from agent_runtime.serving.tools_mode import complete_tools
from tests.support.calculator_episode import qwen3_answer as answer
from tests.support.calculator_episode import qwen3_call as call

QUESTION = "What is 17 * 23?"


@pytest.fixture(scope="module", autouse=True)
def contained() -> Iterator[dict[str, bool]]:
    """fault -> whether it ended only its episode, with the expected code; printed once the module ran."""
    tally: dict[str, bool] = {}
    yield tally
    ended = ", ".join(f"{fault}{'' if ok else ' (NOT contained)'}" for fault, ok in tally.items())
    print(f"\na component raising at each point: {sum(tally.values())} / {len(tally)} ended only their episode, "
          f"coded ({ended})")  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


class Boom(RuntimeError):
    pass


def _qwen3() -> Qwen3Protocol:
    protocol = get_protocol("qwen3")
    assert isinstance(protocol, Qwen3Protocol)
    return protocol


class RaisingParse(Qwen3Protocol):
    """A family whose public parse raises (bypassing the ChatProtocol guard), as a third-party one could."""

    def parse_assistant_text(self, text: str, *, call_id_prefix: str = "call") -> Action:
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")


class RaisingFeedback(Qwen3Protocol):
    def render_feedback(self, messages: Sequence[MessageLike], *, turn_closed: bool = True) -> str:
        raise Boom("feedback cannot be rendered")


class RaisingDecode(HFTokenizer):
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        raise Boom("decode failed")


class RaisingStep(FunctionCallEnvironment):
    async def step(self, action: Action) -> Any:
        raise SystemError("environment exploded")


class ExitingStep(FunctionCallEnvironment):
    async def step(self, action: Action) -> Any:
        raise SystemExit("a plug-in called sys.exit()")


class RaisingReset(FunctionCallEnvironment):
    async def reset(self, task: Any = None) -> None:
        raise OSError("the sandbox could not start")


class RaisingProcessRewards(RewardPipeline):
    """A reward pipeline that raises itself (its strategies' failures it already contains, as codes)."""

    async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> StepReward:
        raise ZeroDivisionError("process reward divided by zero")


class RaisingResultRewards(RewardPipeline):
    async def score(self, episode: EpisodeRecord) -> RewardBreakdown:
        raise ZeroDivisionError("reward divided by zero")


def _env() -> FunctionCallEnvironment:
    return FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4)


def _session(tokenizer: HFTokenizer, fault: str) -> AgentSession:
    protocol: Qwen3Protocol = _qwen3()
    env: Callable[[], FunctionCallEnvironment] = _env
    rewards = RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()])
    tok: HFTokenizer = tokenizer
    match fault:
        case "parse":
            protocol = RaisingParse(protocol.name, protocol.mode)
        case "render":
            protocol = RaisingFeedback(protocol.name, protocol.mode)
        case "decode":
            tok = RaisingDecode(tokenizer.backend, source="raising")
        case "environment_step":
            env = lambda: RaisingStep(tools=[CalculatorTool()], max_steps=4)  # noqa: E731
        case "environment_sys_exit":
            env = lambda: ExitingStep(tools=[CalculatorTool()], max_steps=4)  # noqa: E731
        case "environment_reset":
            env = lambda: RaisingReset(tools=[CalculatorTool()], max_steps=4)  # noqa: E731
        case "process_reward":
            rewards = RaisingProcessRewards(result=[MatchingReward()], process=[ToolCallReward()])
        case "result_reward":
            rewards = RaisingResultRewards(result=[MatchingReward()])
    return AgentSession(protocol=protocol, environment=env, rewards=rewards, tokenizer=tok)


# fault -> (stop reason, error code) the episode must end with
EXPECTED = {
    "parse": ("parse_error", "parse_error"),
    "render": ("render_error", "render_error"),
    "decode": ("decode_error", "decode_error"),
    "environment_step": ("environment_error", "environment_error"),
    "environment_reset": ("environment_error", "environment_error"),
    "environment_sys_exit": ("environment_error", "environment_error"),
    "process_reward": ("reward_error", "reward_error"),
    "result_reward": ("final_answer", "reward_error"),  # the episode finished; only its score failed
}


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_raising_component_ends_only_its_episode_with_a_coded_error(
    tokenizer: HFTokenizer, fault: str, contained: dict[str, bool]
) -> None:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), answer("391")])
    runtime = AgentRuntime(engine, _session(tokenizer, fault))
    result = asyncio.run(runtime.run(QUESTION, task={"answer": "391"}, keep_events=True))

    stop, code = EXPECTED[fault]
    contained[fault] = result.stop_reason == stop and code in [e.code for e in result.trajectory.errors]
    assert result.stop_reason == stop
    assert code in [e.code for e in result.trajectory.errors], result.trajectory.errors
    assert isinstance(result.events[-1], FinalEvent)
    # nothing already recorded is lost: the prompt, and any ids the engine generated, stay on the transcript
    (segment,) = result.trajectory.segments
    assert segment.ids[: len(engine.calls[0])] == engine.calls[0] if engine.calls else segment.ids
    if fault not in ("environment_reset", "result_reward"):
        assert sum(segment.loss_mask) == len(tokenizer.encode(call("17 * 23")))


def test_a_reward_that_raises_while_finishing_keeps_the_answer(
    tokenizer: HFTokenizer, contained: dict[str, bool]
) -> None:
    engine = ScriptedEngine(tokenizer, [answer("391")])
    result = asyncio.run(AgentRuntime(engine, _session(tokenizer, "result_reward")).run(QUESTION))
    codes = [e.code for e in result.trajectory.errors]
    contained["result_reward_on_the_final_answer"] = result.final_answer == "391" and codes == ["reward_error"]
    assert result.final_answer == "391" and result.reward == 0.0
    assert [e.code for e in result.trajectory.errors] == ["reward_error"]


def test_step_itself_never_raises_for_a_broken_environment(tokenizer: HFTokenizer, contained: dict[str, bool]) -> None:
    """The loop in the README (reset / next_request / step) gets the boundary too, without AgentRuntime."""

    async def main() -> tuple[bool, str | None]:
        session = _session(tokenizer, "environment_step")
        await session.reset(QUESTION)
        request = await session.next_request()
        assert request is not None
        engine = ScriptedEngine(tokenizer, [call("2 + 2")])
        outcome = await session.step(await engine.generate(request.prompt_ids, request.sampling()))
        return outcome.done, session.stop_reason

    outcome = asyncio.run(main())
    contained["environment_step_without_runtime"] = outcome == (True, "environment_error")
    assert outcome == (True, "environment_error")


def test_a_session_reset_after_a_contained_error_steps_cleanly(tokenizer: HFTokenizer) -> None:
    """An error contained in one episode's step is not the next episode's (the session is reset between them)."""
    made: list[FunctionCallEnvironment] = []

    def environment() -> FunctionCallEnvironment:  # the first episode's environment raises, the second's works
        kind = RaisingStep if not made else FunctionCallEnvironment
        made.append(kind(tools=[CalculatorTool()], max_steps=4))
        return made[-1]

    async def episode(session: AgentSession, text: str) -> tuple[bool, str | None, list[str]]:
        await session.reset(QUESTION)
        request = await session.next_request()
        assert request is not None
        engine = ScriptedEngine(tokenizer, [text])
        outcome = await session.step(await engine.generate(request.prompt_ids, request.sampling()))
        return outcome.done, session.stop_reason, [error.code for error in session.errors]

    async def main() -> list[tuple[bool, str | None, list[str]]]:
        session = AgentSession(protocol=_qwen3(), environment=environment, tokenizer=tokenizer)
        return [await episode(session, call("2 + 2")), await episode(session, call("2 + 2"))]

    failed, clean = asyncio.run(main())
    assert failed == (True, "environment_error", ["environment_error"])
    assert clean == (False, None, [])


def test_compaction_summary_turn_has_the_same_boundary(tokenizer: HFTokenizer, contained: dict[str, bool]) -> None:
    class RaisingDecodeOnSummary(HFTokenizer):
        calls = 0

        def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
            RaisingDecodeOnSummary.calls += 1
            if RaisingDecodeOnSummary.calls == 2:  # the second generation is the summary
                raise Boom("decode failed on the summary")
            return super().decode(ids, skip_special_tokens=skip_special_tokens)

    session = AgentSession(
        protocol="qwen3",
        environment=_env,
        tokenizer=RaisingDecodeOnSummary(tokenizer.backend, source="raising"),
        context=CompactionPolicy(compact_at_tokens=1),  # ask for a summary after the first tool result
        max_new_tokens=64,
    )
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), answer("Summary: 17 * 23 = 391."), answer("391")])
    result = asyncio.run(AgentRuntime(engine, session).run(QUESTION, keep_events=True))
    contained["compaction_summary"] = result.stop_reason == "decode_error"
    assert result.stop_reason == "decode_error"
    assert any(isinstance(e, ErrorEvent) and e.code == "decode_error" for e in result.events)


def test_one_bad_episode_among_100_loses_nothing_else(tokenizer: HFTokenizer) -> None:
    """The batch of the issue: one degenerate generation (a 1,500-deep tool call) among 100 episodes, plus a
    prompt that cannot be rendered and a dead engine call. Every episode comes back, each with its own end."""
    degenerate = "<tool_call>\n" + "[" * 1500 + "]" * 1500 + "\n</tool_call><|im_end|>"

    def policy(prompt: Sequence[int]) -> str | BaseException:
        text = tokenizer.decode(prompt)
        if "episode 7?" in text:
            return degenerate
        if "episode 8?" in text:
            return Boom("engine died for this one")
        return answer("391") if "<tool_response>" in text else call("17 * 23")

    engine = ScriptedEngine(tokenizer, policy=policy)
    prompts: list[Any] = [f"What is 17 * 23, episode {i}?" for i in range(100)]
    prompts[9] = [{"role": "robot", "content": "a message no chat format can render"}]
    runtime = AgentRuntime(engine, _session(tokenizer, "none"))
    results = asyncio.run(runtime.run_many(prompts, tasks=[{"answer": "391"}] * 100))

    stops = [r.stop_reason for r in results]
    healthy = [r for i, r in enumerate(results) if i not in (7, 8, 9)]
    scored = sum(r.stop_reason == "final_answer" and r.reward > 0 for r in healthy)
    print(f"\n100 episodes with 3 bad ones: {len(results)} results, {scored} / {len(healthy)} healthy ones answered "
          f"and scored; the bad ones ended {stops[7]}, {stops[8]}, {stops[9]}")  # fmt: skip
    assert len(results) == 100
    # the degenerate episode is answered with a parse error each turn until its step budget runs out
    assert stops[7] == "max_steps"
    assert {e.code for e in results[7].trajectory.errors} <= {"invalid_json", "unclosed_tag"}
    assert stops[8] == "engine_error"
    assert stops[9] == "invalid_prompt"
    others = [r for i, r in enumerate(results) if i not in (7, 8, 9)]
    assert all(r.stop_reason == "final_answer" and r.reward > 0 for r in others), {r.stop_reason for r in others}


# -- the boundary itself (agent_runtime.boundary): one rule for every place above ---------------------------


@pytest.mark.parametrize(
    ("stage", "code"),
    [
        ("decode", "decode_error"),
        ("parse", "parse_error"),
        ("environment", "environment_error"),
        ("reward", "reward_error"),
        ("render", "render_error"),
        ("engine", "engine_error"),
        ("idle", "internal_error"),
    ],
)
def test_the_boundary_codes_each_stage_as_the_session_records_it(stage: Stage, code: str) -> None:
    with boundary(stage) as caught:
        raise SystemExit("a plug-in called sys.exit")
    assert (caught.code, caught.message) == (code, "SystemExit: a plug-in called sys.exit")
    assert isinstance(caught.exception, SystemExit)


def test_a_coded_error_keeps_its_code_and_an_inner_stage_is_read_through() -> None:
    with boundary("environment") as outer, boundary("parse", reraise=True):
        raise ValueError("the parser broke")
    assert (outer.code, outer.message) == ("parse_error", "ValueError: the parser broke")
    assert isinstance(outer.exception, ValueError)  # what really raised, not the StageError that carried it
    with boundary("render") as engine:
        raise EngineTimeout("too slow")
    assert engine.code == "engine_timeout"


def test_what_the_caller_passes_and_what_must_propagate_go_through() -> None:
    with pytest.raises(MessageError), boundary("render", passes=(MessageError,)):
        raise MessageError("messages", "the caller's to fix")
    with pytest.raises(KeyboardInterrupt), boundary("environment"):
        raise KeyboardInterrupt
    with boundary("environment") as caught:
        pass
    assert caught.exception is None


def test_a_consumer_closing_a_generator_at_a_yield_inside_the_boundary_is_not_contained() -> None:
    """The boundary is a class, not a generator-based context manager: `aclose()` thrown in at the generator's
    own yield propagates (the generator closes), while a `GeneratorExit` raised by code it calls is contained."""
    seen: list[str] = []

    async def frames() -> AsyncGenerator[int]:
        with boundary() as caught:
            yield 1
            yield 2
        seen.append(caught.code)  # only reached when the boundary contained something

    async def main() -> None:
        stream = frames()
        assert await anext(stream) == 1
        await stream.aclose()

    asyncio.run(main())
    assert seen == []

    def foreign() -> None:
        raise GeneratorExit

    with boundary("parse") as caught:
        foreign()
    assert caught.code == "parse_error"


# -- tools mode: the same stages, the same codes, through the same boundary ---------------------------------


class RaisingPrompt(Qwen3Protocol):
    def render_prompt(self, messages: Iterable[MessageLike], **options: Any) -> str:
        raise Boom("the prompt cannot be rendered")


class Undecoded(LLMEngine):
    """`ScriptedEngine`'s generations, handed over as ids to decode (not as exact text) by the tokenizer given."""

    name = "undecoded"

    def __init__(self, inner: ScriptedEngine, tokenizer: HFTokenizer) -> None:
        self.inner, self.tokenizer = inner, tokenizer
        self.context_length = inner.context_length
        self.stop_token_ids = inner.stop_token_ids

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        generation = await self.inner.generate(prompt_ids, sampling)
        return msgspec.structs.replace(generation, exact_text=False)


TOOLS_FAULTS = {"render": "render_error", "decode": "decode_error", "parse": "parse_error"}


@pytest.mark.parametrize("fault", sorted(TOOLS_FAULTS))
def test_tools_mode_codes_each_stage_as_agent_mode_does(tokenizer: HFTokenizer, fault: str, tmp_path: Path) -> None:
    protocol = {"render": RaisingPrompt, "parse": RaisingParse}.get(fault, Qwen3Protocol)("qwen3", _qwen3().mode)
    served = RaisingDecode(tokenizer.backend, source="raising") if fault == "decode" else tokenizer
    engine = Undecoded(ScriptedEngine(tokenizer, [call("17 * 23")]), served)
    recipe = Recipe(name="stages", protocol=protocol, environment=_env, max_new_tokens=64)
    log = tmp_path / "log.jsonl"
    backend = ServingBackend(engine, recipe, ServeConfig(model_name="stages", trajectory_log=str(log)))
    spec = {"type": "function", "function": {"name": "calculator", "parameters": CalculatorTool().parameters}}
    body = {"model": "stages", "messages": [{"role": "user", "content": QUESTION}], "tools": [spec]}
    request = decode_request(json.dumps(body).encode())

    with pytest.raises(ApiError) as raised:
        asyncio.run(complete_tools(backend, request, coerce_messages(request.messages), coerce_tools(request.tools)))

    code = TOOLS_FAULTS[fault]
    assert (raised.value.status, raised.value.code) == (500, code)
    assert "Boom" in raised.value.message or "RecursionError" in raised.value.message, raised.value.message
    records = list(read_trajectories(log)) if log.exists() else []
    if fault == "render":  # refused before the engine: nothing was generated, nothing is recorded
        assert records == []
    else:  # the generated ids are kept, and the code that failed the request is its stop reason
        (record,) = records
        assert record.stop_reason == code and [e.code for e in record.errors] == [code]
        assert sum(record.segments[0].loss_mask) == len(tokenizer.encode(call("17 * 23")))
