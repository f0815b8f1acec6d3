"""Implementations a composed module can run for a pattern, each able to emit its FX node(s).

  GemmImpl          a generated CUTLASS kernel (or its PyTorch reference twin, for CPU tests)
                    through fact::gemm; operands are viewed into the kernel's layouts here
  HorizontalGemmImpl  linear layers on one input (q/k/v) as one grouped kernel (or its twin)
                    through fact::gemm_parts, each part writing its own output
  AttentionImpl     a generated fused attention kernel (CUTLASS FMHA) or its reference twin,
                    through fact::attention, for hand-written attention and SDPA calls alike
  SdpaAttention     PyTorch's fused scaled_dot_product_attention, a library kernel, for
                    hand-written attention (Q, K, V read in place from the graph's views; an
                    additive score bias, such as a position bias or a padding mask, as its
                    attn_mask)
  NormImpl          a generated row-norm kernel or its reference twin, through fact::norm
  NormLibrary       PyTorch's rms_norm or layer_norm for a hand-written RMSNorm or LayerNorm
  PointwiseImpl     a generated pointwise kernel (a region of elementwise ops, e.g. RoPE) or
                    its reference twin, through fact::pointwise
  GatedTailImpl     a gated MLP as two library GEMMs and its act(gate) * up in one pointwise
                    kernel
  CublasLtGemm      a linear layer with bias+GELU/ReLU or a residual fused by cuBLASLt

The original PyTorch subgraph is always the fallback: the composer keeps it unless an
implementation verifies and is faster in the module's own context.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from fact.compose.ops import (
    BODIES,
    AttentionKernel,
    GemmKernel,
    NormKernel,
    PointwiseKernel,
    gemm_call_key,
    kernel_entry,
    prepare_gemm,
    prepared_launch,
    register_kernel,
)
from fact.compose.program import Region
from fact.errors import FactError
from fact.fx_build import arg_of
from fact.tune.abi import FACT_POINTWISE_MAX_INPUTS, FACT_POINTWISE_MAX_RANK
from fact.tune.reference import GemmSpec, NotSupportedError, gemm_spec, parse_type, torch_dtype

aten = torch.ops.aten

_LINEAR = {aten.linear.default}
_MATMUL = {aten.matmul.default, aten.mm.default, aten.bmm.default}
_ADDMM = {aten.addmm.default, aten.baddbmm.default}


@dataclass
class Impl:
    """What the composer may put in a pattern's place."""

    name: str  # shown in reports: "cutlass:<kernel>", "sdpa", ...
    kind: str  # generated | library
    detail: dict[str, Any] = field(default_factory=dict)

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# GEMM family


def _as_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t as a [.., rows, cols] view in `layout` (row- or column-major), copying only if needed."""
    rows, cols = t.shape[-2], t.shape[-1]
    if layout == "row":
        if (t.stride(-1) == 1 or cols == 1) and t.stride(-2) >= cols:
            return t
        return t.contiguous()
    if (t.stride(-2) == 1 or rows == 1) and t.stride(-1) >= rows:
        return t
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _operand(t: torch.Tensor, kind: str, dtype: torch.dtype, batch: int, m: int, n: int):
    t = t.to(dtype) if t.dtype != dtype else t
    if kind == "scalar":
        return t.reshape(1)
    if kind in ("row", "col"):
        length = n if kind == "row" else m
        shape = (batch, length) if batch > 1 and t.numel() == batch * length else (length,)
        return t.reshape(shape).contiguous()
    if kind == "full":
        shape = (batch, m, n) if batch > 1 and t.numel() == batch * m * n else (m, n)
        return _as_layout(t.reshape(shape), "row")
    raise NotSupportedError(f"epilogue operand kind {kind!r}")


def role_input(
    reg: Region, pattern: Mapping[str, Any], role: str, required: bool = True
) -> fx.Node | None:
    """The region input that the pattern's operand with this role (a, b, x, weight, ...) reads;
    None for a missing optional role."""
    for o in pattern.get("operands") or []:
        if o.get("role") == role:
            return reg.input(o["node"])
    if required:
        raise NotSupportedError(f"pattern {pattern.get('signature')} has no {role!r} operand")
    return None


def _gemm_views(entry: GemmKernel, a, b, operands, form: str) -> tuple:
    """(A, B, operands) of a GEMM call as the kernel reads them: views of the graph's tensors
    in the kernel's layouts (copies only where no view has that layout)."""
    spec = entry.spec
    p = spec.problem
    batch, m, n, k = (int(p.get(key, 1)) for key in ("batch", "m", "n", "k"))
    lead = (batch,) if batch > 1 else ()
    A = a.reshape(*lead, m, k)
    B = b.t() if form == "linear" else b.reshape(*lead, k, n)
    A, B = _as_layout(A, spec.layout_a), _as_layout(B, spec.layout_b)
    ops = [
        _operand(t, o.kind, torch_dtype(o.dtype), batch, m, n)
        for t, o in zip(operands, spec.operands, strict=True)
    ]
    return A, B, ops


def run_gemm_pattern(
    a: torch.Tensor,
    b: torch.Tensor,
    operands: list[torch.Tensor],
    *,
    kernel: int,
    form: str,
    out_shape: list[int],
    direct: bool = False,
) -> torch.Tensor:
    """One GEMM pattern: view the graph's tensors as the kernel reads them, call fact::gemm,
    view the result as the pattern's output node. form: linear | matmul | addmm. direct: call
    the op's body, not through the dispatcher (see direct_calls), through a prepared launch
    where the call's layout allows one (ops.PreparedGemm)."""
    entry = kernel_entry(kernel)
    if direct and entry.backend == "cutlass":

        def prepare() -> Any:
            views = _gemm_views(entry, a, b, operands, form)
            return prepare_gemm(entry, views, (a, b, operands), out_shape)

        layout = gemm_call_key(entry, a, b, operands)
        out = prepared_launch(entry.prepared, layout, prepare, a, b, operands)
        if out is not None:
            return out
    A, B, ops = _gemm_views(entry, a, b, operands, form)
    gemm = BODIES[torch.ops.fact.gemm.default] if direct else torch.ops.fact.gemm.default
    return gemm(A, B, ops, kernel).reshape(out_shape)


def gemm_form(reg: Region, pattern: Mapping[str, Any]) -> str:
    """How the anchor GEMM node reads its operands."""
    anchors = [n for n in reg.nodes if n.name in (pattern.get("anchors") or [])]
    if len(anchors) != 1:
        raise NotSupportedError(f"a GEMM pattern with {len(anchors)} anchors")
    target = anchors[0].target
    if target in _LINEAR:
        return "linear"
    if target in _MATMUL or target in _ADDMM:
        return "matmul"
    raise NotSupportedError(f"GEMM anchor {anchors[0].name} is {target}, not linear/mm/matmul")


