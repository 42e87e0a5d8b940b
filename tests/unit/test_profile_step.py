"""vlmtrain.report.profile (what `vlmtrain profile` and vlmtrain.lab.profile_step print) on a slice of a real H200
trace (Bridge's PyTorch profiler with call stacks, train.profile_step): 64 ms of the issue-9 kernels-sweep best case
around one call of Bridge's ViT position-embedding interpolation."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from vlmtrain import cli
from vlmtrain.report import profile

SLICE = Path(__file__).resolve().parents[1] / "fixtures" / "profile_slice.json.gz"


def test_union_of_overlapping_kernels_and_gaps() -> None:
    busy, gaps = profile.union_ms([(0, 1000), (500, 1500), (3000, 4000), (3500, 3600)])
    assert busy == 2.5 and gaps == [(1500, 3000)]


def test_idle_gpu_is_attributed_to_the_host_code_that_held_it() -> None:
    trace = profile.read_trace(SLICE)
    s = profile.summarize_trace(trace)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert abs(sum(s["kernel_ms_by_family"].values()) - sum(e["dur"] for e in kernels) / 1e3) < 0.1
    assert s["gpu_busy_ms"] + s["idle_gaps_ms"] <= s["window_ms"] + 1e-6
    assert s["gpu_busy_fraction"] < 0.3  # the GPU mostly waited in this slice ...
    top_site, top_ms = next(iter(s["idle_ms_by_python_site"].items()))
    assert "fast_pos_embed_interpolate" in top_site and top_ms > 0.8 * s["idle_gaps_ms"]  # ... on this host loop
    # every site names model code, not the loop/thread plumbing every stack shares
    assert not any(profile.GENERIC.search(site.split(" < ")[0]) for site in s["kernel_ms_by_python_site"])


def test_cli_summarizes_a_run_dir(tmp_path: Path, capsys) -> None:
    assert cli.main(["profile", str(tmp_path)]) == 2
    assert "train.profile_step" in capsys.readouterr().out
    (tmp_path / profile.TRACE).parent.mkdir()
    shutil.copy(SLICE, tmp_path / profile.TRACE)
    assert cli.main(["profile", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[profile] window") and "fast_pos_embed_interpolate" in out
    written = json.loads((tmp_path / "torch_profile" / "profile_summary.json").read_text())
    assert written["idle_gaps"] > 0 and written == profile.summarize_trace(profile.read_trace(SLICE))
    # the same as a module (no `vlmtrain` script on a bare GPU node): it ran and printed, not a silent no-op
    proc = subprocess.run([sys.executable, "-m", "vlmtrain.cli", "profile", str(tmp_path)], capture_output=True,
                          text=True, check=True)
    assert proc.stdout.startswith("[profile] window")


def test_without_python_stacks_sites_are_the_host_ops() -> None:
    """A trace without Python frames (train.profile_stacks=false, the default) attributes kernels and idle gaps to
    the host's op ranges on the launching thread instead, and says so."""
    trace = profile.read_trace(SLICE)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "python_function"]
    s = profile.summarize_trace(trace)
    assert s["sites_from"] == "host_ops" and profile.summarize_trace(profile.read_trace(SLICE))["sites_from"] == \
        "python_stacks"
    ops = {e["name"] for e in trace["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")} | {"(no host op)"}
    assert all(part in ops for site in s["idle_ms_by_python_site"] for part in site.split(" < "))
    assert next(iter(s["idle_ms_by_python_site"])) != "(no host op)"  # the largest idle share has an op open
    assert "the host ops" in profile.render(s)


def test_ab_stretch_reads_the_profiled_step_and_the_others(tmp_path: Path) -> None:
    """lab profile-step --ab: Bridge records iteration N counted from 1 (metrics step N - 1); the other steady
    steps and the unprofiled run's median steady step are its references."""
    from vlmtrain.lab.profile_step import stretch

    for name, times in (("plain", [9, 9, 9, 1.0, 1.2, 1.1, 1.0, 1.1]), ("prof", [9, 9, 9, 1.1, 1.2, 1.5, 1.3, 1.1])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": i, "step_s": t}) + "\n" for i, t in enumerate(times)))
    s = stretch(tmp_path / "prof", tmp_path / "plain", 6)
    assert s["profiled_step_s"] == 1.5 and s["unprofiled_step_s"] == 1.1 and s["other_steps_s"] == 1.15
    assert abs(s["profiled_step_ratio"] - 1.5 / 1.1) < 1e-9
