"""An exported module as one flat FX graph, fed from the live model, and the graph surgery that
swaps a pattern's nodes for its implementation.

`Program` keeps torch.export's graph (ATen ops; parameters, buffers and constants are leading
placeholders) and, on each call, reads the parameters and buffers from the user's module by
name, so the composed module shares them: no copies, and an in-place update, or a new Parameter
assigned to the attribute, is seen by the next call.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from fact.errors import FactError

#: ATen ops whose value is random, by base name (Program refuses them; compose/hoist keeps them
#: per call)
RANDOM_OPS = (
    "native_dropout",
    "bernoulli",
    "rand",
    "randn",
    "rand_like",
    "randn_like",
    "randint",
    "multinomial",
)


def is_random_op(target: Any) -> bool:
    """Whether a call target is one of RANDOM_OPS."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return target.name().split("::")[-1].split(".")[0] in RANDOM_OPS


class Program:
    """torch.export's flat graph of `model`, runnable on the model's live state."""

    def __init__(self, model: nn.Module, program: torch.export.ExportedProgram):
        self.model = model
        self.exported = program
        sig = program.graph_signature
        # ExportedProgram.call_spec builds a new namedtuple type on every access (hundreds of
        # microseconds): read once, for every call's flatten and unflatten.
        spec = program.call_spec
        self.in_spec, self.out_spec = spec.in_spec, spec.out_spec
        self.input_specs = list(sig.input_specs)
        self.user_inputs = [s.arg.name for s in self.input_specs if s.kind == InputKind.USER_INPUT]
        self.graph_module: fx.GraphModule = program.graph_module
        check_inference(type(model).__name__, program)
        self._holders: list[tuple[Any, str]] = []
        self._resolve_state()
        # Calls whose arguments are N positional leaves (tensors, numbers, None) flatten to
        # themselves: the per-call path skips pytree for them.
        n = len(self.user_inputs)
        plain = pytree.tree_structure((tuple(range(n)), {}))
        self._plain_arity = n if self.in_spec == plain else None
        # Buffers and tensor constants whose values the plan may rely on (a tril buffer becomes
        # a causal flag): remember the tensor, its version and its values, so a later change
        # is noticed.
        self.watched: list[tuple[str, torch.Tensor, int, torch.Tensor]] = []
        self.watch(
            spec.target
            for spec in self.input_specs
            if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
        )

    def watch(self, targets: Iterable[str]) -> None:
        """Watch exactly these buffers and tensor constants (by name) for changes from now on."""
        self.watched = []
        self._watch_holders = {}
        for name in targets:
            t = self.state_tensor(name)
            self.watched.append((name, t, t._version, t.detach().clone()))
            self._watch_holders[name] = self._holder(name, parameter=False)

    def state_tensor(self, target: str) -> torch.Tensor:
        """A buffer or tensor constant of the model as it is now: the module's attribute (a
        buffer, or a plain tensor attribute, which torch.export lifts as a constant and would
        otherwise keep as a snapshot), else the program's constant (a tensor made in forward)."""
        prefix, _, attr = target.rpartition(".")
        try:
            owner = self.model.get_submodule(prefix) if prefix else self.model
        except AttributeError:
            owner = None
        value = getattr(owner, attr, None) if owner is not None else None
        if isinstance(value, torch.Tensor):
            return value
        return self.exported.constants[target]

    def recheck_watched(self) -> None:
        """Compare every watched tensor by value at the next stale_buffers() (after writes the
        version counter does not show, such as through `.data`)."""
        self.watched = [(name, t, -1, values) for name, t, _, values in self.watched]

    def stale_buffers(self) -> list[str]:
        """Watched buffers that were replaced or hold other values since the program was built.

        The check per call is the tensor's identity and version counter; a changed version with
        unchanged values (load_state_dict of the same checkpoint) is compared once and
        accepted. Writes through `.data` bypass the version counter and are not seen until
        recheck_watched() (OptimizedModule.refresh()).
        """
        stale = []
        for i, (name, tensor, version, values) in enumerate(self.watched):
            table, key = self._watch_holders[name]
            now = table.get(key) if isinstance(table, dict) else None
            if now is tensor and now._version == version:
                continue
            now = self.state_tensor(name)
            same = now.shape == values.shape and now.dtype == values.dtype
            if same and bool(torch.equal(now.detach(), values.to(now.device))):
                self.watched[i] = (name, now, now._version, values)
                continue
            stale.append(name)
        return stale

    # -- feeding the graph ------------------------------------------------------------------
    def _resolve_state(self) -> None:
        """Where each state placeholder's tensor lives now: the dict of the module that holds
        it (its _parameters or _buffers, or its __dict__ for a plain tensor attribute) and the
        key, so a call reads it with one lookup and still sees a new tensor assigned to the
        attribute. Kinds torch.export has no state for are refused here, once."""
        _watch_structure()
        self._structure = _STRUCTURE[0]
        holders: list[tuple[Any, str]] = []
        for spec in self.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                continue
            if spec.kind == InputKind.PARAMETER:
                holders.append(self._holder(spec.target, parameter=True))
            elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                holders.append(self._holder(spec.target, parameter=False))
            elif spec.kind == InputKind.CUSTOM_OBJ:
                holders.append((self.exported.constants, spec.target))
            else:
                raise FactError(
                    f"exported input {spec.arg.name}: kind {spec.kind} is not supported"
                )
        self._holders = holders

    def _holder(self, target: str, parameter: bool) -> tuple[Any, str]:
        prefix, _, attr = target.rpartition(".")
        try:
            owner = self.model.get_submodule(prefix) if prefix else self.model
        except AttributeError:
            owner = None
        if owner is not None:
            for where in ("_parameters",) if parameter else ("_buffers", "__dict__", "_parameters"):
                table = getattr(owner, where, None)
                if isinstance(table, dict) and isinstance(table.get(attr), torch.Tensor):
                    return table, attr
        if parameter:
            return _Lookup(self.model.get_parameter), target
        if target in self.exported.constants:  # made in forward, or no module attribute
            return self.exported.constants, target
        return _Lookup(self.state_tensor), target

    def refresh(self) -> None:
        """Find every state tensor again (done by itself after a submodule is set anywhere)."""
        self._resolve_state()
        self._watch_holders = {n: self._holder(n, parameter=False) for n, *_ in self.watched}

    def state_inputs(self) -> list[Any]:
        """Parameters, buffers and constants, in placeholder order, read from the model now."""
        if self._structure != _STRUCTURE[0]:  # a submodule was set somewhere (a swap?)
            self.refresh()
        try:
            return [table[key] for table, key in self._holders]
        except KeyError:  # an attribute deleted or moved since: find them again
            self.refresh()
            return [table[key] for table, key in self._holders]

    def flatten(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """The user's call arguments as the graph's user-input placeholders. Arguments passed
        by keyword that the example passed by position (`opt(x=x)`, Hugging Face's
        `model(input_ids=..., attention_mask=...)`) are bound to forward's signature first."""
        if (
            not kwargs
            and len(args) == self._plain_arity
            and all(type(a) in _LEAF_TYPES for a in args)
        ):
            return list(args)
        flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
        expected = self.in_spec
        if expected is None or spec == expected:
            return flat
        if kwargs:
            try:
                bound = inspect.signature(self.model.forward).bind(*args, **kwargs)
                flat, spec = pytree.tree_flatten((bound.args, bound.kwargs))
            except (TypeError, ValueError):
                pass  # not a call forward takes: said below
        if spec != expected:
            raise FactError(
                f"the optimized {type(self.model).__name__} was built for calls like "
                f"forward{_call_shape(expected)}, as in the example; got "
                f"forward{_call_shape(spec)}. Optimize it again with such an example"
            )
        return flat

    def inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        return self.state_inputs() + self.flatten(args, kwargs)

    def unflatten(self, flat_outputs: Sequence[Any]) -> Any:
        return pytree.tree_unflatten(list(flat_outputs), self.out_spec)

    def capture(self, flat_inputs: Sequence[Any]) -> dict[str, Any]:
        """Run the original graph and keep every node's value, by node name: the value it had
        when computed, also where a later in-place op (`y += x`, timm's LayerScale) writes to
        it or to a view of it (those values are copied before the write)."""
        values: dict[str, Any] = {}

        class Recorder(fx.Interpreter):
            def run_node(self, n: fx.Node) -> Any:
                storages = {
                    self.env[w].untyped_storage().data_ptr()
                    for w in written_args(n)
                    if isinstance(w, fx.Node) and isinstance(self.env.get(w), torch.Tensor)
                }
                for name, value in list(values.items()) if storages else []:
                    if (
                        isinstance(value, torch.Tensor)
                        and value.untyped_storage().data_ptr() in storages
                    ):
                        values[name] = value.clone()
                out = super().run_node(n)
                values[n.name] = out
                return out

        with torch.no_grad():
            Recorder(self.graph_module).run(*flat_inputs)
        return values

    def copy_graph(self) -> fx.Graph:
        """A copy of the exported graph whose nodes keep their names, which the plan uses: a
        copy through FX renames a node named like a Python builtin (nn.Sequential's `input`
        becomes `input_1`). Names set as torch.export sets them; the code FX generates still
        renames what it must."""
        graph = copy.deepcopy(self.graph_module.graph)
        for old, new in zip(self.graph_module.graph.nodes, graph.nodes, strict=True):
            new.name = old.name
        return graph

    def module(self, graph: fx.Graph) -> fx.GraphModule:
        return fx.GraphModule(self.graph_module, graph)


#: Bumped whenever any module in the process sets a submodule (nn.Module's global registration
#: hook): a Program then finds its state tensors again, in case one of its submodules was
#: replaced (a LoRA or quantized layer swapped in).
_STRUCTURE = [0]
_STRUCTURE_HOOK: list[Any] = []


def _watch_structure() -> None:
    if not _STRUCTURE_HOOK:
        register = torch.nn.modules.module.register_module_module_registration_hook
        _STRUCTURE_HOOK.append(register(_structure_changed))


def _structure_changed(module: nn.Module, name: str, submodule: Any) -> None:
    _STRUCTURE[0] += 1


#: Argument types that are pytree leaves (a call made of them alone flattens to itself)
_LEAF_TYPES = frozenset(
    {torch.Tensor, torch.nn.Parameter, int, float, bool, complex, str, type(None)}
)


class _Lookup:
    """A getter seen as a mapping: the state holder of a tensor that no module dict holds."""

    def __init__(self, get: Callable[[str], Any]):
        self.get_value = get

    def __getitem__(self, key: str) -> Any:
        return self.get_value(key)


def check_inference(name: str, program: torch.export.ExportedProgram) -> None:
    """FactError unless the exported module is one FACT composes: inference without side effects
    (no state it writes, no random numbers). optimize and the planning commands (discover,
    explain, realize of a problem file) refuse the same modules with the same words."""
    sig = program.graph_signature
    extra = [s for s in sig.output_specs if s.kind != OutputKind.USER_OUTPUT]
    if extra:
        kinds = sorted({s.kind.name.lower() for s in extra})
        raise FactError(
            f"{name} mutates its own state while it runs ({', '.join(kinds)}); "
            "FACT composes inference modules without side effects (put the model in eval() "
            "mode, or keep this module eager)"
        )
    written = mutated_inputs(program)
    if written:
        raise FactError(
            f"{name} writes to {', '.join(written)} while it runs; FACT "
            "composes inference modules without side effects (keep this module eager, or "
            "move the update out of forward)"
        )
    random = random_nodes(program)
    if random:
        raise FactError(
            f"{name} draws random numbers while it runs (nodes "
            f"{', '.join(random)}: active dropout?); FACT optimizes inference, so call "
            "model.eval() first"
        )


def mutated_inputs(program: torch.export.ExportedProgram) -> list[str]:
    """Placeholders (parameters, buffers, inputs) that an in-place op of the graph writes,
    directly or through a view, as 'kind target' strings."""
    specs = {s.arg.name: s for s in program.graph_signature.input_specs}
    found: list[str] = []
    for n in program.graph_module.graph.nodes:
        for value in written_args(n):
            base = _view_base(value)
            if isinstance(base, fx.Node) and base.name in specs:
                spec = specs[base.name]
                what = f"{spec.kind.name.lower()} {spec.target or base.name}"
                if what not in found:
                    found.append(what)
    return found


def random_nodes(program: torch.export.ExportedProgram) -> list[str]:
    """Nodes whose result is random: dropout in training mode (also an SDPA call's
    dropout_p), rand*, bernoulli."""
    aten = torch.ops.aten
    found = []
    for n in program.graph_module.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is aten.dropout.default:
            p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.5)
            train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train", True)
            if train and p:
                found.append(n.name)
        elif n.target is aten.scaled_dot_product_attention.default:
            p = n.args[4] if len(n.args) > 4 else n.kwargs.get("dropout_p", 0.0)
            if p:
                found.append(n.name)
        elif is_random_op(n.target):
            found.append(n.name)
    return found


