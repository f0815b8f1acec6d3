"""Stage 3: compose realized kernels into a drop-in module.

    opt = fact.optimize(model, example_inputs)

reads top to bottom as the pipeline runs:

  1. trace      torch.export; the graph goes to the engine (docs/graph-format.md)
  2. plan       `fact-engine realize` plans the patterns and compiles their kernels into the
                cache; without a GPU only `discover` runs, since nothing could be measured
  3. tune       kernels the registry has not measured are verified and timed (fault-isolated)
  4. choose     per pattern, every implementation (tuned kernels, library kernels) is checked
                on the module's own intermediate values against the original subgraph and
                timed against it there; the original PyTorch subgraph stays unless one is
                correct and faster
  5. compose    the chosen implementations replace their subgraphs in the exported graph; work
                on parameters alone (a weight computed from others) runs once, and again when
                a parameter it reads changes (compose/hoist.py)
  6. verify     the composed module against the model in float64 on fresh random inputs; a
                pattern that breaks it falls back to PyTorch, and the report says so
  7. replay     a whole-module CUDA graph where the inputs' shapes are static
  8. guard      the composed module against the original one, both timed on the example
                inputs; where the original is faster (a fast path eager has that the exported
                graph lacks, host time the kernels do not win back), the module runs the
                original and the report says so

Decisions are cached by the graph's content (with precision, GPU and FACT version), so a second
optimize of the same module skips steps 2-4: it compiles and tunes nothing.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export.graph_signature import InputKind
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _get_current_dispatch_mode

from fact import __version__, timing
from fact.compose.hoist import Hoist
from fact.compose.impls import (
    AttentionImpl,
    GatedGemmImpl,
    GatedTailImpl,
    GemmImpl,
    GemmTailImpl,
    HorizontalGemmImpl,
    Impl,
    NormImpl,
    PointwiseImpl,
    direct_calls,
    library_impls,
)
from fact.compose.ops import dependent_launches, dependent_launches_enabled
from fact.compose.program import Program, pattern_outputs, replace, subgraph
from fact.compose.report import json_ready
from fact.errors import FactError
from fact.timing import Timing

#: relative error bounds: (per pattern against the original subgraph, end to end against float64)
TOLERANCES = {
    "16bit": (2e-2, 2e-2),
    "medium": (2e-2, 2e-2),
    "high": (2e-3, 5e-3),
    "highest": (1e-5, 1e-4),
}
PATTERN_REPS = 20
#: The PyTorch subgraph and every verified candidate of a pattern take turns this many times,
#: each turn a median of PATTERN_REPS calls; each is ranked by the median of its turns, so a
#: drift in clocks during the check does not favour whichever ran first.
CHECK_ROUNDS = 3


def cache_root() -> Path:
    return Path(os.environ.get("FACT_CACHE_DIR") or Path.home() / ".cache" / "fact")


class Progress:
    """One line per step on stderr, with the time since the start; silent when quiet."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.start = time.perf_counter()
        self.lines: list[str] = []

    def __call__(self, message: str) -> None:
        line = f"[fact {time.perf_counter() - self.start:6.1f}s] {message}"
        self.lines.append(line)
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)


def tolerances(dtype: torch.dtype, precision: str) -> tuple[float, float]:
    if dtype in (torch.bfloat16, torch.float16):
        return TOLERANCES["16bit"]
    if precision not in TOLERANCES:
        raise FactError(f"precision {precision!r} is not one of highest, high, medium")
    return TOLERANCES[precision]


def rel_err(out: Any, ref: Any) -> float:
    """max over the output tensors of ||out - ref|| / ||ref|| in float64 (the tuning
    harness's measure: NaN/Inf must sit where the reference has them; inf otherwise)."""
    from fact.tune.harness import rel_err as tensor_err

    outs, _ = pytree.tree_flatten(out)
    refs, _ = pytree.tree_flatten(ref)
    if len(outs) != len(refs):
        return math.inf
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        if not isinstance(o, torch.Tensor):
            continue
        if not isinstance(r, torch.Tensor) or o.shape != r.shape:
            return math.inf
        if r.dtype != torch.float64 and o.dtype != r.dtype:
            return math.inf  # the model's dtype is part of its function
        worst = max(worst, tensor_err(o.detach(), r.detach())[0])
    return worst


def _device_of(inputs: Sequence[Any]) -> torch.device:
    for t in pytree.tree_leaves(list(inputs)):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def time_us(fn: Callable[[], Any], device: torch.device, reps: int = PATTERN_REPS) -> float:
    """Median per-call time (us) of fn() (fact.timing's per-call protocol)."""
    return statistics.median(timing.per_call_times(fn, device, reps=reps))


def take_turns(
    fns: Mapping[Any, Callable[[], Any]],
    device: torch.device,
    errors: dict[Any, str] | None = None,
) -> dict[Any, Timing]:
    """Every callable timed under both protocols (fact.timing), CHECK_ROUNDS turns each in
    alternating order, so that a drift in clocks favours none of them. With `errors`, one that
    raises is dropped and its error recorded there."""
    with torch.no_grad():
        return timing.take_turns(
            dict(fns), device, rounds=CHECK_ROUNDS, reps=PATTERN_REPS, errors=errors
        )


# ---------------------------------------------------------------------------------------------
# The module FACT returns


