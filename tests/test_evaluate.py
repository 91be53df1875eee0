"""Quality beside speed (fsbench.training.evaluate): leave-one-out HR@10 and NDCG@10 over the full
item set, computed by one function from one trained RecModel, the same for every trainer;
with evaluation on, every trainer trains without each user's last item."""
import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from fsbench.cli import dispatch as cli
from fsbench.cli import run_config
from fsbench.training import evaluate
from fsbench.config import ConfigError, EvalConfig, ModelConfig, RunConfig, WorkloadConfig
from fsbench.training.evaluate import EVAL_FILE, eval_set, hit_ndcg, target_ranks
from fsbench.models import build_model
from fsbench.models.sparse import ITEM
from fsbench.training.optim import make_model_optimizer
from fsbench.measurement import run_summary
from fsbench.running.runner import run_once
from fsbench.running.store import read_json
from fsbench.workloads import load_histories, make_batch_source
from fsbench.workloads.realdata import histories_from_events

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = pytest.mark.parallel_safe

ONLY_HELD_OUT = 40  # an item the test data holds only as one user's last interaction


def write_dataset(path, users: int = 30, items: int = 36, seed: int = 3) -> str:
    """A small SASRec-format file (`user item` lines, chronological): histories of 3..12
    items that mostly walk the item ids upwards (something to learn), and one item,
    ONLY_HELD_OUT, that only ever occurs as a user's last interaction."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, users + 1):
        item = int(rng.integers(1, items + 1))
        for _ in range(int(rng.integers(3, 13))):
            lines.append(f"{u} {item}")
            item = item % items + 1 if rng.random() < 0.8 else int(rng.integers(1, items + 1))
    lines.append(f"1 {ONLY_HELD_OUT}")  # user 1's history ends with it
    path.write_text("\n".join(lines) + "\n")
    return f"sasrec:{path}"


def workload(data: str, **kw) -> WorkloadConfig:
    base = dict(name="t", model=ModelConfig(dim=16, num_layers=1, num_heads=2),
                item_vocab=48, user_vocab=32, context_vocabs=(5, 3), max_seq_len=8,
                global_batch_size=8, steps=6, warmup=1, num_negatives=8, optimizer="adagrad",
                lr=0.05, data=data)
    return WorkloadConfig(**(base | kw))


# ------------------------------------------------------------------ the metric itself

def test_hr_and_ndcg_of_ranks_1_3_and_11():
    assert hit_ndcg([1]) == (1.0, 1.0)
    assert hit_ndcg([3]) == (1.0, pytest.approx(1 / math.log2(4)))  # 0.5
    assert hit_ndcg([10]) == (1.0, pytest.approx(1 / math.log2(11)))  # the cut-off counts
    assert hit_ndcg([11]) == (0.0, 0.0)
    hr, ndcg = hit_ndcg(np.array([1, 3, 11]))
    assert hr == pytest.approx(2 / 3) and ndcg == pytest.approx(0.5)
    with pytest.raises(ValueError):
        hit_ndcg([0, 1])


def test_target_rank_counts_ties_against_the_target_and_a_nan_score_last():
    scores = torch.tensor([[0.2, 0.9, 0.2, 0.1],            # tie with the target: rank 3
                           [1.0, 1.0, 1.0, 1.0],            # all alike: last, not first
                           [float("nan"), 0.0, 0.0, 0.0]])  # diverged: last
    assert target_ranks(scores, torch.tensor([0, 2, 0])).tolist() == [3, 4, 4]


class FixedScores(nn.Module):
    """A stand-in RecModel whose score of item i for user u is `scores[u][i - 1]`: item i's
    embedding is the unit vector e_(i-1), and the hidden state at every position of user
    u's input is scores[u]. Lets the ranking be checked against hand-computed ranks."""

    def __init__(self, scores: dict[int, list[float]], num_items: int) -> None:
        super().__init__()
        self.items = nn.Embedding(num_items + 1, num_items)
        with torch.no_grad():
            self.items.weight.copy_(torch.cat([torch.zeros(1, num_items), torch.eye(num_items)]))
        self.scores = scores
        self.sparse = SimpleNamespace(tables={ITEM: self.items}, lookup=lambda batch: None)
        self.dense = SimpleNamespace(encode_rows=self._encode)

    def _encode(self, lookups, batch):
        per_user = torch.tensor([self.scores[u] for u in batch.user_ids.tolist()])
        return per_user.repeat_interleave(batch.lengths, dim=0)


