"""`fsbench quality`: the equivalence verdicts from known runs (fast), and end to end on a
learnable interaction file: the real trainers pass, the broken ones are flagged (dist)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fsbench.cli import main
from fsbench.quality import time_to_quality as ttq
from fsbench.quality.convergence import LOSS_RTOL, RunQuality, analyze, trajectory
from fsbench.stats import equivalence, mean_interval

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = pytest.mark.parallel_safe

SPE = 4  # steps per epoch of the made-up runs


def run(trainer: str, ranks: np.ndarray, losses=None, seed: int = 0, hr=(0.1, 0.2, 0.3),
        valid=None, world_size: int = 2) -> RunQuality:
    """A made-up run: an evaluation every SPE steps, 1 s of training and 16 samples a step
    (`valid`: its validation NDCG@10s; default half the test HR@10s)."""
    valid = valid if valid is not None else [h / 2 for h in hr]
    curve = [{"step": SPE * (k + 1) - 1, "train_s": 1.0 * (k + 1), "samples": 16 * SPE * (k + 1),
              "hr_at_10": h, "valid_ndcg_at_10": v} for k, (h, v) in enumerate(zip(hr, valid))]
    return RunQuality(trainer, world_size, seed, curve, curve[-1], np.asarray(ranks),
                      list(losses if losses is not None else [5.0, 4.0, 3.5, 3.2, 3.0]))


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    rng = np.random.default_rng(0)
    same = rng.normal(0.0, 0.01, 2000)
    assert equivalence(same, 0.01)[0] == "equivalent"
    assert equivalence(same + 0.05, 0.01)[0] == "different"
    assert equivalence(rng.normal(0.0, 1.0, 50), 0.01)[0] == "inconclusive"  # too noisy
    assert equivalence([0.0], 0.01)[0] == "inconclusive"  # nothing to resample
    lo, hi = mean_interval(same)
    assert lo < 0.0 < hi and hi - lo < 0.002


def test_trajectory_tells_rounding_from_another_function():
    base = run("ddp", [1, 2, 3])
    rounding = run("x", [1, 2, 3], losses=[5.0, 4.0 * (1 + LOSS_RTOL / 10), 3.5, 3.2, 3.0])
    assert trajectory(rounding, base, SPE)[0] == "same"
    other = run("x", [1, 2, 3], losses=[5.0, 4.0, 3.6, 3.2, 3.0])
    assert trajectory(other, base, SPE) == ("departs at step 2", pytest.approx(0.1 / 3.5))
    # only the first epoch is compared: a late difference is chaos amplifying rounding
    late = run("x", [1, 2, 3], losses=[5.0, 4.0, 3.5, 3.2, 2.0])
    assert trajectory(late, base, SPE)[0] == "same"
    nan = run("x", [1, 2, 3], losses=[5.0, float("nan"), 3.5, 3.2, 3.0])
    assert trajectory(nan, base, SPE)[0] == "departs at step 1"
    # a look-ahead window trains other batches at each step by design: not compared
    windowed = run("x", [1, 2, 3], losses=[5.0, 4.2, 3.7, 3.3, 3.1])
    windowed.step_alignment = 4
    assert trajectory(windowed, base, SPE)[0] == "not comparable (re-packs samples across 4 steps)"
    users = np.random.default_rng(2).integers(1, 40, 4000)
    windowed.ranks = users
    rows = {r["trainer"]: r for r in analyze([run("ddp", users), windowed], SPE)["rows"]}
    assert rows["x"]["equivalent"] == "equivalent in quality; trajectory not comparable " \
                                      "(re-packs samples across 4 steps)"


def test_analyze_flags_a_trainer_that_departs_or_scores_worse():
    users = 4000
    rng = np.random.default_rng(1)
    good = rng.integers(1, 40, users)  # ranks: about a quarter of users hit
    worse = np.where(rng.random(users) < 0.5, 100, good)  # half the hits lost
    results = [run("ddp", good), run("copy", good),
               run("stale", good, losses=[5.0, 4.2, 3.7, 3.3, 3.1]), run("weak", worse)]
    out = analyze(results, SPE, baseline="ddp", margin=0.1)
    rows = {r["trainer"]: r for r in out["rows"]}
    assert rows["ddp"]["equivalent"] == "(baseline)"
    assert rows["copy"]["equivalent"] == "equivalent"
    assert rows["stale"]["equivalent"].startswith("NOT equivalent: trajectory departs at step 1")
    assert rows["weak"]["equivalent"].startswith("NOT equivalent: test HR@10 differs")
    assert rows["ddp"]["hr_at_10"] == pytest.approx(float((good <= 10).mean()))
    # a baseline that hits nothing leaves no margin, and a run without losses no
    # trajectory: neither can tell, and each says so (not "equivalent", not "NOT")
    zero = analyze([run("ddp", np.full(50, 500)), run("copy", np.full(50, 500))], SPE)
    assert zero["rows"][1]["equivalent"].startswith("inconclusive: the baseline's HR@10 is 0")
    lost = analyze([run("ddp", good), run("copy", good, losses=[])], SPE)
    assert lost["rows"][1]["equivalent"].startswith("inconclusive: a run stored no losses")
    # no baseline run of the same seed: it cannot tell, and says so
    alone = analyze([run("ddp", good), run("copy", good, seed=1)], SPE)
    assert {r["trainer"]: r["equivalent"] for r in alone["rows"]}["copy"].startswith("inconclusive")


def test_a_departure_that_rounding_alone_makes_is_inconclusive_not_a_difference():
    """Where the baseline perturbed by rounding departs from itself at step 2, a trainer
    departing at step 2 or later is no evidence: inconclusive, with the reason; one
    departing earlier (step 1) is still NOT equivalent, and a stable baseline (None)
    leaves every departure a difference."""
    users = np.random.default_rng(3).integers(1, 40, 4000)
    base = run("ddp", users)
    late = run("late", users, losses=[5.0, 4.0, 3.6, 3.2, 3.0])  # departs at step 2
    early = run("early", users, losses=[5.0, 4.2, 3.7, 3.3, 3.1])  # at step 1
    asked = []

    def rounding(seed, steps):
        asked.append((seed, steps))
        return 2 if steps > 2 else None

    rows = {r["trainer"]: r for r in analyze([base, late, early], SPE, rounding=rounding)["rows"]}
    assert rows["late"]["equivalent"].startswith(
        "inconclusive: trajectory departs at step 2, as the baseline perturbed by rounding "
        "does at step 2 (training amplifies rounding here: the trajectory cannot tell); "
        "test HR@10 equivalent")
    assert rows["early"]["equivalent"].startswith("NOT equivalent: trajectory departs at step 1")
    assert sorted(asked) == [(0, 2), (0, 3)]  # asked only as far as each departure
    stable = {r["trainer"]: r for r in analyze([base, late], SPE, rounding=lambda *a: None)["rows"]}
    assert stable["late"]["equivalent"].startswith("NOT equivalent: trajectory departs at step 2")
    # judged per seed: seed 1 departs at the same step as seed 0, but its baseline does
    # not amplify rounding, so that departure is evidence
    seeds = [base, late, run("ddp", users, seed=1),
             run("late", users, losses=[5.0, 4.0, 3.6, 3.2, 3.0], seed=1)]
    mixed = analyze(seeds, SPE, rounding=lambda seed, steps: 2 if seed == 0 and steps > 2 else None)
    row = {r["trainer"]: r for r in mixed["rows"]}["late"]
    assert row["equivalent"].startswith("NOT equivalent: trajectory departs at step 2"), row


def test_the_rounding_probe_finds_where_training_amplifies_rounding(tmp_path):
    """The reference trained twice, once perturbed by 1e-7: with the ring's stable SASRec
    the two stay within the tolerance; at a learning rate of 1e3 they part."""
    from fsbench.quality.convergence import quality_workload
    from fsbench.quality.rounding_probe import baseline_departure

    from fsbench.config import EvalConfig, RunConfig

    data = write_learnable(tmp_path / "d.txt", users=40)
    evaluation = EvalConfig(on=True, split="valid_test")
    for lr, departs in (("0.01", False), ("1000", True)):
        w, _ = quality_workload("small", data, "sasrec", 1, [("global_batch_size", "8"), ("lr", lr)])
        run_ = RunConfig(workload=w, trainer="ddp", world_size=2, seed=0, eval=evaluation)
        assert run_.held_out_items == 2  # the probe trains on what the runs train on
        assert (baseline_departure(run_, 4, LOSS_RTOL) is not None) == departs, lr


def test_the_target_is_a_fraction_of_the_baselines_best_validation_ndcg_per_seed():
    """Each baseline seed's best validation NDCG@10 (not its last, not test), averaged over
    seeds, times the fraction; per world size; a world size without a baseline has none."""
    users = [1, 20]
    runs_ = [run("ddp", users, seed=0, valid=(0.1, 0.3, 0.2)),   # best 0.3 (not the last)
             run("ddp", users, seed=1, valid=(0.1, 0.5, 0.4)),   # best 0.5
             run("ddp", users, valid=(0.2, 0.2, 0.2), world_size=4),
             run("x", users, valid=(0.0, 0.0, 0.9), world_size=8)]  # no ddp at 8 ranks
    out = analyze(runs_, SPE, target_fraction=0.9)
    assert out["target_valid_ndcg_at_10"] == {2: pytest.approx(0.9 * 0.4), 4: pytest.approx(0.18),
                                              8: None}
    rows = {(r["trainer"], r["world_size"]): r for r in out["rows"]}
    # seed 0 first reaches 0.36? never (best 0.3); seed 1 at its second evaluation
    assert rows[("ddp", 2)]["seeds_reached_quality"] == 1
    assert ttq.cells(rows[("ddp", 2)]) == ("2.0 (1/2 seeds; the others not reached, best 0.3000)",
                                           "128 (1/2 seeds)")
    assert ttq.cells(rows[("ddp", 4)]) == ("1.0", "64")  # first evaluation, 4 steps x 16
    assert ttq.cells(rows[("x", 8)])[0] == "n/a (no baseline run with validation scores)"
    assert analyze(runs_, SPE)["target_fraction"] == ttq.TARGET_FRACTION == 0.95  # the default


def test_time_to_quality_reached_not_reached_and_partial():
    users = [1, 20]
    base = [run("ddp", users, seed=s, valid=(0.1, 0.2, 0.4)) for s in (0, 1, 2)]  # target 0.38
    fast = [run("fast", users, seed=s, valid=(0.39, 0.5, 0.5)) for s in (0, 1, 2)]
    never = [run("never", users, seed=s, valid=(0.1, 0.2 + s / 100, 0.1)) for s in (0, 1, 2)]
    some = [run("some", users, seed=0, valid=(0.1, 0.385, 0.1)),  # reached at 2 evaluations
            run("some", users, seed=1, valid=(0.1, 0.1, 0.4)),   # at 3
            run("some", users, seed=2, valid=(0.1, 0.3, 0.37))]  # never: best 0.37
    rows = {r["trainer"]: r for r in analyze(base + fast + never + some, SPE)["rows"]}
    assert rows["ddp"]["target_valid_ndcg_at_10"] == pytest.approx(0.95 * 0.4)
    assert (rows["ddp"]["time_to_quality_s"], rows["ddp"]["samples_to_quality"]) == (3.0, 16 * 3 * SPE)
    assert (rows["fast"]["time_to_quality_s"], rows["fast"]["samples_to_quality"]) == (1.0, 16 * SPE)
    assert rows["fast"]["seeds_reached_quality"] == 3
    assert rows["never"]["time_to_quality_s"] is None and rows["never"]["seeds_reached_quality"] == 0
    assert ttq.cells(rows["never"]) == ("not reached (best 0.2200)", "not reached")
    # median over the seeds that reached it: 2.0 and 3.0 s, 128 and 192 samples
    assert ttq.cells(rows["some"]) == ("2.5 (2/3 seeds; the others not reached, best 0.3700)",
                                       "160 (2/3 seeds)")


def test_samples_to_quality_are_the_samples_the_curve_counted():
    """Not steps x batch: what the run counted (a window that re-packs trains steps of
    uneven size), and n/a, saying why, in a run stored before samples were counted."""
    r = run("ddp", [1, 20], valid=(0.1, 0.5, 0.5))
    r.curve[1]["samples"] = 123  # the real count through the second evaluation
    row = analyze([r], SPE)["rows"][0]
    assert row["samples_to_quality"] == 123 and row["time_to_quality_s"] == 2.0
    for e in r.curve:
        del e["samples"]  # a run stored before samples were counted
    assert ttq.cells(analyze([r], SPE)["rows"][0]) == ("2.0", "n/a (not counted when stored)")


def test_quality_tables_read_results_stored_before_time_to_quality():
    """A quality.json from before (an HR@10 target, no validation target) still renders:
    its time-to-quality cells say why they are empty."""
    from fsbench.cli.quality import markdown

    old = {"data": "recbole:x", "model": "sasrec", "loss": "full", "epochs": 2,
           "steps_per_epoch": 4, "seeds": [0], "baseline": "ddp", "target_hr10": 0.2,
           "target_fraction": 0.9, "margin": 0.1,
           "rows": [{"trainer": "ddp", "world_size": 2, "seeds": 1, "hr_at_10": 0.3,
                     "hr_at_10_ci": [0.2, 0.4], "ndcg_at_10": 0.2, "ndcg_at_10_ci": [0.1, 0.3],
                     "epochs_selected": [2], "steps_to_target": 8, "time_to_target_s": 1.5,
                     "reached_target": 1, "loss_max_rel_diff": 0.0, "equivalent": "(baseline)"}]}
    text = markdown(old)
    assert text.count(ttq.STORED_BEFORE) == 3, text  # the header and both cells
    new = analyze([run("ddp", [1, 20], valid=(0.1, 0.5, 0.5))], SPE)
    new.update(data="recbole:x", model="sasrec", loss="full", epochs=3, seeds=[0])
    text = markdown(json.loads(json.dumps(new)))  # as stored: world sizes become strings
    assert "95% of ddp's best" in text and "2 ranks 0.4750" in text and "| 2.0 | 128 |" in text


def test_a_trainer_that_cannot_run_the_protocol_says_why(tmp_path, capsys):
    """TorchRec's CPU tables have no Adam: as the baseline that is a one-line error before
    any rank starts; beside the baseline it is a row of the table, with the reason."""
    from fsbench.cli.quality import markdown

    data = write_learnable(tmp_path / "d.txt")
    args = ["quality", "--data", data, "--set", "optimizer.tables=adam", "--store", str(tmp_path / "q")]
    assert main([*args, "--trainers", "torchrec,ddp"]) == 2
    err = capsys.readouterr().err
    assert "optimizer.tables=adam" in err and err.count("\n") == 1
    assert not (tmp_path / "q").exists()
    result = analyze([run("ddp", [1, 20], valid=(0.1, 0.5, 0.5))], SPE)
    result.update(data="recbole:x", model="sasrec", loss="full", epochs=3, seeds=[0],
                  not_run={"torchrec": "optimizer.tables=adam: the torchrec trainer runs sgd"})
    assert "| torchrec | | | | | | | | | | not run: optimizer.tables=adam" in markdown(result)


def test_the_report_shows_time_to_quality_from_the_runs_curves(tmp_path):
    """`fsbench report` over a quality store: the target and time to quality per row, from
    the runs' stored learning curves; runs stored before samples were counted say so."""
    import pandas as pd

    from fsbench.reporting.report import report_table

    rows = []
    for i, (trainer, valid, counted) in enumerate([("ddp", (0.1, 0.4), True), ("ddp", (0.2, 0.4), True),
                                                    ("freescale", (0.39, 0.4), False),
                                                    ("freescale", (0.1, 0.2), False)]):
        curve = [{"step": 3 + 4 * k, "train_s": 1.0 + k, "hr_at_10": 0.1, "valid_ndcg_at_10": v,
                  **({"samples": 64 * (k + 1)} if counted else {})} for k, v in enumerate(valid)]
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"quality_curve": curve}))
        rows.append({"workload": "w", "trainer": trainer, "world_size": 2, "status": "complete",
                     "samples_per_s": 10.0, "hr_at_10": 0.1, "ndcg_at_10": 0.05, "run_dir": str(d)})
    table = report_table(pd.DataFrame(rows), "ddp").set_index("trainer")
    assert table.loc["ddp", "target_valid_ndcg_at_10"] == pytest.approx(0.38)
    assert (table.loc["ddp", "time_to_quality_s"], table.loc["ddp", "samples_to_quality"]) == (2.0, 128)
    assert table.loc["freescale", "time_to_quality_s"] == \
        "1.0 (1/2 seeds; the others not reached, best 0.2000)"
    assert table.loc["freescale", "samples_to_quality"] == "n/a (not counted when stored) (1/2 seeds)"
    # a store of speed runs (no validation scores) keeps its table as it was
    for r in rows:
        (Path(r["run_dir"]) / "summary.json").write_text(json.dumps({"quality_curve": [
            {"step": 3, "train_s": 1.0, "hr_at_10": 0.1}]}))
    assert "time_to_quality_s" not in report_table(pd.DataFrame(rows), "ddp")


