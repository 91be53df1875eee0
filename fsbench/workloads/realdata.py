"""Real interaction histories as global batches, in the synthetic batches' format.

Three on-disk formats are read, each into the same `Histories` (per user the
chronological item list, ids remapped to 1..V):

    sasrec:PATH   `user item` per line, whitespace separated, already chronological per
                  user (the files SASRec ships)
    recbole:PATH  a RecBole atomic `.inter` TSV; the header names `user_id:token` and
                  `item_id:token`, and `timestamp:float` when present sets the order
    otto:PATH     OTTO jsonl, one session a line: {"session": s, "events": [{"aid": a,
                  "ts": t, "type": ...}, ...]}; every event type counts as an interaction

Batches stay a pure function of (seed, step), like the synthetic ones, so every rank can
build the global batch itself. With `held_out` items (a run's `--eval`) they are drawn from
the histories without each user's last item or two, which `fsbench.training.evaluate` holds
out to validate and test on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from fsbench.config import WorkloadConfig
from fsbench.errors import ConfigError
from fsbench.specs import DATA_KINDS, DataSpec, parse_data
from fsbench.workloads.batch import JaggedBatch
from fsbench.workloads.generator import step_rng

__all__ = ["DATA_KINDS", "DataSpec", "Histories", "RealDataBatches", "context_ids_for_users", "shown_users",
           "epoch_windows", "histories_from_events", "load_histories", "pack_windows",
           "parse_data_spec", "recent_windows"]


def parse_data_spec(spec: str) -> DataSpec:
    """The data source a `data=` spec names; ConfigError (one line) if bad. Only checks
    that the file exists: reading it is load_histories' job."""
    return parse_data(spec)


@dataclass(frozen=True, eq=False)
class Histories:
    """All users' histories packed end to end. User u (ids are 1..num_users) owns
    items[offsets[u-1]:offsets[u]], oldest first; item ids are 1..num_items."""
    items: np.ndarray
    offsets: np.ndarray
    num_items: int

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def history(self, user_id: int) -> np.ndarray:
        return self.items[self.offsets[user_id - 1]:self.offsets[user_id]]

    def without_last(self, k: int = 1) -> "Histories":
        """The same users and item ids with each user's last (most recent) k items
        removed (all of a shorter history's): what a model trains on when they are held
        out for evaluation. The item count stays that of the full data (a held-out item is
        still a candidate)."""
        lengths = self.lengths
        kept = lengths - np.minimum(lengths, k)
        pos = (np.repeat(self.offsets[:-1] - np.cumsum(kept) + kept, kept)
               + np.arange(int(kept.sum())))
        return Histories(items=self.items[pos],
                         offsets=np.concatenate([[0], np.cumsum(kept)]).astype(np.int64),
                         num_items=self.num_items)


def histories_from_events(users: np.ndarray, items: np.ndarray,
                          times: np.ndarray | None = None) -> Histories:
    """Group interaction events by user, oldest first (ties, or no times: file order),
    and remap user and item keys to contiguous ids in sorted key order."""
    if len(users) == 0:
        raise ValueError("no interactions (the file is empty or holds only its header)")
    user_keys, user_idx = np.unique(users, return_inverse=True)
    item_keys, item_idx = np.unique(items, return_inverse=True)
    # lexsort and a stable argsort both keep file order among equal keys.
    order = (np.argsort(user_idx, kind="stable") if times is None
             else np.lexsort((times, user_idx)))
    counts = np.bincount(user_idx, minlength=len(user_keys))
    return Histories(items=item_idx[order].astype(np.int64) + 1,
                     offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                     num_items=len(item_keys))


def _read_sasrec(f) -> Histories:
    users, items = [], []
    for line_no, line in enumerate(f, start=1):
        fields = line.split()
        if not fields:
            continue
        try:
            if len(fields) != 2:
                raise ValueError
            users.append(int(fields[0]))
            items.append(int(fields[1]))
        except ValueError:
            raise ValueError(f"line {line_no}: expected 'user item' (two integers), "
                             f"got {line.strip()[:80]!r}") from None
    return histories_from_events(np.asarray(users), np.asarray(items))


