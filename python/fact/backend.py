"""`torch.compile(model, backend="fact")`: FACT as a TorchDynamo backend.

Dynamo hands over each captured graph with its example inputs; FACT optimizes that graph like
any module (fact.optimize) and returns the composed module's call. If FACT cannot optimize a
graph, the graph runs as Dynamo captured it and a warning says why: the model never breaks.

Dynamo passes the model's parameters and buffers to its graphs as inputs. FACT takes them back
as the state of the graph's module (the same tensors, not copies): a tril buffer is then known
to be a causal mask, work on weights alone is done once, and in-place updates are seen as with
fact.optimize. A tensor Dynamo passes in place of one it passed before (an attribute assigned a
new tensor) is taken as the new state.

The backend is registered under the name "fact" by the `torch_dynamo_backends` entry point of
FACT's package, and by importing this module where that entry point is not installed.
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fact.compose import optimize as optimize_mod
from fact.errors import FactError

_OPTIMIZE_PARAMETERS = dict(inspect.signature(optimize_mod.optimize).parameters)


def _real(t: Any) -> Any:
    """Dynamo's example inputs as real tensors (fake ones become random of the same kind)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(t, FakeTensor):
        return t
    if t.is_floating_point():
        return torch.randn(t.shape, dtype=t.dtype, device=t.device)
    return torch.zeros(t.shape, dtype=t.dtype, device=t.device)


def _symbolic(t: Any) -> bool:
    """A size Dynamo made symbolic (dynamic shapes), or a tensor with one."""
    if isinstance(t, torch.SymInt):
        return True
    return isinstance(t, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in t.shape)


def _source(node: torch.fx.Node, what: str) -> Any:
    """An attribute of where Dynamo took a graph input from: its `name`
    (L['self']._modules['fc']._parameters['weight']) or `guard_source`; a property in newer
    torch, a method in older; None without one."""
    value = getattr(getattr(node.meta.get("grapharg"), "source", None), what, None)
    return value() if callable(value) else value


def _is_state(node: torch.fx.Node, value: Any) -> bool:
    """A parameter, buffer or tensor attribute of the model, which Dynamo passes as an input."""
    if isinstance(value, nn.Parameter):
        return True
    return isinstance(value, torch.Tensor) and "NN_MODULE" in str(_source(node, "guard_source"))


class CapturedGraph(nn.Module):
    """A Dynamo graph as a module whose state is the model's: the graph inputs that are the
    model's parameters and buffers are registered here (the same tensor objects), and forward
    takes only the others, the user's inputs."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        super().__init__()
        self.graph_module = gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.slots: list[str | None] = []  # per graph input: its state name, or None (a user's)
        for node, value in zip(placeholders, example_inputs, strict=True):
            if not _is_state(node, value):
                self.slots.append(None)
                continue
            # L['self']._modules['fc']._parameters['weight'] -> fc_weight
            source = str(_source(node, "name") or "")
            keys = [a or b for a, b in re.findall(r"\['([^']+)'\]|\.(\w+)", source)]
            parts = [p for p in keys[1:] if not p.startswith("_")] or [node.name]
            name = base = re.sub(r"\W", "_", "_".join(parts))
            suffix = 1
            while hasattr(self, name):  # taken: by a name given before, or the module's own
                suffix += 1
                name = f"{base}_{suffix}"
            self._take(name, value)
            self.slots.append(name)

    def _take(self, name: str, value: torch.Tensor) -> None:
        if isinstance(value, nn.Parameter):
            self.register_parameter(name, value)
        else:
            self.register_buffer(name, value)

    def user_inputs(self, args: Sequence[Any]) -> list[Any]:
        """The user's inputs among a call's graph inputs; state passed as another tensor than
        before (an attribute assigned anew) becomes this module's state first."""
        user = []
        for slot, value in zip(self.slots, args, strict=True):
            if slot is None:
                user.append(value)
            elif getattr(self, slot) is not value:
                self._take(slot, value)
        return user

    def forward(self, *user: Any) -> Any:
        it = iter(user)
        args = [next(it) if slot is None else getattr(self, slot) for slot in self.slots]
        return self.graph_module(*args)


def _optimize_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """torch.compile's options= as fact.optimize's keyword arguments; a name optimize does not
    take is an error (a typo must not quietly turn FACT off)."""
    # Sizes are Dynamo's to key (a graph per shape, or one with symbolic sizes, _per_size).
    accepted = [
        name
        for name, p in _OPTIMIZE_PARAMETERS.items()
        if p.kind == inspect.Parameter.KEYWORD_ONLY
        and name not in ("implementations", "other_sizes", "new_sizes")
    ]
    unknown = sorted(set(options or {}) - set(accepted))
    if unknown:
        raise FactError(
            f"torch.compile(backend='fact', options=...): unknown option(s) {unknown}; FACT "
            f"takes {', '.join(accepted)}"
        )
    return dict(options or {})


