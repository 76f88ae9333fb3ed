"""`AgentProgram`: an agent that is already written, against the OpenAI API, named by a recipe for training.

    async def my_agent(client: openai.AsyncOpenAI, task: ProgramTask) -> str | None:
        messages = task.messages
        while True:
            reply = await client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS)
            ...                                   # run the tools it asks for, any framework, any loop
        return answer

    recipe = Recipe(name="my-agent", agent=AgentProgram(my_agent, timeout_s=120), rewards=RewardPipeline(...))

In a rollout the program gets an `openai.AsyncOpenAI` pointed at an endpoint of its own (one per episode) whose
model is the policy being trained (`agent_runtime.proxy`). Every request it makes is one tools-mode turn; the
proxy keeps the token ids the model sampled, and the episode's training sample is built from them. The recipe's
`rewards` score the returned answer (`EpisodeRecord.final_answer`) and the transcript (the model's turns as steps,
the tool messages the program sent back as their observations), as for any recipe.

Budgets: `timeout_s` bounds the whole program (wall clock), `max_episode_tokens` the tokens the model may
generate over all of its requests. A program that raises, overruns its time or spends its tokens ends only its own
episode, with one of `ProgramCode`; one that never calls the endpoint gets reward 0 and a warning.

This module holds the definition only; running it is `agent_runtime.proxy`'s business.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

__all__ = ["PROGRAM_CODES", "AgentFunction", "AgentProgram", "ProgramCode", "ProgramTask"]

ProgramCode = Literal["program_error", "program_timeout", "token_budget_exhausted", "no_model_calls"]
"""How an agent program's episode went wrong: it raised (or returned something that is not a string), it ran past
`timeout_s`, the model's requests spent `max_episode_tokens`, or it never called the model at all."""

PROGRAM_CODES: Final[tuple[ProgramCode, ...]] = (
    "program_error",
    "program_timeout",
    "token_budget_exhausted",
    "no_model_calls",
)


class ProgramTask(msgspec.Struct, frozen=True, kw_only=True):
    """What a program is asked to do: the dataset row's `prompt` (a string or OpenAI messages), the whole `row`
    (references and metadata stay with the trainer; they are here for programs that need task fields), and the
    `model` id the endpoint serves (send it as ``model=``)."""

    prompt: str | list[dict[str, Any]]
    row: dict[str, Any] = msgspec.field(default_factory=dict)
    model: str = "policy"

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The prompt as OpenAI chat messages (a new list: the program may append to it)."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [dict(m) for m in self.prompt]

    @property
    def question(self) -> str:
        """The text of the prompt's last user message."""
        for message in reversed(self.messages):
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                return str(message["content"])
        return ""


AgentFunction = Callable[[Any, ProgramTask], Awaitable[Any]]
"""``async def agent(client: openai.AsyncOpenAI, task: ProgramTask) -> str | None``: the final answer, or None."""


@dataclass(frozen=True)
class AgentProgram:
    """An agent program and its per-episode budgets (see the module docstring).

    - `agent`: the program.
    - `timeout_s`: the most wall-clock seconds one episode may take (None: no bound).
    - `max_episode_tokens`: the most tokens the model may generate over all of an episode's requests (None: only
      the per-turn and context limits apply). A request past it fails (HTTP 500, ``engine_error``) and the
      episode is recorded as ``token_budget_exhausted`` if the program then fails.
    - `model_name`: the model id the endpoint serves (`ProgramTask.model`).
    """

    agent: AgentFunction
    timeout_s: float | None = 600.0
    max_episode_tokens: int | None = None
    model_name: str = "policy"

    def __post_init__(self) -> None:
        if not callable(self.agent):
            raise TypeError(f"AgentProgram.agent must be an async function, got {type(self.agent).__name__}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive (or None), got {self.timeout_s}")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be at least 1 (or None), got {self.max_episode_tokens}")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