def _read_recbole(f) -> Histories:
    header = f.readline().rstrip("\r\n")
    names = [h.split(":")[0].strip() for h in header.split("\t")]
    if "user_id" not in names or "item_id" not in names:
        raise ValueError(f"the header {header[:80]!r} lacks the user_id:token and item_id:token "
                         "columns (tab-separated; timestamp:float optional)")
    u_col, i_col = names.index("user_id"), names.index("item_id")
    t_col = names.index("timestamp") if "timestamp" in names else None
    users, items, times = [], [], []
    for line_no, line in enumerate(f, start=2):
        row = line.rstrip("\r\n").split("\t")
        if row == [""]:
            continue
        if len(row) != len(names):
            raise ValueError(f"line {line_no}: expected {len(names)} tab-separated fields "
                             f"matching the header, got {len(row)}: {line.strip()[:80]!r}")
        users.append(row[u_col])
        items.append(row[i_col])
        if t_col is not None:
            try:
                times.append(float(row[t_col]))
            except ValueError:
                raise ValueError(f"line {line_no}: timestamp {row[t_col][:40]!r} is not a "
                                 "number") from None
    return histories_from_events(np.asarray(users), np.asarray(items),
                                 None if t_col is None else np.asarray(times))


def _read_otto(f) -> Histories:
    users, items, times = [], [], []
    for line_no, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            session = int(obj["session"])
            for event in obj["events"]:
                users.append(session)
                items.append(int(event["aid"]))
                times.append(int(event["ts"]))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"line {line_no}: expected {{\"session\": int, \"events\": "
                             "[{\"aid\": int, \"ts\": int, ...}]}") from None
    return histories_from_events(np.asarray(users), np.asarray(items), np.asarray(times))


_READERS = {"sasrec": _read_sasrec, "recbole": _read_recbole, "otto": _read_otto}


def load_histories(spec: DataSpec | str) -> Histories:
    """Read a real dataset; ConfigError naming the file and line if it cannot be used."""
    if isinstance(spec, str):
        spec = parse_data_spec(spec)
    if spec.kind not in _READERS:
        raise ConfigError(f"data={str(spec)!r} has no histories to load; allowed here: "
                          + ", ".join(f"{kind}:PATH" for kind in DATA_KINDS))
    try:
        with open(spec.path, encoding="utf-8") as f:
            return _READERS[spec.kind](f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"data={str(spec)!r}: cannot read {spec.path}: {e}") from None