def with_math(detail: dict[str, Any], backend: str, library) -> dict[str, Any]:
    """`detail` plus the math a generated f32 kernel says it runs (tf32 | 3xtf32), for the
    report."""
    info = library.info if backend == "cutlass" and library is not None else {}
    if info.get("math"):
        detail["math"] = info["math"]
    return detail


class GemmImpl(Impl):
    """A generated kernel (backend cutlass) or its PyTorch twin (backend reference)."""

    family = "gemm"  # the plan family (and the kernel's fact_kernel_info family) it runs

    def __init__(
        self, pattern: Mapping[str, Any], backend: str, library=None, knobs=None, label=""
    ):
        spec: GemmSpec = gemm_spec(dict(pattern))
        if spec.family != self.family:
            raise NotSupportedError(f"{type(self).__name__} runs {self.family}, not {spec.family}")
        built = library.info.get("family", spec.family) if library is not None else spec.family
        if backend == "cutlass" and built != spec.family:
            raise NotSupportedError(
                f"{label or library.name} is a {built} kernel; the pattern is {spec.family}"
            )
        entry = GemmKernel(spec, backend, library, dict(knobs or {}), label)
        self.handle = register_kernel(entry)
        name = f"cutlass:{label}" if backend == "cutlass" else f"reference:{label or self.family}"
        detail = {"backend": backend, "knobs": dict(knobs or {})}
        super().__init__(name, "generated", with_math(detail, backend, library))

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        ops = pattern.get("operands") or []
        roles = [o.get("role") for o in ops]
        if roles.count("a") != 1 or roles.count("b") != 1:
            raise FactError(f"pattern {pattern.get('signature')}: operand roles {roles}")
        a, b = role_input(reg, pattern, "a"), role_input(reg, pattern, "b")
        extra = [reg.input(o["node"]) for o in ops if o["role"] not in ("a", "b")]
        out_shape = list(reg.output.meta["val"].shape)
        return graph.call_function(
            run_gemm_pattern,
            (a, b, extra),
            {"kernel": self.handle, "form": gemm_form(reg, pattern), "out_shape": out_shape},
        )


def run_gemm_parts_pattern(
    a: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    *,
    kernel: int,
    out_shapes: list[list[int]],
    direct: bool = False,
) -> tuple[torch.Tensor, ...]:
    """A horizontal GEMM pattern: view the shared input as the kernel's A [m, k], call
    fact::gemm_parts with the Linear weights and biases as they are (in place), view each part's
    result as its node. direct: call the op's body (see direct_calls)."""
    spec = kernel_entry(kernel).spec
    A = _as_layout(a.reshape(int(spec.problem["m"]), int(spec.problem["k"])), spec.layout_a)
    # W_p^T in the kernel's B layout: the weight itself for a contiguous Linear weight
    W = [_as_layout(w.t(), spec.layout_b).t() for w in weights]
    op = BODIES[torch.ops.fact.gemm_parts.default] if direct else torch.ops.fact.gemm_parts.default
    outs = op(A, W, biases, kernel)
    return tuple(o.reshape(shape) for o, shape in zip(outs, out_shapes, strict=True))


class HorizontalGemmImpl(GemmImpl):
    """Several linear layers reading one input (q/k/v projections) as one generated grouped
    GEMM (or its PyTorch twin) through fact::gemm_parts: A is read once per tile for all parts,
    and each part writes its own output. The Linear weights are read where they are, never
    concatenated, so the module keeps sharing the model's parameters."""

    family = "horizontal_gemm"

    def __init__(
        self, pattern: Mapping[str, Any], backend: str, library=None, knobs=None, label=""
    ):
        steps = list(pattern.get("epilogue") or [])
        if pattern.get("family") == self.family and steps not in ([], ["bias"]):
            raise NotSupportedError(f"a horizontal GEMM with epilogue {steps}")
        super().__init__(pattern, backend, library, knobs, label)

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        a, weights, biases = self.parts(reg, pattern)
        entry = kernel_entry(self.handle)
        for out in reg.outputs:
            val = out.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dtype != entry.out_dtype:
                raise NotSupportedError(
                    f"part {out.name} is {val.dtype}, the kernel writes {entry.out_dtype}"
                )
        out_shapes = [list(out.meta["val"].shape) for out in reg.outputs]
        return graph.call_function(
            run_gemm_parts_pattern,
            (a, weights, biases),
            {"kernel": self.handle, "out_shapes": out_shapes},
        )

    @staticmethod
    def parts(
        reg: Region, pattern: Mapping[str, Any]
    ) -> tuple[fx.Node, list[fx.Node], list[fx.Node | None]]:
        """(a, weight per part, bias per part or None) as the region's inputs, after checking
        that each part (region.outputs, in the plan's part order) is a linear layer on `a`
        with the plan's weight and bias. The plan's operands are a, then per part its b and,
        when it has one, its bias."""
        sig = pattern.get("signature")
        a = role_input(reg, pattern, "a")
        weights: list[fx.Node] = []
        biases: list[fx.Node | None] = []
        for o in pattern.get("operands") or []:
            role = o.get("role")
            if role == "b":
                weights.append(reg.input(o["node"]))
                biases.append(None)
            elif role == "bias" and weights and biases[-1] is None:
                biases[-1] = reg.input(o["node"])
            elif role != "a":
                raise FactError(f"pattern {sig}: operand {o.get('node')} has role {role!r} here")
        if len(weights) != len(reg.outputs):
            raise FactError(f"pattern {sig}: {len(weights)} weights for {len(reg.outputs)} parts")
        for node, w, bias in zip(reg.outputs, weights, biases, strict=True):
            if node.target not in _LINEAR:
                raise NotSupportedError(f"part {node.name} is {node.target}, not a linear layer")
            got = (arg_of(node, 0, "input"), arg_of(node, 1, "weight"), arg_of(node, 2, "bias"))
            if got != (a, w, bias):
                names = [getattr(n, "name", n) for n in got]
                raise FactError(
                    f"pattern {sig}: part {node.name} reads {names}, the plan says "
                    f"{[a.name, w.name, bias.name if bias is not None else None]}"
                )
        return a, weights, biases


def run_cublaslt_pattern(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    full: torch.Tensor | None,
    *,
    act: str,
    k: int,
    out_shape: list[int],
) -> torch.Tensor:
    """act(a @ w.T + bias) [+ full] with cuBLASLt's fused epilogues: bias+GELU(tanh) and
    bias+ReLU through torch._addmm_activation, a residual through addmm's C operand."""
    a2 = a.reshape(-1, k)
    if act in ("gelu_tanh", "relu"):
        out = torch._addmm_activation(bias, a2, w.t(), use_gelu=act == "gelu_tanh")
    else:
        out = torch.addmm(full.reshape(a2.shape[0], -1), a2, w.t())
        if bias is not None:
            out.add_(bias)
    return out.reshape(out_shape)


#: plan epilogue steps -> (activation, reads a full operand)
_CUBLASLT_FORMS = {
    ("bias", "gelu_tanh"): ("gelu_tanh", False),
    ("bias", "relu"): ("relu", False),
    ("bias", "residual"): ("", True),
    ("residual",): ("", True),
}


