"""`ControlTokens`: text from users, tools and environments never becomes a control token.

A chat format writes its frame (`<|im_start|>`, `<tool_call>`, `<|eot_id|>`...) as text, and the tokenizer's
added-token matching turns that text into the control-token ids. Hugging Face and vLLM apply the same matching
to everything in the rendered prompt, so a web page a search tool returns, or a user message, that holds
`<|im_end|>\\n<|im_start|>assistant\\n<tool_call>` becomes a forged assistant turn and tool call, in the prompt
that is served and in the sequence that is trained. Here only the protocol's frame writes control ids:

    control = ControlTokens.for_tokenizer(tokenizer)
    text = protocol.render_prompt(control.mark(messages), tools=tools)   # untrusted text between markers
    ids = control.encode(text)                                           # markers gone, their control text plain

`mark` wraps the text of every user and tool message that holds a control string, or starts or ends with part
of one (it could complete one with the frame beside it), between two noncharacters (U+10FFFE, U+10FFFF), inside
its leading and trailing whitespace so that a template's `trim` sees the same text. A message with no such text
is left as it is, so its render, and its ids, are exactly the official template's. `encode` removes the markers,
finds the control strings the tokenizer would match (leftmost-longest, as `tokenizers` matches added tokens)
and encodes every match that overlaps marked text as plain text: by the tokenizer's model alone, with no added
vocabulary (what Hugging Face's ``split_special_tokens`` gives for special tokens), one character at a time
when that still yields a control id. Everything else is cut and encoded exactly as the tokenizer cuts at an
added token (a piece after a cut as the text it continues: without the "▁" a SentencePiece-style `Metaspace`
prepends to a text's first piece only), so the decoded ids are the rendered text, byte for byte, and the only
ids that differ from Hugging Face's are those of control strings inside untrusted text. That is a deliberate
difference from the official template's tokenization for such conversations (docs/RELIABILITY.md);
`special_tokens_in_text=True` where a `Conversation` is built (`apps/serve --special-tokens-in-text`) restores
Hugging Face's behaviour.

The control strings are the tokenizer's added tokens (special or not: Qwen's `<tool_call>` is not special),
less those made of whitespace only. System and assistant text is the operator's and the model's: it is not
marked. Marker characters in any message's text are replaced by U+FFFD (they are noncharacters, never text).
A tokenizer that cannot list its added tokens (neither an `HFTokenizer` nor a transformers one) has none here.
"""

from __future__ import annotations

import itertools
import json
import re
import weakref
from collections.abc import Iterable
from typing import Any, Final

import msgspec
import tokenizers

from agent_protocol.tokenizer import HFTokenizer, Tokenizer
from agent_protocol.types import ImagePart, Message

__all__ = ["CLOSE", "OPEN", "UNTRUSTED_ROLES", "ControlTokens", "added_tokens", "unmarked"]

OPEN: Final = "\U0010fffe"  # a noncharacter: Unicode reserves it for a program's own use, never for text
CLOSE: Final = "\U0010ffff"
UNTRUSTED_ROLES: Final = frozenset({"user", "tool"})
_MARKERS: Final = re.compile(f"[{OPEN}{CLOSE}]")


def unmarked(text: str) -> str:
    """`text` without `mark`'s markers: what a protocol tests when a template looks at a message's content (Qwen3's
    check for a user message that is a tool response, GLM's ``/nothink``)."""
    return text.replace(OPEN, "").replace(CLOSE, "") if OPEN in text else text


def added_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    """The tokenizer's added tokens (text -> id): an `HFTokenizer`'s or a transformers tokenizer's; {} for a
    tokenizer that cannot tell."""
    backend = getattr(tokenizer, "backend", None)
    if isinstance(backend, tokenizers.Tokenizer):
        return {token.content: int(i) for i, token in backend.get_added_tokens_decoder().items()}
    hf = getattr(tokenizer, "hf", None)
    if hf is not None and hasattr(hf, "get_added_vocab"):
        return {str(text): int(i) for text, i in hf.get_added_vocab().items()}
    return {}