class OptimizedModule(nn.Module):
    """The composed module: the exported graph with patterns replaced, fed from `original`'s
    live parameters and buffers. Inference only: it runs under torch.no_grad().

    `cuda_graphs`: replay one captured CUDA graph per input signature. `pdl`: launch the
    generated kernels as programmatic dependents of the kernel before them (ops.py); on by
    default, off when set False, and for calls made within ops.dependent_launches(False) or
    with FACT_PDL=0 in the environment."""

    def __init__(
        self,
        original: nn.Module,
        program: Program,
        graph_module,
        report: dict,
        cuda_graphs: bool,
        example: Sequence[Any] = (),
    ):
        super().__init__()
        self.original = original  # a submodule: parameters() and state_dict() are shared
        self.report = report
        self.cuda_graphs = cuda_graphs
        self.pdl = True
        # Step 8: True where the original module ran faster than the composed one (guard);
        # set it False to run FACT's kernels anyway.
        self.use_original = False
        object.__setattr__(self, "_program", program)
        object.__setattr__(self, "_graph_module", graph_module)
        # What real-tensor calls run: fact ops called directly, and the work on parameters
        # alone (derived weights, masks) done once and again when they change (hoist.Hoist).
        n_state = sum(1 for s in program.input_specs if s.kind != InputKind.USER_INPUT)
        object.__setattr__(self, "_hoist", Hoist(direct_calls(graph_module), n_state))
        object.__setattr__(self, "_replay", None)
        # What the kernels were built for: shapes, dtypes and devices of inputs and state.
        flat = program.flatten(example) if example else []
        object.__setattr__(self, "_built_for", _signature(flat, program.state_inputs()))
        # Input sizes optimized since (prepare): signature -> module; and how a call at sizes
        # not prepared is served (new_sizes: "optimize" | "original" | "error").
        object.__setattr__(self, "_variants", {})
        object.__setattr__(self, "_failed_sizes", {})  # signature -> why (not tried again)
        object.__setattr__(self, "_grow", None)
        object.__setattr__(self, "_grow_lock", threading.Lock())
        self.new_sizes = "original"
        # A loop whose sizes never repeat (a growing sequence) must not optimize at every call.
        self.max_sizes = MAX_SIZES

    def prepare(self, *example: Any, **kwargs: Any) -> OptimizedModule:
        """Optimize for the sizes of these inputs (same dtypes, devices and other arguments as
        the example optimize had, other sizes; passed as a call passes them) now, rather than at
        the first call that has them: the kernels come from the cache (they do not depend on
        sizes), and a pattern whose sizes fall in the power-of-two buckets of one timed in an
        earlier optimize of this module reuses its ranking. Returns the module those calls
        run. At most `max_sizes` sizes besides the example's are kept."""
        program = self._program
        flat = program.flatten(example, kwargs)
        state = program.state_inputs()
        sig = _signature(flat, state)
        if sig == self._built_for:
            return self
        if sig in self._variants:
            return self._variants[sig]
        why = self._why_not_sizes(flat, sig)
        if why:
            raise FactError(f"prepare() takes inputs that differ only in their sizes: {why}")
        if self._grow is None:
            raise FactError(
                "this module cannot optimize for other sizes (a copy made with copy.deepcopy, "
                "or a module fact.load returned): optimize the model again for them"
            )
        if program._plain_arity is None:
            raise FactError(
                "prepare() needs a model whose inputs are tensors or numbers passed one by one "
                "(not nested in lists or dicts): optimize the model again for the new sizes"
            )
        if len(self._variants) >= self.max_sizes:
            raise FactError(
                f"this module keeps at most max_sizes={self.max_sizes} sizes besides its "
                f"example's, and has them ({_sizes_text(flat, program)} would be one more): "
                "raise opt.max_sizes, or prepare the sizes that matter"
            )
        with self._grow_lock:  # one optimize at a time (they time on the GPU)
            if sig not in self._variants:
                self._variants[sig] = self._grow(list(flat))
        return self._variants[sig]

    def _why_not_sizes(self, flat: Sequence[Any], now: tuple) -> str:
        """'' when a call's flat inputs and signature (`now`, of flat and the state) differ
        from the build in tensor sizes alone; else what else differs (a dtype, a device, a
        number of dimensions, a non-tensor argument, the parameters)."""
        built = self._built_for
        if built is None:
            return "the module was built without an example"
        n = len(flat)
        if len(now) != len(built) or now[n:] != built[n:]:
            return "the parameters or buffers changed dtype, device or shape since optimize"
        for i, (a, b) in enumerate(zip(now[:n], built[:n], strict=True)):
            name = _input_name(self._program, i)
            if a[0] == "value" or b[0] == "value":
                if a != b:
                    return f"{name} is {a[1]}, not {b[1]} as in the example"
            elif a[1:] != b[1:] or len(a[0]) != len(b[0]):
                return (
                    f"{name} is a {len(a[0])}-d {a[1]} tensor on {a[2]}, not a {len(b[0])}-d "
                    f"{b[1]} tensor on {b[2]} as in the example"
                )
        return ""

    def _variant(self, flat: Sequence[Any], sig: tuple) -> OptimizedModule | None:
        """The module for a call whose inputs are not the build's (`sig`, _signature of flat
        and state): one prepared for its sizes (prepared now when new_sizes is "optimize"), or
        None (with a warning, once) to run the original module."""
        variant = self._variants.get(sig)
        if variant is not None:
            return variant
        why = self._why_not_sizes(flat, sig)
        if not why and self._grow is None:
            why = "this copy or loaded module does not optimize for new sizes"
        if not why and self.new_sizes == "error":
            raise FactError(
                f"FACT: this call's input sizes ({_sizes_text(flat, self._program)}) were not "
                "prepared (new_sizes='error'): call opt.prepare(*inputs) for them first, or "
                "optimize with other_sizes=[...]"
            )
        if not why and self.new_sizes == "optimize":
            if self._program._plain_arity is None:
                why = "inputs nested in lists or dicts"
            elif len(self._variants) >= self.max_sizes:
                why = f"it keeps at most max_sizes={self.max_sizes} other sizes, and has them"
            elif sig in self._failed_sizes:
                return None  # said when it failed
            else:
                try:
                    return self.prepare(*flat)
                except Exception as exc:  # noqa: BLE001 - the call must still run
                    self._failed_sizes[sig] = str(exc)
                    warnings.warn(
                        f"FACT: optimizing for input sizes {_sizes_text(flat, self._program)} "
                        f"failed ({type(exc).__name__}: {exc}); calls at these sizes run the "
                        "original module",
                        stacklevel=5,
                    )
                    return None
        self._warn_once(
            "unlike",
            "FACT: this module was optimized for other input shapes, dtypes or devices, or "
            "other values of its non-tensor arguments (or its parameters changed dtype or "
            f"device since): {why or f'new sizes are not optimized (new_sizes={self.new_sizes!r})'}"
            "; it runs the original module for such calls. Optimize again for the new ones.",
            stacklevel=5,
        )
        return None

    def _warn_once(self, what: str, message: str, stacklevel: int) -> None:
        """Warn the first time a call runs the original for this reason, not every call."""
        if not getattr(self, f"_warned_{what}", False):
            warnings.warn(message, stacklevel=stacklevel)
            object.__setattr__(self, f"_warned_{what}", True)

    # Copies, yes; pickles, no. The kernels it calls are loaded into this process (handles in a
    # registry of the process), so a saved module could not run anywhere else.
    def __copy__(self) -> OptimizedModule:
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict) -> OptimizedModule:
        """A copy on its own copy of the model; a captured CUDA graph is not copied (it writes
        the original's buffers): the copy captures its own at its first call."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        skip = ("_replay", "_grow", "_grow_lock")
        state = {k: v for k, v in self.__dict__.items() if k not in skip}
        new.__setstate__(copy.deepcopy(state, memo))
        object.__setattr__(new, "_replay", None)
        object.__setattr__(new, "_grow_lock", threading.Lock())
        # optimize's closure would optimize the original model for new sizes, not the copy's
        object.__setattr__(new, "_grow", None)
        return new

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise FactError(
            "an optimized module cannot be pickled: the kernels it calls are loaded into this "
            "process. Use fact.save(opt, folder) and, in the other process, "
            "fact.load(folder, model) with the original model"
        )

    def refresh(self) -> None:
        """Take the model's state as it is now. Updates FACT sees by itself are in-place ops
        (which bump a tensor's version counter) and new tensors assigned to the attributes;
        after a write it cannot see (through `.data`, or by code outside PyTorch), call this:
        the work done once on parameters is computed again on the next call, and the watched
        buffers and tensor attributes are compared by value."""
        self._hoist.forget()
        self._program.refresh()
        self._program.recheck_watched()
        for variant in self._variants.values():
            variant.refresh()

    @property
    def graph_module(self):
        return self._graph_module

    def run_graph(self, flat_user: Sequence[Any], state: Sequence[Any] | None = None) -> list[Any]:
        """The composed graph on the user's flat inputs and the model's state (read now when
        not given)."""
        state = self._program.state_inputs() if state is None else state
        if runs_eagerly(flat_user):
            return list(self._hoist(state, flat_user))
        return list(self._graph_module(*state, *flat_user))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self._forward(args, kwargs)
        # torch.no_grad() without its context object: building one costs a few microseconds
        # of every call's host time
        torch._C._set_grad_enabled(False)
        try:
            return self._forward(args, kwargs)
        finally:
            torch._C._set_grad_enabled(True)

    def _forward(self, args: tuple, kwargs: dict) -> Any:
        # Every call pays for what is here: keep it to lookups (benchmark sets and
        # synchronizing callers see the host time before the first launch).
        if getattr(self, "use_original", False) and not self._variants:
            return self.original(*args, **kwargs)
        program = self._program
        try:
            flat = program.flatten(args, kwargs)
        except FactError as unlike:  # another call structure: the model decides what it is
            self._warn_once("call", f"FACT: {unlike}; this call runs the original module", 4)
            return self.original(*args, **kwargs)
        state = program.state_inputs()  # once per call: guard, replay key, graph
        if self._built_for is not None:
            sig = _signature(flat, state)
            if sig != self._built_for:
                variant = self._variant(flat, sig)
                if variant is None:
                    return self.original(*args, **kwargs)
                variant.pdl = self.pdl  # the caller's setting, made on this module
                # flat as this module read it (the variant's example had the same structure);
                # matched by the signature already, so not checked again there
                return variant._run_built(args, kwargs, flat, variant._program.state_inputs())
        return self._run_built(args, kwargs, flat, state)

    def _run_built(self, args: tuple, kwargs: dict, flat: list[Any], state: list[Any]) -> Any:
        """A call whose inputs and state match what this module was built for."""
        program = self._program
        if getattr(self, "use_original", False):  # absent in modules copied before it
            return self.original(*args, **kwargs)
        if program.watched:
            stale = program.stale_buffers()
            if stale:
                return program.unflatten(self._original_graph(flat, stale, state))
        dependent = self.pdl and dependent_launches_enabled()
        if dependent == dependent_launches_enabled():
            outs = self._run(flat, state)
        else:
            with dependent_launches(dependent):
                outs = self._run(flat, state)
        return program.unflatten(outs)

    def _run(self, flat: Sequence[Any], state: Sequence[Any]) -> list[Any]:
        if self.cuda_graphs and _graphable(flat):
            return self._graphed(flat, state)
        return self.run_graph(flat, state)

    def _original_graph(
        self, flat: Sequence[Any], stale: list[str], state: Sequence[Any]
    ) -> list[Any]:
        """The exported graph as traced: the plan may have relied on the old buffer values."""
        self._warn_once(
            "stale",
            f"FACT: buffers or tensor attributes {stale} changed after optimize, and the plan "
            "may rely on their values (a causal mask, a constant); this module now runs the "
            "original graph. Optimize again to get kernels for the new values.",
            stacklevel=5,
        )
        return list(self._program.graph_module(*state, *flat))

    def _graphed(self, flat: Sequence[Any], state: Sequence[Any]) -> list[Any]:
        # Hoisted values first: recomputed in place when a parameter changed, which the
        # captured graph then reads; new tensors (a new shape) change the key.
        hoisted = self._hoist.values(state)
        key = (
            tuple(
                (tuple(t.shape), t.dtype, t.device, t.stride())
                if isinstance(t, torch.Tensor)
                else ("value", t)
                for t in flat
            ),
            tuple(t.data_ptr() for t in state if isinstance(t, torch.Tensor)),
            tuple(t.data_ptr() for t in hoisted),
            # the launch knobs captured depend on it (ops.launch_knobs): capture again
            torch.are_deterministic_algorithms_enabled(),
            dependent_launches_enabled(),  # launches are captured as made
        )
        replay = self._replay
        if replay is None or replay.key != key:
            replay = _CudaGraph(self.run_graph, flat, key)
            object.__setattr__(self, "_replay", replay)
        return replay(flat)


def runs_eagerly(flat: Sequence[Any]) -> bool:
    """True when the composed graph runs on real tensors with nothing watching the dispatcher:
    then its fact ops may call their bodies directly (impls.direct_calls). False while Dynamo
    traces, under a dispatch mode (fake tensors, make_fx, FLOP counters) or for tensor
    subclasses, which must see the registered ops."""
    if torch.compiler.is_dynamo_compiling() or _get_current_dispatch_mode() is not None:
        return False
    return all(type(t) is torch.Tensor for t in flat if isinstance(t, torch.Tensor))


def _signature(flat: Sequence[Any], state: Sequence[Any]) -> tuple | None:
    """Shapes (torch.Size, a tuple), dtypes and devices of the user inputs and the model's
    state (None: no example). Every call computes it: a list, not a generator, is faster."""
    if not flat:
        return None
    return tuple(
        [
            (t.shape, t.dtype, t.device) if isinstance(t, torch.Tensor) else ("value", repr(t))
            for t in (*flat, *state)
        ]
    )


def _input_name(program: Program, i: int) -> str:
    names = program.user_inputs
    return names[i] if i < len(names) else f"input {i}"


def _sizes_text(flat: Sequence[Any], program: Program) -> str:
    return ", ".join(
        f"{_input_name(program, i)}: {list(t.shape)}"
        for i, t in enumerate(flat)
        if isinstance(t, torch.Tensor)
    )


def _graphable(flat: Sequence[Any]) -> bool:
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.is_cuda for t in tensors)


class _CudaGraph:
    """One captured replay of the module at fixed input shapes. Inputs are copied into static
    buffers and outputs cloned out, so a caller may keep results across calls. Parameters are
    read in place: a weight updated in place is seen; a weight replaced by a new tensor changes
    the key and triggers a new capture."""

    def __init__(self, run: Callable[[Sequence[Any]], list[Any]], flat: Sequence[Any], key):
        # Normal tensors even when captured under torch.inference_mode(): a later call outside
        # it copies its inputs into these.
        with torch.inference_mode(False):
            self._capture(run, flat, key)

    def _capture(self, run: Callable[[Sequence[Any]], list[Any]], flat: Sequence[Any], key):
        self.key = key
        self.static = [t.clone() if isinstance(t, torch.Tensor) else t for t in flat]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up (lazy inits, cuBLAS workspaces) outside the capture
                run(self.static)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = run(self.static)

    def __call__(self, flat: Sequence[Any]) -> list[Any]:
        for dst, src in zip(self.static, flat, strict=True):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        self.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs]


# ---------------------------------------------------------------------------------------------
# Steps


def plan_and_realize(
    graph_path: Path,
    run: Path,
    *,
    arch: str,
    candidates: int,
    realize: bool,
    progress: Progress,
    quiet: bool,
) -> dict:
    """Step 2: the engine's plan, with kernels compiled into `run` when `realize`."""
    from fact.engine import engine_json, run_engine

    if not realize:
        plan = engine_json("discover", graph_path, "--arch", arch)
        (run / "plan.json").write_text(json.dumps(plan, indent=1))
        return plan
    from fact.cli import find_cutlass

    progress(f"planning and compiling kernels (up to {candidates} per pattern) into {run}")
    args = [
        "realize",
        str(graph_path),
        "--out",
        str(run),
        "--cutlass-dir",
        find_cutlass(None),
        "--candidates",
        str(candidates),
    ]
    done = run_engine(args, stream_stderr=not quiet, allowed=(1,))
    if done.returncode == 1:  # the plan stands; its patterns get library kernels only
        progress("no kernel was built (every compile failed; each manifest row names its log)")
    return json.loads((run / "plan.json").read_text())


def evaluate(
    program: Program,
    pattern: Mapping[str, Any],
    impl: Impl,
    values: Mapping[str, Any],
    tol: float,
) -> tuple[dict[str, Any], Callable[[], Any] | None]:
    """Step 4 for one implementation: its error against the original subgraph's value on the
    module's own intermediates. Returns the result and, when it verified, the call that runs it
    as the composed module will (for timing, see `choose`)."""
    result: dict[str, Any] = {
        "impl": impl.name,
        "kind": impl.kind,
        "error": None,
        "time_us": None,
        "ok": False,
        "message": "",
    }
    try:
        sub, names, aliases = subgraph(program.graph_module.graph, pattern)
        replace(sub, pattern, impl.emit, aliases)
        module = direct_calls(program.module(sub))  # as the composed module will call it
        args = [values[n] for n in names]
        outputs = pattern_outputs(pattern)
        expected = values[outputs[0]] if len(outputs) == 1 else tuple(values[n] for n in outputs)
        with torch.no_grad():
            out = module(*args)
            err = rel_err(out, expected)
            result["error"] = err
            if not err <= tol:
                result["message"] = f"error {err:.3g} exceeds {tol:g}"
                return result, None
    except Exception as exc:  # noqa: BLE001 - any failure rejects this implementation only
        result["message"] = f"{type(exc).__name__}: {exc}"
        return result, None
    result["ok"] = True
    return result, lambda: module(*args)


def _record_timing(row: dict[str, Any], t: Timing, prefix: str = "") -> None:
    """A timing into a decision or candidate row: `<prefix>time_us` is the per-call median (the
    protocol a benchmark set reports), the rest under `<prefix>timing`."""
    row[f"{prefix}time_us"] = t.per_call_us
    row[f"{prefix}timing"] = t.as_dict()


def choose(
    program: Program,
    plan: Mapping[str, Any],
    impls: Mapping[int, list[Impl]],
    values: Mapping[str, Any],
    device: torch.device,
    tol: float,
    require_faster: bool,
    progress: Progress,
    buckets: dict[str, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Step 4: one decision per plan pattern. Every verified implementation and the PyTorch
    subgraph take turns under both timing protocols (fact.timing); with `require_faster` an
    implementation is kept only where it beats the subgraph under both, and the best of those
    (mean of the two) wins.

    Patterns with the same signature, problem and operand layouts (the layers of a model) are
    timed once: the first of them is timed, and the others reuse its ranking after their own
    implementations verified on their own values. `buckets` carries timings from one optimize
    to the next of the same module at other input sizes (OptimizedModule.prepare): a pattern
    whose sizes fall in the same power-of-two buckets (size_bucket_class) as one timed in an
    earlier optimize reuses its ranking too; within one optimize only the same problem does."""
    decisions = []
    timed: dict[str, dict[str, Any]] = {}  # pattern class -> the first decision's timings
    earlier = {k: list(v) for k, v in (buckets or {}).items()}  # of earlier optimizes only
    for index, pattern in enumerate(plan.get("patterns") or []):
        d: dict[str, Any] = {
            "index": index,
            "family": pattern.get("family"),
            "signature": pattern.get("signature"),
            "nodes": pattern.get("nodes"),
            "output": pattern.get("output"),
            "est_saving_us": pattern.get("est_saving_us"),
            "chosen": "pytorch",
            "kind": "pytorch",
            "eager_us": None,
            "time_us": None,
            "error": None,
            "candidates": [],
            "reason": "",
        }
        options = impls.get(index) or []
        if not options:
            d["reason"] = _no_impl_reason(pattern, device)
            decisions.append(d)
            continue
        try:
            sub, names, _ = subgraph(program.graph_module.graph, pattern)
            module = program.module(sub)
            args = [values[n] for n in names]
        except Exception as exc:  # noqa: BLE001
            d["reason"] = f"the pattern's subgraph cannot run alone: {exc}"
            decisions.append(d)
            continue
        runs: dict[int, Callable[[], Any]] = {}
        for i, impl in enumerate(options):
            c, run = evaluate(program, pattern, impl, values, tol)
            d["candidates"].append(c)
            if run is not None:
                runs[i] = run
        names = [impl.name for impl in options]
        key, bucket = pattern_class(pattern, names), size_bucket_class(pattern, names)
        same = timed.get(key) or _nearest(earlier.get(bucket) or [], pattern.get("problem") or {})
        if same is not None:
            exact = same["key"] == key
            alike = "the same problem" if exact else f"the same size bucket ({same['problem']})"
            progress(
                f"checked pattern {index} {pattern.get('signature')} ({len(options)} options): "
                f"times of pattern {same['index']}, {alike}"
            )
            d["timed_as"] = same["index"]
            if not exact:
                d["timed_at"] = same["problem"]
            times = same["times"]
        else:
            progress(
                f"checking pattern {index} {pattern.get('signature')} ({len(options)} options)"
            )
            fns: dict[Any, Callable[[], Any]] = {"pytorch": lambda m=module, a=args: m(*a)}
            fns.update(runs)
            failed: dict[Any, str] = {}
            times = take_turns(fns, device, failed)
            if "pytorch" not in times:  # the subgraph itself fails to run
                d["reason"] = f"the pattern's subgraph cannot run alone: {failed.get('pytorch')}"
                decisions.append(d)
                continue
            for i, why in failed.items():  # a candidate that failed while it was timed
                d["candidates"][i].update(ok=False, message=f"failed while timed: {why}")
            timed[key] = {
                "index": index,
                "times": times,
                "key": key,
                "problem": pattern.get("problem"),
            }
            if buckets is not None:
                buckets.setdefault(bucket, []).append(timed[key])
        base = times["pytorch"]
        d["eager_us"] = base.per_call_us
        d["eager_timing"] = base.as_dict()
        for i in runs:
            c = d["candidates"][i]
            if i not in times:  # failed while timed, here or where the class was timed
                if c["ok"]:
                    c.update(ok=False, message=f"not timed (pattern {d.get('timed_as')})")
                continue
            _record_timing(c, times[i])
            if require_faster and not times[i].beats(base):
                c["message"] = (
                    "not faster than the PyTorch subgraph under both protocols (per call "
                    f"{times[i].per_call_us:.1f} vs {base.per_call_us:.1f} us, back to back "
                    f"{times[i].back_to_back_us:.1f} vs {base.back_to_back_us:.1f} us)"
                )
        good = [
            (c, impl, times[i])
            for i, (c, impl) in enumerate(zip(d["candidates"], options, strict=True))
            if c["ok"] and i in times
        ]
        faster = [g for g in good if not require_faster or g[2].beats(base)]
        if faster:
            best, impl, t = min(faster, key=lambda g: g[2].score())
            d.update(chosen=impl.name, kind=impl.kind, error=best["error"], impl=impl)
            _record_timing(d, t)
            if impl.detail.get("math"):
                d["math"] = impl.detail["math"]
        else:
            why = "; ".join(f"{c['impl']}: {c['message']}" for c in d["candidates"])
            d["reason"] = f"kept PyTorch ({why})"
        decisions.append(d)
    return decisions


def pattern_class(pattern: Mapping[str, Any], impl_names: Sequence[str] = ()) -> str:
    """What makes two patterns the same work: family, signature, problem, epilogue (its SSA),
    operand types and broadcasts and attributes, without node names; and the same
    implementations on offer. Patterns of one class share timings (choose)."""
    return json.dumps(_class_fields(pattern, impl_names), sort_keys=True, default=str)


#: Problem sizes that follow a call's inputs (rows, batch, sequence), as opposed to the model's
#: own (a weight's N and K, heads, head dim): only these may differ where a ranking is reused.
INPUT_SIZES = frozenset({"m", "batch", "seq_q", "seq_k", "rows", "numel"})


def _nearest(entries: Sequence[dict[str, Any]], problem: Mapping[str, Any]) -> dict | None:
    """Of the timings of earlier optimizes in a pattern's size bucket, the one whose problem
    differs from `problem` in input sizes alone (INPUT_SIZES), the fewest of them; None if
    none does (then the pattern is timed)."""
    best, fewest = None, None
    for e in entries:
        theirs = e.get("problem") or {}
        differ = {k for k in set(theirs) | set(problem) if theirs.get(k) != problem.get(k)}
        if differ <= INPUT_SIZES and (fewest is None or len(differ) < fewest):
            best, fewest = e, len(differ)
    return best


def size_bucket(n: int) -> int:
    """The power of two at or above n: sizes in one bucket share a ranking of kernels."""
    return 1 << max(0, n - 1).bit_length() if n > 0 else n


def size_bucket_class(pattern: Mapping[str, Any], impl_names: Sequence[str] = ()) -> str:
    """pattern_class with the problem's sizes rounded up to their power-of-two buckets: the
    same work at a nearby size, whose kernels rank alike (1000 rows and 1024). Operands keep
    their dtype, rank and which of their strides are unit (the layout), not their sizes, which
    the problem already carries; attributes stay exact. choose() further reuses a ranking only
    where the sizes that differ are input sizes (_nearest)."""

    def bucketed(v: Any) -> Any:
        if isinstance(v, bool):
            return v
        if isinstance(v, int):
            return size_bucket(v)
        if isinstance(v, list):
            return [bucketed(x) for x in v]
        if isinstance(v, dict):
            return {k: bucketed(x) for k, x in v.items()}
        return v

    def operand(o: Mapping[str, Any]) -> dict[str, Any]:
        rank = lambda m: f"[{len([d for d in m.group(1).split(',') if d.strip()])}-d]"  # noqa: E731
        return dict(
            o,
            type=re.sub(r"\[([0-9, ]*)\]", rank, str(o.get("type"))),
            strides=[s == 1 for s in o.get("strides") or []],
        )

    fields = _class_fields(pattern, impl_names)
    fields["problem"] = bucketed(fields["problem"])
    fields["operands"] = [operand(o) for o in fields["operands"]]
    return json.dumps(fields, sort_keys=True, default=str)


def _class_fields(pattern: Mapping[str, Any], impl_names: Sequence[str]) -> dict[str, Any]:
    operands = [
        {
            "role": o.get("role") if o.get("role") in STRUCTURAL_ROLES else "operand",
            "type": o.get("type"),
            "broadcast": o.get("broadcast"),
            "strides": o.get("strides"),
        }
        for o in pattern.get("operands") or []
    ]
    # Attributes that name graph nodes (a gated MLP's gate and up GEMMs, attention's sources)
    # differ from layer to layer of the same work.
    names = set(pattern.get("nodes") or []) | {
        o.get("node") for o in pattern.get("operands") or [] if isinstance(o, dict)
    }

    def names_nodes(v: Any) -> bool:
        return (isinstance(v, str) and v in names) or (
            isinstance(v, list) and bool(v) and all(isinstance(x, str) and x in names for x in v)
        )

    attrs = {
        k: v
        for k, v in (pattern.get("attrs") or {}).items()
        if k not in ("parts", "outputs") and not k.endswith("_source") and not names_nodes(v)
    }
    key = {
        "family": pattern.get("family"),
        "signature": pattern.get("signature"),
        "problem": pattern.get("problem"),
        "epilogue": pattern.get("epilogue"),
        "ssa": (pattern.get("epilogue_expr") or {}).get("ssa"),
        "operands": operands,
        "attrs": attrs,
        "impls": list(impl_names),
    }
    return key


#: Operand roles that say what an operand is (others are the names of epilogue operands' nodes)
STRUCTURAL_ROLES = ("a", "b", "x", "weight", "bias", "q", "k", "v", "mask", "gate", "up")


def _realize_note(run: Path, index: int, tuned: Sequence[Mapping[str, Any]]) -> str:
    """What realize and tuning said about a pattern's generated kernels, when none is usable."""
    if any(r.get("library") for r in tuned):
        return ""
    try:
        manifest = json.loads((run / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    entries = [e for e in manifest if e.get("pattern_index") == index]
    if not entries:
        return ""
    if any(e.get("library") for e in entries):
        return f"none of its {len(entries)} generated kernels passed verification"
    details = sorted({str(e.get("detail") or e.get("status")) for e in entries})
    return "no generated kernel: " + "; ".join(details)


#: Families whose generated kernels the tuning harness leaves alone (harness.TUNED_FAMILIES
#: lists the others): every built kernel is checked and timed in the module's context.
CHECKED_IN_CONTEXT = ("norm", "pointwise")


def _no_impl_reason(pattern: Mapping[str, Any], device: torch.device) -> str:
    family = pattern.get("family")
    generated = ("gemm", "horizontal_gemm", "norm", "gated_mlp", "attention", "pointwise")
    if family in generated and device.type != "cuda":
        return "no GPU: generated kernels cannot run here"
    if family in ("gemm", "horizontal_gemm", "gated_mlp"):
        return "no usable generated kernel"
    if family in ("attention", "norm", "pointwise"):
        return f"no usable generated {family} kernel"
    return f"{family} kernels are not emitted yet"


def _generated_rows(pattern: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list:
    """The tuned kernels of a pattern worth checking in the module's context: the tuner's top
    two where it timed them (GEMMs, attention; rows come fastest first), every one where it did
    not (row norms, pointwise regions, and any family tuning leaves untimed), since only the
    check in context ranks those."""
    built = [r for r in rows if r.get("library")]
    if pattern.get("family") in CHECKED_IN_CONTEXT:
        return built
    timed = [r for r in built if r.get("time_us")]
    return timed[:2] + [r for r in built if not r.get("time_us")]


def compose(program: Program, plan: Mapping[str, Any], decisions: Sequence[Mapping[str, Any]]):
    """Step 5: the exported graph with each chosen implementation in its pattern's place."""
    graph = program.copy_graph()
    patterns = plan.get("patterns") or []
    aliases: dict[str, Any] = {}
    for d in decisions:
        impl = d.get("impl")
        if impl is not None and not d.get("fallback"):
            replace(graph, patterns[d["index"]], impl.emit, aliases)
    graph.lint()
    return program.module(graph)


def fresh_inputs(example: Sequence[Any], seed: int) -> list[Any]:
    """Random inputs shaped like the examples: floating tensors ~ N(mean, std) of the example,
    except finite ones holding two distinct values (a 0/1 padding mask kept as floats, which a
    model turns into an additive bias with (1 - mask) * finfo.min: values outside {0, 1} would
    make it a huge positive bias), whose values are shuffled, and all-ones or all-zeros ones,
    which become random 0/1 masks (other constants ~ N(value, 1));
    integer and boolean tensors (token ids, masks) and non-tensors are reused as given."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        t = t.detach()
        distinct = torch.unique(t) if t.numel() > 1 and bool(torch.isfinite(t).all()) else None
        if distinct is not None and distinct.numel() == 2:
            order = torch.randperm(t.numel(), generator=gen).to(t.device)
            return t.reshape(-1)[order].reshape(t.shape)
        if distinct is not None and distinct.numel() == 1 and float(distinct[0]) in (0.0, 1.0):
            # an all-ones (or all-zeros) mask: a random 0/1 one, never a constant again
            bits = torch.randint(0, 2, t.shape, generator=gen, dtype=torch.float32)
            return bits.to(device=t.device, dtype=t.dtype)
        finite = torch.isfinite(t)
        values = t[finite].float()
        std = float(values.std()) if values.numel() > 1 else 1.0
        std = std if math.isfinite(std) and std > 0 else 1.0
        mean = float(values.mean()) if values.numel() else 0.0
        r = torch.randn(t.shape, generator=gen, dtype=torch.float32) * std + mean
        # -inf entries (an additive mask) and NaNs stay where they were
        return torch.where(finite, r.to(device=t.device, dtype=t.dtype), t)

    return pytree.tree_map(one, list(example))


def _widened(t: Any) -> Any:
    """A tensor in float64, or complex128 where it is complex (Llama's freqs_cis): a cast of a
    complex tensor to float64 would drop its imaginary part."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.is_complex():
        return t.to(torch.complex128)
    return t.double() if t.is_floating_point() else t


def reference_outputs(model: nn.Module, inputs: Sequence[Any]) -> Any:
    """The model in float64 (a temporary copy; complex state in complex128), or None when it
    cannot run in float64."""
    try:
        ref = copy.deepcopy(model)._apply(_widened)
        args = pytree.tree_map(_widened, list(inputs))
        with torch.no_grad():
            return ref(*args)
    except Exception:  # noqa: BLE001 - a model that insists on its dtype: compare to eager
        return None


def verify_end_to_end(
    model: nn.Module,
    program: Program,
    plan,
    decisions,
    example,
    tol: float,
    progress: Progress,
    seed: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """Step 6: compose, compare with float64 on fresh inputs; drop patterns until it passes.
    Returns (graph module, verification record)."""
    inputs = fresh_inputs(example, seed)
    with torch.no_grad():
        eager = model(*inputs)
    ref = reference_outputs(model, inputs)
    eager_err = rel_err(eager, ref) if ref is not None else 0.0
    # A float64 copy grossly off eager is no reference (a model that computes in its own dtype
    # whatever its state's): twice its distance from eager would make a loose bound.
    if ref is None or not eager_err <= 10 * tol:
        ref, eager_err = None, 0.0
    against = "float64" if ref is not None else "eager"
    ref = ref if ref is not None else eager
    bound = max(tol, 2 * eager_err)
    flat = program.flatten(inputs)
    record: dict[str, Any] = {
        "reference": against,
        "eager_error": eager_err,
        "bound": bound,
        "attempts": [],
    }
    while True:
        gm, err, failure = _composed_error(program, plan, decisions, flat, ref)
        active = [d for d in decisions if d.get("impl") is not None and not d.get("fallback")]
        record["attempts"].append({"error": err, "patterns": [d["index"] for d in active]})
        if failure:
            record["attempts"][-1]["failure"] = failure
        progress(
            f"end-to-end check: error {err:.3g} against {against} "
            f"(eager {eager_err:.3g}, bound {bound:.3g}), {len(active)} patterns replaced"
        )
        if err <= bound or not active:
            record["error"] = err
            record["passed"] = err <= bound
            return gm, record
        worst, raised = _most_harmful(program, plan, decisions, active, flat, ref)
        raised = raised or failure
        worst["fallback"] = True
        worst["fallback_from"] = worst.get("chosen")
        # what runs there now: PyTorch; the dropped implementation's figures stay in candidates
        worst.update(chosen="pytorch", kind="pytorch", time_us=None, error=None)
        worst["reason"] = (
            f"fell back to PyTorch: the composed module raised {raised} with it"
            if raised
            else f"fell back to PyTorch: the module's end-to-end error was {err:.3g} "
            f"(bound {bound:.3g}) with it"
        )
        progress(f"pattern {worst['index']} falls back to PyTorch: {worst['reason']}")


def _composed_error(program, plan, decisions, flat, ref) -> tuple[Any, float, str]:
    """Compose with the active decisions and measure: (graph module, error, failure). A
    composition or run that raises counts as an infinite error (it falls back like a wrong
    one); `failure` then says what raised, else it is empty."""
    gm = None
    try:
        gm = compose(program, plan, decisions)
        run = direct_calls(gm) if runs_eagerly(flat) else gm  # as the module will run it
        with torch.no_grad():
            out = program.unflatten(list(run(*program.state_inputs(), *flat)))
        return gm, rel_err(out, ref), ""
    except Exception as exc:  # noqa: BLE001 - any failure of a replacement is a reason to drop it
        if not any(d.get("impl") is not None and not d.get("fallback") for d in decisions):
            raise  # the original graph itself fails: nothing to fall back to
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        return gm, math.inf, f"{type(exc).__name__}: {first_line}" if first_line else repr(exc)


def _most_harmful(program, plan, decisions, active, flat, ref) -> tuple[dict[str, Any], str]:
    """The active pattern whose fallback alone lowers the module's error the most, and what it
    raised (where it raised; else empty). Where no single fallback helps (two patterns break
    the module), each active pattern is composed alone instead, and the first that breaks the
    module by itself is the one."""

    def without(dropped: Sequence[dict[str, Any]]) -> tuple[float, str]:
        for d in dropped:
            d["fallback"] = True
        try:
            _, err, failure = _composed_error(program, plan, decisions, flat, ref)
        finally:
            for d in dropped:
                d["fallback"] = False
        return err, failure

    best, best_err = active[0], math.inf
    for d in active:
        err, _ = without([d])
        if err < best_err:
            best, best_err = d, err
    if math.isfinite(best_err):
        return best, ""
    for d in active:
        err, failure = without([o for o in active if o is not d])
        if not math.isfinite(err):
            return d, failure
    return best, ""


# ---------------------------------------------------------------------------------------------
# The decision cache: what a warm run reuses


def cache_key(
    graph: Mapping[str, Any],
    precision: str,
    arch: str,
    device: torch.device,
    options: Mapping[str, Any] | None = None,
) -> str:
    from fact.tracer import dumps_graph

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    text = "\n".join(
        [
            dumps_graph(dict(graph, source="")),
            precision,
            arch,
            gpu,
            __version__,
            _code_digest(),
            json.dumps(dict(options or {}), sort_keys=True),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _lowerings_digest() -> str:
    from fact.agent.propose import accepted_digest

    try:
        return accepted_digest()
    except FactError as exc:  # an unreadable registry: planned without its lowerings
        return f"unreadable: {exc}"


def graph_digest(graph: Mapping[str, Any]) -> str:
    """The traced graph's content (where it came from aside): a saved module is loaded only
    into a model that traces to the same graph."""
    from fact.tracer import dumps_graph

    return hashlib.sha256(dumps_graph(dict(graph, source="")).encode()).hexdigest()


@functools.cache
def _code_digest() -> str:
    """The engine binary and the composer's sources: decisions made by other code are stale.
    Read once per process: the code that decides is the code this process loaded, whatever
    is edited or rebuilt on disk while it runs."""
    from fact.engine import find_engine

    h = hashlib.sha256()
    try:
        h.update(Path(find_engine()).read_bytes())
    except (FactError, OSError):
        h.update(b"no engine")
    for source in sorted(Path(__file__).parent.glob("*.py")):
        h.update(source.read_bytes())
    return h.hexdigest()


def _save_decisions(path: Path, plan, decisions) -> None:
    rows = []
    for d in decisions:
        row = {k: v for k, v in d.items() if k != "impl"}
        impl = d.get("impl")
        if impl is not None:
            row["impl_spec"] = {
                "name": impl.name,
                "kind": impl.kind,
                "detail": impl.detail,
                "library": getattr(impl, "library_path", None),
                "cached_library": getattr(impl, "cached_library", None),
            }
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(json_ready({"fact_decisions": 1, "plan": plan, "decisions": rows})))
    os.replace(tmp, path)  # atomic: an interrupted run never leaves half a file


def _load_decisions(
    path: Path, device: torch.device, kernels: Callable[[str], str | None] | None = None
) -> tuple[dict, list[dict]] | str:
    """The cached decisions, or why there are none that can be used (a line for the
    transcript). With `kernels` (a saved module's) each kernel's library is what it returns for
    the recorded name (None: not one of the module's checked kernels)."""
    if not path.is_file():
        return "no decisions cached for this graph, precision, GPU and FACT build"
    try:
        return _read_decisions(path, device, kernels)
    except (FactError, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return f"the cached decisions in {path} cannot be read ({type(exc).__name__}: {exc})"


def _read_decisions(
    path: Path, device: torch.device, kernels: Callable[[str], str | None] | None = None
) -> tuple[dict, list[dict]] | str:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"the cached decisions in {path} cannot be read ({exc})"
    plan, rows = doc.get("plan"), doc.get("decisions") or []
    patterns = plan.get("patterns") or []
    for d in rows:
        spec = d.pop("impl_spec", None)
        if spec is None or d.get("fallback"):
            continue
        pattern = patterns[d["index"]]
        if spec["kind"] == "generated":
            if kernels is not None:
                library = kernels(str(spec.get("library")))
                if library is None:
                    return f"its decision names kernel {spec.get('library')!r}, not one it holds"
                d["impl"] = generated_impl(pattern, library, spec["detail"].get("knobs") or {})
                continue
            found = [p for p in (spec.get("library"), spec.get("cached_library")) if p]
            library = next((p for p in found if Path(p).is_file()), None)
            if library is None:
                return (
                    f"the kernel {spec.get('name')} of the cached decisions is gone "
                    f"({' and '.join(found) or 'no path recorded'}): deciding again"
                )
            knobs = spec["detail"].get("knobs") or {}
            d["impl"] = generated_impl(pattern, library, knobs, spec.get("cached_library"))
        else:
            found = [i for i in library_impls(pattern, device) if i.name == spec["name"]]
            if not found:
                return f"the library implementation {spec['name']} is not available here"
            d["impl"] = found[0]
    return plan, rows


def generated_impl(
    pattern: Mapping[str, Any],
    library: str,
    knobs: Mapping[str, Any],
    cached_library: str | None = None,
) -> Impl:
    """A generated kernel library as an implementation of its pattern (GEMM, horizontal GEMM,
    row norm, fused attention or pointwise region). FactError (NotSupportedError) when the
    kernel does not fit the pattern."""
    from fact.tune.abi import KernelLibrary

    lib = KernelLibrary(library)
    if lib.family == "attention":
        impl: Impl = AttentionImpl(pattern, "cutlass", lib, label=lib.name)
    elif lib.family == "norm":
        impl = NormImpl(pattern, "cutlass", lib, label=lib.name)
    elif lib.family == "pointwise" and pattern.get("family") == "gated_mlp":
        impl = GatedTailImpl(pattern, "cutlass", lib, label=lib.name)
    elif lib.family == "pointwise" and pattern.get("family") == "gemm":
        impl = GemmTailImpl(pattern, "cutlass", lib, label=lib.name)
    elif lib.family == "pointwise":
        impl = PointwiseImpl(pattern, "cutlass", lib, label=lib.name)
    elif pattern.get("family") == "gated_mlp":
        impl = GatedGemmImpl(pattern, "cutlass", lib, knobs, label=lib.name)
    elif pattern.get("family") == "horizontal_gemm":
        impl = HorizontalGemmImpl(pattern, "cutlass", lib, knobs, label=lib.name)
    else:
        impl = GemmImpl(pattern, "cutlass", lib, knobs, label=lib.name)
    impl.library_path = str(library)
    impl.cached_library = cached_library  # the kernel cache's copy: outlives the run directory
    return impl


# ---------------------------------------------------------------------------------------------
# The entry point


def optimize(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    precision: str | None = None,
    arch: str = "sm90",
    candidates: int = 4,
    cuda_graphs: bool = True,
    quiet: bool = False,
    run_dir: str | os.PathLike[str] | None = None,
    use_cache: bool = True,
    require_faster: bool = True,
    implementations: Callable[[int, Mapping[str, Any]], list[Impl]] | None = None,
    fold_norms: bool = False,
    agent: str | Mapping[str, Any] | None = None,
    other_sizes: Sequence[Sequence[Any] | torch.Tensor] = (),
    new_sizes: str = "optimize",
) -> OptimizedModule:
    """Return a module computing `model`'s function with FACT's kernels where they verify and
    win, PyTorch everywhere else. See the module docstring for the steps.

    other_sizes: example inputs at other sizes (other batch or sequence lengths; the same
    dtypes and devices) to optimize for now as well, with the same kernels. new_sizes: what a
    call at sizes not optimized for does: "optimize" (default) for them then, once (kernels
    from the cache, nothing compiled for sizes alone; patterns whose sizes share power-of-two
    buckets with ones timed before reuse their ranking), "original" to run the original module
    (with a warning), or "error" to raise. OptimizedModule.prepare(*inputs) does the first ahead
    of time.

    precision: the float32 matmul precision to honour (default: torch's current setting).
    candidates: kernels compiled per GEMM pattern. run_dir: where the plan, kernels, logs and
    report go (default: the cache's runs/<key>). implementations(index, pattern): extra
    implementations to consider (tests use PyTorch twins of the kernels on CPU).

    fold_norms: fold LayerNorms into the GEMMs after them (fact.folds) where FACT's kernels can
    run them; when a fold's kernels are not chosen, the module is planned again without that
    fold (and any other that failed). Off by default: on the H200 the folded MiniGPT block
    measured no faster in bf16 or fp32 `highest` (bench/README.md, "LayerNorm folds").

    agent: off (None) by default. "live", "record" or "replay" (or a dict with "mode",
    "max_calls", "max_tokens", "max_seconds", or "answers": a file of pasted answers) first
    asks fact.agent for lowerings of the ops the catalog lacks; what its gates accept is
    planned like any op (and kept in the registry for later runs, which need no agent).
    """
    from fact.tracer import example_list

    if new_sizes not in NEW_SIZES:
        raise FactError(f"new_sizes must be one of {NEW_SIZES}, not {new_sizes!r}")
    progress = Progress(quiet)
    options = {
        "precision": precision,
        "arch": arch,
        "candidates": candidates,
        "cuda_graphs": cuda_graphs,
        "use_cache": use_cache,
        "require_faster": require_faster,
        "implementations": implementations,
        "fold_norms": fold_norms,
        # size bucket -> timings, for the optimizes of other sizes (choose)
        "buckets": {},
    }
    opt = _optimize_folds(model, example_inputs, progress, run_dir, dict(options, agent=agent))
    sizes: list[dict[str, Any]] = []

    def grow(example: list[Any]) -> OptimizedModule:
        started = time.perf_counter()
        shapes = _sizes_text(example, opt._program)
        progress(f"optimizing for new input sizes ({shapes}), with the kernels of the cache")
        where = Path(run_dir) / f"sizes-{len(sizes) + 1}" if run_dir is not None else None
        variant = _optimize_folds(model, example, progress, where, options)
        seconds = round(time.perf_counter() - started, 2)
        sizes.append(
            {
                "inputs": shapes,
                "seconds": seconds,
                "replaced": variant.report["replaced"],
                "patterns": len(variant.report["patterns"]),
                "compiled": compiled_count(Path(variant.report["run_dir"])),
                "timed_elsewhere": sum(
                    1 for p in variant.report["patterns"] if p.get("timed_at") is not None
                ),
                "runs": "original" if variant.use_original else "FACT",
                "run_dir": variant.report["run_dir"],
            }
        )
        opt.report["sizes"] = sizes
        return variant

    object.__setattr__(opt, "_grow", grow)
    opt.new_sizes = new_sizes
    for other in other_sizes:
        opt.prepare(*example_list(other))
    return opt


def compiled_count(run: Path) -> int:
    """Kernels the engine compiled for a run (not taken from the cache)."""
    manifest = run / "manifest.json"
    if not manifest.is_file():
        return 0
    return sum(1 for e in json.loads(manifest.read_text()) if e.get("status") == "compiled")


#: Sizes an optimized module keeps besides its example's (OptimizedModule.max_sizes).
MAX_SIZES = 8

#: What a call at input sizes the module was not optimized for does (optimize's new_sizes).
NEW_SIZES = ("optimize", "original", "error")


def _optimize_folds(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    progress: Progress,
    run_dir: str | os.PathLike[str] | None,
    options: Mapping[str, Any],
) -> OptimizedModule:
    """_optimize_once, and again without the LayerNorm folds that did not pay."""
    started = time.perf_counter()
    skip: dict[str, str] = {}  # folds that did not pay: norm -> why
    attempt, replans = run_dir, 0
    while True:
        opt, dropped = _optimize_once(
            model, example_inputs, progress, attempt, started, fold_skip=skip, **options
        )
        if opt is not None:
            return opt
        for norm, why in dropped.items():  # each round drops at least one more fold
            progress(f"fold of {norm} does not pay: {why}")
        skip.update(dropped)
        progress(f"planning again without the folds of {', '.join(skip)}")
        replans += 1
        if run_dir is not None:  # the attempt's files stay where they are
            attempt = Path(run_dir) / f"replan-{replans}"


def _optimize_once(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    progress: Progress,
    run_dir: str | os.PathLike[str] | None,
    started: float,
    *,
    fold_norms: bool,
    fold_skip: Mapping[str, str],
    precision: str | None,
    arch: str,
    candidates: int,
    cuda_graphs: bool,
    use_cache: bool,
    require_faster: bool,
    implementations: Callable[[int, Mapping[str, Any]], list[Impl]] | None,
    agent: str | Mapping[str, Any] | None = None,
    saved: Mapping[str, Any] | None = None,
    buckets: dict[str, list[dict[str, Any]]] | None = None,
) -> tuple[OptimizedModule | None, dict[str, str]]:
    """One pass of optimize (from `started`), with LayerNorm folds (but those in `fold_skip`,
    which did not pay before) or without. Returns the module, or None and the folds it made
    that do not pay, by norm, with why. With `saved` (fact.compose.saved.load) the decisions,
    the replay and the guard's choice come from a saved module whose graph this one must be:
    nothing is compiled, tuned or timed."""
    from fact import folds, rewrites
    from fact.tracer import (
        example_list,
        export_module,
        graph_from_program,
        model_dtype,
        save_graph,
    )

    example = example_list(example_inputs)
    precision = precision or torch.get_float32_matmul_precision()
    device = _device_of(example)

    progress(f"tracing {type(model).__name__}")
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        exported = export_module(model, example)
        dtype = model_dtype(exported)
        tol_pattern, tol_e2e = tolerances(dtype, precision)
        # Before the plan. Folds only where kernels can be built or twins are given: without
        # them nothing would run the folded GEMMs.
        can_fold = fold_norms and (device.type == "cuda" or implementations is not None)
        lines, fold_records = rewrites.apply(
            exported, dtype, precision, arch, fold_norms=can_fold, fold_skip=fold_skip
        )
        for line in lines:
            progress(line)
        program = Program(model, exported)
        graph = graph_from_program(
            exported, source=type(model).__name__, model=type(model).__name__
        )
        if agent not in (None, "off") and saved is None:  # before the key: it may add lowerings
            from fact.agent.propose import for_optimize

            with tempfile.TemporaryDirectory(prefix="fact-agent-") as folder:
                for_optimize(graph, agent, Path(folder), progress)
        key = cache_key(
            graph,
            precision,
            arch,
            device,
            {
                "candidates": candidates,
                "require_faster": require_faster,
                # decided with atomic stream-K reductions allowed or not (ops.launch_knobs)
                "deterministic": torch.are_deterministic_algorithms_enabled(),
                # the registry's accepted lowerings change what the planner does (fact.agent)
                "lowerings": _lowerings_digest(),
            },
        )
        program.watch(
            n["target"]
            for n in graph["nodes"]
            if n.get("op") == "placeholder"
            and n.get("kind") in ("buffer", "constant")
            and n.get("facts")
        )
        run = Path(run_dir) if run_dir else cache_root() / "runs" / key[:16]
        try:
            run.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            where = "run_dir" if run_dir else "the cache (FACT_CACHE_DIR, else ~/.cache/fact)"
            raise FactError(
                f"cannot make the run directory {run} in {where}: {exc.strerror or exc}"
            ) from None
        graph_path = save_graph(graph, run / "graph.json")
        decisions_path = cache_root() / "decisions" / f"{key}.json"
        graph_sha = graph_digest(graph)
        if saved is not None:
            if graph_sha != saved["graph_sha256"]:
                raise FactError(
                    f"{type(model).__name__} does not trace to the graph saved in "
                    f"{saved['folder']} (another model, other input shapes or dtypes, or another "
                    "precision or torch version): load it into the model it was saved from, "
                    "or optimize this one"
                )
            decisions_path = Path(saved["folder"]) / "decisions.json"
            cached = _load_decisions(decisions_path, device, saved["kernel"])
            if isinstance(cached, str):
                raise FactError(f"the saved module in {saved['folder']} cannot be used: {cached}")
        elif use_cache and implementations is None:
            cached = _load_decisions(decisions_path, device)
        else:
            cached = None
        if isinstance(cached, str):
            progress(f"cold: {cached} (decision key {key[:16]})")
            cached = None
        values = None
        tuned: dict[int, list[dict]] = {}
        if cached is not None:
            plan, decisions = cached
            how = "loaded" if saved is not None else "warm: reusing"
            progress(f"{how} the decisions in {decisions_path} (nothing to compile or tune)")
        else:
            gpu = device.type == "cuda"
            plan = plan_and_realize(
                graph_path,
                run,
                arch=arch,
                candidates=candidates,
                realize=gpu and implementations is None,
                progress=progress,
                quiet=progress.quiet,
            )
            if gpu and implementations is None and (run / "manifest.json").is_file():
                from fact.tune.runs import tune_run

                tuned = tune_run(run, precision, progress=progress)
            progress("capturing the module's intermediate values")
            values = program.capture(program.inputs(example))
            options: dict[int, list[Impl]] = {}
            refused: dict[int, list[str]] = {}
            for index, pattern in enumerate(plan.get("patterns") or []):
                opts: list[Impl] = []
                for row in _generated_rows(pattern, tuned.get(index, [])):
                    try:
                        knobs, cached = row.get("knobs") or {}, row.get("cached_library")
                        opts.append(generated_impl(pattern, row["library"], knobs, cached))
                    except FactError as exc:
                        progress(f"pattern {index}: {row['kernel']}: {exc}")
                        refused.setdefault(index, []).append(f"{row['kernel']}: {exc}")
                if implementations is not None:
                    opts += implementations(index, pattern)
                opts += library_impls(pattern, device)
                options[index] = opts
            decisions = choose(
                program, plan, options, values, device, tol_pattern, require_faster, progress,
                buckets,
            )  # fmt: skip
            for d in decisions:
                rows = tuned.get(d["index"]) or []
                kernels_note = _realize_note(run, d["index"], rows)
                if d["index"] in refused:  # built and verified, but unfit for the pattern here
                    notes = [kernels_note, *refused[d["index"]]]
                    kernels_note = "; ".join(n for n in notes if n)
                if kernels_note and d["chosen"] == "pytorch":
                    d["reason"] = f"{d['reason']}; {kernels_note}" if d["reason"] else kernels_note
                d["tuning"] = [
                    {k: r.get(k) for k in ("kernel", "time_us", "error", "source")} for r in rows
                ]
        del values
        progress("verifying the composed module end to end")
        gm, verification = verify_end_to_end(
            model, program, plan, decisions, example, tol_e2e, progress
        )
    finally:
        torch.set_float32_matmul_precision(previous)
    # Decisions ranked on another size's timings stay with this module: a later optimize at
    # this size times its own.
    borrowed = any(d.get("timed_at") is not None for d in decisions)
    if use_cache and implementations is None and cached is None and not borrowed:
        _save_decisions(decisions_path, plan, decisions)
    decided = {"plan": plan, "decisions": decisions, "graph_sha256": graph_sha}
    saved_options = {
        "precision": precision,
        "arch": arch,
        "fold_norms": fold_norms,
        "fold_skip": dict(fold_skip),
    }
    dropped = folds.kept(fold_records, plan, decisions) if fold_records else {}
    if dropped:  # planned again without these folds (optimize); its decisions stay cached
        (run / "folds-dropped.json").write_text(json.dumps(dropped, indent=1) + "\n")
        return None, dropped
    replaced = [d for d in decisions if d.get("impl") is not None and not d.get("fallback")]
    report = {
        "fact_optimize_report": 1,
        "model": type(model).__name__,
        "dtype": str(dtype).removeprefix("torch."),
        "precision": precision,
        "arch": arch,
        "device": str(device),
        "warm": cached is not None,
        "run_dir": str(run),
        "seconds": round(time.perf_counter() - started, 2),
        "patterns": [{k: v for k, v in d.items() if k != "impl"} for d in decisions],
        "replaced": len(replaced),
        "pytorch_nodes": [n.get("name") for n in plan.get("pytorch_nodes") or []],
        "verification": verification,
        "folds": [folds.describe(r) for r in fold_records],
        "folds_dropped": [f"{norm}: {why}" for norm, why in fold_skip.items()],
        "cuda_graphs": False,
        "transcript": list(progress.lines),
    }
    opt = OptimizedModule(model, program, gm, report, False, example)
    # fact.save's: the examples on the host, so the module holds no device memory for them
    cpu = [t.detach().to("cpu") if isinstance(t, torch.Tensor) else t for t in example]
    object.__setattr__(opt, "_decided", dict(decided, example=cpu, options=saved_options))
    if saved is not None:  # as chosen when it was saved: nothing is timed again
        for step in ("replay", "guard"):
            if saved["report"].get(step):
                report[step] = dict(saved["report"][step], as_saved=True)
        opt.cuda_graphs = report["cuda_graphs"] = bool(
            device.type == "cuda" and saved["report"].get("cuda_graphs")
        )
        opt.use_original = bool(saved["report"].get("guard", {}).get("chosen") == "original")
    elif cuda_graphs and device.type == "cuda":
        report["replay"] = choose_replay(opt, example)
        opt.cuda_graphs = report["cuda_graphs"] = report["replay"]["chosen"] == "cuda_graph"
        progress(
            f"CUDA graph replay {report['replay']['graph_us']:.0f} us, plain launches "
            f"{report['replay']['launch_us']:.0f} us: {report['replay']['chosen']}"
        )
    if device.type == "cuda" and require_faster and saved is None:
        report["guard"] = guard(opt, example)
        opt.use_original = report["guard"]["chosen"] == "original"
        if opt.use_original:
            object.__setattr__(opt, "_replay", None)  # free the captured graph's buffers
        progress(
            f"the composed module {report['guard']['fact_us']:.0f} us, the original "
            f"{report['guard']['original_us']:.0f} us: "
            + (
                "it runs the original module (set use_original = False to run FACT's anyway)"
                if opt.use_original
                else "FACT's"
            )
        )
    (run / "optimize.json").write_text(json.dumps(json_ready(report), indent=1) + "\n")
    (run / "transcript.txt").write_text("\n".join(progress.lines) + "\n")
    progress(
        f"done: {len(replaced)} of {len(decisions)} patterns replaced "
        f"in {report['seconds']:.1f}s; report in {run / 'optimize.json'}"
    )
    return opt, {}


def choose_replay(opt: OptimizedModule, example: Sequence[Any]) -> dict[str, Any]:
    """Step 7: time the module with and without whole-module CUDA graph replay on the example
    inputs, under both protocols (fact.timing), in alternating turns. Replay is kept only where
    it wins under both: it copies inputs in and outputs out, which can cost more on the GPU
    than the launches it saves on the host."""
    device = _device_of(example)

    def no_replay(exc: Exception) -> dict[str, Any]:
        object.__setattr__(opt, "_replay", None)
        return {
            "graph_us": math.inf,
            "launch_us": math.nan,
            "chosen": "launches",
            "error": f"{type(exc).__name__}: {exc}",
        }

    for mode in (True, False):  # warm up both; the first replayed call captures the graph
        opt.cuda_graphs = mode
        try:
            with torch.no_grad():
                opt(*example)
        except Exception as exc:  # noqa: BLE001 - capture can fail (a sync in some op)
            if not mode:
                raise
            return no_replay(exc)

    def run(mode: bool) -> Callable[[], Any]:
        def call() -> Any:
            opt.cuda_graphs = mode
            return opt(*example)

        return call

    try:
        times = take_turns({True: run(True), False: run(False)}, device)
    except Exception as exc:  # noqa: BLE001 - a replay that fails later: no replay
        opt.cuda_graphs = False
        with torch.no_grad():
            opt(*example)  # plain launches must work; raise here if they do not
        return no_replay(exc)
    chosen = "cuda_graph" if times[True].beats(times[False]) else "launches"
    opt.cuda_graphs = chosen == "cuda_graph"
    if chosen == "launches":
        object.__setattr__(opt, "_replay", None)  # free the captured graph's buffers
    return {
        "graph_us": times[True].per_call_us,
        "launch_us": times[False].per_call_us,
        "graph": times[True].as_dict(),
        "launches": times[False].as_dict(),
        "chosen": chosen,
    }


def guard(opt: OptimizedModule, example: Sequence[Any]) -> dict[str, Any]:
    """Step 8: the composed module (in the launch mode step 7 chose) against the original
    module on the example inputs, under both protocols, in alternating turns. Every pattern
    was faster in context, but the whole can still lose: eager may take a fast path the
    exported graph does not (nn.MultiheadAttention's fused inference path), and host time
    between launches is in no pattern's timing. The composed module is kept only where it
    beats the original under both protocols; otherwise the module runs the original."""
    device = _device_of(example)

    def original() -> Any:
        return opt.original(*example)

    def composed() -> Any:
        return opt(*example)

    with torch.no_grad():
        original(), composed()  # warm up
    times = take_turns({"pytorch": original, "fact": composed}, device)
    fact_t, original_t = times["fact"], times["pytorch"]
    return {
        "fact_us": fact_t.per_call_us,
        "original_us": original_t.per_call_us,
        "fact": fact_t.as_dict(),
        "original": original_t.as_dict(),
        "chosen": "fact" if fact_t.beats(original_t) else "original",
    }


__all__ = ["OptimizedModule", "optimize"]
