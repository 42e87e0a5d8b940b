"""What the product tells its readers: src/, conf/ (code and comments) and the docs name no issue of the project's
tracker, nothing of the project's own test machines (their staging, limits and tools live in one lab-only doc,
docs/gpu-test-machine.md), no source the reader does not have ("the seed", "the guidance", files outside the
repository) and no machine run of a past session in code or options; the README and the docs link only inside the
repository; and the benchmark codes H1 and H2 appear only where their definition is at hand (the lab, which defines
them in vlmtrain.lab.kit.baselines, and docs that link docs/benchmarks.md's). Link targets are left out of the word
checks: an anchor into docs/measurements.md is that file's heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = ("README.md", "docs/running.md", "docs/data.md", "docs/slurm.md", "docs/design.md", "docs/architecture.md")
ENGINEER_DOCS = ("docs/benchmarks.md", "docs/performance.md", "docs/measurements.md")
LAB_ONLY = "docs/gpu-test-machine.md"
"""The one doc about the project's own GPU test machine."""
ISSUE = re.compile(r"\bissues?[- ]#?\d+", re.IGNORECASE)
TOOLING = re.compile(r"device (call|command|time|tool|minutes?)|lent (GPU )?machine|\bone carry\b|GPU machine|"
                     r"\b10-minute\b|scripts/device/|\.device(-new)?/|/tmp/(site|slurm-root)\b", re.IGNORECASE)
"""Notes about the project's own test machines."""
UNSEEN = re.compile(r"\bseed's\b|\bthe seed (uses|keeps)\b|\bthe guidance\b|\bguidance's\b|\.\./shared/|\bSTACK\.md\b",
                    re.IGNORECASE)
"""Sources a reader of the product does not have."""
MACHINE_RUN = re.compile(r"\bboot-[0-9a-f]{8}\b")
"""A past session's machine run: measurement history, which belongs in results files and measurement docs."""
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
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


def docs() -> list[Path]:
    """The README and every doc but the lab-only one."""
    return [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p != ROOT / LAB_ONLY)]


def test_no_notes_about_the_project_s_test_machines() -> None:
    assert (ROOT / LAB_ONLY).is_file() and found(TOOLING, [ROOT / LAB_ONLY])  # they are kept, in one place
    assert not (hits := found(TOOLING, [*product(), *docs()])), "\n".join(hits)


def test_no_source_the_reader_does_not_have() -> None:
    assert not (hits := found(UNSEEN, [*product(), *docs()])), "\n".join(hits)


def test_no_past_machine_run_in_code_or_options() -> None:
    assert not (hits := found(MACHINE_RUN, [*product(), *(ROOT / d for d in USER_DOCS)])), "\n".join(hits)


def test_the_docs_link_only_inside_the_repository() -> None:
    """Every relative link of the README and the docs names a file of this checkout; none leaves it."""
    outside = []
    for doc in [*docs(), ROOT / LAB_ONLY]:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if target.startswith(("http://", "https://", "mailto:")):
                    continue
                path = (doc.parent / target).resolve()
                if not path.is_relative_to(ROOT) or not path.exists():
                    outside.append(f"{doc.relative_to(ROOT)}:{i}: {target}")
    assert outside == []


def test_benchmark_codes_only_where_defined() -> None:
    lab = ROOT / "src" / "vlmtrain" / "lab"
    outside_lab = [p for p in product() if p.suffix == ".py" and lab not in p.parents]
    assert not (hits := found(BENCHMARK, outside_lab)), "\n".join(hits)
    cases = (lab / "kit" / "baselines.py").read_text()
    assert "- H1: one H200" in cases and "- H2: the same" in cases
    assert "## The benchmarks H1 and H2" in (ROOT / "docs" / "benchmarks.md").read_text()
    undefined = [d for d in USER_DOCS if found(BENCHMARK, [ROOT / d]) and DEFINITION not in (ROOT / d).read_text()]
    assert not undefined, f"name H1/H2 without linking {DEFINITION}: {undefined}"


@pytest.mark.parametrize(("pattern", "text", "hit"), [
    (TOOLING, "run it on the GPU machine", True), (TOOLING, "one 10-minute call each", True),
    (TOOLING, "export PYTHONPATH=/tmp/site:src", True), (TOOLING, "a GPU node of your own", False),
    (UNSEEN, "the seed's first choice", True), (UNSEEN, "the same seed and data order", False),
    (UNSEEN, "the guidance's first layout", True), (UNSEEN, "(../shared/notes/STACK.md)", True),
    (MACHINE_RUN, "(boot-4a774566)", True), (MACHINE_RUN, "`boot-<id>`", False),
])
def test_a_planted_note_is_found(pattern: re.Pattern[str], text: str, hit: bool) -> None:
    assert bool(pattern.search(text)) is hit


@pytest.mark.parametrize(("text", "hit"), [
    ("the issue-9 sweep", True), ("Issue 25 item 1: a job", True), ("issues 23 and 22", True),
    ("(issue 48: QWEN35_PACKING_PROVEN)", True), ("TE #2045", False), ("[m](measurements.md#x-issue-23)", False),
    ("open issues with the loader", False),
])
def test_an_issue_number_is_found_outside_link_targets(text: str, hit: bool) -> None:
    assert bool(ISSUE.search(LINK_TARGET.sub("]()", text))) is hit
