"""The import layering of src/vlmtrain: a stage imports only from its own stage or an earlier one; cli, flow and
worker wire the stages together and may import anything (and no stage imports them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
STAGES = ("config", "data", "check", "build", "launch", "train", "observe", "report", "lab")
WIRING = frozenset({"vlmtrain.cli", "vlmtrain.flow", "vlmtrain.worker"})
SWEEPER_MAY_IMPORT = frozenset({"config", "check", "launch"})


def module_of(path: Path) -> tuple[str, bool]:
    """(dotted module name, whether it is a package's __init__) of a file under SRC."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return (".".join(parts[:-1]), True) if parts[-1] == "__init__" else (".".join(parts), False)


def imports(source: str, module: str, is_package: bool = False, type_checking: bool = True) -> list[tuple[int, str]]:
    """(line, vlmtrain module) of every vlmtrain import in `source`: top level, inside functions and, unless
    `type_checking` is false (the imports that run), under TYPE_CHECKING; `from vlmtrain import x` is vlmtrain.x and
    relative imports are resolved against `module`."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    tree = ast.parse(source)
    annotations_only = set() if type_checking else {
        id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test).endswith(
            "TYPE_CHECKING") for stmt in node.body for inner in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module or ""
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "vlmtrain"]


def stage(module: str) -> int | None:
    """The stage index of a vlmtrain module; None for the package itself and the wiring modules."""
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def wiring(module: str) -> bool:
    """A wiring module or anything in it (`vlmtrain.worker.loaded`): matched by dotted prefix, not by name."""
    return any(module == w or module.startswith(f"{w}.") for w in WIRING)


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Every import in `source` (the text of `module`) of a later stage or of a wiring module."""
    own = stage(module)
    if own is None:
        return []
    out = []
    for line, target in imports(source, module, is_package):
        to = stage(target)
        if wiring(target) or (to is not None and to > own):
            where = STAGES[to] if to is not None else "wiring"
            out.append(f"{module}:{line} imports {target} ({where} comes after {STAGES[own]})")
    return out


def modules() -> list[tuple[Path, str, bool]]:
    return [(p, *module_of(p)) for p in sorted((SRC / "vlmtrain").rglob("*.py"))]


def import_graph(prefix: str, type_checking: bool) -> dict[str, set[str]]:
    """Module -> the modules it imports, among those under `prefix` (a name is the longest module it starts with:
    `from vlmtrain.config.groups.model import Family` imports vlmtrain.config.groups.model)."""
    found = {m: (path, pkg) for path, m, pkg in modules() if m == prefix or m.startswith(f"{prefix}.")}
    graph: dict[str, set[str]] = {}
    for m, (path, pkg) in found.items():
        graph[m] = set()
        for _, name in imports(path.read_text(), m, pkg, type_checking):
            while name and name not in found:
                name = name.rpartition(".")[0]
            if name and name != m:
                graph[m].add(name)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (its modules in import order, the first again at the end), [] where there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str]:
        state[m] = 1
        for to in sorted(graph.get(m, ())):
            if state.get(to) == 1:
                return [*path[path.index(to):], m, to]  # `to` is on the current path
            if to not in state and (found := visit(to, [*path, m])):
                return found
        state[m] = 2
        return []

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, []))), [])


def test_config_imports_no_circle_at_run_time() -> None:
    """config/ is stage 0, read by every later one: the imports that run (top level or in a function) form no
    circle. Those under TYPE_CHECKING (RunConfig, Resolved in annotations) may."""
    assert cycle(import_graph("vlmtrain.config", type_checking=False)) == []


def test_a_planted_circle_is_found() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vlmtrain.config.schema import RunConfig\n"
    assert imports(source, "vlmtrain.config.world", type_checking=False) == []
    assert imports(source, "vlmtrain.config.world") == [(3, "vlmtrain.config.schema.RunConfig")]


def test_every_module_is_in_a_stage_or_wiring() -> None:
    stray = [m for _, m, _ in modules() if m != "vlmtrain" and m not in WIRING and stage(m) is None]
    assert not stray, f"modules outside the stages {STAGES} and the wiring modules: {stray}"


def test_no_stage_imports_a_later_stage() -> None:
    found = [v for path, m, pkg in modules() for v in violations(path.read_text(), m, pkg)]
    assert not found, "\n".join(found)


def test_the_sweeper_imports_only_config_check_and_launch() -> None:
    path = SRC / "hydra_plugins" / "vlmtrain_sweeper" / "vlmtrain_sweeper.py"
    found = [(line, target) for line, target in imports(path.read_text(), "hydra_plugins.vlmtrain_sweeper.x")
             if target.split(".")[1] not in SWEEPER_MAY_IMPORT]
    assert not found, found


@pytest.mark.parametrize(("module", "source", "reported"), [
    ("vlmtrain.launch.slurm", "from vlmtrain.train import trainer\n", "vlmtrain.train.trainer"),
    ("vlmtrain.train.trainer", "def train():\n    from vlmtrain import observe\n", "vlmtrain.observe"),
    ("vlmtrain.train.step_counters", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from vlmtrain.observe.timing import StepTimer\n", "vlmtrain.observe.timing.StepTimer"),
    ("vlmtrain.train.step_counters", "from ..observe import timing\n", "vlmtrain.observe.timing"),
    ("vlmtrain.config", "from . import compose\nfrom ..check import memory\n", "vlmtrain.check.memory"),
    ("vlmtrain.config.compose", "import vlmtrain.data.scan\n", "vlmtrain.data.scan"),
    ("vlmtrain.launch.local", "from vlmtrain import worker\n", "vlmtrain.worker"),
    ("vlmtrain.train.hf_export", "def rank_main():\n    from vlmtrain.worker import loaded\n",
     "vlmtrain.worker.loaded"),
], ids=["top level", "in a function", "type checking", "relative", "relative in a package", "import", "wiring",
        "from wiring"])
def test_a_planted_violation_is_reported(module: str, source: str, reported: str) -> None:
    found = violations(source, module, is_package=module == "vlmtrain.config")
    assert len(found) == 1 and f" imports {reported} " in found[0], found


def test_earlier_and_own_stage_imports_pass() -> None:
    source = "from vlmtrain.config import world\nfrom vlmtrain.launch.slurm import in_process\nimport os\n"
    assert violations(source, "vlmtrain.launch.local") == []
    assert violations("from vlmtrain.observe import run_summary\n", "vlmtrain.cli") == []  # wiring imports anything
