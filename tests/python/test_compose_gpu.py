"""fact.optimize on the GPU machine (pytest -m gpu; scripts/gpu_tests.sh). Skipped without CUDA.

These compile real kernels (nvcc, CUTLASS from $CUTLASS_DIR or the nvidia-cutlass wheel), tune
them, and check the composed module against eager: the generated kernel is really in the graph,
the module survives torch.compile and CUDA graph capture, and a warm optimize reuses its
decisions.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from torch import nn

import fact
from attention_modules import (
    Float32ScoresAttention,
    FoldedHeadsAttention,
    GqaAttention,
    HandWrittenAttention,
    ScaledProjectionAttention,
)
from fact.compose.impls import run_cublaslt_pattern, run_gemm_parts_pattern, run_gemm_pattern
from fact.compose.ops import dense_strides
from fact.compose.optimize import rel_err
from fact.errors import FactError
from pointwise_modules import PointwiseZoo, RopeProjection, apply_rope, rope_tables, zoo_inputs

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


def _replayed_and_plain(opt, y):
    """(replayed on y, replayed on 2y, plain launches on y) from a composed module."""
    saved = opt.cuda_graphs
    try:
        opt.cuda_graphs = True
        first = opt(y)
        second = opt(y * 2)  # outputs are cloned out of the graph: `first` must survive
        opt.cuda_graphs = False
        plain = opt(y)
    finally:
        opt.cuda_graphs = saved
    return first, second, plain


def test_cuda_graph_replay_and_plain_launches_agree(optimized):
    model, x, opt, _ = optimized
    first, second, plain = _replayed_and_plain(opt, torch.randn_like(x))
    assert torch.equal(first, plain)
    assert not torch.equal(first, second)


def test_a_graph_captured_under_inference_mode_replays_outside_it(optimized):
    """The replay's static inputs are normal tensors even when the capture ran under
    torch.inference_mode(): a later call outside it copies its inputs into them."""
    model, x, opt, _ = optimized
    saved, saved_replay = opt.cuda_graphs, opt._replay
    try:
        opt.cuda_graphs = True
        object.__setattr__(opt, "_replay", None)  # capture afresh, under inference mode
        y = torch.randn_like(x)
        with torch.inference_mode():
            first = opt(y)
        again = opt(y)  # outside inference mode: copied into the same static buffers
        assert torch.equal(first, again)
        with torch.no_grad():
            assert rel_err(again, model(y)) < 2e-2
    finally:
        opt.cuda_graphs = saved
        object.__setattr__(opt, "_replay", saved_replay)


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


def test_torch_compile_backend_runs_generated_kernels_on_the_models_own_weights(
    optimized, monkeypatch
):
    """torch.compile(model, backend="fact") on CUDA: Dynamo's graph is optimized with the
    model's parameters as its state (work on weights is planned once, an in-place update is
    seen), FACT's kernels replace both patterns, and the output matches eager."""
    import fact.backend  # noqa: F401 - registers backend="fact" (a source tree on PYTHONPATH)
    from fact.compose import optimize as optimize_mod

    model, x, _, run = optimized
    made = []
    real_optimize = optimize_mod.optimize

    def recording(*args, **kwargs):
        made.append(real_optimize(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(optimize_mod, "optimize", recording)
    torch._dynamo.reset()
    compiled = torch.compile(
        model,
        backend="fact",
        dynamic=False,
        options={"candidates": 2, "require_faster": False, "run_dir": run / "backend"},
    )
    y = torch.randn_like(x)
    with torch.no_grad():
        out = compiled(y)
        assert rel_err(out, model(y)) < 2e-2
        assert len(made) == 1
        chosen = [p["chosen"] for p in made[0].report["patterns"]]
        assert len(chosen) == 2 and "pytorch" not in chosen, made[0].report["patterns"]
        model.down.weight.mul_(0.5)
        try:
            halved = compiled(y)
            assert rel_err(halved, model(y)) < 2e-2
            assert not torch.equal(halved, out)
        finally:
            model.down.weight.mul_(2.0)
    torch._dynamo.reset()


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


def test_saved_module_loads_in_a_new_process_without_compiling(optimized, tmp_path):
    """fact.save, then fact.load in another process with an empty kernel cache: the chosen
    kernels come from the folder (digests checked), nothing is planned, compiled or tuned,
    and the first call gives the optimized module's output."""
    import subprocess
    import sys

    from helpers import REPO

    model, x, opt, run = optimized
    folder = fact.save(opt, tmp_path / "mlp.fact")
    manifest = json.loads((folder / "module.json").read_text())
    assert manifest["device"] == "cuda" and manifest["sm"] == "sm90", manifest
    generated = [p for p in opt.report["patterns"] if p["kind"] == "generated"]
    assert len(manifest["kernels"]) == len({p["chosen"] for p in generated})
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    y = torch.randn_like(x)
    torch.save(y.cpu(), tmp_path / "y.pt")
    with torch.no_grad():
        want = opt(y)
    script = f"""
import sys, time, torch
sys.path.insert(0, {str(REPO / "tests" / "python")!r})
import fact
from test_compose_gpu import GeluMLP
model = GeluMLP().cuda().to(torch.bfloat16).eval()
model.load_state_dict(torch.load({str(tmp_path / "weights.pt")!r}))
start = time.perf_counter()
opt = fact.load({str(folder)!r}, model, quiet=True)
y = torch.load({str(tmp_path / "y.pt")!r}).cuda()
with torch.no_grad():
    out = opt(y)
torch.cuda.synchronize()
print(f"first call after {{time.perf_counter() - start:.2f}} s")
torch.save(out.cpu(), {str(tmp_path / "out.pt")!r})
print("\\n".join(opt.report["transcript"]))
"""
    env = dict(os.environ, FACT_CACHE_DIR=str(tmp_path / "empty-cache"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, env=env, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "nothing to compile or tune" in done.stdout, done.stdout
    assert not (tmp_path / "empty-cache" / "kernels").exists() or not any(
        (tmp_path / "empty-cache" / "kernels").iterdir()
    )
    print(done.stdout.splitlines()[0])
    assert rel_err(torch.load(tmp_path / "out.pt").cuda(), want) < 1e-2


class ShrinkTail(nn.Module):
    """Linear then softshrink and hardshrink: ops the catalog lacks, given lowerings below."""

    def __init__(self, d: int = 1024):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return nn.functional.hardshrink(nn.functional.softshrink(self.fc(x), 0.1), 0.2)


def test_agent_lowerings_become_a_generated_epilogue(tmp_path, monkeypatch):
    """Lowerings accepted through fact.agent's gates (answers pasted in a file, no endpoint)
    put softshrink and hardshrink into the GEMM's generated epilogue, verified against eager."""
    from fact.agent.client import Answers
    from fact.agent.propose import propose

    monkeypatch.setenv("FACT_REGISTRY", str(tmp_path / "registry.db"))
    shrink = {"op": "OP", "inputs": ["self"], "params": [{"name": "lambd", "default": 0.5}]}

    def ssa(*steps):  # ("op", args or value): entries 0 and 1 are the input and lambd
        head = [{"id": 0, "op": "input", "index": 0}, {"id": 1, "op": "param", "index": 0}]
        body = [
            {"id": i, "op": op, **({"value": a} if op == "constant" else {"args": a})}
            for i, (op, a) in enumerate(steps, start=2)
        ]
        return head + body

    hard = ssa(("constant", 0.0), ("abs", [0]), ("le", [3, 1]), ("where", [4, 2, 0]))
    soft = ssa(("constant", 0.0), ("sub", [0, 1]), ("add", [0, 1]), ("gt", [0, 1]),
               ("neg", [1]), ("lt", [0, 6]), ("where", [7, 4, 0]), ("where", [5, 3, 8]),
               ("abs", [0]), ("le", [10, 1]), ("where", [11, 2, 9]))  # fmt: skip
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({
        "hardshrink": json.dumps(dict(shrink, op="hardshrink", ssa=hard)),
        "softshrink": json.dumps(dict(shrink, op="softshrink", ssa=soft)),
    }))  # fmt: skip
    problem = tmp_path / "shrink.py"
    problem.write_text(
        "import torch\nfrom test_compose_gpu import ShrinkTail as Model\n"
        "def get_inputs():\n    return [torch.randn(4096, 1024)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    summary = propose(str(problem), tmp_path / "agent", None, Answers(answers), log=print)
    assert set(summary["ops"].values()) == {"accepted"}, summary
    torch.manual_seed(5)
    model = ShrinkTail().cuda().to(torch.bfloat16).eval()
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    opt = fact.optimize(model, [x], candidates=2, run_dir=tmp_path / "run", quiet=True,
                        require_faster=False, use_cache=False)  # fmt: skip
    (p,) = opt.report["patterns"]
    assert p["signature"].startswith("gemm[bias+softshrink+hardshrink]"), p
    assert p["chosen"] != "pytorch", p
    y = torch.randn_like(x)
    with torch.no_grad():
        assert rel_err(opt(y), model(y)) < 2e-2
    print({k: p.get(k) for k in ("chosen", "time_us", "eager_us")})


def test_fp32_highest_runs_fp32_accurate_kernels(tmp_path):
    """fp32 under "highest": the MLP's two GEMM patterns become CUTLASS's sm80 3xTF32 kernels,
    every candidate verified at the fp32-accurate bound, the report names the math, and the
    module is as close to a float64 reference as eager is."""
    import copy

    torch.manual_seed(3)
    model = GeluMLP().cuda().eval()
    x = torch.randn(4, 512, 512, device="cuda")
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        opt = fact.optimize(model, [x], candidates=2, run_dir=tmp_path / "run", quiet=True,
                            require_faster=False, use_cache=False, precision="highest")  # fmt: skip
        patterns = opt.report["patterns"]
        assert [p["family"] for p in patterns] == ["gemm", "gemm"]
        for p in patterns:
            generated = [c for c in p["candidates"] if c["impl"].startswith("cutlass:")]
            assert len(generated) == 2 and all(c["ok"] for c in generated), p
            assert all(c["impl"].endswith("_3xtf32") for c in generated), p
            assert p["chosen"].startswith("cutlass:") and p["math"] == "3xtf32", p
        y = torch.randn_like(x)
        reference = copy.deepcopy(model).double()(y.double())
        with torch.no_grad():
            ours, eager = opt(y), model(y)
        assert rel_err(ours.double(), reference) <= 2 * rel_err(eager.double(), reference) + 1e-7
        assert rel_err(ours, eager) <= 1e-5
    finally:
        torch.set_float32_matmul_precision(previous)


class InPlaceBiasTail(nn.Module):
    """x @ W.T plus bias.expand_as, then in-place add, hardtanh_ and mul_: one GEMM pattern."""

    def __init__(self, k: int = 512, n: int = 1024):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, k) / k**0.5)
        self.b = nn.Parameter(torch.randn(n))

    def forward(self, x):
        y = x @ self.w.T
        y = y + self.b.expand_as(y)
        y.add_(0.25)
        nn.functional.hardtanh_(y, -1.5, 1.5)
        return y.mul_(0.5)


def test_in_place_tail_runs_in_a_generated_epilogue(tmp_path):
    """The in-place writes and the expanded bias become one GEMM kernel's epilogue, as close
    to a float64 reference as eager is."""
    import copy

    torch.manual_seed(11)
    model = InPlaceBiasTail().cuda().to(torch.bfloat16).eval()
    x = torch.randn(8, 256, 512, device="cuda", dtype=torch.bfloat16)
    opt = fact.optimize(model, [x], candidates=2, run_dir=tmp_path / "run", quiet=True,
                        require_faster=False, use_cache=False)  # fmt: skip
    (p,) = opt.report["patterns"]
    assert p["signature"].startswith("gemm[bias+add+hardtanh+scale]:"), p
    assert p["chosen"].startswith("cutlass:"), p
    y = torch.randn_like(x)
    reference = copy.deepcopy(model).double()(y.double())
    with torch.no_grad():
        ours, eager = opt(y), model(y)
    assert rel_err(ours.double(), reference) <= 2 * rel_err(eager.double(), reference) + 1e-3


class Projections(nn.Module):
    """q, k and v projections of one input (k without a bias): one horizontal GEMM pattern."""

    def __init__(self, d: int = 512):
        super().__init__()
        self.q, self.v = nn.Linear(d, d), nn.Linear(d, d // 4)
        self.k = nn.Linear(d, d // 4, bias=False)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return q, k, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "tf32"])
def test_horizontal_projections_run_one_grouped_kernel(tmp_path, dtype):
    """The three projections become one CUTLASS grouped kernel reading each Linear's own weight
    and bias (bf16; fp32 with TF32 allowed): verified, equal to eager, seen to follow an in-place
    weight update, and the same under CUDA graph replay."""
    torch.manual_seed(3)
    model = Projections().cuda().to(dtype).eval()
    x = torch.randn(8, 512, 512, device="cuda", dtype=dtype)
    os.environ.setdefault("FACT_CACHE_DIR", str(tmp_path / "cache"))
    opt = fact.optimize(model, [x], candidates=2, run_dir=tmp_path / "run", quiet=True,
                        require_faster=False, use_cache=False, precision="high")  # fmt: skip
    (d,) = [p for p in opt.report["patterns"] if p["family"] == "horizontal_gemm"]
    assert d["chosen"].startswith("cutlass:") and "_group" in d["chosen"], d
    assert len(_calls(opt, run_gemm_parts_pattern)) == 1
    y = torch.randn_like(x)
    with torch.no_grad():
        for got, want in zip(opt(y), model(y), strict=True):
            assert rel_err(got, want) < 2e-2
        model.k.weight.mul_(0.5)
        try:
            for got, want in zip(opt(y), model(y), strict=True):
                assert rel_err(got, want) < 2e-2
        finally:
            model.k.weight.mul_(2.0)
    saved = opt.cuda_graphs
    try:
        opt.cuda_graphs = True
        replayed = opt(y)
        opt.cuda_graphs = False
        plain = opt(y)
    finally:
        opt.cuda_graphs = saved
    assert all(torch.equal(a, b) for a, b in zip(replayed, plain, strict=True))


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


class BatchFirstMha(nn.Module):
    """ViT's attention: nn.MultiheadAttention, batch first, and the residual add after it."""

    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x):
        return x + self.attn(x, x, x, need_weights=False)[0]


def test_multihead_attention_projections_run_generated_kernels(tmp_path):
    """After fact.layouts' rewrites, nn.MultiheadAttention's projections are GEMMs over
    row-major (batch, seq) rows, the output projection with the residual add in its epilogue,
    which FACT's kernels implement (verified in context; cuBLASLt's fused epilogue may be the
    faster there); SDPA reads the packed projection in place (no copy left in the graph), and
    the composed module matches eager's fused path."""
    torch.manual_seed(2)
    model = BatchFirstMha().cuda().to(torch.bfloat16).eval()
    x = torch.randn(16, 197, 256, device="cuda", dtype=torch.bfloat16)
    opt = fact.optimize(
        model, [x], candidates=1, run_dir=tmp_path / "run", quiet=True, require_faster=False
    )
    gemms = [p for p in opt.report["patterns"] if p["family"] == "gemm"]
    assert sorted(p["signature"].split(":")[0] for p in gemms) == [
        "gemm[bias+residual]",
        "gemm[bias]",
    ]
    for p in gemms:  # a generated kernel verified on each, and a GEMM kernel chosen
        generated = [c for c in p["candidates"] if c["impl"].startswith("cutlass:")]
        assert generated and all(c["ok"] for c in generated), p
        assert p["chosen"] != "pytorch", p
    aten = torch.ops.aten
    targets = {n.target for n in opt.graph_module.graph.nodes if n.op == "call_function"}
    assert not targets & {aten.clone.default, aten.contiguous.default, aten.transpose.int}
    opt.use_original = False  # the composed module, whatever the last guard chose
    for seed in (3, 4):
        torch.manual_seed(seed)
        y = torch.randn_like(x)
        with torch.no_grad():
            assert rel_err(opt(y), model(y)) < 2e-2


class PreNormMlp(nn.Module):
    """x + down(gelu(up(layer_norm(x)))): the LayerNorm folds into the up projection."""

    def __init__(self, d: int = 768, h: int = 3072):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.ln(x)), approximate="tanh"))


