"""`Conversation`: the one implementation of a turn, token-in-token-out. Agent mode, tools mode, compaction and
training all go through it.

    conversation = Conversation(protocol, tokenizer, max_new_tokens=1024, max_context_tokens=32768, tools=specs)
    await conversation.open_segment(messages)                    # render the prompt, tokenize it once
    request = conversation.request(conversation.max_new_tokens)  # None: no room for another turn
    reply = conversation.accept(await engine.generate(request.prompt_ids, request.sampling(base)))
    ids = await conversation.feedback_ids(observation_messages)  # the feedback, rendered and tokenized alone
    if conversation.fits(len(ids)):
        conversation.append_feedback(ids, observation_messages)

It owns the protocol, the tokenizer, the token segments (one per context; a compacted episode has several),
the messages view, the budgets, the turn counters and the errors the model's output caused. Generated ids are
appended exactly as sampled; only new text (a prompt, feedback) is tokenized, alone. Nothing here is O(history)
per turn: a request hands the engine a view of the current segment (`PromptView`), not a copy.

Images (a vision-language protocol, `ChatProtocol.accepts_images`, and a tokenizer with an image grid,
`HFTokenizer.vision`): a prompt or feedback with images is rendered with one `image_pad` per image, tokenized,
and each pad expanded into as many pads as the model's processor gives that image (what OpenRLHF's
`process_prompt_with_images` builds); the transcript keeps each image's span and source, and a request carries
the current context's images in order, for the engine to see. A text-only protocol refuses a message with an
image; a vision protocol whose tokenizer has no image grid, an unreadable image or more images than `max_images`
is a `MessageError` naming the message and part.

Untrusted text (user and tool messages) never yields a control-token id: a prompt or feedback is rendered from the
messages `ControlTokens.mark`ed and encoded by `ControlTokens.encode` (`agent_protocol.control_tokens`), so a tool
result that writes `<|im_end|>` or `<tool_call>` is that text, not the frame. A conversation whose untrusted text
holds no control string gets exactly the tokenizer's ids of the official render. `special_tokens_in_text=True`
tokenizes it all as Hugging Face does.

What it does not do: call an engine, step an environment, score, decide when an episode ends or when to compact
(`AgentSession` and its `ContextPolicy` do), or speak HTTP (serving maps the wire format onto it). Foreign code it
calls (the tokenizer, the protocol) may raise: whatever it raises comes out as a `StageError` coded with the stage
that raised (``render_error``, ``decode_error``, ``parse_error``; `agent_runtime.boundary`), for the caller's
boundary to record; a `MessageError` (a message the caller must fix) comes out as it is. Its fields are its own:
the callers read them and change them only through its methods.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Sequence
from typing import Final, Literal

import msgspec

from agent_protocol import (
    Action,
    ChatProtocol,
    ControlTokens,
    ImageSpan,
    Message,
    MessageError,
    Tokenizer,
    TokenTranscript,
    ToolSpec,
    TranscriptRecord,
    expand_image_pads,
    image_grid,
    image_spans,
)
from agent_runtime.boundary import Stage, boundary, stage_code
from agent_runtime.encoding import encode_off_loop
from agent_runtime.engines.base import FinishReason, Generation, PromptView, SamplingParams
from agent_runtime.errors import SessionStateError
from agent_runtime.outcomes import ErrorCode
from agent_runtime.trajectory import EpisodeError, Usage, usage_of

__all__ = ["MIN_TURN_TOKENS", "Conversation", "Reply", "Stage", "TurnRequest", "stage_code"]

MIN_TURN_TOKENS: Final = 1
#: a tool result that stands after a rewritten turn while its text is cut out of the template's render
_PLACEHOLDER: Final = Message(role="tool", content="", tool_call_id="placeholder")
# The conversation's stages: what the tokenizer or the protocol raises leaves as a `StageError` with its code; a
# `MessageError` (a message the caller must fix) is not a failure of the stage and leaves as it is.
_RENDER: Final = boundary("render", passes=(MessageError,), reraise=True)
_DECODE: Final = boundary("decode", reraise=True)
_PARSE: Final = boundary("parse", reraise=True)


@functools.lru_cache(maxsize=256)
def _clamped(base: SamplingParams, max_new_tokens: int, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    """`base` with this budget and these stop tokens added (frozen, so one object serves every turn that asks the
    same: the turns of an episode, and every episode of a rollout, mostly do)."""
    stops = base.stop_token_ids + tuple(i for i in stop_token_ids if i not in base.stop_token_ids)
    return msgspec.structs.replace(base, max_new_tokens=max_new_tokens, stop_token_ids=stops)


class TurnRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the next generation needs: the prompt ids of the current context (a view) and the token budget."""

    prompt_ids: Sequence[int]
    max_new_tokens: int
    purpose: Literal["turn", "summary"] = "turn"
    #: the protocol's stop tokens (`ChatProtocol.stop_texts`), which every engine must stop on
    stop_token_ids: tuple[int, ...] = ()
    #: the context's images in the order of their pads (their references, see `agent_protocol.images`)
    images: tuple[str, ...] = ()

    def sampling(self, base: SamplingParams | None = None) -> SamplingParams:
        """`base` with `max_new_tokens` clamped to this turn's budget and the protocol's stop tokens added. A
        summary's budget is its own (`summary_max_new_tokens`, within the context), not capped by the turn limit
        of `base`: a recipe with short turns would otherwise cut every summary short."""
        base = base or SamplingParams()
        budget = self.max_new_tokens if self.purpose == "summary" else min(base.max_new_tokens, self.max_new_tokens)
        return _clamped(base, budget, self.stop_token_ids)


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """A generation as the conversation read it: the parsed action, whether the turn closed itself with the
    end-of-turn token, and whether it was cut off by the length limit instead."""

    action: Action
    closed: bool
    truncated: bool
    #: the token text of `ChatProtocol.turn_end_texts` the turn ended with (None when it was not closed)
    ended_by: str | None = None


