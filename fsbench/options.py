"""Trainer switches as typed, frozen dataclasses, validated in one place.

A trainer declares `class Options(TrainerOptions)` with typed fields and defaults:
`Literal[...]` fields take one of their values, `int` fields take an integer no smaller
than `field(metadata={"min": m})`; cross-field rules go in `check()`. The CLI's
`--set <trainer>.<key>=value` strings are parsed by `Options.parse`, which names the bad
switch and what is allowed in one line (ConfigError), before any rank starts.
"""
from __future__ import annotations

import dataclasses
import typing

from fsbench.config import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerOptions:
    @classmethod
    def defaults(cls) -> dict[str, str]:
        """Every switch and its default, as the strings `--set` would give."""
        return {f.name: str(f.default) for f in dataclasses.fields(cls)}

    @classmethod
    def parse(cls, values: dict[str, str], prefix: str = "") -> "TrainerOptions":
        """The options from `--set` strings (missing keys take their defaults)."""
        hints = typing.get_type_hints(cls)
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, text in values.items():
            name = f"{prefix}.{key}" if prefix else key
            if key not in known:
                raise ConfigError(f"--set {name}: unknown option; allowed: "
                                  + ", ".join(f"{prefix}.{k}" if prefix else k for k in known))
            kwargs[key] = _coerce(name, str(text), hints[key], known[key].metadata)
        options = cls(**kwargs)
        options.check(prefix)
        return options

    def check(self, prefix: str) -> None:
        """Rules between fields (override); raise ConfigError naming the switches."""

    def as_strings(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _coerce(name: str, text: str, hint: object, metadata: typing.Mapping) -> object:
    if typing.get_origin(hint) is typing.Literal:
        allowed = typing.get_args(hint)
        if text not in allowed:
            raise ConfigError(f"{name}={text!r} is not allowed; choose one of: {', '.join(allowed)}")
        return text
    if hint is int:
        minimum = metadata.get("min", 0)
        if not text.lstrip("-").isdigit() or int(text) < minimum:
            raise ConfigError(f"{name}={text!r} must be an integer >= {minimum}")
        return int(text)
    return text
