"""FACT: a kernel-synthesis compiler for PyTorch. This package is its thin Python front door.

`trace` turns a module into a graph file (docs/graph-format.md); the C++ engine, `fact-engine`,
does the rest. Torch-dependent names load on first use, so `fact --help` and running the engine on
a saved graph do not pay for importing torch.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fact.errors import FactError

__version__ = "0.1.0"

__all__ = [
    "FactError",
    "__version__",
    "discover",
    "load",
    "load_graph",
    "load_problem",
    "optimize",
    "save",
    "save_graph",
    "trace",
]

_LAZY = {
    "trace": "fact.tracer",
    "save_graph": "fact.tracer",
    "load_graph": "fact.tracer",
    "load_problem": "fact.problem",
    "optimize": "fact.compose.optimize",
    "save": "fact.compose.saved",
    "load": "fact.compose.saved",
}

if TYPE_CHECKING:
    from fact.compose.optimize import optimize
    from fact.compose.saved import load, save
    from fact.problem import load_problem
    from fact.tracer import load_graph, save_graph, trace


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fact' has no attribute {name!r}")


def discover(
    module_or_problem_path: Any,
    example_inputs: Any = None,
    *,
    dtype: str | None = None,
    arch: str = "sm90",
) -> dict:
    """Trace a module (or a problem file's model) and return the engine's kernel plan for
    `arch`: the plan `fact.optimize` makes, with the layout rewrites it applies for that target
    under torch's float32 matmul precision (fact.layouts).

    Pass an nn.Module with its example inputs, or the path of a problem file (its get_inputs()
    are used). `dtype` casts the model and floating-point inputs first; a module is cast in place.
    """
    from fact.engine import engine_json, find_engine
    from fact.problem import load_problem
    from fact.tracer import save_graph, trace

    find_engine()  # fail before a long trace, not after
    if isinstance(module_or_problem_path, (str, os.PathLike)):
        if example_inputs is not None:
            raise FactError(
                "discover() takes example_inputs only with a module, not a problem file"
            )
        problem = load_problem(module_or_problem_path, dtype)
        graph = trace(problem.model, problem.inputs, source=str(module_or_problem_path), arch=arch)
    else:
        if example_inputs is None:
            raise FactError("discover(module, example_inputs): the example inputs are missing")
        graph = trace(module_or_problem_path, example_inputs, dtype=dtype, arch=arch)
    with tempfile.TemporaryDirectory(prefix="fact-") as folder:
        path = save_graph(graph, Path(folder) / "graph.json")
        return engine_json("discover", path, "--arch", arch)
