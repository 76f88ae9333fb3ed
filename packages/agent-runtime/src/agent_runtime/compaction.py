"""`CompactableSession`: an `AgentSession` that lets the model summarize a long episode and go on from the summary.

When the current context would pass `compact_at_tokens` after a turn's feedback, the session adds an instruction
(a user message, rendered through the protocol like any other) to that feedback and asks the model for a summary.
The summary turn is generated and trained like any other turn (loss mask 1) and does not step the environment.
Then a new segment starts, whose prompt is the system prompt and tools, the original task, and the summary
(`resume_template`); the episode continues there. Each segment is its own token sequence with its own action
ranges; the episode keeps them all, in order, sharing the episode's reward. After `max_compactions`, a context
that fills up ends the episode as an `AgentSession` would (``context_exhausted``).

This behaves the same in serving and in rollouts, because both drive the same `next_request` / `step` loop.
This module knows what the session knows, nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog

from agent_env import Environment, RewardPipeline
from agent_protocol import Action, ChatProtocol, Message, Tokenizer
from agent_runtime.engines.base import Generation
from agent_runtime.errors import SessionStateError
from agent_runtime.session import CONTAINED, AgentSession, StepOutcome, TurnRequest

__all__ = ["DEFAULT_COMPACTION_INSTRUCTION", "DEFAULT_RESUME_TEMPLATE", "CompactableSession"]

logger = structlog.get_logger(__name__)

DEFAULT_COMPACTION_INSTRUCTION: Final = (
    "Your context is nearly full. Summarize the task and everything you have learned so far (facts found, tool "
    "results that matter, what is left to do) in a few sentences. Reply with the summary only; do not call tools."
)
DEFAULT_RESUME_TEMPLATE: Final = "Summary of your work on this task so far:\n{summary}\n\nContinue the task from here."


class CompactableSession(AgentSession):
    """`AgentSession` plus compaction. `compact_at_tokens` defaults to 3/4 of `max_context_tokens`."""

    def __init__(
        self,
        protocol: ChatProtocol | str,
        environment: Environment | Callable[[], Environment],
        rewards: RewardPipeline | None = None,
        tokenizer: Tokenizer | str | Path | None = None,
        *,
        max_new_tokens: int = 1024,
        max_context_tokens: int | None = None,
        system_prompt: str | None = None,
        compact_at_tokens: int | None = None,
        max_compactions: int = 3,
        summary_max_new_tokens: int = 512,
        instruction: str = DEFAULT_COMPACTION_INSTRUCTION,
        resume_template: str = DEFAULT_RESUME_TEMPLATE,
    ) -> None:
        super().__init__(
            protocol,
            environment,
            rewards,
            tokenizer,
            max_new_tokens=max_new_tokens,
            max_context_tokens=max_context_tokens,
            system_prompt=system_prompt,
        )
        if "{summary}" not in resume_template:
            raise ValueError("resume_template must contain '{summary}'")
        if max_compactions < 0:
            raise ValueError(f"max_compactions must be >= 0, got {max_compactions}")
        self.compact_at_tokens = compact_at_tokens
        self.max_compactions = max_compactions
        self.summary_max_new_tokens = summary_max_new_tokens
        self.instruction = instruction
        self.resume_template = resume_template
        self._summarizing = False

    def _clear(self) -> None:
        super()._clear()
        self._summarizing = False
        self.summaries: list[str] = []

    @property
    def threshold(self) -> int | None:
        if self.compact_at_tokens is not None:
            return self.compact_at_tokens
        if self.max_context_tokens is not None:
            return self.max_context_tokens * 3 // 4
        return None

    async def next_request(self) -> TurnRequest | None:
        if self.done or not self._summarizing:
            return await super().next_request()
        room = self._room(self.summary_max_new_tokens)
        if room < 1:
            await self._fail_with("context_exhausted", "no room left for the summary turn")
            return None
        return TurnRequest(prompt_ids=list(self.transcript.ids), max_new_tokens=room, purpose="summary")

    async def _append_feedback(self, messages: list[Message], *, closed: bool, turn: int) -> list[int]:
        threshold = self.threshold
        if threshold is None or self.compactions >= self.max_compactions:
            return await super()._append_feedback(messages, closed=closed, turn=turn)
        plain = await self._encode(self.protocol.render_feedback(messages, turn_closed=closed))
        if len(self.transcript) + len(plain) + self.max_new_tokens <= threshold:
            return await super()._append_feedback(messages, closed=closed, turn=turn)
        instruction = Message(role="user", content=self.instruction)
        ids = await super()._append_feedback([*messages, instruction], closed=closed, turn=turn)
        if ids:
            self.messages.append(instruction)
            self._summarizing = True
            logger.bind(episode_id=self.episode_id, turn=turn).info(
                "compaction_requested", context_tokens=len(self.transcript), threshold=threshold
            )
        return ids

    async def step(self, generation: Generation) -> StepOutcome:
        if not self._summarizing:
            return await super().step(generation)
        if self.done:
            raise SessionStateError(f"episode {self.episode_id} is over ({self.stop_reason}); call reset()")
        self.generations += 1
        self.transcript.append_action(generation.ids, generation.logprobs)
        try:
            return await self._resume_from_summary(generation)
        except CONTAINED as e:  # the same boundary as AgentSession.step: this episode ends, recorded
            return StepOutcome(turn=self.turns, action=Action(), done=True, error=await self.contain(e))

    async def _resume_from_summary(self, generation: Generation) -> StepOutcome:
        self.stage = "decode"
        text = self._tok().decode(generation.ids)
        self.stage = "parse"
        action = self.protocol.parse_assistant_text(text, call_id_prefix="summary")
        self.stage = "render"
        summary = action.content.strip() or (action.reasoning_content or "").strip()
        self.messages.append(
            Message(role="assistant", content=action.content, reasoning_content=action.reasoning_content)
        )
        self._summarizing = False
        if not summary:
            self.stage = "idle"
            await self._fail_with("compaction_failed", "the model's summary was empty")
            return StepOutcome(turn=self.turns, action=action, done=True)
        self.compactions += 1
        self.summaries.append(summary)
        resume = Message(role="user", content=self.resume_template.format(summary=summary))
        prompt = [*self.prompt_messages, resume]
        self.messages.append(resume)
        ids = await self._render_prompt(prompt)
        logger.bind(episode_id=self.episode_id).info(
            "compacted", segment=len(self.segments), prompt_tokens=len(ids), summary_chars=len(summary)
        )
        self.stage = "idle"
        if self.max_context_tokens is not None and len(ids) + 1 > self.max_context_tokens:
            await self._fail_with("context_exhausted", f"the compacted prompt still has {len(ids)} tokens")
        return StepOutcome(turn=self.turns, action=action, done=self.done, feedback_ids=ids, compaction=summary)