def test_full_ranking_on_hand_computed_scores_keeps_seen_items_as_candidates():
    # Items 1..12; users 4 and 5 have one interaction each: nothing to evaluate on.
    histories = {1: [2, 3, 5], 2: [7, 1, 7, 4, 7], 3: [9, 10, 11, 12], 4: [6], 5: [8]}
    events = [(u, i) for u, items in histories.items() for i in items]
    h = histories_from_events(np.array([u for u, _ in events]), np.array([i for _, i in events]))
    assert h.num_items == 12
    data = eval_set(h, max_seq_len=2)
    assert data.users.tolist() == [1, 2, 3] and data.held_out.tolist() == [5, 7, 12]
    # user 2's input: the 2 most recent items before the held-out one, targets shifted
    assert data.item_ids[2:4].tolist() == [7, 4] and data.targets[2:4].tolist() == [4, 7]
    scores = {
        1: [0.0] * 4 + [9.0] + [0.0] * 7,               # item 5 first: rank 1
        # items 1 and 4 (both already seen by user 2) above item 7: rank 3, since seen
        # items stay candidates (masking them would give rank 1)
        2: [5.0, 0, 0, 4.0, 0, 0, 3.0, 0, 0, 0, 0, 0],
        3: [float(12 - i) for i in range(10)] + [0.0, 1.5],  # 10 items above 12: rank 11
    }
    result = evaluate.evaluate(FixedScores(scores, 12), data, context_vocabs=(5,))
    assert result.ranks.tolist() == [1, 3, 11]
    assert result.eval_users == 3
    assert result.hr_at_10 == pytest.approx(2 / 3)
    assert result.ndcg_at_10 == pytest.approx((1 + 1 / math.log2(4) + 0) / 3)


def test_popularity_corrected_variant_adds_log_q_from_training_counts():
    histories = {1: [2, 3, 5], 2: [7, 1, 7, 4, 7], 3: [9, 10, 11, 12], 4: [6], 5: [8]}
    events = [(u, i) for u, items in histories.items() for i in items]
    h = histories_from_events(np.array([u for u, _ in events]), np.array([i for _, i in events]))
    data = eval_set(h, max_seq_len=2)
    # training histories (last items held out) count items 1..12 as below; q = (c + 1) / 21
    counts = np.array([1, 1, 1, 1, 0, 0, 2, 0, 1, 1, 1, 0])
    np.testing.assert_allclose(np.exp(data.log_popularity), (counts + 1) / 21, rtol=1e-6)
    # A hand-made log q: item 12 alone gets +20.
    data = dataclasses.replace(data, log_popularity=np.eye(12, dtype=np.float32)[11] * 20)
    scores = {1: [0.0] * 4 + [9.0] + [0.0] * 7,
              2: [5.0, 0, 0, 4.0, 0, 0, 3.0, 0, 0, 0, 0, 0],
              3: [float(12 - i) for i in range(10)] + [0.0, 1.5]}
    result = evaluate.evaluate(FixedScores(scores, 12), data, context_vocabs=(5,))
    assert result.ranks.tolist() == [1, 3, 11]  # the plain score is unchanged
    # item 12 (score 20 after correction) now precedes items 5 and 7 and leads for user 3
    assert result.ranks_logq.tolist() == [2, 4, 1]
    assert result.hr_at_10_logq == 1.0
    assert result.ndcg_at_10_logq == pytest.approx((1 / math.log2(3) + 1 / math.log2(5) + 1) / 3)


