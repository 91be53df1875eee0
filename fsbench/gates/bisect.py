"""`fsbench bisect GOOD BAD`: the first commit between GOOD and BAD that regressed, found
with the paired gate (fsbench.gates.gate) at each step.

Every step gates a commit against GOOD, the known-good baseline, not against its
neighbour: "is this commit already slower than GOOD?" is what a binary search needs, and
a slowdown spread over several small commits still shows against GOOD. BAD is gated first:
if it did not regress against GOOD there is nothing to find. Then a binary search over
`git rev-list --ancestry-path GOOD..BAD`: about log2(commits) more gates. An inconclusive
gate is run again with twice the pairs; if it stays inconclusive the search stops there
and names the commits the first bad one lies among, with the evidence so far. Every
gate's runs and comparison stay in STORE/<n>-<sha>/ (compare.md, .json, .junit.xml).
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fsbench.errors import ConfigError


@dataclass
class Step:
    """One gate of the search: `sha` against GOOD."""
    sha: str
    subject: str
    outcome: str        # regressed | unchanged | inconclusive (after its rerun)
    summary: str        # the gate's summary line (fsbench.gates.compare_output)
    store: str
    pairs: int
    # Tries before this one that could not tell (inconclusive, then rerun with twice the
    # pairs): (pairs, summary line, store) each, reported beside it.
    earlier: list[tuple[int, str, str]] = field(default_factory=list)


@dataclass
class Found:
    """The search's result: `first_bad` (a sha) when found; else, for an inconclusive
    search, `candidates` (the commits the first bad one lies among); `nothing` when BAD
    did not regress against GOOD."""
    steps: list[Step] = field(default_factory=list)
    first_bad: str | None = None
    candidates: list[str] = field(default_factory=list)
    nothing: bool = False

    @property
    def outcome(self) -> str:
        return ("unchanged" if self.nothing else "regressed" if self.first_bad
                else "inconclusive")


def commits_between(root: Path, good: str, bad: str) -> list[str]:
    """The commits after GOOD up to BAD (BAD last) on the ancestry path between them."""
    if subprocess.run(["git", "merge-base", "--is-ancestor", good, bad], cwd=root).returncode:
        raise ConfigError(f"GOOD {good[:12]} is not an ancestor of BAD {bad[:12]}: nothing to bisect")
    out = subprocess.run(["git", "rev-list", "--ancestry-path", "--reverse", f"{good}..{bad}"],
                         cwd=root, capture_output=True, text=True, check=True).stdout.split()
    if not out:
        raise ConfigError("GOOD and BAD are the same commit: nothing to bisect")
    return out


def search(commits: list[str], judge: Callable[[str], Step]) -> Found:
    """Binary search for the first commit `judge` calls regressed, BAD (the last) first.
    `judge(sha)` gates one commit against GOOD (rerunning an inconclusive gate itself)."""
    found = Found()
    last = judge(commits[-1])
    found.steps.append(last)
    if last.outcome == "unchanged":
        found.nothing = True
        return found
    if last.outcome == "inconclusive":
        found.candidates = list(commits)
        return found
    lo, hi = -1, len(commits) - 1  # commits[hi] regressed; commits[lo] (GOOD at -1) did not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        step = judge(commits[mid])
        found.steps.append(step)
        if step.outcome == "regressed":
            hi = mid
        elif step.outcome == "unchanged":
            lo = mid
        else:
            found.candidates = commits[lo + 1:hi + 1]
            return found
    found.first_bad = commits[hi]
    return found


def subject(root: Path, sha: str) -> str:
    return subprocess.run(["git", "log", "-1", "--format=%s", sha], cwd=root, capture_output=True,
                          text=True).stdout.strip()


def report(found: Found, good: str) -> str:
    """Markdown: the verdict line, then every step's gate."""
    from fsbench.table import grid

    if found.nothing:
        head = f"fsbench bisect: **nothing regressed**: BAD is not slower than GOOD {good[:12]} (exit 0)"
    elif found.first_bad:
        evidence = next(s for s in found.steps if s.sha == found.first_bad)
        head = (f"fsbench bisect: **first bad commit {found.first_bad[:12]}** ({evidence.subject}), "
                f"after {len(found.steps)} gates against GOOD {good[:12]} (exit 1)")
    else:
        head = (f"fsbench bisect: **inconclusive** (exit 3): the first bad commit is one of "
                f"{', '.join(c[:12] for c in found.candidates)}; a gate could not tell, even "
                "with twice the pairs (its reasons are in its compare.md)")
    rows = []
    for s in found.steps:
        rows += [[s.sha[:12], s.subject[:60], "inconclusive, rerun", str(pairs), summary, store]
                 for pairs, summary, store in s.earlier]
        rows.append([s.sha[:12], s.subject[:60], s.outcome, str(s.pairs), s.summary, s.store])
    table = grid(["commit", "subject", "vs GOOD", "pairs", "gate's summary", "runs"], rows,
                 align=["left", "left", "left", "right", "left", "left"])
    return f"{head}\n\n{table}\n"
