"""The official chat templates, rendered the way Hugging Face transformers renders them.

Test and benchmark support only (needs jinja2, a dev dependency): a jinja2 ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and loopcontrols, `tojson` as `json.dumps(ensure_ascii=False)`, and the
`raise_exception` / `strftime_now` globals, as in transformers' `_compile_jinja_template`.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "golden" / "templates"
_META = TEMPLATES.parent / "rendered" / "_meta.json"

#: golden template file stem -> (protocol name, protocol options, template kwargs)
QWEN3_FAMILY: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "qwen3": ("qwen3", {}, {}),
    "qwen3__enable_thinking_false": ("qwen3", {"enable_thinking": False}, {"enable_thinking": False}),
    "qwen3_4b_instruct_2507": ("qwen3-instruct-2507", {}, {}),
    "qwen3_4b_thinking_2507": ("qwen3-thinking-2507", {}, {}),
}


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' `tojson` filter (GLM-4.5's template passes `ensure_ascii` itself)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@cache
def official_template(stem: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime(2025, 9, 1, 12, 0, 0).strftime(fmt)
    return env.from_string((TEMPLATES / f"{stem}.jinja").read_text(encoding="utf-8"))


@cache
def special_tokens(stem: str) -> dict[str, str]:
    """The special-token variables (bos_token, eos_token, ...) the golden renders passed to template `stem`."""
    meta = json.loads(_META.read_text(encoding="utf-8"))
    return dict(meta["templates"][stem]["special_tokens_passed"])


def render_official(
    stem: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **kwargs: Any,
) -> str:
    """Template `stem` (a file in tests/data/golden/templates) rendered with that template's special tokens;
    `kwargs` are further template variables (`enable_thinking`, `thinking`, `date_string`, ...)."""
    return official_template(stem).render(
        messages=messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        **{**special_tokens(stem), **kwargs},
    )
