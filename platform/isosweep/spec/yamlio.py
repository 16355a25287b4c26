"""The YAML toolkit every spec is loaded with: read a mapping, merge ``--set`` overrides, validate
into a frozen pydantic model, and turn pydantic's errors into one ``ConfigError`` that names the
file, the key and what is allowed, e.g. ``sweeps/trials/easy.yaml: key 'Bp': must be greater
than 0 (got -4)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the file, the key and what is allowed."""


class Section(BaseModel):
    """A frozen config section that refuses unknown keys (a typo is an error, not a silent default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["a.b=1", "Bp=16"]`` -> ``{"a": {"b": 1}, "Bp": 16}``; values are parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected key=value, e.g. --set budget=20000")
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {pair!r}: {part!r} is a value, not a section")
        node[leaf] = yaml.safe_load(raw) if raw else raw
    return tree


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``top`` over ``base`` (neither is modified)."""
    out = dict(base)
    for key, value in top.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from ``path``, or a ``ConfigError`` saying why not."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values at the top level")
    return data


def validate(model: type[BaseModel], data: dict[str, Any], source: str) -> Any:
    """``model.model_validate(data)``, with errors rewritten to name ``source``, each key and what is allowed."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        lines = [_describe(model, e) for e in err.errors()]
        raise ConfigError(f"{source}: " + "\n  ".join(lines)) from None


def _describe(model: type[BaseModel], error: dict) -> str:
    """One readable line for one pydantic error: key, problem, allowed values, offending input."""
    loc = [str(part) for part in error["loc"]]
    key = ".".join(loc)
    if error["type"] == "extra_forbidden":
        section = _section_at(model, loc[:-1])
        allowed = ", ".join(section.model_fields) if section else "?"
        return f"key {key!r}: unknown key; allowed here: {allowed}"
    message = error["msg"].removeprefix("Value error, ")
    message = message.replace("Input should be", "must be")
    shown = error.get("input")
    suffix = "" if isinstance(shown, dict) or shown is None else f" (got {shown!r})"
    if not loc:  # a rule across keys (budget vs Bp * n, ...): its message names them
        return message
    return f"key {key!r}: {message}{suffix}"


def _section_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    """The config class found by walking ``loc`` from ``model`` (None if it leaves the config tree)."""
    for part in loc:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def flatten(data: dict, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: a config as flat strings (MLflow params, a sweep's trial settings)."""
    flat: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return flat
