"""Task 1 of the agent: a lowering for an ATen op the catalog does not know, as an expression over
the function vocabulary (format: engine/discover/lowering.h). The model proposes; these gates
decide, in order, all on the CPU:

  schema   the engine's own check of the document (names of the vocabulary and numbers only,
           at most 256 steps), run by planning a small module that uses the op with it
  numeric  float64 against the ATen op on a grid of inputs, +-0, +-inf, NaN, the branch points
           the lowering's comparisons name, and several values of each parameter
  plan     in that module the op joins a FACT pattern (a GEMM epilogue or a pointwise region)

The model never sees tolerances and never judges correctness.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fact.errors import FactError

TEMPLATE = "lowering-v1"
_ATOL, _RTOL = 1e-12, 1e-9

# The JSON schema of an answer, for servers that constrain their output to one.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["op", "inputs", "params", "ssa"],
    "properties": {
        "op": {"type": "string"},
        "inputs": {"type": "array", "items": {"type": "string"}},
        "params": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "default": {"type": "number"}},
            },
        },
        "ssa": {"type": "array", "items": {"type": "object"}},
    },
}


def vocabulary() -> dict[str, int]:
    """The function vocabulary (name -> arity) the expression may use, as the float64
    reference implements it (fact.tune.reference.FUNCTIONS; casts are not offered)."""
    from fact.tune.reference import FUNCTIONS

    return {name: arity for name, (arity, _) in FUNCTIONS.items() if name != "cast"}


def aten_op(name: str) -> Any:
    """The ATen overload packet's default overload, or a FactError."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise FactError(f"{name!r} is not an ATen op name")
    packet = getattr(torch.ops.aten, name, None)
    op = getattr(packet, "default", None) if packet is not None else None
    if op is None:
        raise FactError(f"aten.{name} has no default overload")
    return op


def signature_of(name: str) -> tuple[list[str], list[tuple[str, float | None]]]:
    """(tensor argument names, [(numeric argument name, default or None)]) of the op's schema,
    in order; FactError where the op is no elementwise function of tensors and numbers."""
    schema = aten_op(name)._schema
    if (
        schema.is_mutable
        or any(a.alias_info is not None for a in schema.arguments)
        or any(r.alias_info is not None for r in schema.returns)
    ):
        raise FactError(f"aten.{name} writes or aliases its input: it is no expression")
    tensors, numbers = [], []
    for a in schema.arguments:
        kind = str(a.type)
        if kind == "Tensor" and not numbers:
            tensors.append(a.name)
        elif kind in ("Scalar", "number", "float", "int", "bool"):
            default = a.default_value if a.has_default_value() else None
            numbers.append((a.name, None if default is None else float(default)))
        else:
            raise FactError(f"aten.{name}: argument {a.name} ({kind}) is not a tensor or a number")
    if not tensors or len(tensors) > 3 or len(schema.returns) != 1:
        raise FactError(f"aten.{name} is not an elementwise op of 1 to 3 tensors")
    return tensors, numbers


# The prompt's worked example (exact at the branch points, NaN included: it passes the gates).
EXAMPLE: dict[str, Any] = {
    "op": "hardshrink",
    "inputs": ["self"],
    "params": [{"name": "lambd", "default": 0.5}],
    "ssa": [
        {"id": 0, "op": "input", "index": 0},
        {"id": 1, "op": "param", "index": 0},
        {"id": 2, "op": "constant", "value": 0.0},
        {"id": 3, "op": "abs", "args": [0]},
        {"id": 4, "op": "le", "args": [3, 1]},  # NaN <= l is false: NaN stays NaN
        {"id": 5, "op": "where", "args": [4, 2, 0]},
    ],
}


