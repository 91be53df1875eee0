"""The README and docs/ stand on their own: every link resolves inside the repository."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page):
    text = page.read_text()
    for target in LINK.findall(text):
        assert "://" not in target and not target.startswith("mailto:"), f"{page.name}: {target} leaves the repository"
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: {target} points outside the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"
    assert "../shared" not in text, f"{page.name} names a folder users do not have"


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 160
    block = lines[lines.index("```bash") + 1:lines.index("```")]
    assert [line.split()[:2] for line in block] == [["make", "run"], ["make", "test"]]
    assert (ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")


def test_every_script_is_named_in_the_results_index_with_what_it_makes():
    """scripts/ holds studies and tools; each has a line in docs/results.md (a script that
    makes nothing kept is deleted instead)."""
    section = (ROOT / "docs" / "results.md").read_text().split("## What each script in `scripts/` is for")[1]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([\w.-]+\.(?:py|sh|cjs))`", row)}
    scripts = {p.name for p in (ROOT / "scripts").iterdir() if p.is_file()}
    assert scripts <= named, f"scripts without a line in docs/results.md: {sorted(scripts - named)}"
    assert named <= scripts, f"named but gone: {sorted(named - scripts)}"
