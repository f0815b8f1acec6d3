"""Tracing a PyTorch module into a FACT graph (docs/graph-format.md).

The tracer is deliberately thin: `torch.export.export(..., strict=False)` captures the training IR
(ATen ops such as `aten.linear` survive; no decompositions are run, so the engine sees what the
user wrote), and every FX node becomes one JSON node. Nothing is dropped or rewritten: an op FACT
does not know is still a node, and the engine decides what to do with it. The only tensor data
read is that of buffers and lifted constants, to record value facts (a causal mask) that rules
can use without the data.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import operator
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from fact.errors import FactError, GraphError, TraceError
from fact.problem import cast

FORMAT = "fact.graph"
VERSION = 1

_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "f8e4m3",
    torch.float8_e5m2: "f8e5m2",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.complex64: "c64",
    torch.complex128: "c128",
}

# Facts are checked on real buffer data; past this many elements the check is not worth its memory.
_FACT_MAX_ELEMENTS = 1 << 28

# Where torch and FACT live, to find the user's own frame in an export failure's traceback.
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_FACT_DIR = str(Path(__file__).resolve().parent)


def dtype_name(dtype: torch.dtype) -> str:
    """The format's short dtype name (`bf16`); others as PyTorch names them (`float8_e4m3fnuz`)."""
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def model_dtype(program: torch.export.ExportedProgram) -> torch.dtype:
    """The exported model's floating-point dtype (after any cast): its first floating
    parameter's, else its first floating input's, else float32."""
    from torch.export.graph_signature import InputKind

    vals = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    specs = program.graph_signature.input_specs
    for kind in (InputKind.PARAMETER, InputKind.USER_INPUT):
        for spec in specs:
            val = vals.get(spec.arg.name) if spec.kind == kind else None
            if isinstance(val, torch.Tensor) and val.is_floating_point():
                return val.dtype
    return torch.float32


def trace(
    module: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    dtype: str | None = None,
    source: str | None = None,
    dynamic_shapes: Any = None,
    arch: str | None = None,
    fold_norms: bool = False,
    on_rewrite: Callable[[str], None] | None = None,
) -> dict:
    """Export `module` on `example_inputs` and return its FACT graph as a JSON-ready dict.

    `dtype` ("bf16", "fp16", "fp32") first casts the module in place (as `nn.Module.to` does) and
    the floating-point inputs. `source` is recorded for reports (the problem file); it defaults to
    the module's class. `dynamic_shapes` is passed to torch.export; symbolic dims come out as
    strings such as "s0". With `arch`, the program first gets the rewrites that
    `fact.optimize` gives it for that target under torch's float32 matmul precision
    (fact.rewrites.apply: layouts, and LayerNorm folds with `fold_norms`; `on_rewrite` is
    called with a line for each), so that the graph is the one optimize plans; without, it is
    the graph as exported. Raises `TraceError` when torch.export cannot capture the model.
    """
    program = export_module(
        module, example_inputs, dtype=dtype, source=source, dynamic_shapes=dynamic_shapes
    )
    if arch is not None:  # planned as optimize plans it: refused where optimize refuses
        from fact import rewrites
        from fact.compose.program import check_inference

        check_inference(type(module).__name__, program)
        precision = torch.get_float32_matmul_precision()
        lines, _ = rewrites.apply(
            program, model_dtype(program), precision, arch, fold_norms=fold_norms
        )
        for line in lines:
            if on_rewrite is not None:
                on_rewrite(line)
    return graph_from_program(
        program, source=source or _class_path(module), model=type(module).__name__
    )


def example_list(example_inputs: Any) -> list[Any]:
    """Example inputs as forward's positional arguments: one tensor, or a list or tuple of
    them (and of other values forward takes); anything else is a FactError saying so."""
    if isinstance(example_inputs, torch.Tensor):
        return [example_inputs]
    if isinstance(example_inputs, (list, tuple)):
        return list(example_inputs)
    if isinstance(example_inputs, dict):
        raise FactError(
            "example inputs as a dict: pass forward's arguments as a list, in its order "
            f"(for {list(example_inputs)[:4]}: [{', '.join(map(str, list(example_inputs)[:4]))}])"
        )
    raise FactError(
        "example inputs must be a tensor or a list (or tuple) of forward's arguments, got "
        f"{type(example_inputs).__name__}"
    )


