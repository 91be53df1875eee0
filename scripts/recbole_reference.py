"""A measured outside reference: RecBole's SASRec on MovieLens-100K (HR@10, NDCG@10).

RecBole is NOT a dependency of fsbench, and this script does not run in fsbench's venv
(.venv). It runs in a separate side venv, outside the repository:

    python3.11 -m venv /work/recbole-venv
    /work/recbole-venv/bin/pip install "torch==2.13.0"           # the CPU wheel, as setup.sh
    /work/recbole-venv/bin/pip install --no-deps "recbole==1.2.1"
    /work/recbole-venv/bin/pip install "numpy<2" "pandas<3" scipy tqdm "colorlog==4.7.2" \
        "colorama==0.4.4" scikit-learn pyyaml tensorboard thop tabulate plotly texttable psutil

`--no-deps` because recbole 1.2.1 declares ray<=2.6.3, which only `recbole.quick_start`
imports (and which wants setuptools<70 and numpy 1.x); this script never imports
quick_start. numpy<2 because RecBole 1.2.1 predates numpy 2 (`Config.compatibility_settings`
reads np.float_, np.complex_, np.unicode_); should numpy 2 be installed anyway, those three
aliases are set below before RecBole is imported.

    OMP_NUM_THREADS=1 nice -n 19 /work/recbole-venv/bin/python scripts/recbole_reference.py \
        --seeds 0,1,2 --out results/recbole_sasrec_ml100k.json

Protocol (RecBole's own sequential recipe, driven through Config / create_dataset /
data_preparation / SASRec / Trainer, not quick_start): every prefix of a user's
time-ordered history (at most MAX_ITEM_LIST_LENGTH=50 items) predicts the next item; per
user the last such sample is the test case, the second-to-last the validation case, the
rest train (eval_args split LS valid_and_test, order TO, group_by user). Full ranking over
all items (padding id 0 excluded), HR@10 and NDCG@10, SASRec with CE loss over all items
(no negative sampling), early stopping on the validation metric, test with the best
checkpoint. The data file is symlinked into a work directory under /tmp as dataset
"reference", so RecBole reads exactly that file (the dataset name "ml-100k" would make
RecBole read its own bundled copy whatever data_path says); RecBole's ./log and
./log_tensorboard also go there. Torch runs single-threaded (--threads).
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

# RecBole 1.2.1's Config.compatibility_settings assigns from aliases numpy 2 removed.
for _alias, _value in (("float_", np.float64), ("complex_", np.complex128),
                       ("unicode_", np.str_)):
    if not hasattr(np, _alias):
        setattr(np, _alias, _value)

import torch  # noqa: E402
import recbole  # noqa: E402
from recbole.config import Config  # noqa: E402
from recbole.data import create_dataset, data_preparation  # noqa: E402
from recbole.model.sequential_recommender import SASRec  # noqa: E402
from recbole.trainer import Trainer  # noqa: E402
from recbole.utils import init_logger, init_seed  # noqa: E402

RECBOLE_DIR = Path(recbole.__file__).resolve().parent
DEFAULT_INTER = RECBOLE_DIR / "dataset_example" / "ml-100k" / "ml-100k.inter"
DATASET_NAME = "reference"

# What RecBole's full-sort evaluation does with a user's already-seen items, read in the
# installed recbole 1.2.1 (checked again at run time: see check_seen_items).
SEEN_ITEMS = {
    "masked_for_sequential_models": False,
    "summary": (
        "Not masked. For a sequential model (MODEL_TYPE SEQUENTIAL, e.g. SASRec) "
        "FullSortEvalDataLoader.collate_fn returns history_index=None, so "
        "Trainer._full_sort_batch_eval only sets scores[:, 0] = -inf (the padding item) and "
        "ranks every real item, already-seen (history) items included. Only for "
        "non-sequential models does the loader build uid2history_item (used items minus "
        "positives, in __init__/_set_user_property) and pass (history_u, history_i), which "
        "_full_sort_batch_eval sets to -inf. Same as fsbench's evaluation, which keeps seen "
        "items. (In MovieLens-100K no user rates an item twice, so a seen item is never "
        "the target: leaving seen items rankable can only lower HR/NDCG.)"),
    "sources": [
        "recbole/data/dataloader/general_dataloader.py: FullSortEvalDataLoader.__init__ "
        "(uid2history_item built only `if not self.is_sequential`), "
        "FullSortEvalDataLoader.collate_fn (sequential branch: "
        "`return transformed_interaction, None, positive_u, positive_i`)",
        "recbole/trainer/trainer.py: Trainer._full_sort_batch_eval "
        "(`scores[:, 0] = -np.inf`; `if history_index is not None: "
        "scores[history_index] = -np.inf`)",
    ],
    "ties": ("RecBole ranks with torch.topk (recbole/evaluator/collector.py, "
             "Collector.eval_batch_collect): tied scores are ordered by topk, not counted "
             "against the target as fsbench's rank does; with float scores ties are rare."),
}


def check_seen_items() -> dict:
    """Re-read the installed source and confirm the statements in SEEN_ITEMS still hold."""
    loader = (RECBOLE_DIR / "data" / "dataloader" / "general_dataloader.py").read_text()
    trainer = (RECBOLE_DIR / "trainer" / "trainer.py").read_text()
    checks = {
        "loader_history_only_if_not_sequential": "if not self.is_sequential:" in loader
        and "self.uid2history_item" in loader,
        "loader_sequential_returns_none":
            "return transformed_interaction, None, positive_u, positive_i" in loader,
        "trainer_masks_only_history_index": "if history_index is not None:" in trainer
        and "scores[history_index] = -np.inf" in trainer,
        "trainer_masks_padding": "scores[:, 0] = -np.inf" in trainer,
    }
    return {**SEEN_ITEMS, "source_checks": checks, "source_checks_pass": all(checks.values())}


def describe_inter(path: Path) -> dict:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    users, items, rows = set(), set(), 0
    with path.open() as f:
        header = f.readline().rstrip("\n").split("\t")
        names = [h.split(":")[0] for h in header]
        u, i = names.index("user_id"), names.index("item_id")
        for line in f:
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            users.add(cols[u])
            items.add(cols[i])
            rows += 1
    return {"path": str(path), "sha256": digest, "header": header, "interactions": rows,
            "users": len(users), "items": len(items)}


def overrides(args: argparse.Namespace, seed: int, workdir: Path) -> dict:
    return {
        # environment
        "seed": seed, "reproducibility": True, "use_gpu": False, "gpu_id": "",
        "device": "cpu", "worker": 0, "show_progress": False, "state": "INFO",
        "data_path": str(workdir / "dataset"),
        "checkpoint_dir": str(workdir / "saved"),
        # data: the fields of RecBole's properties/dataset/ml-100k.yaml
        "field_separator": "\t", "USER_ID_FIELD": "user_id", "ITEM_ID_FIELD": "item_id",
        "TIME_FIELD": "timestamp", "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
        "MAX_ITEM_LIST_LENGTH": 50,
        # model (dropouts, activation, init: RecBole's properties/model/SASRec.yaml defaults)
        "hidden_size": 64, "inner_size": 256, "n_layers": 2, "n_heads": 2, "loss_type": "CE",
        # training
        "train_neg_sample_args": None, "epochs": args.epochs,
        "train_batch_size": args.train_batch_size, "learning_rate": 0.001,
        "stopping_step": args.stopping_step, "eval_step": 1,
        # evaluation
        "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "mode": "full",
                      "group_by": "user"},
        "repeatable": True, "metrics": ["Hit", "NDCG"], "topk": [10],
        "valid_metric": args.valid_metric,
    }


def jsonable(value):
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def run_seed(args: argparse.Namespace, seed: int, workdir: Path) -> dict:
    t0 = time.perf_counter()
    argv, sys.argv = sys.argv, sys.argv[:1]  # RecBole's Config reads --key=value from argv
    try:
        config = Config(model="SASRec", dataset=DATASET_NAME,
                        config_dict=overrides(args, seed, workdir))
    finally:
        sys.argv = argv
    init_seed(config["seed"], config["reproducibility"])
    init_logger(config)
    torch.set_num_threads(args.threads)
    dataset = create_dataset(config)
    train_data, valid_data, test_data = data_preparation(config, dataset)
    init_seed(config["seed"], config["reproducibility"])  # as quick_start does
    model = SASRec(config, train_data._dataset).to(config["device"])
    trainer = Trainer(config, model)
    t_data = time.perf_counter()

    valid_scores: list[tuple[int, float, float]] = []
    last = [t_data]

    def on_epoch(epoch_idx: int, valid_score: float) -> None:
        now = time.perf_counter()
        valid_scores.append((epoch_idx, float(valid_score), now - last[0]))
        last[0] = now
        print(f"seed {seed} epoch {epoch_idx}: valid {args.valid_metric} {valid_score:.4f} "
              f"({now - t0:.0f}s)", file=sys.stderr, flush=True)

    best_valid_score, best_valid_result = trainer.fit(
        train_data, valid_data, saved=True, show_progress=False, callback_fn=on_epoch)
    t_fit = time.perf_counter()
    # Trainer.evaluate(load_best_model=True) calls torch.load without weights_only=False,
    # which torch >= 2.6 refuses for RecBole's checkpoint (it pickles the Config); load the
    # best checkpoint the same way it does, with weights_only=False (our own file).
    checkpoint = torch.load(trainer.saved_model_file, map_location=config["device"],
                            weights_only=False)
    trainer.model.load_state_dict(checkpoint["state_dict"])
    trainer.model.load_other_parameter(checkpoint.get("other_parameter"))
    test_result = trainer.evaluate(test_data, load_best_model=False, show_progress=False)
    t_test = time.perf_counter()

    best_epoch = max((e for e, s, _ in valid_scores if s == best_valid_score), default=None)
    return {
        "seed": seed,
        "test_hit@10": float(test_result["hit@10"]),
        "test_ndcg@10": float(test_result["ndcg@10"]),
        "valid_metric": args.valid_metric,
        "best_valid_score": float(best_valid_score),
        "best_valid_result": jsonable(dict(best_valid_result or {})),
        "best_epoch": best_epoch,
        "epochs_trained": len(trainer.train_loss_dict),
        "stopped_early": len(trainer.train_loss_dict) < args.epochs,
        "note": None if len(trainer.train_loss_dict) < args.epochs else (
            f"hit the epoch cap ({args.epochs}) before early stopping: not converged, the "
            "test figures are of the best checkpoint so far"),
        "wall_time_s": round(t_test - t0, 2),
        "wall_time_parts_s": {"data_and_model": round(t_data - t0, 2),
                              "fit": round(t_fit - t_data, 2),
                              "test": round(t_test - t_fit, 2)},
        "history": [{"epoch": e, "train_loss": float(trainer.train_loss_dict[e]),
                     "valid_score": s, "epoch_s": round(dt, 2)} for e, s, dt in valid_scores],
        "recbole_data": {"users": dataset.user_num - 1, "items": dataset.item_num - 1,
                         "sequence_samples": dataset.inter_num,
                         "train_samples": len(train_data._dataset),
                         "valid_samples": len(valid_data._dataset),
                         "test_samples": len(test_data._dataset)},
        "model_parameters": sum(p.numel() for p in model.parameters()),
        "config": jsonable(dict(config.final_config_dict)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--inter", type=Path, default=DEFAULT_INTER,
                    help="RecBole atomic .inter file (default: the one in the recbole wheel)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2")
    ap.add_argument("--epochs", type=int, default=200, help="epoch cap (early stopping)")
    ap.add_argument("--stopping-step", type=int, default=10)
    ap.add_argument("--train-batch-size", type=int, default=256)
    ap.add_argument("--valid-metric", default="NDCG@10", choices=["NDCG@10", "Hit@10"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/recbole_reference"))
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    inter = args.inter.resolve()
    out = args.out.resolve() if args.out else None

    torch.set_num_threads(args.threads)
    workdir = args.workdir.resolve()
    (workdir / "dataset" / DATASET_NAME).mkdir(parents=True, exist_ok=True)
    link = workdir / "dataset" / DATASET_NAME / f"{DATASET_NAME}.inter"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(inter)
    os.chdir(workdir)  # RecBole writes ./log and ./log_tensorboard

    report = {
        "what": "RecBole SASRec reference on a RecBole .inter file (leave-one-out, "
                "full ranking, HR@10/NDCG@10); RecBole is not an fsbench dependency",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "versions": {"recbole": recbole.__version__, "torch": torch.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
        "machine": {"machine": platform.machine(), "processor": platform.processor(),
                    "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "device": "cpu"},
        "dataset": describe_inter(inter),
        "protocol": {"model": "SASRec", "train_batch_size": args.train_batch_size,
                     "epochs_cap": args.epochs, "stopping_step": args.stopping_step,
                     "valid_metric": args.valid_metric, "test": "best-validation checkpoint",
                     "dropout": "RecBole SASRec defaults (hidden 0.5, attn 0.5)"},
        "seen_items": check_seen_items(),
        "runs": [],
    }
    for seed in seeds:
        result = run_seed(args, seed, workdir)
        report["runs"].append(result)
        print(f"seed {seed}: test HR@10 {result['test_hit@10']:.4f} "
              f"NDCG@10 {result['test_ndcg@10']:.4f}, {result['epochs_trained']} epochs "
              f"(best {result['best_epoch']}), {result['wall_time_s']:.0f}s", flush=True)
        summarize(report)
        if out:  # after every seed, so a cut-off run keeps what finished
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("versions", "machine", "summary")}, indent=1))


def summarize(report: dict) -> None:
    runs = report["runs"]
    summary = {"seeds": [r["seed"] for r in runs]}
    for key in ("test_hit@10", "test_ndcg@10", "epochs_trained", "wall_time_s"):
        values = [r[key] for r in runs]
        summary[key] = {"per_seed": values, "mean": statistics.fmean(values),
                        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}
    report["summary"] = summary


if __name__ == "__main__":
    main()
