"""vlmtrain.lab.kit.runner on real processes: a CPU dry run of train.py through `start` exits 0 and leaves its run dir
and log; the env a run gets; a timeout, stop() and kill() end the whole process tree (a child in a session of its own
and a grandchild included, as torchrun's ranks and an async checkpoint writer are)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil

from vlmtrain.lab.kit import runner
from vlmtrain.lab.kit.baselines import TINY, steps
from vlmtrain.lab.kit.case import Case

TREE = "setsid sleep 300 & (sleep 300 & wait) & wait"
"""A launcher (bash), a child in a session of its own, a subshell and its child: four processes."""


def started_tree(tmp_path: Path, **kwargs: object) -> tuple[runner.Run, list[int]]:
    run = runner.spawn(["bash", "-c", TREE], tmp_path / "tree", **kwargs)
    deadline = time.time() + 10
    while len(tree := [run.pid, *(p.pid for p in psutil.Process(run.pid).children(recursive=True))]) < 4:
        assert time.time() < deadline, "the test's process tree did not start"
        time.sleep(0.05)
    return run, tree


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_a_dry_run_of_train_py_exits_0_and_leaves_its_run_dir_and_log(tmp_path: Path) -> None:
    case = Case("tiny_dry", 1, [*TINY, *steps(2)], dry_run=True)
    run = runner.start(case, tmp_path / "run", timeout_s=300)
    assert run.wait() == 0, run.log.read_text()[-4000:]
    assert not run.timed_out and run.log == tmp_path / "run" / "train.log"
    assert (run.run_dir / "bridge_config.yaml").is_file() and (run.run_dir / "run.json").is_file()
    assert "Bridge validation: OK" in run.log.read_text()


def test_a_case_s_command_line_is_written_once() -> None:
    """The world, dry_run and no W&B run follow the overrides; a sweep's world is its own; a case that sets W&B
    itself keeps it; the runner's command and a row's record are that line."""
    single = Case("t", 2, ["model=tiny"], dry_run=False)
    assert single.command_line() == ["model=tiny", "gpus_per_node=2", "dry_run=false", "wandb.enabled=false"]
    assert runner.argv(single, Path("/r")) == [sys.executable, str(runner.TRAIN_PY), *single.command_line(),
                                                "hydra.run.dir=/r"]
    sweep = Case("s", None, ["a=1,2", "wandb.mode=offline"], multirun=True)
    assert runner.argv(sweep, Path("/s"), subdir="run")[2:] == ["-m", "a=1,2", "wandb.mode=offline",
                                                                 "hydra.sweep.dir=/s", "hydra.sweep.subdir=run"]
    assert runner.recorded(sweep) == "python train.py -m a=1,2 wandb.mode=offline"
    assert runner.recorded(Case("t", None, ["model=tiny"])) == "python train.py model=tiny wandb.enabled=false"
    assert runner.argv(single, Path("/r"), checkout=Path("/before"))[1] == "/before/train.py"
    assert single.plus("model=tiny_qwen35", name="q").setting("model") == "tiny_qwen35"


PROBE = """import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}))
"""


def test_a_check_s_own_rank_starts_as_train_py_starts_its_ranks(tmp_path: Path, monkeypatch, compose) -> None:
    """start_ranks: the run config and run.json saved in the run dir, one torchrun rank per GPU running the given
    module on the saved config, with the resolved env vars and a MASTER_PORT of its own (a real torchrun on CPU)."""
    from vlmtrain.config.resolve import resolve

    (tmp_path / "probe_rank.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{runner.ROOT / 'src'}")
    case = Case("probe", 1, TINY, module="probe_rank")
    run = compose(*case.command_line(), output_dir=str(tmp_path / "run"))
    res = resolve(run)
    ranks = runner.start_ranks(case, run, res, log=tmp_path / "run" / "probe.log", timeout_s=120)
    assert ranks.wait() == 0, ranks.log.read_text()[-3000:]
    seen = json.loads(next(line for line in ranks.log.read_text().splitlines() if line.startswith("{")))
    assert seen["argv"] == [str(tmp_path / "run" / "run_config.yaml")] and (tmp_path / "run" / "run.json").is_file()
    assert seen["env"]["WORLD_SIZE"] == "1" and seen["env"]["MASTER_PORT"].isdigit()
    assert res.env_vars and all(seen["env"][k] == v for k, v in res.env_vars.items() if k not in os.environ)


def test_a_run_gets_its_gpus_port_env_and_the_checkout_as_cwd(tmp_path: Path) -> None:
    keys = ("CUDA_VISIBLE_DEVICES", "MASTER_PORT", "PYTHONUNBUFFERED", "VLMTRAIN_TEST_VAR")
    code = f"import json, os; print(json.dumps([os.getcwd(), {{k: os.environ.get(k) for k in {keys!r}}}]))"
    run = runner.spawn([sys.executable, "-c", code], tmp_path / "env", gpus=[2, 3], port=29999,
                       env={"VLMTRAIN_TEST_VAR": "x"})
    assert run.wait() == 0
    cwd, env = json.loads(run.log.read_text())
    assert cwd == str(runner.ROOT)
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3", "MASTER_PORT": "29999", "PYTHONUNBUFFERED": "1",
                   "VLMTRAIN_TEST_VAR": "x"}


def test_free_ports_are_never_handed_out_twice() -> None:
    ports = [runner.free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)


def test_fresh_empties_the_run_dir(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("old\n")
    assert runner.spawn(["true"], tmp_path / "r", fresh=True).wait() == 0
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["train.log"]


def test_a_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    run, tree = started_tree(tmp_path, timeout_s=1.0)
    assert run.wait() == -9 and run.timed_out
    assert not alive(tree)


def test_stop_ends_the_process_group_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    polite = runner.spawn(["bash", "-c", "sleep 300 & wait"], tmp_path / "polite")
    assert polite.poll() is None
    assert polite.stop(grace_s=10) == -15  # SIGTERM to the group ended bash and its sleep
    stubborn = runner.spawn(["bash", "-c", "trap '' TERM; echo ready; sleep 300"], tmp_path / "stubborn")
    deadline = time.time() + 10
    while "ready" not in stubborn.log.read_text():  # the trap is set
        assert time.time() < deadline, "bash did not start"
        time.sleep(0.05)
    assert stubborn.stop(grace_s=0.5) == -9


def test_kill_takes_the_whole_tree_at_once(tmp_path: Path) -> None:
    run, tree = started_tree(tmp_path)
    assert run.kill() == len(tree)
    assert run.poll() == -9  # the launcher's status says it was killed
    assert not alive(tree)