@pytest.mark.parametrize(
    ("dtype", "precision", "bound"),
    [(torch.bfloat16, "high", 2e-2), (torch.float32, "highest", 1e-4)],  # fp32: 3xTF32 GEMMs
)
def test_layer_norm_folded_into_the_gemm_runs_generated_kernels(tmp_path, dtype, precision, bound):
    """fact/folds.py on the GPU: the row statistics and the folded GEMM run as generated
    kernels, the derived weights follow an in-place update, and replay matches launches."""
    torch.manual_seed(3)
    model = PreNormMlp().cuda().to(dtype).eval()
    with torch.no_grad():
        model.ln.weight.uniform_(0.5, 1.5)
        model.ln.bias.uniform_(-0.5, 0.5)
    x = torch.randn(8, 1024, 768, device="cuda", dtype=dtype) * 2 + 0.5
    opt = fact.optimize(
        model, [x], candidates=2, run_dir=tmp_path / "run", quiet=True, require_faster=False,
        precision=precision, use_cache=False, fold_norms=True,
    )  # fmt: skip
    assert opt.report["folds"] and opt.report["folds_dropped"] == [], opt.report
    stats = [p for p in opt.report["patterns"] if "norm[stats]" in (p.get("signature") or "")]
    assert stats and all(p["chosen"].startswith("generated:") for p in stats), stats
    y = torch.randn_like(x) * 3 - 1
    with torch.no_grad():
        assert rel_err(opt(y), model(y)) < bound
        model.ln.weight.mul_(1.25)  # the folded weights W * gamma are derived: recomputed
        opt.cuda_graphs = False
        launched = opt(y)
        assert rel_err(launched, model(y)) < bound
        opt.cuda_graphs = True
        assert rel_err(opt(y), launched) < 1e-6
        model.ln.bias.add_(0.5)  # seen by the captured graph too (kept tensors updated in place)
        assert rel_err(opt(y), model(y)) < bound


