"""`fsbench report --format html`: one self-contained page, checked as text and as rendered
by headless Chromium."""
import base64
import html
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from fsbench.running import store
from fsbench.cli import main
from fsbench.reporting.plot_data import step_timeline
from fsbench.reporting.plots import PLOTS
from fsbench.reporting.report import select_runs, write_report
from fsbench.reporting.report_page import _header, arranged, run_command
from fsbench.stats import median_ratio_interval
from fsbench.table import formatted
from fsbench.training.trainer import option_defaults, resolve_trainer_class
from fsbench.measurement.timeline import read_timelines

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = pytest.mark.parallel_safe

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DATA_PNG = "data:image/png;base64,"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Matplotlib's C1 (orange): the exposed-communication bars and the second trainer's lines
# and markers. The page's CSS never uses it: in a screenshot only the plots can hold it.
PLOT_ORANGE = (255, 127, 14)


@pytest.fixture(scope="module")
def page(tiny_sweep, tmp_path_factory):
    """report.html over real runs, one of them marked contended, and a simulated row
    (a projection has no run directory) beside them."""
    runs = select_runs([], tiny_sweep)
    # The flags under test are set here: a real run of a busy machine could carry its own.
    runs["contended"] = (runs["trainer"] == "freescale") & (runs["world_size"] == 2)
    runs["oversubscribed"] = runs["emulated"] = False
    projected = {**runs.iloc[-1].to_dict(), "world_size": 8, "simulated": True, "contended": False,
                 "run_dir": str(tmp_path_factory.mktemp("none") / "projection")}
    runs = pd.concat([runs, pd.DataFrame([projected])], ignore_index=True)
    out = tmp_path_factory.mktemp("report") / "rep"
    table, written = write_report(runs, None, "html", out)
    return table, written, out


def _results_rows(text: str) -> list[str]:
    results = text[text.index('<table class="results">'):]
    return re.findall(r"<tr[ >].*?</tr>", results[:results.index("</table>")], re.S)


@pytest.mark.dist
def test_html_report_is_one_self_contained_page(page, tiny_sweep):
    table, written, out = page
    assert written == [out / "report.html"] and [p.name for p in out.iterdir()] == ["report.html"]
    text = written[0].read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert "<style>" in text and "<script" not in text and "<link" not in text
    # Outside the embedded images: base64 can spell "http" by chance (it did, 1 run in ~10).
    assert "http" not in re.sub(r'src="data:[^"]*"', "", text), "nothing fetched, nothing linked"
    sources = re.findall(r'src="([^"]*)"', text)
    # one embedded image per plot (no learning curves: no run of this sweep was evaluated)
    assert len(sources) == len(PLOTS) - 1 == text.count("<img"), "one embedded image per plot"
    for src in sources:
        assert src.startswith(DATA_PNG) and base64.b64decode(src[len(DATA_PNG):])[:8] == PNG_MAGIC
    rows = _results_rows(text)
    assert len(rows) == len(table) + 1  # the header and one row per table row
    for (_, r), tr in zip(table.iterrows(), rows[1:]):
        assert f'<td class="text">{r["trainer"]}' in tr and f'<td class="num">{r["world_size"]}</td>' in tr
    (sim,) = [tr for tr in rows if tr.startswith('<tr class="simulated">')]
    assert '<td class="num">8</td>' in sim and "§ simulated</span>" in sim
    (cont,) = [tr for tr in rows if tr.startswith('<tr class="contended">')]
    assert ">freescale<span" in cont and "‡ contended</span>" in cont and "‡</td>" in cont
    assert sum(tr.startswith("<tr>") for tr in rows[1:]) == len(table) - 2, "the rest unmarked"
    assert "‡ contended (ranks waited" in text and "§ simulated: projected" in text
    # The header says when and where; the table starts with the answer.
    meta = text[text.index('<table class="meta">'):]
    meta = meta[:meta.index("</table>")]
    assert "<td>made</td>" in meta and "<td>machine</td>" in meta and "<td>commit</td>" in meta
    assert "<td>every row</td><td>workload: tiny" in meta, "a column the same in every row is folded"
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", rows[0])
    assert heads[:3] == ["trainer", "ranks", "throughput vs ddp"], heads


@pytest.mark.dist
def test_html_report_says_where_the_runs_came_from(page, tiny_sweep):
    text = page[2].joinpath("report.html").read_text()
    manifests = [store.read_json(d / "manifest.json") for d in sorted(tiny_sweep.iterdir())
                 if (d / "manifest.json").is_file()]
    assert len(manifests) == 4
    for m in manifests:
        assert m["run_id"] in text
        defaults = option_defaults(resolve_trainer_class(m["trainer"]))
        switches = "".join(f" --set {m['trainer']}.{k}={v}"  # only those not at their default
                           for k, v in m["config"]["trainer_options"].items() if str(v) != defaults.get(k))
        assert (f"<code>fsbench run --workload tiny --trainer {m['trainer']} --world-size "
                f"{m['world_size']} --seed 0{switches}</code>") in text
    host = manifests[0]["host"]
    assert f"<td class=\"text\">{host['hostname']}</td>" in text and str(host["platform"]) in text
    assert f"<td class=\"text\">torch</td><td class=\"text\">{manifests[0]['packages']['torch']}</td>" in text
    if manifests[0]["git_sha"]:
        assert manifests[0]["git_sha"] in text
    batch = manifests[0]["config"]["workload"]["global_batch_size"]
    assert html.escape(f'"global_batch_size": {batch},') in text  # the workload's configuration


