"""Where one profiled training step's GPU time went, from the chrome trace Bridge's PyTorch profiler writes
(`train.profile_step=N`: rank 0, `<run dir>/torch_profile/rank-0.json.gz`).

The component timers (observe.timing) say which tower a step's time belongs to; this says what inside it: GPU busy
time (union of kernels on all streams) vs the profiled window, kernel time by family, by name and by the code that
launched it, and GPU idle gaps attributed to what the launching thread was inside while the GPU ran dry
(host-bound code shows up there). "The code" is the Python frames where the trace has them
(`train.profile_stacks=true`), else the host's op events (aten ops, TE and Megatron's record_function ranges), which
the profiler records at a fraction of the cost. `vlmtrain profile <run dir>` prints it and writes
profile_summary.json.
"""

from __future__ import annotations

import bisect
import collections
import gzip
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

GAP_MS = 0.05  # idle intervals shorter than this are launch spacing, not host stalls
# Kernel families by name (first match wins); the rest is "other".
FAMILIES = [
    ("nccl", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|cudnn|attn|sdpa", re.I)),
    ("grouped_gemm", re.compile(r"grouped|cutlass.*group|multi_tensor_gemm", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|sm90_", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam", re.I)),
    ("moe_permute", re.compile(r"permute|unpermute|sort|topk|histogram|scatter|gather|index", re.I)),
    ("norm", re.compile(r"norm", re.I)),
    ("memcpy/memset", re.compile(r"^Memcpy|^Memset", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|reduce|fill|copy|cat|softmax|rope|rotary", re.I)),
]


def family(name: str) -> str:
    return next((f for f, rx in FAMILIES if rx.search(name)), "other")


def union_ms(intervals: Iterable[tuple[float, float]]) -> tuple[float, list[tuple[float, float]]]:
    """Covered length (ms) of (start_us, end_us) intervals and the idle gaps between them (start_us, end_us)."""
    total, gaps, cur_s, cur_e = 0.0, [], None, None
    for s, e in sorted(intervals):
        if cur_e is None:
            cur_s, cur_e = s, e
        elif s > cur_e:
            total += cur_e - cur_s
            gaps.append((cur_e, s))
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total / 1e3, gaps


# Frames every stack shares (the loop, threads, module call plumbing): skipped when naming where time went.
GENERIC = re.compile(r"threading|runpy|worker\.py|pretrain\.py|decorators\.py|trainer\.py|/train\.py\(|"
                     r"_call_impl|contextlib|schedules\.py|^<built-in|nn/modules/module|core/utils\.py|vlmtrain/")


def _stacks_at(py_events: list[dict[str, Any]], queries: list[float]) -> list[list[str]]:
    """Python frames (innermost first) open at each query time on one thread; one sweep over the nested
    intervals, so a trace with a million frames takes seconds."""
    evs = sorted(py_events, key=lambda e: (e["ts"], -e["dur"]))
    out: list[list[str]] = [[] for _ in queries]
    stack: list[dict[str, Any]] = []
    j = 0
    for i in sorted(range(len(queries)), key=queries.__getitem__):
        q = queries[i]
        while j < len(evs) and evs[j]["ts"] <= q:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < evs[j]["ts"]:
                stack.pop()
            stack.append(evs[j])
            j += 1
        while stack and stack[-1]["ts"] + stack[-1]["dur"] < q:
            stack.pop()
        out[i] = [e["name"] for e in reversed(stack) if e["ts"] + e["dur"] >= q]
    return out


def site(frames: list[str], depth: int = 3, none: str = "(no Python frame)") -> str:
    """The innermost `depth` frames that are not loop/plumbing frames: where in the model code something ran."""
    return " < ".join([f for f in frames if not GENERIC.search(f)][:depth]) or none


def summarize_trace(trace: dict[str, Any], top: int = 25) -> dict[str, Any]:
    """GPU busy vs the profiled window, kernel ms by family, by name and by the Python code that launched them, and
    GPU idle ms by what the launching thread was inside when the GPU ran dry."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    if not gpu:
        raise SystemExit("no GPU events in the trace (was the profiled step on a CUDA rank?)")
    launches = {e["args"].get("correlation"): e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    # the launching code: Python frames where recorded (train.profile_stacks), else the host's op ranges
    stacks = any(e.get("cat") == "python_function" for e in events)
    frames_cats, none = ({"python_function"}, "(no Python frame)") if stacks else \
        ({"cpu_op", "user_annotation"}, "(no host op)")
    py: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in frames_cats:
            py[e["tid"]].append(e)
    window_ms = (max(e["ts"] + e["dur"] for e in gpu) - gpu[0]["ts"]) / 1e3
    busy_ms, gaps = union_ms((e["ts"], e["ts"] + e["dur"]) for e in gpu)
    # gaps -> the kernel that ended each one (the first to start at or after the gap's end)
    starts = [e["ts"] for e in gpu]
    long_gaps = [(s, e, bisect.bisect_left(starts, e)) for s, e in gaps if (e - s) / 1e3 >= GAP_MS]
    # queries per thread: each kernel's launch time, and each gap's start on the thread that launched its end kernel
    queries: dict[Any, list[tuple[str, int, float]]] = collections.defaultdict(list)
    for i, k in enumerate(gpu):
        if (r := launches.get(k["args"].get("correlation"))) is not None:
            queries[r["tid"]].append(("kernel", i, r["ts"]))
    for g, (s, _, i) in enumerate(long_gaps):
        if (r := launches.get(gpu[i]["args"].get("correlation"))) is not None:
            queries[r["tid"]].append(("gap", g, s))
    by_family: collections.Counter[str] = collections.Counter()
    by_name: collections.Counter[str] = collections.Counter()
    by_site: collections.Counter[str] = collections.Counter()
    idle_by_site: collections.Counter[str] = collections.Counter()
    for e in gpu:
        by_family[family(e["name"])] += e["dur"] / 1e3
        by_name[e["name"][:120]] += e["dur"] / 1e3
    for tid, qs in queries.items():
        for (kind, i, _), frames in zip(qs, _stacks_at(py.get(tid, []), [q for *_, q in qs]), strict=True):
            if kind == "kernel":
                by_site[site(frames, 2, none)] += gpu[i]["dur"] / 1e3
            else:
                s, e, _ = long_gaps[i]
                idle_by_site[site(frames, none=none)] += (e - s) / 1e3
    rounded = lambda c: {k: round(v, 2) for k, v in c.most_common(top)}  # noqa: E731
    return {
        "window_ms": window_ms,
        "gpu_busy_ms": busy_ms,
        "gpu_busy_fraction": busy_ms / window_ms,
        "idle_gaps_ms": sum((e - s) / 1e3 for s, e, _ in long_gaps),
        "idle_gaps": len(long_gaps),
        "kernel_ms_by_family": rounded(by_family),
        "top_kernels_ms": rounded(by_name),
        "kernel_ms_by_python_site": rounded(by_site),
        "idle_ms_by_python_site": rounded(idle_by_site),
        "sites_from": "python_stacks" if stacks else "host_ops",
    }


def read_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def render(s: dict[str, Any]) -> str:
    """The summary as text, one `[profile]` line each."""
    lines = [f"[profile] window {s['window_ms']:.1f} ms, GPU busy {s['gpu_busy_ms']:.1f} ms "
             f"({100 * s['gpu_busy_fraction']:.1f} %), idle gaps >= {GAP_MS} ms: {s['idle_gaps']} = "
             f"{s['idle_gaps_ms']:.1f} ms"]
    code = "the Python code" if s.get("sites_from", "python_stacks") == "python_stacks" else \
        "the host ops (train.profile_stacks=true: Python frames)"
    for title, key in (("kernel ms by family", "kernel_ms_by_family"), ("top kernels (ms)", "top_kernels_ms"),
                       (f"kernel ms by {code} that launched them", "kernel_ms_by_python_site"),
                       ("GPU idle ms by what the launching thread was inside", "idle_ms_by_python_site")):
        lines.append(f"[profile] {title}:")
        lines += [f"[profile]   {v:9.2f}  {k}" for k, v in s[key].items()]
    return "\n".join(lines)


TRACE = Path("torch_profile") / "rank-0.json.gz"


def trace_path(path: Path) -> Path:
    """A trace file itself, or the run directory it was written under (train.profile_step)."""
    if path.is_dir():
        if not (path / TRACE).exists():
            raise FileNotFoundError(f"no {TRACE} under {path}: was the run started with train.profile_step=N "
                                    "(and did it reach that step)?")
        return path / TRACE
    return path


def summarize(path: Path) -> dict[str, Any]:
    """Summary of a run directory's (or a file's) trace, also written as profile_summary.json beside the trace."""
    trace = trace_path(path)
    s = summarize_trace(read_trace(trace))
    (trace.parent / "profile_summary.json").write_text(json.dumps(s, indent=1) + "\n")
    return s