def test_quality_rejects_bad_input_in_one_line(tmp_path, capsys):
    assert main(["quality", "--data", "synthetic"]) == 2
    assert "has no histories to load" in capsys.readouterr().err
    data = write_learnable(tmp_path / "d.txt")
    assert main(["quality", "--data", data, "--epochs", "0"]) == 2
    assert "--epochs=0 must be >= 1" in capsys.readouterr().err
    assert main(["quality", "--data", data, "--margin", "0"]) == 2
    assert "--margin=0.0 must be > 0" in capsys.readouterr().err
    for bad in ("0", "1.5", "nan"):
        assert main(["quality", "--data", data, "--target-fraction", bad]) == 2
        err = capsys.readouterr().err
        assert f"--target-fraction={float(bad)} must be in (0, 1]" in err and err.count("\n") == 1


def write_learnable(path: Path, users: int = 240, items: int = 60, seed: int = 0) -> str:
    """A sasrec-format file a sequence model can learn: each user walks a ring of items,
    mostly one step forward, sometimes two."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(users):
        item = int(rng.integers(items))
        for _ in range(int(rng.integers(8, 40))):
            lines.append(f"{u} {item}")
            item = (item + (1 if rng.random() < 0.8 else 2)) % items
    path.write_text("\n".join(lines) + "\n")
    return f"sasrec:{path}"


@pytest.mark.dist
def test_quality_passes_the_real_trainers_and_flags_the_broken_ones(tmp_path, rank_pythonpath, capsys):
    """The issue's check: a trainer that trains on one-step-stale embeddings, and one that
    drops a rank's gradients, are NOT equivalent to DDP; FreeScale, TorchRec and DeepSpeed
    are (or the verdict says why it cannot tell; never a silent pass)."""
    data = write_learnable(tmp_path / "d.txt")
    trainers = ["ddp", "freescale", "torchrec", "deepspeed",
                "trainers_for_tests:StaleEmbeddingDDP", "trainers_for_tests:DroppedRankDDP"]
    # Adagrad at lr 0.01 (the protocol before Adam), which every trainer runs on CPU and
    # which learns this ring in 3 epochs.
    code = main(["quality", "--data", data, "--trainers", ",".join(trainers), "--epochs", "3",
                 "--seeds", "0", "--set", "global_batch_size=16", "--set", "optimizer=adagrad",
                 "--set", "lr=0.01", "--store", str(tmp_path / "q"), "--format", "json",
                 "--no-plots"])
    doc = json.loads(capsys.readouterr().out)
    rows = {r["trainer"]: r for r in doc["rows"]}
    assert code == 1
    for broken in trainers[4:]:
        assert rows[broken]["equivalent"].startswith("NOT equivalent"), rows[broken]
        assert rows[broken]["trajectory"].startswith("departs")
    for real in trainers[1:4]:
        assert rows[real]["trajectory"] == "same", rows[real]
        assert not rows[real]["equivalent"].startswith("NOT"), rows[real]
    assert rows["ddp"]["hr_at_10"] > 0.3  # it learned the ring (random: 10/60)
    assert (tmp_path / "q" / "quality" / "quality.md").read_text().count("NOT equivalent") == 2
    assert json.loads((tmp_path / "q" / "quality" / "quality.json").read_text())["rows"] == doc["rows"]
    assert rows["ddp"]["seeds_reached_quality"] == 1  # it reaches 95% of its own best
    assert rows["ddp"]["samples_to_quality"] % 16 == 0 and rows["ddp"]["time_to_quality_s"] > 0
    # the store is a store like any: its report shows quality and the learning curves
    assert main(["report", "--store", str(tmp_path / "q"), "--out", str(tmp_path / "rep")]) == 0
    assert "HR@10" in (tmp_path / "rep" / "report.md").read_text()
    assert "samples to quality" in (tmp_path / "rep" / "report.md").read_text()
    assert (tmp_path / "rep" / "learning_curves.png").stat().st_size > 1000


@pytest.mark.dist
def test_the_adam_protocol_runs_every_trainer_that_can_and_says_why_not(tmp_path, capsys):
    """The default protocol (Adam on the dense part and on the tables): FreeScale's
    sharded tables and DeepSpeed follow DDP's losses over the first epoch; TorchRec, whose
    fused CPU tables have no Adam, is a row that says so, and the exit code is 3."""
    data = write_learnable(tmp_path / "d.txt", users=120)
    code = main(["quality", "--data", data, "--trainers", "ddp,freescale,deepspeed,torchrec",
                 "--epochs", "1", "--seeds", "0", "--store", str(tmp_path / "q"),
                 "--format", "json", "--no-plots"])
    doc = json.loads(capsys.readouterr().out)
    rows = {r["trainer"]: r for r in doc["rows"]}
    assert code == 3, doc
    assert set(rows) == {"ddp", "freescale", "deepspeed"}
    for trainer in ("freescale", "deepspeed"):
        assert rows[trainer]["trajectory"] == "same", rows[trainer]
    assert "optimizer.tables=adam" in doc["not_run"]["torchrec"]


def test_the_protocol_trains_on_the_history_alone(tmp_path):
    """RecBole's SASRec sees no user: the protocol turns user features off (one anonymous
    user row); turned back on, the user table holds every user."""
    from fsbench.quality.convergence import quality_workload

    data = write_learnable(tmp_path / "d.txt", users=50)
    w, _ = quality_workload("small", data, "sasrec", 1, [])
    assert not w.model.user_features and w.user_vocab == 2
    w, _ = quality_workload("small", data, "sasrec", 1, [("model.user_features", "true")])
    assert w.model.user_features and w.user_vocab == 51


def test_early_stopping_needs_validation_scores_and_a_patience_of_one_or_more(tmp_path, capsys):
    from fsbench.config import ConfigError, EvalConfig

    EvalConfig(on=True, every=4, split="valid_test", patience=10)
    with pytest.raises(ConfigError, match="eval.patience=3 needs validation scores"):
        EvalConfig(on=True, every=4, split="last", patience=3)
    with pytest.raises(ConfigError, match="eval.patience=3 needs validation scores"):
        EvalConfig(on=True, every=0, split="valid_test", patience=3)
    data = write_learnable(tmp_path / "d.txt")
    assert main(["quality", "--data", data, "--patience", "0"]) == 2
    assert "--patience=0 must be >= 1" in capsys.readouterr().err


def test_epoch_lines_print_each_new_evaluation_and_the_early_stop(tmp_path):
    """What a CI log shows of a long run: a line per epoch as rank 0 writes eval.json."""
    import io

    from fsbench.quality.epoch_lines import EpochLines

    out = io.StringIO()
    run_dir = tmp_path / "run-1"

    def write(evals, stopped=None):
        run_dir.mkdir(exist_ok=True)
        (run_dir / "manifest.json").write_text("{}")
        (run_dir / "eval.json").write_text(json.dumps({
            "patience": 2, "stopped_at_step": stopped,
            "evaluations": [{"step": 4 * k + 3, "hr_at_10": 0.1 * k, "ndcg_at_10": 0.05 * k,
                             "valid_ndcg_at_10": v} for k, v in enumerate(evals)]}))

    with EpochLines(tmp_path, "ddp at 2 ranks, seed 0", 200, every_s=3600, stream=out) as lines:
        lines.poll()  # nothing written yet: nothing printed
        write([0.2, 0.3])
        lines.poll()
        write([0.2, 0.3, 0.25, 0.28], stopped=15)
    text = out.getvalue().splitlines()
    assert len(text) == 5, text
    assert text[0].startswith("quality: ddp at 2 ranks, seed 0: epoch 1 (at most 200): test HR@10 0.0000")
    assert text[3].endswith("valid NDCG@10 0.2800 (best 0.3000 at epoch 2)")
    assert text[4] == ("quality: ddp at 2 ranks, seed 0: stopped early after epoch 4: no better "
                       "validation NDCG@10 in 2 epochs")


def test_the_quality_table_says_how_runs_stopped():
    from fsbench.cli.quality import markdown

    ranks = np.random.default_rng(1).integers(1, 40, 400)
    result = analyze([run("ddp", ranks), run("freescale", ranks)], SPE, baseline="ddp", margin=0.1)
    result.update(data="recbole:x", model="sasrec", loss="full", epochs=200, patience=10, seeds=[0])
    text = markdown(result)
    assert "up to 200 epochs of 4 steps, each run stopped after 10 epochs without a better validation" in text
    assert "| 3 (3) |" in text  # the epoch picked, of the epochs trained


@pytest.mark.dist
def test_a_quality_run_stops_early_on_every_rank_once_validation_stops_improving(tmp_path, capsys):
    """RecBole's early stopping end to end at 2 ranks: with a patience of 1 a run ends at
    the first epoch that is no better than the best before it, far below the cap, on both
    ranks (the run completes), and the table reads the best-validation epoch's scores."""
    data = write_learnable(tmp_path / "d.txt", users=120)
    code = main(["quality", "--data", data, "--trainers", "ddp", "--patience", "1",
                 "--max-epochs", "30", "--seeds", "0", "--set", "lr=0.01", "--store", str(tmp_path / "q"),
                 "--format", "json", "--no-plots"])
    assert code == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    (row,) = doc["rows"]
    (trained,), (picked,) = row["epochs_trained"], row["epochs_selected"]
    assert trained < 30 and picked == trained - 1  # one epoch past its best, as patience 1 says
    (run_dir,) = [p for p in (tmp_path / "q").iterdir() if (p / "eval.json").exists()]
    evaluation = json.loads((run_dir / "eval.json").read_text())
    assert evaluation["stopped_at_step"] is not None and len(evaluation["evaluations"]) == trained
    valid = [e["valid_ndcg_at_10"] for e in evaluation["evaluations"]]
    assert valid[-1] <= max(valid[:-1]) and all(b > a for a, b in zip(valid[:-2], valid[1:-1]))
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "complete"
    # stderr is no terminal here: a line per epoch, and the stop
    assert "quality: run 1 of 1, ddp at 2 ranks, seed 0: epoch 1 (at most 30)" in err
    assert f"stopped early after epoch {trained}" in err