class NormSiluTanh(PreNormMlp):
    """x + tanh(down(silu(up(layer_norm(x))))): a LayerNorm and two GEMMs whose tails (SiLU,
    tanh then a residual) no cuBLASLt epilogue has, so FACT's own kernels run all three."""

    def forward(self, x):
        return x + torch.tanh(self.down(nn.functional.silu(self.up(self.ln(x)))))


def test_dependent_launches_change_no_bits(tmp_path):
    """A chain of generated kernels, each reading what the one before wrote (LayerNorm, GEMM +
    bias + SiLU, GEMM + tanh + residual), launched as programmatic dependents (the default)
    gives the bits of plain launches, with plain launches and under CUDA graph replay, call
    after call on alternating inputs: a kernel that read before its predecessor finished would
    not."""
    from fact.compose.impls import run_norm_pattern

    torch.manual_seed(5)
    model = NormSiluTanh().cuda().to(torch.bfloat16).eval()
    x = torch.randn(8, 1024, 768, device="cuda", dtype=torch.bfloat16)
    opt = fact.optimize(
        model, [x], candidates=1, run_dir=tmp_path / "run", quiet=True, require_faster=False,
        use_cache=False,
    )  # fmt: skip
    assert opt.pdl  # on by default
    chosen = [p["chosen"] for p in opt.report["patterns"]]
    assert len(_calls(opt, run_norm_pattern)) == 1, chosen
    assert len(_calls(opt, run_gemm_pattern)) == 2, chosen  # generated CUTLASS GEMMs
    inputs = [torch.randn_like(x), torch.randn_like(x) * 2 + 1]
    opt.pdl, opt.cuda_graphs = False, False
    expected = [opt(y) for y in inputs]
    for graphs in (False, True):
        opt.pdl, opt.cuda_graphs = True, graphs
        for i in range(40):
            out = opt(inputs[i % 2])
            assert torch.equal(out, expected[i % 2]), (graphs, i)
    assert rel_err(expected[0], model(inputs[0])) < 2e-2


