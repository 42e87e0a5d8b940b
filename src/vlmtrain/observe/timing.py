"""Per-component time of each training step: vision encoder, projector, decoder, optimizer and data wait.

A timeline of marks "from here on, this rank's GPU time belongs to <component>": each mark is a CUDA event on the
current stream, read once after the step-end synchronize that the metrics callback does anyway (no extra sync).
- Forward: pre/post hooks push/pop a component on `vision_model`, `vision_model.merger`, every
  `vision_model.decoder.deepstack_merger_list[i]` and `language_model` (unwrapped Qwen3VLModel). Nested marks make
  vision = vision_model minus its mergers: patch embedding, position embeddings, rotary setup and the ViT blocks;
  projector = merger + deepstack mergers.
- Backward: hooks at the same modules' boundaries. A pre-hook on the autograd node that produced a module's output
  fires when that node is about to run: the module's backward starts. A hook on an input tensor fires when the
  input's gradient is complete: the module's backward is over (back to the enclosing component). Autograd runs
  tensor hooks before node pre-hooks, so where one module's output is the next one's input, "ends" comes before
  "starts". The ViT's input (pixels) needs no gradient, so autograd's final callback, queued from the decoder's
  output hook, closes every backward pass. Recomputed (checkpointed) forwards inside backward nest the same way.
- Optimizer: `optimizer.step()` wrapped. Data: `next(data_iterator)` wrapped (train.step_counters.StepCounters.wrap).

An interval between two marks is GPU time, including the GPU idling while the host is busy inside that section
(host-bound Python in the ViT counts as vision). So `time_data_s` is the exposed data wait: the GPU time that
passed while the host was inside next(); `data_host_s` is the host time inside next(), hidden or not.
Everything in no named component (gradient reduce and all-gather waits, pipeline send/recv, the loss, the text
embedding and MRoPE index, Bridge's bookkeeping) is `time_other_s` = step_s - sum(named), so the components add up
to step_s by construction; `component_coverage` = sum(named) / step_s.
The timer's own host time (its hooks, the events it records) is counted per step too (`StepTimer.host_s`, part of
metrics.jsonl `vlmtrain_host_s`), so what timing costs is measured, not assumed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import pairwise
from typing import Any

from vlmtrain.observe.keys import time_key
from vlmtrain.train.unwrap import unwrap

COMPONENTS = ("vision", "projector", "decoder", "optimizer", "data")
OTHER = "other"
KEYS = tuple(time_key(c) for c in COMPONENTS)


def attribute(labels: Sequence[str], durations: Sequence[float]) -> dict[str, float]:
    """Seconds per label: the interval after mark i (durations[i]) belongs to mark i's label."""
    if len(durations) != max(len(labels) - 1, 0):
        raise ValueError(f"{len(labels)} marks need {max(len(labels) - 1, 0)} intervals, got {len(durations)}")
    totals: dict[str, float] = {}
    for label, seconds in zip(labels, durations, strict=False):
        totals[label] = totals.get(label, 0.0) + seconds
    return totals


def row(totals: Mapping[str, float], step_s: float) -> dict[str, float]:
    """metrics.jsonl keys: time_<component>_s, time_other_s = the rest of step_s, and component_coverage."""
    named = {time_key(c): float(totals.get(c, 0.0)) for c in COMPONENTS}
    covered = sum(named.values())
    # The marks lie inside the synchronised step window, so covered <= step_s up to clock resolution.
    return {**named, time_key(OTHER): max(step_s - covered, 0.0),
            "component_coverage": covered / step_s if step_s > 0 else 0.0}


DATA_BOUND = 0.10
"""An exposed data wait of at least this share of the step: the loader is behind (more data.num_workers)."""


def data_bound(time_data_s: float | None, step_s: float | None) -> float | None:
    """The step's share spent waiting on the data loader when it is at least DATA_BOUND, else None."""
    if not time_data_s or not step_s:
        return None
    share = time_data_s / step_s
    return share if share >= DATA_BOUND else None


class Timeline:
    """Ordered (label, clock token) marks of one step; forward hooks nest through a stack."""

    def __init__(self, clock: Callable[[], Any]):
        self.clock = clock
        self.marks: list[tuple[str, Any]] = []
        self.stack: list[str] = []
        self.current = OTHER
        self.active = False

    def begin(self) -> None:
        self.marks, self.stack, self.current, self.active = [], [], OTHER, True
        self.switch(OTHER)

    def end(self) -> None:
        self.switch(OTHER)
        self.active = False

    def switch(self, label: str) -> None:
        """From now on the time is `label`'s (a no-op outside a step or while a CUDA graph is captured)."""
        self.current = label
        if not self.active:
            return
        token = self.clock()
        if token is not None:
            self.marks.append((label, token))

    def enter(self, label: str) -> None:
        self.stack.append(self.current)
        self.switch(label)

    def exit(self) -> None:
        self.switch(self.stack.pop() if self.stack else OTHER)


