"""`TokenTranscript`: the token stream of one episode, built by appending, never by re-tokenizing.

Three kinds of span: the prompt (rendered and tokenized once), actions (token ids exactly as the policy
generated them, loss mask 1, with their logprobs when the engine gave them) and observations (feedback text
tokenized on its own, loss mask 0). Action ranges follow OpenRLHF's convention: half-open `(start, end)`
indices into the full token list, one per generation. Every action span may carry the policy (weight) version
its tokens were sampled with (`Span.version`; None where the engine tracks none): a generation whose tokens span
a weight update is appended as consecutive action spans, split where the version changes, with its ids, loss mask
and logprobs as they would be unsplit; `action_ranges` reads such spans as the one generation they are. A prompt
or an observation may carry images: their placeholder tokens are appended expanded, as the model's processor
expands them (what training sees), and `images` records each image's span and source (`agent_protocol.images`);
`engine_ids` gives the same stream with each run of pads collapsed to one, the prompt an engine that expands
images itself (vLLM) takes. This module knows token ids only; text is the protocol's business.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Literal

import msgspec

from agent_protocol.images import ImageSpan, collapse_image_pads

__all__ = ["ImageSpan", "Span", "SpanKind", "TokenTranscript", "TranscriptRecord", "action_ranges", "version_runs"]

SpanKind = Literal["prompt", "action", "observation"]


def action_ranges(spans: Sequence[Span]) -> list[tuple[int, int]]:
    """Half-open `(start, end)` index pairs of every generation, in OpenRLHF's convention. A generation split where
    its policy version changed (adjacent action spans, the later of a higher version) is one range, so the ranges,
    and the loss mask they give, are the same with and without versions."""
    ranges: list[tuple[int, int]] = []
    previous: Span | None = None
    for span in spans:
        if span.kind == "action":
            if previous is not None and _continues(previous, span):
                ranges[-1] = (ranges[-1][0], span.end)
            else:
                ranges.append((span.start, span.end))
        previous = span
    return ranges


def _continues(previous: Span, span: Span) -> bool:
    """Whether action `span` is the rest of `previous`'s generation: right after it, split by a version change."""
    return (
        previous.kind == "action"
        and previous.end == span.start
        and previous.version is not None
        and span.version is not None
        and span.version > previous.version
    )


def version_runs(versions: Sequence[int], count: int) -> list[tuple[int, int, int]]:
    """`(start, end, version)` of each run of equal versions in `versions` (one per generated id, non-decreasing
    ints >= 0), relative to the generation; `count` is its number of ids. Raises ValueError for anything else."""
    if len(versions) != count:
        raise ValueError(f"got {len(versions)} policy versions for {count} generated tokens")
    first = versions[0] if count else None
    whole = versions if isinstance(versions, list) else list(versions)
    if type(first) is int and first >= 0 and whole.count(first) == count:  # one version (most): a C loop
        return [(0, count, first)]
    starts: list[int] = []
    previous = -1
    for position, version in enumerate(versions):
        if type(version) is not int or version < 0:
            raise ValueError(f"policy version {position} is {version!r}, not an int >= 0")
        if version < previous:
            raise ValueError(f"policy version {position} is {version}, below the {previous} before it")
        if version != previous:
            starts.append(position)
            previous = version
    ends = [*starts[1:], count] if starts else []
    return [(start, end, versions[start]) for start, end in zip(starts, ends, strict=True)]


class Span(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A half-open run of a transcript's ids. `version`: the policy (weight) version an action span's tokens were
    sampled with (None: untracked, and always None on a prompt or an observation); left out of the wire format
    when None, so an untracked record encodes as it did before the field."""

    kind: SpanKind
    start: int
    end: int
    version: int | None = None


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
        """One half-open `(start, end)` per generation (adjacent action spans merged, see `action_ranges`)."""
        return action_ranges(self.spans)


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
        actions = len(self.action_ranges)
        return f"TokenTranscript(tokens={len(self.ids)}, actions={actions})"

    @property
    def action_ranges(self) -> list[tuple[int, int]]:
        """Half-open `(start, end)` index pairs of every generation, in OpenRLHF's convention (`action_ranges`)."""
        return action_ranges(self.spans)

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

    def append_action(
        self, ids: Sequence[int], logprobs: Sequence[float] | None = None, *, versions: Sequence[int] | None = None
    ) -> Span:
        """Append generated ids exactly as sampled. `logprobs`, when given, has one value per id; so has
        `versions` (the policy version each id was sampled with, non-decreasing ints >= 0), and the ids are then
        one action span per run of equal versions (an empty generation: one span, of its version if given). Returns
        the last span appended. Raises ValueError, appending nothing, for logprobs or versions that do not fit."""
        if not self.spans:
            raise ValueError("an action needs a prompt before it")
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"got {len(logprobs)} logprobs for {len(ids)} generated tokens")
        if versions is None:
            return self._append("action", ids, mask=1, logprobs=logprobs)
        runs = version_runs(versions, len(ids))
        if len(runs) <= 1:
            return self._append("action", ids, mask=1, logprobs=logprobs, version=runs[0][2] if runs else None)
        start = len(self.ids)
        self._append("action", ids, mask=1, logprobs=logprobs)  # checked and appended once, then split
        del self.spans[-1]
        self.spans.extend(Span(kind="action", start=start + a, end=start + b, version=v) for a, b, v in runs)
        return self.spans[-1]

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
        version: int | None = None,
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
        span = Span(kind=kind, start=start, end=len(self.ids), version=version)
        self.spans.append(span)
        return span
