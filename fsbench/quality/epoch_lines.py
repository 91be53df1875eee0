"""A line per epoch of a long `fsbench quality` run, on stderr, where no one watches a
progress bar (a CI log, a file): without it a 25-minute run printed one line.

The ranks write their log to the run directory, not to the command's stderr, so a thread
of the command reads the run's `eval.json` (rank 0 rewrites it, atomically, after every
evaluation) and prints what is new."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path


class EpochLines:
    """`with EpochLines(store, label, max_epochs):` around one run: prints each new
    evaluation of the newest run directory in `store` created since it started."""

    def __init__(self, store: str | Path, label: str, max_epochs: int, every_s: float = 2.0,
                 stream=None) -> None:
        self.store, self.label, self.max_epochs, self.every_s = Path(store), label, max_epochs, every_s
        self.stream = stream or sys.stderr
        self.printed = 0
        self.best = (-1.0, 0)
        self.said_stop = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="fsbench-epoch-lines")

    def __enter__(self) -> EpochLines:
        self.started = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # the last evaluations, written as the run ended

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.poll()

    def _run_dir(self) -> Path | None:
        try:
            fresh = [p for p in self.store.iterdir()
                     if p.is_dir() and p.stat().st_mtime >= self.started - 1 and (p / "manifest.json").exists()]
        except OSError:
            return None
        return max(fresh, key=lambda p: p.stat().st_mtime, default=None)

    def poll(self) -> None:
        run_dir = self._run_dir()
        if run_dir is None:
            return
        try:
            doc = json.loads((run_dir / "eval.json").read_text())
        except (OSError, ValueError):  # not written yet
            return
        for epoch, e in enumerate(doc.get("evaluations", [])[self.printed:], self.printed + 1):
            valid = e.get("valid_ndcg_at_10")
            if valid is not None and valid > self.best[0]:
                self.best = (valid, epoch)
            line = (f"quality: {self.label}: epoch {epoch} (at most {self.max_epochs}): test HR@10 "
                    f"{e['hr_at_10']:.4f}, NDCG@10 {e['ndcg_at_10']:.4f}")
            if valid is not None:
                line += f"; valid NDCG@10 {valid:.4f} (best {self.best[0]:.4f} at epoch {self.best[1]})"
            print(line, file=self.stream, flush=True)
            self.printed = epoch
        if doc.get("stopped_at_step") is not None and self.printed and not self.said_stop:
            self.said_stop = True
            print(f"quality: {self.label}: stopped early after epoch {self.printed}: no better validation "
                  f"NDCG@10 in {doc.get('patience')} epochs", file=self.stream, flush=True)
