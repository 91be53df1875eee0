"""Bad input: one line naming the field and what is allowed, exit code 2, no rank started."""
import pytest

from fsbench.cli import main


NO_CUDA = not __import__("torch").cuda.is_available()
HAS_TORCHREC = __import__("importlib.util").util.find_spec("torchrec") is not None


@pytest.mark.parametrize("argv, expected", [
    pytest.param(["run", "--workload", "tiny", "--device", "cuda"], "--device cuda: no CUDA device",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is visible")),
    (["run", "--workload", "huge"], "workload='huge' is unknown; choose one of: tiny, small"),
    (["run", "--workload", "tiny", "--trainer", "magic"], "trainer='magic' is unknown; choose one of: ddp, torchrec, deepspeed, freescale"),
    (["run", "--workload", "tiny", "--world-size", "0"], "--world-size=0 must be >= 1"),
    (["sweep", "--workload", "tiny", "--world-sizes", "1,0"], "every world size must be >= 1"),
    (["run", "--workload", "tiny", "--set", "colour=blue"], "--set colour: unknown key; allowed:"),
    (["run", "--workload", "tiny", "--set", "model.depth=3"], "--set model.depth: unknown key; allowed: model.family"),
    (["run", "--workload", "tiny", "--set", "global_batch_size=many"], "expected an integer"),
    (["run", "--workload", "tiny", "--set", "model.family=bert"], "model.family='bert' is not allowed; choose one of: hstu, sasrec"),
    (["run", "--workload", "tiny", "--set", "lengths=/no/such.csv"], "lengths="),
    (["run", "--workload", "tiny", "--set", "lengths=hist:/no/such/file.csv"], "/no/such/file.csv"),
    (["run", "--workload", "tiny", "--set", "steps"], "expected key=value"),
    (["run", "--workload", "tiny", "--set", "ddp.bogus=1"], "--set ddp.bogus: unknown option of trainer 'ddp'"),
    (["run", "--workload", "tiny", "--world-size", "9"], "world_size=9 exceeds global_batch_size=8"),
    (["run", "--workload", "tiny", "--warmup", "4"], "warmup=4 must be >= 0 and < steps=4"),
    (["run", "--workload", "tiny", "--trainer", "freescale", "--set", "freescale.partitioner=greedy"],
     "freescale.partitioner='greedy' is not allowed; choose one of: kk, lpt, best"),
    (["run", "--workload", "tiny", "--trainer", "freescale", "--set", "freescale.window=0"],
     "freescale.window='0' must be an integer >= 1"),
    (["run", "--workload", "tiny", "--trainer", "freescale", "--set", "freescale.data=sharded",
      "--set", "freescale.window=2"], "freescale.window > 1 needs freescale.data=replicated"),
    pytest.param(["run", "--workload", "tiny", "--trainer", "freescale", "--set",
                  "freescale.transport=sm_free"],
                 "freescale.transport=sm_free cannot run here: it needs CUDA ranks",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is visible")),
    (["run", "--workload", "tiny", "--trainer", "freescale", "--set", "freescale.overlap=off"],
     "freescale.priority=on needs freescale.overlap=on"),
    (["run", "--workload", "tiny", "--set", "optimizer.tables=lamb"],
     "optimizer.tables='lamb' is not allowed; choose one of: adagrad, rowwise_adagrad, adam, "
     "sparse_adam, sgd"),
    (["run", "--workload", "tiny", "--set", "optimizer.dense=sparse_adam"],
     "optimizer.dense='sparse_adam' is not allowed; choose one of: adam, adagrad, sgd"),
    (["run", "--workload", "tiny", "--set", "optimizer.tables_lr=0"], "optimizer.tables_lr=0.0 must be > 0"),
    (["run", "--workload", "tiny", "--set", "optimizer.momentum=0.9"],
     "--set optimizer.momentum: unknown key; allowed: optimizer.tables, optimizer.tables_lr"),
    (["run", "--workload", "tiny", "--set", "optimizer_parts.tables=adam"], "--set optimizer_parts.tables: unknown key"),
    pytest.param(["run", "--workload", "tiny", "--trainer", "torchrec", "--set", "optimizer.tables=adam"],
                 "optimizer.tables=adam: the torchrec trainer runs sgd, adagrad, rowwise_adagrad on cpu (fbgemm 1.8 "
                 "has no CPU fused Adam", marks=pytest.mark.skipif(not HAS_TORCHREC, reason="no torchrec")),
    (["run", "--workload", "tiny", "--trainer", "deepspeed", "--set", "optimizer.dense=adam"],
     "the deepspeed trainer steps tables and dense part with one optimizer: optimizer.tables=adagrad "
     "and optimizer.dense=adam must be the same one of adam, adagrad, sgd"),
    (["run", "--workload", "tiny", "--trainer", "freescale", "--set", "freescale.micro_batches=2"],
     "freescale.micro_batches > 1 needs freescale.tables=replicated"),
    (["run", "--workload", "tiny", "--trainer", "freescale", "--set", "freescale.chunks=-1"],
     "freescale.chunks='-1' must be an integer >= 0"),
    (["run", "--workload", "tiny", "--trainer", "deepspeed", "--set", "deepspeed.zero_stage=5"],
     "deepspeed.zero_stage='5' is not allowed"),
])
def test_bad_input_gets_one_line_and_exit_code_2(argv, expected, capsys, tmp_path):
    code = main(argv + ["--store", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir()), "no run directory may be created for bad input"


def test_cuda_runs_that_cannot_mean_anything_are_refused_before_ranks_start(tmp_path, capsys, monkeypatch):
    """More local ranks than GPUs: one line, exit 2, nothing started. (The machine's GPU
    count is stood in for here: this checks input validation, not a measurement.)"""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code = main(["sweep", "--workload", "tiny", "--device", "cuda", "--world-sizes", "1,2",
                 "--store", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "world size 2 needs one GPU per local rank and 1 are visible" in err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_the_ground_truth_model_may_run_on_cuda_as_device_time():
    """compute=synthetic on CUDA is a sleep kernel of the same cost (fsbench.models.synthetic),
    so that the ground truth checks the GPU's busy measure; it used to be refused."""
    from fsbench.config import RunConfig
    from fsbench.running.groundtruth import synthetic_workload

    run = RunConfig(workload=synthetic_workload(), trainer="ddp", device="cuda", world_size=1)
    assert run.workload.compute == "synthetic" and run.resolved_backend == "nccl"


def test_unreadable_length_csv_is_named(tmp_path, capsys):
    bad = tmp_path / "lengths.csv"
    bad.write_text("this,is\nnot,numbers\n")
    code = main(["run", "--workload", "tiny", "--set", f"lengths=hist:{bad}", "--store", str(tmp_path / "o")])
    assert code == 2
    assert str(bad) in capsys.readouterr().err


def test_list_names_workloads_length_presets_and_trainers(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ["tiny", "small", "medium", "large", "amazon-beauty", "kuairand-1k", "ddp"]:
        assert name in out


@pytest.mark.parametrize("trainer, module", [("deepspeed", "deepspeed"), ("torchrec", "torchrec"),
                                             ("torchrec", "fbgemm_gpu")])
def test_missing_framework_names_the_extra_to_install(trainer, module, tmp_path):
    """A trainer whose framework is not installed: one line naming the extra, exit 2."""
    import subprocess
    import sys

    code = (f"import sys; sys.modules[{module!r}] = None\n"  # as if it were not installed
            "from fsbench.cli import main\n"
            f"sys.exit(main(['run', '--workload', 'tiny', '--trainer', {trainer!r}, "
            f"'--store', {str(tmp_path)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"pip install -e '.[{trainer}]'" in err[0], err


def test_steps_and_warmup_are_checked_together_whatever_the_order(capsys):
    from fsbench.cli.dispatch import build_parser
    from fsbench.cli.run_config import build_workload

    for argv in (["--steps", "3", "--warmup", "1"], ["--warmup", "1", "--steps", "3"]):
        w = build_workload(build_parser().parse_args(["run", "--workload", "small", *argv]))
        assert (w.steps, w.warmup, w.name) == (3, 1, "small")
    w = build_workload(build_parser().parse_args(
        ["run", "--workload", "tiny", "--set", "warmup=5", "--set", "steps=9"]))
    assert (w.steps, w.warmup) == (9, 5)
    assert main(["run", "--workload", "small", "--steps", "3", "--warmup", "3"]) == 2
    assert "warmup=3 must be >= 0 and < steps=3" in capsys.readouterr().err


def test_no_command_prints_help_and_the_first_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "usage: fsbench" in out and "Start with: make run" in out


def test_version_names_the_commit(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("fsbench ") and "(git " in out


def test_list_json_holds_workload_fields_length_targets_and_trainer_switches(capsys):
    import json

    from fsbench.workloads.distributions import LENGTH_PRESETS
    from fsbench.workloads.presets import get_workload

    assert main(["list", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    small = get_workload("small")
    assert doc["workloads"]["small"]["model"]["dim"] == small.model.dim
    assert doc["workloads"]["small"]["item_vocab"] == small.item_vocab
    assert doc["workloads"]["small"]["lengths"] == small.lengths
    beauty = doc["length_presets"]["amazon-beauty"]
    assert (beauty["median"], beauty["p90"]) == (LENGTH_PRESETS["amazon-beauty"].median,
                                                 LENGTH_PRESETS["amazon-beauty"].p90)
    assert set(doc["trainers"]) == {"ddp", "torchrec", "deepspeed", "freescale"}
    tables = doc["trainers"]["freescale"]["switches"]["tables"]
    assert tables == {"default": "sharded", "allowed": ["sharded", "replicated"]}
    assert doc["trainers"]["freescale"]["switches"]["window"]["allowed"] == "integer >= 1"
    assert doc["trainers"]["ddp"]["installed"] is True


def test_list_json_says_which_trainer_is_not_installed(tmp_path):
    import json
    import subprocess
    import sys

    code = ("import sys; sys.modules['deepspeed'] = None\n"
            "from fsbench.cli import main\nsys.exit(main(['list', '--format', 'json']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ds = json.loads(proc.stdout)["trainers"]["deepspeed"]
    assert ds["installed"] is False and "deepspeed" in ds["why_not"] and ds["switches"] is None


def test_sigterm_stops_a_command_as_ctrl_c_does_and_the_handler_is_restored(monkeypatch, capsys):
    """SIGTERM (a cancelled CI job) raises inside the command like Ctrl-C, so every cleanup
    runs (fsbench.running.runner marks the run interrupted); exit 143, one line."""
    import os
    import signal
    import time

    from fsbench.cli import dispatch

    cleaned = []

    def command(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        finally:
            cleaned.append(True)
        return 0

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setitem(dispatch.COMMANDS, "list", command)
    assert main(["list"]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert cleaned and len(err) == 1 and "stopped by SIGTERM" in err[0], err
    assert signal.getsignal(signal.SIGTERM) is before
