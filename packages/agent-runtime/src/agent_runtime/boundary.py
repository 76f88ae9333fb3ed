"""`boundary`: the one boundary of agent-runtime, where whatever a named stage raises becomes a coded error.

    with boundary("environment") as caught:
        result = await environment.step(action)
    if caught.exception is not None:
        ...caught.code, caught.message           # "environment_error", "RuntimeError: boom"

What is contained, and what propagates, is agent-env's rule (`agent_env.containment.propagates`): every
`BaseException` is contained except `KeyboardInterrupt`, the cancellation of the current task from outside and a
`GeneratorExit` thrown in at the catching generator's own yield. `boundary` is a class, not a generator-based
context manager, so that a ``with`` around a ``yield`` sees a consumer's ``aclose()`` as thrown in at its own frame.

The code: an error that carries its own (`StageError`, raised by an inner boundary with ``reraise=True``, and
`EngineError`) keeps it; anything else gets its stage's (`stage_code`: ``environment`` -> ``environment_error``,
``idle`` -> ``internal_error``). A `StageError` is read through: the message is its cause's, so a record names
what really raised. `passes` lists exception types that are not failures here (the caller's input errors).

This module knows codes and `agent_env.containment`; what a caught error does next (end an episode, fail a
request, become an `EngineFailure`) is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Final, Literal

from agent_env import describe_error, propagates
from agent_runtime.errors import EngineError, EngineErrorCode, RuntimeAgentError
from agent_runtime.outcomes import StageCode

__all__ = ["PREVIEW", "Stage", "StageError", "boundary", "coded", "stage_code"]

PREVIEW: Final = 500
"""How much of a contained error's message a record keeps (`describe_error`'s cut)."""

Stage = Literal["idle", "decode", "parse", "environment", "reward", "render", "engine"]
"""The foreign code running: the tokenizer's decode, the protocol's parser, the environment, a reward, the
protocol's renderer (or the tokenizer's encode), the engine; ``idle`` outside every stage."""

_STAGE_CODES: Final[dict[str, StageCode | EngineErrorCode]] = {
    "decode": "decode_error",  # the tokenizer could not decode the generated ids
    "parse": "parse_error",  # the protocol's parser raised (it should not: see ChatProtocol.parse_assistant_text)
    "environment": "environment_error",  # the environment's reset or step raised
    "reward": "reward_error",  # a reward raised
    "render": "render_error",  # the prompt or feedback could not be rendered or tokenized
    "engine": "engine_error",  # the engine raised something that is not an EngineError
}


def stage_code(stage: Stage) -> StageCode | EngineErrorCode:
    """The error code of an exception raised while `stage` ran (``internal_error`` outside every stage)."""
    return _STAGE_CODES.get(stage, "internal_error")


class StageError(RuntimeAgentError):
    """A stage's foreign code raised (`boundary(..., reraise=True)`): its code and message, the original chained
    (``__cause__``). An outer `boundary` records it with this code and the original's message."""

    def __init__(self, code: StageCode | EngineErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class boundary:  # lower case: used as a function, `with boundary("parse") as caught:`
    """The boundary (see the module docstring). `stage`: a `Stage`, or a function that says the stage running
    when the error arrives. `limit`: the message's cut (None: whole). `reraise`: raise the coded error on as a
    `StageError` (for an inner boundary whose caller's boundary records it) instead of holding it in
    `exception`, `code` and `message`; such a boundary keeps no state, so one instance serves every call (the
    conversation's, made once: entering a boundary costs what a ``with`` costs, not an allocation). A holding
    boundary can be entered again too: entering clears what it held."""

    #: what was contained (a `StageError`'s cause, read through), None while nothing was
    exception: BaseException | None = None
    code: StageCode | EngineErrorCode = "internal_error"
    message: str = ""
    passes: tuple[type[BaseException], ...] = ()
    limit: int | None = PREVIEW
    reraise: bool = False

    def __init__(
        self,
        stage: Stage | Callable[[], Stage] = "idle",
        *,
        passes: tuple[type[BaseException], ...] = (),
        limit: int | None = PREVIEW,
        reraise: bool = False,
    ) -> None:
        self.stage = stage
        if passes:  # the defaults stay the class's: a boundary per step costs one attribute
            self.passes = passes
        if limit != PREVIEW:
            self.limit = limit
        if reraise:
            self.reraise = reraise

    def __enter__(self) -> boundary:
        if self.exception is not None:  # one boundary entered again (a session's, at each step) starts clean
            self.exception = None
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> bool:
        if error is None or isinstance(error, self.passes) or propagates(error):
            return False
        if self.reraise:
            if isinstance(error, StageError):  # an inner stage's: it goes on as it is
                return False
            code, raised, message = coded(error, self.stage, limit=self.limit)
            raise StageError(code, message) from raised
        self.code, self.exception, self.message = coded(error, self.stage, limit=self.limit)
        return True


def coded(
    error: BaseException, stage: Stage | Callable[[], Stage] = "idle", *, limit: int | None = PREVIEW
) -> tuple[StageCode | EngineErrorCode, BaseException, str]:
    """`error`'s code, the exception that really raised, and its message (never raises; see `boundary`)."""
    if isinstance(error, StageError):
        cause = error.__cause__ if error.__cause__ is not None else error
        message = error.message if limit is None or len(error.message) <= limit else error.message[:limit] + "..."
        return error.code, cause, message
    message = describe_error(error, limit=limit)
    if isinstance(error, EngineError):
        return error.code, error, message
    return stage_code(stage() if callable(stage) else stage), error, message
