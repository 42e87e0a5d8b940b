"""The lab's one way of doing each thing, read from its source: the kit beneath the experiments, one parser for every
experiment, one case type and its command line written once, the torchrun command written once, every process the
lab starts going through vlmtrain.lab.kit.runner, and results files read and written through its store."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "vlmtrain"
LAB = SRC / "lab"
KIT = LAB / "kit"


def trees(folder: Path) -> dict[str, ast.Module]:
    """Every module under `folder`, parsed, by its path under src/ (or the checkout, for the tests)."""
    base = SRC.parent if folder.is_relative_to(SRC.parent) else ROOT
    return {str(p.relative_to(base)): ast.parse(p.read_text()) for p in sorted(folder.rglob("*.py"))}


PROCESSES = {"vlmtrain/lab/bridge_alone.py", "vlmtrain/lab/bridge_recipe_rank.py",
             "vlmtrain/lab/checks/packing_harness.py", "vlmtrain/lab/checks/hf_parity.py"}
"""Modules the lab starts as processes of their own (torchrun ranks, verification's logits step): not experiments."""


def test_every_experiment_is_reachable_from_the_one_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """Every lab module with `add_arguments` and `run` is an experiment of `vlmtrain lab`, whose --help reaches it;
    no other lab module has a command line of its own (an argparse parser or a __main__ block) but the processes
    the runner starts; the aliases are the same experiments."""
    from vlmtrain import cli
    from vlmtrain.lab.kit import experiments

    registered = {module for module, _ in experiments.EXPERIMENTS.values()}
    for name, tree in trees(LAB).items():
        defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        own = "ArgumentParser(" in ast.unparse(tree) or "__main__" in ast.unparse(tree)
        if {"add_arguments", "run"} <= defs:
            assert name.removesuffix(".py").replace("/", ".") in registered, name
        else:
            assert not own or name in PROCESSES, f"{name} has a command line outside `vlmtrain lab`"
    top = next(a for a in cli.parser()._actions if a.dest == "command").choices
    lab = next(a for a in top["lab"]._actions if a.dest == "experiment").choices
    for name, (module, _) in experiments.EXPERIMENTS.items():
        assert lab[name].get_default("func").__module__ == module
        with pytest.raises(SystemExit) as done:
            cli.main(["lab", name, "--help"])
        assert done.value.code == 0 and f"vlmtrain lab {name}" in capsys.readouterr().out
    for alias in experiments.ALIASES:
        assert top[alias].get_default("func") is lab[alias].get_default("func")


def fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_every_named_run_is_one_case_type() -> None:
    """No class but vlmtrain.lab.kit.case.Case, in the lab or the tests, is a *Case or carries a run's overrides: a
    spec's cases, tune's candidates, the preemption sizes, the acceptance suite, packing equivalence, the precision
    recipes, Bridge's peers, the resume, reliability and kill-checkpoint runs and the config bytes cases are Cases,
    and what needs more holds one."""
    from vlmtrain.lab.bridge_benchmarks import H1
    from vlmtrain.lab.checks import (
        acceptance,
        config_bytes,
        kill_checkpoint,
        packing_equivalence,
        precision_parity,
        reliability,
        resume,
        slurm_preempt,
    )
    from vlmtrain.lab.kit.case import Case
    from vlmtrain.lab.kit.spec import load
    from vlmtrain.lab.tune import space

    others = [f"{name}:{node.name}" for name, tree in {**trees(LAB), **trees(ROOT / "tests")}.items()
              for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
              and (node.name.endswith("Case") or "overrides" in fields(node))
              and (name, node.name) != ("vlmtrain/lab/kit/case.py", "Case")]
    assert others == []
    named = [*(e.case for e in acceptance.CASES), *config_bytes.CASES, *packing_equivalence.CASES,
             *precision_parity.RECIPES, *(p.case for p in slurm_preempt.CASES.values()), H1.run,
             load("perf_h200").case({}), resume.case("r", "fsdp", Path("c")), reliability.tiny("t")]
    assert all(type(c) is Case for c in named)
    assert {type(e).__name__ for e in acceptance.CASES} == {"Expected"} and set(kill_checkpoint.MODES) <= {
        n.removeprefix("kill_ckpt_") for n in reliability.CHECKS}
    assert space.Candidate.__dataclass_fields__["case"].type == "Case"


def test_the_kit_imports_no_experiment() -> None:
    """vlmtrain.lab.kit (runner, store, case, spec, schedule, the experiment index) imports nothing of the lab
    outside itself, at top level or in a function: an experiment builds on the kit, never the other way round. The
    index names its experiments' modules as strings."""
    def imported(tree: ast.Module) -> list[tuple[int, str]]:
        return [(n.lineno, f"{n.module}.{a.name}" if isinstance(n, ast.ImportFrom) else a.name) for n in ast.walk(tree)
                if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names]

    assert all(n.level == 0 for tree in trees(KIT).values() for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    outside = [f"{name}:{line} imports {target}" for name, tree in trees(KIT).items() for line, target in imported(tree)
               if target.startswith("vlmtrain.lab.") and not target.startswith("vlmtrain.lab.kit.")]
    assert outside == []
    assert imported(ast.parse("from vlmtrain.lab import sweep\n")) == [(1, "vlmtrain.lab.sweep")]  # would be found
    from vlmtrain.lab.kit import experiments

    assert all(not m.startswith("vlmtrain.lab.kit") for m, _ in experiments.EXPERIMENTS.values())


def test_results_files_are_read_and_written_through_the_store() -> None:
    """No lab module but the store opens a results file: rows are read with store.read and written with
    store.append / store.rewrite (a run's own metrics.jsonl is observe's, read by run_summary)."""
    offenders = []
    for name, tree in trees(LAB).items():
        if name.endswith("lab/kit/store.py"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and "read_jsonl(" in ast.unparse(node) and \
                    "metrics.jsonl" not in ast.unparse(node) and "samples.jsonl" not in ast.unparse(node):
                offenders.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_the_torchrun_command_has_one_writer() -> None:
    """`torch.distributed.run` is named in code once, in launch.local.torchrun: the training launch, the lab's check
    ranks and its Bridge-only peers all build their command there."""
    from pathlib import Path as P

    from vlmtrain.lab import bridge_recipe, overhead
    from vlmtrain.lab.bridge_benchmarks import H1
    from vlmtrain.launch import local

    writers = [name for name, tree in trees(SRC).items() for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and node.value == "torch.distributed.run"]
    assert writers == ["vlmtrain/launch/local.py"]
    assert overhead.direct_command(P("c.yaml"), 2, "29500") == local.torchrun(overhead.BRIDGE_ALONE, ["c.yaml"], 2, 1,
                                                                             "29500")
    assert bridge_recipe.command(H1, P("r"), 1)[:-2] == local.torchrun(H1.run.module, [], 1, 1, 1)


def test_every_process_the_lab_starts_goes_through_the_runner() -> None:
    """No lab module but runner.py calls subprocess with the interpreter (a train.py run, a rank, a step): the
    runner's process group, log, timeout and GPU slot hold for every launch."""
    bypass = []
    for name, tree in trees(LAB).items():
        if name.endswith("lab/kit/runner.py"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess" and \
                    "sys.executable" in ast.unparse(node):
                bypass.append(f"{name}:{node.lineno}")
    assert bypass == []


def test_a_row_records_the_command_as_typed() -> None:
    """`vlmtrain lab tune ...` is recorded as `vlmtrain tune ...`, the form rows and presets name (a preset whose
    notes begin `Found by \\`vlmtrain tune` is never the hand side of a comparison); other experiments as typed."""
    from argparse import Namespace

    from vlmtrain.lab.kit import experiments
    from vlmtrain.lab.tune import command

    tune = experiments.typed(Namespace(argv=["lab", "tune", "model=tiny", "--versus", "a=1 b=2"]))
    assert tune == "vlmtrain tune model=tiny --versus 'a=1 b=2'" and f"Found by `{tune}".startswith(command.FOUND_BY)
    assert experiments.typed(Namespace(argv=["lab", "profile-step", "--step", "5"])) == \
        "vlmtrain lab profile-step --step 5"
    assert experiments.command("vlmtrain.lab.checks.verification") == "vlmtrain lab verification"
    assert experiments.command("vlmtrain.lab.sweep") == "vlmtrain sweep"


def test_the_documented_experiment_is_one() -> None:
    """docs/benchmarks.md's "Adding an experiment" module imports from the kit alone, and its command line parses
    the flags experiments share."""
    import argparse
    import re

    doc = (ROOT / "docs" / "benchmarks.md").read_text().split("## Adding an experiment", 1)[1]
    source = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    assert {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)} <= {
        "vlmtrain.lab.kit", "vlmtrain.lab.kit.baselines", "vlmtrain.lab.kit.case"}
    module: dict[str, object] = {}
    exec(compile(source, "docs/benchmarks.md", "exec"), module)  # noqa: S102 - the documented module, as written
    ap = argparse.ArgumentParser()
    module["add_arguments"](ap)  # type: ignore[operator]
    args = ap.parse_args(["--repeats", "2", "--machine-run", "node7", "--budget-s", "60"])
    assert (args.repeats, args.machine_run, args.budget_s, args.results.name) == (2, "node7", 60.0, "my_check.jsonl")
    assert callable(module["run"]) and all(type(c).__name__ == "Case" for c in module["CASES"])  # type: ignore[union-attr]
