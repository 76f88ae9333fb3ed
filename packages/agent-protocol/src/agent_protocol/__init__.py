"""agent-protocol: exact chat rendering, tolerant tool-call parsing and token-in-token-out transcripts.

The bottom layer of OpenRLHF-Agent. Depends on msgspec and tokenizers only; never imports torch,
transformers or an HTTP stack.
"""

from importlib.metadata import version as _version

from agent_protocol.chat_protocol import ChatProtocol
from agent_protocol.chatml import ChatMLProtocol
from agent_protocol.control_tokens import ControlTokens
from agent_protocol.errors import (
    MessageError,
    ProtocolDetectionError,
    ProtocolError,
    TemplateGapWarning,
    TokenizerLoadError,
    UnknownProtocolError,
)
from agent_protocol.families import Family, Member, ReadmeRow, family_table, register_family, unregister_family
from agent_protocol.image_format import ImageHeader, read_header
from agent_protocol.images import (
    ImageSpan,
    SeesImages,
    VisionGrid,
    check_image_url,
    collapse_image_pads,
    data_url_payload,
    decode_base64,
    expand_image_pads,
    image_grid,
    image_size,
    image_spans,
    read_image,
)
from agent_protocol.protocol_detection import detect_protocol, protocol_for_template, read_chat_template
from agent_protocol.protocols.qwen3 import Qwen3Protocol, ThinkingMode
from agent_protocol.registry import get_protocol, list_protocols, protocol_options, register_protocol
from agent_protocol.tokenizer import (
    GIL_FREE_MIN_CHARS,
    HFTokenizer,
    Tokenizer,
    TransformersTokenizer,
    load_tokenizer,
    processor_vision_grid,
)
from agent_protocol.transcript import Span, TokenTranscript, TranscriptRecord, version_runs
from agent_protocol.types import (
    Action,
    ImagePart,
    IssueCode,
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
    "ChatMLProtocol",
    "ChatProtocol",
    "ControlTokens",
    "Family",
    "HFTokenizer",
    "ImageHeader",
    "ImagePart",
    "ImageSpan",
    "IssueCode",
    "Member",
    "Message",
    "MessageError",
    "MessageLike",
    "ParseIssue",
    "ProtocolDetectionError",
    "ProtocolError",
    "Qwen3Protocol",
    "ReadmeRow",
    "SeesImages",
    "Span",
    "TemplateGapWarning",
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
    "VisionGrid",
    "__version__",
    "check_image_url",
    "coerce_messages",
    "coerce_tools",
    "collapse_image_pads",
    "data_url_payload",
    "decode_base64",
    "detect_protocol",
    "expand_image_pads",
    "family_table",
    "get_protocol",
    "image_grid",
    "image_size",
    "image_spans",
    "list_protocols",
    "load_tokenizer",
    "processor_vision_grid",
    "protocol_for_template",
    "protocol_options",
    "read_chat_template",
    "read_header",
    "read_image",
    "register_family",
    "register_protocol",
    "unregister_family",
    "version_runs",
]

__version__ = _version("agent-protocol")
