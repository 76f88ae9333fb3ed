"""`ContextState`: one episode's side of its `ContextPolicy`, and the one place the policy's decisions are applied.

    state = ContextState(policy, prompt=prompt_messages)
    grown = await state.add_feedback(conversation, observed, max_new_tokens=1024)   # at a turn's feedback
    if grown.ended is not None: ...                                                   # end the episode with it
    request = conversation.request(state.summary_budget, purpose="summary") if state.summarizing else ...
    grown = await state.after_summary(conversation, reply.action)                     # at a summary turn

The policy (`agent_runtime.context_policy`) holds settings and decides; this state holds what the episode did (its
compactions, summaries, whether the next generation is a summary) and applies each decision to the `Conversation`:
renders the feedback (with a summary instruction), appends it when it fits, or opens a new segment from the
messages the policy returned. Agent mode (`AgentSession`) and tools mode (`serving.tools_mode`, without summary
turns: the client runs the turns there) both go through it. This module knows conversations and messages; it calls
no engine and steps no environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import structlog

from agent_protocol import Action, Message
from agent_runtime.context_policy import BudgetPolicy, ContextPolicy, ContextView, Continue, End, NewSegment, Summarize
from agent_runtime.conversation import Conversation

__all__ = ["ContextState", "Grown"]

logger = structlog.get_logger(__name__)


class Grown(msgspec.Struct, frozen=True, kw_only=True):
    """What growing the context did: the ids appended (a new segment's prompt when one was opened), or the
    `End` the episode must end with (nothing appended)."""

    ids: list[int] = msgspec.field(default_factory=list)
    ended: End | None = None
    new_segment: bool = False
    summary: str | None = None


@dataclass
class ContextState:
    """One episode's context bookkeeping under `policy` (see the module docstring)."""

    policy: ContextPolicy = field(default_factory=BudgetPolicy)
    prompt: Sequence[Message] = ()
    compactions: int = 0
    summaries: list[str] = field(default_factory=list)
    #: the budget of the summary turn asked for (None: the next generation is a turn)
    summary_budget: int | None = None
    #: the episode's id, for the logs
    episode_id: str = ""
    #: the policy keeps `ContextPolicy.on_feedback` (always `Continue`): no view to build, no call to make
    _plain: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._plain = type(self.policy).on_feedback is ContextPolicy.on_feedback

    @property
    def summarizing(self) -> bool:
        return self.summary_budget is not None

    def view(self, conversation: Conversation, tokens: int, feedback: Sequence[Message] = ()) -> ContextView:
        return ContextView(
            tokens=tokens,
            max_new_tokens=conversation.max_new_tokens,
            max_context_tokens=conversation.max_context_tokens,
            compactions=self.compactions,
            prompt=self.prompt,
            history=conversation.messages,
            feedback=feedback,
        )

    async def add_feedback(
        self, conversation: Conversation, observed: Sequence[Message], *, summaries: bool = True
    ) -> Grown:
        """Render `observed` as the feedback of the last turn and do what the policy decides. `summaries=False`
        (tools mode) reads a `Summarize` as `Continue`: nothing there runs a summary turn."""
        ids = await conversation.feedback_ids(observed)
        if self._plain:  # the budget's answer, without building what it would not read
            if not conversation.fits(len(ids)):
                return self._no_room(conversation, observed, ids)
            conversation.append_feedback(ids, observed)
            return Grown(ids=ids)
        decision = self.policy.on_feedback(self.view(conversation, len(conversation) + len(ids), observed))
        if isinstance(decision, Summarize) and summaries:
            messages = [*observed, decision.instruction]
            ids = await conversation.feedback_ids(messages)
            if not conversation.fits(len(ids)):
                return self._no_room(conversation, observed, ids)
            conversation.append_feedback(ids, messages)
            self.summary_budget = decision.max_new_tokens
            logger.bind(episode_id=self.episode_id, turn=conversation.turns).info(
                "compaction_requested", context_tokens=len(conversation)
            )
            return Grown(ids=ids)
        if isinstance(decision, End):
            conversation.add_messages(observed)  # the results are part of the record even when they are not shown
            return Grown(ended=decision)
        if isinstance(decision, NewSegment):
            conversation.add_messages(observed)
            return await self._open(conversation, decision)
        if not conversation.fits(len(ids)):  # Continue (or a Summarize nothing runs)
            return self._no_room(conversation, observed, ids)
        conversation.append_feedback(ids, observed)
        return Grown(ids=ids)

    async def after_summary(self, conversation: Conversation, reply: Action) -> Grown:
        """A summary turn came back (`reply`, already accepted by the conversation): do what the policy decides."""
        self.summary_budget = None
        decision = self.policy.on_summary(reply, self.view(conversation, len(conversation)))
        if isinstance(decision, NewSegment):
            return await self._open(conversation, decision)
        if isinstance(decision, Continue):
            return Grown()
        if isinstance(decision, End):
            return Grown(ended=decision)
        why = f"{type(self.policy).__name__} asked for another summary after a summary"
        return Grown(ended=End(why, code="compaction_failed"))

    async def _open(self, conversation: Conversation, decision: NewSegment) -> Grown:
        ids = await conversation.open_segment(list(decision.messages), add=list(decision.added))
        self.compactions += 1
        if decision.summary is not None:
            self.summaries.append(decision.summary)
        logger.bind(episode_id=self.episode_id).info(
            "compacted",
            segment=len(conversation.segments),
            prompt_tokens=len(ids),
            summary_chars=len(decision.summary or ""),
        )
        if not conversation.fits(0):
            ended = End(f"the compacted prompt still has {len(ids)} tokens")
            return Grown(ids=ids, ended=ended, new_segment=True, summary=decision.summary)
        return Grown(ids=ids, new_segment=True, summary=decision.summary)

    @staticmethod
    def _no_room(conversation: Conversation, observed: Sequence[Message], ids: list[int]) -> Grown:
        conversation.add_messages(observed)  # the results are part of the record even when they cannot be shown
        why = f"the feedback of turn {conversation.turns} ({len(ids)} tokens) does not fit"
        return Grown(ended=End(why))
