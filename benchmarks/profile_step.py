"""Where one steady training step's GPU time goes: a perf_h200x2 case with Bridge's PyTorch profiler on one step
(rank 0, Python call stacks on), summarized from the chrome trace Bridge writes.

    python benchmarks/profile_step.py --case SUBSTR [--step 5] [--results results/profile_h200x2.jsonl]
    python benchmarks/profile_step.py --summarize TRACE.json.gz      # the summary of an existing trace

The component timers (vlmtrain.timing) say which tower a step's time belongs to; this says what inside it: GPU
busy time (union of kernels on all streams) vs the step, kernel time by family, and GPU idle gaps attributed to
the Python functions the host was inside while the GPU waited (host-bound code shows up there).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perf_h200x2  # noqa: E402
import run_cases  # noqa: E402
from run_cases import ROOT, Case  # noqa: E402

from vlmtrain import results  # noqa: E402

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


def site(frames: list[str], depth: int = 3) -> str:
    """The innermost `depth` frames that are not loop/plumbing frames: where in the model code something ran."""
    return " < ".join([f for f in frames if not GENERIC.search(f)][:depth]) or "(no Python frame)"


def summarize_trace(trace: dict[str, Any], top: int = 25) -> dict[str, Any]:
    """GPU busy vs the profiled window, kernel ms by family, by name and by the Python code that launched them, and
    GPU idle ms by what the launching thread was inside when the GPU ran dry."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    if not gpu:
        raise SystemExit("no GPU events in the trace (was the profiled step on a CUDA rank?)")
    launches = {e["args"].get("correlation"): e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    py: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "python_function":
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
                by_site[site(frames, 2)] += gpu[i]["dur"] / 1e3
            else:
                s, e, _ = long_gaps[i]
                idle_by_site[site(frames)] += (e - s) / 1e3
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
    }


def read_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def print_summary(s: dict[str, Any]) -> None:
    print(f"[profile] window {s['window_ms']:.1f} ms, GPU busy {s['gpu_busy_ms']:.1f} ms "
          f"({100 * s['gpu_busy_fraction']:.1f} %), idle gaps >= {GAP_MS} ms: {s['idle_gaps']} = "
          f"{s['idle_gaps_ms']:.1f} ms")
    for title, key in (("kernel ms by family", "kernel_ms_by_family"), ("top kernels (ms)", "top_kernels_ms"),
                       ("kernel ms by the Python code that launched them", "kernel_ms_by_python_site"),
                       ("GPU idle ms by what the launching thread was inside", "idle_ms_by_python_site")):
        print(f"[profile] {title}:")
        for k, v in s[key].items():
            print(f"[profile]   {v:9.2f}  {k}")


def profile_case(case: Case, step: int, out: Path) -> Case:
    """The case plus Bridge's PyTorch profiler on `step` (rank 0, call stacks); the trace lands in
    <out>/<name>/torch_profile (Bridge writes it beside the tensorboard dir)."""
    name = f"profile_{case.name}"
    run_dir = out / name
    extra = [f"train.iterations={step + 2}", "+bridge.profiling.use_pytorch_profiler=true",
             f"+bridge.profiling.profile_step_start={step}", f"+bridge.profiling.profile_step_end={step + 1}",
             "+bridge.profiling.pytorch_profiler_collect_callstack=true",
             f"+bridge.logger.tensorboard_dir={run_dir / 'tb'}"]
    kept = [o for o in case.overrides if not o.startswith("train.iterations=")]
    return Case(name, case.gpus, [*kept, *extra])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default=perf_h200x2.BEST.name(), help="a perf_h200x2 case name (any sweep)")
    ap.add_argument("--step", type=int, default=5, help="the profiled iteration (after warm-up)")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides added to the case (e.g. what a fix changes)")
    ap.add_argument("--summarize", type=Path, help="only summarize this trace")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "profile_h200x2.jsonl")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "profile")
    args = ap.parse_args(argv)
    if args.summarize:
        print_summary(summarize_trace(read_trace(args.summarize)))
        return 0
    cases = {c.name: c for c, _ in perf_h200x2.expand(["all"])}
    if args.case not in cases:
        raise SystemExit(f"unknown case {args.case!r}; see python benchmarks/perf_h200x2.py --sweep all --list")
    base = cases[args.case]
    base = Case(base.name, base.gpus, [*base.overrides, *args.extra])
    case = profile_case(base, args.step, args.out)
    t0 = time.time()
    ((_, rc, run_dir, _),) = run_cases.run_batch([case], args.out, base.gpus)
    if rc != 0:
        print(f"[profile] {case.name} failed rc={rc}; see {run_dir / 'train.log'}", flush=True)
        return rc
    trace = next((run_dir / "torch_profile").glob("rank-0.json.gz"), None)
    if trace is None:
        print(f"[profile] no trace under {run_dir / 'torch_profile'}", flush=True)
        return 1
    s = summarize_trace(read_trace(trace))
    print_summary(s)
    metrics = {k: s[k] for k in ("window_ms", "gpu_busy_ms", "gpu_busy_fraction", "idle_gaps_ms")}
    metrics.update({f"kernel_ms_{k.replace('/', '_')}": v for k, v in s["kernel_ms_by_family"].items()})
    # the run's median step; its rates are left out: the profiled step includes writing the trace
    metrics.update({k: v for k, v in results.summarize(run_dir).items() if k in ("step_s", "peak_mem_gib")})
    results.append(args.results, case.name, "python benchmarks/profile_step.py " + " ".join(argv or sys.argv[1:]),
                   metrics, config=run_cases.overrides(case), wall_s=round(time.time() - t0, 1),
                   **{k: s[k] for k in ("top_kernels_ms", "kernel_ms_by_python_site", "idle_ms_by_python_site")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
