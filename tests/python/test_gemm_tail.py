"""The library-GEMM form of a GEMM pattern (issue 31, item 4): the plain product by PyTorch's
GEMM (cuBLAS on a GPU) and the whole epilogue in one pointwise kernel, the plan's "tail".

Without a GPU the tail runs as its PyTorch twin (GemmTailImpl backend "reference", which
evaluates the tail's SSA): what is checked is the plan's tail (its inputs, kinds and shapes) and
that the composed module computes the model's function for every kind of epilogue operand and
every GEMM form (linear, addmm, matmul, batched).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fact
from fact.compose.impls import GemmTailImpl
from fact.compose.optimize import fresh_inputs, rel_err

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FACT_CACHE_DIR", str(tmp_path / "fact-cache"))


class LinearScaleLeaky(nn.Module):
    """a row operand (the bias), a constant, a parametrised function"""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 96)

    def forward(self, x):
        return F.leaky_relu(self.fc(x) * 0.5, 0.02)


class Conv1DResidual(nn.Module):
    """GPT-2's Conv1D (addmm over a flattened input, viewed back) with a full residual operand"""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 64) * 0.1)
        self.bias = nn.Parameter(torch.randn(64) * 0.1)

    def forward(self, x):
        y = torch.addmm(self.bias, x.view(-1, 64), self.weight).view(x.shape)
        return torch.relu(y + x)


class MatmulColScale(nn.Module):
    """a column operand (one value per row) and a scalar tensor, over a plain matmul"""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(48, 80) * 0.1)
        self.s = nn.Parameter(torch.tensor(1.5))

    def forward(self, x, rows):
        return torch.tanh((x @ self.w) * rows * self.s)


class BatchedGelu(nn.Module):
    """a batched product (bmm) with a GELU"""

    def forward(self, a, b):
        return F.gelu(torch.bmm(a, b))


CASES = [
    (LinearScaleLeaky, lambda: [torch.randn(3, 10, 64)]),
    (Conv1DResidual, lambda: [torch.randn(2, 12, 64)]),
    (MatmulColScale, lambda: [torch.randn(20, 48), torch.rand(20, 1) + 0.5]),
    (BatchedGelu, lambda: [torch.randn(4, 16, 32), torch.randn(4, 32, 24)]),
]


def tails(index, pattern):
    if pattern.get("family") == "gemm" and pattern.get("tail"):
        return [GemmTailImpl(pattern, "reference", label="tail")]
    return []


@pytest.mark.parametrize("make, inputs", CASES, ids=[c[0].__name__ for c in CASES])
def test_gemm_tail_computes_the_pattern(engine_available, tmp_path, make, inputs):
    torch.manual_seed(0)
    model, example = make().eval(), inputs()
    opt = fact.optimize(
        model, example, implementations=tails, require_faster=False, run_dir=tmp_path / "r",
        quiet=True, use_cache=False,
    )  # fmt: skip
    gemms = [p for p in opt.report["patterns"] if p["family"] == "gemm"]
    assert gemms, opt.report["patterns"]
    assert all(p["chosen"] == "cublas+reference:tail" for p in gemms), gemms
    pointwise = [
        n for n in opt.graph_module.graph.nodes if n.target is torch.ops.fact.pointwise.default
    ]
    assert len(pointwise) == len(gemms)
    for seed in (1, 2):
        args = fresh_inputs(example, seed)
        with torch.no_grad():
            want = model(*args)
        assert rel_err(opt(*args), want) < 1e-5


def test_the_tail_lists_the_product_then_each_operand_by_kind(engine_available, tmp_path):
    """in0 is the product shaped as the output; a row operand is [n]; a full one is shaped as
    the output; the SSA reads the product where the fused kernel read the accumulator."""
    plan = fact.discover(Conv1DResidual().eval(), [torch.randn(2, 12, 64)])
    (p,) = [p for p in plan["patterns"] if p["family"] == "gemm"]
    tail = p["tail"]
    assert tail["family"] == "pointwise" and tail["rule"] == "gemm_epilogue_tail"
    types = [o["type"] for o in tail["operands"]]
    assert types == ["f32[2, 12, 64]", "f32[64]", "f32[2, 12, 64]"], types
    assert tail["attrs"]["access"] == ["contiguous", "contiguous", "contiguous"]
    ssa = tail["epilogue_expr"]["ssa"]
    assert not any(e["op"] == "acc" for e in ssa)
    assert [e["index"] for e in ssa if e["op"] == "operand"] == [0, 1, 2]


def test_a_gemm_without_epilogue_has_no_tail(engine_available):
    plan = fact.discover(nn.Linear(32, 16, bias=False).eval(), [torch.randn(8, 32)])
    assert all("tail" not in p for p in plan["patterns"])
