"""`run_program`: one episode of an agent program (`AgentProgram`) against the rollout engine, as a `Trajectory`.

    episode = await run_program(recipe, engine, ProgramTask(prompt=row["prompt"], row=row), sampling=sampling)
    episode.trajectory.segments      # one per context: each continued conversation, each prefix break's new one

The program runs against its own `EpisodeEndpoint` (the tools-mode server on `EpisodeEngine`: the rollout's
sampling and the episode's token budget) under the program's time budget. Then the request log becomes the
episode: its segments (`RequestLog.segments`, with the prefix breaks that opened them), the model's turns as
reward steps, the program's return value as the final answer, scored by the recipe's reward pipeline.

Every failure ends this episode only and is recorded, never raised (`program_thread.py` runs the program on a
thread and a loop of its own): the program raising anything at all (``program_error``), overrunning `timeout_s`
(``program_timeout``, the program cancelled, even one that blocks), failing after the token budget was spent
(``token_budget_exhausted``), asking for a model call past `max_requests` (``too_many_requests``) or opening a
conversation past `max_conversations` (``too_many_conversations``), not starting for want of a thread
(``program_unavailable``), or returning something that is not a string. What the model generated before is kept
and trained (up to `max_conversations` conversations). A program that never called the endpoint gets reward 0 and a
warning (``no_model_calls``); its trajectory holds the task's prompt alone, so that a rollout record still exists.
A command program (`AgentProgram.command`) runs as a process per episode, through the rollout worker's
`Gateway` (`program_process.py`), with the same budgets and codes; a score it posts to its session's ``/reward``
is kept as ``ProgramOutcome.reported_reward`` and given to the recipe's rewards as the episode record's
``metadata["program_reward"]``. The program's code goes in ``trajectory.task["agent_program"]`` with its
request count and prefix breaks (the stored trajectory's error codes are a closed set that does not name
programs). A reward strategy that raises (a
`BaseException` too) leaves the episode unscored. Only the cancellation of the caller's own task propagates.

This module knows the endpoint, the request log and the reward pipeline; it knows nothing about OpenRLHF.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from agent_env import EpisodeRecord, RewardBreakdown
from agent_protocol import ControlTokens, Message, TokenTranscript, TranscriptRecord, coerce_messages
from agent_runtime.agent_program import ProgramCode, ProgramCommand, ProgramTask
from agent_runtime.boundary import boundary
from agent_runtime.engines.base import LLMEngine, SamplingParams
from agent_runtime.outcomes import StopReason
from agent_runtime.proxy.endpoint import EpisodeEndpoint
from agent_runtime.proxy.episode_engine import EpisodeEngine
from agent_runtime.proxy.gateway import Gateway
from agent_runtime.proxy.prefix_break import EditKind, PrefixBreak
from agent_runtime.proxy.program_process import run_program_process
from agent_runtime.proxy.program_thread import run_program_thread
from agent_runtime.proxy.request_log import Segment, generated
from agent_runtime.recipe import Recipe, RecipeError
from agent_runtime.trajectory import EpisodeError, Trajectory, build_trajectory

__all__ = ["ProgramEpisode", "ProgramOutcome", "run_program"]

logger = structlog.get_logger(__name__)


class ProgramOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the program did: its failure `code` and `message` (None when it returned an answer or None), the
    requests it made, the prefix breaks among them and the tokens the model generated for it."""

    code: ProgramCode | None = None
    message: str = ""
    requests: int = 0
    breaks: list[PrefixBreak] = msgspec.field(default_factory=list)
    #: how many requests of each history-edit kind it made (`prefix_break.EDIT_KINDS`, `RequestLog.edits`)
    edits: dict[EditKind, int] = msgspec.field(default_factory=dict)
    generated_tokens: int = 0
    reported_reward: float | None = None  # what a command program posted to its session's /reward


class ProgramEpisode(msgspec.Struct, frozen=True, kw_only=True):
    """The episode: its `trajectory` (segments in order), whether the model's last turn hit the length limit
    (`truncated`), and the program's `outcome`."""

    trajectory: Trajectory
    truncated: bool
    outcome: ProgramOutcome


