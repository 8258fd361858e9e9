"""What an id that names stored things may be: episode, group and run ids.

An episode's id names everything it leaves behind: object keys (`rows/{episode}.parquet`, staging and
ledger pages under `{episode}/`), file names of a local store, its gateway URL. So an id is checked once,
where the episode or run is specified (EpisodeSpec, RunConfig: the CLI, the Python start and a Temporal
client's start alike), instead of failing at its first write (a newline or `..`: every call 503
`InvalidKeyError`; a 300-character part: "file name too long" at the first write, a close that hangs).

The rule: one to `MAX_PARTS` parts separated by `/`, each of 1 to `MAX_PART` characters from letters,
digits and `._-:@+=~,`, none of them `.` or `..`.

Pure module (stdlib only).
"""

from __future__ import annotations

import re

MAX_PART = 100  # characters of one part: a file name of a local store (255 bytes) with room for suffixes
MAX_PARTS = 8
_PART = re.compile(r"[A-Za-z0-9._\-:@+=~,]+")


RUN_ID_PARTS = MAX_PARTS - 4  # a run's evaluation episodes add 4 parts: {run}/eval/s000001/t0/g0


def check_id(value: str, what: str, max_parts: int = MAX_PARTS) -> str:
    """`value` if it is a valid id (module docstring), else ValueError naming `what`, the id and the rule."""
    rule = (
        f"1 to {max_parts} parts separated by '/', each of 1 to {MAX_PART} characters from letters, digits "
        "and ._-:@+=~, (not '.' or '..')"
    )
    parts = value.split("/")
    if len(parts) > max_parts:
        raise ValueError(f"{what} {value!r} has {len(parts)} parts; expected {rule}")
    for part in parts:
        problem = _problem(part)
        if problem is not None:
            raise ValueError(f"{what} {value!r}: {problem}; expected {rule}. Choose another {what}")
    return value


def _problem(part: str) -> str | None:
    if not part:
        return "an empty part ('//', or '/' at an end)"
    if part in (".", ".."):
        return f"a {part!r} part"
    if len(part) > MAX_PART:
        return f"a part of {len(part)} characters"
    bad = sorted(set(re.sub(_PART, "", part)))
    if bad:
        return f"characters {bad!r}"
    return None