def messages(name: str) -> list[dict[str, str]]:
    """The chat for one op: the format, the vocabulary, the op's schema, one worked example."""
    schema = str(aten_op(name)._schema)
    vocab = ", ".join(f"{k}/{v}" for k, v in sorted(vocabulary().items()))
    system = (
        "You write PyTorch ATen operators as expressions over a fixed vocabulary of elementwise "
        "functions, for a CUTLASS kernel compiler. Answer with one JSON object and nothing else. "
        'Format: {"op": name, "inputs": [tensor argument names in schema order], "params": '
        '[{"name": numeric argument name, "default": number}, ...] in schema order, "ssa": '
        '[entries]}. Entries, numbered by "id" from 0: '
        '{"op": "input", "index": i} (tensor argument i), {"op": "param", "index": j} (numeric '
        'argument j), {"op": "constant", "value": number}, or {"op": function, "args": [ids of '
        'earlier entries], "params": [numbers] (only for functions that take them)}. Comparisons '
        "return 1.0 or 0.0; where(c, a, b) is a where c != 0. The last entry is the op's value. "
        f"Functions (name/arity): {vocab}. Parametric functions: leaky_relu [slope], hardtanh "
        "[min, max], clamp [min, max], softplus [beta, threshold], elu [alpha, scale, "
        "input_scale]. Be exact, including at branch points, +-0, +-inf and NaN."
    )
    user = (
        f"Example, aten.hardshrink:\n{json.dumps(EXAMPLE)}\n\nWrite aten.{name}, schema: {schema}"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def repair_messages(previous: Sequence[Mapping[str, str]], answer: str, why: str) -> list:
    return [
        *previous,
        {"role": "assistant", "content": answer[:4000]},
        {"role": "user", "content": f"That is not usable ({why}). Answer with the JSON only."},
    ]


def parse(answer: str) -> dict[str, Any]:
    """The JSON object in a model's answer (bare, or in a ```json fence); FactError otherwise."""
    text = answer.strip()
    fence = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.S)
    if fence:
        text = fence.group(1)
    elif not text.startswith("{"):
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end < start:
            raise FactError("no JSON object in the answer")
        text = text[start : end + 1]
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FactError(f"the answer's JSON does not parse ({exc.msg} at {exc.pos})") from None
    if not isinstance(doc, dict):
        raise FactError("the answer is not a JSON object")
    return doc


# ---------------------------------------------------------------------------------------------
# The gates


def evaluate(
    lowering: Mapping[str, Any],
    inputs: Sequence[torch.Tensor],
    params: Sequence[float],
    dtype: torch.dtype = torch.float64,
):
    """The lowering's value on `dtype` tensors, through the float64 reference's functions."""
    from fact.tune.reference import FUNCTIONS

    values: list[Any] = []
    for e in lowering["ssa"]:
        op = e["op"]
        if op == "input":
            values.append(inputs[e["index"]])
        elif op == "param":
            values.append(torch.tensor(float(params[e["index"]]), dtype=dtype))
        elif op == "constant":
            values.append(torch.tensor(float(e["value"]), dtype=dtype))
        else:
            _, fn = FUNCTIONS[op]
            values.append(fn([values[a] for a in e["args"]], e.get("params") or []))
    return values[-1]


def _grid(points: Sequence[float]) -> torch.Tensor:
    base = torch.linspace(-8.0, 8.0, 1601, dtype=torch.float64)
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30, 1e30, -1e30]
    special += [s * m for m in (1e-3, 1e-5, 1e-8) for s in (1.0, -1.0)]  # where cancellation shows
    near = []
    for p in points:
        for q in (p, -p):
            near += [q, math.nextafter(q, math.inf), math.nextafter(q, -math.inf)]
    return torch.cat([base, torch.tensor(special + near, dtype=torch.float64)])


def _param_sets(defaults: Sequence[float]) -> list[tuple[int | None, list[float]]]:
    """(which parameter moved, the values): all at their defaults, then each parameter in
    turn at a few other values."""
    sets: list[tuple[int | None, list[float]]] = [(None, list(defaults))]
    for i, d in enumerate(defaults):
        for v in (0.25, 1.5, -0.75, 3.0):
            if v != d:
                sets.append((i, [*defaults[:i], v, *defaults[i + 1 :]]))
    return sets