_GOLDEN64 = 0x9E3779B97F4A7C15


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: scrambles uint64 keys (multiplication wraps mod 2^64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


ANONYMOUS_USER = 1
"""The user id every sample shows with `model.user_features=false`."""


def shown_users(users: np.ndarray, user_features: bool) -> np.ndarray:
    """The user ids the model sees: the real ones, or the anonymous user for all."""
    return users.astype(np.int64) if user_features else np.full(len(users), ANONYMOUS_USER, np.int64)


def context_ids_for_users(user_ids: np.ndarray, context_vocabs: tuple[int, ...]) -> np.ndarray:
    """(B, C) context ids, a fixed hash of (user id, table) into [1, vocab-1]: a user's
    context is the same in every batch, like a real profile feature."""
    out = np.empty((len(user_ids), len(context_vocabs)), dtype=np.int64)
    keys = user_ids.astype(np.uint64)
    for c, vocab in enumerate(context_vocabs):
        h = _mix64(keys + np.uint64((c + 1) * _GOLDEN64 % 2**64))
        out[:, c] = (h % np.uint64(vocab - 1)).astype(np.int64) + 1
    return out


def recent_windows(h: Histories, users: np.ndarray,
                   max_seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item_ids, targets, lengths) of each user's most recent `max_seq_len + 1` items,
    packed: inputs and their next items, shifted by one. Every user needs >= 2 items."""
    ends = h.offsets[users]
    return pack_windows(h.items, np.maximum(h.offsets[users - 1], ends - (max_seq_len + 1)), ends)


def pack_windows(items: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 trained: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item_ids, targets, lengths) of the windows items[starts:ends] (each >= 2 items),
    packed: every item but the last an input, its next item its target. With `trained`
    > 0 only each window's last `trained` targets are kept; the others are 0 (padding,
    no target: the loss skips them) and serve as context."""
    lengths = ends - starts - 1
    # positions of each window's inputs in items; its targets sit one further on
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = np.repeat(starts, lengths) + within
    targets = items[pos + 1]
    if trained:  # the first lengths - trained positions of each window are context
        targets = np.where(within < np.repeat(lengths - trained, lengths), 0, targets)
    return items[pos], targets, lengths.astype(np.int64)


def epoch_windows(h: Histories, max_seq_len: int,
                  trained: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(users, starts, ends) of windows that hold every target of every history exactly
    once: from each history's end backwards, `trained` targets a window (0: max_seq_len),
    each window up to max_seq_len inputs; with trained < max_seq_len the windows overlap
    and only their last `trained` targets count (pack_windows)."""
    step = trained or max_seq_len
    lengths = h.lengths
    per_user = np.where(lengths >= 2, -(-(lengths - 1) // step), 0)
    users = np.repeat(np.arange(1, h.num_users + 1), per_user)
    j = np.arange(int(per_user.sum())) - np.repeat(np.cumsum(per_user) - per_user, per_user)
    ends = h.offsets[users] - j * step
    starts = np.maximum(h.offsets[users - 1], ends - (max_seq_len + 1))
    return users, starts, ends


class RealDataBatches:
    """Global batches of real users' windows, inputs and targets shifted by one, drawn
    from the histories without each user's last `held_out` items (held out for
    evaluation: never a training input or target).

    `workload.data_order`: `recent` draws users per step (seeded), each sample a user's
    most recent `max_seq_len + 1` items; `epochs` covers every training target once per
    epoch (`epoch_windows`, shuffled per epoch, the last partial batch of an epoch
    dropped so every step has the same global batch size: `steps_per_epoch`).

    Negatives (`model.loss`): `sampled` draws `num_negatives` item ids uniformly from
    1..V, so the sampled softmax's logit learns log p(item | history) up to a constant
    (popularity-drawn negatives would teach log p - log q); `full` takes every item id as
    a negative: the softmax over all items."""

    def __init__(self, workload: WorkloadConfig, seed: int, histories: Histories,
                 held_out: int = 0) -> None:
        for what, have, key, vocab in (("items", histories.num_items, "item_vocab",
                                        workload.item_vocab),
                                       ("users", histories.num_users if workload.model.user_features
                                        else ANONYMOUS_USER, "user_vocab", workload.user_vocab)):
            if have > vocab - 1:
                raise ConfigError(f"data={workload.data!r} has {have} {what} but "
                                  f"{key}={vocab} holds only {vocab - 1} (id 0 is padding); "
                                  f"use --set {key}={have + 1}")
        self.workload = workload
        self.seed = seed
        self.held_out = held_out
        histories = histories.without_last(held_out) if held_out else histories
        self.histories = histories  # what is trained on
        self.eligible = np.flatnonzero(histories.lengths >= 2) + 1  # user ids
        if len(self.eligible) == 0:
            held = f" besides the {held_out} held out for evaluation" if held_out else ""
            raise ConfigError(f"data={workload.data!r}: no user has the 2 interactions{held} "
                              "a sample needs (one input, one target)")
        self.windows = (epoch_windows(histories, workload.max_seq_len, workload.window_targets)
                        if workload.data_order == "epochs" else None)
        if self.windows is not None and self.steps_per_epoch == 0:
            raise ConfigError(f"data_order=epochs: {len(self.windows[0])} training windows hold "
                              f"no global batch of {workload.global_batch_size}; lower "
                              "global_batch_size")

    @property
    def steps_per_epoch(self) -> int:
        """data_order=epochs: full global batches per pass over the training targets."""
        return len(self.windows[0]) // self.workload.global_batch_size if self.windows else 0

    def global_batch(self, step: int) -> JaggedBatch:
        w, h = self.workload, self.histories
        rng = step_rng(self.seed, step)
        if self.windows is None:
            # Distinct users when there are enough of them; small datasets repeat users.
            users = rng.choice(self.eligible, w.global_batch_size,
                               replace=w.global_batch_size > len(self.eligible))
            item_ids, targets, lengths = recent_windows(h, users, w.max_seq_len)
        else:
            # Each epoch its own shuffle (a stream apart from the steps' own draws).
            epoch, k = divmod(step, self.steps_per_epoch)
            order = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, 0x3E9]))
            pick = order.permutation(len(self.windows[0]))[k * w.global_batch_size:
                                                           (k + 1) * w.global_batch_size]
            users, starts, ends = (a[pick] for a in self.windows)
            item_ids, targets, lengths = pack_windows(h.items, starts, ends, w.window_targets)
        if w.model.loss == "full":
            negatives = np.arange(1, h.num_items + 1, dtype=np.int64)
        else:
            negatives = rng.integers(1, h.num_items + 1, w.num_negatives, dtype=np.int64)
        shown = shown_users(users, w.model.user_features)
        return JaggedBatch(
            item_ids=torch.from_numpy(item_ids),
            targets=torch.from_numpy(targets),
            lengths=torch.from_numpy(lengths),
            user_ids=torch.from_numpy(shown),
            context_ids=torch.from_numpy(context_ids_for_users(shown, w.context_vocabs)),
            negative_ids=torch.from_numpy(negatives),
            global_num_targets=int(np.count_nonzero(targets)),
            step=step,
        )
