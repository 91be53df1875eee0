"""A store survives bad files: corrupt or foreign content is skipped with one warning
line naming it; run, sweep and report go on; an unwritable --store or --out is a one-line error."""
import json
import shutil

import pytest

from fsbench.running import store
from fsbench.running.output_paths import check_writable_dir
from fsbench.cli import main
from fsbench.config import ConfigError
from fsbench.reporting.report import select_runs


@pytest.fixture(scope="module")
def good_run(tiny_sweep):
    """One real complete run (tiny, ddp, 1 rank: the session's sweep has it), copied into
    each test's store; never written to."""
    (run_dir,) = [d for d in tiny_sweep.iterdir() if "-ddp-n1-" in d.name]
    return run_dir


def _bad_store(tmp_path, good_run):
    shutil.copytree(good_run, tmp_path / good_run.name)
    corrupt = tmp_path / "corrupt-summary"
    shutil.copytree(good_run, corrupt)
    manifest = json.loads((corrupt / "manifest.json").read_text())
    manifest["run_id"] = "corrupt-summary"
    (corrupt / "manifest.json").write_text(json.dumps(manifest))
    (corrupt / "summary.json").write_text('{"bubble_ratio": 0.1, "trunc')
    (tmp_path / "garbage-manifest").mkdir()
    (tmp_path / "garbage-manifest" / "manifest.json").write_bytes(b"\x00\xffnot json")
    (tmp_path / "list-manifest").mkdir()
    (tmp_path / "list-manifest" / "manifest.json").write_text("[1, 2]")
    (tmp_path / "calibrations").mkdir()  # not a run: silently not a row
    (tmp_path / "notes.txt").write_text("a user's notes")
    return tmp_path


@pytest.mark.dist  # good_run is a real run
def test_scan_skips_bad_files_with_one_warning_each(tmp_path, good_run, capsys):
    root = _bad_store(tmp_path, good_run)
    table = store.refresh_table(root)
    table = store.refresh_table(root)  # a second scan (a sweep rescans) repeats no warning
    assert set(table["status"]) == {"complete", "corrupt"}
    assert (table["status"] == "complete").sum() == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3, lines
    for name in ("corrupt-summary/summary.json", "garbage-manifest/manifest.json",
                 "list-manifest/manifest.json"):
        assert sum(name in line for line in lines) == 1, (name, lines)
    assert all(line.startswith("fsbench: warning: skipping ") for line in lines)
    assert "notes.txt" not in " ".join(lines) and "calibrations" not in " ".join(lines)


@pytest.mark.dist
def test_run_and_report_go_on_past_a_corrupt_summary(tmp_path, good_run, capsys):
    root = _bad_store(tmp_path, good_run)
    assert main(["run", "--workload", "tiny", "--store", str(root)]) == 0
    assert main(["report", "--store", str(root), "--format", "md", "--no-plots",
                 "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr()
    assert "| ddp |" in out.out.replace("  ", " ") or "ddp" in out.out
    assert "skipping" in out.err


@pytest.mark.dist  # good_run is a real run
def test_a_store_given_as_run_dir_is_reported(tmp_path, good_run):
    root = _bad_store(tmp_path, good_run)
    runs = select_runs([str(root)], "unused")
    assert list(runs["status"]) == ["complete"]


def test_a_directory_that_is_neither_run_nor_store_is_named(tmp_path):
    with pytest.raises(ConfigError, match="is not a run directory .*use --store DIR"):
        select_runs([str(tmp_path)], "unused")


@pytest.mark.dist  # good_run is a real run
def test_unwritable_out_is_a_one_line_error(tmp_path, good_run, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="afile/sub: cannot write there"):
        check_writable_dir(blocker / "sub")
    assert check_writable_dir(tmp_path / "new" / "dir").is_dir()
    for argv in (["run", "--workload", "tiny", "--store"], ["sweep", "--workload", "tiny", "--store"],
                 ["report", "--store", str(good_run.parent), "--out"]):
        assert main(argv + [str(blocker / "sub")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot write there" in err[0], err
