"""A made-up model family for tests/agent_protocol/test_families.py: everything a new family writes, in one module.

"fake-chat" is ChatML with Hermes calls whose template has no default system prompt and renders a later system
message as a turn. The test registers it with one family-table entry and checks that it is then a registered
protocol, detected from its template, listed in the README table and fuzzed like every built-in family.
"""

from __future__ import annotations

from typing import Final

from agent_protocol.chat_protocol import generated_message
from agent_protocol.chatml import IM_END, IM_START, ChatMLProtocol, hermes_calls, hermes_tool_response, strip_end_marker
from agent_protocol.families import Family, Member, ReadmeRow
from agent_protocol.hermes_parser import split_tool_calls
from agent_protocol.types import Action, Message, MessageLike

#: what sets the family's template apart (a comment its authors left in it)
TEMPLATE_MARK: Final = "{#- fake-chat template -#}"


class FakeChatProtocol(ChatMLProtocol):
    name = "fake-chat"
    template = "fake-chat"

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        return (msg.content or "") + hermes_calls(msg.content, msg.tool_calls) + IM_END

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        content, calls = split_tool_calls(strip_end_marker(text), call_id_prefix=call_id_prefix)
        return Action(content=content, tool_calls=tuple(calls))

    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        out: list[str] = []
        for index, msg in enumerate(msgs):
            if msg.role == "user" or (msg.role == "system" and (index > 0 or feedback)):
                out.append(f"{IM_START}{msg.role}\n{msg.content or ''}{IM_END}\n")
            elif msg.role == "assistant":
                out.append(f"{IM_START}assistant\n{self.render_generation(msg)}\n")
            elif msg.role == "tool":
                out.append(hermes_tool_response(msgs, index))
        return out


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"fake-chat": FakeChatProtocol}

#: its one entry in the family table
FAMILY: Final = Family(
    module=__name__,
    members=(Member(name="fake-chat", marks=(IM_START, TEMPLATE_MARK)),),
    readme=ReadmeRow(golden="none", jinja="none", parser="`hermes`", tito="none", seams="none: a test family"),
)
