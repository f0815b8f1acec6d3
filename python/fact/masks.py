"""Attention masks made of constants, evaluated before planning: an SDPA call whose attn_mask is
computed from shapes and constants alone (Hugging Face's models build causal, sliding-window and
all-true masks from `arange`, comparisons and `&`; torch.export fixes the shapes, so the mask
is one constant tensor) is rewritten by what its mask is:

  all true (or an additive mask of zeros)   no mask
  causal, top-left aligned (key j <= query i, SDPA's `is_causal`)   is_causal=True
  anything else (another diagonal, a sliding window, padding)   left as it is

so the attention rule sees a causal or plain SDPA call, which FACT's fused attention kernels and
PyTorch's flash path run without reading a mask. A mask that depends on an input (a padding
mask passed by the caller) or on the model's state is left alone: it stays a mask and stays
correct.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fact.compose.program import is_random_op
from fact.fx_build import arg_of

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
#: mask nodes evaluated at most this large (elements): a mask is [B or 1, H or 1, Sq, Sk]
_MAX_ELEMENTS = 1 << 28


def constant_inputs(node: fx.Node) -> list[fx.Node] | None:
    """The nodes `node` is computed from, in graph order, when none of them is a placeholder
    (an input, parameter, buffer or constant of the program) and every call among them is a
    plain function (no in-place write, nothing random); None otherwise."""
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op != "call_function":
            return None  # a placeholder, get_attr or anything else read from outside
        target = n.target
        if isinstance(target, torch._ops.OpOverload):
            schema = target._schema
            if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
                return None
            if is_random_op(target) or "dropout" in target.name():
                return None
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def evaluate(node: fx.Node, consumer: fx.Node, region: list[fx.Node]) -> Any:
    """The value of a node computed from constants alone (`region`: constant_inputs(node)), on
    the CPU. The calls between them that return nothing and that nothing reads (torch.func's
    vmap nesting around a vmapped mask function) run in graph order too, up to `consumer`, the
    mask's reader, so that they pair up as traced; vmap's nesting is restored whatever
    happens."""
    needed = set(region)
    level = _vmap_level()
    env: dict[fx.Node, Any] = {}
    started = False
    try:
        for n in node.graph.nodes:
            if n is consumer:
                break
            started = started or n in needed
            if n in needed or (started and _side_effect(n)):
                args = fx.node.map_arg(n.args, lambda a: env[a])
                kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
                if kwargs.get("device") is not None:
                    kwargs = {**kwargs, "device": torch.device("cpu")}
                env[n] = n.target(*args, **kwargs)
    finally:
        while _vmap_level() > level:
            torch._C._functorch._vmap_decrement_nesting()
    return env[node]


def _vmap_level() -> int:
    level = torch._C._functorch.maybe_current_level()
    return -1 if level is None else int(level)


#: The calls without a value that a vmapped mask function leaves in an exported graph
_VMAP_CALLS = ("_vmap_increment_nesting", "_vmap_decrement_nesting", "lazy_load_decompositions")


def _side_effect(n: fx.Node) -> bool:
    """vmap's nesting counters and its decompositions' lazy loading: calls that nothing reads,
    which must run (in pairs) around a vmapped mask function's ops."""
    return (
        n.op == "call_function"
        and not n.users
        and getattr(n.target, "__name__", "") in _VMAP_CALLS
        and "functorch" in getattr(n.target, "__module__", "")
    )


def classify(mask: torch.Tensor, seq_q: int, seq_k: int) -> str:
    """What a mask broadcast to [.., seq_q, seq_k] keeps: "all" (every key for every query),
    "causal" (key j for query i where j <= i, SDPA's is_causal) or "other"."""
    if mask.dim() < 2 or mask.shape[-2] not in (1, seq_q) or mask.shape[-1] not in (1, seq_k):
        return "other"
    if mask.dtype == torch.bool:
        keep = mask
    elif mask.is_floating_point():
        # additive: 0 keeps a key; a value that makes exp() vanish (-inf, finfo.min) drops it
        if not bool(((mask == 0) | (mask <= torch.finfo(mask.dtype).min / 2)).all()):
            return "other"
        keep = mask == 0
    else:
        return "other"
    keep = keep.expand(*keep.shape[:-2], seq_q, seq_k).reshape(-1, seq_q, seq_k)
    first = keep[0]
    if not bool((keep == first).all()):
        return "other"  # differs by batch or head (padding)
    if bool(first.all()):
        return "all"
    causal = torch.ones(seq_q, seq_k, dtype=torch.bool).tril()
    return "causal" if bool(torch.equal(first, causal)) else "other"


def rewrite(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite, in place, every SDPA call whose mask is made of constants and keeps all keys or
    is causal (see the module docstring). Returns a line per rewrite."""
    gm = program.graph_module
    graph = gm.graph
    done = []
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is _SDPA]:
        mask = arg_of(node, 3, "attn_mask")
        if not isinstance(mask, fx.Node) or arg_of(node, 5, "is_causal", False):
            continue
        q, k = (arg_of(node, i, name).meta.get("val") for i, name in ((0, "query"), (1, "key")))
        traced = mask.meta.get("val")
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
            continue
        if not isinstance(traced, torch.Tensor) or traced.numel() > _MAX_ELEMENTS:
            continue
        region = constant_inputs(mask)
        if region is None:
            continue
        try:
            value = evaluate(mask, node, region)
            if not isinstance(value, torch.Tensor):
                continue
            value = value.cpu()
            kind = classify(value, q.shape[-2], k.shape[-2])
        except Exception:  # noqa: BLE001 - a mask we cannot evaluate here stays as it is
            continue
        if kind == "other":
            continue
        args = list(node.args)
        kwargs = dict(node.kwargs)
        if len(args) > 3:
            args[3] = None
        else:
            kwargs.pop("attn_mask", None)
        if kind == "causal":
            if len(args) > 5:
                args[5] = True
            else:
                kwargs["is_causal"] = True
        node.args, node.kwargs = tuple(args), kwargs
        removed = _drop_unused(mask, region)
        shape = "x".join(str(d) for d in value.shape)
        what = "no mask" if kind == "all" else "is_causal=True"
        done.append(
            f"{node.name}: its mask ({value.dtype}, {shape}, computed from constants in "
            f"{removed} nodes) keeps {'every key' if kind == 'all' else 'keys up to the query'}"
            f": {what}"
        )
    if done:
        graph.lint()
        gm.recompile()
    return done


def _drop_unused(mask: fx.Node, region: list[fx.Node]) -> int:
    """Erase the mask and every node of its constant computation (`region`) that nothing reads
    any more, with the dead ends hanging off them (views the exporter left unused); the count
    erased. Calls that return nothing (vmap's nesting) stay, so that they still pair up."""
    inside = set(region)
    for n in mask.graph.nodes:  # what is computed from the region alone
        if n.op == "call_function" and n.all_input_nodes and set(n.all_input_nodes) <= inside:
            inside.add(n)
    erased = 0
    changed = True
    while changed:
        changed = False
        for n in reversed(list(mask.graph.nodes)):
            if n in inside and not n.users and not _side_effect(n):
                inside.discard(n)
                n.graph.erase_node(n)
                erased += 1
                changed = True
    return erased
