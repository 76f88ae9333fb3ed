"""What a tool is: `ToolBase`, and `tool`, which builds one from a typed function or a msgspec Struct.

A tool has a name, a description and a JSON schema for its parameters (shown to the model through `spec`),
checks a model's arguments before it runs (`parse_arguments`, raising `ArgumentError` naming the field), and
runs with `async call(arguments, context)`. Its result may be any value: the tool runner turns a non-string
into JSON text.

    @tool
    def add(a: int, b: int = 0) -> int:
        '''Add two integers.

        Args:
            a: The first addend.
            b: The second addend.
        '''
        return a + b

The schema comes from the types (msgspec's JSON schema), never from hand-written JSON; descriptions come
from the docstring's first paragraph and its ``Args:`` section, or from ``Annotated[int, msgspec.Meta(...)]``.
A function whose only parameter is a Struct takes that Struct as its schema. A parameter annotated
`ToolContext` receives the call's context and is not shown to the model. A sync function runs on its own
thread so it cannot block the event loop (see `_threads.py`).

Where a tool's coroutine runs (`event_loop`): ``"isolated"`` (the default for async tools) runs each call on
a fresh event loop in its own thread, so a coroutine that blocks (``time.sleep``, a CPU loop, a blocking
client) blocks only itself and its timeout still fires on time; ``"shared"`` runs it on the caller's loop,
which a tool bound to that loop needs (an MCP session, a client or lock created on the main loop). A shared
tool must await and never block: nothing can interrupt it, and every episode on the loop waits for it.
``"inline"`` is for small, bounded computations that never await (the calculator): the call runs in place, in
the caller's step, with no task, timer or thread (a sync function is called directly); see `tool_runner.py`.
`max_hung_calls` caps how many of a tool's calls may still be running after their timeout before new calls
are refused (see `tool_runner.py`).

Tools are shared by concurrent episodes: a tool object must not keep per-episode state on itself; it puts
what one episode needs in `context.state`, which belongs to that episode, and reads the episode's task (the
dataset row `Environment.reset(task)` got, e.g. its ``images``) from `context.task`.

This module knows nothing about timeouts, truncation or observations (that is `tool_runner.py`).
"""

from __future__ import annotations

import inspect
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypedDict, Unpack, get_type_hints, overload

import msgspec

from agent_env._threads import run_in_daemon_thread
from agent_env.errors import ToolDefinitionError
from agent_env.schema import check_arguments, convert_arguments, struct_schema
from agent_protocol import ToolSpec

__all__ = [
    "DEFAULT_MAX_HUNG_CALLS",
    "EVENT_LOOP_MODES",
    "EventLoopMode",
    "FunctionTool",
    "ToolBase",
    "ToolContext",
    "ToolOptions",
    "tool",
]

_TOOL_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_EMPTY_SCHEMA: Final[dict[str, Any]] = {"type": "object", "properties": {}}

EventLoopMode = Literal["isolated", "shared", "inline"]
EVENT_LOOP_MODES: Final[tuple[EventLoopMode, ...]] = ("isolated", "shared", "inline")
"""Where a tool's coroutine runs: on its own loop and thread per call, or on the caller's loop."""

DEFAULT_MAX_HUNG_CALLS: Final = 16


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool call knows about where it runs. `state` is the episode's own scratch space: tools share
    nothing between episodes except through it. `task` is the episode's task row as `Environment.reset` got it
    (read it, never write it: a tool that needs a task's images or data finds them there)."""

    episode_id: str = ""
    step: int = 0
    call_id: str = ""
    state: dict[str, Any] = field(default_factory=dict)
    task: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls, episode_id: str, step: int, call_id: str, state: dict[str, Any], task: Mapping[str, Any]
    ) -> ToolContext:
        """The same as the constructor, at a third of its cost (a frozen dataclass sets each field through
        `object.__setattr__`): the runtime makes one or two per tool call."""
        context = object.__new__(cls)
        fields = context.__dict__
        fields["episode_id"], fields["step"], fields["call_id"] = episode_id, step, call_id
        fields["state"], fields["task"] = state, task
        return context


