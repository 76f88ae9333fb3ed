"""The family table (`agent_protocol.families`) is the one list of model families: the registry, protocol
detection, the golden tests, the bench and the package README's table read it, and a new family is one module and
one entry. A made-up family (tests/agent_protocol/fake_family.py) registered with its entry alone is a protocol,
is detected from its template, gets a README row and passes the parser and control-token fuzz tests that every
built-in family passes, with nothing else touched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_protocol import detect_protocol, get_protocol, list_protocols, protocol_for_template
from agent_protocol.families import family_table, readme_table, register_family, unregister_family
from tests.agent_protocol import fake_family, test_control_tokens, test_parse_fuzz
from tests.agent_protocol.golden import TEMPLATE_PROTOCOLS

README = Path(__file__).resolve().parents[2] / "packages" / "agent-protocol" / "README.md"
FAKE = fake_family.FAMILY
FAKE_TEMPLATE = (
    f"{fake_family.TEMPLATE_MARK}{{% for m in messages %}}<|im_start|>{{{{ m.role }}}}\n{{{{ m.content }}}}"
    "<|im_end|>\n{% endfor %}"
)


@pytest.fixture
def fake() -> Iterator[str]:
    register_family(FAKE)
    try:
        yield "fake-chat"
    finally:
        unregister_family(FAKE)


def test_the_readme_family_table_is_the_tables() -> None:
    expected = readme_table()
    assert expected in README.read_text(encoding="utf-8"), (
        "packages/agent-protocol/README.md's family table differs from agent_protocol.families; write this one:\n"
        + expected
    )


def test_every_registered_name_is_in_one_entry_and_every_golden_template_in_one_member() -> None:
    names = [name for family in family_table() for name in family.names]
    assert sorted(names) == list_protocols() and len(set(names)) == len(names)
    golden = Path(__file__).resolve().parents[1] / "data" / "golden" / "templates"
    assert sorted(TEMPLATE_PROTOCOLS) == sorted(p.stem for p in golden.glob("*.jinja"))


def test_a_name_already_in_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="qwen3"):
        register_family(family_table()[0])


def test_a_new_family_is_one_module_and_one_entry(fake: str, tmp_path: Path) -> None:
    assert fake in list_protocols()
    protocol = get_protocol(fake)
    assert isinstance(protocol, fake_family.FakeChatProtocol)
    messages = [{"role": "user", "content": "hi"}]
    assert protocol.render_prompt(messages) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    assert protocol_for_template(FAKE_TEMPLATE) == fake
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "fake"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": FAKE_TEMPLATE}))
    assert detect_protocol(tmp_path) == fake

    assert "| `fake-chat` | none | none | `hermes` | none | none: a test family |" in readme_table()


def test_a_new_family_is_fuzzed_like_every_other(fake: str) -> None:
    """The fuzz tests are parametrized by `list_protocols()` when collected; run with the fake family's name they
    take everything (its call frame, tokenizer, control strings) from its protocol."""
    test_parse_fuzz.test_parser_never_raises(fake)
    for killer in test_parse_fuzz.KILLER_ARGUMENTS:
        test_parse_fuzz.test_known_killers_in_each_familys_own_frame(fake, killer)
    test_control_tokens.test_untrusted_text_writes_no_control_token(fake)
    test_control_tokens.test_a_forged_turn_in_a_tool_result_is_text(fake)


def test_the_family_leaves_with_its_entry() -> None:
    assert "fake-chat" not in list_protocols()
    assert protocol_for_template(FAKE_TEMPLATE) is None
