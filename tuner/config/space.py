"""The search-space file's model: `SearchSpace`, its knobs (`ParamSpec`: choices or a range, the engine's
default), the constraints between them (`Constraint`: `n_ubatch <= n_batch`), the line the search
starts along, the sampler's encoding of ordinal knobs, and `load_search_space`."""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from tuner.config.reading import StrictModel, read_toml, validate_strictly
from tuner.errors import ConfigError

__all__ = ["Constraint", "ParamSpec", "ParamValue", "SearchSpace", "load_search_space"]

ParamValue = int | float | bool | str


class ParamSpec(StrictModel):
    """One knob: a list of `choices`, or an integer or float range `low`..`high`."""

    description: str = ""
    choices: list[ParamValue] | None = None
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    default: ParamValue | None = Field(
        default=None, description="The engine's own default: the value the baseline runs with."
    )

    @model_validator(mode="after")
    def _one_form(self) -> ParamSpec:
        has_range = self.low is not None or self.high is not None
        if (self.choices is None) == (not has_range):
            raise ValueError("give either choices = [...] or low and high")
        if has_range:
            if self.low is None or self.high is None or self.low > self.high:
                raise ValueError("a range needs low <= high")
        elif not self.choices:
            raise ValueError("choices must not be empty")
        if self.default is not None and not self.allows(self.default):
            raise ValueError(f"default {self.default!r} is not a valid value of this knob")
        return self

    @property
    def ordinal(self) -> bool:
        """Ascending numeric choices (32, 64, ..., 2048): ordered, so samplers see them as an index."""
        choices = self.choices or []
        if len(choices) < 3 or not all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices):
            return False
        return all(float(a) < float(b) for a, b in itertools.pairwise(choices))

    def allows(self, value: ParamValue) -> bool:
        if self.choices is not None:
            return any(type(value) is type(c) and value == c for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
    "!=": operator.ne,
}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_]\w*|-?\d+(?:\.\d+)?)\s*(<=|>=|==|!=|<|>)\s*([A-Za-z_]\w*|-?\d+(?:\.\d+)?)\s*$")


class Constraint(StrictModel):
    """`left op right`, each side a knob name or a number; e.g. `n_ubatch <= n_batch`."""

    text: str
    left: str
    op: str
    right: str

    @classmethod
    def parse(cls, text: str) -> Constraint:
        match = _CONSTRAINT.match(text)
        if not match:
            raise ValueError(f"constraint {text!r} is not 'knob op knob' with op one of <= < >= > == !=")
        return cls(text=text, left=match[1], op=match[2], right=match[3])

    def names(self) -> list[str]:
        return [side for side in (self.left, self.right) if not _is_number(side)]

    def holds(self, values: Mapping[str, ParamValue]) -> bool:
        def side(token: str) -> Any:
            return float(token) if _is_number(token) else values[token]

        return _COMPARISONS[self.op](side(self.left), side(self.right))


def _is_number(token: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(?:\.\d+)?", token))


class SearchSpace(StrictModel):
    engine: str = Field(description="The engine kind these knobs belong to.")
    description: str = ""
    params: dict[str, ParamSpec]
    constraints: list[Constraint] = Field(default_factory=list)
    line: list[str] = Field(
        default_factory=list,
        description="Knobs the search starts by moving together (tuner/sampling.py): the first trials walk the "
        "line where they take one value, the other knobs at the baseline's.",
    )

    @field_validator("constraints", mode="before")
    @classmethod
    def _parse_constraints(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [Constraint.parse(v) if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _constraints_name_knobs(self) -> SearchSpace:
        for constraint in self.constraints:
            unknown = [n for n in constraint.names() if n not in self.params]
            if unknown:
                raise ValueError(f"constraint {constraint.text!r} names unknown knob {unknown[0]!r}")
        unknown = [n for n in self.line if n not in self.params or not self.params[n].ordinal]
        if unknown:
            raise ValueError(f"line names {unknown[0]!r}, which is not a knob with ascending numeric choices")
        if self.line:
            # The walk moves the line's knobs together through the values they share: its middle and both
            # neighbours need three, or the line would be skipped without a word.
            shared = set(self.params[self.line[0]].choices or []).intersection(
                *(self.params[n].choices or [] for n in self.line[1:])
            )
            if len(shared) < 3:
                raise ValueError(f"line {self.line}: its knobs share {len(shared)} choices; the walk needs at least 3")
        return self

    def encode(self, settings: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """Knob values to what the sampler sees: an ordinal knob's value becomes its index."""
        encoded: dict[str, ParamValue] = {}
        for name, value in settings.items():
            param = self.params[name]
            encoded[name] = param.choices.index(value) if param.ordinal and param.choices else value
        return encoded

    def decode(self, sampled: Mapping[str, Any]) -> dict[str, ParamValue]:
        """What the sampler proposed, back to knob values."""
        decoded: dict[str, ParamValue] = {}
        for name, value in sampled.items():
            param = self.params[name]
            decoded[name] = param.choices[int(value)] if param.ordinal and param.choices else value
        return decoded

    def restricted_to(self, names: Sequence[str] | None) -> SearchSpace:
        if names is None:
            return self
        unknown = [n for n in names if n not in self.params]
        if unknown:
            raise ConfigError(
                f"search.params names {unknown[0]!r}, which the search space does not define; "
                f"valid: {', '.join(sorted(self.params))}"
            )
        # A constraint between a tuned knob and one left at its baseline has nothing to choose between.
        kept = [c for c in self.constraints if all(n in names for n in c.names())]
        line = [n for n in self.line if n in names]
        return self.model_copy(update={"params": {n: self.params[n] for n in names}, "constraints": kept, "line": line})


def load_search_space(path: Path) -> SearchSpace:
    return validate_strictly(SearchSpace, read_toml(path), source=str(path))
