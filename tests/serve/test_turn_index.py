"""`TurnIndex`: the bounded map from a tools-mode turn's prompt key to the key its conversation was stored under,
by which a follow-up that rewrote that turn finds it (`tools_mode`)."""

from __future__ import annotations

import pytest

from agent_runtime.serving.turn_index import TurnIndex


def test_it_keeps_the_latest_keys_up_to_its_capacity() -> None:
    index = TurnIndex(2)
    index.put("a", "stored-a")
    index.put("b", "stored-b")
    index.put("a", "stored-a2")  # the same prompt answered again: its latest turn is the one found
    index.put("c", "stored-c")  # over capacity: the least recently put ("b") goes
    assert (index.get("a"), index.get("b"), index.get("c"), len(index)) == ("stored-a2", None, "stored-c", 2)


def test_a_disabled_store_keeps_no_turns_and_a_negative_capacity_is_refused() -> None:
    index = TurnIndex(0)
    index.put("a", "stored-a")
    assert index.get("a") is None and len(index) == 0
    with pytest.raises(ValueError, match="capacity"):
        TurnIndex(-1)
