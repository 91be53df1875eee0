"""scripts/recbole_resume.py: what lets the RecBole reference (hours a seed) be cut off and
rerun. The parts that need neither torch nor RecBole: which runs are the same protocol, which
finished seeds of an earlier output are kept, the in-progress list, atomic writes. (The
resume itself, in scripts/recbole_reference.py, runs only in RecBole's side venv.)"""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("recbole_resume",
                                               ROOT / "scripts" / "recbole_resume.py")
resume = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resume)

SHA = "ab" * 32
OVERRIDES = {"seed": 0, "epochs": 200, "stopping_step": 10, "data_path": "/tmp/a/dataset",
             "checkpoint_dir": "/tmp/a/saved", "eval_args": {"split": {"LS": "valid_and_test"}},
             "topk": (10,), "train_neg_sample_args": None}


def report(path: Path, *, sha=SHA, overrides=OVERRIDES, seeds=(0,)) -> Path:
    runs = [{"seed": s, "status": "finished", "test_hit@10": 0.1} for s in seeds]
    path.write_text(json.dumps({
        "dataset": {"sha256": sha},
        "protocol": {"recbole_overrides": resume.protocol_of(overrides, with_seed=False)},
        "runs": runs, "in_progress": [{"seed": 9, "status": "in_progress"}]}))
    return path


def test_the_protocol_is_the_overrides_without_paths():
    moved = {**OVERRIDES, "data_path": "/elsewhere", "checkpoint_dir": "/elsewhere/saved"}
    assert resume.protocol_of(moved) == resume.protocol_of(OVERRIDES)
    assert resume.protocol_of({**OVERRIDES, "stopping_step": 1}) != resume.protocol_of(OVERRIDES)
    assert "seed" not in resume.protocol_of(OVERRIDES, with_seed=False)
    assert resume.protocol_of(OVERRIDES)["topk"] == [10]  # as it reads back from JSON


def test_finished_seeds_of_the_same_protocol_are_kept(tmp_path):
    assert resume.kept_runs(None, SHA, {}) == []
    assert resume.kept_runs(tmp_path / "absent.json", SHA, {}) == []
    out = report(tmp_path / "out.json", seeds=(0, 2),
                 overrides={**OVERRIDES, "data_path": "/other/dataset"})
    kept = resume.kept_runs(out, SHA, resume.protocol_of(OVERRIDES, with_seed=False))
    assert [r["seed"] for r in kept] == [0, 2]  # in_progress is not carried over as a run


@pytest.mark.parametrize("sha, overrides", [
    ("cd" * 32, OVERRIDES),                       # another data file
    (SHA, {**OVERRIDES, "stopping_step": 1}),     # another protocol
    (SHA, {**OVERRIDES, "epochs": 14}),           # another epoch cap
])
def test_finished_seeds_of_another_protocol_are_refused_not_overwritten(tmp_path, sha, overrides):
    out = report(tmp_path / "out.json")
    before = out.read_text()
    with pytest.raises(resume.ProtocolMismatch, match="another"):
        resume.kept_runs(out, sha, resume.protocol_of(overrides, with_seed=False))
    assert out.read_text() == before


def test_a_finished_seed_replaces_its_seed_and_runs_stay_ordered():
    runs = [{"seed": 2, "v": "old"}, {"seed": 0, "v": "a"}]
    merged = resume.merge_run(runs, {"seed": 2, "v": "new"})
    assert merged == [{"seed": 0, "v": "a"}, {"seed": 2, "v": "new"}]
    assert [r["seed"] for r in resume.merge_run(merged, {"seed": 1})] == [0, 1, 2]


def test_progress_is_listed_as_in_progress_not_as_a_result(tmp_path):
    seed_dir = resume.seed_dir(tmp_path, SHA, 1)
    assert seed_dir == tmp_path / SHA[:12] / "seed1"
    protocol = resume.protocol_of({**OVERRIDES, "seed": 1})
    assert resume.read_progress(seed_dir, protocol) is None
    resume.atomic_write_json(seed_dir / "progress.json", {
        "seed": 1, "protocol": protocol, "epochs_done": 7, "best_epoch": 5,
        "best_valid_score": 0.06, "cur_step": 2, "resumed_at_epochs": [4]})
    progress = resume.read_progress(seed_dir, protocol)
    entry = resume.in_progress_entry(progress)
    assert entry["status"] == "in_progress" and entry["note"].startswith("not a result")
    assert (entry["seed"], entry["epochs_done"], entry["best_epoch"]) == (1, 7, 5)
    assert resume.read_progress(seed_dir, resume.protocol_of(OVERRIDES)) is None  # seed 0


def test_a_write_cut_off_midway_leaves_the_previous_file(tmp_path):
    path = tmp_path / "last.pt"
    resume.atomic_write(path, lambda f: f.write(b"epoch 4"))

    def killed(f):
        f.write(b"epoch 5, half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        resume.atomic_write(path, killed)
    assert path.read_bytes() == b"epoch 4"
    resume.atomic_write(path, lambda f: f.write(b"epoch 5"))  # the stale .tmp is overwritten
    assert path.read_bytes() == b"epoch 5"


def test_describe_inter_counts_and_hashes_the_file(tmp_path):
    inter = tmp_path / "x.inter"
    inter.write_text("user_id:token\titem_id:token\ttimestamp:float\n1\t10\t5\n1\t11\t6\n2\t10\t7\n")
    info = resume.describe_inter(inter)
    assert (info["interactions"], info["users"], info["items"]) == (3, 2, 2)
    assert len(info["sha256"]) == 64
