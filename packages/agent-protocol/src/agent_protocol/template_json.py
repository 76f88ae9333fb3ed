"""JSON the way chat templates print it under Hugging Face conventions: transformers replaces Jinja's `tojson`
with `json.dumps(ensure_ascii=False, indent=..., separators=..., sort_keys=...)`, so a Python renderer that
dumps with these defaults writes the template's bytes. Shared by every family module.

`tojson_kept` is `tojson` for values rendered again and again (the tool listing every episode's prompt starts
with): the text is kept, keyed by the value's msgspec JSON encoding (C speed, a tenth of `json.dumps`'s cost).
That key is exact: two values with the same msgspec encoding dump to the same text, except that msgspec writes
NaN and the infinities as `null` where `json.dumps` writes `NaN` and `Infinity`, so a value whose encoding holds
`null` is dumped every time. The key is the content, not the object, so a schema edited in place renders as it
is now.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

__all__ = ["tojson", "tojson_kept"]

KEPT_TEXTS: Final = 1024  # `tojson_kept` forgets every kept text when it holds this many


def tojson(value: Any, *, indent: int | None = None, separators: tuple[str, str] | None = None) -> str:
    """Hugging Face's `tojson` filter: `json.dumps(ensure_ascii=False)`, default separators unless given."""
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)


_kept: dict[tuple[int | None, bytes], str] = {}


def tojson_kept(value: Any, *, indent: int | None = None) -> str:
    """`tojson(value, indent=indent)`, kept by content for the next value with the same content (see the module
    docstring)."""
    try:
        encoded = msgspec.json.encode(value)
    except (TypeError, ValueError, msgspec.EncodeError):  # a value msgspec cannot write: tojson says what it can
        return tojson(value, indent=indent)
    if b"null" in encoded:  # None, NaN or an infinity (or the word in a string): the key cannot tell them apart
        return tojson(value, indent=indent)
    key = (indent, encoded)
    text = _kept.get(key)
    if text is None:
        text = tojson(value, indent=indent)
        if len(_kept) >= KEPT_TEXTS:
            _kept.clear()
        _kept[key] = text
    return text
