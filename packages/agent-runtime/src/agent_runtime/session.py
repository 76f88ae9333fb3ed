"""`AgentSession`: the one episode loop that serving and training both run.

    session = AgentSession(protocol="qwen3", environment=env, rewards=pipeline, tokenizer=tok)
    prompt_ids = await session.reset("What is 17 * 23?")
    while (request := await session.next_request()) is not None:          # None once the episode is over
        generation = await engine.generate(request.prompt_ids, request.sampling(base))
        outcome = await session.step(generation)

An `AgentSession` is a `Conversation` (the turn: rendering, token-in-token-out appends, parsing, budgets) plus
an `Environment`, a `RewardPipeline` and a `ContextPolicy`. `reset` renders the first prompt and tokenizes it
once. `step` hands the generated ids to the conversation (appended exactly as sampled, then parsed), steps the
environment, scores the step, and appends the feedback (tool results, the next turn's header), tokenized alone.
`next_request` enforces the budgets: a per-turn `max_new_tokens` and a `max_context_tokens` for the context; when
the next turn cannot fit, the episode ends cleanly with ``stop_reason="context_exhausted"`` and the engine is
never sent a prompt longer than its context. The context policy decides what happens as the context grows (ask for
a summary and continue from it, start a new segment from messages it rewrote, end); the episode's side of it
(`context_state`: compactions, summaries) applies its decisions (`agent_runtime.context_state`). Errors (a dead
engine, a broken environment) are recorded on the trajectory with `fail`; nothing already recorded is lost.
Whatever a stage raises is caught by the one boundary (`agent_runtime.boundary`) and recorded by `contain` with
the stage's code. The session reads its
conversation (`session.conversation`: messages, segments, turns) and changes it only through its methods.

This module knows protocols, environments, rewards, tokens and `Generation`; it does not call engines (the
runtime and the training executor do) and knows nothing about HTTP or OpenRLHF.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog

from agent_env import (
    PARSE_CODES,
    Environment,
    EpisodeRecord,
    Observation,
    RewardBreakdown,
    RewardPipeline,
    StepRecord,
    StepReward,
)
from agent_protocol import (
    Action,
    ChatProtocol,
    Message,
    MessageLike,
    Tokenizer,
    coerce_messages,
    get_protocol,
    load_tokenizer,
)
from agent_runtime.boundary import Stage, boundary, coded
from agent_runtime.context_policy import BudgetPolicy, ContextPolicy
from agent_runtime.context_state import ContextState, Grown
from agent_runtime.conversation import Conversation, TurnRequest
from agent_runtime.engines.base import Generation
from agent_runtime.errors import SessionStateError
from agent_runtime.outcomes import EndingCode, ErrorCode, StopReason
from agent_runtime.trajectory import EpisodeError, Trajectory, Usage, build_trajectory

__all__ = ["AgentSession", "EnvironmentFactory", "Stage", "StepOutcome", "TurnRequest"]

logger = structlog.get_logger(__name__)

EnvironmentFactory = Callable[[], Environment]


class StepOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What one `step` did: the parsed action, the observations, the step's process reward, whether the
    episode is over, and the feedback ids appended (empty when it ended)."""

    turn: int
    action: Action
    observations: tuple[Observation, ...] = ()
    step_reward: StepReward | None = None
    done: bool = False
    final_answer: str | None = None
    truncated: bool = False
    feedback_ids: list[int] = msgspec.field(default_factory=list)
    compaction: str | None = None  # the summary, when this step was a summary turn and the context was compacted
    #: the context policy started a new segment from messages it rewrote, at this turn's feedback (no summary turn)
    new_segment: bool = False
    error: EpisodeError | None = None  # set when an exception ended the episode in this step (see `contain`)


