"""One vocabulary for every command's flags (fsbench.cli and its cli_* modules build on it):

- `--store DIR`: a store of runs that the command reads or writes (default: runs);
- `--out`: an artifact only (a report's folder, a trace file, a copy of the output);
- `--format`: what stdout gets, `json` always among the choices (one JSON document);
- `--help` shows every default; a usage error is one line and exit 2, as any bad input.

Flags renamed to this vocabulary keep working under their old names, hidden from --help,
with one warning line each (`Renamed`).
"""
from __future__ import annotations

import argparse
import sys

from fsbench.errors import ConfigError

DEFAULT_STORE = "runs"
# fsbench's own flags, given before the command (fsbench.cli.dispatch.build_parser).
GLOBAL_FLAGS = ("-q", "--quiet", "--debug", "--version")
TEXT_OR_JSON = ("text", "json")


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default (a list comma-separated), unless the help
    says it already or there is none to say (no value, an off switch, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        value = action.default
        if (not action.option_strings or "default" in text or value is None or value is False
                or value is argparse.SUPPRESS or value == []):
            return text
        shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        return f"{text} (default: {shown.replace('%', '%%')})".strip()


class Parser(argparse.ArgumentParser):
    """argparse with defaults in --help (sub-commands inherit the class) and usage errors
    as one line through main's bad-input path (exit 2), not usage text and SystemExit."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        misplaced = [f for f in GLOBAL_FLAGS if message.startswith("unrecognized arguments:")
                     and f in message.split(":", 1)[1].split()]
        if misplaced:  # `fsbench list -q`: the flag belongs to fsbench, not to the command
            raise ConfigError(f"{message}: {', '.join(misplaced)} goes before the command: "
                              f"fsbench {misplaced[0]} COMMAND ...")
        raise ConfigError(f"{message} (see: {self.prog} --help)")


class Renamed(argparse.Action):
    """A flag's old name: hidden from --help, does what the new name does, and says so in
    one warning line (once per command line, however often it is given)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs.update(help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new
        self.warned = False

    def __call__(self, parser, namespace, values, option_string=None):
        if not self.warned:
            print(f"fsbench: warning: {option_string} is now {self.new} (the old name still "
                  "works, for now)", file=sys.stderr)
            self.warned = True
        setattr(namespace, self.dest, values)


def path_arg(text: str) -> str:
    """A path flag's value: an empty one would silently mean the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a directory or file name")
    return text


def rename(p: argparse.ArgumentParser, old: str, new: str, dest: str) -> None:
    p.add_argument(old, dest=dest, action=Renamed, new=new, metavar="DIR", type=path_arg)


def add_store(p: argparse.ArgumentParser, help: str, default: str | None = DEFAULT_STORE,
              old: str | None = None) -> None:
    """`--store DIR`, and `old` (the flag's name before) as a hidden alias of it."""
    p.add_argument("--store", default=default, metavar="DIR", type=path_arg, help=help)
    if old:
        rename(p, old, "--store", "store")


def add_format(p: argparse.ArgumentParser, choices: tuple[str, ...] = TEXT_OR_JSON,
               help: str = "text: a table for people; json: one JSON document for scripts") -> None:
    assert "json" in choices, "every command that prints a result can print it as JSON"
    p.add_argument("--format", default=choices[0], choices=choices, help=help)