# ---------------------------------------------------------------------------------------------
# Fused attention: generated CUTLASS FMHA kernels through fact::attention


ATTENTION_BLOCKS = {
    # MiniGPT's attention half at width 768, 8 heads of 96; Llama's GQA (8 query heads share 2
    # key/value heads of 128, no RoPE) through SDPA; MiniGPT's in fp32 with TF32 allowed (the
    # sm80 kernel in TF32 math). Values: (model, input shape, dtype, float32 matmul precision).
    "minigpt_causal": (
        lambda: HandWrittenAttention(768, 8, 256),
        (8, 256, 768),
        torch.bfloat16,
        "highest",
    ),  # fmt: skip
    "gqa_sdpa": (
        lambda: GqaAttention(1024, 8, 2, sdpa=True),
        (4, 512, 1024),
        torch.bfloat16,
        "highest",
    ),  # fmt: skip
    "minigpt_causal_fp32_tf32": (
        lambda: HandWrittenAttention(768, 8, 256),
        (8, 256, 768),
        torch.float32,
        "high",
    ),  # fmt: skip
    # Whisper's encoder attention: not causal, q and k each scaled by head_dim ** -0.25 per
    # head, k viewed into K^T by permute(0, 2, 3, 1): the kernel reads the unscaled projections
    "whisper_scaled_qk": (
        lambda: ScaledProjectionAttention("heads", 512, 8),
        (8, 256, 512),
        torch.bfloat16,
        "highest",
    ),  # fmt: skip
    # GPT-J's: f32 scores over bf16 Q and K, where(tril, w, torch.tensor(finfo.min)) / sqrt(d)
    "gptj_f32_scores": (
        lambda: Float32ScoresAttention(1024, 16, 512),
        (4, 512, 1024),
        torch.bfloat16,
        "highest",
    ),  # fmt: skip
    # CLIP's older code: heads folded into bmm's batch, 257 tokens (a ragged last tile)
    "clip_folded_heads": (
        lambda: FoldedHeadsAttention(1024, 16),
        (8, 257, 1024),
        torch.bfloat16,
        "highest",
    ),  # fmt: skip
}