def cuda_mark() -> Any:
    """A timing event recorded on the current stream; None while that stream is being captured into a graph."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def cuda_elapsed_s(events: Sequence[Any]) -> list[float]:
    """Seconds between consecutive events; call after a synchronize."""
    return [a.elapsed_time(b) / 1e3 for a, b in pairwise(events)]


def host_elapsed_s(stamps: Sequence[float]) -> list[float]:
    """Seconds between consecutive perf_counter stamps (a timeline of CPU-only work)."""
    return [b - a for a, b in pairwise(stamps)]


def _grad_tensors(*objs: Any) -> list[Any]:
    """Tensors that will receive a gradient, from top-level args/kwargs values or a (tuple of) output(s)."""
    import torch

    flat: list[Any] = []
    for obj in objs:
        items = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, tuple | list) else (obj,)
        flat += [t for t in items if isinstance(t, torch.Tensor) and t.requires_grad]
    return flat


def qwen3vl_parts(model_chunks: Sequence[Any]) -> list[tuple[Any, str, str | None]]:
    """(module, component, component its backward returns to) for the timed modules of every model chunk."""
    parts: list[tuple[Any, str, str | None]] = []
    for chunk in model_chunks:
        m = unwrap(chunk)
        vision = getattr(m, "vision_model", None)
        if vision is not None:
            parts.append((vision, "vision", None))
            deepstack = getattr(getattr(vision, "decoder", None), "deepstack_merger_list", None) or []
            parts += [(merger, "projector", "vision") for merger in deepstack]
            if getattr(vision, "merger", None) is not None:
                parts.append((vision.merger, "projector", "vision"))
        if getattr(m, "language_model", None) is not None:
            parts.append((m.language_model, "decoder", OTHER))
    return parts


class _Restore:
    """A removable handle for an attribute we replaced."""

    def __init__(self, obj: Any, name: str, original: Any):
        self.obj, self.name, self.original = obj, name, original

    def remove(self) -> None:
        setattr(self.obj, self.name, self.original)


class StepTimer:
    """One rank's step timeline and the hooks that feed it."""

    def __init__(self, clock: Callable[[], Any] = cuda_mark,
                 elapsed: Callable[[Sequence[Any]], list[float]] = cuda_elapsed_s):
        self.timeline = Timeline(clock)
        self.elapsed = elapsed
        self.handles: list[Any] = []
        self.data_host_s = 0.0
        self.host_s = 0.0  # this step's host time inside the hooks and marks: part of vlmtrain_host_s
        self._end_queued = False

    @contextlib.contextmanager
    def _host(self) -> Iterator[None]:
        """Counts the enclosed host time as the timer's own (hooks, marks), not the model's."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.host_s += time.perf_counter() - t0

    def attach(self, model_chunks: Sequence[Any], optimizer: Any = None) -> None:
        """Hook the Qwen3-VL towers of every chunk and the optimizer step (Callback.on_train_start)."""
        for module, label, returns_to in qwen3vl_parts(model_chunks):
            self.attach_module(module, label, returns_to, closes_backward=label == "decoder")
        if optimizer is not None:
            self.attach_optimizer(optimizer)

    def attach_module(self, module: Any, label: str, returns_to: str | None, closes_backward: bool = False) -> None:
        """Forward time of `module` is `label`'s; with `returns_to`, its backward too (from the node that made its
        output to the gradient of its input, then `returns_to`). `closes_backward`: queue the end-of-backward mark
        (only from a module whose forward never runs inside a checkpointed region, so the outermost pass)."""
        timeline = self.timeline

        def pre(_module: Any, args: tuple, kwargs: dict) -> None:
            with self._host():
                timeline.enter(label)
                if returns_to is not None:
                    for t in _grad_tensors(args, kwargs):
                        t.register_hook(self._switch_on_grad(returns_to))

        def post(_module: Any, _args: tuple, output: Any) -> None:
            with self._host():
                if returns_to is not None:
                    for t in _grad_tensors(output):
                        if t.grad_fn is not None:
                            t.grad_fn.register_prehook(self._switch_on_grad(label, closes_backward))
                timeline.exit()

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(module.register_forward_hook(post))

    def _switch_on_grad(self, label: str, close: bool = False) -> Callable[[Any], None]:
        def hook(_grads: Any) -> None:
            with self._host():
                self.timeline.switch(label)
                if close and not self._end_queued:
                    from torch.autograd import Variable

                    self._end_queued = True
                    Variable._execution_engine.queue_callback(self._backward_done)

        return hook

    def _backward_done(self) -> None:
        with self._host():
            self._end_queued = False
            self.timeline.switch(OTHER)

    def attach_optimizer(self, optimizer: Any) -> None:
        step = optimizer.step

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            with self._host():
                self.timeline.enter("optimizer")
            try:
                return step(*args, **kwargs)
            finally:
                with self._host():
                    self.timeline.exit()

        optimizer.step = timed_step
        self.handles.append(_Restore(optimizer, "step", step))

    @contextlib.contextmanager
    def data(self) -> Iterator[None]:
        """Around next(data_iterator)."""
        with self._host():
            self.timeline.enter("data")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.timeline.active:
                self.data_host_s += time.perf_counter() - t0
            with self._host():
                self.timeline.exit()

    def start(self) -> None:
        self.data_host_s = self.host_s = 0.0
        self._end_queued = False
        with self._host():
            self.timeline.begin()

    def stop(self) -> None:
        with self._host():
            self.timeline.end()

    def totals(self) -> dict[str, float]:
        """Seconds per component of the last step (after the step-end synchronize), plus data_host_s."""
        labels = [label for label, _ in self.timeline.marks]
        totals = attribute(labels, self.elapsed([token for _, token in self.timeline.marks]))
        return {**{c: totals.get(c, 0.0) for c in COMPONENTS}, "data_host_s": self.data_host_s}

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
