"""`LLMEngine`: what the runtime needs from a model backend, and the data that crosses that boundary.

An engine takes prompt token ids and returns generated token ids (never text-in, text-out), so the transcript
stays token-in-token-out whatever serves the model. `validate_generation` is the one gate every engine's raw
output passes before it becomes a `Generation`, so a broken or hostile backend can never put out-of-vocabulary
ids, NaN logprobs or an unknown finish reason into a training transcript. This module knows nothing about chat
formats beyond the optional `chat()` convenience, which uses a `ChatProtocol` it is given.
"""

from __future__ import annotations

import itertools
import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, Final, Literal, overload

import msgspec

from agent_protocol import ChatProtocol, ControlTokens, MessageLike, Tokenizer, coerce_messages, version_runs
from agent_runtime.errors import ContextBudgetExceeded, EngineBadOutput, EngineError

__all__ = [
    "FinishReason",
    "Generation",
    "LLMEngine",
    "PromptView",
    "SamplingParams",
    "check_versions",
    "checked_policy_version",
    "plain_ids",
    "tokenizer_vocab_size",
    "validate_generation",
]

FinishReason = Literal["stop", "length", "abort"]
"""vLLM's names: `stop` (a stop token or string), `length` (max_new_tokens or the context), `abort`."""

_FINISH_REASONS: Final[dict[str, FinishReason]] = {"stop": "stop", "length": "length", "abort": "abort"}
_LOGPROB_SLACK: Final = 1e-3  # a log-probability is <= 0; this much above is float rounding, more is garbage


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Per-request sampling settings. `top_k <= 0` disables top-k; a temperature below 1e-5 is greedy (vLLM's
    rule). `stop_token_ids` are added to the engine's own stop tokens. Invalid values raise ValueError here, so
    every engine rejects them the same way."""

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    logprobs: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    """One completion: the generated ids exactly as sampled (a stop token included, as vLLM returns it), their
    text, one logprob per id (None when the engine gave none) and why generation stopped. `exact_text` says the
    text is exactly the engine tokenizer's decode of the ids, special tokens kept, so a conversation on the same
    tokenizer reads it instead of decoding again (`AgentRuntime` clears it for a session with a tokenizer of its
    own); an engine whose text comes from elsewhere (a server's detokenizer) leaves it False. `versions`: the
    policy (weight) version each id was sampled with, one per id, non-decreasing ints >= 0 (None: the engine
    tracks no versions); a generation that an update landed in the middle of holds two or more."""

    ids: list[int]
    text: str
    logprobs: list[float] | None
    finish_reason: FinishReason
    exact_text: bool = False
    versions: list[int] | None = None


class PromptView(Sequence[int]):
    """The first `len(self)` ids of a transcript, without copying them. Transcripts only grow, so the view stays
    what it was when the request was made."""

    __slots__ = ("_ids", "_length")

    def __init__(self, ids: list[int], length: int | None = None) -> None:
        self._ids = ids
        self._length = len(ids) if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            return self._ids[start:stop:step]
        position = index + self._length if index < 0 else index
        if not 0 <= position < self._length:
            raise IndexError("prompt index out of range")
        return self._ids[position]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._ids, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PromptView, list, tuple)):
            return len(other) == self._length and all(a == b for a, b in zip(self, other, strict=False))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are not hashable

    def __add__(self, other: Sequence[int]) -> list[int]:
        """A new list, as `list + list` gives (the view itself never changes)."""
        return [*self, *other]

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"PromptView(tokens={self._length})"


def plain_ids(ids: Sequence[int]) -> list[int]:
    """`ids` as a new list of plain ints, for a request body or an engine's prompt. A transcript's `PromptView`
    is copied as one slice (its ids are plain ints already); anything else (numpy, torch, a tuple) goes through
    `operator.index` (a float is refused): a 32k-token prompt in about 0.1 ms, where `[int(i) for i in ids]`
    took 3-4 ms."""
    if isinstance(ids, PromptView):
        return ids[:]
    return list(map(operator.index, ids))


class LLMEngine(ABC):
    """A model backend. Implementations: `HFEngine` (transformers), `VLLMEngine` (in-process vLLM),
    `OpenAIEngine` (HTTP, token ids in and out), `ScriptedEngine` (replays recorded ids)."""

    #: short backend name used in logs and errors
    name: str
    #: the tokenizer the engine's ids belong to
    tokenizer: Tokenizer
    #: the most tokens a prompt plus its completion may hold
    context_length: int
    #: ids that end a generation (e.g. <|im_end|>, <|endoftext|>)
    stop_token_ids: tuple[int, ...]
    #: whether `generate` takes `images` (a vision-language model behind an engine that passes them on)
    accepts_images: bool = False
    #: the policy (weight) version the engine samples with now; None: it tracks none. An engine that tracks
    #: versions tags every generated id with the version it was sampled with (`Generation.versions`), and the
    #: version only grows (`checked_policy_version`)
    policy_version: int | None = None

    @abstractmethod
    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        """Generate a continuation of `prompt_ids`. Logprobs are raw: the model's log-softmax before temperature,
        top-k and top-p (vLLM's default), which is what training's importance ratios need. Raises `ValueError`
        for invalid input, `EngineError` on failure and `ContextBudgetExceeded` when the prompt leaves no room
        for a single token.

        `images`: the references (`agent_protocol.images`) of the prompt's images, in the order of their runs of
        pad tokens; `prompt_ids` holds each run expanded, as the model's processor expands it (an engine that
        expands images itself collapses them, `collapse_image_pads`). Callers pass them only when the prompt has
        images and the engine `accepts_images`; an engine that does not raises `ValueError` when given any."""

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def max_new_tokens_for(self, prompt_len: int, requested: int) -> int:
        """How many tokens a prompt of `prompt_len` may still generate, at most `requested`."""
        room = self.context_length - prompt_len
        if room <= 0:
            raise ContextBudgetExceeded(
                f"{self.name}: prompt of {prompt_len} tokens leaves no room in a {self.context_length}-token context"
            )
        return min(requested, room)

    async def chat(
        self,
        messages: Sequence[MessageLike],
        protocol: ChatProtocol,
        sampling: SamplingParams | None = None,
    ) -> str:
        """Convenience for callers such as an LLM judge: render, generate, return the answer's content. The user
        text (an answer under judgement, say) is kept from writing control tokens (`agent_protocol.control_tokens`)."""
        control = ControlTokens.for_tokenizer(self.tokenizer)
        prompt = control.encode(
            protocol.render_prompt(control.mark(coerce_messages(messages, images=protocol.accepts_images)))
        )
        generation = await self.generate(prompt, sampling or SamplingParams())
        text = self.tokenizer.decode(generation.ids)
        return protocol.parse_assistant_text(text).content

    def stats(self) -> dict[str, Any]:
        """The engine's own counters for a server's `/metrics` (the HTTP engine's upstreams); none by default."""
        return {}

    async def close(self) -> None:  # noqa: B027 - optional hook, most engines hold nothing
        """Release what the engine holds (HTTP clients, model memory)."""


def tokenizer_vocab_size(tokenizer: Tokenizer) -> int | None:
    """How many ids `tokenizer` knows, added tokens included; None when it cannot say."""
    size = getattr(tokenizer, "vocab_size", None)  # HFTokenizer: get_vocab_size(with_added_tokens=True)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    wrapped = getattr(tokenizer, "hf", None)  # TransformersTokenizer: len() counts the added tokens
    if wrapped is not None and hasattr(wrapped, "__len__"):
        return len(wrapped)
    return None


def validate_generation(
    engine: str,
    tokenizer: Tokenizer,
    *,
    ids: object,
    logprobs: object,
    finish_reason: object,
    max_tokens: int,
    vocab_size: int | None,
    versions: object = None,
) -> Generation:
    """Check what a backend answered and build the `Generation`, its text decoded from the ids here (so exact).

    `ids` must be a list of plain ints (not bools, floats or strings) in `[0, vocab_size)`, at most
    `max_tokens` of them; `logprobs` None or one finite float per id, none above 0; `finish_reason` one of
    `FinishReason`; `versions` None or one policy version per id (`check_versions`). A violation raises
    `EngineBadOutput` naming the first bad value; a finish reason of `"error"` (vLLM's retryable internal
    failure) raises `EngineError`. `vocab_size=None` checks only that ids are not negative."""
    if not isinstance(ids, list):
        raise EngineBadOutput(f"{engine}: the token ids are a {type(ids).__name__}, not a list")
    if len(ids) > max_tokens:
        raise EngineBadOutput(f"{engine}: {len(ids)} ids for max_tokens={max_tokens}")
    upper = vocab_size if vocab_size is not None else math.inf
    for position, token in enumerate(ids):
        if type(token) is not int:
            raise EngineBadOutput(f"{engine}: id {position} is {token!r} ({type(token).__name__}), not an int")
        if not 0 <= token < upper:
            raise EngineBadOutput(f"{engine}: id {token} at {position} is outside the vocabulary of {vocab_size}")
    checked: list[float] | None = None
    if logprobs is not None:
        if not isinstance(logprobs, list):
            raise EngineBadOutput(f"{engine}: the logprobs are a {type(logprobs).__name__}, not a list")
        if len(logprobs) != len(ids):
            raise EngineBadOutput(f"{engine}: {len(logprobs)} logprobs for {len(ids)} ids")
        checked = []
        for position, value in enumerate(logprobs):
            if type(value) not in (float, int):
                raise EngineBadOutput(f"{engine}: logprob {position} is {value!r} ({type(value).__name__})")
            number = float(value)
            if not math.isfinite(number):
                raise EngineBadOutput(f"{engine}: logprob {position} is {number}, not finite")
            if number > _LOGPROB_SLACK:
                raise EngineBadOutput(f"{engine}: logprob {position} is {number}, above 0")
            checked.append(number)
    if finish_reason == "error":
        raise EngineError(f"{engine}: the backend reported an internal error for this request (finish reason 'error')")
    finish = _FINISH_REASONS.get(finish_reason) if isinstance(finish_reason, str) else None
    if finish is None:
        raise EngineBadOutput(f"{engine}: unknown finish reason {finish_reason!r}")
    return Generation(
        ids=ids,
        text=tokenizer.decode(ids),
        logprobs=checked,
        finish_reason=finish,
        exact_text=True,
        versions=check_versions(engine, versions, len(ids)),
    )


def check_versions(engine: str, versions: object, count: int) -> list[int] | None:
    """`versions` (an engine's `Generation.versions`) checked for a generation of `count` ids: None, or a list
    of one plain int >= 0 per id, never decreasing, by the transcript's own rule (`agent_protocol.version_runs`,
    which appends them). A violation raises `EngineBadOutput` naming the first bad value: a record must never say a
    token came from a policy it did not."""
    if versions is None:
        return None
    if not isinstance(versions, list):
        raise EngineBadOutput(f"{engine}: the policy versions are a {type(versions).__name__}, not a list")
    try:
        version_runs(versions, count)
    except ValueError as e:
        raise EngineBadOutput(f"{engine}: {e}") from None
    return versions


def checked_policy_version(engine: str, version: object, current: int | None) -> int:
    """`version` as an engine's new `policy_version`: a plain int >= 0, not below `current` (versions only grow:
    a record's staleness is current minus oldest). Raises ValueError otherwise."""
    if type(version) is not int or version < 0:
        raise ValueError(f"{engine}: a policy version is an int >= 0, got {version!r}")
    if current is not None and version < current:
        raise ValueError(f"{engine}: policy version {version} is below the current {current}; versions only grow")
    return version