def fact_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
    **kwargs: Any,
) -> Callable:
    """Optimize one Dynamo graph. torch.compile's `options` are fact.optimize's keyword
    arguments (for example {"candidates": 8, "cuda_graphs": False}); its `mode` has no
    meaning here (FACT tunes, and chooses CUDA graph replay, by measurement)."""
    settings = {**_optimize_options(options), **kwargs}
    if mode not in (None, "default"):
        warnings.warn(
            f"torch.compile(mode={mode!r}) has no meaning for backend='fact', which tunes and "
            "chooses CUDA graph replay by measurement; pass FACT's settings as options=",
            stacklevel=2,
        )
    grads = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in [*example_inputs, *gm.parameters()]
    )
    if grads:  # FACT's modules are inference only: training keeps Dynamo's graph
        warnings.warn(
            "FACT optimizes inference; this graph needs gradients, so it runs as captured "
            "(use torch.no_grad() or inference_mode() around calls to get FACT's kernels)",
            stacklevel=2,
        )
        return gm.forward
    settings.setdefault("quiet", True)
    if any(_symbolic(t) for t in example_inputs):
        return _per_size(gm, settings)
    return _optimized_graph(gm, example_inputs, settings)


def _optimized_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], settings: Mapping[str, Any]
) -> Callable:
    """The graph optimized for these inputs' shapes, as a call on the graph's inputs; the
    captured graph (with a warning) where FACT cannot optimize it."""
    try:
        module = CapturedGraph(gm, example_inputs)
        user = [_real(t) for t in module.user_inputs(example_inputs)]
        opt = optimize_mod.optimize(module, user, **settings)  # looked up now: tests replace it
    except Exception as exc:  # noqa: BLE001 - whatever fails, the model must still run
        warnings.warn(f"FACT could not optimize a graph; it runs as captured: {exc}", stacklevel=3)
        return gm.forward

    def run(*args: Any) -> Any:
        return opt(*module.user_inputs(args))

    run.optimized = opt  # type: ignore[attr-defined]  # the OptimizedModule, for inspection
    return run


def _per_size(gm: torch.fx.GraphModule, settings: Mapping[str, Any]) -> Callable:
    """A graph Dynamo made dynamic (a call with new sizes recompiled it with symbolic sizes):
    optimized for each concrete set of sizes at its first call, as fact.optimize does for new
    sizes (the kernels come from the cache; nothing is compiled for sizes alone). Its symbolic
    sizes arrive as integers, which each optimized graph takes as constants."""
    sized = dict(settings, new_sizes="original")  # this table, not the module, keys the sizes
    built: dict[tuple, Callable] = {}
    warned: list[bool] = []
    user: list[int] | None = None  # positions of the user's inputs among the graph's

    def run(*args: Any) -> Any:
        nonlocal user
        if user is None:
            user = [i for i, slot in enumerate(CapturedGraph(gm, args).slots) if slot is None]
        # The state's shapes and dtypes are each optimized module's to check (it runs the
        # original where they changed), so the user's inputs alone key the table.
        key = tuple(
            (tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("value", a)
            for a in (args[i] for i in user)
        )
        fn = built.get(key)
        if fn is None:
            if len(built) >= optimize_mod.MAX_SIZES:  # a loop whose sizes never repeat
                if not warned:
                    warned.append(True)
                    warnings.warn(
                        f"FACT optimized this graph for {optimize_mod.MAX_SIZES} sizes already; "
                        "calls at further sizes run it as captured",
                        stacklevel=2,
                    )
                return gm.forward(*args)
            fn = built[key] = _optimized_graph(gm, list(args), sized)
        return fn(*args)

    run.sizes = built  # type: ignore[attr-defined]  # sizes -> optimized call, for inspection
    return run


def _register() -> None:
    """backend="fact" without the package's entry point (the source tree on PYTHONPATH). Where
    the entry point is installed, torch loads this module through it and registers the name
    itself: registering here too would make that a duplicate."""
    from importlib.metadata import entry_points

    if any(e.name == "fact" for e in entry_points(group="torch_dynamo_backends")):
        return
    try:
        from torch._dynamo import register_backend

        register_backend(compiler_fn=fact_backend, name="fact")
    except (ImportError, RuntimeError, AssertionError):  # already registered, or no dynamo
        pass


_register()
