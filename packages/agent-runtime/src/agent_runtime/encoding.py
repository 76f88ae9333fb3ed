"""`encode_off_loop`: tokenize without stalling the event loop.

Many episodes (in a rollout) or requests (in the server) share one event loop. Encoding a long conversation
takes milliseconds to hundreds of them (about 130 ms for 37,000 Qwen3 tokens on a loaded two-core machine),
and every other episode waits while it runs. So texts of `GIL_FREE_MIN_CHARS` characters or more are encoded on
a worker thread, where `HFTokenizer` releases the GIL; shorter ones, the usual per-turn feedback, are encoded
in place, where a thread hop would cost more than the work. The ids are the tokenizer's either way; with a
`ControlTokens` (`agent_protocol.control_tokens`), its `encode`: text between its markers yields no control id.
"""

from __future__ import annotations

import asyncio

from agent_protocol import GIL_FREE_MIN_CHARS, ControlTokens, Tokenizer

__all__ = ["encode_off_loop"]


async def encode_off_loop(tokenizer: Tokenizer, text: str, control: ControlTokens | None = None) -> list[int]:
    """`tokenizer.encode(text)`, or `control.encode(text)` when given, on a worker thread when `text` is long (see
    the module docstring)."""
    encode = tokenizer.encode if control is None else control.encode
    if len(text) < GIL_FREE_MIN_CHARS:
        return encode(text)
    return await asyncio.to_thread(encode, text)
