"""Loads the golden reference data copied into tests/data/golden (see its README provenance in
tests/data/golden/templates/SOURCES.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"

#: golden template name -> protocol name
TEMPLATE_PROTOCOLS = {
    "qwen3": "qwen3",
    "qwen3_4b_instruct_2507": "qwen3-instruct-2507",
    "qwen3_4b_thinking_2507": "qwen3-thinking-2507",
}


@dataclass(frozen=True)
class GoldenRender:
    path: Path
    template: str
    case: str
    add_generation_prompt: bool
    options: dict[str, Any]

    @property
    def protocol(self) -> str:
        return TEMPLATE_PROTOCOLS[self.template]

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def ids(self) -> list[int]:
        return list(json.loads(self.path.with_suffix(".ids.json").read_text()))

    @property
    def id(self) -> str:
        return self.path.stem


@cache
def cases() -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads((GOLDEN / "cases.json").read_text(encoding="utf-8"))}


def renders() -> list[GoldenRender]:
    out = []
    for path in sorted((GOLDEN / "rendered").glob("*.txt")):
        template, case, gen, *variant = path.stem.split("__")
        options = {"enable_thinking": False} if variant == ["enable_thinking_false"] else {}
        out.append(GoldenRender(path, template, case, gen == "gen_true", options))
    return out


def tool_outputs() -> list[dict[str, Any]]:
    return list(json.loads((GOLDEN / "tool_outputs.json").read_text(encoding="utf-8")))
