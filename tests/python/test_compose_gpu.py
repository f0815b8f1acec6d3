"""fact.optimize on the GPU machine (pytest -m gpu; scripts/gpu_tests.sh). Skipped without CUDA.

These compile real kernels (nvcc, CUTLASS from $CUTLASS_DIR or the nvidia-cutlass wheel), tune
them, and check the composed module against eager: the generated kernel is really in the graph,
the module survives torch.compile and CUDA graph capture, and a warm optimize reuses its
decisions.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from torch import nn

import fact
from fact.compose.impls import run_cublaslt_pattern, run_gemm_pattern
from fact.compose.optimize import rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build kernels"),
]


class GeluMLP(nn.Module):
    """A GEMM with a bias + GELU(tanh) tail, then one with a residual: two fusable patterns."""

    def __init__(self, d: int = 512, h: int = 2048):
        super().__init__()
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x), approximate="tanh"))


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    torch.manual_seed(0)
    model = GeluMLP().cuda().to(torch.bfloat16).eval()
    x = torch.randn(8, 1024, 512, device="cuda", dtype=torch.bfloat16)
    run = tmp_path_factory.mktemp("compose-gpu")
    os.environ.setdefault("FACT_CACHE_DIR", str(run / "cache"))  # kernels + decisions
    opt = fact.optimize(
        model, [x], candidates=2, run_dir=run / "run", quiet=True, require_faster=False
    )
    return model, x, opt, run


def _calls(opt, fn):
    return [n for n in opt.graph_module.graph.nodes if n.op == "call_function" and n.target is fn]


def test_generated_kernels_replace_the_patterns_and_match_eager(optimized):
    model, x, opt, _ = optimized
    chosen = [p["chosen"] for p in opt.report["patterns"]]
    assert len(chosen) == 2
    assert all(c != "pytorch" for c in chosen), opt.report["patterns"]
    generated = _calls(opt, run_gemm_pattern) + _calls(opt, run_cublaslt_pattern)
    assert len(generated) == 2
    y = torch.randn_like(x)
    with torch.no_grad():
        assert rel_err(opt(y), model(y)) < 2e-2
    assert opt.report["verification"]["passed"]


def test_cuda_graph_replay_and_plain_launches_agree(optimized):
    model, x, opt, _ = optimized
    y = torch.randn_like(x)
    saved = opt.cuda_graphs
    try:
        opt.cuda_graphs = True
        first = opt(y)
        second = opt(y * 2)  # outputs are cloned out of the graph: `first` must survive
        opt.cuda_graphs = False
        plain = opt(y)
    finally:
        opt.cuda_graphs = saved
    assert torch.equal(first, plain)
    assert not torch.equal(first, second)


def test_weights_updated_in_place_are_seen(optimized):
    model, x, opt, _ = optimized
    y = torch.randn_like(x)
    before = opt(y)
    with torch.no_grad():
        model.down.weight.mul_(0.5)
        try:
            after = opt(y)
            assert not torch.equal(before, after)
            assert rel_err(after, model(y)) < 2e-2
        finally:
            model.down.weight.mul_(2.0)


def test_composed_module_runs_under_torch_compile(optimized):
    model, x, opt, _ = optimized
    opt.cuda_graphs = False
    compiled = torch.compile(opt.graph_module)
    flat = opt._program.state_inputs() + [x]
    with torch.no_grad():
        out = compiled(*flat)[0]
        assert rel_err(out, model(x)) < 2e-2


def test_warm_optimize_reuses_decisions(optimized):
    model, x, opt, run = optimized
    again = fact.optimize(
        model, [x], candidates=2, run_dir=run / "warm", quiet=True, require_faster=False
    )
    assert again.report["warm"]
    assert [p["chosen"] for p in again.report["patterns"]] == [
        p["chosen"] for p in opt.report["patterns"]
    ]
    assert not (run / "warm" / "manifest.json").exists()  # nothing realized, nothing compiled


class Norms(nn.Module):
    """A LayerNorm op and a hand-written RMSNorm (Llama's), each a row-norm pattern."""

    def __init__(self, d: int = 768):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        h = self.ln(x)
        hf = h.float()
        r = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return r.type_as(h) * self.weight


def test_generated_norm_kernels_match_eager(tmp_path):
    from fact.compose.impls import run_norm_pattern

    torch.manual_seed(1)
    model = Norms().cuda().to(torch.bfloat16).eval()
    with torch.no_grad():
        model.ln.weight.uniform_(0.5, 1.5)
        model.ln.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16) * 3 + 1
    opt = fact.optimize(
        model, [x], run_dir=tmp_path / "run", quiet=True, require_faster=False, use_cache=False
    )
    patterns = opt.report["patterns"]
    assert [p["family"] for p in patterns] == ["norm", "norm"]
    for p in patterns:  # every generated block width verified against the original subgraph
        generated = [c for c in p["candidates"] if c["impl"].startswith("generated:")]
        assert generated and all(c["ok"] and c["error"] < 1e-2 for c in generated), p
    ln = next(p for p in patterns if p["signature"].endswith("layer_norm"))
    assert ln["chosen"].startswith("generated:")  # the only implementation besides PyTorch's
    assert len(_calls(opt, run_norm_pattern)) >= 1
    y = torch.randn_like(x) * 2 - 1
    with torch.no_grad():
        out, ref = opt(y), model(y)
    assert rel_err(out, ref) < 1e-2
    # rounding like the model: most elements equal to eager's bits
    assert (out == ref).float().mean() > 0.9