async def run_program(
    recipe: Recipe,
    engine: LLMEngine,
    task: ProgramTask,
    *,
    sampling: SamplingParams,
    max_context_tokens: int | None = None,
    engine_timeout_s: float | None = None,
    gateway: Gateway | None = None,
    on_record: Callable[[Trajectory], None] | None = None,
) -> ProgramEpisode:
    """Run `recipe.agent` once on `task` with `engine` sampling as `sampling` says (see the module docstring).
    `max_context_tokens` caps every conversation's context (with the recipe's and the engine's limits). A command
    program (`AgentProgram.command`) reaches its endpoint through `gateway` (the rollout worker's; None: one of
    its own for the episode). `on_record` is called with each request's record as the endpoint keeps it, on the
    running loop (a served program streams its turns from there)."""
    program = recipe.agent
    if program is None:
        raise RecipeError(f"recipe {recipe.name!r} names no agent program (Recipe.agent)")
    limits = [x for x in (max_context_tokens, recipe.max_context_tokens) if x]
    served = dataclasses.replace(recipe, max_context_tokens=min(limits) if limits else None, sampling=sampling)
    episode_engine = EpisodeEngine(engine, sampling, max_tokens=program.max_episode_tokens)
    endpoint = EpisodeEndpoint(
        served, episode_engine, model_name=program.model_name, engine_timeout_s=engine_timeout_s,
        max_requests=program.max_requests, max_conversations=program.max_conversations, on_record=on_record,
    )  # fmt: skip
    task = msgspec.structs.replace(task, model=program.model_name)
    log = logger.bind(recipe=recipe.name, endpoint=endpoint.key)
    started = time.perf_counter()
    reported: float | None = None
    try:
        if isinstance(program.agent, ProgramCommand):
            run = run_program_process(program, program.agent, endpoint, task, gateway=gateway)
            (answer, code, message), reported = await run
        else:
            answer, code, message = await run_program_thread(program, endpoint, task)
    finally:
        await endpoint.close()
    if code is None and answer is not None and not issubclass(type(answer), str):  # type(): __class__ can lie
        answer, code, message = None, "program_error", f"the program returned a {type(answer).__name__}, not a str"
    if answer is not None and type(answer) is not str:
        answer = str.__str__(answer)  # a str subclass's own methods are the program's code: keep the text only
    if code is None and endpoint.requests == 0:
        code, message = "no_model_calls", "the program never called the model; the episode gets reward 0"
    if code == "program_error" and episode_engine.exhausted:
        code = "token_budget_exhausted"
    if code is not None:
        log.warning("agent_program_failed", code=code, error=message, requests=endpoint.requests)
    segments, breaks = endpoint.log.segments()
    outcome = ProgramOutcome(
        code=code, message=message, requests=endpoint.requests, breaks=breaks, edits=endpoint.log.edits(),
        generated_tokens=episode_engine.generated, reported_reward=reported,
    )  # fmt: skip
    trajectory = await _trajectory(served, engine, task, endpoint, segments, answer, outcome)
    trajectory.timings["total_s"] = time.perf_counter() - started
    last = next((r for r in reversed(endpoint.log.records) if generated(r)), None)
    log.info(
        "agent_program_finished", requests=endpoint.requests, segments=len(trajectory.segments),
        breaks=len(breaks), reward=trajectory.reward, code=code,
    )  # fmt: skip
    return ProgramEpisode(
        trajectory=trajectory, truncated=last is not None and last.stop_reason == "length", outcome=outcome
    )


async def _trajectory(
    recipe: Recipe,
    engine: LLMEngine,
    task: ProgramTask,
    endpoint: EpisodeEndpoint,
    segments: list[Segment],
    answer: str | None,
    outcome: ProgramOutcome,
) -> Trajectory:
    records = endpoint.log.records
    steps = endpoint.log.steps(segments)
    if steps:
        steps[-1] = msgspec.structs.replace(steps[-1], done=True)
    prompt = segments[0].record.messages[: segments[0].prompt_messages] if segments else coerce_messages(task.messages)
    stop_reason: StopReason | None = None
    if outcome.code is None:
        stop_reason = "final_answer" if answer is not None else "done"
    elif outcome.code == "token_budget_exhausted":
        stop_reason = "context_exhausted"  # a budget, not an answer, ended it (trained as over-long)
    row = task.row
    references = row.get("references", row.get("answer", row.get("label")))
    refs = tuple(str(r) for r in references) if isinstance(references, (list, tuple)) else ()
    if references is not None and not isinstance(references, (list, tuple)):
        refs = (str(references),)
    metadata = {k: v for k, v in row.items() if k not in ("references", "answer", "label", "prompt")}
    if outcome.reported_reward is not None:  # a command program's own score, for the recipe's rewards to read
        metadata["program_reward"] = outcome.reported_reward
    record = EpisodeRecord(
        prompt=tuple(prompt),
        steps=tuple(steps),
        final_answer=answer,
        references=refs,
        stop_reason=stop_reason,
        metadata=metadata,
    )
    breakdown = await _score(recipe, record) if outcome.requests else None  # no model call, nothing to reward
    transcripts = [t for segment in segments for t in segment.record.segments]
    if not transcripts:
        transcripts = [_prompt_only(recipe, engine, prompt)]
    errors: list[EpisodeError] = [error for r in records for error in r.errors]
    program: dict[str, Any] = msgspec.to_builtins(outcome)
    return build_trajectory(
        episode_id=endpoint.key,
        protocol=recipe.chat_protocol().name,
        messages=segments[-1].record.messages if segments else prompt,
        segments=transcripts,
        generations=len(steps),
        breakdown=breakdown,
        final_answer=answer,
        stop_reason=stop_reason,
        turns=len(steps),
        tool_calls=sum(len(step.action.tool_calls) for step in steps),
        errors=errors,
        task={**row, "agent_program": program},
        policy_version=engine.policy_version,
    )


async def _score(recipe: Recipe, record: EpisodeRecord) -> RewardBreakdown | None:
    if recipe.rewards is None:
        return None
    with boundary("reward") as failed:  # the pipeline contains its strategies' errors; this is the last boundary
        return await recipe.rewards.score(record)
    logger.error("agent_program_reward_failed", error_type=type(failed.exception).__name__, error=failed.message)
    return None


def _prompt_only(recipe: Recipe, engine: LLMEngine, prompt: list[Message]) -> TranscriptRecord:
    """The task's prompt alone, rendered without tools: the record of an episode the model never took part in
    (no action, so nothing is trained; the record keeps the rollout's shape)."""
    transcript = TokenTranscript()
    control = ControlTokens.for_tokenizer(engine.tokenizer)  # as the served requests encode it
    with boundary("render") as failed:
        text = recipe.chat_protocol().render_prompt(prompt if recipe.special_tokens_in_text else control.mark(prompt))
        transcript.append_prompt(
            control.encode(text) if not recipe.special_tokens_in_text else engine.tokenizer.encode(text)
        )
    if failed.exception is not None:
        error_type = type(failed.exception).__name__
        logger.warning("agent_program_prompt_unrendered", error_type=error_type, error=failed.message)
    return transcript.record()
