"""The error for bad user input. A leaf module: it imports nothing from fsbench, so every
layer (config, specs, workloads, cli) can raise it without importing another."""
from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: one line naming the field and what is allowed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached fsbench: it stops as on Ctrl-C (ranks ended, the run kept
    and marked `interrupted`) and exits with 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