def numeric_gate(name: str, lowering: Mapping[str, Any]) -> tuple[bool, str]:
    """(passed, why): float64 against aten.<name> on the grid, for every parameter set."""
    op = aten_op(name)
    k = len(lowering["inputs"])
    defaults = [p["default"] for p in lowering["params"]]
    constants = [e["value"] for e in lowering["ssa"] if e["op"] == "constant"]
    worst = 0.0
    tested = [False] * len(defaults)  # each parameter checked away from its default
    for moved, params in _param_sets(defaults):
        x = _grid([*params, *constants])
        if k == 1:
            inputs = [x]
        else:  # a coarser mesh for 2 or 3 inputs, the special values and branch points kept
            special = x[1601:]
            coarse = torch.cat([x[:1601:40], special])
            grids = torch.meshgrid(*([coarse] * k), indexing="ij")
            inputs = [g.reshape(-1) for g in grids]
        for dtype, atol, rtol in ((torch.float64, _ATOL, _RTOL), (torch.float32, 1e-10, 1e-4)):
            # float32 as the kernels compute: a lowering exact in float64 that cancels in
            # float32 (log(1 + x) for log1p) is refused
            typed = [t.to(dtype) for t in inputs]
            try:
                want = op(*[t.clone() for t in typed], *params).to(torch.float64)
            except Exception as exc:  # other params ATen refuses (a negative lambd): no case
                if moved is not None and isinstance(exc, RuntimeError):
                    break
                return False, f"aten.{name} cannot run on the check grid ({exc})"
            try:
                got = evaluate(lowering, typed, params, dtype)
                got = torch.as_tensor(got).to(torch.float64).expand_as(want)
            except Exception as exc:
                return False, f"the expression cannot be evaluated ({type(exc).__name__}: {exc})"
            problem = _differs(name, typed, params, got, want, atol, rtol)
            if problem:
                return False, problem
            if dtype == torch.float64:
                finite = torch.isfinite(want) & torch.isfinite(got)
                d = torch.where(finite, (got - want).abs(), torch.zeros_like(got))
                worst = max(worst, float(d.max()))
        else:
            if moved is not None:
                tested[moved] = True
    problem = _elementwise_check(name, op, lowering, defaults)
    if problem:
        return False, problem
    untested = [lowering["params"][i]["name"] for i, t in enumerate(tested) if not t]
    if untested:
        return False, f"aten.{name} refused every other value of {', '.join(untested)}: unchecked"
    return True, f"matches aten.{name} on every point (max abs difference {worst:.2g})"