def _optimize_every_pattern(model, inputs, tmp_path_factory, name: str, precision=None):
    """fact.optimize with 2 candidates a pattern, every verified kernel kept whether or not it is
    faster (the tests check verification, not speed); returns (module, run directory)."""
    run = tmp_path_factory.mktemp(name)
    os.environ.setdefault("FACT_CACHE_DIR", str(run / "cache"))
    opt = fact.optimize(model, inputs, candidates=2, run_dir=run / "run", quiet=True,
                        require_faster=False, use_cache=False, precision=precision)  # fmt: skip
    return opt, run / "run"


@pytest.fixture(scope="module", params=list(ATTENTION_BLOCKS))
def attention_optimized(request, tmp_path_factory):
    make, shape, dtype, precision = ATTENTION_BLOCKS[request.param]
    torch.manual_seed(2)
    model = make().cuda().to(dtype).eval()
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)  # the model's own matmuls, as a user runs it
    try:
        opt, run = _optimize_every_pattern(
            model, [x], tmp_path_factory, f"attention-{request.param}", precision
        )
        yield model, x, opt, run
    finally:
        torch.set_float32_matmul_precision(previous)


def _tolerance(x: torch.Tensor) -> float:
    """bf16: 2e-2; fp32 with TF32 math: 5e-3."""
    return 2e-2 if x.dtype == torch.bfloat16 else 5e-3


