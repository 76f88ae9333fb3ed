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
generate over all of its requests, `max_requests` its model calls and `max_conversations` the conversations it may
open (each one a training record). A program that raises anything at all, overruns its time, spends its tokens or
passes a cap ends only its own episode, with one of `ProgramCode`; one that never calls the endpoint gets reward 0
and a warning.

A program may also be a synchronous function (`AgentProgram.sync`), ``def agent(client: openai.OpenAI, task) ->
str | None``: it runs on a thread of its own with a synchronous client bound to its endpoint (the endpoint's URL and
key cannot be given as ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` in process: the environment is the whole process's;
a program that reads only those runs as a command line, below).

A program may also be a command line (`AgentProgram.command`): a process started per episode, in a process group
of its own, with ``OPENAI_BASE_URL`` (its session's URL on the rollout worker's listening gateway,
`agent_runtime.proxy.gateway`), ``OPENAI_API_KEY`` (the session's key) and ``OPENAI_MODEL`` in its environment,
the task as one JSON object on its stdin (``{"prompt": ..., "row": ..., "model": ...}``: `ProgramTask`'s fields),
and the last non-empty line of its stdout as its answer. Any language, any client, synchronous or not:

    program = AgentProgram.command([sys.executable, "my_agent.py"], timeout_s=120)

Its budgets and codes are a function program's; a non-zero exit is ``program_error`` with the tail of its stderr,
and its time budget kills the whole process group (SIGTERM, then SIGKILL after `ProgramCommand.kill_grace_s`).

Each function program's episode runs on a thread and an event loop of its own, so that blocking code in it
(``time.sleep``, a synchronous client, a CPU loop) stalls nobody else and is cut off at `timeout_s`; its requests
are handed to the endpoint on the rollout's own loop, where the engine lives. At most `max_concurrent` episodes of
one program run at once in a process; the others wait for a place, and their time budget starts when they run.

This module holds the definition only; running it is `agent_runtime.proxy`'s business.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

import msgspec

__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_MAX_CONVERSATIONS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_MAX_REQUESTS",
    "PROGRAM_CODES",
    "AgentFunction",
    "AgentProgram",
    "ProgramCode",
    "ProgramCommand",
    "ProgramSync",
    "ProgramTask",
]

ProgramCode = Literal[
    "program_error",
    "program_timeout",
    "token_budget_exhausted",
    "no_model_calls",
    "too_many_requests",
    "too_many_conversations",
    "program_unavailable",
]
"""How an agent program's episode went wrong: it raised (anything: a `BaseException` too; or returned something that
is not a string), it ran past `timeout_s`, the model's requests spent `max_episode_tokens`, it never called the
model at all, it asked for a model call past `max_requests` or opened a conversation past `max_conversations`, or
it could not be started (the process already holds too many programs that never stopped after their timeout)."""

PROGRAM_CODES: Final[tuple[ProgramCode, ...]] = get_args(ProgramCode)  # the codes, in order: one list to extend

DEFAULT_MAX_REQUESTS: Final = 256
"""Model calls one episode may make: far more than an agent's turns, few enough that a retry loop is cut short."""

DEFAULT_MAX_CONVERSATIONS: Final = 32
"""Conversations one episode may open (a new one, or a rewritten history: each is a training record of its own)."""

DEFAULT_MAX_CONCURRENT: Final = 512
"""Episodes of one program that run at once in one process, each on a thread of its own: half of agent-env's
process-wide cap on worker threads (1024), which the tools' threads share."""


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

DEFAULT_MAX_OUTPUT_BYTES: Final = 1 << 20
"""Bytes of a command program's stdout read at most (more ends the episode as ``program_error``), and of its
stderr kept (the last ones: the tail quoted when it fails)."""


@dataclass(frozen=True)
class ProgramCommand:
    """A program that is a command line (`AgentProgram.command`), started once per episode.

    - `argv`: the command and its arguments (no shell).
    - `env`: the environment it starts with (None: this process's), to which ``OPENAI_BASE_URL``,
      ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` are added.
    - `cwd`: its working directory (None: this process's).
    - `max_output_bytes`: see `DEFAULT_MAX_OUTPUT_BYTES`.
    - `kill_grace_s`: how long it has to exit after SIGTERM (when its time is up, or it ended its session) before
      its process group gets SIGKILL.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    kill_grace_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise ValueError(f"a command program needs a non-empty list of strings, got {self.argv!r}")
        if self.max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be at least 1, got {self.max_output_bytes}")
        if not self.kill_grace_s >= 0:
            raise ValueError(f"kill_grace_s must be at least 0, got {self.kill_grace_s}")


@dataclass(frozen=True)
class ProgramSync:
    """A program that is a synchronous function (`AgentProgram.sync`): ``function(client, task)``, where `client`
    is an `openai.OpenAI` bound to the episode's endpoint; run on the episode's own thread."""

    function: Callable[[Any, ProgramTask], Any]

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise TypeError(f"a synchronous program must be callable, got {type(self.function).__name__}")


@dataclass(frozen=True)
class AgentProgram:
    """An agent program and its per-episode budgets (see the module docstring).

    - `agent`: the program: an async function, or a `ProgramCommand` (made by `AgentProgram.command`).
    - `timeout_s`: the most wall-clock seconds one episode may take (None: no bound).
    - `max_episode_tokens`: the most tokens the model may generate over all of an episode's requests (None: only
      the per-turn and context limits apply). A request past it fails (HTTP 500, ``engine_error``) and the
      episode is recorded as ``token_budget_exhausted`` if the program then fails.
    - `model_name`: the model id the endpoint serves (`ProgramTask.model`).
    - `max_requests`: the most model calls (chat completions) one episode may make (None: no cap). The one past it
      is refused (HTTP 429, ``too_many_requests``) and ends the episode as ``too_many_requests``; the turns before
      are kept.
    - `max_conversations`: the most conversations one episode may open, counting each new conversation and each
      rewritten history (each becomes a training record; None: no cap). A request that opens one past it ends the
      episode as ``too_many_conversations``; its turn is dropped, the first `max_conversations` are kept.
    - `max_concurrent`: the most episodes of this program that run at once in one process (each holds a thread
      while it runs); more wait for a place, and their `timeout_s` counts from when they start.
    """

    agent: AgentFunction | ProgramCommand | ProgramSync
    timeout_s: float | None = 600.0
    max_episode_tokens: int | None = None
    model_name: str = "policy"
    max_requests: int | None = DEFAULT_MAX_REQUESTS
    max_conversations: int | None = DEFAULT_MAX_CONVERSATIONS
    max_concurrent: int = DEFAULT_MAX_CONCURRENT

    @classmethod
    def sync(cls, function: Callable[[Any, ProgramTask], Any], **budgets: Any) -> AgentProgram:
        """A program that is a synchronous function taking an `openai.OpenAI` (see `ProgramSync`); `budgets` are the
        other fields (`timeout_s`, `max_episode_tokens`, ...)."""
        return cls(ProgramSync(function), **budgets)

    @classmethod
    def command(
        cls,
        argv: Sequence[str],
        *,
        timeout_s: float | None = 600.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        kill_grace_s: float = 2.0,
        **budgets: Any,
    ) -> AgentProgram:
        """A program that is a command line, started per episode (see the module docstring and `ProgramCommand`);
        `budgets` are the other fields (`max_episode_tokens`, `max_requests`, ...)."""
        command = ProgramCommand(
            tuple(argv), env=None if env is None else dict(env), cwd=cwd, max_output_bytes=max_output_bytes,
            kill_grace_s=kill_grace_s,
        )  # fmt: skip
        return cls(command, timeout_s=timeout_s, **budgets)

    def __post_init__(self) -> None:
        if not callable(self.agent) and not isinstance(self.agent, (ProgramCommand, ProgramSync)):
            raise TypeError(
                "AgentProgram.agent must be an async function, a ProgramSync or a ProgramCommand, got "
                f"{type(self.agent).__name__}"
            )
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive (or None), got {self.timeout_s}")
        for name in ("max_episode_tokens", "max_requests", "max_conversations"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None), got {value}")
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {self.max_concurrent}")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
