"""What users write, read strictly: `StrictModel` (unknown keys, NaN and infinities refused), a TOML file
read with every way it can be unreadable as one line (`read_toml`), `--set` overrides, and validation
without coercion (`validate_strictly`, a plugin's table through `validate_options`) whose error is one
line naming the file and the key."""

from __future__ import annotations

import datetime
import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner.errors import ConfigError
from tuner.files import special_file
from tuner.redact import SECRET_REFUSED

__all__ = ["StrictModel", "apply_overrides", "read_toml", "validate_options", "validate_strictly"]

OptionsT = TypeVar("OptionsT", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every model a user writes: unknown keys are refused, NaN and infinities too.

    What a user wrote is validated with `validate_strictly`, which does not coerce (`rounds = "3"` and
    `trials = true` are refused); code that builds these models from its own values may pass a Path
    where the file has a string."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_BOUND_ERRORS = ("less_than", "less_than_equal", "greater_than", "greater_than_equal")


def _field_description(model: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """The description of the field at `loc`, following nested models; None where there is none."""
    current: Any = model
    description = None
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            continue  # a list index, a dict key, a union branch
        info = fields[part]
        description = info.description
        current = info.annotation
        for arg in getattr(current, "__args__", ()):  # `X | None`, `list[X]`: follow the model in it
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
    return description


# pydantic names the branch of a union (`int | float | bool | str`) in an error's location: not a key.
_UNION_BRANCHES = frozenset({"int", "float", "bool", "str"})


def _key_path(loc: Sequence[int | str]) -> tuple[int | str, ...]:
    return tuple(part for part in loc if part not in _UNION_BRANCHES)


def _format_validation_error(source: str, error: ValidationError, model: type[BaseModel] | None = None) -> str:
    errors = error.errors()
    first = errors[0]
    # A value no branch of a union takes fails once per branch; the non-finite number is the telling one.
    same_key = [e for e in errors if _key_path(e["loc"]) == _key_path(first["loc"])]
    first = next((e for e in same_key if e["type"] == "finite_number"), first)
    where = ".".join(str(p) for p in _key_path(first["loc"])) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {where!r}; remove it or check its spelling"
    if first["type"] == "missing":
        return f"{source}: missing required key {where!r}"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == SECRET_REFUSED:  # the input may be a key: never echoed
        return f"{source}: {where}: {message}"
    line = f"{source}: {where}: {message} (got {first.get('input')!r})"
    description = _field_description(model, first["loc"]) if model is not None else None
    if first["type"] in _BOUND_ERRORS and description:
        line += f"; {where} is: {description}"
    return line


def _first_non_json(value: Any, where: str) -> str | None:
    """Where a value TOML has and a study cannot use (a date or time) sits; None if there is none."""
    if isinstance(value, datetime.date | datetime.time):
        return where or "(top level)"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_non_json(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_non_json(item, f"{where}.{index}")
            if found:
                return found
    return None


def validate_strictly(model: type[OptionsT], data: Mapping[str, Any], *, source: str) -> OptionsT:
    """Validates what a user wrote without coercing it: a string is not a number, a boolean or a float is
    not an integer, NaN and infinities are refused. Errors are one line naming `source` and the key.

    The data goes through pydantic's strict JSON mode, in which a file path may be written as a string and
    a list stands for a tuple, as the user writes them; only dates and times (TOML has them) have no JSON
    form, and no setting takes one."""
    found = _first_non_json(dict(data), "")
    if found:
        raise ConfigError(f"{source}: {found}: a date or time is not a valid value here; quote it if it is text")

    def as_text(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        raise TypeError(f"{type(value).__name__} is not a value a study file can hold")

    try:
        text = json.dumps(dict(data), default=as_text, allow_nan=True)
        return model.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(source, exc, model)) from None
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def validate_options(model: type[OptionsT], options: Mapping[str, Any], *, where: str) -> OptionsT:
    """Validates a plugin's table with its strict model, without coercion; errors name `where.key`."""
    return validate_strictly(model, options, source=where)


_BOM = b"\xef\xbb\xbf"


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file's tables; every way it can be unreadable is one line saying what to do."""
    special = special_file(path)
    if special is not None:
        raise ConfigError(f"{path} is {special}, not a TOML file; pass the path of the study's .toml file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory; pass the TOML file in it, e.g. {path / 'study.toml'}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}; check the path and its permissions") from None
    if raw.startswith(_BOM):
        raise ConfigError(f"{path}: starts with a byte-order mark (BOM); save it as UTF-8 without a BOM")
    if b"\x00" in raw:
        raise ConfigError(f"{path}: is a binary file, not TOML text; pass the study's .toml file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); save it as UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: arrays or tables nested too deeply to be a study file") from None


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Applies `--set a.b=value` overrides; `value` is read as TOML, or as a string if it is not TOML."""
    for override in overrides:
        key, sep, raw = override.partition("=")
        parts = [part.strip() for part in key.split(".")]
        if not sep or not all(parts):
            raise ConfigError(f"--set {override!r}: expected KEY=VALUE, e.g. budget.trials=3")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        except RecursionError:
            raise ConfigError(f"--set {key}: the value is nested too deeply; give a plain value") from None
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if isinstance(child, list):  # [[objectives]], [[constraints]]: arrays of tables have no key path
                raise ConfigError(
                    f"--set {override!r}: {part!r} is a list of tables, which --set cannot reach into; "
                    f"edit it in the study file, or give the whole list, e.g. --set '{part}=[{{...}}]'"
                )
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"--set {override!r}: {part!r} is a value, not a table; --set {where}=VALUE sets it")
            node = child
        node[parts[-1]] = value
    return data
