"""Tool parameter schemas: built from Python types with msgspec, and checked against arguments.

Two paths, one result (an `ArgumentError` naming the field and the reason):

- A tool built from a typed function or a msgspec Struct has an arguments Struct. Its JSON schema comes from
  `msgspec.json.schema` (inlined so the top level is ``{"type": "object", ...}``, as OpenAI function schemas
  are), and `convert_arguments` validates with `msgspec.convert`, which also gives typed values.
- A tool whose schema was written by hand or came from elsewhere (an MCP server) is checked by
  `check_arguments` against the common subset of JSON Schema: ``type``, ``properties``, ``required``,
  ``additionalProperties: false``, ``enum``, ``items``, ``anyOf``/``oneOf``, ``minimum``/``maximum``.
  Keywords outside the subset are not enforced (the tool, or the MCP server, is the final judge).

This module knows JSON Schema and msgspec; it knows nothing about tools or observations.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from agent_env.errors import ArgumentError

__all__ = ["check_arguments", "convert_arguments", "struct_schema"]

_AT_PATH: Final = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NAMED_FIELD: Final = re.compile(r"field `(?P<name>[^`]+)`")


def struct_schema(
    struct_type: type[msgspec.Struct], *, description_by_field: dict[str, str] | None = None
) -> dict[str, Any]:
    """The JSON schema of a Struct's fields, top level inlined, titles dropped; other `$defs` kept.

    `description_by_field` fills in descriptions (from a docstring) where the type does not give one.
    """
    raw = msgspec.json.schema(struct_type)
    defs: dict[str, Any] = dict(raw.get("$defs", {}))
    ref = raw.get("$ref", "")
    top: dict[str, Any] = dict(defs.pop(ref.rsplit("/", 1)[-1])) if ref else dict(raw)
    top.pop("title", None)
    properties = {name: dict(prop) for name, prop in top.get("properties", {}).items()}
    for name, text in (description_by_field or {}).items():
        if name in properties and "description" not in properties[name]:
            properties[name] = {"description": text, **properties[name]}
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if top.get("required"):
        out["required"] = list(top["required"])
    if "additionalProperties" in top:
        out["additionalProperties"] = top["additionalProperties"]
    if defs:
        out["$defs"] = defs
    return out


def convert_arguments[S: msgspec.Struct](arguments: dict[str, Any], struct_type: type[S], *, strict: bool = True) -> S:
    """Validate `arguments` into `struct_type`, or raise `ArgumentError` naming the field and why."""
    try:
        return msgspec.convert(arguments, struct_type, strict=strict)
    except msgspec.ValidationError as e:
        field, problem = _split_msgspec_error(str(e))
        raise ArgumentError(field, problem) from e


def _split_msgspec_error(text: str) -> tuple[str, str]:
    """'Expected `int`, got `str` - at `$.a`' -> ('a', 'Expected `int`, got `str`');
    'Object missing required field `b` - at `$.inner`' -> ('inner.b', 'missing required field')."""
    path = ""
    match = _AT_PATH.search(text)
    if match:
        path = match.group("path").lstrip(".")
        text = text[: match.start()]
    named = _NAMED_FIELD.search(text)
    if named and text.startswith("Object "):
        name = named.group("name")
        field = f"{path}.{name}" if path else name
        if "missing required" in text:
            return field, "missing required field"
        if "unknown field" in text:
            return field, "unknown field (not a parameter of this tool)"
    return path, text


_JSON_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> None:
    """Check `arguments` against `schema` (the subset above); raise `ArgumentError` on the first problem."""
    problem = _check(arguments, schema, "")
    if problem is not None:
        raise ArgumentError(*problem)


def _type_ok(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    kinds = _JSON_TYPES.get(name)
    return True if kinds is None else isinstance(value, kinds)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _check(value: Any, schema: Any, path: str) -> tuple[str, str] | None:
    if not isinstance(schema, dict):
        return None
    for union in ("anyOf", "oneOf"):
        options = schema.get(union)
        if isinstance(options, list) and options:
            failures = [_check(value, option, path) for option in options]
            if all(failure is not None for failure in failures):
                return failures[0]
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_type_ok(value, str(name)) for name in names):
            return path, f"expected {' or '.join(map(str, names))}, got {_json_type_name(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return path, f"must be one of {schema['enum']!r}, got {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return path, f"must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return path, f"must be <= {schema['maximum']}, got {value}"
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                return _join(path, name), "missing required field"
        if schema.get("additionalProperties") is False:
            for name in value:
                if name not in properties:
                    return _join(path, name), "unknown field (not a parameter of this tool)"
        for name, item in value.items():
            if name in properties:
                found = _check(item, properties[name], _join(path, name))
                if found is not None:
                    return found
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found = _check(item, schema["items"], _join(path, index))
            if found is not None:
                return found
    return None


def _json_type_name(value: Any) -> str:
    for name, kinds in _JSON_TYPES.items():
        if name in ("number", "integer") and isinstance(value, bool):
            continue
        if isinstance(value, kinds):
            return name
    return type(value).__name__
