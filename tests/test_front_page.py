"""The front page keeps its promises: README's Quickstart is on the first screen and runs
the scripts CI runs, the CHANGELOG's newest release is the package's version with one line
per entry, and every link of README, CHANGELOG and docs/results.md reaches a file and a
heading that exist."""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRONT_PAGES = ("README.md", "CHANGELOG.md", "docs/results.md")
QUICKSTART = "## Quickstart"
# Issue 34: what it is, the quickstart and the results table within the first screen.
FIRST_SCREEN_LINES = 25
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    # GitHub numbers repeated headings: the second `## Setup` is `#setup-1`.
    seen: dict[str, int] = {}
    anchors = set()
    for line in FENCE.sub("", markdown).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            anchors.add(slug if count == 0 else f"{slug}-{count}")
            seen[slug] = count + 1
    return anchors


def test_quickstart_is_on_the_first_screen():
    lines = _read("README.md").splitlines()
    assert QUICKSTART in lines
    assert lines.index(QUICKSTART) <= FIRST_SCREEN_LINES


def test_quickstart_runs_the_scripts_ci_runs():
    readme = _read("README.md")
    section = readme.split(QUICKSTART, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert commands == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
    for command in commands:
        assert (ROOT / command.split()[1]).is_file()
    assert "scripts/test.sh" in _read(".ci/run")


def test_changelog_newest_release_is_the_package_version():
    changelog = _read("CHANGELOG.md")
    releases = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    version = tomllib.loads(_read("pyproject.toml"))["project"]["version"]
    assert releases[:2] == ["Unreleased", version]
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    for release in releases:
        assert re.search(rf"^\[{re.escape(release)}\]: \S+$", changelog, re.M), release


def test_changelog_entries_are_one_line_each():
    continued = [line for line in _read("CHANGELOG.md").splitlines() if re.match(r"\s+\S", line)]
    assert continued == []


@pytest.mark.parametrize("name", FRONT_PAGES)
def test_front_page_links_resolve(name: str):
    page = ROOT / name
    broken = []
    for target in LINK.findall(FENCE.sub("", _read(name))):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not this repository's
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text("utf-8")):
            broken.append(target)
    assert broken == []
