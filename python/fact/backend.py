"""`torch.compile(model, backend="fact")`: FACT as a TorchDynamo backend.

Dynamo hands over each captured graph with its example inputs; FACT optimizes that graph like
any module (fact.optimize) and returns the composed module's call. If FACT cannot optimize a
graph, the graph runs as Dynamo captured it and a warning says why: the model never breaks.
The backend is registered under the name "fact" by the `torch_dynamo_backends` entry point of
FACT's package (and by importing this module).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch


def _real(t: Any) -> Any:
    """Dynamo's example inputs as real tensors (fake ones become random of the same kind)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(t, FakeTensor):
        return t
    if t.is_floating_point():
        return torch.randn(t.shape, dtype=t.dtype, device=t.device)
    return torch.zeros(t.shape, dtype=t.dtype, device=t.device)


def fact_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any
) -> Callable:
    """Optimize one Dynamo graph; options are fact.optimize's keyword arguments."""
    from fact.compose.optimize import optimize

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
    inputs = [_real(t) for t in example_inputs]
    options.setdefault("quiet", True)
    try:
        opt = optimize(gm, inputs, **options)
    except Exception as exc:  # noqa: BLE001 - whatever fails, the model must still run
        warnings.warn(f"FACT could not optimize a graph; it runs as captured: {exc}", stacklevel=2)
        return gm.forward
    return opt


try:  # registering makes backend="fact" work without the package's entry point
    from torch._dynamo import register_backend

    register_backend(compiler_fn=fact_backend, name="fact")
except (ImportError, RuntimeError, AssertionError):  # already registered, or no dynamo
    pass
