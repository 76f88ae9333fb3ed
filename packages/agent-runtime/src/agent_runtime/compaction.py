"""Deprecated: `CompactableSession`, the seed's name for an `AgentSession` whose context policy is compaction.

    session = CompactableSession(environment=env, protocol=protocol, max_context_tokens=32768)   # deprecated
    session = AgentSession(environment=env, protocol=protocol, max_context_tokens=32768,
                           context=CompactionPolicy())                                         # write this

The model summarizes a long episode and goes on from the summary in a new segment (`CompactionPolicy`, see
`agent_runtime.context_policy`). Nothing here overrides the session's loop; this module only builds the policy
from keyword arguments, with a `DeprecationWarning` naming the replacement.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

from agent_env import Environment, RewardPipeline
from agent_protocol import ChatProtocol, Tokenizer
from agent_runtime.context_policy import DEFAULT_COMPACTION_INSTRUCTION, DEFAULT_RESUME_TEMPLATE, CompactionPolicy
from agent_runtime.session import AgentSession

__all__ = ["DEFAULT_COMPACTION_INSTRUCTION", "DEFAULT_RESUME_TEMPLATE", "CompactableSession"]


class CompactableSession(AgentSession):
    """Deprecated: `AgentSession(..., context=CompactionPolicy(...))`. `compact_at_tokens` defaults to 3/4 of
    `max_context_tokens`; `instruction` is the policy's `instruction_text`."""

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
        max_images: int | None = None,
        special_tokens_in_text: bool = False,
    ) -> None:
        warnings.warn(
            "CompactableSession is deprecated; write AgentSession(..., context=CompactionPolicy(...))",
            DeprecationWarning,
            stacklevel=2,
        )
        policy = CompactionPolicy(
            compact_at_tokens=compact_at_tokens,
            max_compactions=max_compactions,
            summary_max_new_tokens=summary_max_new_tokens,
            instruction_text=instruction,
            resume_template=resume_template,
        )
        super().__init__(
            protocol,
            environment,
            rewards,
            tokenizer,
            max_new_tokens=max_new_tokens,
            max_context_tokens=max_context_tokens,
            system_prompt=system_prompt,
            context=policy,
            max_images=max_images,
            special_tokens_in_text=special_tokens_in_text,
        )
