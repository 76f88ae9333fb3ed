"""Exceptions raised by agent-protocol.

Only *caller* mistakes raise: a conversation that cannot be rendered, an unknown protocol name, a tokenizer
file that cannot be loaded. Malformed *model output* never raises; it becomes a `ParseIssue` on the parsed
`Action` (see `types.py`).
"""

from __future__ import annotations

__all__ = [
    "JsonLimitError",
    "MessageError",
    "ProtocolDetectionError",
    "ProtocolError",
    "TemplateGapWarning",
    "TokenizerLoadError",
    "UnknownProtocolError",
]


class ProtocolError(Exception):
    """Base class of every error agent-protocol raises."""


class MessageError(ProtocolError, ValueError):
    """A message, tool call or tool spec given by the caller is malformed.

    `location` names the offending element the way a user would write it, e.g.
    ``messages[2].tool_calls[0].function.arguments``.
    """

    def __init__(self, location: str, problem: str) -> None:
        self.location = location
        self.problem = problem
        super().__init__(f"{location}: {problem}")


class JsonLimitError(ProtocolError, ValueError):
    """JSON text or a decoded value is beyond what is accepted: nested too deeply, a number too long to read,
    or a string that is not valid Unicode text. The message says which, written to be shown as it is."""


class UnknownProtocolError(ProtocolError, ValueError):
    """`get_protocol` was asked for a name that is not registered."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown chat protocol {name!r}; known protocols: {', '.join(known)}")


class ProtocolDetectionError(ProtocolError, ValueError):
    """`detect_protocol` cannot tell which registered protocol fits a model directory. The message names the
    directory, what it holds (model_type, chat template) and the registered protocols (`known`)."""

    def __init__(self, model_dir: str, reason: str, *, known: list[str] | None = None) -> None:
        self.model_dir = model_dir
        self.reason = reason
        self.known = known or []
        super().__init__(f"cannot choose a chat protocol for {model_dir}: {reason}")


class TokenizerLoadError(ProtocolError):
    """A tokenizer file is missing or cannot be parsed. The message names the path."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot load tokenizer from {path}: {reason}")


class TemplateGapWarning(UserWarning):
    """A family's official chat template leaves out part of what it was given (deepseek-v3.1 and llama4 without a
    system message show no tools; kimi-k2's first template renders no earlier tool calls). The render is still the
    official one, byte for byte, but the model never sees that part: the message names a variant or a fix. Each
    family warns once per protocol object; `warnings.filterwarnings("ignore", category=TemplateGapWarning)`
    silences all of them."""