def test_run_command_repeats_overrides_counts_and_switches():
    manifest = {"workload": "small+lengths=yelp,context_vocabs=10,20", "trainer": "freescale",
                "world_size": 4, "seed": 3,
                "config": {"workload": {"steps": 7, "warmup": 2}, "threads_per_rank": 2,
                           "input_workers": 1, "device": "cpu",
                           "trainer_options": {"balance": "lpt"}}}
    assert run_command(manifest) == (
        "fsbench run --workload small --trainer freescale --world-size 4 --seed 3 --steps 7 "
        "--warmup 2 --threads 2 --set lengths=yelp --set context_vocabs=10,20 "
        "--set freescale.balance=lpt")


def test_run_command_leaves_out_switches_at_their_defaults():
    defaults = option_defaults(resolve_trainer_class("freescale"))
    manifest = {"workload": "tiny", "trainer": "freescale", "world_size": 2, "seed": 0,
                "config": {"trainer_options": {**defaults, "window": "4"}}}
    assert run_command(manifest) == ("fsbench run --workload tiny --trainer freescale "
                                     "--world-size 2 --seed 0 --set freescale.window=4")


def test_the_page_puts_the_answer_first_and_folds_what_every_row_shares():
    table = pd.DataFrame({"workload": ["tiny", "tiny"], "trainer": ["ddp", "freescale"],
                          "world_size": [2, 2], "repeats": [3, 3], "step_time_ms_median": [10.0, 8.0],
                          "samples_per_s": [100.0, 125.0], "throughput_vs_ddp": [1.0, 1.25]})
    shown, cells, folded = arranged(table, formatted(table))
    assert list(shown.columns) == ["trainer", "world_size", "throughput_vs_ddp", "samples_per_s",
                                   "step_time_ms_median"]  # ranks: constant, but always shown
    assert list(cells.columns) == ["trainer", "ranks", "throughput vs ddp", "samples/s", "step ms"]
    assert folded == [("workload", "tiny"), ("repeats", "3")]
    same_speed = table.assign(samples_per_s=[100.0, 100.0])  # a key column can be constant too
    assert arranged(same_speed, formatted(same_speed))[2] == [
        ("workload", "tiny"), ("repeats", "3"), ("samples/s", "100.0")], "listed in the table's order"
    one_row = table.iloc[:1]
    assert arranged(one_row, formatted(one_row))[2] == [], "one row: nothing is 'the same in every row'"


def test_the_page_header_says_when_where_and_how_and_flags_a_dirty_tree():
    source = {"run_id": "r1", "git_sha": "0123456789abcdef-dirty", "packages": {"torch": "2.13.0"},
              "host": {"hostname": "box", "cpu_model": "Xeon", "cpus": 2, "python": "3.11.7"}}
    text = _header([source], "2026-12-05 06:30 UTC", "fsbench report --store runs", [("workload", "tiny")])
    assert "2026-12-05 06:30 UTC" in text and "box: Xeon, 2 cores, no GPU, Python 3.11.7" in text
    assert "<code>0123456789ab</code> <span class=\"dirty\">dirty" in text
    assert "<code>fsbench report --store runs</code>" in text and "workload: tiny" in text
    assert 'class="dirty"' not in _header([{**source, "git_sha": "0123456789abcdef"}], "now", None, [])
    other = {**source, "host": {**source["host"], "hostname": "other"}}
    assert "runs from different machines" in _header([source, other], "now", None, [])
    projected = _header([{**source, "simulated": True}], "now", None, [])
    assert "none: every row is projected" in projected and "box: Xeon" not in projected
    newer = {**source, "packages": {"torch": "2.14.0"}}
    assert "2.13.0, 2.14.0 <span class=\"dirty\">runs from different torch" in _header([source, newer], "now", None, [])


def test_the_ratio_interval_resamples_each_sides_repeats_and_needs_two_a_side():
    lo, hi = median_ratio_interval([100.0, 110.0, 90.0], [120.0, 130.0, 125.0])
    # Resampled medians stay within each side's range: 120/110 .. 130/90.
    assert 120 / 110 <= lo <= 1.25 <= hi <= 130 / 90
    assert np.isnan(median_ratio_interval([100.0], [120.0, 130.0])).all()


@pytest.mark.dist
def test_step_timeline_of_a_real_run_stays_inside_each_ranks_step(tiny_sweep):
    (run,) = [d for d in tiny_sweep.iterdir() if "-ddp-n2-" in d.name]
    step, windows, segments = step_timeline(read_timelines(run))
    assert windows["rank"].tolist() == [0, 1]
    assert set(segments["rank"]) == {0, 1} and "compute" in set(segments["kind"])
    w = windows.set_index("rank")
    assert (segments["start_ms"] >= segments["rank"].map(w["start_ms"])).all()
    assert (segments["end_ms"] <= segments["rank"].map(w["end_ms"])).all()
    compute = segments[segments["kind"] == "compute"]
    assert (compute["busy_ms"] <= compute["end_ms"] - compute["start_ms"] + 1e-9).all()