class CublasLtGemm(Impl):
    """A GEMM pattern as one cuBLASLt call with a fused epilogue (PyTorch's own kernels): the
    library candidate next to the generated ones."""

    def __init__(self, pattern: Mapping[str, Any]):
        steps = tuple(pattern.get("epilogue") or [])
        if pattern.get("family") != "gemm" or steps not in _CUBLASLT_FORMS:
            raise NotSupportedError(f"no cuBLASLt epilogue for {steps}")
        problem = pattern.get("problem") or {}
        if int(problem.get("batch", 1)) != 1:
            raise NotSupportedError("batched GEMM")
        self.act, self.full = _CUBLASLT_FORMS[steps]
        super().__init__("cublaslt", "library", {"epilogue": list(steps)})

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        if gemm_form(reg, pattern) != "linear":
            raise NotSupportedError("cuBLASLt epilogues are used for linear layers only")
        ops = pattern.get("operands") or []
        a, w = role_input(reg, pattern, "a"), role_input(reg, pattern, "b")
        rows = [o for o in ops if o.get("broadcast") == "row"]
        fulls = [o for o in ops if o.get("broadcast") == "full"]
        bias = reg.input(rows[0]["node"]) if rows else None
        full = reg.input(fulls[0]["node"]) if fulls else None
        if (full is None) == self.full or (self.act and bias is None):
            raise NotSupportedError("operands do not fit the cuBLASLt form")
        k = int((pattern.get("problem") or {})["k"])
        out_shape = list(reg.output.meta["val"].shape)
        return graph.call_function(
            run_cublaslt_pattern,
            (a, w, bias, full),
            {"act": self.act, "k": k, "out_shape": out_shape},
        )


def _gated_input(reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
    """A gated MLP's input x, after checking its two projections are bias-free linear layers
    (what both gated forms rebuild)."""
    anchors = [n for n in reg.nodes if n.name in (pattern.get("anchors") or [])]
    if len(anchors) != 2 or any(n.target not in _LINEAR for n in anchors):
        raise NotSupportedError("gated MLP projections that are not linear layers")
    if any(len(n.args) > 2 and n.args[2] is not None for n in anchors):
        raise NotSupportedError("gated MLP projections with a bias")
    return role_input(reg, pattern, "a")


class GatedGemmImpl(GemmImpl):
    """A gated MLP, act(x W_gate^T) * (x W_up^T), as PyTorch's up projection plus one
    generated gate GEMM whose epilogue computes act(acc) * up (the plan's "lowered" pattern):
    the activation and the product never round-trip through memory."""

    def __init__(
        self, pattern: Mapping[str, Any], backend: str, library=None, knobs=None, label=""
    ):
        lowered = pattern.get("lowered")
        if pattern.get("family") != "gated_mlp" or not lowered:
            raise NotSupportedError("not a gated MLP with a fused-epilogue form")
        super().__init__(lowered, backend, library, knobs, label)
        self.detail["lowered"] = lowered.get("signature")

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        x = _gated_input(reg, pattern)
        up = graph.call_function(aten.linear.default, (x, role_input(reg, pattern, "b_up")))
        out_shape = list(reg.output.meta["val"].shape)
        return graph.call_function(
            run_gemm_pattern,
            (x, role_input(reg, pattern, "b_gate"), [up]),
            {"kernel": self.handle, "form": "linear", "out_shape": out_shape},
        )


# ---------------------------------------------------------------------------------------------
# Attention

_ATTENTION_STEPS = {"scale", "bias", "causal_mask", "softmax", "dropout"}
_SDPA = aten.scaled_dot_product_attention.default
_RESHAPES = {aten.reshape.default, aten.view.default, aten._unsafe_view.default}
_SCALES = {aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar}


def _is_eval_dropout(n: fx.Node) -> bool:
    if n.target is not aten.dropout.default:
        return False
    p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.0)
    train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train", True)
    return p == 0 or train is False


