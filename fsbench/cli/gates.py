"""`fsbench compare | gate | history | reference`: the regression gates' entry points
(fsbench.cli holds the rest and dispatches here through `COMMANDS`)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from fsbench.cli.args import add_format, add_store, path_arg, rename
from fsbench.errors import ConfigError
from fsbench.table import dumps, note, warn


def add_parsers(sub, csv: Callable, default_store: str) -> None:
    """The gates' sub-commands; `csv` parses a comma-separated flag (fsbench.cli's)."""
    p = sub.add_parser(
        "compare", help="BASE vs NEW runs: per metric change, interval, p, verdict (exit 1 regressed, 3 inconclusive)",
        description="Compare two sets of runs (each a run directory or a store of runs) per "
                    "workload, trainer and world size, on per-step samples: step time, "
                    "throughput, the bubble and its four causes, peak memory. Each effect is a "
                    "ratio of totals, as the summaries state them. Runs with one seed each on "
                    "both sides are paired (by block where they took turns under `fsbench gate`, "
                    "else by run, else by batches of steps) and tested by sign-flip "
                    "randomization over the paired units; other runs by relabelling units "
                    "between the sides; peak memory by a t-test on log values. A regression needs the p "
                    "(Holm-adjusted over metrics) below --alpha AND a change beyond the "
                    "threshold (relative for times and memory, percentage points for ratios) "
                    "AND an interval that excludes no change; unchanged needs the whole "
                    "interval within the threshold; anything else is inconclusive, with its "
                    "reason and what would settle it. Exit codes: 0 unchanged or improved, "
                    "1 regressed, 2 bad input, 3 inconclusive, 4 internal error (docs/ci.md).")
    p.add_argument("base", metavar="BASE", help="a run directory or a store of runs")
    p.add_argument("new", metavar="NEW", help="a run directory or a store of runs")
    _verdict_args(p)
    p.add_argument("--out", metavar="FILE", type=path_arg,
                   help="also write the output (in --format) to this file (never a store's own files)")

    p = sub.add_parser(
        "gate", help="run BASE and NEW code in interleaved pairs on this machine, then compare",
        description="Check BASE (and NEW, default: this checkout with its uncommitted changes) "
                    "out into git worktrees and run the same small sweep of each: per trainer "
                    "and seed both versions' runs start together and take turns a block of "
                    "steps at a time, which goes first decided by a seeded coin per block, so "
                    "the machine's drift hits both; then compare as `fsbench compare` does, "
                    "block k of BASE paired with block k of NEW. A BASE that predates turn-"
                    "taking falls back to whole runs in random order (far less sensitive; said "
                    "so). A pair in which a run was contended is moved to DIR/contended/ and run "
                    "again, up to --retries times; one still contended then makes its trainer's "
                    "every verdict inconclusive. Exit codes as "
                    "compare's: 0 unchanged, 1 regressed, 2 bad input, 3 inconclusive, 4 "
                    "internal error.")
    p.add_argument("--base", required=True, metavar="REV", help="the version to compare against")
    p.add_argument("--new", metavar="REV", help="default: this checkout, uncommitted changes included")
    _sweep_args(p, csv, "where both sides' runs go (DIR/base, DIR/new), beside compare.md, "
                        "compare.json and compare.junit.xml; default: runs/gate/<time>", old="--out")
    _verdict_args(p)

    p = sub.add_parser(
        "bisect", help="the first commit between GOOD and BAD that regressed, gate by gate",
        description="Gate BAD against GOOD; if it regressed, binary-search the commits between "
                    "them (git rev-list --ancestry-path GOOD..BAD), gating each against GOOD "
                    "with `fsbench gate`'s paired design, for the first one that regressed. An "
                    "inconclusive gate is run again with twice the pairs; if it stays "
                    "inconclusive the search stops and names the commits the first bad one "
                    "lies among. Every gate's runs stay in STORE/<n>-<sha>/. Exit codes: 0 "
                    "nothing regressed, 1 first bad commit found, 2 bad input, 3 inconclusive.")
    p.add_argument("good", metavar="GOOD", help="a commit known to be fast")
    p.add_argument("bad", metavar="BAD", help="a later commit known (or suspected) to be slow")
    _sweep_args(p, csv, "where every gate's runs go (STORE/<n>-<sha>/); default: runs/bisect/<time>")
    _verdict_args(p, table=False)

    p = sub.add_parser(
        "reference", help="deterministic gates: check (or refresh) results/reference/",
        description="Quantities that must never move without intent: the planners' loads on "
                    "fixed seeds (exact) and each trainer's losses on `tiny` at 2 ranks (exact "
                    "on the reference's torch and CPU instruction set, else within 1e-5). "
                    "`check` exits 1 naming what moved; `refresh` rewrites the references, "
                    "to commit with the change that moved them.")
    p.add_argument("action", choices=["check", "refresh"])
    p.add_argument("--only", type=csv(str), help="quantities (comma-separated); default: all")
    add_format(p)

    p = sub.add_parser(
        "history", help="stored runs in commit order, change points per metric (HTML + markdown)",
        description="Order the runs in --store by the commit they measured, find change "
                    "points per metric and (workload, trainer, world size) with ruptures (PELT), "
                    "and write a self-contained history.html with a plot per metric and the "
                    "change points marked, beside history.md.")
    add_store(p, "the store of runs to read", default=default_store)
    rename(p, "--runs", "--store", "store")
    p.add_argument("--out", default="history", metavar="DIR", type=path_arg,
                   help="the folder history.html and history.md go to")
    add_format(p, help="text: the change points as a table; json: every series and its "
                       "change points, one JSON document")


def _sweep_args(p: argparse.ArgumentParser, csv: Callable, store_help: str, old: str | None = None) -> None:
    """The gate's sweep: what `gate` and `bisect` run on each side."""
    from fsbench.gates import gate

    defaults = gate.Sweep()
    p.add_argument("--workload", default=defaults.workload, help="workload preset")
    p.add_argument("--trainers", type=csv(str), default=list(defaults.trainers), help="comma-separated")
    p.add_argument("--world-size", type=int, default=defaults.world_size, help="ranks per run")
    p.add_argument("--pairs", type=int, default=defaults.pairs,
                   help="A/B run pairs (seeds) per trainer")
    p.add_argument("--retries", type=int, default=gate.DEFAULT_RETRIES,
                   help="reruns of a pair with a contended run")
    p.add_argument("--block-steps", type=int, default=defaults.block_steps,
                   help="steps per turn when the versions take turns")
    p.add_argument("--steps", type=int, default=defaults.steps, help="steps per run")
    p.add_argument("--warmup", type=int, default=defaults.warmup, help="leading steps not measured")
    p.add_argument("--seed", type=int, default=0, help="order of each pair and data seeds")
    add_store(p, store_help, default=None, old=old)