def _attention_decision(opt) -> dict:
    (att,) = [p for p in opt.report["patterns"] if p["family"] == "attention"]
    return att


def test_generated_attention_kernels_are_verified_in_context(attention_optimized):
    """Realize built FMHA kernels for the pattern, the tuner timed them, and the composer
    checked its top two against the original subgraph on the module's own values. Whether
    one is chosen depends on speed: assert verification, not speed."""
    model, x, opt, _ = attention_optimized
    att = _attention_decision(opt)
    tuned = [r for r in att["tuning"] if r["kernel"] != "pytorch"]
    assert tuned and all(r["time_us"] for r in tuned), att
    generated = [c for c in att["candidates"] if c["impl"].startswith("cutlass:")]
    assert 1 <= len(generated) <= 2, att["candidates"]
    for c in generated:
        assert c["kind"] == "generated"
        assert c["ok"] and c["error"] < _tolerance(x) and c["time_us"] > 0, c
    if att["chosen"].startswith("cutlass:"):
        assert _calls(opt, torch.ops.fact.attention.default), opt.graph_module.code
        assert att["time_us"] <= min(c["time_us"] for c in att["candidates"] if c["ok"])
    elif att["chosen"] == "pytorch":
        assert att["reason"], att
    y = torch.randn_like(x)
    with torch.no_grad():
        assert rel_err(opt(y), model(y)) < _tolerance(x)
    assert opt.report["verification"]["passed"]