def export_module(
    module: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    dtype: str | None = None,
    source: str | None = None,
    dynamic_shapes: Any = None,
) -> torch.export.ExportedProgram:
    """The torch.export step of `trace` (same arguments), for callers that want the program."""
    if not isinstance(module, nn.Module):
        raise FactError(f"trace() needs an nn.Module, got {type(module).__name__}")
    module, inputs = cast(module, example_list(example_inputs), dtype)
    try:
        with _quiet_torch():
            return torch.export.export(
                module, tuple(inputs), dynamic_shapes=dynamic_shapes, strict=False
            )
    except Exception as exc:  # torch raises many unrelated types; all mean "could not capture"
        raise _trace_error(exc, type(module).__name__, source or _class_path(module)) from None


def _class_path(module: nn.Module) -> str:
    """Where a module came from when no problem file says so: its class, fully qualified."""
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def graph_from_program(program: torch.export.ExportedProgram, *, source: str, model: str) -> dict:
    """Convert an ExportedProgram to the graph format: one node per FX node but `output`."""
    sig = program.graph_signature
    placeholders: dict[str, tuple[str, str]] = {}
    for name, target in sig.inputs_to_parameters.items():
        placeholders[name] = ("parameter", target)
    for name, target in sig.inputs_to_buffers.items():
        placeholders[name] = ("buffer", target)
    for name, target in sig.inputs_to_lifted_tensor_constants.items():
        placeholders[name] = ("constant", target)
    for name, target in getattr(sig, "inputs_to_lifted_custom_objs", {}).items():
        placeholders[name] = ("constant", target)
    for name in sig.user_inputs:
        if isinstance(name, str):
            placeholders[name] = ("input", name)

    nodes: list[dict] = []
    outputs: list[Any] = []
    float_dtypes: set[torch.dtype] = set()
    for node in program.graph.nodes:
        if node.op == "output":
            results = node.args[0]
            outputs = (
                [_value(v) for v in results]
                if isinstance(results, (list, tuple))
                else [_value(results)]
            )
            continue
        if node.op == "placeholder":
            kind, target = placeholders.get(node.name, ("input", str(node.target)))
            val = node.meta.get("val")
            if kind == "input" and not isinstance(val, torch.Tensor) and not node.users:
                continue  # a number, bool or None the export took as a constant of the trace
            entry = _placeholder(node, kind, target, program)
            if kind in ("parameter", "input") and isinstance(val, torch.Tensor):
                if val.dtype.is_floating_point:
                    float_dtypes.add(val.dtype)
        elif node.op == "get_attr":
            # A control-flow op's subgraph (torch.cond): an opaque call the engine leaves alone.
            entry = {
                "name": node.name,
                "op": "get_attr",
                "kind": "call",
                "target": str(node.target),
                "module": "",
                "args": [],
                "kwargs": {},
                "outputs": [],
            }
        else:
            entry = _call(node)
        nodes.append(entry)

    if len(float_dtypes) == 1:
        graph_dtype = dtype_name(next(iter(float_dtypes)))
    else:
        graph_dtype = "mixed" if float_dtypes else "none"
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": source,
        "model": model,
        "dtype": graph_dtype,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_version": str(torch.__version__),
        "nodes": nodes,
        "outputs": outputs,
    }


def _placeholder(
    node: fx.Node, kind: str, target: str, program: torch.export.ExportedProgram
) -> dict:
    """A placeholder node; buffers and constants also get the facts their values support."""
    entry: dict[str, Any] = {
        "name": node.name,
        "op": "placeholder",
        "kind": kind,
        "target": target,
        "outputs": _outputs(node.meta.get("val")),
    }
    if kind in ("buffer", "constant"):
        value = program.state_dict.get(target)
        if value is None:
            value = program.constants.get(target)  # non-persistent buffers and lifted constants
        if isinstance(value, torch.Tensor):
            facts = value_facts(value)
            if facts:
                entry["facts"] = facts
    return entry


def _call(node: fx.Node) -> dict:
    """A call node: op name, issuing module, encoded arguments and result types."""
    return {
        "name": node.name,
        "op": op_name(node),
        "kind": "call",
        "module": _module_path(node),
        "args": [_value(a) for a in node.args],
        "kwargs": {k: _value(v) for k, v in node.kwargs.items()},
        "outputs": _outputs(node.meta.get("val")),
    }


