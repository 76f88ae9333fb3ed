"""Policy versions in tools mode (the gateway an agent program trains through): a conversation continued across two
requests, with a weight update between them, keeps each turn's version through the transcript store, and its
record reports both versions and the staleness. The store's wire format (what Redis holds) keeps the versions of a
turn split by an update. The real server, the official openai client, `ScriptedEngine` replaying real Qwen3 ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_protocol import HFTokenizer, Span, TokenTranscript, get_protocol
from agent_runtime import ScriptedEngine, read_trajectories
from agent_runtime.conversation import Conversation
from agent_runtime.serving import StoredConversation
from agent_runtime.serving.transcript_store import dump_entry, load_entry
from tests.serve.conftest import MODEL, ServerFactory
from tests.serve.test_tools_mode import QUESTION, run_tool
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy


def test_an_update_between_two_requests_shows_in_the_conversations_record(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25, policy_version=2)
    server = start_server(engine=engine, trajectory_log=str(tmp_path / "log.jsonl"))
    client = server.client()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    engine.set_policy_version(3)  # the trainer's update lands between the program's two requests
    messages.append(first.choices[0].message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function.arguments)})
    client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    assert server.metrics()["transcript_prefix_hits"] == 1  # continued from the store, not re-rendered

    before, after = read_trajectories(tmp_path / "log.jsonl")
    assert (before.policy_versions, before.policy_version, before.staleness) == ([2], 2, 0)
    assert (after.policy_versions, after.policy_version, after.staleness) == ([2, 3], 3, 1)
    (segment,) = after.segments
    assert [s.version for s in segment.spans if s.kind == "action"] == [2, 3]
    assert json.loads(call.function.arguments) == {"expression": "17 * 23"}


def test_the_stores_wire_format_keeps_the_versions_of_a_split_turn(tokenizer: HFTokenizer) -> None:
    transcript = TokenTranscript()
    transcript.append_prompt([151644, 872, 198])
    transcript.append_action([42, 43, 44, 151645], [-0.5, -0.25, -0.125, 0.0], versions=[6, 6, 7, 7])
    transcript.append_observation([198])
    transcript.append_action([45], [-1.0])  # an untracked turn beside it
    conversation = Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=16)
    conversation.restore([transcript], [], turns=2, generations=2)
    stored = StoredConversation.pack("c", conversation)
    assert stored is not None
    restored = load_entry(dump_entry(stored)).restore(Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=16))
    assert restored.records() == conversation.records()
    assert [s for s in restored.transcript.spans if s.kind == "action"] == [
        Span(kind="action", start=3, end=5, version=6),
        Span(kind="action", start=5, end=7, version=7),
        Span(kind="action", start=8, end=9),
    ]
