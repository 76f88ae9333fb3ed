"""Protocols by name."""

from __future__ import annotations

import pytest

from agent_protocol import ChatProtocol, UnknownProtocolError, get_protocol, list_protocols, register_protocol
from agent_protocol.protocols.qwen3 import Qwen3Protocol, ThinkingMode


def test_known_names() -> None:
    assert list_protocols() == ["qwen3", "qwen3-instruct-2507", "qwen3-thinking-2507"]


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown chat protocol 'llama9'.*qwen3, qwen3-instruct-2507") as info:
        get_protocol("llama9")
    assert isinstance(info.value, UnknownProtocolError)


def test_enable_thinking_option() -> None:
    assert get_protocol("qwen3").generation_prompt == "<|im_start|>assistant\n"
    off = get_protocol("qwen3", enable_thinking=False)
    assert off.generation_prompt == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert get_protocol("qwen3-thinking-2507").generation_prompt.endswith("<think>\n")


def test_unknown_option_is_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match=r"qwen3-instruct-2507.*enable_thinking"):
        get_protocol("qwen3-instruct-2507", enable_thinking=False)


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
