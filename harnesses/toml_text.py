"""TOML text of a nested dict of strings, numbers, booleans, lists of them and tables: what a harness's
config file needs (Codex's config.toml), without a TOML-writing dependency.

Scalars of a table come before its sub-tables (`[a.b]`); keys that are not bare are quoted; strings are
TOML basic strings (JSON's escapes are valid TOML escapes). `None` values are left out (TOML has no null).

Pure module (stdlib only).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


class TomlValueError(ValueError):
    """A value TOML cannot hold (NaN is allowed by TOML but not by grove's configs; other types)."""


def _key(key: str) -> str:
    return key if _BARE.match(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TomlValueError(f"{where}: {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v, f"{where}[{i}]") for i, v in enumerate(value)) + "]"
    if isinstance(value, Mapping):  # a table inside a list or scalar position: inline
        inner = ", ".join(
            f"{_key(k)} = {_value(v, f'{where}.{k}')}" for k, v in value.items() if v is not None
        )
        return "{" + inner + "}"
    raise TomlValueError(f"{where}: a {type(value).__name__} cannot be written as TOML")


def to_toml(table: Mapping[str, Any], _path: tuple[str, ...] = ()) -> str:
    """The TOML document of `table` (module docstring)."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in table.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            tables.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value, '.'.join((*_path, key)))}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, sub in tables:
        path = (*_path, key)
        body = to_toml(sub, path)
        has_scalars = any(v is not None and not isinstance(v, Mapping) for v in sub.values())
        header = f"[{'.'.join(_key(p) for p in path)}]\n" if has_scalars or not sub else ""
        out += ("\n" if out else "") + header + body
    return out