def _shape(n: Any) -> tuple[int, ...] | None:
    val = n.meta.get("val") if isinstance(n, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _dims(n: fx.Node, *dims: Any) -> set[int] | None:
    """The node's integer dim arguments, normalized to its input's rank."""
    shape = _shape(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
    if shape is None or not all(isinstance(d, int) for d in dims):
        return None
    return {d % len(shape) for d in dims}


def _through_full_slices(reg: Region, n: Any) -> Any:
    """Step back over region slices that keep a whole dim (x[:, :, None] may trace so)."""
    while isinstance(n, fx.Node) and n in reg.nodes and n.target is aten.slice.Tensor:
        src = n.args[0]
        if _shape(src) is None or _shape(src) != _shape(n):
            break
        n = src
    return n


def _in(reg: Region, n: Any) -> bool:
    return isinstance(n, fx.Node) and n in reg.nodes


def _unrepeated(reg: Region, kv: fx.Node) -> fx.Node:
    """K or V as the region reads it before GQA's repeat: repeat_kv's
    x[:, :, None].expand(b, hkv, n, s, d).reshape(b, hkv * n, s, d), or
    x.repeat_interleave(n, dim=1), inside the region, give x (query head h reads head h // n, as
    the kernel does), so nothing is copied; any other K/V is returned as it is."""
    node = _through_full_slices(reg, kv)
    if not _in(reg, node):
        return kv
    src: Any = None
    if node.target is aten.repeat_interleave.self_int:
        src = node.args[0]
        dim = arg_of(node, 2, "dim")
        if not isinstance(dim, int) or _dims(node, dim) != {1}:
            return kv
    elif node.target in _RESHAPES:
        exp = _through_full_slices(reg, node.args[0])
        if not (_in(reg, exp) and exp.target is aten.expand.default):
            return kv
        uns = _through_full_slices(reg, exp.args[0])
        # the new dim right after the heads: [b, hkv, 1, s, d]
        if not (_in(reg, uns) and uns.target is aten.unsqueeze.default and uns.args[1] in (2, -3)):
            return kv
        src = _through_full_slices(reg, uns.args[0])
        inner, wide = _shape(src), _shape(exp)
        if inner is None or wide is None or len(inner) != 4 or len(wide) != 5:
            return kv
        b, hkv, s, d = inner
        if wide[:2] != (b, hkv) or wide[3:] != (s, d):
            return kv
    else:
        return kv
    inner, outer = _shape(src), _shape(kv)
    if inner is None or outer is None or len(inner) != 4 or len(outer) != 4:
        return kv
    if (inner[0], inner[2], inner[3]) != (outer[0], outer[2], outer[3]) or outer[1] % inner[1]:
        return kv
    return src


def _unrepeated_pair(reg: Region, k: fx.Node, v: fx.Node) -> tuple[fx.Node, fx.Node]:
    """K and V both read before their repeat, or both as they are."""
    k0, v0 = _unrepeated(reg, k), _unrepeated(reg, v)
    if _shape(k0) is not None and _shape(k0) == _shape(v0):
        return k0, v0
    return k, v


_CASTS = {aten.to.dtype, aten._to_copy.default, aten.type_as.default}


def _dropped_on_read(n: fx.Node) -> fx.Node | None:
    """What `n` scales by a Python number, or widens from 16-bit floats to f32 (GPT-J's
    query.to(torch.float32)), or None: the fused kernels read the tensor itself."""
    if n.target in _CASTS and n.args and isinstance(n.args[0], fx.Node):
        src, val = n.args[0].meta.get("val"), n.meta.get("val")
        widens = (
            isinstance(src, torch.Tensor)
            and isinstance(val, torch.Tensor)
            and src.dtype in (torch.bfloat16, torch.float16)
            and val.dtype == torch.float32
            and src.shape == val.shape
        )
        return n.args[0] if widens else None
    if n.target not in _SCALES or len(n.args) != 2:
        return None
    a, b = n.args
    if isinstance(a, fx.Node) and isinstance(b, (int, float)):
        return a
    if n.target in (aten.mul.Tensor, aten.mul.Scalar) and isinstance(b, fx.Node):
        return b if isinstance(a, (int, float)) else None
    return None


def _unscaled(graph: fx.Graph, reg: Region, node: fx.Node) -> fx.Node:
    """`node` (Q, or K^T) without the constant scales on its way that the plan folded into the
    softmax scale (CLIP's q_proj(x) * scaling before the heads are split, Whisper's q and k
    each scaled) and without widening casts (GPT-J's; engine: rule_attention's
    trace_operand): the region's views after the outermost such step are emitted again on the
    tensor it reads. `node` where there is none."""
    chain, cur, found = [], node, None
    while cur in reg.nodes:
        base = _dropped_on_read(cur)
        if base is not None:
            found = cur
        inputs = [base] if base is not None else cur.all_input_nodes
        if len(inputs) != 1:
            break
        chain.append(cur)
        cur = inputs[0]
    if found is None:
        return node
    env: dict[fx.Node, fx.Node] = {}
    for n in reversed(chain):
        base = _dropped_on_read(n)
        if base is not None:
            env[n] = env.get(base, base)
        else:
            env[n] = graph.node_copy(n, lambda a: env.get(a, a))
    return env[node]


def _unsqueezed(graph: fx.Graph, t: fx.Node) -> fx.Node:
    """t.unsqueeze(1), with its value's metadata (shape, dtype) where t has it."""
    node = graph.call_function(aten.unsqueeze.default, (t, 1))
    val = t.meta.get("val")
    if isinstance(val, torch.Tensor):
        node.meta["val"] = val.unsqueeze(1)
    return node


def _untransposed(graph: fx.Graph, reg: Region, k_t: fx.Node) -> fx.Node:
    """K from the K^T the scores read: the transpose's input where the region transposes the
    last two dims, a new transpose view otherwise."""
    if (
        k_t in reg.nodes
        and k_t.target is aten.transpose.int
        and len(_shape(k_t) or ()) >= 2
        and _dims(k_t, k_t.args[1], k_t.args[2]) == {len(_shape(k_t)) - 2, len(_shape(k_t)) - 1}
    ):
        return k_t.args[0]
    return graph.call_function(aten.transpose.int, (k_t, -2, -1))


@dataclass
class AttentionIO:
    """Where a pattern's attention reads Q, K and V, and the region node whose value is its
    result [B, H, S, Dv] (the P @ V matmul, or the scaled_dot_product_attention call)."""

    q: fx.Node
    k: fx.Node  # K [B, Hk, Sk, D] (not K^T); Hk < H only where GQA is read without a repeat
    v: fx.Node
    value: fx.Node
    enable_gqa: bool = False
    # The graph's Q, K, V are [B * H, S, D] (heads folded into bmm's batch), read as
    # [B * H, 1, S, D]: the result is squeezed back (`result`)
    folded: bool = False

    def result(self, graph: fx.Graph, attn: fx.Node) -> fx.Node:
        """The attention's result as the graph had it: `attn` less the unit heads dim where
        the heads were folded into the batch."""
        return graph.call_function(aten.squeeze.dim, (attn, 1)) if self.folded else attn


def attention_io(
    graph: fx.Graph, reg: Region, pattern: Mapping[str, Any], unrepeat: bool
) -> AttentionIO:
    """Q, K and V of an attention pattern of either rule, as graph nodes (views of the graph's
    own tensors: nothing is copied). With `unrepeat`, K and V repeated for grouped-query
    attention inside the region are read before the repeat. NotSupportedError for what a fused
    forward kernel does not compute: active dropout, a mask the plan did not find causal."""
    attrs = pattern.get("attrs") or {}
    for n in reg.nodes:
        if n.target is aten.dropout.default and not _is_eval_dropout(n):
            raise NotSupportedError(f"{n.name} is an active dropout (training mode)")
    calls = [n for n in reg.nodes if n.target is _SDPA]
    if pattern.get("rule") == "attention_sdpa" or calls:
        if len(calls) != 1:
            raise NotSupportedError(f"attention with {len(calls)} scaled_dot_product_attention")
        (node,) = calls
        q, k, v = node.args[:3]
        p = arg_of(node, 4, "dropout_p", 0.0)
        if p:
            raise NotSupportedError(f"{node.name} has dropout_p={p} (training mode)")
        if arg_of(node, 3, "attn_mask") is not None and not attrs.get("causal"):
            raise NotSupportedError(f"{node.name} has an attn_mask that is not a causal mask")
        gqa = bool(node.kwargs.get("enable_gqa", False))
        qs, ks = _shape(q), _shape(k)
        if qs is None or ks is None or len(qs) != 4 or len(ks) != 4:
            raise NotSupportedError(f"{node.name}: q or k is not [batch, heads, seq, dim]")
        if ks[0] != qs[0] or (ks[1] != qs[1] and not gqa):
            raise NotSupportedError(f"{node.name} broadcasts k {list(ks)} to q {list(qs)}")
        if unrepeat:
            k, v = _unrepeated_pair(reg, k, v)
        return AttentionIO(q, k, v, node, gqa)
    mms = [n for n in reg.nodes if n.target in _MATMUL]
    if len(mms) != 2:
        raise NotSupportedError(f"attention with {len(mms)} matmuls")
    scores, out = mms
    # constant scales of Q and K before the product are part of the plan's scale
    q, k_t = _unscaled(graph, reg, scores.args[0]), _unscaled(graph, reg, scores.args[1])
    v = out.args[1]
    k = _untransposed(graph, reg, k_t)
    if all(len(_shape(t) or ()) == 3 for t in (q, k, v)):  # Hugging Face's bmm over B * H
        q, k, v = (_unsqueezed(graph, t) for t in (q, k, v))
        return AttentionIO(q, k, v, out, folded=True)
    if unrepeat:
        k, v = _unrepeated_pair(reg, k, v)
    return AttentionIO(q, k, v, out)


def copy_tail(graph: fx.Graph, reg: Region, value: fx.Node, new: fx.Node) -> fx.Node:
    """What the pattern does with the attention's value (transpose back, merge heads) copied
    after `new`, which replaces `value`; returns the copy of the region's output.

    The tail's views were traced on eager's result, whose memory order can differ from the
    kernel's output: on a GPU, SDPA writes its output in the order its query is laid out (in
    nn.MultiheadAttention's exported graph (seq, batch, heads, dim), which makes the merge of
    seq and batch after a permute a view), where FACT's kernels write (batch, seq, heads, dim)
    or (batch, heads, seq, dim). So `view` is copied as `reshape`: the same view wherever the
    strides allow one, a copy where they do not (the graph is functional: nothing writes
    through a view)."""
    env = {value: new}
    last = new
    for n in reg.nodes[reg.nodes.index(value) + 1 :]:
        if all(a in env or a not in reg.nodes for a in n.all_input_nodes) and any(
            a in env for a in n.all_input_nodes
        ):
            last = env[n] = graph.node_copy(n, lambda a: env.get(a, a))
            if n.target is aten.view.default:
                last.target = aten.reshape.default
    if reg.output not in env:
        raise NotSupportedError("the attention output is not computed from its result")
    return last


def _attention_steps(pattern: Mapping[str, Any]) -> None:
    steps = set(pattern.get("epilogue") or [])
    if pattern.get("family") != "attention":
        raise NotSupportedError(f"{pattern.get('family')} is not attention")
    if not steps <= _ATTENTION_STEPS:
        raise NotSupportedError(f"attention steps {sorted(steps - _ATTENTION_STEPS)}")


def causal_floor(
    bias: torch.Tensor, q_len: int, k_len: int, floor: float, bias_first: bool
) -> torch.Tensor:
    """SDPA's attn_mask for a score bias and a causal mask, as the graph applied them: above
    the diagonal of the (q_len, k_len) scores (aligned at the top left, as is_causal and
    torch.tril are) a masked score is the mask's floor (-inf, finfo.min, times any scale after
    it), plus the bias where the bias came after the mask. A score plus the floor rounds to the
    floor, so scores + this mask is what the graph computed, also in a row the bias masks whole
    (a padded query's), where the floors decide which keys the row sees."""
    above = torch.ones(q_len, k_len, dtype=torch.bool, device=bias.device).triu(1)
    if bias_first:
        return bias.masked_fill(above, floor)
    return torch.where(above, bias + floor, bias)


class SdpaAttention(Impl):
    """Hand-written attention (matmul, scale, causal mask or additive bias, softmax, matmul) as
    one call of torch's scaled_dot_product_attention on the graph's own Q, K, V views. An
    additive bias (T5's position bias, BERT's padding mask) is its attn_mask, in Q's dtype: the
    scores are scaled first, then the bias added, as the pattern's step order says. SDPA takes
    is_causal or an attn_mask, not both: a bias under a causal mask (a decoder's position bias or
    padding mask) goes as one attn_mask with the mask's floor above the diagonal (causal_floor)."""

    def __init__(self, pattern: Mapping[str, Any]):
        if pattern.get("rule") == "attention_sdpa":
            raise NotSupportedError("the pattern already is scaled_dot_product_attention")
        _attention_steps(pattern)
        attrs = pattern.get("attrs") or {}
        self.causal = bool(attrs.get("causal"))
        steps = list(pattern.get("epilogue") or [])
        self.bias = "bias" in steps
        if self.bias and self.causal:  # (floor, whether the bias came before the mask)
            first = steps.index("bias") < steps.index("causal_mask")
            self.floor = (float(attrs.get("mask_floor", "-inf")), first)
        self.scale = float(attrs.get("scale", 0.0)) or None
        detail = {"causal": self.causal, "scale": self.scale}
        if self.bias:
            detail["bias"] = list(attrs.get("bias_shape") or [])
        super().__init__("sdpa", "library", detail)

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        io = attention_io(graph, reg, pattern, unrepeat=False)
        kwargs: dict[str, Any] = {"is_causal": self.causal, "scale": self.scale}
        if self.bias:
            bias = role_input(reg, pattern, "bias")
            q_val, b_val = io.q.meta.get("val"), bias.meta.get("val")
            if not isinstance(q_val, torch.Tensor) or not isinstance(b_val, torch.Tensor):
                raise NotSupportedError(f"the dtypes of {io.q.name} and {bias.name} are unknown")
            if not b_val.is_floating_point():  # SDPA would read a bool as a keep-mask
                raise NotSupportedError(f"the score bias {bias.name} is {b_val.dtype}")
            if io.folded and b_val.dim() == 3:  # [B * H, Sq, Sk] scores, read as [B * H, 1, ..]
                bias = _unsqueezed(graph, bias)
            if b_val.dtype != q_val.dtype:  # finfo(f32).min would round to -inf in 16 bits
                info = torch.finfo(q_val.dtype)
                bias = graph.call_function(aten.clamp.default, (bias, info.min, info.max))
                bias = graph.call_function(aten.to.dtype, (bias, q_val.dtype))
            if self.causal:
                k_val = io.k.meta.get("val")
                if not isinstance(k_val, torch.Tensor):
                    raise NotSupportedError(f"the shape of {io.k.name} is unknown")
                shape = (q_val.shape[-2], k_val.shape[-2])
                bias = graph.call_function(causal_floor, (bias, *shape, *self.floor))
                kwargs["is_causal"] = False
            kwargs["attn_mask"] = bias
        attn = graph.call_function(_SDPA, (io.q, io.k, io.v), kwargs)
        return copy_tail(graph, reg, io.value, io.result(graph, attn))


class AttentionImpl(Impl):
    """A generated fused attention kernel (backend cutlass: CUTLASS's Hopper FMHA, also in TF32
    for f32, or its sm80 kernel for f32, built by realize) or its PyTorch twin (backend
    reference), through fact::attention, for both attention rules. Q, K and V are read in place
    from the graph's views; grouped-query K/V repeated in the region (repeat_kv) are read
    un-repeated; the output is written in (batch, seq, heads, dim) order, so merging the heads
    afterwards copies nothing."""

    def __init__(self, pattern: Mapping[str, Any], backend: str, library=None, label: str = ""):
        _attention_steps(pattern)
        if "bias" in (pattern.get("epilogue") or []):
            raise NotSupportedError("an additive score bias: the FMHA kernels add none")
        problem = pattern.get("problem") or {}
        attrs = pattern.get("attrs") or {}
        d = int(problem.get("head_dim", 0))
        dv = int(problem.get("head_dim_v", d))
        if d != dv:
            raise NotSupportedError(f"head_dim {d} differs from head_dim_v {dv}")
        causal = bool(attrs.get("causal"))
        scale = float(attrs.get("scale") or 0.0) or (d**-0.5 if d else 1.0)
        dtype = attrs.get("dtype", "f32")
        out_dtype = torch_dtype(attrs.get("out_dtype") or dtype)
        if backend == "cutlass":
            info = library.info if library is not None else {}
            name = label or (library.name if library is not None else "attention")
            if info.get("family", "attention") != "attention":
                raise NotSupportedError(f"{name} is a {info.get('family')} kernel")
            if bool(info.get("causal")) != causal:
                raise NotSupportedError(
                    f"{name} is {'' if info.get('causal') else 'not '}causal; the pattern is "
                    f"{'' if causal else 'not '}causal"
                )
            if info.get("dtype") != dtype or torch_dtype(info.get("dtype", dtype)) != out_dtype:
                raise NotSupportedError(
                    f"{name} reads and writes {info.get('dtype')}; the pattern reads {dtype} and "
                    f"writes {attrs.get('out_dtype') or dtype}"
                )
            if info.get("head_dim") and d > int(info["head_dim"]):
                raise NotSupportedError(
                    f"{name} handles head_dim up to {info['head_dim']}, not {d}"
                )
        out_layout = attrs.get("out_layout") or "bs(hd)"
        if out_layout not in ("bs(hd)", "bhsd"):
            raise NotSupportedError(f"attention output layout {out_layout!r}")
        if backend == "cutlass":
            # The sm80 kernel (f32) writes (batch, seq, heads, dim) only; its info says so
            # (Hopper's kernels take any layout).
            layouts = info.get("out_layouts") or ["bs(hd)", "bhsd"]
            if out_layout not in layouts:
                raise NotSupportedError(
                    f"{name} writes its output as {' or '.join(layouts)}, the model wants "
                    f"{out_layout}"
                )
            # ... and runs grouped query heads one launch per K/V head, where its one-query
            # blocks take the group's heads as rows, a block of them at a time (the kernel
            # refuses a partial block at run time).
            heads, kv_heads = int(problem.get("heads", 0)), int(problem.get("kv_heads", 0))
            group = heads // kv_heads if kv_heads else 1
            block_q = int((info.get("config") or {}).get("block_q", 0))
            if "kv_groups" in info and block_q and group > block_q and group % block_q:
                raise NotSupportedError(
                    f"{name}: {group} query heads over each K/V head is not a whole number of "
                    f"its {block_q}-row blocks"
                )
        entry = AttentionKernel(causal, scale, out_dtype, backend, library, label, out_layout)
        self.handle = register_kernel(entry)
        name = f"cutlass:{label}" if backend == "cutlass" else f"reference:{label or 'attention'}"
        detail = {"backend": backend, "causal": causal, "scale": scale}
        super().__init__(name, "generated", with_math(detail, backend, library))

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        io = attention_io(graph, reg, pattern, unrepeat=True)
        shapes = [_shape(t) for t in (io.q, io.k, io.v)]
        if any(s is not None and len(s) != 4 for s in shapes):
            raise NotSupportedError(f"q, k, v shaped {shapes}, not [batch, heads, seq, dim]")
        val = io.value.meta.get("val")
        entry = kernel_entry(self.handle)
        if isinstance(val, torch.Tensor) and val.dtype != entry.out_dtype:
            raise NotSupportedError(
                f"the attention value is {val.dtype}, the kernel writes {entry.out_dtype}"
            )
        attn = graph.call_function(
            torch.ops.fact.attention.default, (io.q, io.k, io.v, self.handle)
        )
        return copy_tail(graph, reg, io.value, io.result(graph, attn))


# ---------------------------------------------------------------------------------------------
# Norms


class NormLibrary(Impl):
    """A hand-written row norm as torch's own op: RMSNorm (x * rsqrt(mean(x^2) + eps)) as
    rms_norm, LayerNorm ((x - u) / sqrt(mean((x - u)^2) + eps)) as layer_norm. It normalises in
    f32, then applies what the model wrote after: its cast (round_to), weight and bias."""

    def __init__(self, pattern: Mapping[str, Any]):
        attrs = pattern.get("attrs") or {}
        self.norm = attrs.get("kind")
        if self.norm not in ("rms_norm", "layer_norm"):
            raise NotSupportedError(f"norm kind {self.norm!r} has no library twin here")
        if self.norm == "layer_norm" and pattern.get("rule") == "norm":
            raise NotSupportedError("the pattern already is torch's layer_norm")
        self.eps = float(attrs.get("eps", 1e-6 if self.norm == "rms_norm" else 1e-5))
        super().__init__(self.norm, "library", {"eps": self.eps})

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        x = role_input(reg, pattern, "x")
        weight = role_input(reg, pattern, "weight", required=False)
        bias = role_input(reg, pattern, "bias", required=False)
        val = reg.output.meta["val"]
        cols = int((pattern.get("problem") or {}).get("cols", val.shape[-1]))
        dtype = val.dtype
        xf = graph.call_function(aten._to_copy.default, (x,), {"dtype": torch.float32})
        if self.norm == "rms_norm":
            out = graph.call_function(aten.rms_norm.default, (xf, [cols], None, self.eps))
        else:
            out = graph.call_function(aten.layer_norm.default, (xf, [cols], None, None, self.eps))
        current = torch.float32
        round_to = (pattern.get("attrs") or {}).get("round_to")
        affine = weight is not None or bias is not None
        if affine and round_to not in (None, "f32"):  # the model's .type_as(x)
            current = torch_dtype(round_to)
            out = graph.call_function(aten._to_copy.default, (out,), {"dtype": current})
        for operand, op in ((weight, aten.mul.Tensor), (bias, aten.add.Tensor)):
            if operand is not None:
                out = graph.call_function(op, (out, operand))
                current = torch.promote_types(current, operand.meta["val"].dtype)
        if current != dtype:
            out = graph.call_function(aten._to_copy.default, (out,), {"dtype": dtype})
        return out


def run_norm_pattern(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    kernel: int,
    direct: bool = False,
) -> torch.Tensor:
    norm = BODIES[torch.ops.fact.norm.default] if direct else torch.ops.fact.norm.default
    return norm(x, weight, bias, kernel)


class NormImpl(Impl):
    """A generated row-norm kernel (backend cutlass: a library built by realize) or its
    PyTorch twin (backend reference), through fact::norm."""

    def __init__(self, pattern: Mapping[str, Any], backend: str, library=None, label: str = ""):
        attrs = pattern.get("attrs") or {}
        kind = attrs.get("kind")
        if pattern.get("family") != "norm" or kind not in ("layer_norm", "rms_norm"):
            raise NotSupportedError(f"norm kind {kind!r}")
        roles = {o.get("role") for o in pattern.get("operands") or []}
        round_to = attrs.get("round_to")
        rounds = "weight" in roles and round_to not in (None, "f32")
        entry = NormKernel(
            kind,
            int((pattern.get("problem") or {})["cols"]),
            float(attrs.get("eps", 1e-5)),
            torch_dtype(attrs["dtype_out"]),
            backend,
            library,
            torch_dtype(round_to) if rounds else None,
            label,
        )
        self.stats = bool(attrs.get("stats"))  # mean and rstd (fact::norm_stats), no row
        if library is not None and bool(library.info.get("stats")) != self.stats:
            raise NotSupportedError(
                f"{label}: a {'statistics' if library.info.get('stats') else 'row-norm'} kernel "
                f"for a {'statistics' if self.stats else 'row-norm'} pattern"
            )
        self.handle = register_kernel(entry)
        name = f"generated:{label}" if backend == "cutlass" else f"reference:{label or kind}"
        super().__init__(name, "generated", {"backend": backend})

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        x = role_input(reg, pattern, "x")
        if self.stats:  # (mean, rstd): replace() takes one getitem per output
            stats = torch.ops.fact.norm_stats.default
            return graph.call_function(stats, (x,), {"kernel": self.handle})
        weight = role_input(reg, pattern, "weight", required=False)
        bias = role_input(reg, pattern, "bias", required=False)
        return graph.call_function(run_norm_pattern, (x, weight, bias), {"kernel": self.handle})


# ---------------------------------------------------------------------------------------------
# Pointwise regions


class PointwiseImpl(Impl):
    """A generated pointwise kernel (backend cutlass: a library built by realize) or its
    PyTorch twin (backend reference), through fact::pointwise: a region of elementwise ops left
    over by the other patterns (Llama's RoPE, q * cos + rotate_half(q) * sin) in one pass.
    Inputs are read in place (strided views, broadcasts); the output is laid out like eager's
    (the traced strides), so what reads it next sees the same tensor."""

    def __init__(self, pattern: Mapping[str, Any], backend: str, library=None, label: str = ""):
        if pattern.get("family") != "pointwise":
            raise NotSupportedError(f"{pattern.get('family')} is not pointwise")
        sig = pattern.get("signature")
        ssa = list((pattern.get("epilogue_expr") or {}).get("ssa") or [])
        if not ssa:
            raise NotSupportedError(f"pointwise pattern {sig} has no epilogue_expr")
        if any(e.get("op") == "acc" for e in ssa):
            raise NotSupportedError(f"pointwise pattern {sig} reads an accumulator")
        operands = list(pattern.get("operands") or [])
        roles = [o.get("role") for o in operands]
        if roles != [f"in{i}" for i in range(len(operands))]:
            raise FactError(f"pointwise pattern {sig}: operand roles {roles}, not in0..inN-1")
        if not 1 <= len(operands) <= FACT_POINTWISE_MAX_INPUTS:
            raise NotSupportedError(
                f"pointwise pattern {sig} reads {len(operands)} inputs; its kernels read 1 to "
                f"{FACT_POINTWISE_MAX_INPUTS}"
            )
        attrs = pattern.get("attrs") or {}
        self.shape = [int(d) for d in attrs["shape"]] if attrs.get("shape") is not None else None
        if self.shape is not None and len(self.shape) > FACT_POINTWISE_MAX_RANK:
            raise NotSupportedError(
                f"pointwise pattern {sig} has a rank-{len(self.shape)} output; its kernels "
                f"handle up to {FACT_POINTWISE_MAX_RANK} dims"
            )
        dtypes = [parse_type(o.get("type", ""))[0] for o in operands]
        dtype_out = attrs.get("dtype_out")
        if not dtype_out:
            raise FactError(f"pointwise pattern {sig}: attrs lack 'dtype_out'")
        problem = pattern.get("problem") or {}
        cols = int(problem.get("cols") or (self.shape[-1] if self.shape else 1))
        if backend == "cutlass":
            _check_pointwise_library(library, label, dtypes, dtype_out, cols, self.shape)
        shapes = [parse_type(o.get("type", ""))[1] for o in operands]
        entry = PointwiseKernel(
            ssa,
            [torch_dtype(d) for d in dtypes],
            torch_dtype(dtype_out),
            cols,
            backend,
            library,
            label,
            input_cols=[shape[-1] if shape else 1 for shape in shapes],
        )
        self.n_inputs = len(operands)
        self.handle = register_kernel(entry)
        name = f"generated:{label}" if backend == "cutlass" else f"reference:{label or 'pointwise'}"
        super().__init__(name, "generated", {"backend": backend})

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        entry = kernel_entry(self.handle)
        inputs = [role_input(reg, pattern, f"in{i}") for i in range(self.n_inputs)]
        for i, (node, dtype) in enumerate(zip(inputs, entry.inputs, strict=True)):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dtype != dtype:
                raise NotSupportedError(
                    f"{node.name} (in{i}) is {val.dtype}, the pointwise kernel reads {dtype}"
                )
        val = reg.output.meta["val"]
        where = f"the pointwise region's output {reg.output.name}"
        if val.dtype != entry.out_dtype:
            raise NotSupportedError(f"{where} is {val.dtype}, the kernel writes {entry.out_dtype}")
        shape = list(val.shape)
        if self.shape is not None and shape != self.shape:
            raise NotSupportedError(f"{where} is shaped {shape}, the plan says {self.shape}")
        if len(shape) > FACT_POINTWISE_MAX_RANK or (shape and shape[-1] != entry.cols):
            raise NotSupportedError(
                f"{where} is shaped {shape}; the kernel writes {entry.cols} columns and at most "
                f"{FACT_POINTWISE_MAX_RANK} dims"
            )
        return graph.call_function(
            torch.ops.fact.pointwise.default, (inputs, self.handle, shape, list(val.stride()))
        )


class GatedTailImpl(PointwiseImpl):
    """A gated MLP, act(x W_gate^T) * (x W_up^T), as PyTorch's two projections (library GEMMs)
    and one generated pointwise kernel for act(gate) * up (the plan's "tail"): the activation
    and the product in one pass over the two projections instead of two passes."""

    def __init__(self, pattern: Mapping[str, Any], backend: str, library=None, label: str = ""):
        tail = pattern.get("tail")
        if pattern.get("family") != "gated_mlp" or not tail:
            raise NotSupportedError("not a gated MLP with a pointwise tail")
        super().__init__(tail, backend, library, label)
        self.detail["form"] = "tail"

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        x = _gated_input(reg, pattern)
        gate = graph.call_function(aten.linear.default, (x, role_input(reg, pattern, "b_gate")))
        up = graph.call_function(aten.linear.default, (x, role_input(reg, pattern, "b_up")))
        val = reg.output.meta["val"]
        entry = kernel_entry(self.handle)
        if val.dtype != entry.out_dtype or (val.dim() and val.shape[-1] != entry.cols):
            raise NotSupportedError(
                f"the gated MLP's output {reg.output.name} is {val.dtype} {list(val.shape)}; the "
                f"tail kernel writes {entry.out_dtype} with {entry.cols} columns"
            )
        return graph.call_function(
            torch.ops.fact.pointwise.default,
            ([gate, up], self.handle, list(val.shape), list(val.stride())),
        )


#: A GEMM anchor and the ATen call that computes its product alone (its bias, if it takes one,
#: is in the epilogue the tail computes): target -> (product op, indices of its arguments)
_PRODUCT = {
    aten.linear.default: (aten.linear.default, (0, 1)),
    aten.matmul.default: (aten.matmul.default, (0, 1)),
    aten.mm.default: (aten.mm.default, (0, 1)),
    aten.bmm.default: (aten.bmm.default, (0, 1)),
    aten.addmm.default: (aten.mm.default, (1, 2)),
    aten.baddbmm.default: (aten.bmm.default, (1, 2)),
}


def tail_operand(t: torch.Tensor, kind: str, out_shape: list[int]) -> torch.Tensor:
    """An epilogue operand as a GEMM tail kernel reads it (realize's gemm_epilogue_tail): a row
    as [n], a column as [.., 1] over the output's rows, a scalar as [1], a full operand shaped
    as the output. Views where the layout allows, copies otherwise."""
    if kind == "row":
        return t.reshape(out_shape[-1])
    if kind == "col":
        return t.reshape(*out_shape[:-1], 1)
    if kind == "scalar":
        return t.reshape(1)
    return t.reshape(out_shape)


class GemmTailImpl(PointwiseImpl):
    """A GEMM pattern as PyTorch's GEMM for the plain product (cuBLAS, a library kernel) and its
    whole epilogue in one generated pointwise kernel (the plan's "tail"): where cuBLAS's
    mainloop beats every generated config (small M with large N and K), the epilogue still
    takes one pass instead of eager's pass per op."""

    def __init__(self, pattern: Mapping[str, Any], backend: str, library=None, label: str = ""):
        tail = pattern.get("tail")
        if pattern.get("family") != "gemm" or not tail:
            raise NotSupportedError("not a GEMM pattern with a pointwise tail")
        super().__init__(tail, backend, library, label)
        self.detail["form"] = "tail"
        self.name = f"cublas+{self.name}"

    def emit(self, graph: fx.Graph, reg: Region, pattern: Mapping[str, Any]) -> fx.Node:
        anchors = [n for n in reg.nodes if n.name in (pattern.get("anchors") or [])]
        if len(anchors) != 1 or anchors[0].target not in _PRODUCT:
            names = [n.name for n in anchors]
            raise NotSupportedError(f"GEMM anchors {names} have no product form")
        anchor = anchors[0]
        if anchor.target in (aten.addmm.default, aten.baddbmm.default) and any(
            anchor.kwargs.get(k, 1) != 1 for k in ("alpha", "beta")
        ):
            raise NotSupportedError(f"{anchor.name} scales its product or bias")
        op, picks = _PRODUCT[anchor.target]
        entry = kernel_entry(self.handle)
        val = reg.output.meta["val"]
        out_shape = list(val.shape)
        if val.dtype != entry.out_dtype or not out_shape or out_shape[-1] != entry.cols:
            raise NotSupportedError(
                f"the GEMM pattern's output {reg.output.name} is {val.dtype} {out_shape}; the tail "
                f"kernel writes {entry.out_dtype} with {entry.cols} columns"
            )
        if self.shape is not None and out_shape != self.shape:
            raise NotSupportedError(
                f"{reg.output.name} is shaped {out_shape}, the plan says {self.shape}"
            )
        product = graph.call_function(op, tuple(anchor.args[i] for i in picks))
        acc = graph.call_function(aten.reshape.default, (product, out_shape))
        inputs = [acc]
        for o in pattern.get("operands") or []:
            if o.get("role") in ("a", "b"):
                continue
            node = reg.input(o["node"])
            inputs.append(
                graph.call_function(tail_operand, (node, o.get("broadcast", "full"), out_shape))
            )
        if len(inputs) != self.n_inputs:
            raise FactError(
                f"pattern {pattern.get('signature')}: {len(inputs)} tail inputs, the kernel "
                f"reads {self.n_inputs}"
            )
        return graph.call_function(
            torch.ops.fact.pointwise.default, (inputs, self.handle, out_shape, list(val.stride()))
        )


def _check_pointwise_library(
    library, label: str, dtypes: list[str], dtype_out: str, cols: int, shape: list[int] | None
) -> None:
    """NotSupportedError unless a generated library computes this pattern's signature of
    dtypes, columns and rank (what fact_kernel_info() says)."""
    info = library.info if library is not None else {}
    name = label or (library.name if library is not None else "pointwise")
    if info.get("family", "pointwise") != "pointwise":
        raise NotSupportedError(f"{name} is a {info.get('family')} kernel")
    if "inputs" in info and list(info["inputs"]) != dtypes:
        raise NotSupportedError(f"{name} reads {info['inputs']}; the pattern's inputs are {dtypes}")
    if info.get("dtype_out", dtype_out) != dtype_out:
        raise NotSupportedError(
            f"{name} writes {info['dtype_out']}; the pattern writes {dtype_out}"
        )
    if info.get("cols") is not None and int(info["cols"]) != cols:
        raise NotSupportedError(
            f"{name} writes {info['cols']} columns; the pattern's output has {cols}"
        )
    if info.get("rank") is not None and shape is not None and int(info["rank"]) != len(shape):
        raise NotSupportedError(
            f"{name} is built for rank {info['rank']}; the pattern's output has rank {len(shape)}"
        )


def library_impls(pattern: Mapping[str, Any], device: torch.device | None = None) -> list[Impl]:
    """The library implementations that apply to a pattern (possibly none). cuBLASLt
    epilogues are offered on CUDA devices only."""
    family = pattern.get("family")
    makers: list[Any] = {"attention": [SdpaAttention], "norm": [NormLibrary]}.get(family, [])
    if family == "gemm" and device is not None and device.type == "cuda":
        makers = [CublasLtGemm]
    impls = []
    for make in makers:
        try:
            impls.append(make(pattern))
        except NotSupportedError:
            continue
    return impls


# ---------------------------------------------------------------------------------------------
# Running a composed graph eagerly

# Graph helpers that call a fact op inside; direct_calls passes them direct=True.
_HELPERS = (run_gemm_pattern, run_gemm_parts_pattern, run_norm_pattern)


def direct_calls(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` in which every fact op call goes straight to the op's Python body
    (ops.BODIES): the same kernels and results without the dispatcher's host time. For real
    tensors only (optimize.runs_eagerly says when): `gm` stays the graph to trace, compile or
    export, since fake tensors, dispatch modes and torch.compile need the registered ops."""
    graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    old_output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    output = graph.output(graph.graph_copy(gm.graph, {}), type_expr=old_output.type)
    output.meta = copy.copy(old_output.meta)
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in BODIES:
            node.target = BODIES[node.target]
        elif node.target in _HELPERS:
            node.kwargs = {**node.kwargs, "direct": True}
    return fx.GraphModule(gm, graph)