def test_fact_attention_op_runs_a_generated_kernel(attention_optimized):
    """One of the run's attention kernels, straight through fact::attention: in-place strided
    (and grouped-query) Q, K, V; the output a (B, S, H, D) buffer seen as BHSD; the same as
    PyTorch's SDPA; and it records into a CUDA graph."""
    from fact.compose.ops import kernel_entry
    from fact.compose.optimize import generated_impl

    model, x, opt, run = attention_optimized
    att = _attention_decision(opt)
    plan = json.loads((run / "plan.json").read_text())
    pattern = plan["patterns"][att["index"]]
    manifest = json.loads((run / "manifest.json").read_text())
    libraries = [
        e["library"]
        for e in manifest
        if e.get("pattern_index") == att["index"] and e.get("library")
    ]
    assert libraries, "realize built no attention kernel"
    library = libraries[0] if os.path.isabs(libraries[0]) else str(run / libraries[0])
    impl = generated_impl(pattern, library, {})
    entry = kernel_entry(impl.handle)
    p = pattern["problem"]
    b, h, hkv, s, d = p["batch"], p["heads"], p["kv_heads"], p["seq_q"], p["head_dim"]
    qkv = torch.randn(b, s, h + 2 * hkv, d, device="cuda", dtype=x.dtype)
    q, k, v = qkv[:, :, :h], qkv[:, :, h : h + hkv], qkv[:, :, h + hkv :]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = torch.ops.fact.attention(q, k, v, impl.handle)
    # a (B, S, H, D) buffer seen as BHSD (a unit dim's stride is free: one head, as CLIP's
    # folded heads read)
    assert out.shape == (b, h, s, d) and out.transpose(1, 2).is_contiguous(), out.stride()
    expected = nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=entry.causal, scale=entry.scale, enable_gqa=hkv != h
    )
    assert rel_err(out, expected.double()) < _tolerance(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = torch.ops.fact.attention(q, k, v, impl.handle)
    qkv.mul_(0.5)  # new values in place: the replay reads them
    graph.replay()
    expected = nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=entry.causal, scale=entry.scale, enable_gqa=hkv != h
    )
    assert rel_err(replayed, expected.double()) < _tolerance(x)


# ---------------------------------------------------------------------------------------------
# Pointwise regions: generated kernels through fact::pointwise (Llama's RoPE)


@pytest.fixture(scope="module")
def rope_optimized(tmp_path_factory):
    """RoPE on Q (8 heads of 128) and K (2 heads) straight from their projections, bf16."""
    torch.manual_seed(3)
    model = RopeProjection(width=1024, heads=8, kv_heads=2, seq=512)
    model = model.cuda().to(torch.bfloat16).eval()
    x = torch.randn(4, 512, 1024, device="cuda", dtype=torch.bfloat16)
    opt, run = _optimize_every_pattern(model, [x], tmp_path_factory, "rope")
    return model, x, opt, run


def _pointwise_decisions(opt) -> list[dict]:
    found = [p for p in opt.report["patterns"] if p["family"] == "pointwise"]
    assert len(found) == 2, opt.report["patterns"]  # RoPE on Q, RoPE on K
    return found


def test_generated_pointwise_kernels_are_verified_in_context(rope_optimized):
    """Realize built pointwise kernels for both RoPE regions; tuning left them untimed (like
    norms) and the composer checked every one against the original subgraph on the module's
    own values. Whether one is chosen depends on speed: assert verification, not speed."""
    model, x, opt, _ = rope_optimized
    for p in _pointwise_decisions(opt):
        assert p["tuning"] and all(r["source"] == "realize" for r in p["tuning"]), p
        generated = [c for c in p["candidates"] if c["impl"].startswith("generated:")]
        assert len(generated) == len(p["tuning"]), p["candidates"]
        for c in generated:
            assert c["kind"] == "generated"
            assert c["ok"] and c["error"] < 2e-2 and c["time_us"] > 0, c
        if p["chosen"].startswith("generated:"):
            assert p["time_us"] <= min(c["time_us"] for c in p["candidates"] if c["ok"])
        else:
            assert p["chosen"] == "pytorch" and p["reason"], p
    if any(p["chosen"].startswith("generated:") for p in _pointwise_decisions(opt)):
        assert _calls(opt, torch.ops.fact.pointwise.default), opt.graph_module.code
    y = torch.randn_like(x)
    with torch.no_grad():
        got, want = opt(y), model(y)
    assert rel_err(got, want) < 2e-2
    for g, w in zip(got, want, strict=True):
        assert g.stride() == w.stride()  # (b, s, h, d) in memory, as eager leaves it
    assert opt.report["verification"]["passed"]


