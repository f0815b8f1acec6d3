"""Stage 1 end to end: trace a module, run the engine, assert the exact patterns it plans.

Each case names the set of (family, epilogue) pairs FACT must find, in fp32 and in bf16, and every
test checks that nothing was silently dropped: each call node of the traced graph is in exactly
one place — a pattern, the PyTorch remainder, or the kernel-free views.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import EXAMPLES, REPO

DTYPES = ["fp32", "bf16"]


def plan_for(module: nn.Module, inputs, dtype: str, tmp_path: Path) -> tuple[dict, dict]:
    """(plan, graph) for a module, through the same path `fact discover` takes (with the
    rewrites fact.optimize gives the program for sm90: fact.rewrites)."""
    from fact.engine import engine_json
    from fact.tracer import save_graph, trace

    graph = trace(module.eval(), inputs, dtype=dtype, arch="sm90")
    path = save_graph(graph, tmp_path / "graph.json")
    return engine_json("discover", path), graph


def found(plan: dict) -> Counter:
    return Counter((p["family"], tuple(p["epilogue"])) for p in plan["patterns"])


def assert_nothing_dropped(plan: dict, graph: dict) -> None:
    calls = {n["name"] for n in graph["nodes"] if n["kind"] == "call"}
    placed = Counter()
    for p in plan["patterns"]:
        placed.update(p["nodes"])
    placed.update(n["name"] for n in plan["pytorch_nodes"])
    placed.update(n["name"] for n in plan["free_nodes"])
    assert set(placed) == calls, (
        f"unaccounted: {calls - set(placed)}; unknown: {set(placed) - calls}"
    )
    assert max(placed.values()) == 1, f"placed twice: {[k for k, v in placed.items() if v > 1]}"
    s = plan["summary"]
    assert s["covered_compute_nodes"] + len(plan["pytorch_nodes"]) == s["compute_nodes"]


def only(plan: dict, family: str) -> dict:
    matches = [p for p in plan["patterns"] if p["family"] == family]
    assert len(matches) == 1, f"expected one {family} pattern, got {found(plan)}"
    return matches[0]


# ---------------------------------------------------------------------------------------------
# Transformer blocks from shared/BENCHMARKS.md


def load_example(name: str, **kwargs):
    from fact.problem import import_problem_module

    module = import_problem_module(EXAMPLES / name)
    return module.Model(**kwargs), module.get_inputs()


@pytest.mark.parametrize("dtype", DTYPES)
def test_minigpt_block(engine_available, tmp_path, dtype):
    model, inputs = load_example("minigpt_block.py")
    plan, graph = plan_for(model, inputs, dtype, tmp_path)
    assert found(plan) == Counter(
        {
            ("attention", ("scale", "causal_mask", "softmax")): 1,
            ("gemm", ("bias", "gelu_tanh")): 1,
            ("gemm", ("bias", "residual")): 2,
            ("gemm", ("bias",)): 1,
            ("norm", ("weight", "bias")): 2,
        }
    )
    assert plan["pytorch_nodes"] == [] and plan["opaque_nodes"] == []
    assert_nothing_dropped(plan, graph)
    attn = only(plan, "attention")
    assert attn["problem"] == {
        "batch": 128,
        "heads": 8,
        "kv_heads": 8,
        "seq_q": 512,
        "seq_k": 512,
        "head_dim": 96,
        "head_dim_v": 96,
    }
    assert attn["attrs"]["causal"] is True
    assert attn["attrs"]["scale"] == pytest.approx(1 / math.sqrt(96))
    # Q, K and V are read in place from c_attn's output: no copies, strides of the fused layout.
    assert {attn["attrs"][f"{t}_source"] for t in "qkv"} == {"linear"}
    assert attn["attrs"]["q_strides"] == [512 * 2304, 96, 2304, 1]
    assert attn["attrs"]["out_layout"] == "bs(hd)"
    assert {"split", "transpose", "contiguous", "masked_fill", "dropout"} <= set(attn["nodes"])
    mlp = next(p for p in plan["patterns"] if p["epilogue"] == ["bias", "gelu_tanh"])
    assert mlp["problem"] == {"batch": 1, "m": 128 * 512, "n": 3072, "k": 768}
    assert len(mlp["nodes"]) == 9  # linear + the eight ops of the hand-written GELU
    assert mlp["epilogue_expr"]["text"] == "gelu_tanh(acc + p_mlp_c_fc_bias)"
    want = "f32" if dtype == "fp32" else "bf16"
    assert mlp["attrs"]["dtype_a"] == want and mlp["attrs"]["layout_b"] == "col"
    assert plan["patterns"][0]["est_saving_us"] >= plan["patterns"][-1]["est_saving_us"]


# Blocks FACT was not developed against (bench/zoo/): what each plans, and what is left to
# PyTorch and why.
ZOO = {
    "t5": {
        ("norm", ("weight",)): 2,  # T5's RMS norm: x.float() squared, x itself multiplied
        ("attention", ("bias", "softmax")): 1,  # position bias, no scale: SDPA's attn_mask
        ("horizontal_gemm", ()): 1,
        ("gemm", ("relu",)): 1,
        ("gemm", ("residual",)): 2,
    },
    "bert": {
        ("attention", ("scale", "bias", "softmax")): 1,  # the padding mask, made additive
        ("pointwise", ("sub", "mul")): 1,  # (1 - mask) * finfo.min, the bias's own kernel
        ("horizontal_gemm", ("bias",)): 1,
        ("gemm", ("bias", "gelu_erf")): 1,
        ("gemm", ("bias", "residual")): 2,
        ("norm", ("weight", "bias")): 2,
    },
    "neox": {  # x + attn(ln1(x)) + mlp(ln2(x)): one residual add for each projection's tail
        ("gemm", ("bias",)): 1,
        ("gemm", ("bias", "gelu_erf")): 1,
        ("gemm", ("bias", "residual")): 2,
        ("attention", ("scale", "causal_mask", "softmax")): 1,
        ("norm", ("weight", "bias")): 2,
    },
    "gpt2": {  # Hugging Face's eager path: Conv1D as addmm, torch.where(tril, s, finfo.min)
        ("attention", ("scale", "causal_mask", "softmax")): 1,
        ("gemm", ("bias", "gelu_tanh")): 1,
        ("gemm", ("bias", "residual")): 2,
        ("gemm", ("bias",)): 1,
        ("norm", ("weight", "bias")): 2,
    },
    "gpt2_padded": {  # the same with a 0/1 padding mask made additive: a bias under the causal mask
        ("attention", ("scale", "causal_mask", "bias", "softmax")): 1,
        ("pointwise", ("sub", "mul")): 1,  # (1 - mask) * finfo.min
        ("gemm", ("bias", "gelu_tanh")): 1,
        ("gemm", ("bias", "residual")): 2,
        ("gemm", ("bias",)): 1,
        ("norm", ("weight", "bias")): 2,
    },
    "einsum": {  # einsum projections, einsum attention, GEGLU with its bias written out
        ("attention", ("scale", "causal_mask", "softmax")): 1,
        ("gemm", ("bias", "gelu_erf", "mul")): 1,  # the gate half, reading the up half as C
        ("gemm", ("bias",)): 1,  # the up half
        ("gemm", ("residual",)): 2,
        ("gemm", ()): 1,
        ("norm", ("weight", "bias")): 2,
    },
    "phi3": {  # fused QKV cut by slices; fused gate/up cut by chunk, split into a gated MLP
        ("norm", ("weight",)): 2,
        ("gated_mlp", ("silu", "mul")): 1,
        ("pointwise", ("mul", "slice", "slice", "neg", "cat", "mul", "add")): 2,  # RoPE
        ("gemm", ("residual",)): 2,
        ("gemm", ()): 1,
        ("attention", ("scale", "causal_mask", "softmax")): 1,
    },
    "clip": {  # q_proj(x) * scale stays in the q GEMM; heads folded into the batch for bmm
        ("attention", ("softmax",)): 1,
        ("gemm", ("bias", "scale", "sigmoid", "mul")): 1,  # quick_gelu
        ("gemm", ("bias", "scale")): 1,
        ("gemm", ("bias", "residual")): 2,
        ("horizontal_gemm", ("bias",)): 1,
        ("norm", ("weight", "bias")): 2,
    },
    "gemma": {  # MQA widened by repeat_kv, head dim 256; GeGLU; norms cast after (1 + w)
        ("norm", ("weight",)): 2,
        ("gated_mlp", ("gelu_tanh", "mul")): 1,
        ("pointwise", ("mul", "slice", "slice", "neg", "cat", "mul", "add")): 2,  # RoPE
        ("gemm", ("residual",)): 2,
        ("horizontal_gemm", ()): 1,
        ("attention", ("scale", "causal_mask", "softmax")): 1,
    },
    "qwen2": {  # q/k/v projections with biases, GQA widened by repeat_kv
        ("norm", ("weight",)): 2,
        ("gated_mlp", ("silu", "mul")): 1,
        ("pointwise", ("mul", "slice", "slice", "neg", "cat", "mul", "add")): 2,  # RoPE
        ("gemm", ("residual",)): 2,
        ("horizontal_gemm", ("bias",)): 1,
        ("attention", ("scale", "causal_mask", "softmax")): 1,
    },
    "vit": {  # nn.MultiheadAttention's export, its rows in (batch, seq) order (fact.layouts):
        ("gemm", ("bias",)): 1,  # in_proj
        ("gemm", ("bias", "gelu_erf")): 1,
        ("gemm", ("bias", "residual")): 2,  # out_proj + the first residual add; fc2
        ("attention", ("scale", "softmax")): 1,
        ("norm", ("weight", "bias")): 2,
    },
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_block(engine_available, tmp_path, name):
    from fact.problem import import_problem_module

    module = import_problem_module(REPO / "bench" / "zoo" / f"{name}_block.py")
    plan, graph = plan_for(module.Model(), module.get_inputs(), "bf16", tmp_path)
    assert found(plan) == Counter(ZOO[name])
    assert_nothing_dropped(plan, graph)
    left = [n["name"] for n in plan["pytorch_nodes"] if not n.get("once")]
    # Gemma's norm weights, 1 + w.float(), are made from the parameters alone: once, and again
    # when they change
    once = [n["name"] for n in plan["pytorch_nodes"] if n.get("once")]
    assert once == (["to_1", "add_1", "to_5", "add_6"] if name == "gemma" else [])
    # CLIP: the copies that fold the heads into bmm's batch, (b, h, s, d).contiguous(), which
    # the attention reads
    expected_left = {"clip": ["contiguous", "contiguous_1", "contiguous_2"]}
    assert left == expected_left.get(name, [])
    attn = only(plan, "attention")
    if name == "vit":  # Q, K, V read in place from MHA's packed in-projection (fact.layouts)
        assert {attn["attrs"][f"{t}_source"] for t in "qkv"} == {"linear"}
    if "bias" in attn["epilogue"]:
        assert attn["operands"][-1]["role"] == "bias"
    if name == "gemma":  # one KV head read by all eight query heads, in place
        assert (attn["problem"]["heads"], attn["problem"]["kv_heads"]) == (8, 1)
        assert attn["problem"]["head_dim"] == 256
        for norm in (p for p in plan["patterns"] if p["family"] == "norm"):
            assert norm["attrs"]["dtype_out"] == "bf16" and "round_to" not in norm["attrs"]


LLAMA_SMALL = dict(dim=256, n_heads=8, n_kv_heads=2, ffn=512, max_seq=64)


def llama(attention: str, full: bool):
    """The Llama-3 block; `full` uses the benchmark size, else a small one of the same structure."""
    from fact.problem import import_problem_module

    module = import_problem_module(EXAMPLES / "llama3_block.py")
    if full:
        return module.Model(attention=attention), module.get_inputs()
    return module.Model(attention=attention, **LLAMA_SMALL), [torch.randn(2, 64, 256)]


LLAMA_COMMON = {
    ("norm", ("weight",)): 2,
    ("gated_mlp", ("silu", "mul")): 1,
    ("gemm", ("residual",)): 2,
    ("horizontal_gemm", ()): 1,
    ("attention", ("scale", "causal_mask", "softmax")): 1,
    ("pointwise", ("mul", "slice", "slice", "neg", "cat", "mul", "add")): 2,  # RoPE on Q and K
}
ROPE = {"mul_2", "neg", "cat", "mul_3", "add_1", "mul_4", "neg_1", "cat_1", "mul_5", "add_2"}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_llama3_block(engine_available, tmp_path, dtype, attention):
    full = dtype == "bf16" and attention == "sdpa"  # the benchmark shape once; small otherwise
    model, inputs = llama(attention, full)
    plan, graph = plan_for(model, inputs, dtype, tmp_path)
    assert found(plan) == Counter(LLAMA_COMMON)
    assert_nothing_dropped(plan, graph)
    attn = only(plan, "attention")
    heads, kv, seq, dim = (32, 8, 2048, 128) if full else (8, 2, 64, 32)
    # RoPE on Q and K: one pointwise region each, reading the transposed projections in place
    # and writing (b, h, s, d) laid out (b, s, h, d), as eager does; nothing is left to PyTorch.
    assert plan["pytorch_nodes"] == []
    ropes = sorted(
        (p for p in plan["patterns"] if p["family"] == "pointwise"), key=lambda p: p["output"]
    )
    assert ROPE <= {n for p in ropes for n in p["nodes"]}
    assert [p["operands"][0]["node"] for p in ropes] == ["transpose", "transpose_1"]
    batch = attn["problem"]["batch"]
    for p, h in zip(ropes, (heads, kv), strict=True):
        assert [o["role"] for o in p["operands"]] == ["in0", "in1", "in2"]
        assert p["attrs"]["shape"] == [batch, h, seq, dim]
        assert p["attrs"]["strides"] == [seq * h * dim, dim, h * dim, 1]
        assert p["problem"]["cols"] == dim
    assert attn["problem"]["heads"] == heads and attn["problem"]["kv_heads"] == kv
    assert attn["problem"]["seq_q"] == seq and attn["problem"]["head_dim"] == dim
    assert attn["attrs"]["causal"] is True
    assert attn["attrs"]["scale"] == pytest.approx(1 / math.sqrt(dim))
    assert attn["attrs"]["v_source"] == "linear_2"  # V read in place from its projection
    if attention == "manual":
        assert attn["attrs"]["softmax_dtype"] == "f32"
    gated = only(plan, "gated_mlp")
    assert gated["problem"]["n"] == (14336 if full else 512)
    qkv = only(plan, "horizontal_gemm")
    assert qkv["problem"]["n_parts"] == ([4096, 1024, 1024] if full else [256, 64, 64])
    norms = [p for p in plan["patterns"] if p["family"] == "norm"]
    assert all(p["attrs"]["kind"] == "rms_norm" and p["attrs"]["eps"] == 1e-5 for p in norms)


# ---------------------------------------------------------------------------------------------
# Single-op modules: one pattern each, with its exact epilogue


class Lin(nn.Module):
    """x @ W^T + b followed by `tail`."""

    def __init__(self, tail, bias=True, k=64, n=48):
        super().__init__()
        self.fc = nn.Linear(k, n, bias=bias)
        self.tail = tail
        self.register_buffer("vec", torch.randn(n))

    def forward(self, x, other=None):
        return self.tail(self, self.fc(x), x, other)


def hand_gelu_tanh(y):
    return (
        0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))
    )


GEMM_TAILS = {
    "plain": (lambda m, y, x, o: y, ["bias"]),
    "relu": (lambda m, y, x, o: torch.relu(y), ["bias", "relu"]),
    "scale_leaky_relu": (
        lambda m, y, x, o: F.leaky_relu(y * 0.5, 0.2),
        ["bias", "scale", "leaky_relu"],
    ),
    "sub_vector_mul_relu": (
        lambda m, y, x, o: torch.relu((y - m.vec) * 3.0),
        ["bias", "sub", "scale", "relu"],
    ),
    "sigmoid_residual": (lambda m, y, x, o: torch.sigmoid(y) + o, ["bias", "sigmoid", "residual"]),
    "mish": (lambda m, y, x, o: F.mish(y), ["bias", "mish"]),
    "hardtanh_gelu": (lambda m, y, x, o: F.gelu(F.hardtanh(y)), ["bias", "hardtanh", "gelu_erf"]),
    "gelu_tanh_op": (lambda m, y, x, o: F.gelu(y, approximate="tanh"), ["bias", "gelu_tanh"]),
    "gelu_tanh_by_hand": (lambda m, y, x, o: hand_gelu_tanh(y), ["bias", "gelu_tanh"]),
    "gelu_erf_by_hand": (
        lambda m, y, x, o: 0.5 * y * (1 + torch.erf(y / math.sqrt(2))),
        ["bias", "gelu_erf"],
    ),
    "silu_by_hand": (lambda m, y, x, o: y * torch.sigmoid(y), ["bias", "silu"]),
    "swish_op": (lambda m, y, x, o: F.silu(y), ["bias", "silu"]),
    "tanh": (lambda m, y, x, o: torch.tanh(y), ["bias", "tanh"]),
    "clamp_min_max": (lambda m, y, x, o: torch.clamp(y, min=-1.0, max=6.0), ["bias", "clamp"]),
    "max_with_constant": (lambda m, y, x, o: torch.clamp_min(y, 0.25), ["bias", "clamp_min"]),
    "divide_by_column": (
        lambda m, y, x, o: y / (x.abs().sum(-1, keepdim=True) + 1),
        ["bias", "div"],
    ),
    "residual_then_scale": (lambda m, y, x, o: (y + o) / 4.0, ["bias", "residual", "scale"]),
    "log1p_of_abs": (lambda m, y, x, o: torch.log1p(y.abs()), ["bias", "abs", "log1p"]),
    "expm1": (lambda m, y, x, o: torch.expm1(y), ["bias", "expm1"]),
    # in-place forms nobody else sees read as the functional ops
    "in_place_chain": (
        lambda m, y, x, o: F.hardtanh_(y.add_(1.0), -2.0, 2.0).mul_(0.5),
        ["bias", "add", "hardtanh", "scale"],
    ),
    "in_place_relu_residual": (lambda m, y, x, o: y.relu_().add_(o), ["bias", "relu", "residual"]),
    # a vector expanded against the output is read as the vector
    "expand_as_row": (lambda m, y, x, o: y * m.vec.expand_as(y), ["bias", "mul"]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tail", sorted(GEMM_TAILS))
def test_gemm_epilogues(engine_available, tmp_path, dtype, tail):
    fn, steps = GEMM_TAILS[tail]
    x, other = torch.randn(4, 16, 64), torch.randn(4, 16, 48)
    plan, graph = plan_for(Lin(fn), (x, other), dtype, tmp_path)
    gemm = only(plan, "gemm")
    assert gemm["epilogue"] == steps
    assert gemm["problem"] == {"batch": 1, "m": 64, "n": 48, "k": 64}
    assert_nothing_dropped(plan, graph)


class Mm(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.w = nn.Parameter(torch.randn(48, 64))
        self.b = nn.Parameter(torch.randn(48))
        self.op = op

    def forward(self, a, b):
        return self.op(self, a, b)


MATMULS = {
    # name: (forward, inputs, problem, layout_a, layout_b, epilogue)
    "mm_transposed_weight": (
        lambda m, a, b: torch.mm(a, m.w.t()),
        ((32, 64), (1,)),
        (1, 32, 48, 64),
        "row",
        "col",
        [],
    ),
    "addmm": (
        lambda m, a, b: torch.addmm(m.b, a, m.w.t()),
        ((32, 64), (1,)),
        (1, 32, 48, 64),
        "row",
        "col",
        ["bias"],
    ),
    "addmm_alpha_beta": (
        lambda m, a, b: torch.addmm(m.b, a, m.w.t(), beta=0.5, alpha=2.0),
        ((32, 64), (1,)),
        (1, 32, 48, 64),
        "row",
        "col",
        ["scale", "scale", "bias"],
    ),
    "mm_transposed_activation": (
        lambda m, a, b: torch.mm(a.t(), b),
        ((64, 32), (64, 40)),
        (1, 32, 40, 64),
        "col",
        "row",
        [],
    ),
    "bmm": (
        lambda m, a, b: torch.bmm(a, b),
        ((6, 32, 64), (6, 64, 40)),
        (6, 32, 40, 64),
        "row",
        "row",
        [],
    ),
    "matmul_4d": (
        lambda m, a, b: a @ b,
        ((2, 3, 32, 64), (2, 3, 64, 40)),
        (6, 32, 40, 64),
        "row",
        "row",
        [],
    ),
    "matmul_3d_by_2d": (
        lambda m, a, b: a @ m.w.t(),
        ((4, 8, 64), (1,)),
        (1, 32, 48, 64),
        "row",
        "col",
        [],
    ),
    "matmul_numpy_t_weight": (
        lambda m, a, b: a @ m.w.T,
        ((32, 64), (1,)),
        (1, 32, 48, 64),
        "row",
        "col",
        [],
    ),
    "matmul_mt": (
        lambda m, a, b: a @ b.mT,
        ((5, 32, 64), (5, 40, 64)),
        (5, 32, 40, 64),
        "row",
        "col",
        [],
    ),
    "matmul_batched_transposed": (
        lambda m, a, b: a @ b.transpose(-2, -1),
        ((5, 32, 64), (5, 40, 64)),
        (5, 32, 40, 64),
        "row",
        "col",
        [],
    ),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(MATMULS))
def test_gemm_ops(engine_available, tmp_path, dtype, case):
    fn, (sa, sb), (batch, m, n, k), la, lb, steps = MATMULS[case]
    plan, graph = plan_for(Mm(fn), (torch.randn(*sa), torch.randn(*sb)), dtype, tmp_path)
    gemm = only(plan, "gemm")
    assert gemm["problem"] == {"batch": batch, "m": m, "n": n, "k": k}
    assert (gemm["attrs"]["layout_a"], gemm["attrs"]["layout_b"]) == (la, lb)
    assert gemm["epilogue"] == steps
    assert_nothing_dropped(plan, graph)


class Qkv(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(64, n) for n in (64, 32, 32))

    def forward(self, x):
        return self.q(x).sum() + self.k(x).sum() + self.v(x).sum()


class Gated(nn.Module):
    def __init__(self, act, swap=False):
        super().__init__()
        self.w1, self.w3 = nn.Linear(64, 96, bias=False), nn.Linear(64, 96, bias=False)
        self.act, self.swap = act, swap

    def forward(self, x):
        a, b = self.act(self.w1(x)), self.w3(x)
        return b * a if self.swap else a * b


@pytest.mark.parametrize("dtype", DTYPES)
def test_horizontal_qkv(engine_available, tmp_path, dtype):
    plan, graph = plan_for(Qkv(), (torch.randn(2, 8, 64),), dtype, tmp_path)
    h = only(plan, "horizontal_gemm")
    assert h["epilogue"] == ["bias"]
    assert h["problem"]["n_parts"] == [64, 32, 32] and h["problem"]["n"] == 128
    assert_nothing_dropped(plan, graph)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "act,swap,name",
    [
        (F.silu, False, "silu"),
        (F.silu, True, "silu"),
        (F.gelu, False, "gelu_erf"),
        (lambda y: y * torch.sigmoid(y), False, "silu"),
    ],
)
def test_gated_mlp(engine_available, tmp_path, dtype, act, swap, name):
    plan, graph = plan_for(Gated(act, swap), (torch.randn(2, 8, 64),), dtype, tmp_path)
    assert found(plan) == Counter({("gated_mlp", (name, "mul")): 1})
    assert only(plan, "gated_mlp")["problem"] == {"batch": 1, "m": 16, "n": 96, "k": 64}
    assert_nothing_dropped(plan, graph)


class Attn(nn.Module):
    """Hand-written or SDPA attention over (b, h, s, d) inputs, in several spellings."""

    def __init__(self, style, s=32):
        super().__init__()
        self.style = style
        self.register_buffer("tril", torch.tril(torch.ones(s, s, dtype=torch.bool)))

    def forward(self, q, k, v):
        d = q.shape[-1]
        if self.style == "sdpa":
            return F.scaled_dot_product_attention(q, k, v)
        if self.style == "sdpa_causal_gqa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if self.style == "where_fp32_softmax":
            s = (q / math.sqrt(d)) @ k.transpose(-2, -1)
            s = torch.where(self.tril, s, float("-inf"))
            return F.softmax(s.float(), dim=-1).to(q.dtype) @ v
        if self.style == "repeat_interleave":
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
            return F.softmax(q @ k.transpose(-2, -1) * d**-0.5, dim=-1) @ v
        raise AssertionError(self.style)


ATTENTION = {
    "sdpa": ((2, 4, 32, 64), (2, 4, 32, 64), ["scale", "softmax"], False, 4),
    "sdpa_causal_gqa": (
        (2, 4, 32, 64),
        (2, 2, 32, 64),
        ["scale", "causal_mask", "softmax"],
        True,
        2,
    ),
    "where_fp32_softmax": (
        (2, 4, 32, 64),
        (2, 4, 32, 64),
        ["scale", "causal_mask", "softmax"],
        True,
        4,
    ),
    "repeat_interleave": ((2, 4, 32, 96), (2, 2, 32, 96), ["scale", "softmax"], False, 2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", sorted(ATTENTION))
def test_attention(engine_available, tmp_path, dtype, style):
    qs, ks, steps, causal, kv_heads = ATTENTION[style]
    q, k, v = torch.randn(*qs), torch.randn(*ks), torch.randn(*ks)
    plan, graph = plan_for(Attn(style), (q, k, v), dtype, tmp_path)
    assert found(plan) == Counter({("attention", tuple(steps)): 1})
    attn = only(plan, "attention")
    assert attn["attrs"]["causal"] is causal
    assert attn["problem"]["kv_heads"] == kv_heads and attn["problem"]["head_dim"] == qs[-1]
    assert attn["attrs"]["scale"] == pytest.approx(qs[-1] ** -0.5)
    assert_nothing_dropped(plan, graph)


class ScaledBeforeProduct(nn.Module):
    """Projections scaled by a constant before Q @ K^T: "projection" (CLIP, BART) scales
    q_proj(x) before the heads are split; "heads" (Whisper) scales q and k per head, k viewed
    straight into K^T by permute(0, 2, 3, 1); "shared" reads the scaled projection outside the
    attention too, so the scale stays and the attention reads its result."""

    def __init__(self, form, width=64, heads=4):
        super().__init__()
        self.form, self.heads = form, heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        b, s, c = x.shape
        d = c // self.heads
        if self.form == "heads":
            q = self.q(x).view(b, s, self.heads, d).permute(0, 2, 1, 3) * d**-0.25
            k_t = self.k(x).view(b, s, self.heads, d).permute(0, 2, 3, 1) * d**-0.25
        else:
            scaled = self.q(x) * d**-0.5
            q = scaled.view(b, s, self.heads, d).transpose(1, 2)
            k_t = self.k(x).view(b, s, self.heads, d).transpose(1, 2).transpose(-1, -2)
        v = self.v(x).view(b, s, self.heads, d).transpose(1, 2)
        y = (torch.softmax(q @ k_t, dim=-1) @ v).transpose(1, 2).reshape(b, s, c)
        return (y, scaled) if self.form == "shared" else y


@pytest.mark.parametrize("form", ["projection", "heads", "shared"])
def test_attention_scaled_before_the_product(engine_available, tmp_path, form):
    plan, graph = plan_for(ScaledBeforeProduct(form), (torch.randn(2, 32, 64),), "bf16", tmp_path)
    attn = only(plan, "attention")
    assert attn["epilogue"] == (["softmax"] if form == "shared" else ["scale", "softmax"])
    assert attn["attrs"]["k_source"] == "linear_1"
    if form == "shared":  # the scaled projection is read as it is: its scale is not the kernel's
        assert attn["attrs"]["scale"] == pytest.approx(1.0)
        assert attn["attrs"]["q_source"] == "mul" and "mul" not in attn["nodes"]
    else:
        assert attn["attrs"]["scale"] == pytest.approx(16**-0.5)
        assert attn["attrs"]["q_source"] == "linear"
        assert {"mul"} | ({"mul_1"} if form == "heads" else set()) <= set(attn["nodes"])
    assert attn["attrs"]["k_strides"] == [2048, 16, 64, 1]  # K, (b, h, s, d), read in place
    assert_nothing_dropped(plan, graph)


class HandRMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(64))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "module,kind,steps",
    [
        (nn.LayerNorm(64), "layer_norm", ["weight", "bias"]),
        (nn.LayerNorm(64, elementwise_affine=False), "layer_norm", []),
        (nn.RMSNorm(64, eps=1e-6), "rms_norm", ["weight"]),
        (HandRMSNorm(), "rms_norm", ["weight"]),
    ],
    ids=["layer_norm", "layer_norm_plain", "rms_norm_op", "rms_norm_by_hand"],
)
def test_norms(engine_available, tmp_path, dtype, module, kind, steps):
    plan, graph = plan_for(module, (torch.randn(4, 8, 64),), dtype, tmp_path)
    norm = only(plan, "norm")
    assert norm["attrs"]["kind"] == kind and norm["epilogue"] == steps
    assert norm["problem"] == {"rows": 32, "cols": 64}
    assert_nothing_dropped(plan, graph)
    assert plan["pytorch_nodes"] == []


class WithUnknownOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return torch.cumsum(torch.relu(self.fc(x)), dim=-1)


def test_unknown_op_is_kept_and_reported(engine_available, tmp_path):
    plan, graph = plan_for(WithUnknownOp(), (torch.randn(8, 64),), "fp32", tmp_path)
    assert found(plan) == Counter({("gemm", ("bias", "relu")): 1})
    assert [n["op"] for n in plan["opaque_nodes"]] == ["aten.cumsum.default"]
    assert [n["name"] for n in plan["pytorch_nodes"]] == ["cumsum"]
    assert_nothing_dropped(plan, graph)


# ---------------------------------------------------------------------------------------------
# The CLI on the shipped example


def run_fact(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fact", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_cli_discover_minigpt_bf16_under_ten_seconds(engine_available):
    start = time.perf_counter()
    res = run_fact("discover", "examples/minigpt_block.py", "--dtype", "bf16")
    elapsed = time.perf_counter() - start
    assert res.returncode == 0, res.stderr
    assert "attention" in res.stdout and "gelu_tanh" in res.stdout and "causal" in res.stdout
    assert elapsed < 10.0, f"fact discover took {elapsed:.1f}s"
    # the plan fact.optimize makes: LayerNorms are norms of their own (folds are asked for)
    assert "fold:" not in res.stderr and "computed from parameters alone" not in res.stdout
    assert res.stdout.count("weight, bias") == 2 and "bias, gelu_tanh" in res.stdout
    assert "runs in PyTorch" not in res.stdout


def test_cli_discover_fold_norms_shows_the_folded_plan(engine_available):
    res = run_fact("discover", "examples/minigpt_block.py", "--dtype", "bf16", "--fold-norms")
    assert res.returncode == 0, res.stderr
    # both LayerNorms folded into the GEMMs after them, their statistics patterns of their own,
    # and the folded weights' work listed apart
    assert "fold: layer_norm folded into linear " in res.stderr
    assert "fold: layer_norm_1 folded into linear_2 " in res.stderr
    assert res.stdout.count("stats") == 2 and "mul, sub, mul, bias, gelu_tanh" in res.stdout
    assert "computed from parameters alone, once and again when they change (14):" in res.stdout
    assert "runs in PyTorch" not in res.stdout


def test_cli_fold_norms_needs_a_problem_file_and_a_target(tmp_path):
    graph = tmp_path / "g.json"
    graph.write_text("{}")
    res = run_fact("discover", str(graph), "--fold-norms")
    assert res.returncode == 2
    assert f"--fold-norms applies to problem files; {graph} was rewritten" in res.stderr
    res = run_fact("trace", "examples/minigpt_block.py", "--fold-norms", "-o", str(graph))
    assert res.returncode == 2 and "give --arch too" in res.stderr


def test_cli_explain_names_the_pattern_and_misses(engine_available, tmp_path):
    res = run_fact("explain", "examples/minigpt_block.py", "--dtype", "bf16", "--node", "tanh")
    assert res.returncode == 0, res.stderr
    assert "covered by pattern" in res.stdout and "gelu_tanh" in res.stdout
    res = run_fact("explain", "examples/minigpt_block.py", "--dtype", "bf16", "--node", "linear")
    assert res.returncode == 0, res.stderr
    # c_attn's output feeds the attention's split: the epilogue stops there, and explain says so.
    assert "stops before 'split'" in res.stdout
    res = run_fact("explain", "examples/minigpt_block.py", "--node", "no_such_node")
    assert res.returncode == 2 and "no node named 'no_such_node'" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "content,expected",
    [
        ('{"format": "fact.graph", "version": 1, "nodes": [', "malformed JSON"),
        ("not json at all", "malformed JSON"),
        ('{"format": "fact.graph", "version": 7, "nodes": [], "outputs": []}', "version 7"),
        ('{"format": "something else"}', "not a FACT graph"),
        ("", "empty"),
    ],
)
def test_cli_bad_graph_files(engine_available, tmp_path, content, expected):
    path = tmp_path / "graph.json"
    path.write_text(content)
    res = run_fact("discover", str(path))
    assert res.returncode == 2
    assert expected in res.stderr and str(path) in res.stderr
    assert "Traceback" not in res.stderr


def test_cli_truncated_real_graph(engine_available, tmp_path):
    res = run_fact("trace", "examples/minigpt_block.py", "-o", str(tmp_path / "g.json"))
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "g.json").read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    res = run_fact("discover", str(tmp_path / "cut.json"))
    assert res.returncode == 2 and "malformed JSON" in res.stderr and "truncated" in res.stderr


def test_seed_registry_gives_vetted_configs(engine_available, tmp_path):
    """The shipped seed (measured on the H200) answers the MiniGPT MLP GEMM and attention
    exactly."""
    registry = tmp_path / "registry.db"
    imported = subprocess.run(
        [str(engine_available), "registry", "import", str(REPO / "data" / "registry_seed.json"),
         "--registry", str(registry)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    graph = tmp_path / "g.json"
    assert (
        run_fact(
            "trace", "examples/minigpt_block.py", "--dtype", "bf16", "-o", str(graph)
        ).returncode
        == 0
    )
    from fact.engine import engine_json

    plan = engine_json("discover", graph, "--registry", str(registry))
    mlp = next(p for p in plan["patterns"] if p["epilogue"] == ["bias", "gelu_tanh"])
    assert mlp["vetted"], "no vetted configs for the bias+gelu_tanh GEMM"
    assert mlp["vetted"][0]["match"] == "exact" and mlp["vetted"][0]["provenance"] == "seed"
    times = [v["time_us"] for v in mlp["vetted"]]
    assert times == sorted(times)  # exact matches, fastest first
    # attention too (the FMHA runs of bench/results/2026-12-01-fmha-overlap/call2): the ping-pong
    # 128x128 kernel with 5 stages, its causal tiles heaviest first, its warp groups' GEMMs
    # overlapped and the next tile's Q loaded during this one, was the fastest at this shape
    att = next(p for p in plan["patterns"] if p["family"] == "attention")
    assert att["vetted"] and att["vetted"][0]["match"] == "exact"
    assert att["vetted"][0]["config"]["name"] == "q128kv128_pp_s5_q4_ov"


class Writes(nn.Module):
    """Two in-place writes: one into a tensor an earlier alias still reads (it must stay in
    PyTorch, as written), one into a tensor read only before the write (it reads as add)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 48)

    def forward(self, x):
        y = self.fc(x)
        head = y[..., :8]  # an alias of y taken before the write
        y.mul_(2.0)
        z = self.fc(x)
        w = z.sigmoid()  # read before the write
        z.add_(1.0)
        return head + 1, w * z


