"""Loads the golden reference data copied into tests/data/golden (provenance of every template in
tests/data/golden/templates/SOURCES.md; how the renders were made in rendered/_meta.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

from agent_protocol.families import family_table

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"

#: the date the golden renders froze `strftime_now` to
FROZEN_TODAY = date(2025, 9, 1)

#: golden template stem -> the protocol that renders it, from the family table
TEMPLATE_PROTOCOLS = {
    member.template: member.name for family in family_table() for member in family.members if member.template
}

#: the Qwen3 templates the first version implemented (the tests written for them select these)
QWEN3_TEMPLATES = ("qwen3", "qwen3_4b_instruct_2507", "qwen3_4b_thinking_2507")

#: templates that print today's date through `strftime_now`: their protocol takes `today`
DATED_TEMPLATES = ("llama3.2_instruct", "gpt_oss", "mistral_small_3.2")

#: golden variant suffix -> protocol options
VARIANT_OPTIONS: dict[str, dict[str, Any]] = {
    "enable_thinking_false": {"enable_thinking": False},
    "clear_thinking_false": {"clear_thinking": False},
    "thinking_true": {"thinking": True},
    "preserve_thinking_true": {"preserve_thinking": True},
}


@dataclass(frozen=True)
class GoldenRender:
    path: Path
    template: str
    case: str
    add_generation_prompt: bool
    options: dict[str, Any]
    #: the template itself refuses this case (the file holds its error message)
    refused: bool = False

    @property
    def protocol(self) -> str:
        return TEMPLATE_PROTOCOLS[self.template]

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def ids(self) -> list[int]:
        """Qwen3 token ids of the text (present for the Qwen-family templates only)."""
        return list(json.loads(self.path.with_name(self.path.name.removesuffix(".txt") + ".ids.json").read_text()))

    @property
    def id(self) -> str:
        return self.path.name.removesuffix(".txt")


@cache
def cases() -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads((GOLDEN / "cases.json").read_text(encoding="utf-8"))}


@cache
def meta() -> dict[str, Any]:
    return dict(json.loads((GOLDEN / "rendered" / "_meta.json").read_text(encoding="utf-8")))


def renders(*templates: str) -> list[GoldenRender]:
    """Every golden render of `templates` (default: every template), refused cases included."""
    out = []
    for path in sorted((GOLDEN / "rendered").glob("*.txt")):
        stem = path.name.removesuffix(".txt")
        refused = stem.endswith(".ERROR")
        template, case, gen, *variant = stem.removesuffix(".ERROR").split("__")
        if templates and template not in templates:
            continue
        options: dict[str, Any] = {}
        for name in variant:
            options.update(VARIANT_OPTIONS[name])
        if template in DATED_TEMPLATES:
            options["today"] = FROZEN_TODAY
        out.append(GoldenRender(path, template, case, gen == "gen_true", options, refused))
    return out


def tool_outputs() -> list[dict[str, Any]]:
    return list(json.loads((GOLDEN / "tool_outputs.json").read_text(encoding="utf-8")))
