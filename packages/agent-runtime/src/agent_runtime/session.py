"""`AgentSession`: the one episode loop that serving and training both run.

    session = AgentSession(protocol="qwen3", environment=env, rewards=pipeline, tokenizer=tok)
    prompt_ids = await session.reset("What is 17 * 23?")
    while (request := await session.next_request()) is not None:          # None once the episode is over
        generation = await engine.generate(request.prompt_ids, request.sampling(base))
        outcome = await session.step(generation)

`reset` renders the first prompt through the protocol and tokenizes it once. `step` appends the generated
ids exactly as sampled (never re-tokenized), parses their text, steps the environment, scores the step,
renders the feedback (tool results, next turn header) and appends the feedback's ids, tokenized alone.
`next_request` enforces the budgets: a per-turn `max_new_tokens` and a `max_context_tokens` for the context;
when the next turn cannot fit, the episode ends cleanly with ``stop_reason="context_exhausted"`` and the engine
is never sent a prompt longer than its context. Errors (a dead engine, a broken environment) are recorded on
the trajectory with `fail`; nothing already recorded is lost.

This module knows protocols, environments, rewards, tokens and `Generation`; it does not call engines (the
runtime and the training executor do) and knows nothing about HTTP or OpenRLHF.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

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
    TokenTranscript,
    coerce_messages,
    get_protocol,
    load_tokenizer,
)
from agent_runtime.encoding import encode_off_loop
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.errors import SessionStateError
from agent_runtime.trajectory import EpisodeError, Trajectory, Usage

__all__ = ["AgentSession", "EnvironmentFactory", "StepOutcome", "TurnRequest"]

logger = structlog.get_logger(__name__)

EnvironmentFactory = Callable[[], Environment]
_MIN_TURN_TOKENS: Final = 1
_ERROR_PREVIEW: Final = 500

Stage = Literal["idle", "decode", "parse", "environment", "reward", "render"]
"""Where a step is: the foreign code it is running, so that an exception is recorded with the right code."""

_STAGE_CODES: Final[dict[str, str]] = {
    "decode": "decode_error",  # the tokenizer could not decode the generated ids
    "parse": "parse_error",  # the protocol's parser raised (it should not: see ChatProtocol.parse_assistant_text)
    "environment": "environment_error",  # the environment's reset or step raised
    "reward": "reward_error",  # a process reward raised
    "render": "render_error",  # the feedback could not be rendered or tokenized
}


CONTAINED: Final = (Exception, SystemExit)
"""What an episode boundary catches: every error, and `SystemExit` (a tool, environment or reward plug-in calling
`sys.exit` must not end a server or a training step). Never `KeyboardInterrupt` or cancellation."""


def _short(text: str) -> str:
    return text if len(text) <= _ERROR_PREVIEW else text[:_ERROR_PREVIEW] + "..."


class TurnRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the next generation needs: the full prompt ids of the current context and the token budget."""

    prompt_ids: list[int]
    max_new_tokens: int
    purpose: str = "turn"  # "turn" or "summary" (compaction)

    def sampling(self, base: SamplingParams | None = None) -> SamplingParams:
        """`base` with `max_new_tokens` clamped to this turn's budget."""
        base = base or SamplingParams()
        return msgspec.structs.replace(base, max_new_tokens=min(base.max_new_tokens, self.max_new_tokens))


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
    compaction: str | None = None  # set by CompactableSession when this step produced a summary
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
    ) -> None:
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
        self.system_prompt = system_prompt
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
            env.episode_id = uuid.uuid4().hex[:12]
            return env
        env = source()
        if not isinstance(env, Environment):
            raise TypeError(f"the environment factory returned {type(env).__name__}, not an Environment")
        return env

    def _clear(self) -> None:
        self.episode_id = self.environment.episode_id
        self.segments: list[TokenTranscript] = []
        self.messages: list[Message] = []
        self.prompt_messages: list[Message] = []
        self.task: dict[str, Any] = {}
        self.steps: list[StepRecord] = []
        self.step_rewards: list[StepReward] = []
        self.errors: list[EpisodeError] = []
        self.turns = 0
        self.generations = 0
        self.tool_calls = 0
        self.compactions = 0
        self.done = False
        self.started = False
        self.stop_reason: str | None = None
        self.final_answer: str | None = None
        self.breakdown: RewardBreakdown | None = None
        self.timings: dict[str, float] = {"environment_s": 0.0, "reward_s": 0.0, "render_s": 0.0}
        self._turn_closed = True
        self.stage: Stage = "idle"

    @property
    def transcript(self) -> TokenTranscript:
        """The current segment's transcript (the only one unless the session compacted)."""
        if not self.segments:
            raise SessionStateError("the session has no transcript yet; call reset() first")
        return self.segments[-1]

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

    # -- the loop ----------------------------------------------------------------------------------------

    async def reset(self, prompt: str | Sequence[MessageLike], *, task: Mapping[str, Any] | None = None) -> list[int]:
        """Start an episode on `prompt` (a user message, or a whole conversation). `task` is the dataset row
        (references for rewards, metadata). Returns the prompt ids."""
        if self.started:
            self.environment = self._new_environment()
            self._clear()
        messages = [Message(role="user", content=prompt)] if isinstance(prompt, str) else coerce_messages(prompt)
        if not messages:
            raise ValueError("reset() needs a prompt: a string or at least one message")
        if self.system_prompt is not None and messages[0].role != "system":
            messages.insert(0, Message(role="system", content=self.system_prompt))
        self.started = True
        self.task = dict(task or {})
        self.prompt_messages = list(messages)
        self.messages = list(messages)
        reset_error: BaseException | None = None
        try:
            await self.environment.reset(self.task)
        except CONTAINED as e:  # ends this episode (below), once its prompt is recorded
            reset_error = e
        ids = await self._render_prompt(messages)
        if reset_error is not None:
            self.stage = "environment"
            await self.contain(reset_error)
            return ids
        log = logger.bind(episode_id=self.episode_id)
        log.debug("session_reset", prompt_tokens=len(ids))
        if self.max_context_tokens is not None and len(ids) + _MIN_TURN_TOKENS > self.max_context_tokens:
            limit = self.max_context_tokens
            await self._fail_with("context_exhausted", f"the prompt has {len(ids)} tokens; the context holds {limit}")
        return ids

    async def _render_prompt(self, messages: Sequence[Message]) -> list[int]:
        t0 = time.perf_counter()
        ids = await self._encode(self.protocol.render_prompt(messages, tools=self.environment.tools))
        self.timings["render_s"] += time.perf_counter() - t0
        transcript = TokenTranscript()
        transcript.append_prompt(ids)
        self.segments.append(transcript)
        return ids

    async def next_request(self) -> TurnRequest | None:
        """The next generation to run, or None when the episode is over (it may end here, on budget)."""
        if not self.started:
            raise SessionStateError("call reset() before next_request()")
        if self.done:
            return None
        room = self._room(self.max_new_tokens)
        if room < _MIN_TURN_TOKENS:
            await self._fail_with(
                "context_exhausted", f"no room left for another turn in {self.max_context_tokens} tokens"
            )
            return None
        return TurnRequest(prompt_ids=list(self.transcript.ids), max_new_tokens=room)

    def _room(self, wanted: int) -> int:
        if self.max_context_tokens is None:
            return wanted
        return min(wanted, self.max_context_tokens - len(self.transcript))

    async def step(self, generation: Generation) -> StepOutcome:
        """Apply one generated turn. Never raises for what the model, a tool, the environment or a reward
        did: an exception from any of them ends this episode only, recorded with the code of the stage it came
        from (``decode_error``, ``parse_error``, ``environment_error``, ``reward_error``, ``render_error``), and
        everything recorded before it (the generated ids included) is kept."""
        if not self.started:
            raise SessionStateError("call reset() before step()")
        if self.done:
            raise SessionStateError(f"episode {self.episode_id} is over ({self.stop_reason}); call reset()")
        self.turns += 1
        self.generations += 1
        turn = self.turns
        self.transcript.append_action(generation.ids, generation.logprobs)
        try:
            return await self._apply(generation, turn)
        except CONTAINED as e:
            return StepOutcome(turn=turn, action=Action(), done=True, error=await self.contain(e))

    async def _apply(self, generation: Generation, turn: int) -> StepOutcome:
        tok = self._tok()
        closed = self._closes_turn(generation.ids)
        truncated = not closed and generation.finish_reason == "length"
        self.stage = "decode"
        text = tok.decode(generation.ids)
        self.stage = "parse"
        action = self.protocol.parse_assistant_text(text, call_id_prefix=f"call_{turn}")
        for issue in action.issues:
            self.errors.append(EpisodeError(code=issue.code, message=issue.message, turn=turn))
        self.messages.append(action.to_message())
        self.tool_calls += len(action.tool_calls)

        self.stage = "environment"
        t0 = time.perf_counter()
        result = await self.environment.step(action)
        self.timings["environment_s"] += time.perf_counter() - t0
        observations = result.observations
        for observation in observations:  # parse problems are recorded above, from the action
            if not observation.ok and observation.code not in PARSE_CODES:
                code = observation.code or "tool_error"
                self.errors.append(EpisodeError(code=code, message=observation.content, turn=turn))
        if result.stop_reason == "environment_error":
            self._record_error("environment_error", str(result.info.get("error", "")), turn)
        self.messages.extend(o.to_message() for o in observations)

        record = StepRecord(index=turn - 1, action=action, observations=observations, done=result.done)
        self.steps.append(record)
        self.stage = "reward"
        step_reward = await self._score_step(record)

        if result.done:
            self.final_answer = result.final_answer
            self.stage = "idle"
            await self._finish(result.stop_reason or "done")
            return StepOutcome(
                turn=turn, action=action, observations=observations, step_reward=step_reward,
                done=True, final_answer=result.final_answer, truncated=truncated,
            )  # fmt: skip
        feedback_messages = [o.to_message() for o in observations]
        if not feedback_messages:
            self.stage = "idle"
            await self._fail_with("environment_error", "the environment answered nothing and did not end the episode")
            return StepOutcome(turn=turn, action=action, step_reward=step_reward, done=True, truncated=truncated)
        self.stage = "render"
        feedback_ids = await self._append_feedback(feedback_messages, closed=closed, turn=turn)
        self.stage = "idle"
        return StepOutcome(
            turn=turn, action=action, observations=observations, step_reward=step_reward,
            done=self.done, truncated=truncated, feedback_ids=feedback_ids,
        )  # fmt: skip

    async def contain(self, error: BaseException) -> EpisodeError:
        """End the episode because `error` escaped one of its stages (see `step`); the error is recorded with
        the stage's code, the episode is scored if the reward pipeline still can be, and nothing recorded is
        lost. The one place a foreign exception becomes episode data; the runtime calls it too."""
        code = _STAGE_CODES.get(self.stage, "internal_error")
        message = f"{type(error).__name__}: {_short(str(error))}"
        logger.bind(episode_id=self.episode_id, turn=self.turns).warning(
            "episode_contained_error", code=code, stage=self.stage, error_type=type(error).__name__, error=message
        )
        self.stage = "idle"
        if self.done:  # it failed while finishing (scoring): keep the stop reason, record what broke
            self._record_error(code, message, self.turns)
        else:
            await self._fail_with(code, message)
        return EpisodeError(code=code, message=message, turn=self.turns)

    async def _append_feedback(self, messages: list[Message], *, closed: bool, turn: int) -> list[int]:
        t0 = time.perf_counter()
        ids = await self._encode(self.protocol.render_feedback(messages, turn_closed=closed))
        self.timings["render_s"] += time.perf_counter() - t0
        if self._room(len(ids) + _MIN_TURN_TOKENS) < len(ids) + _MIN_TURN_TOKENS:
            await self._fail_with("context_exhausted", f"the feedback of turn {turn} ({len(ids)} tokens) does not fit")
            return []
        self.transcript.append_observation(ids)
        return ids

    async def _encode(self, text: str) -> list[int]:
        """Encode `text` alone; a long one on a worker thread, so other episodes on the loop keep running."""
        return await encode_off_loop(self._tok(), text)

    def _closes_turn(self, ids: Sequence[int]) -> bool:
        end = self._tok().token_to_id(self.protocol.end_of_turn)
        return bool(ids) and end is not None and ids[-1] == end

    async def fail(self, code: str, message: str) -> None:
        """End the episode because of an error outside the model's control (a dead engine). What was
        recorded stays; the episode is still scored, so a rollout gets a reward."""
        if self.done:
            return
        await self._fail_with(code, message)

    async def _fail_with(self, code: str, message: str) -> None:
        self._record_error(code, message, self.turns)
        logger.bind(episode_id=self.episode_id, turn=self.turns).info("episode_ended_early", code=code, why=message)
        await self._finish(code)

    def _record_error(self, code: str, message: str, turn: int) -> None:
        self.errors.append(EpisodeError(code=code, message=message, turn=turn))

    async def _finish(self, reason: str) -> None:
        self.done = True
        self.stop_reason = reason
        try:
            await self.score()
        except CONTAINED as e:  # a reward that raised: the episode keeps its stop reason and gets no reward
            self.breakdown = None
            self.stage = "reward"
            await self.contain(e)

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
        completion = sum(sum(t.loss_mask) for t in self.segments)
        total = sum(len(t) for t in self.segments)
        return Usage(prompt_tokens=total - completion, completion_tokens=completion, generations=self.generations)

    def record(self) -> Trajectory:
        """The episode as a `Trajectory` (serving logs it, training consumes it)."""
        return Trajectory(
            episode_id=self.episode_id,
            protocol=self.protocol.name,
            messages=list(self.messages),
            segments=[t.record() for t in self.segments],
            reward=self.reward,
            breakdown=self.breakdown,
            final_answer=self.final_answer,
            stop_reason=self.stop_reason,
            turns=self.turns,
            tool_calls=self.tool_calls,
            compactions=self.compactions,
            errors=list(self.errors),
            usage=self.usage(),
            timings=dict(self.timings),
            task=self.task,
        )
