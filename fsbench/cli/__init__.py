"""The command line: one module per command group over the groups below.

`dispatch` holds the parser and the dispatch (exit codes: docs/ci.md); `args` the shared
flag vocabulary; `runs` the commands that start runs (`run_config`: flags to validated
runs); `gates` compare, gate, history and reference; `results` list, report and trace;
`scaling` calibrate and simulate.

May import: everything in fsbench. Nothing in fsbench imports it.
"""

from fsbench.cli.dispatch import main

__all__ = ["main"]
