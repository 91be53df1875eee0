"""Quality beside speed: HR@10 and NDCG@10 of a trained model, the same for every trainer.

With evaluation on (`fsbench run --eval`, real data only) the protocol is leave-one-out,
as SASRec and RecBole evaluate sequential recommenders:

- **Held out**: each user's last (most recent) interaction. Training batches are drawn from
  the histories without it (`RealDataBatches(held_out=1)`), identical for every trainer;
  it is never a training input or target. With `eval.split=valid_test` (RecBole's
  `valid_and_test`, what `fsbench quality` uses) the second-to-last is held out too and
  scored as validation, its inputs the items before it (`held_out=2`).
- **Evaluated users**: every user with >= 2 interactions (at least one input before the
  held-out item). `eval_users` in the summary counts them.
- **Input**: the user's most recent `max_seq_len` items before the held-out one, with the
  user's context ids, exactly as a training sample of that window would be built.
- **Score** of item i: `<h, E[i]>`, with h the model's final hidden state at the user's last
  input position (`DenseArch.encode`) and E the item table: the logit the model's
  sampled-softmax loss gives a target or a negative.
- **Candidates**: every item id 1..V of the data set (V its number of distinct items): the
  full item set, not sampled negatives. Padding id 0 is excluded, and so are item-table rows
  beyond V (`item_vocab` may be larger; such rows hold no item and are never trained).
- **Already-seen items are NOT excluded.** Sequential interaction data repeats items (a
  user rates, buys or clicks an item again; OTTO sessions revisit aids), so the held-out
  item may be one the user has seen, and masking the history would make such a target
  unrankable. This is RecBole's full ranking for sequential models (it masks the history
  only for non-sequential recommenders); figures are therefore comparable to RecBole's
  sequential full-ranking HR/NDCG, and lower than papers that mask seen items or rank
  against 100 sampled negatives.
- **Rank** of the held-out item = the number of candidates scoring >= its score (itself
  included): ties count against it, so a model scoring every item alike gets rank V, not
  1. A NaN target score (a diverged model) ranks last.
- `HR@10 = mean(rank <= 10)`; `NDCG@10 = mean(1 / log2(rank + 1) if rank <= 10 else 0)`
  (one relevant item per user, so the ideal DCG is 1).
- **Popularity-boosted variant**, reported beside (`hr_at_10_logq`, `ndcg_at_10_logq`):
  every score plus `log q(i)`, q each item's training count plus one (an item seen only
  as a held-out one stays rankable). The loss learns `log p(i | history)` up to a
  constant (real data's negatives are uniform, or all items with `model.loss=full`:
  fsbench.workloads.realdata), so `hr_at_10`, the model's own logit with nothing added,
  is the primary figure and the one time to quality uses; the variant shows what a
  popularity prior adds. (Before the loss was corrected, negatives were drawn by
  popularity without correction, the logit learned `log p - log q`, and this variant
  was the one that ranked sensibly.)

Every trainer exposes its trained weights as one `fsbench.models.RecModel` on rank 0
(`trained_model()`: replicas copied, sharded tables gathered), and rank 0 scores it with
the reference code below, on the run's device. `Evaluator` runs this after the last step
and, with `eval.every=K`, after every K-th step: between steps, after the step's span has
ended and before the next step's barrier, so no step's time includes it.

Time to quality (`eval.target_hr10=X`, MLPerf's habit): `time_to_target_s` is the sum of
the step times T (fsbench.measurement.metrics) of every step trained up to and including the first
evaluation whose HR@10 reaches X, warm-up steps included (they train the model too);
None if no evaluation reached it. Evaluation time is in no step, hence not in it either.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fsbench.config import ConfigError, RunConfig
from fsbench.models.sparse import ITEM
from fsbench.files import write_json_atomic
from fsbench.workloads.batch import JaggedBatch
from fsbench.workloads.realdata import (Histories, context_ids_for_users, load_histories,
                                        recent_windows, shown_users)

K = 10
"""Cut-off of the reported metrics (the keys say it: hr_at_10, ndcg_at_10)."""
EVAL_FILE = "eval.json"
"""Rank 0's record of a run's evaluations, in the run directory (fsbench.measurement.run_summary
turns it into the summary's quality keys)."""
RANKS_FILE = "eval-ranks.npy"
"""The final evaluation's rank of each evaluated user's held-out item (int32, (2, U): the
plain then the popularity-boosted score; users in id order): paired comparisons of two
runs' quality, user by user."""
RANKS_DIR = "eval-ranks"
"""eval.split=valid_test: every evaluation's test ranks (RANKS_FILE's layout), as
`step-K.npy`: the evaluation early stopping selects, compared user by user."""


def hit_ndcg(ranks: np.ndarray, k: int = K) -> tuple[float, float]:
    """(HR@k, NDCG@k) of 1-based ranks of one relevant item per user."""
    hit, gain = per_user_hit_gain(ranks, k)
    return float(hit.mean()), float(gain.mean())


def per_user_hit_gain(ranks: np.ndarray, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """Each user's hit (1.0 if rank <= k) and NDCG gain (1 / log2(rank + 1) if rank <= k),
    of 1-based ranks of one relevant item per user: what HR@k and NDCG@k average."""
    ranks = np.asarray(ranks, dtype=np.int64)
    if ranks.size == 0 or (ranks < 1).any():
        raise ValueError(f"ranks must be a non-empty array of ranks >= 1, got {ranks!r}")
    hit = ranks <= k
    return hit.astype(float), np.where(hit, 1.0 / np.log2(ranks + 1.0), 0.0)


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(U,) 1-based rank of each row's target column among all columns of `scores` (U, V):
    the number of columns scoring >= the target (ties count against it; a NaN target
    score ranks last)."""
    target = scores.gather(1, targets.unsqueeze(1))
    ranks = (scores >= target).sum(dim=1)
    return torch.where(target.squeeze(1).isnan(), scores.shape[1], ranks)


@dataclass(frozen=True, eq=False)
class EvalSet:
    """The evaluation inputs of every evaluated user, packed like a batch's histories."""
    users: np.ndarray      # (U,) user ids
    item_ids: np.ndarray   # (T,) inputs: each user's most recent items before the held-out one
    targets: np.ndarray    # (T,) next items; each user's last target is the held-out item
    lengths: np.ndarray    # (U,)
    held_out: np.ndarray   # (U,) item ids
    num_items: int         # V: candidates are item ids 1..V
    log_popularity: np.ndarray  # (V,) float32 log q(i), q from training counts + 1

    @property
    def num_users(self) -> int:
        return len(self.users)


def eval_set(histories: Histories, max_seq_len: int) -> EvalSet:
    """Leave-one-out inputs from the FULL histories (module docstring)."""
    users = np.flatnonzero(histories.lengths >= 2) + 1
    if len(users) == 0:
        raise ConfigError("--eval: no user has the 2 interactions an evaluation needs "
                          "(one input, the held-out item)")
    item_ids, targets, lengths = recent_windows(histories, users, max_seq_len)
    held = histories.items[histories.offsets[users] - 1]
    counts = np.bincount(histories.without_last().items, minlength=histories.num_items + 1)[1:]
    log_q = np.log((counts + 1.0) / (counts + 1.0).sum()).astype(np.float32)
    return EvalSet(users=users, item_ids=item_ids, targets=targets, lengths=lengths,
                   held_out=held, num_items=histories.num_items, log_popularity=log_q)


@dataclass(frozen=True)
class EvalResult:
    hr_at_10: float
    ndcg_at_10: float
    hr_at_10_logq: float
    ndcg_at_10_logq: float
    eval_users: int
    ranks: np.ndarray       # (U,) per evaluated user, in EvalSet order
    ranks_logq: np.ndarray  # (U,) the same, popularity-boosted scores (+ log q)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: EvalSet, context_vocabs: tuple[int, ...],
             users_per_chunk: int | None = None, user_features: bool = True) -> EvalResult:
    """HR@10 and NDCG@10 of `model` (a `fsbench.models.RecModel`, on any device) on the
    held-out items of `data`, ranked among all V items (module docstring). Users are
    scored in chunks; by default each chunk's (users, V) score matrix stays <= 2^26
    floats (256 MiB), so a catalogue of millions of items still fits."""
    if users_per_chunk is None:
        users_per_chunk = max(1, min(512, 2**26 // data.num_items))
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    candidates = model.sparse.tables[ITEM].weight[1:data.num_items + 1]  # (V, D): ids 1..V
    log_q = torch.from_numpy(data.log_popularity).to(device)
    offsets = np.concatenate([[0], np.cumsum(data.lengths)])
    ranks, ranks_logq = [], []
    try:
        for lo in range(0, data.num_users, users_per_chunk):
            hi = min(lo + users_per_chunk, data.num_users)
            t0, t1 = int(offsets[lo]), int(offsets[hi])
            users = shown_users(data.users[lo:hi], user_features)  # as in training
            batch = JaggedBatch(
                item_ids=torch.from_numpy(data.item_ids[t0:t1]),
                targets=torch.from_numpy(data.targets[t0:t1]),
                lengths=torch.from_numpy(data.lengths[lo:hi]),
                user_ids=torch.from_numpy(users),
                context_ids=torch.from_numpy(context_ids_for_users(users, context_vocabs)),
                negative_ids=torch.zeros(0, dtype=torch.int64),
                global_num_targets=t1 - t0,
            ).to(device)
            hidden = model.dense.encode_rows(model.sparse.lookup(batch), batch)
            last = hidden.index_select(0, batch.offsets[1:] - 1)  # each user's last position
            scores = last @ candidates.T  # (users, V): column j is item j + 1
            held = torch.from_numpy(data.held_out[lo:hi] - 1).to(device)
            ranks.append(target_ranks(scores, held).cpu())
            ranks_logq.append(target_ranks(scores + log_q, held).cpu())
    finally:
        model.train(was_training)
    ranks, ranks_logq = torch.cat(ranks).numpy(), torch.cat(ranks_logq).numpy()
    hr, ndcg = hit_ndcg(ranks, K)
    hr_q, ndcg_q = hit_ndcg(ranks_logq, K)
    return EvalResult(hr_at_10=hr, ndcg_at_10=ndcg, hr_at_10_logq=hr_q, ndcg_at_10_logq=ndcg_q,
                      eval_users=len(ranks), ranks=ranks, ranks_logq=ranks_logq)


def check_trainer(run: RunConfig, trainer_cls: type) -> None:
    """Before any rank starts: with --eval the trainer must expose its trained model."""
    if run.eval.on and not hasattr(trainer_cls, "trained_model"):
        raise ConfigError(f"--eval: trainer {run.trainer!r} has no trained_model() to "
                          "evaluate (every trainer must expose its weights as one RecModel)")


class Evaluator:
    """A run's evaluations, driven by the rank's loop between steps. Every rank takes part
    (gathering a sharded model is a collective); rank 0 scores and writes `eval.json`.
    With `eval.split=valid_test` each evaluation also scores the validation item (each
    user's second-to-last: `valid_hr_at_10`, `valid_ndcg_at_10`) and keeps its test
    ranks (`eval-ranks/step-K.npy`), so a reader can pick the evaluation the validation
    score selects (early stopping) and compare runs user by user there."""

    def __init__(self, run: RunConfig, ctx, run_dir: Path) -> None:
        self.run, self.ctx, self.run_dir = run, ctx, Path(run_dir)
        self.every, self.steps = run.eval.every, run.workload.steps
        self.data = self.valid = None
        if ctx.is_main:
            histories = load_histories(run.workload.data)
            self.data = eval_set(histories, run.workload.max_seq_len)
            if run.eval.split == "valid_test":
                self.valid = eval_set(histories.without_last(), run.workload.max_seq_len)
        self.records: list[dict] = []
        self.patience = run.eval.patience
        self.best, self.since_best = -1.0, 0  # rank 0's: the best validation score so far
        self.stopped_at: int | None = None

    def after_step(self, step: int, trainer) -> bool:
        """Evaluate the model trained through `step` if it is an `every`-th step (the last
        step is `after_training`'s). Call on every rank, outside the step's span and
        before the next step's barrier. Returns whether to stop here (early stopping,
        `eval.patience`): every rank gets rank 0's decision."""
        if self.every > 0 and (step + 1) % self.every == 0 and step < self.steps - 1:
            self._evaluate(step, trainer)
            if self.patience and self._agree(self.since_best >= self.patience):
                self.stopped_at = step
                self._write(step)
                return True
        return False

    def after_training(self, trainer) -> None:
        """Evaluate the final model (every rank calls it, after the last step); after an
        early stop the model was evaluated where it stopped."""
        if self.stopped_at is None:
            self._evaluate(self.steps - 1, trainer)

    def _agree(self, stop: bool) -> bool:
        """Rank 0's decision on every rank (a broadcast on the run's group)."""
        if self.ctx.world_size == 1:
            return stop
        import torch.distributed as dist

        # the harness's own gloo group where there is one: no device stream, and nothing a
        # trainer left in flight on its groups queues before it
        group = self.ctx.barrier_group
        flag = torch.tensor([1 if stop else 0], device="cpu" if group is not None else self.ctx.device)
        dist.broadcast(flag, src=0, group=group or self.ctx.group)
        return bool(flag.item())

    def _evaluate(self, step: int, trainer) -> None:
        t0 = time.perf_counter()
        model = trainer.trained_model()  # collective; the model on rank 0, None elsewhere
        if not self.ctx.is_main:
            return
        model = model.to(self.ctx.device)
        shown = self.run.workload.model.user_features
        result = evaluate(model, self.data, self.run.workload.context_vocabs, user_features=shown)
        record = {"step": step, "hr_at_10": result.hr_at_10, "ndcg_at_10": result.ndcg_at_10,
                  "hr_at_10_logq": result.hr_at_10_logq,
                  "ndcg_at_10_logq": result.ndcg_at_10_logq}
        ranks = np.stack([result.ranks, result.ranks_logq]).astype(np.int32)
        if self.valid is not None:
            valid = evaluate(model, self.valid, self.run.workload.context_vocabs, user_features=shown)
            record.update(valid_hr_at_10=valid.hr_at_10, valid_ndcg_at_10=valid.ndcg_at_10)
            (self.run_dir / RANKS_DIR).mkdir(exist_ok=True)
            _save_atomic(self.run_dir / RANKS_DIR / f"step-{step}.npy", ranks)
        self.records.append({**record, "eval_s": time.perf_counter() - t0})
        if self.valid is not None:
            if record["valid_ndcg_at_10"] > self.best:
                self.best, self.since_best = record["valid_ndcg_at_10"], 0
            else:
                self.since_best += 1
        self._ranks, self._eval_users = ranks, result.eval_users
        self._write(step)

    def _write(self, step: int) -> None:
        """eval.json (rank 0): every evaluation so far, and where an early stop ended it."""
        if not self.ctx.is_main:
            return
        if step == self.steps - 1 or self.stopped_at is not None:
            _save_atomic(self.run_dir / RANKS_FILE, self._ranks)
        write_json_atomic(self.run_dir / EVAL_FILE, {
            "k": K, "eval_users": self._eval_users, "num_items": self.data.num_items,
            "every": self.every, "target_hr10": self.run.eval.target_hr10,
            "split": self.run.eval.split, "seen_items": "kept", "patience": self.patience,
            "stopped_at_step": self.stopped_at, "evaluations": self.records})


def _save_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)
