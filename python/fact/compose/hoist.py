"""Work on parameters alone, done once: a composed graph split into a prologue that reads only
the model's state (parameters, buffers, constants) and the per-call graph.

A model may compute on its weights every call: a weight normalised or scaled, a mask cut from a
buffer, or the derived weights of a LayerNorm folded into the GEMM after it (fact.folds). The
values do not change from call to call, so `Hoist` computes them once and keeps them; the graph
reads the kept tensors as inputs.

They are computed again when a parameter or buffer they read changes: the check per call is each
tensor's identity, storage and version counter, so an in-place update (`w.mul_(2)` under
no_grad, `load_state_dict`, an optimizer step) or a new Parameter assigned to the attribute is
seen by the next call. A recomputed value is copied into the kept tensor when its shape allows,
so a captured CUDA graph that reads it stays valid. Writes through `.data` bypass the version
counter and are not seen (as for the watched buffers, Program.stale_buffers) until
OptimizedModule.refresh().

Only work worth keeping is hoisted: a node that computes (not a view or alias of a parameter,
which costs nothing) and is read by the per-call graph. Random ops, and values the module
returns (or views of them), stay in the per-call graph.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from fact.compose.program import is_random_op


def _is_alias(n: fx.Node) -> bool:
    """A view, alias or getitem: no work of its own."""
    if n.op != "call_function":
        return True
    if not isinstance(n.target, torch._ops.OpOverload):
        return n.target is operator.getitem
    returns = n.target._schema.returns
    return bool(returns) and all(r.alias_info is not None for r in returns)


def _is_random(n: fx.Node) -> bool:
    """Random, or a dropout (kept per call whatever its mode)."""
    return is_random_op(n.target) or (
        isinstance(n.target, torch._ops.OpOverload) and "dropout" in str(n.target)
    )


def _pure_call(n: fx.Node) -> bool:
    """A call whose value depends on its arguments alone: no randomness, no in-place write."""
    if n.op != "call_function" or _is_random(n):
        return False
    if isinstance(n.target, torch._ops.OpOverload):
        return not any(
            a.alias_info is not None and a.alias_info.is_write for a in n.target._schema.arguments
        )
    return True


class Hoist:
    """`gm` (called as gm(*state, *inputs), the first `n_state` placeholders the model's state)
    as a prologue of state-only work and a per-call graph. `values(state)` gives the prologue's
    outputs, computed when the state they read changed; `main(*state, *values, *inputs)` is
    the per-call graph. With nothing to hoist, `main` is `gm` and `values` is empty."""

    def __init__(self, gm: fx.GraphModule, n_state: int):
        graph = gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        state = placeholders[:n_state]
        const: set[fx.Node] = set(state)
        heavy: dict[fx.Node, bool] = {p: False for p in state}
        for n in graph.nodes:
            if n.op == "get_attr" or (_pure_call(n) and all(a in const for a in n.all_input_nodes)):
                const.add(n)
                heavy[n] = (n.op == "call_function" and not _is_alias(n)) or any(
                    heavy[a] for a in n.all_input_nodes
                )
        # Values the module returns, and what they are views of: a kept tensor must never reach
        # the caller (who may write to it, and whom a recomputation would overwrite).
        returned: set[fx.Node] = set()
        stack = [a for n in graph.nodes if n.op == "output" for a in n.all_input_nodes]
        while stack:
            m = stack.pop()
            if m not in returned:
                returned.add(m)
                if _is_alias(m):
                    stack.extend(m.all_input_nodes)
        # What the per-call graph reads of the constant part, where computing it costs something.
        hoisted = [
            n
            for n in graph.nodes
            if n in const
            and n.op == "call_function"
            and heavy[n]
            and n not in returned
            and any(u not in const for u in n.users)
            and isinstance(n.meta.get("val", torch.empty(0)), torch.Tensor)
        ]
        self.hoisted_names = [n.name for n in hoisted]
        self._key: tuple | None = None
        self._kept: list[torch.Tensor] = []
        if not hoisted:
            self.prologue, self.main, self.reads = None, gm, []
            return
        needed: set[fx.Node] = set()  # the hoisted values and everything they are made of
        stack = list(hoisted)
        while stack:
            m = stack.pop()
            if m not in needed:
                needed.add(m)
                stack.extend(m.all_input_nodes)
        self.prologue = self._prologue(gm, state, hoisted, needed)
        self.main = self._main(gm, state, hoisted)
        self.reads = [i for i, p in enumerate(state) if p in needed]  # state the prologue reads

    @staticmethod
    def _prologue(
        gm: fx.GraphModule, state: list[fx.Node], hoisted: list[fx.Node], needed: set[fx.Node]
    ) -> fx.GraphModule:
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for p in state:
            env[p] = graph.placeholder(p.name)
            env[p].meta.update(p.meta)
        for n in gm.graph.nodes:
            if n in needed and n.op != "placeholder":
                env[n] = graph.node_copy(n, lambda a: env[a])
        graph.output(tuple(env[n] for n in hoisted))
        return fx.GraphModule(gm, graph)

    @staticmethod
    def _main(gm: fx.GraphModule, state: list[fx.Node], hoisted: list[fx.Node]) -> fx.GraphModule:
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        nodes = list(gm.graph.nodes)
        for n in nodes:  # state placeholders, then one per hoisted value, then the user inputs
            if n.op == "placeholder" and n in state:
                env[n] = graph.placeholder(n.name)
                env[n].meta.update(n.meta)
        for n in hoisted:
            env[n] = graph.placeholder(f"hoisted_{n.name}")
            env[n].meta.update({k: v for k, v in n.meta.items() if k in ("val", "tensor_meta")})
        for n in nodes:
            if n in env:
                continue
            if n.op == "placeholder":
                env[n] = graph.placeholder(n.name)
                env[n].meta.update(n.meta)
            else:
                env[n] = graph.node_copy(n, lambda a: env[a])
        graph.eliminate_dead_code()
        return fx.GraphModule(gm, graph)

    def forget(self) -> None:
        """Compute the hoisted values again on the next call (after a write no version counter
        shows: OptimizedModule.refresh)."""
        self._key = None

    def values(self, state: Sequence[Any]) -> list[torch.Tensor]:
        """The hoisted values for the model's state now (computed again when it changed)."""
        if self.prologue is None:
            return []
        key = tuple(
            (id(t), t.data_ptr(), t._version) if isinstance(t, torch.Tensor) else ("value", t)
            for t in (state[i] for i in self.reads)
        )
        if key == self._key:
            return self._kept
        # Normal tensors even on a first call under torch.inference_mode(): an inference tensor
        # kept here could never be updated in place by a later call outside it.
        with torch.inference_mode(False), torch.no_grad():
            fresh = list(self.prologue(*state))
            same = len(fresh) == len(self._kept) and all(
                k.shape == f.shape
                and k.dtype == f.dtype
                and k.device == f.device
                and not k.is_inference()
                for k, f in zip(self._kept, fresh, strict=True)
            )
            if same:
                for k, f in zip(self._kept, fresh, strict=True):
                    k.copy_(f)  # in place: a captured CUDA graph reads these addresses
            else:
                self._kept = fresh
        self._key = key
        return self._kept

    def __call__(self, state: Sequence[Any], inputs: Sequence[Any]) -> Any:
        # The generated forward itself: nn.Module's call path around it (hooks nobody sets on
        # this internal module) costs a few microseconds of every call's host time.
        return self.main.forward(*state, *self.values(state), *inputs)