def _verdict_args(p: argparse.ArgumentParser, table: bool = True) -> None:
    """What `compare`, `gate` and `bisect` share: output format and the verdict's settings
    (`table`: the command prints compare's table, in md, json or junit)."""
    if table:
        add_format(p, ("md", "json", "junit"),
                   help="md: a summary line, then the verdict table (markdown, for a review "
                        "comment); json: one JSON document; junit: JUnit XML (a test case per key "
                        "and metric: regressed fails, inconclusive is skipped with its reason)")
        p.add_argument("--only-changed", action="store_true",
                       help="md: leave unchanged rows out of the table (the summary line still "
                            "counts them; json and junit keep every row)")
    else:
        add_format(p, ("md", "json"), help="md: the verdict and every gate, as markdown; json: "
                                           "one JSON document")
    p.add_argument("--alpha", type=float, default=None, help="significance level; default: 0.01")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="per kind (time, memory: relative; ratio: absolute) or per metric, "
                        "e.g. time=0.05, bubble_ratio=0.03; defaults: time=0.05 memory=0.05 ratio=0.02")
    p.add_argument("--allow-cross-machine", action="store_true",
                   help="compare runs from different machines (host, CPU, cores, accelerator "
                        "or torch differ) instead of calling them inconclusive; noted in the output")