def test_rope_module_replays_in_a_cuda_graph(rope_optimized):
    model, x, opt, _ = rope_optimized
    first, second, plain = _replayed_and_plain(opt, torch.randn_like(x))
    for f, p, s in zip(first, plain, second, strict=True):
        assert torch.equal(f, p)
        assert not torch.equal(f, s)


def test_fact_pointwise_op_runs_a_generated_kernel(rope_optimized):
    """One of the run's pointwise kernels, straight through fact::pointwise: q a transposed
    view read in place, cos and sin [S, D] broadcast, the output laid out like eager's; the
    same values as the PyTorch formula; and it records into a CUDA graph."""
    from fact.compose.optimize import generated_impl

    model, x, opt, run = rope_optimized
    p = _pointwise_decisions(opt)[0]
    plan = json.loads((run / "plan.json").read_text())
    pattern = plan["patterns"][p["index"]]
    manifest = json.loads((run / "manifest.json").read_text())
    libraries = [
        e["library"] for e in manifest if e.get("pattern_index") == p["index"] and e.get("library")
    ]
    assert libraries, "realize built no pointwise kernel"
    library = libraries[0] if os.path.isabs(libraries[0]) else str(run / libraries[0])
    impl = generated_impl(pattern, library, {})
    b, h, s, d = pattern["attrs"]["shape"]
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = (t.cuda().to(torch.bfloat16) for t in rope_tables(s, d))
    expected = apply_rope(q.double(), cos.double(), sin.double())
    eager = apply_rope(q, cos, sin)
    out = torch.ops.fact.pointwise([q, cos, sin], impl.handle, list(q.shape), list(eager.stride()))
    assert out.stride() == eager.stride() == (s * h * d, d, h * d, 1)
    assert rel_err(out, expected) < 1e-2
    # a contiguous q into a contiguous output: another dim order, the same function
    qc = q.contiguous()
    contiguous = torch.ops.fact.pointwise(
        [qc, cos, sin], impl.handle, list(q.shape), list(qc.stride())
    )
    assert contiguous.is_contiguous() and torch.equal(contiguous, out)
    with pytest.raises(FactError, match=r"in1 is torch.float32 on cuda:0, the kernel reads"):
        torch.ops.fact.pointwise(
            [q, cos.float(), sin], impl.handle, list(q.shape), list(eager.stride())
        )
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = torch.ops.fact.pointwise(
            [q, cos, sin], impl.handle, list(q.shape), list(eager.stride())
        )
    q.mul_(0.5)  # new values in place: the replay reads them
    graph.replay()
    expected = apply_rope(q.double(), cos.double(), sin.double())
    assert rel_err(replayed, expected) < 1e-2


def test_pointwise_zoo_kernels_verify_in_context(tmp_path_factory):
    """The kernels' other paths on the GPU: a strided (transposed) input, broadcast operands (a
    column, a one-column slice), a boolean mask, f32 inputs cast to bf16 with rows of 12 (4-wide
    vectors), the SwiGLU product; sizes that leave the last block partial. Every generated
    kernel must verify in context; the module must match eager."""
    model = PointwiseZoo().eval()
    x = zoo_inputs(batch=3, n=40, m=96, dtype=torch.bfloat16, device="cuda")
    opt, _ = _optimize_every_pattern(model, x, tmp_path_factory, "zoo")
    regions = [p for p in opt.report["patterns"] if p["family"] == "pointwise"]
    assert len(regions) == 4, opt.report["patterns"]
    for p in regions:
        generated = [c for c in p["candidates"] if c["impl"].startswith("generated:")]
        assert generated, p
        for c in generated:
            assert c["ok"] and c["error"] < 2e-2, (p["signature"], c)
    y = zoo_inputs(batch=3, n=40, m=96, dtype=torch.bfloat16, device="cuda", seed=5)
    with torch.no_grad():
        got, want = opt(*y), model(*y)
    for g, w in zip(got, want, strict=True):
        # eager's layout where pointwise_out can keep it (dense, last dim contiguous); r1
        # follows its transposed first operand in eager, and the kernel writes it row-major
        kept = dense_strides(list(w.shape), list(w.stride()))
        layout = w.stride() if kept else w.contiguous().stride()
        assert g.shape == w.shape and g.stride() == layout
        assert rel_err(g, w) < 2e-2
    assert want[0].stride(-1) != 1  # the case above is exercised
