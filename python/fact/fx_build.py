"""Adding nodes to an exported graph with the metadata FACT's tracer reads (fact.layouts and
fact.folds rewrite programs before they are planned)."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx


def value_of(node: Any) -> Any:
    """A node's traced value (a FakeTensor), or the argument itself when it is not a node."""
    return node.meta.get("val") if isinstance(node, fx.Node) else node


def arg_of(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """An argument of a call node, given by position or by name."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def fake_mode_of(gm: fx.GraphModule) -> Any:
    """The FakeTensorMode the graph's values were traced in (None without any)."""
    from torch._guards import detect_fake_mode

    values = [n.meta["val"] for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return detect_fake_mode(values)


def take_name(node: fx.Node, name: str) -> None:
    """Give `node` the name of a node just erased, so that the names a user knows from the
    exported program (`fact explain --node linear`) keep meaning the same computation. FX keeps
    erased names reserved; where its namespace is not as this expects, the node keeps its own."""
    used = getattr(node.graph._graph_namespace, "_used_names", None)
    if not isinstance(used, set) or any(n.name == name for n in node.graph.nodes):
        return
    used.discard(name)
    node._rename(name)


class NodeBuilder:
    """Adds nodes after an anchor, in order, each with its FakeTensor value (what the tracer's
    graph conversion reads shapes and strides from) and the anchor's source location."""

    def __init__(self, graph: fx.Graph, anchor: fx.Node, fake_mode: Any):
        self.graph, self.last, self.fake_mode = graph, anchor, fake_mode
        self.source(anchor)

    def source(self, node: fx.Node) -> None:
        """Nodes added from now on carry `node`'s source location and module path."""
        self.meta = {k: node.meta[k] for k in ("stack_trace", "nn_module_stack") if k in node.meta}

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        with self.graph.inserting_after(self.last):
            node = self.graph.call_function(target, tuple(args), kwargs)
        node.meta.update(self.meta)
        values = [value_of(a) for a in args]
        with self.fake_mode:
            node.meta["val"] = target(*values, **kwargs)
        self.last = node
        return node