def test_in_place_writes_someone_sees_stay_in_pytorch(engine_available, tmp_path):
    plan, graph = plan_for(Writes(), (torch.randn(4, 16, 64),), "bf16", tmp_path)
    kept = {n["name"] for n in plan["pytorch_nodes"]}
    ops = {n["name"]: n.get("op", "") for n in graph["nodes"]}
    writes = {op.split(".")[1]: name for name, op in ops.items() if op.endswith("_.Tensor")}
    assert set(writes) == {"mul_", "add_"}, writes
    assert writes["mul_"] in kept
    taken = [p for p in plan["patterns"] if writes["add_"] in p["nodes"]]
    assert len(taken) == 1 and writes["add_"] not in kept, plan["patterns"]
    assert_nothing_dropped(plan, graph)


def test_view_as_family_takes_the_static_size(tmp_path):
    """x.view_as(y) and friends are views of y's size, not reads of y (fact.rewrites)."""
    import torch.export

    from fact.rewrites import shape_refs

    class M(nn.Module):
        def forward(self, a, b, c):
            return a.view_as(b) + 1, a.reshape_as(b), c.expand_as(b)

    program = torch.export.export(M(), (torch.randn(6, 4), torch.randn(3, 8), torch.randn(8)))
    lines = shape_refs(program)
    assert len(lines) == 3, lines
    targets = [n.target for n in program.graph_module.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert aten.view.default in targets and aten.reshape.default in targets
    assert aten.expand.default in targets
    refs = {aten.view_as.default, aten.reshape_as.default, aten.expand_as.default}
    assert not refs & set(targets)
    inputs = (torch.randn(6, 4), torch.randn(3, 8), torch.randn(8))
    for got, want in zip(program.module()(*inputs), M()(*inputs), strict=True):
        assert torch.equal(got, want)
