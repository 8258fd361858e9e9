"""Run configs as files: YAML (or JSON) validated by `RunConfig`, with dotted command-line overrides.

    load_run_config("examples/delegation-parent-and-workers.yaml", ["learner.lr=3e-4",
    "sampling.temperature=0.8"])

Overrides are applied to the parsed mapping *before* validation, so a config is only ever validated
whole. Each override is `dotted.path=value`; the value is parsed as YAML (`3e-4` a float, `true` a
bool, `null` None, `[0.9, 0.95]` a list, `"123"` a string). Every failure is one typed error with one
message naming the file, the field path, the value and what is allowed:

    ConfigFileError        the file is missing, unreadable, not YAML, or not a mapping
    OverrideError          an override is not `dotted.path=value`, or walks into a non-mapping value
    ConfigValidationError  the merged mapping is not a valid RunConfig (pydantic's errors, one line each)

`describe_schema()` renders every field of RunConfig (nested configs flattened to dotted paths) with
its type, default and meaning: what `grove run schema` prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUndefined

from grove.contracts import AuxiliaryTrainingError, EpisodeTimeoutError, RunConfig, SamplingMismatchError
from grove.sampling import UnmirrorableSamplingError


class RunConfigError(ValueError):
    """A run config that cannot be used (base class of the kinds below)."""


class ConfigFileError(RunConfigError):
    """The config file is missing, unreadable, not valid YAML, or not a mapping at its top."""


class OverrideError(RunConfigError):
    """A command-line override that is not `dotted.path=value` or cannot be applied."""


class ConfigValidationError(RunConfigError):
    """The config (file + overrides) does not validate as a RunConfig. `issues`: (path, value, problem)."""

    def __init__(self, source: str, issues: list[tuple[str, Any, str]]) -> None:
        self.source = source
        self.issues = issues
        lines = [f"  {path} = {_show(value)}: {problem}" for path, value, problem in issues]
        super().__init__(
            f"invalid run config {source} ({len(issues)} problem{'s' if len(issues) != 1 else ''}):\n"
            + "\n".join(lines)
            + "\n  (fix the file or the override; `grove run schema` lists every field)"
        )


# ------------------------------------------------------------------------------------------ loading


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The file's top-level mapping (YAML; JSON is YAML too)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigFileError(
            f"run config {p}: cannot read it ({err.strerror or err}); check the path"
        ) from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigFileError(f"run config {p}: not valid YAML: {err}") from err
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(
            f"run config {p}: the top level must be a mapping of RunConfig fields (run_id: ..., steps: ...), "
            f"got a {type(data).__name__}"
        )
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`learner.lr=3e-4` -> (["learner", "lr"], 0.0003)."""
    key, sep, raw = text.partition("=")
    path = key.strip().split(".")
    if not sep or not all(part.strip() for part in path):
        raise OverrideError(
            f"override {text!r}: expected dotted.path=value, e.g. learner.lr=3e-4 or sampling.temperature=0.8"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise OverrideError(f"override {text!r}: the value is not a YAML value: {err}") from err
    return [part.strip() for part in path], value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of `data` with each override set at its dotted path (intermediate mappings created)."""
    out = json.loads(json.dumps(data, default=str)) if data else {}
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise OverrideError(
                    f"override {text!r}: {where} is {_show(child)}, not a mapping; "
                    f"cannot set {'.'.join(path)}"
                )
            node = child
        node[path[-1]] = value
    return out


def validate_run_config(data: dict[str, Any], source: str = "<mapping>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigValidationError(source, [_issue(e) for e in err.errors()]) from err
    except AuxiliaryTrainingError as err:  # `__cause__` keeps its kind (unknown / never trained)
        issue = ("train_auxiliary", data.get("train_auxiliary"), str(err))
        raise ConfigValidationError(source, [issue]) from err
    # a validator's own typed error, re-raised by pydantic
    except (
        ValueError,
        TypeError,
        KeyError,
        SamplingMismatchError,
        EpisodeTimeoutError,
        UnmirrorableSamplingError,
    ) as err:
        raise ConfigValidationError(source, [("(config)", "", str(err))]) from err


def load_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override, validate. Raises ConfigFileError, OverrideError or ConfigValidationError."""
    data = apply_overrides(read_config_file(path), list(overrides or []))
    source = str(path) + (f" with {' '.join(overrides)}" if overrides else "")
    return validate_run_config(data, source)


# ------------------------------------------------------------------------------------------ errors


def _issue(error: ErrorDetails) -> tuple[str, Any, str]:
    loc = [str(p) for p in error.get("loc", ())]
    path = ".".join(loc) or "(config)"
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1])
        problem = "unknown field; allowed here: " + (", ".join(allowed) if allowed else "(none)")
        return path, error.get("input"), problem
    if kind == "missing":
        return path, "(missing)", "required field: " + (_description_at(loc) or "give it a value")
    problem = error.get("msg", "invalid")
    meaning = _description_at(loc)
    return path, error.get("input"), problem + (f" ({meaning})" if meaning else "")


def _field_at(loc: list[str]) -> FieldInfo | None:
    model: type[BaseModel] | None = RunConfig
    info = None
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = _model_of(info)
    return info


def _fields_at(loc: list[str]) -> list[str]:
    if not loc:
        return list(RunConfig.model_fields)
    info = _field_at(loc)
    model = _model_of(info) if info else None
    return list(model.model_fields) if model else []


def _description_at(loc: list[str]) -> str | None:
    info = _field_at(loc)
    return info.description if info else None


def _model_of(info: FieldInfo) -> type[BaseModel] | None:
    ann = info.annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) or value != "(missing)" else value
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------------------------------ schema


def schema_rows(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted path, type, default, meaning) of every leaf field; nested configs flattened."""
    rows = []
    for name, info in model.model_fields.items():
        path = prefix + name
        sub = _model_of(info)
        if sub is not None:
            rows.extend(schema_rows(sub, path + "."))
            continue
        rows.append((path, _type_name(info.annotation), _default(info), info.description or ""))
    return rows


def describe_schema() -> str:
    rows = schema_rows()
    width = max(len(r[0]) for r in rows)
    lines = [
        "RunConfig: one training run (YAML file for `grove run start CONFIG`; override any field with",
        "dotted.path=value, the value parsed as YAML). Fields, type, default, meaning:",
        "",
    ]
    for path, kind, default, meaning in rows:
        lines.append(f"{path:<{width}}  {kind}  [default: {default}]")
        if meaning:
            lines.append(f"{'':<{width}}    {meaning}")
    return "\n".join(lines)


def json_schema() -> str:
    return json.dumps(RunConfig.model_json_schema(), indent=2)


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "")


def _default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.get_default(call_default_factory=True)
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)
