"""Tool specs in every shape clients send, for render tests against the official templates: a template renders
the dict it is given (`tool | tojson`, or field by field), so a renderer must keep what the client sent: no
description, extra keys such as `strict`, keys in any order, rich JSON schemas, the flat (un-nested) form."""

from __future__ import annotations

from typing import Any

TOOL_SHAPES: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    },
    # no description at all
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
    # an empty description and no parameters
    {"type": "function", "function": {"name": "ping", "description": ""}},
    # `strict`, and keys in another order than OpenAI's
    {
        "function": {
            "strict": True,
            "parameters": {
                "additionalProperties": False,
                "type": "object",
                "required": ["city", "unit"],
                "properties": {"unit": {"enum": ["c", "f"], "type": "string"}, "city": {"type": "string"}},
            },
            "name": "weather",
            "description": 'Weather for a city: "quoted", unicode é 中文, and a\nnewline.',
        },
        "type": "function",
    },
    # a rich schema: nested objects, arrays, numbers with bounds, defaults, anyOf, $defs
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Search flights.",
            "parameters": {
                "type": "object",
                "properties": {
                    "legs": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
                            "required": ["from", "to"],
                        },
                        "minItems": 1,
                    },
                    "passengers": {"type": "integer", "minimum": 1, "maximum": 9, "default": 1},
                    "max_price": {"type": "number", "description": "in EUR"},
                    "cabin": {"anyOf": [{"type": "string", "enum": ["economy", "business"]}, {"type": "null"}]},
                    "flexible": {"type": "boolean"},
                    "filters": {"$ref": "#/$defs/filters"},
                },
                "required": ["legs"],
                "$defs": {"filters": {"type": "object", "properties": {"stops": {"type": "integer"}}}},
            },
        },
    },
]

#: the usual case, every tool in OpenAI's nested form with name, description and parameters
PLAIN_TOOLS: list[dict[str, Any]] = [TOOL_SHAPES[0], TOOL_SHAPES[4]]