def written_args(n: fx.Node) -> list[Any]:
    """The arguments an op writes to (in-place ops, out= arguments), as given to the node."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return []
    return [
        n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
        for i, arg in enumerate(n.target._schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    ]


def _call_shape(spec: pytree.TreeSpec) -> str:
    """A call's argument structure for a message: `(x, [x, x], mask=x)`, x for each value."""
    args, kwargs = pytree.tree_unflatten(["x"] * spec.num_leaves, spec)

    def shape(v: Any) -> str:
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(shape(i) for i in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k!r}: {shape(i)}" for k, i in v.items()) + "}"
        return str(v)

    parts = [shape(a) for a in args] + [f"{k}={shape(v)}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _view_base(value: Any) -> Any:
    """Follow view ops (outputs that alias their first input) back to the viewed node."""
    while isinstance(value, fx.Node) and value.op == "call_function":
        target = value.target
        if not isinstance(target, torch._ops.OpOverload) or not target._schema.returns:
            break
        ret = target._schema.returns[0].alias_info
        first = target._schema.arguments[0].alias_info if target._schema.arguments else None
        if ret is None or first is None or ret.is_write or not value.args:
            break
        value = value.args[0]
    return value


# ---------------------------------------------------------------------------------------------
# Graph surgery


def pattern_outputs(pattern: Mapping[str, Any]) -> list[str]:
    """The plan names of the nodes a pattern produces for the rest of the graph: a horizontal
    GEMM's parts (its linear layers reading one input, in part order), each read on its own;
    a pattern's `attrs.outputs` where it has them (row statistics: mean and rstd); otherwise
    its one output."""
    attrs = pattern.get("attrs") or {}
    if pattern.get("family") == "horizontal_gemm":
        parts = attrs.get("parts") or pattern.get("anchors") or []
        if parts:
            return [str(name) for name in parts]
    if attrs.get("outputs"):  # several values of one kernel (a norm's mean and rstd)
        return [str(name) for name in attrs["outputs"]]
    return [str(pattern.get("output", ""))]


@dataclass
class Region:
    """A pattern's nodes in one graph: where it reads from and what it produces."""

    nodes: list[fx.Node]  # in graph order
    inputs: list[fx.Node]  # nodes outside the region that it reads, in first-use order
    output: fx.Node  # the first of `outputs`
    names: Mapping[str, fx.Node]  # plan node names (and aliases) -> nodes of this graph
    outputs: list[fx.Node]  # what it produces (pattern_outputs), in order: [output] mostly

    def input(self, name: str) -> fx.Node:
        """The region's input the plan calls `name`."""
        node = self.names.get(name)
        if node is None or node not in self.inputs:
            raise FactError(f"{name!r} is not an input of the pattern ending at {self.output.name}")
        return node


def region(
    graph: fx.Graph, pattern: Mapping[str, Any], aliases: Mapping[str, fx.Node] | None = None
) -> Region:
    """Locate a plan pattern's nodes; FactError when the plan and the graph disagree.
    `aliases` names the nodes that replaced earlier patterns' outputs (by the old name)."""
    by_name = {**(aliases or {}), **{n.name: n for n in graph.nodes}}
    names = list(pattern.get("nodes") or [])
    missing = [name for name in names if name not in by_name]
    if missing:
        raise FactError(f"pattern nodes {missing} are not in the graph (a stale plan?)")
    members = {by_name[name] for name in names}
    outputs = [by_name.get(name) for name in pattern_outputs(pattern)]
    for name, output in zip(pattern_outputs(pattern), outputs, strict=True):
        if output not in members:
            raise FactError(f"pattern output {name!r} is not one of its nodes")
    ordered = [n for n in graph.nodes if n in members]
    escaping = [
        n.name
        for n in ordered
        if n not in outputs and any(u not in members and not is_assert(u) for u in n.users)
    ]
    if escaping:
        raise FactError(
            f"pattern {pattern.get('signature')}: nodes {escaping} are also read outside the "
            "pattern, so it cannot be replaced as a whole"
        )
    inputs: list[fx.Node] = []
    for n in ordered:
        for arg in n.all_input_nodes:
            if arg not in members and arg not in inputs:
                inputs.append(arg)
    return Region(ordered, inputs, outputs[0], by_name, outputs)


def is_assert(n: fx.Node) -> bool:
    """A metadata assertion torch.export leaves beside casts (aten._assert_tensor_metadata on
    `x.float()`'s input, ...): no value, no users. One on a node inside a pattern does not keep
    the pattern from being replaced; it goes with the node it checks."""
    target = n.target
    return (
        n.op == "call_function"
        and not n.users
        and isinstance(target, torch._ops.OpOverload)
        and target.name().split("::")[-1].startswith("_assert")
    )


#: emit(graph, region, pattern) -> the node that replaces region.output (created before it); for
#: a pattern with several outputs, a node whose value is a tuple or list of them, in
#: region.outputs order (created before the first of them)
Emitter = Callable[[fx.Graph, Region, Mapping[str, Any]], fx.Node]

_KEPT_META = ("val", "tensor_meta")


def replace(
    graph: fx.Graph,
    pattern: Mapping[str, Any],
    emit: Emitter,
    aliases: dict[str, fx.Node] | None = None,
) -> fx.Node:
    """Swap the pattern's nodes for what `emit` builds; nodes left without users are removed
    (views the new node still reads stay). With `aliases`, the new node is recorded under the
    old output's name, so later patterns that read that output still find it. A pattern with
    several outputs (pattern_outputs) gets one getitem of emit's node per output, each taking
    that output's place and name in `aliases`; the node yielding them all is returned."""
    reg = region(graph, pattern, aliases)
    if len(reg.outputs) == 1:
        with graph.inserting_before(reg.output):
            new = emit(graph, reg, pattern)
        new.meta.update({k: v for k, v in reg.output.meta.items() if k in _KEPT_META})
        reg.output.replace_all_uses_with(new)
        if aliases is not None:
            aliases[str(pattern.get("output"))] = new
    else:
        new = _replace_outputs(graph, reg, pattern, emit, aliases)
    for n in reversed(reg.nodes):
        if n.users and all(is_assert(u) for u in n.users):
            for u in list(n.users):
                graph.erase_node(u)
        if not n.users:
            graph.erase_node(n)
    return new


def _replace_outputs(
    graph: fx.Graph,
    reg: Region,
    pattern: Mapping[str, Any],
    emit: Emitter,
    aliases: dict[str, fx.Node] | None,
) -> fx.Node:
    """replace() for several outputs: emit's node goes before the first of them (everything
    the region reads must come before that), then one getitem per output takes its uses."""
    first = next(n for n in reg.nodes if n in reg.outputs)
    before = set(itertools.takewhile(lambda n: n is not first, graph.nodes))
    late = [n for n in reg.inputs if n not in before]
    movable = _movable_before(late, before, set(reg.nodes))
    if movable is None:
        raise FactError(
            f"pattern {pattern.get('signature')}: it reads {[n.name for n in late]}, computed "
            f"after its first output {first.name}, so one node cannot produce all its outputs "
            "there"
        )
    for n in movable:  # views or work on weights (w.t(), w[:, a:b]) the later parts read
        first.prepend(n)
    with graph.inserting_before(first):
        new = emit(graph, reg, pattern)
        items = [graph.call_function(operator.getitem, (new, i)) for i in range(len(reg.outputs))]
    vals = [o.meta.get("val") for o in reg.outputs]
    if all(isinstance(v, torch.Tensor) for v in vals):
        new.meta["val"] = vals  # as FX records an op returning Tensor[]
    for name, old, item in zip(pattern_outputs(pattern), reg.outputs, items, strict=True):
        item.meta.update({k: v for k, v in old.meta.items() if k in _KEPT_META})
        old.replace_all_uses_with(item)
        if aliases is not None:
            aliases[name] = item
    return new


def _movable_before(
    late: Sequence[fx.Node], before: set[fx.Node], region_nodes: set[fx.Node]
) -> list[fx.Node] | None:
    """The nodes to move up for `late` to come before the region's first output, in graph
    order: `late` and what they read that is not before it yet. None when that would move
    a node of the region or one that writes or draws random numbers, or where anything from
    the region's first output to its last node writes in place."""
    todo, found = list(late), set()
    while todo:
        n = todo.pop()
        if n in before or n in found:
            continue
        if n in region_nodes or n.op != "call_function" or is_random_op(n.target):
            return None  # (a write among them the scan below refuses)
        found.add(n)
        todo.extend(n.all_input_nodes)
    if not found:
        return []
    # An in-place write anywhere from the first output to the region's last node could change
    # what a moved node reads or what the region reads of it: refuse then.
    moved, started, left = [], False, set(region_nodes)
    for n in late[0].graph.nodes:
        started = started or n not in before
        if not started:
            continue
        if written_args(n):
            return None
        if n in found:
            moved.append(n)
        left.discard(n)
        if not left:
            break
    return moved


def subgraph(
    graph: fx.Graph, pattern: Mapping[str, Any]
) -> tuple[fx.Graph, list[str], dict[str, fx.Node]]:
    """A standalone graph of one pattern: placeholders for what it reads, its nodes, its output
    (a tuple of its outputs when it has several).
    Returns (graph, names of the read nodes in placeholder order, aliases): FX may rename a
    placeholder (`input` becomes `input_1`), so aliases maps the plan's names to them."""
    reg = region(graph, pattern)
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    aliases: dict[str, fx.Node] = {}
    for n in reg.inputs:
        p = sub.placeholder(n.name)
        p.meta.update(n.meta)
        env[n] = aliases[n.name] = p
    for n in reg.nodes:
        env[n] = sub.node_copy(n, lambda a: env[a])
    outs = [env[n] for n in reg.outputs]
    sub.output(outs[0] if len(outs) == 1 else tuple(outs))
    return sub, [n.name for n in reg.inputs], aliases
