"""`fsbench list --format json`: what a script or CI job needs to know about presets and
trainers, in one document.

  workloads       name -> every WorkloadConfig field (as `--set` keys name them)
  length_presets  name -> the fitted distribution, its target median and p90, the source
  length_kinds    the parametric `lengths=` specs besides the presets
  trainers        name -> description, the extra to install, whether it imports here (and
                  why not), and its switches: default and allowed values
"""
from __future__ import annotations

import dataclasses
import typing

from fsbench.config import ConfigError
from fsbench.config_io import to_dict
from fsbench.specs import LENGTH_KINDS
from fsbench.training.trainer import TRAINERS, option_defaults, resolve_trainer_class


def switches(cls: type) -> dict[str, dict]:
    """Each `--set <trainer>.<key>` switch: its default and what it accepts."""
    options = getattr(cls, "Options", None)
    if options is None:
        return {k: {"default": v} for k, v in option_defaults(cls).items()}
    hints = typing.get_type_hints(options)
    out = {}
    for f in dataclasses.fields(options):
        hint = hints[f.name]
        entry: dict = {"default": str(f.default)}
        if typing.get_origin(hint) is typing.Literal:
            entry["allowed"] = list(typing.get_args(hint))
        elif hint is int:
            entry["allowed"] = f"integer >= {f.metadata.get('min', 0)}"
        out[f.name] = entry
    return out


def trainer_entry(name: str) -> dict:
    _, extra, description = TRAINERS[name]
    entry = {"description": description, "extra": extra}
    try:
        cls = resolve_trainer_class(name)
    except ConfigError as e:  # an optional package is missing: say so, list the rest
        return {**entry, "installed": False, "why_not": str(e), "switches": None}
    return {**entry, "installed": True, "switches": switches(cls)}


def listing() -> dict:
    from fsbench.workloads.distributions import LENGTH_PRESETS
    from fsbench.workloads.presets import WORKLOADS

    return {
        "workloads": {name: to_dict(make()) for name, make in WORKLOADS.items()},
        "length_presets": {name: {"distribution": p.distribution.describe(), "median": p.median,
                                  "p90": p.p90, "source": p.source}
                           for name, p in LENGTH_PRESETS.items()},
        "length_kinds": list(LENGTH_KINDS),
        "trainers": {name: trainer_entry(name) for name in TRAINERS},
    }
