"""What the product tells its readers: src/, conf/ and the docs name no issue of the project's tracker and no tool of
the machines it was measured on, and the benchmark codes H1 and H2 appear only where their definition is at hand (the
lab, which defines them in vlmtrain.lab.kit.baselines, and docs that link docs/benchmarks.md's). Link targets are left
out: an anchor into docs/measurements.md is that file's heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = ("README.md", "docs/running.md", "docs/data.md", "docs/slurm.md", "docs/design.md", "docs/architecture.md")
ENGINEER_DOCS = ("docs/benchmarks.md", "docs/performance.md")
ISSUE = re.compile(r"\bissues?[- ]#?\d+", re.IGNORECASE)
TOOLING = re.compile(r"device (call|command|time|tool)|lent (GPU )?machine|\bone carry\b", re.IGNORECASE)
BENCHMARK = re.compile(r"(?<![\w.])H[12]\b")
"""H1 or H2 as a word (`wr.H2`, W&B's heading block, is not one)."""
DEFINITION = "benchmarks.md#the-benchmarks-h1-and-h2"
LINK_TARGET = re.compile(r"\]\([^)]*\)")


def lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a file, markdown link targets removed."""
    return [(i, LINK_TARGET.sub("]()", line)) for i, line in enumerate(path.read_text().splitlines(), 1)]


def found(pattern: re.Pattern[str], paths: list[Path]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in paths for i, line in lines(p) if pattern.search(line)]


def product() -> list[Path]:
    """The code and options a user runs and reads."""
    return sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "conf").rglob("*.yaml")])


def test_no_issue_numbers() -> None:
    paths = [*product(), *(ROOT / d for d in (*USER_DOCS, *ENGINEER_DOCS))]
    assert not (hits := found(ISSUE, paths)), "\n".join(hits)


def test_no_tooling_words() -> None:
    assert not (hits := found(TOOLING, [*product(), *(ROOT / d for d in USER_DOCS)])), "\n".join(hits)


def test_benchmark_codes_only_where_defined() -> None:
    lab = ROOT / "src" / "vlmtrain" / "lab"
    outside_lab = [p for p in product() if p.suffix == ".py" and lab not in p.parents]
    assert not (hits := found(BENCHMARK, outside_lab)), "\n".join(hits)
    cases = (lab / "kit" / "baselines.py").read_text()
    assert "- H1: one H200" in cases and "- H2: the same" in cases
    assert "## The benchmarks H1 and H2" in (ROOT / "docs" / "benchmarks.md").read_text()
    undefined = [d for d in USER_DOCS if found(BENCHMARK, [ROOT / d]) and DEFINITION not in (ROOT / d).read_text()]
    assert not undefined, f"name H1/H2 without linking {DEFINITION}: {undefined}"


@pytest.mark.parametrize(("text", "hit"), [
    ("the issue-9 sweep", True), ("Issue 25 item 1: a job", True), ("issues 23 and 22", True),
    ("(issue 48: QWEN35_PACKING_PROVEN)", True), ("TE #2045", False), ("[m](measurements.md#x-issue-23)", False),
    ("open issues with the loader", False),
])
def test_an_issue_number_is_found_outside_link_targets(text: str, hit: bool) -> None:
    assert bool(ISSUE.search(LINK_TARGET.sub("]()", text))) is hit