def op_name(node: fx.Node) -> str:
    """The format's `op` for a call: `aten.add.Tensor`, `getitem`, or `python.<qualified name>`."""
    target = node.target
    if node.op == "call_function":
        if isinstance(target, torch._ops.OpOverload):
            return str(target)  # "<namespace>.<name>.<overload>"
        if isinstance(target, torch._ops.HigherOrderOperator):
            return f"{target.namespace}.{target.name()}"
        if target is operator.getitem:
            return "getitem"
        module = getattr(target, "__module__", None) or ""
        module = {"_operator": "operator"}.get(module, module)
        qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
        if qualname is None:
            return f"python.{target!r}"
        return f"python.{module}.{qualname}" if module else f"python.{qualname}"
    # torch.export does not emit these today; kept as opaque nodes rather than dropped.
    return f"python.{node.op}.{target}"


def _module_path(node: fx.Node) -> str:
    """The innermost nn.Module FQN on the node's nn_module_stack ("" at the top or if none)."""
    stack = node.meta.get("nn_module_stack") or {}
    for key, value in reversed(list(stack.items())):
        if str(key).startswith("_empty_nn_module_stack"):
            continue  # torch's placeholder entry for nodes created outside any module
        path = value[0] if isinstance(value, tuple) else value
        return path if isinstance(path, str) else ""
    return ""


def _outputs(val: Any) -> list[dict]:
    """One entry per result: a tensor type, or `{"value": ...}` for a non-tensor result."""
    if val is None:
        return []
    if isinstance(val, (list, tuple)):
        return [_result(v) for v in val]
    return [_result(val)]


def _result(val: Any) -> dict:
    if isinstance(val, torch.Tensor):
        return tensor_type(val)
    return {"value": _value(val)}


def tensor_type(t: torch.Tensor) -> dict:
    """`{"dtype", "shape", "strides"}` from a (fake) tensor, without touching its data."""
    try:
        strides: list[Any] | None = [_dim(s) for s in t.stride()]
    except (RuntimeError, NotImplementedError):  # sparse and other non-strided layouts
        strides = None
    return {"dtype": dtype_name(t.dtype), "shape": [_dim(d) for d in t.shape], "strides": strides}


def _dim(d: Any) -> int | str:
    """A size or stride: an int, or the symbolic expression as a string ("s0")."""
    if isinstance(d, torch.SymInt):
        concrete = d.node.maybe_as_int()
        return concrete if concrete is not None else str(d)
    return int(d)


def _value(v: Any) -> Any:
    """Encode an argument value as docs/graph-format.md says ("Argument values")."""
    if isinstance(v, fx.Node):
        return {"node": v.name}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return {"float": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"symbol": str(v)}
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, torch.Tensor):  # never print tensor data
        return {"repr": f"tensor(dtype={dtype_name(v.dtype)}, shape={list(v.shape)})"}
    return {"repr": repr(v)}