class ToolBase(ABC):
    """A tool an environment can run. Subclass it for full control, or use `@tool` on a function.

    Class or instance attributes: `name`, `description`, `parameters` (a JSON schema object),
    `timeout_s` (None: the environment's default, 30 s), `max_output_chars` (None: the environment's),
    `event_loop` (``"isolated"``: each call on its own loop and thread; ``"shared"``: on the caller's loop,
    for a tool bound to it; ``"inline"``: in place, for bounded work that never awaits; see the module
    docstring) and `max_hung_calls` (calls still running after their
    timeout before new calls are refused with ``tool_unavailable``; None: only the process-wide cap).

    A tool whose arguments are a msgspec Struct names it as `arguments_type`: the class then gets the Struct's
    schema as `parameters` (unless it sets its own) and `parse_arguments` returns an instance of it (`strict`:
    types exactly as the schema states them).
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = _EMPTY_SCHEMA
    timeout_s: float | None = None
    max_output_chars: int | None = None
    event_loop: EventLoopMode = "isolated"
    max_hung_calls: int | None = DEFAULT_MAX_HUNG_CALLS
    arguments_type: type[msgspec.Struct] | None = None
    strict: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        arguments_type = cls.__dict__.get("arguments_type")
        if arguments_type is not None and "parameters" not in cls.__dict__:
            cls.parameters = struct_schema(arguments_type)

    @property
    def spec(self) -> ToolSpec:
        """The OpenAI function schema the prompt shows for this tool."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def parse_arguments(self, arguments: dict[str, Any]) -> Any:
        """Check a model's arguments before the call; return what `call` receives.

        Raises `ArgumentError` naming the field. The default converts to `arguments_type` where the tool has
        one; otherwise it checks `parameters` (see `schema.py`) and passes the dict on unchanged."""
        if self.arguments_type is not None:
            return convert_arguments(arguments, self.arguments_type, strict=self.strict)
        check_arguments(arguments, self.parameters)
        return arguments

    @abstractmethod
    async def call(self, arguments: Any, context: ToolContext) -> object:
        """Run the tool. Raise `ToolError` for a failure the model should read; anything else raised is
        reported as well (type and message). The result may be any value."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionTool(ToolBase):
    """A tool made from a typed Python function (sync or async). See the module docstring."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
        max_output_chars: int | None = None,
        strict: bool = True,
        event_loop: EventLoopMode | None = None,
        max_hung_calls: int | None = DEFAULT_MAX_HUNG_CALLS,
    ) -> None:
        self.fn = fn
        self.name = name or str(getattr(fn, "__name__", ""))
        if not _TOOL_NAME.match(self.name):
            raise ToolDefinitionError(f"tool name {self.name!r} must match {_TOOL_NAME.pattern}")
        summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
        self.description = description if description is not None else summary
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.strict = strict
        self._is_async = inspect.iscoroutinefunction(fn)
        if event_loop not in (None, *EVENT_LOOP_MODES):
            raise ToolDefinitionError(f"tool {self.name!r}: event_loop must be one of {', '.join(EVENT_LOOP_MODES)}")
        if max_hung_calls is not None and max_hung_calls < 1:
            raise ToolDefinitionError(f"tool {self.name!r}: max_hung_calls must be at least 1 (or None)")
        # A sync function's coroutine only awaits its thread: it cannot block a loop, so it needs none of its own.
        self.event_loop = event_loop if event_loop is not None else ("isolated" if self._is_async else "shared")
        self.max_hung_calls = max_hung_calls
        self._context_param: str | None = None
        self._struct_param: str | None = None
        self.arguments_type = self._arguments_type(fn)
        self.parameters = struct_schema(self.arguments_type, description_by_field=arg_docs)

    def _arguments_type(self, fn: Callable[..., Any]) -> type[msgspec.Struct]:
        where = f"tool {self.name!r}"
        try:
            hints = get_type_hints(fn, include_extras=True)
            signature = inspect.signature(fn)
        except (NameError, TypeError, ValueError) as e:
            raise ToolDefinitionError(f"{where}: cannot read the signature: {e}") from e
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        for param in signature.parameters.values():
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise ToolDefinitionError(f"{where}: *args and **kwargs cannot be described to a model")
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise ToolDefinitionError(f"{where}: parameter {param.name!r} is positional-only")
            if param.name not in hints:
                raise ToolDefinitionError(f"{where}: parameter {param.name!r} needs a type annotation")
            annotation = hints[param.name]
            if annotation is ToolContext or annotation == ToolContext | None:
                self._context_param = param.name
                continue
            if param.default is inspect.Parameter.empty:
                fields.append((param.name, annotation))
            else:
                fields.append((param.name, annotation, param.default))
        if len(fields) == 1 and isinstance(fields[0][1], type) and issubclass(fields[0][1], msgspec.Struct):
            self._struct_param = fields[0][0]
            struct_type: type[msgspec.Struct] = fields[0][1]
            return struct_type
        try:
            return msgspec.defstruct(f"{self.name}_arguments", fields, kw_only=True, forbid_unknown_fields=True)
        except TypeError as e:
            raise ToolDefinitionError(f"{where}: {e}") from e

    async def call(self, arguments: Any, context: ToolContext) -> object:
        kwargs: dict[str, Any]
        if self._struct_param is not None:
            kwargs = {self._struct_param: arguments}
        else:
            kwargs = {name: getattr(arguments, name) for name in arguments.__struct_fields__}
        if self._context_param is not None:
            kwargs[self._context_param] = context
        if self._is_async:
            result: object = await self.fn(**kwargs)
            return result
        if self.event_loop == "inline":  # bounded work, called in place: no thread
            return self.fn(**kwargs)
        return await run_in_daemon_thread(lambda: self.fn(**kwargs), name=f"tool-{self.name}")


class ToolOptions(TypedDict, total=False):
    """The keyword options `tool` passes on to `FunctionTool` (defaults and meaning: there)."""

    name: str | None
    description: str | None
    timeout_s: float | None
    max_output_chars: int | None
    strict: bool
    event_loop: EventLoopMode | None
    max_hung_calls: int | None


@overload
def tool(fn: Callable[..., Any], /, **options: Unpack[ToolOptions]) -> FunctionTool: ...


@overload
def tool(**options: Unpack[ToolOptions]) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, **options: Unpack[ToolOptions]
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Build a `FunctionTool` from a typed function: ``@tool`` or ``@tool(name=..., timeout_s=...)``.

    The options (`ToolOptions`) are `FunctionTool`'s: `name`, `description`, `timeout_s`, `max_output_chars`,
    `strict` (default True) validates types exactly as the schema states them (``"3"`` is not an integer),
    `event_loop` (default: ``"isolated"`` for an async function) and `max_hung_calls` (default 16): see
    `ToolBase`.
    """

    def build(function: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(function, **options)

    return build(fn) if fn is not None else build


_SECTION: Final = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE: Final = re.compile(r"^\s*(?P<name>\w+)\s*(\([^)]*\))?\s*:\s*(?P<text>.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Google-style docstring -> (text before the first section, {argument: description})."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    base_indent: int | None = None
    for line in doc.splitlines():
        header = _SECTION.match(line)
        if header:
            section, current, base_indent = header.group(1), None, None
            continue
        if section is None:
            summary.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line)
        if match and (base_indent is None or indent <= base_indent):
            base_indent = indent
            current = match.group("name")
            args[current] = match.group("text").strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args