class AgentSession:
    """One episode at a time. `spawn()` gives a fresh session with the same definition (for concurrency)."""

    def __init__(
        self,
        protocol: ChatProtocol | str,
        environment: Environment | EnvironmentFactory,
        rewards: RewardPipeline | None = None,
        tokenizer: Tokenizer | str | Path | None = None,
        *,
        max_new_tokens: int = 1024,
        max_context_tokens: int | None = None,
        system_prompt: str | None = None,
        context: ContextPolicy | None = None,
        max_images: int | None = None,
        special_tokens_in_text: bool = False,
    ) -> None:
        """`max_images`: the most images one context may hold (a prompt or feedback past it is an error that says
        so; None: no limit here, the engine's own applies). `special_tokens_in_text`: tokenize user and tool text
        as Hugging Face does, control strings in it becoming control tokens (default: they stay text, see
        `agent_protocol.control_tokens`)."""
        self.protocol = get_protocol(protocol) if isinstance(protocol, str) else protocol
        self._environment_source = environment
        self.rewards = rewards
        self.tokenizer: Tokenizer | None = None if tokenizer is None else load_tokenizer(tokenizer)
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
        if max_context_tokens is not None and max_context_tokens <= 0:
            raise ValueError(f"max_context_tokens must be positive, got {max_context_tokens}")
        self.max_new_tokens = max_new_tokens
        self.max_context_tokens = max_context_tokens
        if max_images is not None and max_images < 0:
            raise ValueError(f"max_images must be at least 0, got {max_images}")
        self.max_images = max_images
        self.special_tokens_in_text = special_tokens_in_text
        self.system_prompt = system_prompt
        self.context: ContextPolicy = context if context is not None else BudgetPolicy()
        self.environment = self._new_environment()
        self._clear()

    # -- lifecycle ---------------------------------------------------------------------------------------

    def spawn(self) -> AgentSession:
        """A fresh session with this one's definition and a new environment (for another episode)."""
        clone = copy.copy(self)
        clone.environment = self._new_environment()
        clone._clear()
        return clone

    def _new_environment(self) -> Environment:
        source = self._environment_source
        if isinstance(source, Environment):
            # One instance per episode: a shallow copy shares the read-only tools and gets its own state on reset.
            env = copy.copy(source)
            env.episode_id = os.urandom(6).hex()
            return env
        env = source()
        if not isinstance(env, Environment):
            raise TypeError(f"the environment factory returned {type(env).__name__}, not an Environment")
        return env

    def _clear(self) -> None:
        self.episode_id = self.environment.episode_id
        self.conversation: Conversation | None = None
        self.prompt_messages: list[Message] = []
        self.task: dict[str, Any] = {}
        self.steps: list[StepRecord] = []
        self.step_rewards: list[StepReward] = []
        self.errors: list[EpisodeError] = []
        self.tool_calls = 0
        self.context_state = ContextState(self.context, episode_id=self.episode_id)
        self.done = False
        self.started = False
        self.stop_reason: StopReason | None = None
        self.final_answer: str | None = None
        self.breakdown: RewardBreakdown | None = None
        self.timings: dict[str, float] = {"environment_s": 0.0, "reward_s": 0.0, "render_s": 0.0}
        self._stage: Stage = "idle"

    @property
    def reward(self) -> float:
        return self.breakdown.total if self.breakdown is not None else 0.0

    @property
    def context_limit(self) -> int | None:
        return self.max_context_tokens

    def bind_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Use `tokenizer` when none was given (the runtime binds its engine's)."""
        if self.tokenizer is None:
            self.tokenizer = tokenizer

    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise SessionStateError("the session has no tokenizer; pass tokenizer= or run it through AgentRuntime")
        return self.tokenizer

    def _turns(self) -> int:
        return self.conversation.turns if self.conversation is not None else 0

    def _conv(self) -> Conversation:
        if self.conversation is None:
            raise SessionStateError("call reset() first")
        return self.conversation

    # -- the loop ----------------------------------------------------------------------------------------

    async def reset(self, prompt: str | Sequence[MessageLike], *, task: Mapping[str, Any] | None = None) -> list[int]:
        """Start an episode on `prompt` (a user message, or a whole conversation). `task` is the dataset row
        (references for rewards, metadata). A prompt with images gives the task its "images" (the prompt's, in
        order) unless the row has its own, so a tool that looks at the task's images (`crop`) sees them when
        served as when trained. Returns the prompt ids."""
        if self.started:
            self.environment = self._new_environment()
            self._clear()
        messages = (
            [Message(role="user", content=prompt)]
            if isinstance(prompt, str)
            else coerce_messages(prompt, images=self.protocol.accepts_images)
        )
        if not messages:
            raise ValueError("reset() needs a prompt: a string or at least one message")
        if self.system_prompt is not None and messages[0].role != "system":
            messages.insert(0, Message(role="system", content=self.system_prompt))
        tokenizer = self._tok()
        self.task = dict(task or {})
        shown = [image.url for message in messages for image in message.images]
        if shown and "images" not in self.task:  # the tools that look (crop) read the task's images
            self.task["images"] = shown
        self.prompt_messages = list(messages)
        self.context_state.prompt = self.prompt_messages
        with boundary("environment") as reset_failed:  # ends this episode (below), once its prompt is recorded
            await self.environment.reset(self.task)
        conversation = Conversation(  # with the tools the environment has after its reset
            self.protocol,
            tokenizer,
            max_new_tokens=self.max_new_tokens,
            max_context_tokens=self.max_context_tokens,
            tools=self.environment.tools,
            errors=self.errors,
            max_images=self.max_images,
            special_tokens_in_text=self.special_tokens_in_text,
        )
        self.started = True
        ids = await conversation.open_segment(messages)  # raises for a prompt that cannot be rendered: caller input
        self.conversation = conversation
        if reset_failed.exception is not None:
            await self._end_on(reset_failed)
            return ids
        if not conversation.fits(0):
            limit = self.max_context_tokens
            await self._fail_with("context_exhausted", f"the prompt has {len(ids)} tokens; the context holds {limit}")
        return ids

    async def next_request(self) -> TurnRequest | None:
        """The next generation to run, or None when the episode is over (it may end here, on budget)."""
        if not self.started:
            raise SessionStateError("call reset() before next_request()")
        if self.done:
            return None
        conversation = self._conv()
        summary_budget = self.context_state.summary_budget
        if summary_budget is not None:
            request = conversation.request(summary_budget, purpose="summary")
            if request is None:
                await self._fail_with("context_exhausted", "no room left for the summary turn")
            return request
        request = conversation.request(self.max_new_tokens)
        if request is None:
            await self._fail_with(
                "context_exhausted", f"no room left for another turn in {self.max_context_tokens} tokens"
            )
        return request

    async def step(self, generation: Generation) -> StepOutcome:
        """Apply one generated turn. Never raises for what the model, a tool, the environment or a reward
        did: anything any of them raises (any `BaseException` but `KeyboardInterrupt` and the cancellation of
        the episode's task from outside, see `agent_env.containment`) ends this episode only, recorded with the
        code of the stage it came from (``decode_error``, ``parse_error``, ``environment_error``, ``reward_error``,
        ``render_error``), and everything recorded before it (the generated ids included) is kept."""
        if not self.started:
            raise SessionStateError("call reset() before step()")
        if self.done:
            raise SessionStateError(f"episode {self.episode_id} is over ({self.stop_reason}); call reset()")
        # A boundary per step, not one kept on the session: that one held the session's own bound method, a
        # reference cycle that left every finished episode (its transcript's id lists too) to the cyclic garbage
        # collector instead of being freed when its request ended (about 40 us of collection per served request).
        with boundary(self._current_stage) as failed:
            if self.context_state.summarizing:
                return await self._resume_from_summary(generation)
            return await self._apply(generation)
        return StepOutcome(turn=self._turns(), action=Action(), done=True, error=await self._end_on(failed))

    def _current_stage(self) -> Stage:
        return self._stage

    async def _apply(self, generation: Generation) -> StepOutcome:
        conversation = self._conv()
        reply = conversation.accept(generation, call_id_prefix=f"call_{conversation.turns + 1}")
        turn, action, truncated = conversation.turns, reply.action, reply.truncated
        self.tool_calls += len(action.tool_calls)

        self._stage = "environment"
        t0 = time.perf_counter()
        result = await self.environment.step(action)
        self.timings["environment_s"] += time.perf_counter() - t0
        observations = result.observations
        for observation in observations:  # parse problems are recorded by the conversation, from the action
            if not observation.ok and observation.code not in PARSE_CODES:
                self.record_error(observation.code or "tool_error", observation.content, turn)
        if result.stop_reason == "environment_error":
            self.record_error("environment_error", str(result.info.get("error", "")), turn)
        if result.done:  # the observations of a final step are part of the record, never rendered
            conversation.add_messages(o.to_message() for o in observations)

        record = StepRecord(index=turn - 1, action=action, observations=observations, done=result.done)
        self.steps.append(record)
        self._stage = "reward"
        step_reward = await self._score_step(record)

        if result.done:
            self.final_answer = result.final_answer
            self._stage = "idle"
            await self._finish(result.stop_reason or "done")
            return StepOutcome(
                turn=turn, action=action, observations=observations, step_reward=step_reward,
                done=True, final_answer=result.final_answer, truncated=truncated,
            )  # fmt: skip
        feedback = [o.to_message() for o in observations]
        if not feedback:
            self._stage = "idle"
            await self._fail_with("environment_error", "the environment answered nothing and did not end the episode")
            return StepOutcome(turn=turn, action=action, step_reward=step_reward, done=True, truncated=truncated)
        self._stage = "render"  # the context policy's instruction and the feedback's render
        grown = await self.context_state.add_feedback(self._conv(), feedback)  # what the context policy decides
        feedback_ids = await self._grown(grown)
        self._stage = "idle"
        return StepOutcome(
            turn=turn, action=action, observations=observations, step_reward=step_reward,
            done=self.done, truncated=truncated, feedback_ids=feedback_ids, new_segment=grown.new_segment,
        )  # fmt: skip

    async def _resume_from_summary(self, generation: Generation) -> StepOutcome:
        """A summary turn: the context policy reads it (a compaction goes on from it in a new segment)."""
        conversation = self._conv()
        reply = conversation.accept(generation, call_id_prefix="summary", summary=True)
        grown = await self.context_state.after_summary(conversation, reply.action)
        ids = await self._grown(grown)
        return StepOutcome(
            turn=self._turns(), action=reply.action, done=self.done, feedback_ids=ids, compaction=grown.summary
        )

    async def _grown(self, grown: Grown) -> list[int]:
        """The ids the context grew by; or, when the policy (or the budget) ended the episode, end it."""
        if grown.ended is None:
            return grown.ids
        await self._fail_with(grown.ended.code, grown.ended.message)
        return grown.ids if grown.new_segment else []

    async def contain(self, error: BaseException) -> EpisodeError:
        """End the episode because `error` escaped one of its stages (see `step`); the error is recorded with
        the stage's code (`agent_runtime.boundary.coded`), the episode is scored if the reward pipeline still can
        be, and nothing recorded is lost. The runtime calls it for what escaped the session."""
        code, raised, message = coded(error, self._stage)
        return await self._contained(code, message, raised)

    async def _end_on(self, caught: boundary) -> EpisodeError:
        """End the episode on what `caught` (one of this session's boundaries) contained."""
        return await self._contained(caught.code, caught.message, caught.exception)

    async def _contained(self, code: EndingCode, message: str, raised: BaseException | None) -> EpisodeError:
        stage, error_type = self._stage, type(raised).__name__
        logger.bind(episode_id=self.episode_id, turn=self._turns()).warning(
            "episode_contained_error", code=code, stage=stage, error_type=error_type, error=message
        )
        self._stage = "idle"
        if self.done:  # it failed while finishing (scoring): keep the stop reason, record what broke
            return self.record_error(code, message)
        return await self._fail_with(code, message)

    async def fail(self, code: EndingCode, message: str) -> None:
        """End the episode because of an error outside the model's control (a dead engine). What was
        recorded stays; the episode is still scored, so a rollout gets a reward."""
        if self.done:
            return
        await self._fail_with(code, message)

    async def _fail_with(self, code: EndingCode, message: str) -> EpisodeError:
        error = self.record_error(code, message)
        logger.bind(episode_id=self.episode_id, turn=self._turns()).info("episode_ended_early", code=code, why=message)
        await self._finish(code)  # an error that ends an episode is its stop reason
        return error

    def record_error(self, code: ErrorCode, message: str, turn: int | None = None) -> EpisodeError:
        """Record an error on the episode (at the current turn unless `turn` says), without ending it."""
        error = EpisodeError(code=code, message=message, turn=self._turns() if turn is None else turn)
        self.errors.append(error)
        return error

    async def _finish(self, reason: StopReason) -> None:
        self.done = True
        self.stop_reason = reason
        self._stage = "reward"
        with boundary("reward") as failed:
            await self.score()
        self._stage = "idle"
        if failed.exception is not None:  # a reward that raised: the episode keeps its stop reason, no reward
            self.breakdown = None
            await self._end_on(failed)

    async def _score_step(self, record: StepRecord) -> StepReward | None:
        if self.rewards is None or not self.rewards.process:
            return None
        t0 = time.perf_counter()
        reward = await self.rewards.score_step(record, self.episode_record())
        self.timings["reward_s"] += time.perf_counter() - t0
        self.step_rewards.append(reward)
        return reward

    async def score(self) -> RewardBreakdown | None:
        """Score the episode with the reward pipeline (done automatically when it ends)."""
        if self.rewards is None:
            return None
        t0 = time.perf_counter()
        self.breakdown = await self.rewards.score(self.episode_record())
        self.timings["reward_s"] += time.perf_counter() - t0
        return self.breakdown

    # -- views -------------------------------------------------------------------------------------------

    def episode_record(self) -> EpisodeRecord:
        references = self.task.get("references", self.task.get("answer", self.task.get("label")))
        if references is None:
            refs: tuple[str, ...] = ()
        elif isinstance(references, (list, tuple)):
            refs = tuple(str(r) for r in references)
        else:
            refs = (str(references),)
        return EpisodeRecord(
            prompt=tuple(self.prompt_messages),
            steps=tuple(self.steps),
            final_answer=self.final_answer,
            references=refs,
            stop_reason=self.stop_reason,
            metadata={k: v for k, v in self.task.items() if k not in ("references", "answer", "label")},
        )

    def usage(self) -> Usage:
        return self.conversation.usage() if self.conversation is not None else Usage()

    def _timings(self) -> dict[str, float]:
        timings = dict(self.timings)
        if self.conversation is not None:
            timings["render_s"] = self.conversation.render_s
        return timings

    def record(self, *, policy_version: int | None = None) -> Trajectory:
        """The episode as a `Trajectory` (serving logs it, training consumes it); `policy_version`: the engine's
        now (`LLMEngine.policy_version`), which the session does not know."""
        conversation = self.conversation
        return build_trajectory(
            episode_id=self.episode_id,
            protocol=self.protocol.name,
            messages=conversation.messages if conversation is not None else (),
            segments=conversation.records() if conversation is not None else [],
            generations=conversation.generations if conversation is not None else 0,
            breakdown=self.breakdown,
            final_answer=self.final_answer,
            stop_reason=self.stop_reason,
            turns=self._turns(),
            tool_calls=self.tool_calls,
            compactions=self.context_state.compactions,
            errors=self.errors,
            timings=self._timings(),
            task=self.task,
            policy_version=policy_version,
        )
