"""Reading fields of a parsed JSON request body, each failure an ``InvalidInputError`` naming the field."""

from __future__ import annotations

from typing import Any

import orjson

from swarmyard.errors import InvalidInputError
from swarmyard.jsondepth import check_nesting

#: ``max_tokens`` above this is refused as absurd before any provider or price is consulted.
ABSURD_MAX_TOKENS = 1_000_000


def parse_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; too deep a body is refused before the parser reads it."""
    check_nesting(raw)
    try:
        body = orjson.loads(raw)  # stricter than json (no NaN, 64-bit integers): all refusals are 400s anyway
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"request body is not valid JSON: {exc}", field="body") from exc
    if not isinstance(body, dict):
        raise InvalidInputError("request body must be a JSON object", field="body")
    return body


def req_str(body: dict[str, Any], key: str, where: str = "") -> str:
    """A required non-empty string."""
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{where}{key} must be a non-empty string", field=f"{where}{key}")
    return value


def opt_str(body: dict[str, Any], key: str, where: str = "") -> str | None:
    """An optional string."""
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidInputError(f"{where}{key} must be a string", field=f"{where}{key}")
    return value


def opt_bool(body: dict[str, Any], key: str) -> bool:
    """An optional boolean (default False)."""
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidInputError(f"{key} must be a boolean", field=key)
    return value


def opt_number(body: dict[str, Any], key: str) -> float | None:
    """An optional number."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{key} must be a number", field=key)
    return float(value)


def opt_max_tokens(body: dict[str, Any], *keys: str) -> int | None:
    """The first present of ``keys`` as a positive integer, refusing absurd values."""
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"{key} must be an integer", field=key)
        if value <= 0 or value > ABSURD_MAX_TOKENS:
            raise InvalidInputError(
                f"{key} must be between 1 and {ABSURD_MAX_TOKENS}, got {value}", field=key
            )
        return value
    return None


def req_list(body: dict[str, Any], key: str, where: str = "", *, allow_empty: bool = False) -> list[Any]:
    """A required list."""
    value = body.get(key)
    if not isinstance(value, list) or (not value and not allow_empty):
        raise InvalidInputError(f"{where}{key} must be a non-empty list", field=f"{where}{key}")
    return value


def opt_list(body: dict[str, Any], key: str, where: str = "") -> list[Any]:
    """An optional list (default empty)."""
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInputError(f"{where}{key} must be a list", field=f"{where}{key}")
    return value


def as_object(value: Any, where: str) -> dict[str, Any]:
    """``value`` if it is a JSON object."""
    if not isinstance(value, dict):
        raise InvalidInputError(f"{where} must be an object", field=where)
    return value


def opt_stop(body: dict[str, Any], key: str) -> tuple[str, ...]:
    """``stop`` as a string or a list of strings."""
    value = body.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise InvalidInputError(f"{key} must be a string or a list of strings", field=key)