def test_candidates_are_the_data_sets_items_not_unused_table_rows():
    """Table rows beyond the data's V items hold no item: a high score there must not
    push the held-out item down."""
    h = histories_from_events(np.array([1, 1]), np.array([1, 2]))
    model = FixedScores({1: [0.0, 1.0, 0.0, 0.0]}, 4)  # rows for items 3, 4 exist...
    model.scores[1] = [0.0, 1.0, 5.0, 5.0]  # ...and score highest, but V = 2
    assert evaluate.evaluate(model, eval_set(h, 4), (5,)).ranks.tolist() == [1]


def test_without_user_features_every_user_is_scored_as_the_anonymous_one(tmp_path):
    """model.user_features=false: training shows every sample as user 1 (and the context
    ids hashed from it), and so does the evaluation: the scores are those of a data set
    whose users are all user 1; with the features on, the user's own row counts."""
    spec = write_dataset(tmp_path / "d.txt")
    anonymous = workload(spec, model=ModelConfig(dim=16, num_layers=1, num_heads=2,
                                                 user_features=False), user_vocab=2)
    batch = make_batch_source(anonymous, 0).global_batch(0)
    assert set(batch.user_ids.tolist()) == {1} and len(set(map(tuple, batch.context_ids.tolist()))) == 1
    model = reference_model(workload(spec), seed=5)
    data = eval_set(load_histories(spec), 8)
    as_one = dataclasses.replace(data, users=np.ones_like(data.users))
    got = evaluate.evaluate(model, data, (5, 3), user_features=False).ranks
    np.testing.assert_array_equal(got, evaluate.evaluate(model, as_one, (5, 3)).ranks)
    assert not np.array_equal(got, evaluate.evaluate(model, data, (5, 3)).ranks)


# --------------------------------------------------- held-out items and the run config

def test_training_with_holdout_never_sees_a_users_last_item(tmp_path):
    spec = write_dataset(tmp_path / "d.txt")
    w = workload(spec)
    full = load_histories(spec)
    source = make_batch_source(w, seed=0, held_out=1)
    for u in range(1, full.num_users + 1):
        assert source.histories.history(u).tolist() == full.history(u)[:-1].tolist()
    held = {u: int(full.history(u)[-1]) for u in range(1, full.num_users + 1)}
    only_held = held[1]  # ONLY_HELD_OUT's id
    assert np.bincount(full.items)[only_held] == 1
    negatives = set()
    for step in range(30):
        b = source.global_batch(step)
        for u, s, e in zip(b.user_ids.tolist(), b.offsets[:-1].tolist(), b.offsets[1:].tolist()):
            train = full.history(u)[:-1].tolist()
            assert b.item_ids[s:e].tolist() == train[:-1][-w.max_seq_len:]
            assert b.targets[s:e].tolist() == train[1:][-w.max_seq_len:]
        negatives |= set(b.negative_ids.tolist())
    # uniform over every item id (the loss then learns log p up to a constant), the
    # held-out-only item included: a negative is no training input or target
    assert negatives <= set(range(1, full.num_items + 1)) and len(negatives) > 1
    # without holdout the same step trains on the full histories
    plain = make_batch_source(w, seed=0).global_batch(0)
    u = int(plain.user_ids[0])
    assert int(plain.targets[int(plain.lengths[0]) - 1]) == held[u]


def test_eval_needs_real_data_and_the_reference_model(tmp_path):
    spec = write_dataset(tmp_path / "d.txt")
    on = EvalConfig(on=True)
    with pytest.raises(ConfigError, match="--eval needs real interaction data"):
        RunConfig(workload=workload("synthetic"), trainer="ddp", eval=on)
    with pytest.raises(ConfigError, match="--eval needs compute=model"):
        RunConfig(workload=workload(spec, compute="synthetic"), trainer="ddp", eval=on)
    with pytest.raises(ConfigError, match="need eval.on"):
        EvalConfig(every=5)
    with pytest.raises(ValueError, match="real data"):
        make_batch_source(workload("synthetic"), 0, held_out=1)


