"""JSON the way chat templates print it under Hugging Face conventions: transformers replaces Jinja's `tojson`
with `json.dumps(ensure_ascii=False, indent=..., separators=..., sort_keys=...)`, so a Python renderer that
dumps with these defaults writes the template's bytes. Shared by every family module."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["tojson"]


def tojson(value: Any, *, indent: int | None = None, separators: tuple[str, str] | None = None) -> str:
    """Hugging Face's `tojson` filter: `json.dumps(ensure_ascii=False)`, default separators unless given."""
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)