class Conversation:
    """One conversation's token segments, messages, budgets and counters (see the module docstring)."""

    def __init__(
        self,
        protocol: ChatProtocol,
        tokenizer: Tokenizer,
        *,
        max_new_tokens: int,
        max_context_tokens: int | None = None,
        tools: Sequence[ToolSpec] = (),
        errors: list[EpisodeError] | None = None,
        max_images: int | None = None,
        special_tokens_in_text: bool = False,
    ) -> None:
        self.max_images = max_images
        #: how untrusted text is kept from writing control tokens (None: `special_tokens_in_text`, Hugging Face's way)
        self.control = None if special_tokens_in_text else ControlTokens.for_tokenizer(tokenizer)
        self.protocol = protocol.with_tools(tools) if tools else protocol  # parsers that type values by schema
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.max_context_tokens = max_context_tokens
        self.tools = list(tools)
        self.segments: list[TokenTranscript] = []
        self.messages: list[Message] = []
        self.errors: list[EpisodeError] = [] if errors is None else errors  # the owner's record, when it has one
        self.turns = 0
        self.generations = 0
        self.turn_closed = True
        self.ended_by: str | None = None  # which of the protocol's turn-end tokens closed the last turn
        self.turn_finish_reason: FinishReason | None = None  # why the last turn's generation stopped (not a summary's)
        self.render_s = 0.0
        self._turn_ends = _token_ids(tokenizer, protocol.turn_end_texts)
        self.stop_token_ids = tuple(_token_ids(tokenizer, protocol.stop_texts))

    @property
    def transcript(self) -> TokenTranscript:
        """The current segment (the only one unless the conversation was compacted)."""
        if not self.segments:
            raise SessionStateError("the conversation has no transcript yet; open a segment first")
        return self.segments[-1]

    def __len__(self) -> int:
        """Tokens in the current context."""
        return len(self.segments[-1]) if self.segments else 0

    # -- building the context ----------------------------------------------------------------------------

    async def open_segment(self, prompt: Sequence[Message], *, add: Sequence[Message] | None = None) -> list[int]:
        """Render `prompt` (with the tools) as a new context and tokenize it once. `add` is what the messages
        view gains (default: the whole prompt; a compacted context adds only its resume message)."""
        t0 = time.perf_counter()
        with _RENDER:
            # No tools renders as no tools at all: Llama's template tells `tools=[]` (an empty tool prompt) from None.
            shown = list(prompt) if self.control is None else self.control.mark(prompt)
            text = self.protocol.render_prompt(shown, tools=self.tools or None)
            ids = await encode_off_loop(self.tokenizer, text, self.control)
            spans: list[ImageSpan] = []
            if self.protocol.accepts_images:
                ids, spans = self._expand_images(ids, prompt, held=0)
        self.render_s += time.perf_counter() - t0
        transcript = TokenTranscript()
        transcript.append_prompt(ids, images=spans)
        self.segments.append(transcript)
        self.messages.extend(prompt if add is None else add)
        self.turn_closed = True
        self.ended_by = None
        return ids

    async def open_history(self, messages: Sequence[Message]) -> list[int]:
        """`open_segment` for a conversation a client sends whole (tools mode, rendered from scratch): its
        assistant messages count as the turns (and generations) it already had."""
        ids = await self.open_segment(messages)
        self.turns = self.generations = sum(1 for m in messages if m.role == "assistant")
        return ids

    def restore(
        self,
        segments: list[TokenTranscript],
        messages: list[Message],
        *,
        turns: int = 0,
        generations: int = 0,
        turn_closed: bool = True,
        ended_by: str | None = None,
        render_s: float = 0.0,
    ) -> None:
        """Continue a stored conversation (`TranscriptStore`): its transcript, messages and counters replace this
        new conversation's (built with the tools, budgets and error record of the request that continues it)."""
        self.segments, self.messages = segments, messages
        self.turns, self.generations = turns, generations
        self.turn_closed, self.ended_by, self.render_s = turn_closed, ended_by, render_s

    async def feedback_ids(self, messages: Sequence[Message]) -> list[int]:
        """`messages` (tool results, a user message) rendered as what follows the last turn, tokenized alone."""
        t0 = time.perf_counter()
        with _RENDER:
            shown = list(messages) if self.control is None else self.control.mark(messages)
            text = self.protocol.render_feedback(shown, turn_closed=self.turn_closed, ended_by=self.ended_by)
            ids = await encode_off_loop(self.tokenizer, text, self.control)
            if self.protocol.accepts_images:
                ids, _ = self._expand_images(ids, messages, held=len(self.transcript.images))
        self.render_s += time.perf_counter() - t0
        return ids

    async def rewrite_last_turn(self, message: Message, context: Sequence[Message]) -> list[int] | None:
        """Roll the last generated turn back to its start and put `message` (the client's rewrite of it) in its
        place: rendered as the chat template renders it after `context` (the messages before it), tokenized
        alone and appended as an observation (not trained: the model did not sample it). None, and nothing
        changed, when the current segment does not end with a generated turn."""
        transcript = self.transcript
        if not transcript.spans or transcript.spans[-1].kind != "action" or not self.messages:
            return None
        t0 = time.perf_counter()
        with _RENDER:
            shown = [*context, message] if self.control is None else self.control.mark([*context, message])
            text = self._turn_text(shown)
            ids = await encode_off_loop(self.tokenizer, text, self.control)
        self.render_s += time.perf_counter() - t0
        cut = transcript.action_ranges[-1][0]
        transcript.ids, transcript.loss_mask = transcript.ids[:cut], transcript.loss_mask[:cut]
        transcript.logprobs = transcript.logprobs[:cut]
        transcript.spans = [span for span in transcript.spans if span.end <= cut]
        transcript.images = [image for image in transcript.images if image.start < cut]
        transcript.append_observation(ids)
        self.messages[-1] = message
        self.turn_closed, self.ended_by = True, None
        return ids

    def _turn_text(self, messages: list[Message]) -> str:
        """The text the template writes for the last of `messages`, an assistant turn, between the generation
        prompt that opens it and what the feedback after a closed turn writes: the render of the conversation
        with the turn and a placeholder tool result, less the render up to its generation prompt and the
        placeholder's feedback. A family whose render does not split so gives its `render_generation`."""
        tools = self.tools or None
        head = self.protocol.render_prompt(messages[:-1], tools=tools)
        tail = self.protocol.render_feedback([_PLACEHOLDER])
        whole = self.protocol.render_messages([*messages, _PLACEHOLDER], tools=tools, add_generation_prompt=True)
        if whole.startswith(head) and whole.endswith(tail) and len(whole) >= len(head) + len(tail):
            return whole[len(head) : len(whole) - len(tail)]
        return self.protocol.render_generation(messages[-1])

    def fits(self, tokens: int, *, reserve: int = MIN_TURN_TOKENS) -> bool:
        """Whether `tokens` more, and `reserve` for the next turn, fit the context."""
        return self.max_context_tokens is None or len(self) + tokens + reserve <= self.max_context_tokens

    def append_feedback(self, ids: Sequence[int], messages: Sequence[Message]) -> None:
        """Append feedback ids (from `feedback_ids`, image pads expanded) and the messages they render."""
        sources = [image.url for message in messages for image in message.images]
        spans = image_spans(ids, pad_id=self._pad_id(), sources=sources) if sources else []
        self.transcript.append_observation(ids, images=spans)
        self.messages.extend(messages)

    def add_messages(self, messages: Iterable[Message]) -> None:
        """Add messages to the record that are not rendered into the context (an episode's last observations,
        feedback that did not fit)."""
        self.messages.extend(messages)

    def _pad_id(self) -> int:
        pad = self.protocol.image_pad
        pad_id = None if pad is None else self.tokenizer.token_to_id(pad)
        if pad_id is None:
            raise MessageError("messages", f"the tokenizer has no {pad!r} token for the {self.protocol.name} protocol")
        return pad_id

    def _expand_images(
        self, ids: list[int], messages: Sequence[Message], *, held: int
    ) -> tuple[list[int], list[ImageSpan]]:
        """`ids` with each image's pad expanded as the model's processor expands it, and the images' spans.
        `held`: images the context already holds (for `max_images`). Without images, checks that no text wrote
        the pad token: a pad with no image behind it would misalign every image after it, in the engine and in
        training."""
        if not any(m.images for m in messages):
            pad_id = self.tokenizer.token_to_id(self.protocol.image_pad or "")
            if pad_id is not None and pad_id in ids:
                where = "the conversation's text writes the image placeholder"
                raise MessageError("messages", f"{where} {self.protocol.image_pad!r} with no image behind it")
            return ids, []
        grid = image_grid(self.tokenizer)
        if grid is None:
            raise MessageError(
                "messages",
                "the conversation holds images, and the model has no image processor (a Qwen2-VL-style "
                "preprocessor_config.json beside its tokenizer.json): use a vision-language model",
            )
        pads: list[int] = []
        sources: list[str] = []
        for index, message in enumerate(messages):
            for k, image in enumerate(message.images):
                try:
                    pads.append(grid.pads_for(image.url))
                except ValueError as e:
                    raise MessageError(f"messages[{index}].content[{_part_index(message, k)}]", str(e)) from e
                sources.append(image.url)
        if self.max_images is not None and held + len(sources) > self.max_images:
            raise MessageError(
                "messages",
                f"{held + len(sources)} images in one context; the model takes at most {self.max_images}",
            )
        try:
            return expand_image_pads(ids, pad_id=self._pad_id(), pads=pads, sources=sources)
        except ValueError as e:  # a pad written as text (a tool's output, say) has no image behind it
            raise MessageError("messages", f"image placeholders and images disagree: {e}") from e

    # -- one turn ----------------------------------------------------------------------------------------

    def room(self, wanted: int) -> int:
        """How many new tokens the next turn may have: `wanted`, or what the context has left."""
        if self.max_context_tokens is None:
            return wanted
        return min(wanted, self.max_context_tokens - len(self))

    def request(self, wanted: int, *, purpose: Literal["turn", "summary"] = "turn") -> TurnRequest | None:
        """The next generation on the current context, or None when not even one token fits."""
        room = self.room(wanted)
        if room < MIN_TURN_TOKENS:
            return None
        transcript = self.transcript
        return TurnRequest(
            prompt_ids=PromptView(transcript.ids),
            max_new_tokens=room,
            purpose=purpose,
            stop_token_ids=self.stop_token_ids,
            images=tuple(image.source for image in transcript.images),
        )

    def accept(self, generation: Generation, *, call_id_prefix: str, summary: bool = False) -> Reply:
        """Append the generated ids exactly as sampled, then read them: decode (or take the engine's exact text),
        parse, record the parse issues as errors and the assistant message. A summary turn (`summary=True`) is a
        generation but not a turn, and its message keeps no tool calls (nothing runs them). Ids that carry policy
        versions are one action span per version (`TokenTranscript.append_action`)."""
        self.generations += 1
        if not summary:
            self.turns += 1
        self.transcript.append_action(generation.ids, generation.logprobs, versions=generation.versions)
        ended_by = self._turn_ends.get(generation.ids[-1]) if generation.ids else None
        closed = ended_by is not None
        self.turn_closed, self.ended_by = closed, ended_by
        # The engine decoded these ids with its tokenizer, which the runtime binds to the session: no second decode.
        if generation.exact_text:
            text = generation.text
        else:
            with _DECODE:
                text = self.tokenizer.decode(generation.ids)
        with _PARSE:
            action = self.protocol.parse_assistant_text(text, call_id_prefix=call_id_prefix)
        if not summary:
            self.turn_finish_reason = generation.finish_reason
            for issue in action.issues:
                self.record_error(issue.code, issue.message)
            self.messages.append(action.to_message())
        else:
            self.messages.append(
                Message(role="assistant", content=action.content, reasoning_content=action.reasoning_content)
            )
        truncated = not closed and generation.finish_reason == "length"
        return Reply(action=action, closed=closed, truncated=truncated, ended_by=ended_by)

    # -- records -----------------------------------------------------------------------------------------

    def record_error(self, code: ErrorCode, message: str, turn: int | None = None) -> EpisodeError:
        error = EpisodeError(code=code, message=message, turn=self.turns if turn is None else turn)
        self.errors.append(error)
        return error

    def usage(self) -> Usage:
        return usage_of(self.segments, generations=self.generations)

    def records(self) -> list[TranscriptRecord]:
        return [t.record() for t in self.segments]


def _part_index(message: Message, k: int) -> int:
    """The index, among the message's OpenAI content parts, of its `k`-th image."""
    images = [j for j, part in enumerate(message.content_parts()) if part["type"] == "image_url"]
    return images[k]


def _token_ids(tokenizer: Tokenizer, texts: Sequence[str]) -> dict[int, str]:
    """The ids of the single-token `texts` the tokenizer has (id -> text); texts it lacks are left out."""
    return {i: text for text in texts if (i := tokenizer.token_to_id(text)) is not None}
