"""`--set key=value` overrides of the typed configs (fsbench.config), and their
(de)serialization for manifests and rank specs: one-line errors name the key and what
its value must look like."""
from __future__ import annotations

import dataclasses
import math
import typing

from fsbench.config import (EvalConfig, ModelConfig, OptimizerParts, RunConfig,
                            SyntheticComputeConfig, WorkloadConfig)
from fsbench.errors import ConfigError

# ---------------------------------------------------------------------------
# `--set key=value` overrides, and (de)serialization for manifests and rank specs.

# `--set <key>.<sub>=...` where <key> is itself a value: its sub-keys live in another field.
SUBKEYS = {"optimizer": "optimizer_parts"}

# What a --set value must look like, by the field's type (for the one-line error).
_TYPE_WORDS = {int: "an integer", float: "a finite number",
               bool: "a boolean (true|false, on|off, yes|no, 1|0)",
               tuple[int, ...]: "comma-separated integers, e.g. 100,20,10"}


def _coerce(value: str, hint: object, key: str) -> object:
    args = typing.get_args(hint)
    if len(args) == 2 and type(None) in args:  # `float | None`: the text gives the float
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    try:
        if hint is int:
            return int(value)
        if hint is float:
            number = float(value)
            if not math.isfinite(number):
                raise ConfigError(f"--set {key}={value!r}: expected a finite number")
            return number
        if hint is bool:
            if value.lower() in ("1", "true", "on", "yes"):
                return True
            if value.lower() in ("0", "false", "off", "no"):
                return False
            raise ValueError(value)
        if origin is tuple:
            return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--set {key}={value!r}: expected {_TYPE_WORDS.get(hint, hint)}") from None
    return value


def override_all(cfg: object, pairs: list[tuple[str, str]], _prefix: str = "") -> object:
    """Return a copy of dataclass `cfg` with every (dotted key, text) in `pairs` set at
    once, so that rules between fields (warmup < steps) are checked after all of them,
    whatever their order."""
    names = [f.name for f in dataclasses.fields(cfg)]
    hints = typing.get_type_hints(type(cfg))
    direct: dict[str, object] = {}
    nested: dict[str, list[tuple[str, str]]] = {}
    shown = {v: k for k, v in SUBKEYS.items()}  # a sub-key field's name on the command line
    for key, value in pairs:
        given, _, rest = key.partition(".")
        # `optimizer.tables` sets optimizer_parts.tables; `optimizer_parts.*` is no key
        head = SUBKEYS.get(given, given) if rest else given
        if head not in names or shown.get(head, given) != given:
            raise ConfigError(f"--set {_prefix}{key}: unknown key; allowed: "
                              + ", ".join(_prefix + n for n in _settable_keys(cfg)))
        current = getattr(cfg, head)
        if rest:
            if not dataclasses.is_dataclass(current):
                raise ConfigError(f"--set {_prefix}{key}: {_prefix}{head} has no sub-keys")
            nested.setdefault(head, []).append((rest, value))
        elif dataclasses.is_dataclass(current):
            raise ConfigError(f"--set {_prefix}{key}: give a sub-key, e.g. "
                              f"{_prefix}{head}.{dataclasses.fields(current)[0].name}")
        else:
            direct[head] = _coerce(value, hints[head], _prefix + key)
    for head, sub in nested.items():
        direct[head] = override_all(getattr(cfg, head), sub,
                                    _prefix=f"{_prefix}{shown.get(head, head)}.")
    return dataclasses.replace(cfg, **direct)


def _settable_keys(cfg: object) -> list[str]:
    out = []
    for f in dataclasses.fields(cfg):
        sub = getattr(cfg, f.name)
        if dataclasses.is_dataclass(sub):
            shown = {v: k for k, v in SUBKEYS.items()}.get(f.name, f.name)
            out += [f"{shown}.{k}" for k in _settable_keys(sub)]
        elif f.name != "name":
            out.append(f.name)
    return out


def to_dict(cfg: object) -> dict:
    return dataclasses.asdict(cfg)


def workload_from_dict(d: dict) -> WorkloadConfig:
    d = dict(d)
    d["model"] = ModelConfig(**d["model"])
    d["synthetic"] = SyntheticComputeConfig(**d["synthetic"])
    d["optimizer_parts"] = OptimizerParts(**d.get("optimizer_parts", {}))  # none stored before
    d["context_vocabs"] = tuple(d["context_vocabs"])
    return WorkloadConfig(**d)


def run_from_dict(d: dict) -> RunConfig:
    d = dict(d)
    d["workload"] = workload_from_dict(d["workload"])
    if "eval" in d:  # runs stored before evaluation existed have none
        d["eval"] = EvalConfig(**d["eval"])
    return RunConfig(**d)
