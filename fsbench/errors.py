"""The error for bad user input. A leaf module: it imports nothing from fsbench, so every
layer (config, specs, workloads, cli) can raise it without importing another."""
from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: one line naming the field and what is allowed."""
