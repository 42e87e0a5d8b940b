"""The lab's one way of doing each thing, read from its source: the torchrun command has one writer, and every
process the lab starts goes through vlmtrain.lab.runner."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "vlmtrain"
LAB = SRC / "lab"


def trees(folder: Path) -> dict[str, ast.Module]:
    return {str(p.relative_to(SRC.parent)): ast.parse(p.read_text()) for p in sorted(folder.rglob("*.py"))}


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
    assert bridge_recipe.command(H1, P("r"), 1)[:-2] == local.torchrun(bridge_recipe.RANK_MODULE, [], 1, 1, 1)


def test_every_process_the_lab_starts_goes_through_the_runner() -> None:
    """No lab module but runner.py calls subprocess with the interpreter (a train.py run, a rank, a step): the
    runner's process group, log, timeout and GPU slot hold for every launch."""
    bypass = []
    for name, tree in trees(LAB).items():
        if name.endswith("lab/runner.py"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess" and \
                    "sys.executable" in ast.unparse(node):
                bypass.append(f"{name}:{node.lineno}")
    assert bypass == []
