"""The tracer's output against docs/graph-format.md, on small modules and the MiniGPT example."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from fact.errors import FactError, GraphError, TraceError
from fact.problem import import_problem_module
from fact.tracer import (
    dumps_graph,
    export_module,
    graph_from_program,
    load_graph,
    save_graph,
    trace,
    value_facts,
)
from helpers import EXAMPLES, node_named, node_refs, nodes_with_op

# --- MiniGPT ---------------------------------------------------------------------------------


def test_minigpt_header(minigpt):
    _, _, graph = minigpt
    assert graph["format"] == "fact.graph"
    assert graph["version"] == 1
    assert graph["source"].endswith("examples/minigpt_block.py")
    assert graph["model"] == "Model"
    assert graph["dtype"] == "bf16"
    assert graph["float32_matmul_precision"] in ("highest", "high", "medium")
    assert graph["torch_version"] == str(torch.__version__)
    assert graph["outputs"] == [{"node": graph["nodes"][-1]["name"]}]


def test_minigpt_keeps_every_fx_node_in_order(minigpt):
    _, program, graph = minigpt
    fx_names = [n.name for n in program.graph.nodes if n.op != "output"]
    assert [n["name"] for n in graph["nodes"]] == fx_names
    assert len(graph["nodes"]) == len(program.graph.nodes) - 1  # `output` is graph["outputs"]


def test_minigpt_placeholders(minigpt):
    problem, _, graph = minigpt
    placeholders = [n for n in graph["nodes"] if n["op"] == "placeholder"]
    params = {n["target"] for n in placeholders if n["kind"] == "parameter"}
    assert params == {name for name, _ in problem.model.named_parameters()}
    assert [n["target"] for n in placeholders if n["kind"] == "buffer"] == ["attn.bias"]
    (x,) = [n for n in placeholders if n["kind"] == "input"]
    assert x["target"] == "x"
    assert x["outputs"] == [
        {"dtype": "bf16", "shape": [128, 512, 768], "strides": [512 * 768, 768, 1]}
    ]
    weight = node_named(graph, "p_attn_c_attn_weight")
    assert weight["target"] == "attn.c_attn.weight"
    assert weight["outputs"] == [{"dtype": "bf16", "shape": [2304, 768], "strides": [768, 1]}]
    assert all("args" not in n and "module" not in n for n in placeholders)


def test_minigpt_tril_fact_on_mask_buffer(minigpt):
    _, _, graph = minigpt
    mask = node_named(graph, "b_attn_bias")
    assert mask["kind"] == "buffer"
    assert mask["facts"] == {"tril": True}  # ones on/below the diagonal, so not additive
    assert all("facts" not in n for n in graph["nodes"] if n["kind"] == "parameter")


def test_minigpt_calls(minigpt):
    _, _, graph = minigpt
    linear = nodes_with_op(graph, "aten.linear.default")
    assert [n["module"] for n in linear] == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    first = linear[0]
    assert first["kind"] == "call"
    assert first["args"] == [
        {"node": "layer_norm"},
        {"node": "p_attn_c_attn_weight"},
        {"node": "p_attn_c_attn_bias"},
    ]
    assert first["kwargs"] == {}
    assert first["outputs"] == [
        {"dtype": "bf16", "shape": [128, 512, 2304], "strides": [512 * 2304, 2304, 1]}
    ]
    assert node_named(graph, "layer_norm")["module"] == "ln_1"
    assert node_named(graph, "mul_1")["module"] == "mlp.act"
    assert graph["nodes"][-1]["module"] == ""  # the last residual add is the top module's
    # the -inf fill of the causal mask survives JSON
    (fill,) = nodes_with_op(graph, "aten.masked_fill.Scalar")
    assert fill["args"][2] == {"float": "-inf"}


def test_minigpt_split_and_getitem(minigpt):
    _, _, graph = minigpt
    (split,) = nodes_with_op(graph, "aten.split.Tensor")
    assert split["args"] == [{"node": "linear"}, 768, 2]
    part = {"dtype": "bf16", "shape": [128, 512, 768], "strides": [512 * 2304, 2304, 1]}
    assert split["outputs"] == [part, part, part]
    items = [n for n in nodes_with_op(graph, "getitem") if n["args"][0] == {"node": split["name"]}]
    assert [n["args"][1] for n in items] == [0, 1, 2]
    assert all(n["outputs"] == [part] for n in items)


def test_minigpt_transpose_strides(minigpt):
    _, _, graph = minigpt
    heads = [n for n in nodes_with_op(graph, "aten.transpose.int") if n["args"][1:] == [1, 2]]
    # q, k, v: views of the fused qkv projection, so the stride of T is 3 * 768
    assert heads[0]["outputs"][0]["shape"] == [128, 8, 512, 96]
    assert heads[0]["outputs"][0]["strides"] == [512 * 2304, 96, 2304, 1]
    (kt,) = [n for n in nodes_with_op(graph, "aten.transpose.int") if n["args"][1:] == [-2, -1]]
    assert kt["outputs"][0]["strides"] == [512 * 2304, 96, 1, 2304]


def test_every_argument_refers_to_an_earlier_node(minigpt):
    _, _, graph = minigpt
    seen: set[str] = set()
    for node in graph["nodes"]:
        for ref in node_refs(node.get("args", [])):
            assert ref in seen, f"{node['name']} uses {ref} before it is defined"
        for ref in node_refs(list(node.get("kwargs", {}).values())):
            assert ref in seen
        seen.add(node["name"])
    assert all(ref in seen for ref in node_refs(graph["outputs"]))


def test_save_and_load_round_trip(minigpt, tmp_path):
    _, _, graph = minigpt
    path = save_graph(graph, tmp_path / "minigpt.json")
    assert load_graph(path) == graph
    text = path.read_text()
    assert json.loads(text) == graph
    assert "Infinity" not in text and "NaN" not in text
    # one node per line, so graphs diff and grep well
    assert sum(1 for line in text.splitlines() if line.startswith('    {"name":')) == len(
        graph["nodes"]
    )


# --- small modules ---------------------------------------------------------------------------


class Layouts(nn.Module):
    def forward(self, x):
        return (
            x.transpose(0, 1),
            x.permute(2, 0, 1),
            x[:, :1].expand(2, 5, 4),
            x.transpose(1, 2).contiguous(),
            x[:, ::2],
        )


def test_strides_match_eager():
    x = torch.randn(2, 3, 4)
    graph = trace(Layouts(), [x])
    eager = Layouts()(x)
    for ref, out in zip(graph["outputs"], eager, strict=True):
        (produced,) = node_named(graph, ref["node"])["outputs"]
        assert produced["shape"] == list(out.shape)
        assert produced["strides"] == list(out.stride())


class Masks(nn.Module):
    def __init__(self, n=6):
        super().__init__()
        upper = torch.ones(n, n, dtype=torch.bool).triu(1)
        self.register_buffer("additive", torch.zeros(n, n).masked_fill(upper, float("-inf")))
        self.register_buffer("keep", ~upper)  # a bool tril mask
        self.register_buffer("tril_ones", torch.ones(1, n, n).tril())
        self.register_buffer("triu_ones", torch.ones(n, n).triu())
        self.register_buffer("random", torch.randn(n, n))
        self.register_buffer("not_square", torch.ones(n, n + 1).tril())
        self.register_buffer("scale", torch.tensor(0.125), persistent=False)
        self.register_buffer("neg_inf", torch.tensor([float("-inf")]))
        self.offset = torch.tensor(3)  # a plain tensor attribute: a lifted constant

    def forward(self, x):
        y = x + self.additive
        y = y.masked_fill(~self.keep, 0.0) * self.tril_ones + self.triu_ones + self.random
        y = y[..., :1] + self.not_square * self.scale + self.neg_inf
        return y + self.offset


def test_value_facts_on_buffers_and_constants():
    graph = trace(Masks(), [torch.randn(6, 6)])
    facts = {n["target"]: n.get("facts") for n in graph["nodes"] if n["op"] == "placeholder"}
    assert facts["additive"] == {"causal_additive": True}
    assert facts["keep"] == {"tril": True}
    assert facts["tril_ones"] == {"tril": True}
    assert facts["triu_ones"] is None
    assert facts["random"] is None
    assert facts["not_square"] is None
    assert facts["scale"] == {"value": 0.125}
    assert facts["neg_inf"] == {"value": {"float": "-inf"}}
    assert facts["offset"] == {"value": 3}
    kinds = {n["target"]: n["kind"] for n in graph["nodes"] if n["op"] == "placeholder"}
    assert kinds["scale"] == "buffer"  # non-persistent buffers are still buffers
    assert kinds["offset"] == "constant"
    assert kinds["x"] == "input"


def test_value_facts_edge_cases():
    assert value_facts(torch.ones(1, 1)) == {"tril": True, "value": 1.0}
    assert value_facts(torch.zeros(0, 0)) == {}
    assert value_facts(torch.tensor(float("nan"))) == {"value": {"float": "nan"}}
    assert value_facts(torch.ones(4, 4, device="meta")) == {}
    batched = torch.ones(3, 4, 4).tril()
    batched[1, 0, 3] = 1.0  # one slice is not lower-triangular
    assert value_facts(batched) == {}


class Opaque(nn.Module):
    def forward(self, x):
        values, indices = torch.ops.aten.sort(x, -1)
        return torch.cumsum(values, 0), indices


def test_unknown_ops_are_kept_as_nodes():
    x = torch.randn(3, 5)
    program = export_module(Opaque(), [x])
    graph = graph_from_program(program, source="test", model="Opaque")
    assert len(graph["nodes"]) == len(program.graph.nodes) - 1
    (sort,) = nodes_with_op(graph, "aten.sort.default")
    assert sort["outputs"] == [
        {"dtype": "f32", "shape": [3, 5], "strides": [5, 1]},
        {"dtype": "i64", "shape": [3, 5], "strides": [5, 1]},
    ]
    (cumsum,) = nodes_with_op(graph, "aten.cumsum.default")
    assert cumsum["args"][1] == 0
    items = nodes_with_op(graph, "getitem")
    assert [n["args"] for n in items] == [[{"node": "sort"}, 0], [{"node": "sort"}, 1]]
    assert len(graph["outputs"]) == 2


class Branch(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))


def test_control_flow_op_is_kept_opaque():
    program = export_module(Branch(), [torch.randn(3)])
    graph = graph_from_program(program, source="test", model="Branch")
    assert len(graph["nodes"]) == len(program.graph.nodes) - 1
    branches = nodes_with_op(graph, "get_attr")
    assert [n["kind"] for n in branches] == ["call", "call"]
    assert [n["target"] for n in branches] == ["true_graph_0", "false_graph_0"]
    (cond,) = nodes_with_op(graph, "higher_order.cond")
    assert cond["args"][1:] == [
        {"node": "true_graph_0"},
        {"node": "false_graph_0"},
        [{"node": "x"}],
    ]
    assert cond["outputs"] == [{"dtype": "f32", "shape": [3], "strides": [1]}]


class Dynamic(nn.Module):
    def forward(self, x):
        n = x.shape[0]
        return x.reshape(n * 2, -1) + 1.0


def test_dynamic_shapes_become_string_dims():
    batch = torch.export.Dim("batch")
    graph = trace(Dynamic(), [torch.randn(4, 6)], dynamic_shapes=({0: batch},))
    x = node_named(graph, "x")
    (dim, width) = x["outputs"][0]["shape"]
    assert isinstance(dim, str) and width == 6
    sizes = nodes_with_op(graph, "aten.sym_size.int")
    assert sizes and sizes[0]["outputs"] == [{"value": {"symbol": dim}}]
    (mul,) = nodes_with_op(graph, "python.operator.mul")  # a Python callable, not an ATen op
    assert mul["outputs"] == [{"value": {"symbol": f"2*{dim}"}}]
    (reshape,) = nodes_with_op(graph, "aten.reshape.default")
    assert reshape["args"][1] == [{"node": mul["name"]}, -1]
    assert reshape["outputs"][0]["shape"] == [f"2*{dim}", 3]


class Enums(nn.Module):
    def forward(self, x, ids):
        y = x.to(torch.float16).float()
        z = torch.zeros(2, 3, dtype=torch.bfloat16, device=x.device)
        return y * 2.0 + 3, z, ids + 1, torch.clamp(x, min=-math.inf, max=1.5)


def test_argument_encoding():
    graph = trace(Enums(), [torch.randn(2, 3), torch.arange(3)])
    to = nodes_with_op(graph, "aten.to.dtype")[0]
    assert to["args"][1] == {"dtype": "f16"}
    (zeros,) = nodes_with_op(graph, "aten.zeros.default")
    assert zeros["args"] == [[2, 3]]
    assert zeros["kwargs"]["dtype"] == {"dtype": "bf16"}
    assert zeros["kwargs"]["device"] == {"device": "cpu"}
    (mul,) = nodes_with_op(graph, "aten.mul.Tensor")
    assert mul["args"][1] == 2.0 and isinstance(mul["args"][1], float)
    assert '"args": [{"node": "to_1"}, 2.0]' in dumps_graph(graph)  # a float keeps its .0
    ids = node_named(graph, "ids")
    assert ids["outputs"][0]["dtype"] == "i64"
    (clamp,) = nodes_with_op(graph, "aten.clamp.default")
    assert clamp["args"][1:] == [{"float": "-inf"}, 1.5]
    assert nodes_with_op(graph, "aten._assert_tensor_metadata.default")[0]["outputs"] == []


def test_dtype_cast_and_graph_dtype():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    graph = trace(model, [torch.randn(2, 4)], dtype="fp16")
    assert graph["dtype"] == "f16"
    assert all(
        n["outputs"][0]["dtype"] == "f16" for n in graph["nodes"] if n["kind"] == "parameter"
    )
    assert node_named(graph, "linear")["module"] == "0"
    assert graph["source"] == "torch.nn.modules.container.Sequential"
    assert graph["model"] == "Sequential"

    mixed = trace(nn.Linear(4, 4).to(torch.bfloat16), [torch.randn(2, 4, dtype=torch.float16)])
    assert mixed["dtype"] == "mixed"
    no_floats = trace(Integer(), [torch.arange(4)])
    assert no_floats["dtype"] == "none"


class Integer(nn.Module):
    def forward(self, ids):
        return ids * 2


def test_llama_block_small():
    module = import_problem_module(EXAMPLES / "llama3_block.py")
    model = module.Model(dim=64, n_heads=4, n_kv_heads=2, ffn=128, max_seq=16).eval()
    graph = trace(model, [torch.randn(2, 16, 64)], dtype="bf16", source="llama3_block.py")
    (sdpa,) = nodes_with_op(graph, "aten.scaled_dot_product_attention.default")
    assert sdpa["module"] == "attention"
    assert sdpa["kwargs"] == {"enable_gqa": True}
    assert sdpa["args"][3:] == [None, 0.0, True]
    buffers = {n["target"]: n for n in graph["nodes"] if n["kind"] == "buffer"}
    assert set(buffers) == {"attention.cos", "attention.sin"}
    assert all("facts" not in b for b in buffers.values())
    assert [n["module"] for n in nodes_with_op(graph, "aten.linear.default")] == [
        "attention.wq",
        "attention.wk",
        "attention.wv",
        "attention.wo",
        "feed_forward.w1",
        "feed_forward.w3",
        "feed_forward.w2",
    ]
    (cat, _) = nodes_with_op(graph, "aten.cat.default")
    assert cat["args"][0] == [{"node": "neg"}, {"node": "slice_3"}]


# --- errors ----------------------------------------------------------------------------------


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_data_dependent_control_flow_is_a_trace_error(capfd):
    with pytest.raises(TraceError) as caught:
        trace(DataDependent(), [torch.randn(4)], source="my_problem.py")
    message = str(caught.value)
    assert message.startswith("torch.export could not trace DataDependent (my_problem.py)")
    assert "data-dependent" in message
    assert "if x.sum() > 0:" in message  # the user's own line
    assert "hint:" in message and "torch.where" in message
    assert "Traceback" not in capfd.readouterr().err  # torch's chatter is kept off stderr


def test_trace_rejects_non_modules():
    with pytest.raises(FactError, match="needs an nn.Module"):
        trace(lambda x: x, [torch.randn(2)])


def test_load_graph_errors(tmp_path):
    with pytest.raises(GraphError, match="not found"):
        load_graph(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(GraphError, match=r"bad\.json is not valid JSON \(line 1"):
        load_graph(bad)
    other = tmp_path / "other.json"
    other.write_text('{"format": "onnx"}')
    with pytest.raises(GraphError, match="not a FACT graph"):
        load_graph(other)
    future = tmp_path / "future.json"
    future.write_text('{"format": "fact.graph", "version": 99, "nodes": []}')
    with pytest.raises(GraphError, match="version 99"):
        load_graph(future)
    with pytest.raises(GraphError, match="cannot write"):
        save_graph({"nodes": []}, tmp_path / "no" / "such" / "dir.json")