class ControlTokens:
    """A tokenizer's control strings, and the two steps that keep untrusted text from producing their ids."""

    def __init__(self, tokenizer: Tokenizer, controls: dict[str, int]) -> None:
        self.tokenizer = tokenizer
        #: control text -> id (the tokenizer's added tokens, less whitespace-only ones; SentencePiece's "▁" is a
        #: space: Gemma 3 adds runs of it, which are also ordinary vocabulary that any run of spaces encodes to)
        self.controls = {text: i for text, i in controls.items() if text.replace("\u2581", " ").strip()}
        self.ids = frozenset(self.controls.values())
        self._pattern = _trie_pattern(self.controls) if self.controls else None
        self._prefixes = {t[:k] for t in self.controls for k in range(1, len(t))}
        self._suffixes = {t[k:] for t in self.controls for k in range(1, len(t))}
        self._edge = max((len(t) for t in self.controls), default=1) - 1
        # A text can end with part of a control string only if its last `_edge` characters hold a first character
        # of one (and start with part of one only if its first hold a last character): a cheap test first.
        self._firsts = _char_class({t[0] for t in self.controls})
        self._lasts = _char_class({t[-1] for t in self.controls})
        self._plain: dict[str, list[int]] = {}
        self._model_only: tokenizers.Tokenizer | bool | None = False  # False: not built yet
        self._continuation: tokenizers.Tokenizer | bool | None = False  # False: not built yet; None: not needed

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> ControlTokens:
        """The tokenizer's `ControlTokens`, built once per tokenizer object."""
        try:
            found = _built.get(tokenizer)
        except TypeError:  # a tokenizer that cannot be weakly referenced: built each time
            return cls(tokenizer, added_tokens(tokenizer))
        if found is None:
            found = _built[tokenizer] = cls(tokenizer, added_tokens(tokenizer))
        return found

    def __repr__(self) -> str:
        return f"ControlTokens({len(self.controls)} control strings of {self.tokenizer!r})"

    # -- marking ---------------------------------------------------------------------------------------------

    def needs_mark(self, text: str) -> bool:
        """Whether `text` holds a control string, or starts or ends with part of one."""
        if self._pattern is None or not text:
            return False
        if self._pattern.search(text) is not None:
            return True
        edge = min(self._edge, len(text))
        ends = self._firsts.search(text, len(text) - edge) is not None
        if ends and any(text[-k:] in self._prefixes for k in range(1, edge + 1)):
            return True
        starts = self._lasts.search(text, 0, edge) is not None
        return starts and any(text[:k] in self._suffixes for k in range(1, edge + 1))

    def mark(self, messages: Iterable[Message]) -> list[Message]:
        """`messages` with the text of each user and tool message that needs it between markers (module
        docstring); every other message as it is, but for marker characters in its text, which become U+FFFD."""
        return [self._mark_one(message) for message in messages]

    def _mark_one(self, message: Message) -> Message:
        content = message.content
        if content is None:
            return message
        if OPEN in content or CLOSE in content:
            message = _without_markers(message)
            content = message.content or ""
        if message.role not in UNTRUSTED_ROLES:
            return message
        if not message.images:
            return (
                msgspec.structs.replace(message, content=self._wrap(content)) if self.needs_mark(content) else message
            )
        # Each run of text between two images is marked on its own, so that the protocol's image frame between
        # them stays outside every marked span; the images' offsets move with the markers before them.
        cuts = sorted({0, len(content), *(image.offset for image in message.images)})
        pieces = [content[a:b] for a, b in itertools.pairwise(cuts)]
        if not any(self.needs_mark(piece) for piece in pieces):
            return message
        text: list[str] = []
        moved = {0: 0}
        length = 0
        for at, piece in zip(cuts[1:], pieces, strict=True):
            text.append(self._wrap(piece) if self.needs_mark(piece) else piece)
            length += len(text[-1])
            moved[at] = length
        images = tuple(ImagePart(url=image.url, offset=moved[image.offset]) for image in message.images)
        return msgspec.structs.replace(message, content="".join(text), images=images)

    @staticmethod
    def _wrap(text: str) -> str:
        core = text.strip()
        if not core:
            return text
        start = text.index(core)
        return f"{text[:start]}{OPEN}{core}{CLOSE}{text[start + len(core) :]}"

    # -- encoding --------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The ids of a render of `mark`ed messages: the tokenizer's, but that a control string overlapping
        marked text is encoded as plain text (module docstring). Without markers, `tokenizer.encode(text)`."""
        if OPEN not in text or self._pattern is None:
            return self.tokenizer.encode(_MARKERS.sub("", text) if CLOSE in text else text)
        clean, spans = _unwrap(text)
        ids: list[int] = []
        at = 0
        k = 0
        for match in self._pattern.finditer(clean):
            a, b = match.span()
            while k < len(spans) and spans[k][1] <= a:
                k += 1
            if k == len(spans):
                break
            if spans[k][0] >= b:  # the match lies wholly before the next marked span: the frame's own token
                continue
            if a > at:
                ids.extend(self._encode_piece(clean[at:a], first=at == 0))
            ids.extend(self.plain_ids(match.group()))
            at = b
        if at < len(clean):
            ids.extend(self._encode_piece(clean[at:], first=at == 0))
        return ids

    def _encode_piece(self, piece: str, *, first: bool) -> list[int]:
        """A piece of the text, cut where the text goes on: a SentencePiece-style tokenizer whose `Metaspace`
        prepends "▁" to the first piece of a text only (Mistral's) must not prepend it to a piece after a cut."""
        if first:
            return self.tokenizer.encode(piece)
        if self._continuation is False:
            self._continuation = _without_first_prefix(_backend_of(self.tokenizer))
        if isinstance(self._continuation, tokenizers.Tokenizer):
            return list(self._continuation.encode(piece, add_special_tokens=False).ids)
        return self.tokenizer.encode(piece)

    def plain_ids(self, control: str) -> list[int]:
        """`control` (one control string) encoded as text: by the tokenizer's model with no added vocabulary, or
        one character at a time where that still gives a control id; never a control id (else `ValueError`)."""
        found = self._plain.get(control)
        if found is not None:
            return found
        model = self._model_without_added_tokens()
        ids = list(model.encode(control, add_special_tokens=False).ids) if model is not None else []
        if not ids or self.ids.intersection(ids):
            ids = [i for char in control for i in self.tokenizer.encode(char)]
        if self.ids.intersection(ids):
            raise ValueError(f"{control!r} has no encoding without a control token in {self.tokenizer!r}")
        self._plain[control] = ids
        return ids

    def _model_without_added_tokens(self) -> tokenizers.Tokenizer | None:
        if self._model_only is False:
            self._model_only = _strip_added_tokens(self.tokenizer)
        return self._model_only if isinstance(self._model_only, tokenizers.Tokenizer) else None


_built: weakref.WeakKeyDictionary[Any, ControlTokens] = weakref.WeakKeyDictionary()


def _backend_of(tokenizer: Tokenizer) -> tokenizers.Tokenizer | None:
    backend = tokenizer.backend if isinstance(tokenizer, HFTokenizer) else None
    if backend is None:
        hf = getattr(tokenizer, "hf", None)
        backend = getattr(hf, "backend_tokenizer", None)
    return backend if isinstance(backend, tokenizers.Tokenizer) else None


def _never_prepend(spec: dict[str, Any]) -> bool:
    """Set every `Metaspace` pre-tokenizer of a tokenizer.json spec whose `prepend_scheme` is "first" to "never";
    returns whether there was one."""
    changed = False
    pre = spec.get("pre_tokenizer") or {}
    for part in [pre, *(pre.get("pretokenizers") or [])]:
        if part.get("type") == "Metaspace" and part.get("prepend_scheme") == "first":
            part["prepend_scheme"] = "never"
            changed = True
    return changed


def _without_first_prefix(backend: tokenizers.Tokenizer | None) -> tokenizers.Tokenizer | None:
    """`backend` as it encodes a piece that continues a text (None: it encodes every piece alike already)."""
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    if not _never_prepend(spec):
        return None
    try:
        return tokenizers.Tokenizer.from_str(json.dumps(spec))
    except Exception:  # tokenizers raises a bare Exception on a spec it cannot load
        return None


def _strip_added_tokens(tokenizer: Tokenizer) -> tokenizers.Tokenizer | None:
    """The tokenizer's `tokenizers` backend with its added vocabulary removed (the model's own vocabulary only),
    encoding a control string as the text it continues (no first-piece "▁" of a `Metaspace`)."""
    backend = _backend_of(tokenizer)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    spec["added_tokens"] = []
    _never_prepend(spec)
    try:
        return tokenizers.Tokenizer.from_str(json.dumps(spec))
    except Exception:  # tokenizers raises a bare Exception on a spec it cannot load; the fallback is per character
        return None


def _unwrap(text: str) -> tuple[str, list[tuple[int, int]]]:
    """`text` without markers, and the spans (in that text) that were between an `OPEN` and its `CLOSE` (an
    `OPEN` left open runs to the end; a stray `CLOSE` is dropped)."""
    clean: list[str] = []
    spans: list[tuple[int, int]] = []
    length = pos = 0
    start: int | None = None
    for marker in _MARKERS.finditer(text):
        piece = text[pos : marker.start()]
        clean.append(piece)
        length += len(piece)
        pos = marker.end()
        if marker.group() == OPEN:
            start = length if start is None else start
        elif start is not None:
            if length > start:
                spans.append((start, length))
            start = None
    clean.append(text[pos:])
    if start is not None:
        spans.append((start, length + len(text) - pos))
    return "".join(clean), spans


def _without_markers(message: Message) -> Message:
    """`message` with every marker character in its text replaced by U+FFFD (one for one: image offsets hold)."""
    return msgspec.structs.replace(message, content=_MARKERS.sub("\ufffd", message.content or ""))


def _char_class(chars: set[str]) -> re.Pattern[str]:
    return re.compile("[" + "".join(re.escape(c) for c in sorted(chars)) + "]" if chars else "(?!)")


def _trie_pattern(strings: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching any of `strings`, longest first at each position (leftmost-longest, as `tokenizers`
    matches added tokens), built as a trie so that a text with many ``<`` costs a few steps per ``<``."""
    trie: dict[str, Any] = {}
    for text in strings:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body  # a string ends here: the longer ones first, then it

    return re.compile(build(trie))