def value_facts(t: torch.Tensor) -> dict:
    """What a buffer's or constant's values prove: `tril`, `causal_additive`, `value`."""
    facts: dict[str, Any] = {}
    if t.is_meta or t.layout != torch.strided or t.numel() > _FACT_MAX_ELEMENTS:
        return facts
    with torch.no_grad():
        if t.dim() >= 2 and t.shape[-1] == t.shape[-2] and t.shape[-1] > 0:
            n = t.shape[-1]
            lower = torch.ones(n, n, dtype=torch.bool, device=t.device).tril()
            if bool(((t != 0) == lower).all()):
                facts["tril"] = True
            if t.is_floating_point():
                additive = torch.zeros(n, n, dtype=t.dtype, device=t.device)
                additive.masked_fill_(~lower, float("-inf"))
                if bool((t == additive).all()):
                    facts["causal_additive"] = True
        if t.numel() == 1:
            facts["value"] = _value(t.item())
    return facts


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Keep torch's own stderr chatter (partial graphs, logged tracebacks) off the user's screen.

    On failure the TraceError says what matters; on success whatever was printed (Python warnings)
    is passed on. FACT_VERBOSE=1 turns this off, for debugging torch.export itself.
    """
    if os.environ.get("FACT_VERBOSE"):
        yield
        return
    captured = io.StringIO()
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    succeeded = False
    try:
        with contextlib.redirect_stderr(captured):
            yield
        succeeded = True
    finally:
        logging.disable(previous)
        if succeeded and captured.getvalue():
            sys.stderr.write(captured.getvalue())


def _trace_error(exc: Exception, model: str, source: str) -> TraceError:
    """Name the model, quote the first paragraph of torch's message, point at the user's line."""
    lines: list[str] = []
    for line in str(exc).strip().splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.rstrip()[:300])
        if len(lines) == 4:
            break
    message = f"torch.export could not trace {model} ({source}): {type(exc).__name__}"
    if lines:
        message += ": " + "\n  ".join(lines)
    where = _user_frame(exc)
    if where:
        message += f"\n  at {where}"
    message += f"\nhint: {_hint(exc)}"
    return TraceError(message)


def _user_frame(exc: BaseException) -> str | None:
    """The innermost traceback frame outside torch, FACT and the standard library."""
    stdlib = os.path.dirname(contextlib.__file__)
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        filename = os.path.abspath(frame.filename)
        if filename.startswith((_TORCH_DIR, _FACT_DIR, stdlib)) or frame.filename.startswith("<"):
            continue
        found = frame
    if found is None:
        return None
    shown = found.filename
    with contextlib.suppress(ValueError):  # ValueError: another drive, on Windows
        relative = os.path.relpath(found.filename)
        if not relative.startswith(".."):
            shown = relative
    code = f": {found.line.strip()}" if found.line else ""
    return f"{shown}:{found.lineno} in {found.name}{code}"


def _hint(exc: Exception) -> str:
    text = str(exc)
    if "data-dependent" in text or "data dependent" in text:
        return (
            "the model's Python control flow depends on tensor values (an `if` on a tensor, "
            ".item(), .tolist() or a boolean-mask index), which torch.export cannot capture; "
            "compute both sides with torch.where, use torch.cond, or make the value a Python "
            "constant"
        )
    if "Constraints violated" in text or "specialized" in text:
        return (
            "a dimension marked dynamic was fixed by the model's code; drop it from "
            "dynamic_shapes (FACT compiles for static shapes anyway)"
        )
    return (
        "FACT captures models with torch.export.export(model, inputs, strict=False); check that "
        "the model runs eagerly on get_inputs(), and run that export call yourself (or set "
        "FACT_VERBOSE=1) to see torch's full message"
    )


def dumps_graph(graph: dict) -> str:
    """Serialise a graph as JSON, one node per line so that graphs diff and grep well."""

    def dump(value: Any) -> str:
        return json.dumps(value, allow_nan=False, ensure_ascii=False)

    head = [f"  {dump(k)}: {dump(v)}" for k, v in graph.items() if k != "nodes"]
    nodes = graph.get("nodes", [])
    body = '  "nodes": [\n' + ",\n".join("    " + dump(n) for n in nodes) + "\n  ]"
    if not nodes:
        body = '  "nodes": []'
    keys = list(graph)
    at = keys.index("nodes") if "nodes" in keys else len(keys)
    parts = head[:at] + [body] + head[at:]
    return "{\n" + ",\n".join(parts) + "\n}\n"


def save_graph(graph: dict, path: str | os.PathLike) -> Path:
    """Write `graph` to `path` (see `dumps_graph`); returns the path."""
    path = Path(path)
    text = dumps_graph(graph)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise GraphError(f"cannot write the graph to {path}: {exc.strerror or exc}") from None
    return path


def load_graph(path: str | os.PathLike) -> dict:
    """Read a graph file, checking that it is a FACT graph of a version this FACT writes."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GraphError(f"graph file {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GraphError(f"cannot read graph file {path}: {exc}") from None
    try:
        graph = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(graph, dict) or graph.get("format") != FORMAT:
        raise GraphError(
            f'{path} is not a FACT graph (no "format": "{FORMAT}"); make one with `fact trace`'
        )
    if graph.get("version") != VERSION:
        raise GraphError(
            f"{path} is a FACT graph of version {graph.get('version')!r}, this FACT reads version "
            f"{VERSION}; trace the model again"
        )
    return graph
