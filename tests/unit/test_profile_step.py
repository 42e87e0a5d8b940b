"""benchmarks/profile_step.py's trace summary on a slice of a real H200 trace (Bridge's PyTorch profiler, Python call
stacks on): 64 ms of the issue-9 best case around one call of Bridge's ViT position-embedding interpolation."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import profile_step  # noqa: E402  (benchmarks/ is scripts, not a package)

SLICE = ROOT / "tests" / "fixtures" / "profile_slice.json.gz"


def test_union_of_overlapping_kernels_and_gaps() -> None:
    busy, gaps = profile_step.union_ms([(0, 1000), (500, 1500), (3000, 4000), (3500, 3600)])
    assert busy == 2.5 and gaps == [(1500, 3000)]


def test_idle_gpu_is_attributed_to_the_host_code_that_held_it() -> None:
    trace = profile_step.read_trace(SLICE)
    s = profile_step.summarize_trace(trace)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert abs(sum(s["kernel_ms_by_family"].values()) - sum(e["dur"] for e in kernels) / 1e3) < 0.1
    assert s["gpu_busy_ms"] + s["idle_gaps_ms"] <= s["window_ms"] + 1e-6
    assert s["gpu_busy_fraction"] < 0.3  # the GPU mostly waited in this slice ...
    top_site, top_ms = next(iter(s["idle_ms_by_python_site"].items()))
    assert "fast_pos_embed_interpolate" in top_site and top_ms > 0.8 * s["idle_gaps_ms"]  # ... on this host loop
    # every site names model code, not the loop/thread plumbing every stack shares
    assert not any(profile_step.GENERIC.search(site.split(" < ")[0]) for site in s["kernel_ms_by_python_site"])
