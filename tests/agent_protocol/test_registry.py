"""Protocols by name."""

from __future__ import annotations

import pytest

from agent_protocol import (
    ChatProtocol,
    UnknownProtocolError,
    get_protocol,
    list_protocols,
    protocol_options,
    register_protocol,
)
from agent_protocol.protocols.qwen3 import Qwen3Protocol, ThinkingMode


def test_known_names() -> None:
    """Every name the package has shipped stays registered (a new family adds names without an edit here)."""
    assert list_protocols() == sorted(list_protocols())
    assert set(list_protocols()) >= {
        "deepseek-v3.1",
        "glm-4.5",
        "gpt-oss",
        "llama3.1",
        "llama3.2",
        "mistral-small-3.2",
        "mistral-v0.3",
        "qwen2.5",
        "qwen2.5-vl",
        "qwen3",
        "qwen3-2504",
        "qwen3-coder",
        "qwen3-instruct-2507",
        "qwen3-thinking-2507",
        "qwen3-vl",
    }


def test_every_name_builds_a_protocol_with_that_name() -> None:
    for name in list_protocols():
        protocol = get_protocol(name)
        assert isinstance(protocol, ChatProtocol)
        assert protocol.name == name
        assert protocol.stop_texts and set(protocol.turn_end_texts) <= set(protocol.stop_texts)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown chat protocol 'llama9'.*deepseek-v3.1, .*glm-4.5, .*qwen3-thinking-2507"
    ) as info:
        get_protocol("llama9")
    assert isinstance(info.value, UnknownProtocolError)


def test_enable_thinking_option() -> None:
    assert get_protocol("qwen3").generation_prompt == "<|im_start|>assistant\n"
    off = get_protocol("qwen3", enable_thinking=False)
    assert off.generation_prompt == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert get_protocol("qwen3-thinking-2507").generation_prompt.endswith("<think>\n")


def test_unknown_option_is_a_clear_type_error() -> None:
    with pytest.raises(
        TypeError, match=r"'qwen3-instruct-2507' does not take the option\(s\) enable_thinking; it takes: none"
    ):
        get_protocol("qwen3-instruct-2507", enable_thinking=False)
    with pytest.raises(TypeError, match=r"'qwen3' does not take the option\(s\) thinking; it takes: enable_thinking"):
        get_protocol("qwen3", thinking=True)
    assert protocol_options("qwen3") == ["enable_thinking"]


def test_register_a_new_protocol() -> None:
    def factory() -> ChatProtocol:
        return Qwen3Protocol("my-qwen", ThinkingMode.NONE)

    register_protocol("my-qwen", factory)
    try:
        assert get_protocol("my-qwen").name == "my-qwen"
        with pytest.raises(ValueError, match="already registered"):
            register_protocol("my-qwen", factory)
    finally:
        from agent_protocol import registry

        registry._REGISTRY.pop("my-qwen")
