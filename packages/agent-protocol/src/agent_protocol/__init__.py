"""agent-protocol: exact chat rendering, tolerant tool-call parsing and token-in-token-out transcripts.

The bottom layer of OpenRLHF-Agent. Depends on msgspec and tokenizers only; never imports torch,
transformers or an HTTP stack.
"""

from importlib.metadata import version as _version

from agent_protocol.chat_protocol import ChatProtocol
from agent_protocol.errors import (
    MessageError,
    ProtocolDetectionError,
    ProtocolError,
    TokenizerLoadError,
    UnknownProtocolError,
)
from agent_protocol.protocol_detection import detect_protocol, protocol_for_template, read_chat_template
from agent_protocol.protocols.qwen3 import Qwen3Protocol, ThinkingMode
from agent_protocol.registry import get_protocol, list_protocols, protocol_options, register_protocol
from agent_protocol.tokenizer import GIL_FREE_MIN_CHARS, HFTokenizer, Tokenizer, TransformersTokenizer, load_tokenizer
from agent_protocol.transcript import Span, TokenTranscript, TranscriptRecord
from agent_protocol.types import (
    Action,
    Message,
    MessageLike,
    ParseIssue,
    ToolCall,
    ToolSpec,
    ToolSpecLike,
    coerce_messages,
    coerce_tools,
)

__all__ = [
    "GIL_FREE_MIN_CHARS",
    "Action",
    "ChatProtocol",
    "HFTokenizer",
    "Message",
    "MessageError",
    "MessageLike",
    "ParseIssue",
    "ProtocolDetectionError",
    "ProtocolError",
    "Qwen3Protocol",
    "Span",
    "ThinkingMode",
    "TokenTranscript",
    "Tokenizer",
    "TokenizerLoadError",
    "ToolCall",
    "ToolSpec",
    "ToolSpecLike",
    "TranscriptRecord",
    "TransformersTokenizer",
    "UnknownProtocolError",
    "__version__",
    "coerce_messages",
    "coerce_tools",
    "detect_protocol",
    "get_protocol",
    "list_protocols",
    "load_tokenizer",
    "protocol_for_template",
    "protocol_options",
    "read_chat_template",
    "register_protocol",
]

__version__ = _version("agent-protocol")
