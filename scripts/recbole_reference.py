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

    mkdir -p /work/recbole_state && OMP_NUM_THREADS=1 setsid nohup sh -c \
        'echo $$ > /work/recbole_state/run.pid; echo 19 > /proc/self/autogroup; \
         exec nice -n 19 /work/recbole-venv/bin/python scripts/recbole_reference.py \
         --seeds 0,1,2 --out /work/recbole_state/recbole_sasrec_ml100k.json' \
        > /work/recbole_state/run.log 2>&1 < /dev/null &

(setsid: it outlives the shell that started it. The autogroup line: with the kernel's
sched_autogroup on, a new session is its own scheduling group and `nice` only ranks a
process within its group; without it this run took a full core from everyone else.)

Resumable, because a converged seed takes hours (about 200 s an epoch on one contended
core, and 30 to 80 epochs before early stopping) and a session ends without warning. The
same command, rerun, continues where it stopped:
- after every epoch (Trainer.fit's callback) the seed's last state goes to
  --state-dir/<dataset sha256[:12]>/seed<N>/last.pt: model, Adam state, epoch, the
  early-stopping patience (trainer.cur_step), best_valid_score/result, train_loss_dict,
  the valid-score history with each epoch's seconds, RecBole's best checkpoint (kept in the
  same file so the two cannot disagree), and every RNG a continued fit draws from (see
  rng_state). One atomic write (tmp, fsync, os.replace): a kill or ctrl-C at any moment
  leaves the last completed epoch's state. progress.json beside it is the readable summary;
- a seed with a saved state of the same protocol (the override dict minus its paths)
  restores all of it and continues from the next epoch (Trainer.start_epoch), and records
  resumed_at_epochs; a seed whose saved state says training ended (early stopping, or the
  cap) is only tested;
- finished seeds already in --out (same dataset sha256 and protocol) are kept and skipped;
  an --out of another dataset or protocol is refused, not overwritten. --out is rewritten
  after every epoch: finished seeds in "runs" (status "finished"), a seed still training in
  "in_progress" (its epochs so far and best validation so far; not a result).
Keep --out outside the repository while it runs (nothing in a work tree changes under
anyone), and copy the finished file into results/ when all seeds are done.
The bookkeeping that needs neither torch nor RecBole is scripts/recbole_resume.py.

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
./log_tensorboard also go there. Torch runs single-threaded (--threads). The epoch cap
(--epochs, 200) is far above where early stopping (--stopping-step 10 epochs without a
better validation score) fires; each run records stopped_early, false meaning not converged.
A run's wall_time_parts_s["fit"] sums the seconds of its completed epochs over all the
sessions it took (an epoch cut off by a kill is not counted).
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
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

import recbole_resume as resume  # noqa: E402  (scripts/, beside this file)

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


RESUME_NOTE = (
    "Resumed at the epochs in resumed_at_epochs from the saved state of the epoch before: "
    "model, Adam state, early-stopping patience, best score, result and checkpoint, train "
    "losses, and every RNG a continued fit draws from were restored: torch's global "
    "generator (dropout), numpy's, Python's, and each RecBole loader's own torch.Generator "
    "(the train loader's drives its RandomSampler, i.e. the shuffle). So the shuffle order "
    "and dropout masks after the resume point are those of an uninterrupted run; checked "
    "on a small file (a killed and resumed run gave the same train losses and valid scores "
    "as an uninterrupted one) with torch 2.13.0 on CPU, one thread. A resumed session's "
    "first epoch_s counts from the end of its data loading.")


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


def loaders_of(*loaders) -> dict:
    return {name: loader for name, loader in zip(("train", "valid", "test"), loaders)}


def rng_state(loaders: dict) -> dict:
    """Every RNG a continued fit draws from: torch's global generator (dropout), numpy's and
    Python's, and the torch.Generator each RecBole loader owns (the train loader's drives its
    RandomSampler, i.e. the shuffle: AbstractDataLoader.__init__ seeds it with the seed)."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate(),
            "loaders": {k: v.generator.get_state() for k, v in loaders.items()}}


def set_rng_state(state: dict, loaders: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    for name, loader in loaders.items():
        loader.generator.set_state(state["loaders"][name])


def load_state(path: Path, protocol: dict) -> dict | None:
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own file
    if state["protocol"] != protocol:
        raise resume.ProtocolMismatch(
            f"{path} is a saved state of another protocol; remove it or pass another "
            "--state-dir")
    return state


def run_seed(args: argparse.Namespace, seed: int, workdir: Path, state_dir: Path,
             on_progress) -> dict:
    t0 = time.perf_counter()
    settings = overrides(args, seed, workdir)
    protocol = resume.protocol_of(settings)
    argv, sys.argv = sys.argv, sys.argv[:1]  # RecBole's Config reads --key=value from argv
    try:
        config = Config(model="SASRec", dataset=DATASET_NAME, config_dict=settings)
    finally:
        sys.argv = argv
    init_seed(config["seed"], config["reproducibility"])
    init_logger(config)
    torch.set_num_threads(args.threads)
    dataset = create_dataset(config)
    train_data, valid_data, test_data = data_preparation(config, dataset)
    loaders = loaders_of(train_data, valid_data, test_data)
    init_seed(config["seed"], config["reproducibility"])  # as quick_start does
    model = SASRec(config, train_data._dataset).to(config["device"])
    trainer = Trainer(config, model)
    t_data = time.perf_counter()

    # What a resumed seed carries over; the same dict is saved after every epoch.
    track = {"valid_scores": [], "resumed_at_epochs": [], "best_checkpoint": None,
             "done": False}
    state = load_state(state_dir / "last.pt", protocol)
    if state is not None:
        trainer.model.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.start_epoch = state["epoch"] + 1
        trainer.cur_step = state["cur_step"]
        trainer.best_valid_score = state["best_valid_score"]
        trainer.best_valid_result = state["best_valid_result"]
        trainer.train_loss_dict = dict(state["train_loss_dict"])
        set_rng_state(state["rng"], loaders)
        track.update({k: state[k] for k in track})
        track["resumed_at_epochs"] = [*state["resumed_at_epochs"], trainer.start_epoch]
        # RecBole's best checkpoint (Trainer.fit saves it on each new best); a file under
        # the work dir, so it is put back from the state, where it was saved with the rest.
        torch.save(track["best_checkpoint"], trainer.saved_model_file, pickle_protocol=4)
        print(f"seed {seed}: resuming at epoch {trainer.start_epoch} from {state_dir}"
              + (" (training had finished; testing)" if track["done"] else ""),
              file=sys.stderr, flush=True)
    last = [t_data]

    def on_epoch(epoch_idx: int, valid_score: float) -> None:
        """After each validated epoch (eval_step 1): Trainer.fit has updated best_valid_*,
        cur_step and train_loss_dict and saved a new best checkpoint, and has not yet broken
        off on early stopping. Saves the seed's state, so a kill loses at most this epoch."""
        now = time.perf_counter()
        epoch_s, last[0] = now - last[0], now
        track["valid_scores"].append((epoch_idx, float(valid_score), epoch_s))
        if trainer.cur_step == 0:  # early_stopping() updated the best: fit just saved it
            track["best_checkpoint"] = torch.load(trainer.saved_model_file, map_location="cpu",
                                                  weights_only=False)
        track["done"] = (trainer.cur_step > trainer.stopping_step  # fit breaks next
                         or epoch_idx + 1 >= trainer.epochs)
        state = {"protocol": protocol, "epoch": epoch_idx, "cur_step": trainer.cur_step,
                 "best_valid_score": trainer.best_valid_score,
                 "best_valid_result": trainer.best_valid_result,
                 "train_loss_dict": dict(trainer.train_loss_dict),
                 "model": trainer.model.state_dict(),
                 "optimizer": trainer.optimizer.state_dict(), "rng": rng_state(loaders),
                 **track}
        resume.atomic_write(state_dir / "last.pt", lambda f: torch.save(state, f))
        best_epoch = max(e for e, s, _ in track["valid_scores"]
                         if s == trainer.best_valid_score)
        progress = {"seed": seed, "protocol": protocol, "epochs_done": epoch_idx + 1,
                    "best_epoch": best_epoch, "best_valid_score": trainer.best_valid_score,
                    "best_valid_result": jsonable(dict(trainer.best_valid_result or {})),
                    "cur_step": trainer.cur_step,
                    "resumed_at_epochs": track["resumed_at_epochs"],
                    "fit_s_so_far": round(sum(dt for *_, dt in track["valid_scores"]), 1),
                    "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        resume.atomic_write_json(state_dir / "progress.json", progress)
        on_progress(progress)
        print(f"seed {seed} epoch {epoch_idx}: valid {args.valid_metric} {valid_score:.4f} "
              f"({epoch_s:.0f}s, state saved)", file=sys.stderr, flush=True)

    if not track["done"]:
        trainer.fit(train_data, valid_data, saved=True, show_progress=False,
                    callback_fn=on_epoch)
    best_valid_score, best_valid_result = trainer.best_valid_score, trainer.best_valid_result
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

    valid_scores = track["valid_scores"]
    best_epoch = max((e for e, s, _ in valid_scores if s == best_valid_score), default=None)
    epochs = len(trainer.train_loss_dict)
    fit_s = sum(dt for *_, dt in valid_scores)
    return {
        "seed": seed,
        "test_hit@10": float(test_result["hit@10"]),
        "test_ndcg@10": float(test_result["ndcg@10"]),
        "valid_metric": args.valid_metric,
        "best_valid_score": float(best_valid_score),
        "best_valid_result": jsonable(dict(best_valid_result or {})),
        "best_epoch": best_epoch,
        "status": "finished",
        "epochs_trained": epochs,
        "stopped_early": epochs < args.epochs,
        "note": None if epochs < args.epochs else (
            f"hit the epoch cap ({args.epochs}) before early stopping: not converged, the "
            "test figures are of the best checkpoint so far"),
        "resumed_at_epochs": track["resumed_at_epochs"],
        "resume_note": RESUME_NOTE if track["resumed_at_epochs"] else None,
        "wall_time_s": round(t_data - t0 + fit_s + t_test - t_fit, 2),
        "wall_time_parts_s": {"data_and_model": round(t_data - t0, 2),
                              "fit": round(fit_s, 2),
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
    ap.add_argument("--epochs", type=int, default=200,
                    help="epoch cap; large, so that early stopping ends a seed first")
    ap.add_argument("--stopping-step", type=int, default=10)
    ap.add_argument("--train-batch-size", type=int, default=256)
    ap.add_argument("--valid-metric", default="NDCG@10", choices=["NDCG@10", "Hit@10"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/recbole_reference"))
    ap.add_argument("--state-dir", type=Path, default=Path("/work/recbole_state"),
                    help="each seed's last state, under <dataset sha256[:12]>/seed<N>/")
    ap.add_argument("--out", type=Path, default=None,
                    help="write the JSON here (finished seeds in it of the same dataset and "
                         "protocol are kept and not rerun)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    inter = args.inter.resolve()
    out = args.out.resolve() if args.out else None
    state_root = args.state_dir.resolve()

    torch.set_num_threads(args.threads)
    workdir = args.workdir.resolve()
    (workdir / "dataset" / DATASET_NAME).mkdir(parents=True, exist_ok=True)
    link = workdir / "dataset" / DATASET_NAME / f"{DATASET_NAME}.inter"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(inter)

    dataset = resume.describe_inter(inter)
    protocol = resume.protocol_of(overrides(args, 0, workdir), with_seed=False)
    try:
        runs = resume.kept_runs(out, dataset["sha256"], protocol)
    except resume.ProtocolMismatch as e:
        sys.exit(str(e))
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
        "dataset": dataset,
        "protocol": {"model": "SASRec", "train_batch_size": args.train_batch_size,
                     "epochs_cap": args.epochs, "stopping_step": args.stopping_step,
                     "valid_metric": args.valid_metric, "test": "best-validation checkpoint",
                     "dropout": "RecBole SASRec defaults (hidden 0.5, attn 0.5)",
                     "recbole_overrides": protocol},
        "seen_items": check_seen_items(),
        "runs": runs,
        "in_progress": [],
    }
    todo = [s for s in seeds if s not in {r["seed"] for r in runs}]
    in_progress = {}
    for seed in todo:
        progress = resume.read_progress(resume.seed_dir(state_root, dataset["sha256"], seed),
                                        {**protocol, "seed": seed})
        if progress:
            in_progress[seed] = resume.in_progress_entry(progress)

    def write() -> None:
        report["in_progress"] = [in_progress[s] for s in sorted(in_progress)]
        summarize(report)
        if out:  # atomic, after every epoch and every seed: a cut-off run keeps what it did
            resume.atomic_write_json(out, report)

    for seed in seeds:
        if seed not in todo:
            print(f"seed {seed}: finished in {out}, kept", file=sys.stderr, flush=True)
    write()
    for seed in todo:
        def on_progress(progress: dict, seed: int = seed) -> None:
            in_progress[seed] = resume.in_progress_entry(progress)
            write()

        state_dir = resume.seed_dir(state_root, dataset["sha256"], seed)
        try:
            result = run_seed(args, seed, workdir, state_dir, on_progress)
        except resume.ProtocolMismatch as e:
            sys.exit(str(e))
        report["runs"] = resume.merge_run(report["runs"], result)
        in_progress.pop(seed, None)
        print(f"seed {seed}: test HR@10 {result['test_hit@10']:.4f} "
              f"NDCG@10 {result['test_ndcg@10']:.4f}, {result['epochs_trained']} epochs "
              f"(best {result['best_epoch']}, stopped early: {result['stopped_early']}), "
              f"{result['wall_time_s']:.0f}s", flush=True)
        write()
    print(json.dumps({k: report.get(k) for k in ("versions", "machine", "summary")}, indent=1))


def summarize(report: dict) -> None:
    runs = report["runs"]
    summary = {"seeds": [r["seed"] for r in runs]}
    if not runs:
        report["summary"] = summary
        return
    for key in ("test_hit@10", "test_ndcg@10", "epochs_trained", "wall_time_s"):
        values = [r[key] for r in runs]
        summary[key] = {"per_seed": values, "mean": statistics.fmean(values),
                        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}
    summary["all_stopped_early"] = all(r["stopped_early"] for r in runs)
    report["summary"] = summary


if __name__ == "__main__":
    main()