def test_cli_eval_flags(tmp_path, capsys):
    spec = write_dataset(tmp_path / "d.txt")
    args = cli.build_parser().parse_args(["run", "--target-hr10", "0.2", "--set", f"data={spec}"])
    assert run_config.eval_config(args) == EvalConfig(on=True, every=run_config.DEFAULT_EVAL_EVERY,
                                               target_hr10=0.2)
    args = cli.build_parser().parse_args(["sweep", "--eval-every", "4"])
    assert run_config.eval_config(args) == EvalConfig(on=True, every=4)
    assert run_config.eval_config(cli.build_parser().parse_args(["run"])) == EvalConfig()
    assert cli.main(["run", "--eval", "--store", str(tmp_path / "runs")]) == 2
    assert "--eval needs real interaction data" in capsys.readouterr().err
    assert cli.main(["run", "--eval-every", "0", "--set", f"data={spec}"]) == 2
    assert "--eval-every=0 must be >= 1" in capsys.readouterr().err


def test_time_to_target_sums_step_times_through_the_first_evaluation_reaching_it():
    evals = [{"step": 1, "hr_at_10": 0.2, "ndcg_at_10": 0.1},
             {"step": 5, "hr_at_10": 0.31, "ndcg_at_10": 0.2},
             {"step": 3, "hr_at_10": 0.35, "ndcg_at_10": 0.3}]  # any order on file
    step_ms = {s: 100.0 * (s + 1) for s in range(6)}  # 100, 200, ..., 600 ms
    out = run_summary.quality({"eval_users": 7, "target_hr10": 0.3, "evaluations": evals}, step_ms)
    assert out["steps_to_target"] == 4 and out["time_to_target_s"] == pytest.approx(1.0)
    assert (out["hr_at_10"], out["ndcg_at_10"], out["eval_users"]) == (0.31, 0.2, 7)  # final
    never = run_summary.quality({"eval_users": 7, "target_hr10": 0.9, "evaluations": evals}, step_ms)
    assert never["time_to_target_s"] is None and never["steps_to_target"] is None
    assert set(run_summary.quality(None, {}).values()) == {None}
    # the curve counts the global samples trained through each evaluation: what the ranks
    # counted (a window re-packs steps of uneven size), None from a step nobody recorded on
    counted = run_summary.quality({"eval_users": 7, "evaluations": evals}, step_ms,
                                  {0: 16, 1: 12, 2: 20, 3: 16, 5: 16})["quality_curve"]
    assert [(e["step"], e["samples"], e["train_s"]) for e in counted] == [
        (1, 28, pytest.approx(0.3)), (3, 64, pytest.approx(1.0)), (5, None, pytest.approx(2.1))]
    stats = pd.DataFrame({"rank": [0, 1, 0, 1, 0], "step": [0, 0, 1, 1, 2],
                          "num_samples": [9, 7, 5, 7, 8]})
    assert run_summary.samples_per_step(stats, 2) == {0: 16, 1: 12}  # step 2: rank 1 missing


# ----------------------------------------------- every trainer: the same trained model

