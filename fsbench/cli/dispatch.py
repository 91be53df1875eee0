"""`fsbench`: the entry point. It builds the parser from the command groups and runs one
command: fsbench.cli.runs (run, summarize, sweep, validate, overhead, micro: what starts
runs), .results (trace, report, list), .gates (compare, gate, history, reference),
.scaling (simulate, calibrate), .quality (quality).

Exit codes, the same for every command (docs/ci.md): 0 success (a gate: unchanged or
improved); 1 a regression, or a failed rank (with the rank's error); 2 bad input (unknown
workload or trainer, a bad --set key or value, an unreadable file: one line naming what is
wrong and what is allowed); 3 inconclusive (a gate that cannot tell, with why); 4 an
internal error (one line; the traceback with --debug, else in a log file it names);
130 Ctrl-C, with the interrupted run kept on disk and marked so; 143 SIGTERM (129
SIGHUP), which stop it as Ctrl-C does.
"""
from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading

from fsbench.cli import cluster, gates, micro, quality, results, runs, scaling
from fsbench.cli.args import DEFAULT_STORE, Parser
from fsbench.config import ConfigError
from fsbench.errors import Terminated
from fsbench.table import set_quiet


def _csv(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return parse


# The README's first command, shown when `fsbench` runs with no command.
FIRST_COMMAND = "make run   (or: fsbench sweep --workload small --trainers ddp,torchrec,deepspeed,freescale --world-sizes 1,2)"


def version_line() -> str:
    """fsbench's version and the git commit of the checkout it runs from."""
    from importlib.metadata import PackageNotFoundError, version

    from fsbench.running.store import git_sha

    try:
        v = version("fsbench")
    except PackageNotFoundError:
        v = "unknown (not installed)"
    return f"fsbench {v} (git {git_sha() or 'unknown: not a git checkout'})"


class _Version(argparse.Action):
    """--version, computed only when asked for (it runs git)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fsbench",
        description="Benchmark distributed training of sequence-recommendation models: "
                    "bubbles, throughput and SM occupancy, per trainer and world size. "
                    "Results go to stdout (a table, or one JSON document with --format json); "
                    "notes and progress to stderr.")
    parser.add_argument("--version", action=_Version,
                        help="print fsbench's version and the git commit it runs from")
    parser.add_argument("--debug", action="store_true",
                        help="on an internal error, print the traceback (else it goes to a log file)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no notes and no progress bars on stderr (results, warnings and "
                             "errors still print); give it before the command: fsbench -q sweep ...")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    runs.add_parsers(sub, _csv)
    micro.add_parsers(sub)
    results.add_parsers(sub, _csv, DEFAULT_STORE)
    gates.add_parsers(sub, _csv, DEFAULT_STORE)
    scaling.add_parsers(sub, _csv, DEFAULT_STORE)
    cluster.add_parsers(sub, _csv, DEFAULT_STORE)
    quality.add_parsers(sub, _csv)

    return parser


COMMANDS = {**runs.COMMANDS, **micro.COMMANDS, **results.COMMANDS, **scaling.COMMANDS,
            **cluster.COMMANDS,
            **gates.COMMANDS, **quality.COMMANDS}


def main(argv: list[str] | None = None) -> int:
    """`fsbench ...`: the command's exit code (docs/ci.md)."""
    before = on_termination(_terminated)
    try:
        try:
            return dispatch(argv)
        finally:
            # Output may still sit in stdout's buffer (help text included): flushed here, a
            # reader that left (`fsbench list | head -1`) shows up inside this try, not as
            # a traceback at interpreter exit.
            sys.stdout.flush()
    except BrokenPipeError:  # the reader left; nothing is wrong
        stdout_to_devnull()
        return 0
    finally:
        on_termination(before)


# SIGTERM (a CI job cancelled, `kill`, systemd, a container stopped) and SIGHUP (the
# terminal closed) stop fsbench as Ctrl-C does; by default they would end it on the spot,
# its runs left `running` and its ranks to die on their own.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def _terminated(signum: int, frame) -> None:
    raise Terminated(signum)


def on_termination(handler) -> dict:
    """Install `handler` (a function, or {signal: handler} as returned) for TERMINATING;
    returns the handlers it replaced. Only the main thread may install handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    handlers = handler if isinstance(handler, dict) else dict.fromkeys(TERMINATING, handler)
    return {sig: signal.signal(sig, h) for sig, h in handlers.items()}


def dispatch(argv: list[str] | None) -> int:
    from fsbench.running.launch.local import RankFailed

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except ConfigError as e:  # a usage error: one line, as any bad input
        print(f"fsbench: error: {e}", file=sys.stderr)
        return 2
    set_quiet(args.quiet)
    # The command line as given, for outputs that say what made them (the report's header).
    args.command_line = "fsbench " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.command is None:  # a new user's first try: what to do, not just "required"
        parser.print_help()
        print(f"\nStart with: {FIRST_COMMAND}")
        return 0
    try:
        if getattr(args, "world_size", None) is not None and args.world_size < 1:
            raise ConfigError(f"--world-size={args.world_size} must be >= 1")
        if any(n < 1 for n in getattr(args, "world_sizes", [1])):
            raise ConfigError(f"--world-sizes={args.world_sizes}: every world size must be >= 1")
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # for main: not an internal error
        raise
    except ConfigError as e:
        print(f"fsbench: error: {e}", file=sys.stderr)
        return 2
    except RankFailed as e:
        print(f"fsbench: run failed: {e}", file=sys.stderr)
        return 1
    except Terminated as e:
        print(f"fsbench: stopped by {signal.Signals(e.signum).name}; the run directory is kept "
              "and marked 'interrupted'", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("fsbench: interrupted; the run directory is kept and marked 'interrupted'",
              file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not the user's input: never exit 1, the regression code
        return internal_error(e, args.debug)


def stdout_to_devnull() -> None:
    """After a closed pipe: what is left in stdout's buffer goes nowhere, so that Python's
    flush at exit does not fail again (and print a second traceback)."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # no file behind stdout (replaced in tests)
        pass


def internal_error(error: Exception, debug: bool) -> int:
    """Exit 4 with one line; the traceback on stderr with --debug, else in a log file."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(error))
    if debug:
        print(text, file=sys.stderr, end="")
        where = "above"
    else:
        fd, where = tempfile.mkstemp(prefix="fsbench-error-", suffix=".log")
        with open(fd, "w") as f:
            f.write(text)
    print(f"fsbench: internal error: {type(error).__name__}: {str(error)[:200]} "
          f"(traceback {where}; please report it)", file=sys.stderr)
    return 4


if __name__ == "__main__":
    sys.exit(main())