def _verdict_settings(args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    from fsbench.gates import compare

    alpha = compare.DEFAULT_ALPHA if args.alpha is None else args.alpha
    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha={alpha} must be between 0 and 1")
    return alpha, compare.parse_thresholds(args.threshold)


def cmd_compare(args: argparse.Namespace) -> int:
    from fsbench.gates import compare
    from fsbench.gates import compare_output
    from fsbench.gates import compare_sides

    alpha, thresholds = _verdict_settings(args)
    if args.out:
        from fsbench.running.output_paths import check_output_file

        check_output_file(args.out, "--out")
    base, new = compare_sides.load_side(args.base), compare_sides.load_side(args.new)
    shared = set(base["run_dir"].map(_real)) & set(new["run_dir"].map(_real))
    if shared:  # a run against itself tells nothing: every change would read zero
        raise ConfigError(f"BASE and NEW share {len(shared)} of their runs (e.g. {min(shared)}); "
                          "compare two different sets of runs")
    rows, notes = compare.compare(base, new, alpha, thresholds, args.allow_cross_machine)
    text = compare_output.render(rows, notes, args.format, args.only_changed)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return compare.exit_code(rows)


def _real(path: str) -> str:
    return str(Path(path).resolve())


def _sweep_of(args: argparse.Namespace):
    """The gate's sweep from `gate`'s and `bisect`'s shared flags, checked."""
    from fsbench.gates import gate
    from fsbench.training.trainer import TRAINERS

    # One pair is a valid gate (its steps, paired block by block, are the units); whether
    # a design can reach alpha is compare's to say (inconclusive when it cannot).
    if args.pairs < 1:
        raise ConfigError(f"--pairs={args.pairs} must be >= 1")
    if args.retries < 0:
        raise ConfigError(f"--retries={args.retries} must be >= 0")
    if args.block_steps < 1:
        raise ConfigError(f"--block-steps={args.block_steps} must be >= 1")
    if not 0 <= args.warmup < args.steps:
        raise ConfigError(f"--warmup={args.warmup} must be >= 0 and < --steps={args.steps}")
    for t in args.trainers:
        if ":" not in t and t not in TRAINERS:
            raise ConfigError(f"--trainers: {t!r} is unknown; choose from: {', '.join(TRAINERS)}")
    return gate.Sweep(args.workload, tuple(args.trainers), args.world_size, args.steps,
                      args.warmup, args.pairs, args.seed, args.block_steps)


def _store_of(args: argparse.Namespace, command: str) -> Path:
    import datetime

    from fsbench.running.output_paths import check_writable_dir

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return check_writable_dir(Path(args.store or f"runs/{command}/{stamp}").resolve(), "--store")


def cmd_gate(args: argparse.Namespace) -> int:
    from fsbench.gates import compare
    from fsbench.gates import compare_output
    from fsbench.gates import gate
    from fsbench.table import progress

    alpha, thresholds = _verdict_settings(args)
    sweep = _sweep_of(args)
    root = gate.repo_root()
    base_sha = gate.resolve_rev(root, args.base, "--base")
    new_sha = gate.resolve_rev(root, args.new, "--new") if args.new else None
    out = _store_of(args, "gate")
    # The comparison reads every run under base/ and new/: an earlier gate's runs there
    # (another commit's, another day's) would be compared as this one's.
    held = [side for side in ("base", "new") if (out / side).is_dir() and any((out / side).iterdir())]
    if held:
        raise ConfigError(f"--store {out} already holds a gate's runs ({', '.join(held)}/), which "
                          "would be compared with this one's: give a new directory")
    verdict = gate.run_gate(root, base_sha, new_sha, sweep, out, args.retries, alpha, thresholds,
                            args.allow_cross_machine,
                            progress=lambda it: progress(it, "gate run pairs", "pair"))
    print(compare_output.render(verdict.rows, verdict.notes, args.format, args.only_changed, "fsbench gate"))
    if not verdict.paced:
        warn("gate: one version predates turn-taking (fsbench/running/pacing.py), so the versions ran "
             "one after the other: the machine's drift between runs counts as change (the design "
             "line says how the steps were paired)")
    note(f"gate runs and comparison in {out}")
    return compare.exit_code(verdict.rows)


def cmd_bisect(args: argparse.Namespace) -> int:
    import dataclasses
    import itertools

    from fsbench.gates import bisect
    from fsbench.gates import compare
    from fsbench.gates import compare_output
    from fsbench.gates import gate

    alpha, thresholds = _verdict_settings(args)
    sweep = _sweep_of(args)
    root = gate.repo_root("bisect")
    good = gate.resolve_rev(root, args.good, "GOOD")
    bad = gate.resolve_rev(root, args.bad, "BAD")
    commits = bisect.commits_between(root, good, bad)
    out = _store_of(args, "bisect")
    gates = itertools.count(1)  # numbers each gate's folder, reruns included

    def judge(sha: str) -> bisect.Step:
        pairs, earlier = sweep.pairs, []
        while True:
            where = out / f"{next(gates):02d}-{sha[:12]}"
            where.mkdir()
            note(f"bisect: gating {sha[:12]} against GOOD {good[:12]} ({pairs} pairs) in {where}")
            verdict = gate.run_gate(root, good, sha, dataclasses.replace(sweep, pairs=pairs), where,
                                    args.retries, alpha, thresholds, args.allow_cross_machine,
                                    name="fsbench bisect")
            outcome, summary = compare.outcome(verdict.rows), compare_output.summary_line(verdict.rows)
            if outcome != "inconclusive" or pairs > sweep.pairs:
                return bisect.Step(sha, bisect.subject(root, sha), outcome, summary, str(where),
                                   pairs, earlier)
            earlier.append((pairs, summary, str(where)))
            pairs *= 2  # once more, with twice the units

    found = bisect.search(commits, judge)
    text = bisect.report(found, good)
    (out / "bisect.md").write_text(text)
    if args.format == "json":
        print(dumps({"outcome": found.outcome, "first_bad": found.first_bad,
                     "candidates": found.candidates, "good": good, "bad": bad,
                     "steps": [dataclasses.asdict(s) for s in found.steps], "store": str(out)}))
    else:
        print(text)
    note(f"bisect runs in {out}")
    return {"unchanged": 0, "regressed": 1, "inconclusive": 3}[found.outcome]


def cmd_reference(args: argparse.Namespace) -> int:
    from fsbench.gates import reference

    names = args.only or list(reference.QUANTITIES)
    unknown = [n for n in names if n not in reference.QUANTITIES]
    if unknown:
        raise ConfigError(f"--only {','.join(unknown)}: unknown; choose from: "
                          f"{', '.join(reference.QUANTITIES)}")
    if args.action == "refresh":
        written = reference.refresh(names)
        print(dumps({"action": "refresh", "written": written}) if args.format == "json"
              else "\n".join(f"wrote {path}" for path in written))
        return 0
    moved, notes = reference.check(names)
    if args.format == "json":
        print(dumps({"action": "check", "quantities": names, "moved": moved, "notes": notes,
                     "ok": not moved}))
        return 1 if moved else 0
    for line in notes:
        print(f"note: {line}")
    for line in moved:
        print(f"moved: {line}")
    print(f"reference check: {len(moved)} value(s) moved in {', '.join(names)}"
          + ("" if moved else " (all exact)" if not notes else ""))
    return 1 if moved else 0


def cmd_history(args: argparse.Namespace) -> int:
    from fsbench.gates import history
    from fsbench.running.output_paths import check_writable_dir

    runs = history.load(args.store)
    out = check_writable_dir(args.out)
    items = history.history(runs)
    page, summary = history.write(items, out)
    print(dumps({"items": items, "written": [page, summary]}) if args.format == "json"
          else history.table(items))
    note(f"wrote {page} and {summary}")
    return 0


COMMANDS = {"compare": cmd_compare, "gate": cmd_gate, "bisect": cmd_bisect,
            "reference": cmd_reference, "history": cmd_history}