def _elementwise_check(name: str, op: Any, lowering: Mapping[str, Any], params: list) -> str:
    """The planner reads a lowered op as elementwise with operands broadcast right-aligned:
    check that on a rank-4 input and operands of other shapes (an op mixing elements along a
    dim, or broadcasting some other way, such as prelu's channel weight, fails here)."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(2, 3, 4, 5), (3, 1, 1), (4, 5)][: len(lowering["inputs"])]
    inputs = [torch.randn(s, generator=gen, dtype=torch.float64) * 3 for s in shapes]
    try:
        want = op(*[t.clone() for t in inputs], *params)
        got = torch.as_tensor(evaluate(lowering, inputs, params)).to(torch.float64)
    except Exception as exc:
        return f"aten.{name} is not elementwise with right-aligned broadcasting ({exc})"
    if tuple(want.shape) != (2, 3, 4, 5):
        return f"aten.{name} of a (2, 3, 4, 5) input has shape {tuple(want.shape)}"
    return _differs(name, [t.broadcast_to(want.shape).reshape(-1) for t in inputs], params,
                    got.broadcast_to(want.shape).reshape(-1), want.reshape(-1).to(torch.float64),
                    _ATOL, _RTOL)  # fmt: skip


def _differs(name, inputs, params, got, want, atol, rtol) -> str:
    """Where `got` is not `want` (NaN where NaN, the same infinities, finite values close), in
    words; "" where it is everywhere."""
    same_nan = torch.isnan(got) == torch.isnan(want)
    finite = torch.isfinite(want) & torch.isfinite(got)
    same_inf = torch.where(torch.isinf(want) | torch.isinf(got), got == want, True)
    close = torch.where(finite, (got - want).abs() <= atol + rtol * want.abs(), True)
    bad = ~(same_nan & same_inf & close)
    if not bad.any():
        return ""
    i = int(bad.nonzero()[0])
    where = ", ".join(f"{t[i].item():.17g}" for t in inputs)
    return (
        f"differs from aten.{name} in {str(inputs[0].dtype).removeprefix('torch.')} at ({where}) "
        f"with params {params}: {got[i].item():.17g} instead of {want[i].item():.17g} "
        f"({int(bad.sum())} of {bad.numel()} points)"
    )


class _Probe(torch.nn.Module):
    """A linear, then the op: where a lowering should land in a GEMM epilogue."""

    def __init__(self, name: str, tensors: int, params: Sequence[float]):
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)
        self.op, self.tensors, self.params = aten_op(name), tensors, list(params)

    def forward(self, x, *others):
        return self.op(self.fc(x), *others, *self.params)


def plan_gate(name: str, lowering: Mapping[str, Any]) -> tuple[bool, str, bool]:
    """(passed, why, schema_ok): plan the probe module with the lowering. The engine checks the
    document first (schema_ok False: it refused it, and why says what)."""
    from fact.engine import engine_json
    from fact.errors import EngineError
    from fact.tracer import save_graph, trace

    k = len(lowering["inputs"])
    params = [p["default"] for p in lowering["params"]]
    model = _Probe(name, k, params).eval()
    x = [torch.randn(8, 64)] + [torch.randn(8, 64) for _ in range(k - 1)]
    with tempfile.TemporaryDirectory(prefix="fact-agent-") as folder:
        path = save_graph(trace(model, x), Path(folder) / "graph.json")
        lowerings = Path(folder) / "lowerings.json"
        lowerings.write_text(json.dumps([lowering]))
        try:
            # an empty registry: the lowering under test is the only one
            empty = str(Path(folder) / "empty.db")
            plan = engine_json("discover", path, "--lowerings", str(lowerings), "--registry", empty)
        except EngineError as exc:
            return False, str(exc), False
    nodes = [n for p in plan["patterns"] for n in p["nodes"]]
    mine = [n["name"] for n in plan.get("opaque_nodes", []) + plan.get("pytorch_nodes", [])
            if n["op"].startswith(f"aten.{name}.")]  # fmt: skip
    if name not in plan.get("lowerings", []) or mine:
        return False, f"the planner left aten.{name} to PyTorch with this lowering", True
    family = next(p["family"] for p in plan["patterns"] if any(n in nodes for n in p["nodes"]))
    return True, f"aten.{name} joins a {family} pattern", True


def gates(name: str, proposal: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every gate's verdict, in order, stopping at the first that fails."""
    results: list[dict[str, Any]] = []
    if proposal.get("op") != name:
        return [{"gate": "schema", "passed": False, "why": f"proposes {proposal.get('op')!r}"}]
    try:
        tensors, numbers = signature_of(name)
    except FactError as exc:
        return [{"gate": "schema", "passed": False, "why": str(exc)}]
    names = [p.get("name") for p in proposal.get("params") or [] if isinstance(p, dict)]
    if proposal.get("inputs") != tensors or names != [n for n, _ in numbers][: len(names)]:
        why = f"arguments {proposal.get('inputs')} + {names} are not the schema's {tensors} + "
        why += f"{[n for n, _ in numbers]}"
        return [{"gate": "schema", "passed": False, "why": why}]
    for p, (pname, default) in zip(proposal.get("params") or [], numbers, strict=False):
        given = p.get("default") if isinstance(p, dict) else None
        if default is not None and given != default:
            why = f"param {pname} defaults to {given!r}; aten.{name}'s default is {default}"
            return [{"gate": "schema", "passed": False, "why": why}]
    ok, why, schema_ok = plan_gate(name, proposal)
    results.append({"gate": "schema", "passed": schema_ok, "why": "" if schema_ok else why})
    if not schema_ok:
        return results
    passed, numeric_why = numeric_gate(name, proposal)
    results.append({"gate": "numeric", "passed": passed, "why": numeric_why})
    if not passed:
        return results
    results.append({"gate": "plan", "passed": ok, "why": why})
    return results
