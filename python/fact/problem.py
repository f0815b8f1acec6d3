"""Loading problem files: a .py that defines `Model`, `get_inputs()` and `get_init_inputs()`.

This is the KernelBench-style convention the examples use. Loading runs the user's code, so every
way it can go wrong is turned into a `ProblemError` that names the file and says what to fix,
instead of a traceback from deep inside importlib or torch.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from fact.errors import FactError, ProblemError

#: The spellings `--dtype` accepts, and the torch dtype each casts to.
DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}

_SHAPE_HINT = "a problem file defines `Model`, `get_inputs()` and `get_init_inputs()`"


@dataclass
class Problem:
    """A loaded problem: the model in eval mode and the example inputs, already cast."""

    path: Path
    model: nn.Module
    inputs: list[torch.Tensor]
    dtype: str | None = None

    @property
    def name(self) -> str:
        """The model's class name, as reports show it."""
        return type(self.model).__name__


def resolve_dtype(name: str | None) -> torch.dtype | None:
    """Map a `--dtype` spelling to a torch dtype (None stays None: no cast)."""
    if name is None:
        return None
    try:
        return DTYPES[name]
    except KeyError:
        raise FactError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def cast(model: nn.Module, inputs: list[Any], dtype: str | None) -> tuple[nn.Module, list[Any]]:
    """Cast the model (in place, as `nn.Module.to` does) and the floating-point inputs.

    Integer and bool inputs (token ids, masks) keep their dtype, as do the model's integer buffers:
    only what a mixed-precision user would cast is cast.
    """
    torch_dtype = resolve_dtype(dtype)
    if torch_dtype is None:
        return model, list(inputs)
    model = model.to(torch_dtype)
    cast_inputs = [
        t.to(torch_dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for t in inputs
    ]
    return model, cast_inputs


def import_problem_module(path: str | Path) -> ModuleType:
    """Import a problem file by path and return the module, or raise `ProblemError`.

    The file's folder is on sys.path while it imports, so a problem may import helpers beside it;
    the module is registered in sys.modules (dataclasses and pickling need that).
    """
    path = check_problem_path(path)
    name = "fact_problem_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProblemError(f"cannot import {path}: Python does not recognise it as a module")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.modules[name] = module
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise ProblemError(f"importing {path} raised {_describe(exc)}") from None
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    return module


def check_problem_path(path: str | Path) -> Path:
    """Check that path names an existing .py file (cheaply, before any slow work)."""
    path = Path(path)
    shown = str(path)
    if not path.exists():
        raise ProblemError(f"problem file {shown} not found")
    if path.is_dir():
        raise ProblemError(f"{shown} is a folder, not a problem file; {_SHAPE_HINT}")
    if path.suffix != ".py":
        also = ""
        if path.suffix == ".json":
            also = "; a traced graph (.json) goes to `fact discover` or `fact explain`"
        raise ProblemError(f"{shown} is not a Python file (.py); {_SHAPE_HINT}{also}")
    return path


def load_problem(path: str | Path, dtype: str | None = None) -> Problem:
    """Load a problem file: build `Model(*get_init_inputs())` in eval mode and its inputs.

    With `dtype` ("bf16", "fp16", "fp32") the model and the floating-point inputs are cast.
    `get_init_inputs` may be left out (no constructor arguments).
    """
    resolve_dtype(dtype)  # reject a bad spelling before running any user code
    module = import_problem_module(path)
    shown = str(path)

    model_cls = getattr(module, "Model", None)
    if model_cls is None:
        raise ProblemError(f"{shown} defines no `Model`; {_SHAPE_HINT}")
    if not (isinstance(model_cls, type) and issubclass(model_cls, nn.Module)):
        raise ProblemError(f"`Model` in {shown} is {_kind(model_cls)}, not an nn.Module subclass")
    get_inputs = getattr(module, "get_inputs", None)
    if get_inputs is None:
        raise ProblemError(
            f"{shown} defines no `get_inputs()`; "
            "add one that returns the list of example input tensors"
        )
    if not callable(get_inputs):
        raise ProblemError(f"`get_inputs` in {shown} is {_kind(get_inputs)}, not a function")

    init_inputs: Any = []
    get_init_inputs = getattr(module, "get_init_inputs", None)
    if get_init_inputs is not None:
        if not callable(get_init_inputs):
            raise ProblemError(
                f"`get_init_inputs` in {shown} is {_kind(get_init_inputs)}, not a function"
            )
        init_inputs = _call(get_init_inputs, "get_init_inputs()", shown)
        if not isinstance(init_inputs, (list, tuple)):
            raise ProblemError(
                f"get_init_inputs() in {shown} returned {_kind(init_inputs)}; "
                "it must return a list of Model's constructor arguments"
            )

    model = _call(lambda: model_cls(*init_inputs), "Model(*get_init_inputs())", shown)
    inputs = _call(get_inputs, "get_inputs()", shown)
    if not isinstance(inputs, (list, tuple)):
        raise ProblemError(
            f"get_inputs() in {shown} returned {_kind(inputs)}; it must return a list of tensors"
        )
    for i, value in enumerate(inputs):
        # Tensors, and the plain values forward commonly takes besides (a scale, a flag, None):
        # the trace takes those as constants, and a call with other values runs the model.
        if not isinstance(value, (torch.Tensor, bool, int, float, type(None))):
            raise ProblemError(
                f"get_inputs() in {shown} returned {_kind(value)} at position {i}; every "
                "example input must be a tensor, a number, a bool or None"
            )

    model, inputs = cast(model.eval(), list(inputs), dtype)
    return Problem(path=Path(path), model=model, inputs=inputs, dtype=dtype)


def _call(fn: Any, what: str, shown: str) -> Any:
    """Run user code, turning any exception into a ProblemError that names the call."""
    try:
        return fn()
    except (Exception, SystemExit) as exc:
        raise ProblemError(f"{what} in {shown} raised {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    """`Type: message`, first lines only: enough to act on, never a traceback."""
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()][:3]
    head = type(exc).__name__
    return f"{head}: {' / '.join(lines)}" if lines else head


def _kind(value: Any) -> str:
    """A short description of a value for messages ("a dict", "None")."""
    if value is None:
        return "None"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"