def reference_model(w: WorkloadConfig, seed: int) -> nn.Module:
    """The single-process model trained on the same global batches (held-out items
    removed): what every trainer computes."""
    model = build_model(w, seed)
    optimizer = make_model_optimizer(model, w)
    source = make_batch_source(w, seed, held_out=1)
    for step in range(w.steps):
        model(source.global_batch(step)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


TRAINERS = {
    "ddp": ("trainers_for_tests:ModelDumpDDP", {}),
    # sharded tables, row-wise, overlapped and prioritized exchange: rows gathered at eval
    "freescale": ("trainers_for_tests:ModelDumpFreeScale", {}),
    "freescale_table_wise": ("trainers_for_tests:ModelDumpFreeScale", {"sharding": "table"}),
    "torchrec": ("trainers_for_tests:ModelDumpTorchRec", {"sharding": "row_wise"}),
    # ZeRO 3 partitions the parameters: gathered for the evaluation
    "deepspeed_zero3": ("trainers_for_tests:ModelDumpDeepSpeed", {"zero_stage": "3"}),
}
EXTRAS = {"torchrec": "torchrec", "deepspeed_zero3": "deepspeed"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    spec = write_dataset(tmp_path_factory.mktemp("data") / "d.txt")
    w = workload(spec)
    model = reference_model(w, seed=5)
    data = eval_set(load_histories(spec), w.max_seq_len)
    return w, model, evaluate.evaluate(model, data, w.context_vocabs)


@pytest.mark.dist
@pytest.mark.parametrize("name", list(TRAINERS))
def test_every_trainer_hands_over_the_reference_model_and_scores_the_same(
        name, reference, tmp_path, monkeypatch, rank_pythonpath):
    if name in EXTRAS:
        pytest.importorskip(EXTRAS[name], reason=f"needs the {EXTRAS[name]} extra (scripts/setup.sh)")
    w, ref_model, ref = reference
    trainer, options = TRAINERS[name]
    monkeypatch.setenv("FSBENCH_TEST_DUMP", str(tmp_path))
    run = RunConfig(workload=w, trainer=trainer, world_size=2, seed=5, trainer_options=options,
                    eval=EvalConfig(on=True, every=3, target_hr10=1e-9))
    run_dir, summary = run_once(run, tmp_path / "runs", timeout_s=180)

    # The model the evaluation scored is the single-process trained model (to float
    # noise: a sub-batch's GEMMs round differently; Adagrad moves a weight ~lr = 0.05 a
    # step, so a misplaced or stale row is far outside this tolerance)...
    trained = torch.load(tmp_path / "trained-model.pt")
    initial = build_model(w, seed=5).state_dict()
    for key, want in ref_model.state_dict().items():
        assert torch.allclose(trained[key], want, rtol=1e-4, atol=5e-5), key
    assert not torch.allclose(trained["sparse.tables.item.weight"], initial["sparse.tables.item.weight"])
    # ...so its metrics are the reference's.
    assert summary["eval_users"] == ref.eval_users == 30
    assert summary["hr_at_10"] == pytest.approx(ref.hr_at_10, abs=1e-9)
    assert summary["ndcg_at_10"] == pytest.approx(ref.ndcg_at_10, abs=1e-6)
    assert summary["hr_at_10_logq"] == pytest.approx(ref.hr_at_10_logq, abs=1e-9)
    assert summary["ndcg_at_10_logq"] == pytest.approx(ref.ndcg_at_10_logq, abs=1e-6)
    assert 0 < ref.hr_at_10 < 1
    ranks = np.load(run_dir / evaluate.RANKS_FILE)  # user by user, both scores
    assert ranks.tolist() == [ref.ranks.tolist(), ref.ranks_logq.tolist()]
    # Evaluated after steps 3 and 6 (every=3); the first evaluation with HR@10 >= the
    # target ends the time to quality, summed over the steps trained until then.
    record = read_json(run_dir / EVAL_FILE)
    assert [e["step"] for e in record["evaluations"]] == [2, 5]
    first = next((e for e in record["evaluations"] if e["hr_at_10"] >= 1e-9), None)
    if first is None:
        assert summary["time_to_target_s"] is None
    else:
        assert summary["steps_to_target"] == first["step"] + 1 and summary["time_to_target_s"] > 0
    # every trainer counts the global batch's samples once a step, however it splits them
    assert [e["samples"] for e in summary["quality_curve"]] == [3 * w.global_batch_size,
                                                                 6 * w.global_batch_size]
