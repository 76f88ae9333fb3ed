"""`TokenTranscript`: the token stream of one episode, built by appending, never by re-tokenizing.

Three kinds of span: the prompt (rendered and tokenized once), actions (token ids exactly as the policy
generated them, loss mask 1, with their logprobs when the engine gave them) and observations (feedback text
tokenized on its own, loss mask 0). Action ranges follow OpenRLHF's convention: half-open `(start, end)`
indices into the full token list. A prompt or an observation may carry images: their placeholder tokens are
appended expanded, as the model's processor expands them (what training sees), and `images` records each
image's span and source (`agent_protocol.images`); `engine_ids` gives the same stream with each run of pads
collapsed to one, the prompt an engine that expands images itself (vLLM) takes. This module knows token ids
only; text is the protocol's business.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Literal

import msgspec

from agent_protocol.images import ImageSpan, collapse_image_pads

__all__ = ["ImageSpan", "Span", "SpanKind", "TokenTranscript", "TranscriptRecord"]

SpanKind = Literal["prompt", "action", "observation"]


class Span(msgspec.Struct, frozen=True, kw_only=True):
    kind: SpanKind
    start: int
    end: int


class TranscriptRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A transcript as stored or sent over the wire (trajectory logs, rollout records)."""

    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float | None]
    spans: list[Span]
    #: every image's placeholder span, in order (empty for a text-only episode)
    images: list[ImageSpan] = msgspec.field(default_factory=list)

    @property
    def action_ranges(self) -> list[tuple[int, int]]:
        return [(s.start, s.end) for s in self.spans if s.kind == "action"]


class TokenTranscript:
    """Append-only token stream with loss mask, per-token logprobs and span bookkeeping."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float | None] = []
        self.spans: list[Span] = []
        self.images: list[ImageSpan] = []

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        actions = sum(1 for s in self.spans if s.kind == "action")
        return f"TokenTranscript(tokens={len(self.ids)}, actions={actions})"

    @property
    def action_ranges(self) -> list[tuple[int, int]]:
        """Half-open `(start, end)` index pairs of every action, in OpenRLHF's convention."""
        return [(s.start, s.end) for s in self.spans if s.kind == "action"]

    @property
    def prompt_ids(self) -> list[int]:
        return [i for s in self.spans if s.kind == "prompt" for i in self.ids[s.start : s.end]]

    @property
    def has_logprobs(self) -> bool:
        """True when every action token came with a logprob."""
        return all(lp is not None for lp, m in zip(self.logprobs, self.loss_mask, strict=True) if m)

    def engine_ids(self, pad_ids: set[int] | frozenset[int]) -> list[int]:
        """The ids with each image's run of pads (`pad_ids`) collapsed to one: what an engine that expands images
        itself is given (OpenRLHF's `dedup_media_tokens`). Without images, the ids as they are."""
        return collapse_image_pads(self.ids, pad_ids) if self.images else list(self.ids)

    def append_prompt(self, ids: Sequence[int], *, images: Sequence[ImageSpan] = ()) -> Span:
        """Append prompt ids; `images` are the spans of its images' pads, relative to `ids`."""
        if any(s.kind != "prompt" for s in self.spans):
            raise ValueError("the prompt comes first; after an action, append observations instead")
        return self._append("prompt", ids, mask=0, logprobs=None, images=images)

    def append_action(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> Span:
        """Append generated ids exactly as sampled. `logprobs`, when given, has one value per id."""
        if not self.spans:
            raise ValueError("an action needs a prompt before it")
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"got {len(logprobs)} logprobs for {len(ids)} generated tokens")
        return self._append("action", ids, mask=1, logprobs=logprobs)

    def append_observation(self, ids: Sequence[int], *, images: Sequence[ImageSpan] = ()) -> Span:
        """Append feedback ids (tool results, next turn header), tokenized on their own; `images` are the spans
        of its images' pads, relative to `ids`."""
        if not self.spans:
            raise ValueError("an observation needs a prompt before it")
        return self._append("observation", ids, mask=0, logprobs=None, images=images)

    def record(self) -> TranscriptRecord:
        return TranscriptRecord(
            ids=list(self.ids),
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            spans=list(self.spans),
            images=list(self.images),
        )

    @classmethod
    def from_record(cls, record: TranscriptRecord) -> TokenTranscript:
        transcript = cls()
        transcript.ids = list(record.ids)
        transcript.loss_mask = list(record.loss_mask)
        transcript.logprobs = list(record.logprobs)
        transcript.spans = list(record.spans)
        transcript.images = list(record.images)
        return transcript

    def _append(
        self,
        kind: SpanKind,
        ids: Sequence[int],
        *,
        mask: int,
        logprobs: Sequence[float] | None,
        images: Sequence[ImageSpan] = (),
    ) -> Span:
        for image in images:
            if not 0 <= image.start < image.end <= len(ids):
                raise ValueError(f"image span ({image.start}, {image.end}) is outside the {len(ids)} ids appended")
        start = len(self.ids)
        # `operator.index` keeps the stream plain ints (numpy or torch ids become ints; a float is refused, not
        # truncated) at C speed: three times faster than `int()`, which goes through the type's constructor
        # (about 100 ns an id: 45 us for a 450-token prompt).
        try:
            self.ids.extend(map(operator.index, ids))
        except TypeError:
            del self.ids[start:]  # the ids before the bad one were appended: the transcript stays as it was
            raise
        if images:
            self.images.extend(ImageSpan(start=start + i.start, end=start + i.end, source=i.source) for i in images)
        count = len(self.ids) - start
        self.loss_mask.extend([mask] * count)
        self.logprobs.extend(logprobs if logprobs is not None else [None] * count)
        span = Span(kind=kind, start=start, end=len(self.ids))
        self.spans.append(span)
        return span
