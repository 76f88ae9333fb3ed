"""`ChatProtocol`: everything a model family's chat format decides, behind one small interface.

A protocol turns a conversation into the exact prompt text the model's own chat template would give, parses
one generated assistant turn into an `Action`, and renders the *feedback* that follows a generated turn (tool
results or a user message, then the next generation prompt) so that the token stream of an episode equals
the template's rendering of the same conversation. It works on text; tokens are the transcript's business.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from agent_protocol.errors import MessageError
from agent_protocol.types import (
    Action,
    Message,
    MessageLike,
    ParseIssue,
    ToolSpec,
    ToolSpecLike,
    coerce_messages,
    coerce_tools,
)

__all__ = ["ChatProtocol", "feedback_messages", "generated_message"]


class ChatProtocol(ABC):
    """One chat format. Subclasses are stateless and safe to share between episodes."""

    #: registry name, e.g. "qwen3"
    name: str
    #: the token text that closes an assistant turn in history; `render_feedback` writes it after a turn that
    #: was cut off (families whose turns end on the next role's token have none: "")
    end_of_turn: str
    #: token texts an engine must stop on; every engine and the turn core take them from here
    stop_texts: tuple[str, ...]
    #: the token a vision-language family writes once per image, which the model's processor expands (None: the
    #: family is text-only, and a message with an image is refused)
    image_pad: str | None = None

    @property
    def accepts_images(self) -> bool:
        """Whether the family renders images (a vision-language template)."""
        return self.image_pad is not None

    @property
    def turn_end_texts(self) -> tuple[str, ...]:
        """The token texts that, generated last, end a turn *closed* (anything else was cut off). Families with
        several (gpt-oss `<|call|>` / `<|return|>`, Llama `<|eot_id|>` / `<|eom_id|>`, GLM's next role token)
        override this, and tell by `render_feedback(ended_by=...)` which one the model wrote."""
        return (self.end_of_turn,) if self.end_of_turn else self.stop_texts

    def render_messages(
        self,
        messages: Iterable[MessageLike],
        *,
        tools: Iterable[ToolSpecLike] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The conversation as the official chat template renders it, byte for byte. Checks and coerces the
        caller's messages (images only where the family renders them) and tools, then calls `render_coerced`;
        a family implements that (or, as before, overrides this method whole)."""
        messages = self.prepare_raw(messages, tools_given=tools is not None)
        msgs = coerce_messages(messages, images=self.accepts_images)
        specs = None if tools is None else coerce_tools(tools)
        return self.render_coerced(msgs, specs, add_generation_prompt=add_generation_prompt)

    def prepare_raw(self, messages: Iterable[MessageLike], *, tools_given: bool) -> Iterable[MessageLike]:
        """The caller's messages as `render_messages` got them, before `coerce_messages` joins a list of parts into
        text: a family whose template treats such a list otherwise refuses it here (Nemotron, Gemma 3, Llama 4) or
        leaves out what the template renders nothing for. `tools_given`: tools were passed (maybe an empty list).
        What is not a list of messages is passed on for `coerce_messages` to name. By default: as they came."""
        return messages

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        """The family's rendering of already-checked messages and tool specs, called by `render_messages` (call
        that, not this). `specs` is None when the caller passed no tools and a list (maybe empty) when it passed
        some: the families whose template tells the two apart (Llama 3.x) read it, the others treat both alike."""
        raise NotImplementedError(
            f"{type(self).__name__} renders nothing: a family implements render_coerced (the template method "
            "render_messages calls it with checked messages and tools) or overrides render_messages itself"
        )

    @property
    @abstractmethod
    def generation_prompt(self) -> str:
        """The text that opens an assistant turn for the model to continue."""

    def parse_assistant_text(self, text: str, *, call_id_prefix: str = "call") -> Action:
        """Split one generated turn (the text after the generation prompt) into reasoning, content and tool
        calls. Never raises, whatever the text: this is the boundary around the family's `parse_turn`, so
        that a parser bug on some degenerate generation costs that turn (an `Action` with the issue
        ``parse_error``) and never the episode, its batch or the server."""
        try:
            return self.parse_turn(text, call_id_prefix=call_id_prefix)
        except Exception as e:  # a family parser that raised: the turn is kept, unread, with a coded issue
            issue = ParseIssue(
                code="parse_error",
                message=f"Your turn could not be read ({type(e).__name__}); nothing in it was run. "
                "Write it again, shorter and in the expected format.",
            )
            return Action(content="", error=issue)

    @abstractmethod
    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        """The family's parser, called through `parse_assistant_text` (call that, not this). Malformed output
        should become `ParseIssue`s; anything this raises is caught there as ``parse_error``."""

    @abstractmethod
    def render_generation(self, message: MessageLike) -> str:
        """The text a model following this format generates for `message` after the generation prompt, up to
        and including `end_of_turn`. Used to make expert (SFT) trajectories and to test the transcript."""

    @abstractmethod
    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        """The text that follows a generated assistant turn: it closes the turn (adding `end_of_turn` when
        `turn_closed` is false, i.e. the turn was cut off by the length limit), carries `messages` (tool
        results and/or a user message) and opens the next assistant turn. `ended_by` is the token text of
        `turn_end_texts` the model generated last, when the turn was closed and the caller knows it (None:
        the family's usual closing); a family whose next scaffold depends on it (GLM's role token, which the
        model already wrote) reads it, the others ignore it."""

    def with_tools(self, tools: Iterable[ToolSpecLike]) -> ChatProtocol:
        """This protocol for an episode or request that shows the model `tools`. A family whose parser types
        argument values by the tools' schemas, as vLLM's parser does with the request's tools (Qwen3-Coder's XML
        parameters), returns a copy that knows them; the others return themselves. The turn core calls it."""
        return self

    def render_prompt(self, messages: Iterable[MessageLike], *, tools: Iterable[ToolSpecLike] | None = None) -> str:
        """The first prompt of an episode: the conversation plus the generation prompt."""
        return self.render_messages(messages, tools=tools, add_generation_prompt=True)

    def assistant_message(self, text: str, *, call_id_prefix: str = "call") -> Message:
        """Convenience: parse a generated turn straight into the assistant message it stands for."""
        return self.parse_assistant_text(text, call_id_prefix=call_id_prefix).to_message()


def feedback_messages(
    messages: Sequence[MessageLike], *, system_refused: str | None = None, images: bool = False
) -> list[Message]:
    """The messages of a `render_feedback` call, checked the way every family needs: at least one, and none an
    assistant turn (the turn is generated, not fed back). `system_refused`: the family's reason for refusing a
    system message too (its template renders system messages only at the top); None: system messages pass.
    `images`: the family renders images (see `coerce_messages`)."""
    msgs = coerce_messages(messages, images=images)
    if not msgs:
        raise MessageError("messages", "feedback needs at least one tool result or user message")
    carried = "tool, user or system" if system_refused is None else "tool or user"
    for index, message in enumerate(msgs):
        if message.role == "assistant":
            raise MessageError(f"messages[{index}].role", f"feedback carries {carried} messages")
        if message.role == "system" and system_refused is not None:
            raise MessageError(f"messages[{index}].role", system_refused)
    return msgs


def generated_message(message: MessageLike, *, images: bool = False) -> Message:
    """The message of a `render_generation` call, which must be an assistant turn: only those are generated."""
    (msg,) = coerce_messages([message], images=images)
    if msg.role != "assistant":
        raise MessageError("message.role", f"only assistant turns are generated, not {msg.role}")
    return msg