# ---------------------------------------------------------------------------- Chromium

def _chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def _headless(binary: str, tmp_path, *args: str, size: str = "1200,3000") -> subprocess.CompletedProcess:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={size}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _orange_pixels(image) -> int:
    pixels = np.asarray(image, dtype=int)
    return int(np.all(np.abs(pixels - PLOT_ORANGE) <= 8, axis=-1).sum())


@pytest.mark.dist
def test_report_html_renders_in_headless_chromium(request, tmp_path):
    binary = _chromium()
    if binary is None:  # before the fixture: a skip costs no runs
        pytest.skip("no Chromium binary on PATH (looked for " + ", ".join(CHROMIUM_NAMES)
                    + "); .ci/run installs Debian's `chromium` when it can")
    Image = pytest.importorskip("PIL.Image")
    table, (report,), _ = request.getfixturevalue("page")
    dom = _headless(binary, tmp_path, "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count(f'src="{DATA_PNG}') == len(PLOTS) - 1, "Chromium parsed every image (no learning curves here)"
    assert '<table class="results">' in dom.stdout and "‡ contended" in dom.stdout
    # The same page without its images: the control the screenshot is compared with.
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r'src="data:image/png;base64,[^"]*"', 'src=""', report.read_text()))
    shots = {}
    for name, page_file in (("report", report), ("bare", bare)):
        shot = tmp_path / f"{name}.png"
        proc = _headless(binary, tmp_path, f"--screenshot={shot}", page_file.as_uri())
        assert shot.exists(), proc.stderr[-2000:]
        shots[name] = Image.open(shot).convert("RGB")
    full = shots["report"]
    assert full.size == (1200, 3000)
    top = full.crop((0, 0, 1200, 500))  # title, lead and the table: dark text on white
    assert sum(top.convert("L").histogram()[:100]) > 2_000, "the table is not on the screen"
    colours = np.unique(np.asarray(full).reshape(-1, 3), axis=0)
    assert len(colours) > 1_000, "a blank or flat screenshot"
    assert _orange_pixels(full) > 300 and _orange_pixels(shots["bare"]) == 0, \
        "the plots' colours appear only where the images are"


# A workload name as long as real-data runs have them, one path without a hyphen or space
# to break at.
LONG_WORKLOAD = ("tiny+data=recbole:/home/someone/datasets/recbole/movielens100k/ml100k.inter,"
                 "model.dim=128,lengths=hist:/home/someone/lengths/kuairand1khistogramofhistorylengths.csv")
# After the page loaded: the widths that say whether it fits its window, as JSON in a <pre>.
LAYOUT_PROBE = """<script>
addEventListener('load', () => {
  const table = document.querySelector('table.results').getBoundingClientRect();
  const out = {page: document.documentElement.scrollWidth, window: innerWidth, table: table.right,
               scrolled: [...document.querySelectorAll('.scroll, pre')].filter(
                   e => e.scrollWidth > e.clientWidth).length};
  const p = document.createElement('pre'); p.id = 'probe'; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
});
</script></body>"""


@pytest.mark.dist
def test_report_page_fits_1400_pixels_with_a_long_workload_in_chromium(tiny_sweep, tmp_path):
    """Issue 44: a data=recbole:PATH workload's name ran the results table off the page's
    right edge. Laid out by Chromium at 1,400 px: the page, the table and every scroll box
    fit; the screenshot's header band ends where the table does, inside the window."""
    import json

    binary = _chromium()
    if binary is None:
        pytest.skip("no Chromium binary on PATH (looked for " + ", ".join(CHROMIUM_NAMES) + ")")
    Image = pytest.importorskip("PIL.Image")
    runs = select_runs([], tiny_sweep)
    runs["workload"] = np.where(runs["trainer"] == "ddp", runs["workload"], LONG_WORKLOAD)
    _, (report,) = write_report(runs, None, "html", tmp_path / "rep", plots=False)
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", LAYOUT_PROBE))
    width = 1400
    dom = _headless(binary, tmp_path, "--virtual-time-budget=5000", "--dump-dom", probed.as_uri(),
                    size=f"{width},2000")
    layout = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout).group(1)))
    assert layout["window"] == width, layout
    assert layout["page"] <= width and layout["table"] <= width and layout["scrolled"] == 0, layout
    shot = tmp_path / "shot.png"
    _headless(binary, tmp_path, f"--screenshot={shot}", report.as_uri(), size=f"{width},2000")
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=int)
    header_grey = np.all(pixels == (0xF2, 0xF2, 0xF2), axis=-1)  # the table's <th> background
    columns = np.flatnonzero(header_grey.sum(axis=0) > 10)
    assert columns.size and abs(columns.max() + 1 - layout["table"]) <= 2, (columns.max(), layout)
