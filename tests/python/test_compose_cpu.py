"""Stage 3 (composition) without a GPU: `fact.optimize` on CPU, with PyTorch twins of the
generated GEMM kernels (GemmImpl backend "reference", called through the `fact::gemm` custom op)
and PyTorch's library kernels (SDPA, rms_norm).

What is checked: the composed graph's wiring, that it reads the live model's parameters, that a
wrong implementation is rejected per pattern and a harmful one falls back end to end, the custom
op and its fake, several module forms, the report files, the user errors, the CPU path with no
implementations (and its decision cache), the torch.compile backend and `fact bench` on CPU.
Every optimize here uses the MiniGPT block at [2, 64, 768] or a smaller module.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import operator
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import fact
from attention_modules import (
    BiasedAttention,
    Float32ScoresAttention,
    FoldedHeadsAttention,
    GqaAttention,
    HandWrittenAttention,
    ScaledProjectionAttention,
)
from fact.compose import report as report_mod
from fact.compose.impls import (
    AttentionImpl,
    GemmImpl,
    HorizontalGemmImpl,
    Impl,
    NormLibrary,
    library_impls,
    run_gemm_parts_pattern,
    run_gemm_pattern,
)
from fact.compose.ops import BODIES, AttentionKernel, GemmKernel, kernel_entry, register_kernel
from fact.compose.optimize import (
    OptimizedModule,
    Progress,
    fresh_inputs,
    reference_outputs,
    rel_err,
    tolerances,
    verify_end_to_end,
)
from fact.compose.program import Program, pattern_outputs, region, replace, subgraph
from fact.errors import FactError
from fact.tune.reference import NotSupportedError, gemm_spec
from helpers import EXAMPLES, REPO

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default
SOFTMAXES = {aten.softmax.int, aten._softmax.default}
X_SHAPE = (2, 64, 768)  # the MiniGPT block at a CPU-friendly size (its tril buffer is sliced)


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Each test has its own decision cache (FACT_CACHE_DIR), so nothing leaks between tests."""
    monkeypatch.setenv("FACT_CACHE_DIR", str(tmp_path / "fact-cache"))


@pytest.fixture(scope="module")
def minigpt_module():
    """examples/minigpt_block.py, imported (Model, get_init_inputs)."""
    spec = importlib.util.spec_from_file_location(
        "fact_test_minigpt_block", EXAMPLES / "minigpt_block.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def new_minigpt(minigpt_module, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = minigpt_module.Model(*minigpt_module.get_init_inputs()).eval()
    return model, torch.randn(*X_SHAPE)


def reference_twins(index: int, pattern: dict) -> list[Impl]:
    """The PyTorch twin of a generated kernel for every GEMM pattern."""
    return [GemmImpl(pattern, "reference", label="ref")] if pattern["family"] == "gemm" else []


def calls(gm: fx.GraphModule, target) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def targets(gm: fx.GraphModule) -> set:
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def by_family(report: dict, family: str) -> list[dict]:
    return [p for p in report["patterns"] if p["family"] == family]


def eager(model: nn.Module, *args):
    with torch.no_grad():
        return model(*args)


@pytest.fixture(scope="module")
def ref_opt(engine_available, minigpt_module, tmp_path_factory):
    """MiniGPT optimized with the reference GEMM twins: (model, x, opt, run_dir). Shared: a test
    that changes the model restores it."""
    run_dir = tmp_path_factory.mktemp("ref-run")
    model, x = new_minigpt(minigpt_module, seed=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FACT_CACHE_DIR", str(tmp_path_factory.mktemp("ref-cache")))
        opt = fact.optimize(
            model,
            [x],
            precision="highest",
            implementations=reference_twins,
            require_faster=False,
            run_dir=run_dir,
            quiet=True,
        )
    return model, x, opt, Path(opt.report["run_dir"])


# Implementations that are wrong on purpose


class ScaledGemm(GemmImpl):
    """The reference twin, times 1.1: wrong by 10 %."""

    def __init__(self, pattern):
        super().__init__(pattern, "reference", label="scaled")

    def emit(self, graph, reg, pattern):
        node = super().emit(graph, reg, pattern)
        return graph.call_function(aten.mul.Tensor, (node, 1.1))


class OffsetGemm(GemmImpl):
    """The reference twin plus a constant: wrong by a little everywhere."""

    def __init__(self, pattern, offset: float):
        super().__init__(pattern, "reference", label="offset")
        self.offset = offset

    def emit(self, graph, reg, pattern):
        node = super().emit(graph, reg, pattern)
        return graph.call_function(aten.add.Tensor, (node, self.offset))


class BrokenImpl(Impl):
    """An implementation whose emit fails."""

    def __init__(self):
        super().__init__("broken", "generated")

    def emit(self, graph, reg, pattern):
        raise RuntimeError("broken emit on purpose")


def _slow_identity(t: torch.Tensor) -> torch.Tensor:
    time.sleep(0.02)
    return t


class SlowGemm(GemmImpl):
    """The reference twin, correct but 20 ms slower per call than anything it replaces here
    (far above timing noise on a loaded 2-core machine)."""

    def __init__(self, pattern):
        super().__init__(pattern, "reference", label="slow")

    def emit(self, graph, reg, pattern):
        return graph.call_function(_slow_identity, (super().emit(graph, reg, pattern),))


# Small modules


class LinearTail(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 128)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0


class FoldedNormLinear(nn.Module):
    """A LayerNorm folded into the linear after it, written out: the epilogue reads per-row
    statistics and per-column sums, and (mean * rstd) * c1 is an outer product of the two."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 128, bias=False)
        self.c1 = nn.Parameter(torch.randn(128))
        self.c2 = nn.Parameter(torch.randn(128))

    def forward(self, x, mean, rstd):
        return torch.relu(self.fc(x) * rstd - (mean * rstd) * self.c1 + self.c2)


class WeightNormLinear(nn.Module):
    """A linear whose weight is computed from parameters every call (weight normalisation)."""

    def __init__(self):
        super().__init__()
        self.v = nn.Parameter(torch.randn(32, 64))
        self.g = nn.Parameter(torch.rand(32) + 0.5)
        self.b = nn.Parameter(torch.randn(32))

    def forward(self, x):
        w = self.g[:, None] * self.v / self.v.norm(dim=1, keepdim=True)
        return torch.relu(nn.functional.linear(x, w, self.b))


class BatchedMatmul(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 64, 32) * 0.1)

    def forward(self, x):
        return torch.matmul(x, self.w)


class RMSNorm(nn.Module):
    def __init__(self, width: int = 64, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


class TwoLayerMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) + x


class QkvProjections(nn.Module):
    """Three linear layers on one input, as attention's q/k/v projections (k without a bias):
    one horizontal_gemm pattern whose three parts are each read by the rest of the module.
    `cat_all`: all three concatenated; otherwise q is added to k and v's concatenation, an add
    that q's GEMM may take as its epilogue instead (the planner weighs both)."""

    def __init__(self, d: int = 64, cat_all: bool = False):
        super().__init__()
        self.cat_all = cat_all
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d // 2, bias=False)
        self.v = nn.Linear(d, d // 2)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.cat_all:
            return torch.cat([q, k, v], dim=-1)
        return q + torch.cat([k, v], dim=-1)


class Counter(nn.Module):
    """Counts its calls in a buffer: a side effect FACT refuses to compose."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.fc(x)


class SmallGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x):
        return F.gelu(self.fc(x)) + 1.0


# ---------------------------------------------------------------------------------------------
# 1. Wiring


def test_minigpt_reference_twins_are_wired_into_the_graph(ref_opt):
    model, x, opt, run_dir = ref_opt
    gm = opt.graph_module
    gemms = calls(gm, run_gemm_pattern)
    assert len(gemms) == 4, gm.code
    assert len(calls(gm, SDPA)) == 1, gm.code
    assert not (targets(gm) & SOFTMAXES), "the hand-written softmax is still in the graph"
    assert aten.linear.default not in targets(gm), "a Linear was left unreplaced"
    for node in gemms:  # each call names a reference entry of the kernel table
        assert node.kwargs["form"] == "linear"
        assert kernel_entry(node.kwargs["kernel"]).backend == "reference"
    # the causal mask became is_causal, with the block's 1/sqrt(96) scale
    (sdpa,) = calls(gm, SDPA)
    assert sdpa.kwargs["is_causal"] is True
    assert sdpa.kwargs["scale"] == pytest.approx(96**-0.5)


def test_minigpt_reference_twins_match_eager_on_fresh_inputs(ref_opt):
    model, x, opt, _ = ref_opt
    assert isinstance(opt, OptimizedModule)
    for seed in (1, 2):
        inputs = fresh_inputs([x], seed)
        assert not torch.equal(inputs[0], x)
        out = opt(*inputs)
        assert out.shape == X_SHAPE and out.dtype == torch.float32
        assert rel_err(out, eager(model, *inputs)) < 1e-5


def test_minigpt_reference_twins_report_and_decisions(ref_opt):
    _, _, opt, run_dir = ref_opt
    report = opt.report
    plan = json.loads((run_dir / "plan.json").read_text())
    assert report["replaced"] == 5
    assert len(report["patterns"]) == len(plan["patterns"]) == 7
    assert [p["index"] for p in report["patterns"]] == list(range(7))
    chosen = sorted(p["chosen"] for p in report["patterns"])
    assert chosen == ["pytorch"] * 2 + ["reference:ref"] * 4 + ["sdpa"]
    for p in report["patterns"]:
        if p["chosen"] == "pytorch":
            assert p["kind"] == "pytorch"
            assert p["reason"], f"pattern {p['index']} kept as PyTorch without a reason"
        else:
            assert not p.get("fallback")
            assert p["error"] is not None and p["error"] <= 1e-5
            assert p["time_us"] > 0 and p["eager_us"] > 0
    for p in by_family(report, "gemm"):
        assert p["kind"] == "generated"
    (attention,) = by_family(report, "attention")
    assert (attention["chosen"], attention["kind"]) == ("sdpa", "library")
    for p in by_family(report, "norm"):  # LayerNorm: generated kernels only, and no GPU here
        assert p["chosen"] == "pytorch" and p["reason"].startswith("no GPU")
    ver = report["verification"]
    assert ver["passed"] and ver["reference"] == "float64" and ver["error"] <= ver["bound"]
    assert len(ver["attempts"]) == 1 and sorted(ver["attempts"][0]["patterns"]) == [0, 1, 2, 3, 4]
    assert report["warm"] is False and report["cuda_graphs"] is False
    # the run directory holds the plan, the graph, the report and the transcript; no LayerNorm
    # was folded (off by default) and none planned again
    assert report["folds"] == report["folds_dropped"] == [] and run_dir.name.startswith("ref-run")
    saved = json.loads((run_dir / "optimize.json").read_text())
    assert saved["replaced"] == 5 and saved["model"] == "Model"
    assert (run_dir / "graph.json").is_file()
    assert "end-to-end check" in (run_dir / "transcript.txt").read_text()


# ---------------------------------------------------------------------------------------------
# 2. Parameter sharing


class _SeenOps(TorchDispatchMode):
    """Records every op that reaches the dispatcher."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _dispatched_fact_ops(fn) -> list[str]:
    """Names of the fact ops that went through PyTorch's dispatcher while fn ran."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("fact::")]


def test_the_eager_path_calls_the_fact_ops_bodies_not_the_dispatcher(ref_opt):
    _, x, opt, _ = ref_opt
    flat, state = opt._program.flatten([x], {}), opt._program.state_inputs()
    with torch.no_grad():
        assert _dispatched_fact_ops(lambda: opt.graph_module(*state, *flat)) == ["fact::gemm"] * 4
        assert _dispatched_fact_ops(lambda: opt(x)) == []  # the bodies, called directly
        want = opt.graph_module(*state, *flat)
        got = opt.run_graph(flat, state)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    # the composed graph is left as it was
    assert all(not n.kwargs.get("direct") for n in calls(opt.graph_module, run_gemm_pattern))


def test_the_module_launches_dependents_unless_told_not_to(ref_opt, monkeypatch):
    """The composed module's kernels launch as programmatic dependents (ops.py) by default;
    `pdl = False`, or a call within dependent_launches(False), makes them launch plainly, and
    the setting ends with the call. FACT_PDL=0 in the environment turns the default off."""
    from fact.compose import ops

    _, x, opt, _ = ref_opt
    seen = []
    real = ops.pytorch_candidate  # what the reference kernels run

    def spy(*args):
        seen.append(ops.dependent_launches_enabled())
        return real(*args)

    monkeypatch.setattr(ops, "pytorch_candidate", spy)
    assert opt.pdl
    with torch.no_grad():
        opt(x)
        opt.pdl = False
        try:
            opt(x)
        finally:
            opt.pdl = True
        with ops.dependent_launches(False):
            opt(x)
    assert seen == [True] * 4 + [False] * 8
    assert ops.dependent_launches_enabled()
    with ops.dependent_launches(False):
        assert not ops.dependent_launches_enabled()
    code = "from fact.compose import ops; print(ops.dependent_launches_enabled())"
    env = {**os.environ, "FACT_PDL": "off"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_dispatch_modes_and_torch_compile_see_the_fact_ops(ref_opt):
    _, x, opt, _ = ref_opt
    with torch.no_grad(), _SeenOps() as mode:  # FLOP counters, make_fx, fake tensors: modes
        out = opt(x)
    assert [f for f in mode.ops if f.namespace == "fact"] == [torch.ops.fact.gemm.default] * 4
    traced = []

    def backend(gm, example_inputs):
        traced.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(opt, backend=backend)  # graph breaks at the buffer guard
    assert torch.equal(compiled(x), out)
    assert traced.count(torch.ops.fact.gemm.default) == 4


def test_optimized_module_reads_the_live_parameters(engine_available, minigpt_module, tmp_path):
    model, x = new_minigpt(minigpt_module, seed=3)
    opt = fact.optimize(
        model, [x], implementations=reference_twins, require_faster=False, run_dir=tmp_path / "r"
    )
    assert opt.report["replaced"] == 5
    params = list(opt.parameters())
    assert len(params) == len(list(model.parameters()))
    assert all(a is b for a, b in zip(params, model.parameters(), strict=True))
    state = opt.state_dict()
    assert state["original.mlp.c_fc.weight"].data_ptr() == model.mlp.c_fc.weight.data_ptr()

    before = opt(x)
    assert rel_err(before, eager(model, x)) < 1e-5
    # an in-place update of a weight a generated GEMM reads
    with torch.no_grad():
        model.mlp.c_fc.weight.mul_(2)
    after = opt(x)
    assert rel_err(after, before) > 1e-3, "the optimized module did not see the in-place update"
    assert rel_err(after, eager(model, x)) < 1e-5
    # a new Parameter assigned to the attribute
    new_weight = nn.Parameter(torch.randn_like(model.attn.c_proj.weight) * 0.05)
    model.attn.c_proj.weight = new_weight
    model.attn.c_proj.bias = nn.Parameter(torch.randn_like(model.attn.c_proj.bias))
    replaced = opt(x)
    assert rel_err(replaced, after) > 1e-3, "the optimized module did not see the new Parameter"
    assert rel_err(replaced, eager(model, x)) < 1e-5
    assert any(p is new_weight for p in opt.parameters())


def test_in_place_update_of_the_causal_mask_buffer_is_seen(ref_opt):
    """The plan baked the tril buffer in as is_causal=True: after the buffer changes, the module
    says so once and runs the original graph, which reads the buffer."""
    model, x, opt, _ = ref_opt
    saved = model.attn.bias.clone()
    before = eager(model, x)
    assert rel_err(opt(x), before) < 1e-5
    try:
        with torch.no_grad():
            model.attn.bias.fill_(1.0)  # no mask at all: eager attends to the future now
        assert rel_err(eager(model, x), before) > 1e-3  # the update matters to eager
        with pytest.warns(
            UserWarning, match=r"tensor attributes \['attn.bias'\] changed after optimize"
        ):
            assert rel_err(opt(x), eager(model, x)) < 1e-5
    finally:
        with torch.no_grad():
            model.attn.bias.copy_(saved)


# ---------------------------------------------------------------------------------------------
# 3. Fallback


def test_wrong_implementations_are_rejected_per_pattern(engine_available, tmp_path):
    torch.manual_seed(4)
    model, x = TwoLayerMLP().eval(), torch.randn(2, 16, 64)
    offered = {}

    def impls(index, pattern):
        if pattern["family"] != "gemm":
            return []
        if "relu" in pattern["signature"]:
            offered[index] = "scaled"
            return [ScaledGemm(pattern)]
        offered[index] = "broken+ref"
        return [BrokenImpl(), GemmImpl(pattern, "reference", label="ref")]

    opt = fact.optimize(
        model, [x], implementations=impls, require_faster=False, run_dir=tmp_path / "r"
    )
    assert sorted(offered.values()) == ["broken+ref", "scaled"]
    patterns = {p["index"]: p for p in opt.report["patterns"]}
    scaled = patterns[next(i for i, v in offered.items() if v == "scaled")]
    assert scaled["chosen"] == "pytorch"
    assert scaled["reason"].startswith("kept PyTorch (reference:scaled: error ")
    assert "exceeds 1e-05" in scaled["reason"]
    (cand,) = scaled["candidates"]
    assert not cand["ok"] and cand["error"] == pytest.approx(0.1, rel=1e-3)
    other = patterns[next(i for i, v in offered.items() if v == "broken+ref")]
    assert other["chosen"] == "reference:ref"
    broken, ref = other["candidates"]
    assert not broken["ok"]
    assert broken["message"] == "RuntimeError: broken emit on purpose"
    assert ref["ok"] and ref["error"] < 1e-6
    assert opt.report["replaced"] == 1
    assert len(calls(opt.graph_module, run_gemm_pattern)) == 1
    assert aten.mul.Tensor not in targets(opt.graph_module)  # the * 1.1 never made it in
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


def test_candidates_and_the_subgraph_take_turns(ref_opt):
    """Each verified candidate and the PyTorch subgraph are timed in CHECK_ROUNDS interleaved
    turns; the times compared are the medians of the turns."""
    import statistics

    from fact.compose.optimize import CHECK_ROUNDS

    _, _, opt, _ = ref_opt
    checked = [p for p in opt.report["patterns"] if p["candidates"]]
    assert checked
    for p in checked:
        for row, prefix in [(p, "eager_"), *((c, "") for c in p["candidates"] if c["ok"])]:
            t = row[f"{prefix}timing"]
            for protocol in ("per_call", "back_to_back"):
                assert len(t[f"{protocol}_turns_us"]) == CHECK_ROUNDS
                assert t[f"{protocol}_us"] == statistics.median(t[f"{protocol}_turns_us"])
            assert row["eager_us" if prefix else "time_us"] == t["per_call_us"]


def test_require_faster_keeps_pytorch_when_the_implementation_is_slower(engine_available, tmp_path):
    torch.manual_seed(5)
    model, x = LinearTail().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(
        model,
        [x],
        implementations=lambda i, p: [SlowGemm(p)] if p["family"] == "gemm" else [],
        require_faster=True,
        run_dir=tmp_path / "r",
    )
    (p,) = opt.report["patterns"]
    assert p["chosen"] == "pytorch"
    assert "reference:slow: not faster than the PyTorch subgraph under both" in p["reason"]
    assert p["candidates"][0]["time_us"] > p["eager_us"]
    assert opt.report["replaced"] == 0
    assert not calls(opt.graph_module, run_gemm_pattern)
    assert rel_err(opt(x), eager(model, x)) == 0.0


def test_verify_end_to_end_falls_back_on_a_pattern_that_breaks_the_module(ref_opt):
    model, x, opt, run_dir = ref_opt
    program = opt._program
    plan = json.loads((run_dir / "plan.json").read_text())
    patterns = plan["patterns"]
    final = next(n for n in program.graph_module.graph.nodes if n.op == "output").args[0][0].name
    bad_index = next(i for i, p in enumerate(patterns) if p["output"] == final)
    good_index = next(i for i, p in enumerate(patterns) if "gelu" in p["signature"])
    assert patterns[bad_index]["family"] == patterns[good_index]["family"] == "gemm"
    decisions = []
    for i, p in enumerate(patterns):
        d = {"index": i, "family": p["family"], "reason": ""}
        if i == good_index:
            d.update(impl=GemmImpl(p, "reference", label="good"), error=1e-7)
        elif i == bad_index:  # claims a tiny per-pattern error; adds 0.01 to the block's output
            d.update(impl=OffsetGemm(p, 0.01), error=5e-6)
        decisions.append(d)
    tol = tolerances(torch.float32, "highest")[1]
    assert tol == 1e-4
    gm, record = verify_end_to_end(model, program, plan, decisions, [x], tol, Progress(quiet=True))

    assert record["passed"] is True and record["error"] <= record["bound"]
    assert record["reference"] == "float64" and record["bound"] == pytest.approx(1e-4)
    first, last = record["attempts"]
    assert sorted(first["patterns"]) == sorted([good_index, bad_index])
    assert first["error"] > 1e-3  # the offset broke the module end to end
    assert last["patterns"] == [good_index] and last["error"] < 1e-6
    bad, good = decisions[bad_index], decisions[good_index]
    assert bad["fallback"] is True
    assert bad["reason"].startswith("fell back to PyTorch: the module's end-to-end error was ")
    assert "bound 0.0001" in bad["reason"]
    assert not good.get("fallback")
    assert len(calls(gm, run_gemm_pattern)) == 1
    assert aten.add.Tensor in targets(gm)  # the bad pattern's residual add is back
    inputs = fresh_inputs([x], 9)
    out = program.unflatten(list(gm(*program.state_inputs(), *program.flatten(inputs))))
    assert rel_err(out, eager(model, *inputs)) < 1e-5


# ---------------------------------------------------------------------------------------------
# 4. The custom op


BIAS_RELU = {
    "family": "gemm",
    "rule": "gemm_epilogue",
    "problem": {"batch": 1, "m": 32, "n": 48, "k": 16},
    "attrs": {
        "dtype_a": "f32",
        "dtype_b": "f32",
        "dtype_out": "f32",
        "layout_a": "row",
        "layout_b": "row",
    },
    "operands": [
        {"node": "x", "role": "a", "type": "f32[32, 16]"},
        {"node": "w", "role": "b", "type": "f32[16, 48]"},
        {"node": "bias", "role": "bias", "broadcast": "row", "type": "f32[48]"},
    ],
    "epilogue": ["bias", "relu"],
    "epilogue_expr": {
        "ssa": [
            {"id": 0, "op": "acc"},
            {"id": 1, "op": "operand", "index": 0},
            {"id": 2, "op": "add", "args": [0, 1]},
            {"id": 3, "op": "relu", "args": [2]},
        ],
        "text": "relu(acc + bias)",
    },
    "signature": "gemm[bias+relu]:f32,f32->f32:row,row",
}


def test_fact_gemm_reference_kernel_matches_torch():
    handle = register_kernel(GemmKernel(gemm_spec(BIAS_RELU), "reference", label="bias_relu"))
    assert kernel_entry(handle).label == "bias_relu"
    torch.manual_seed(6)
    a, b, bias = torch.randn(32, 16), torch.randn(16, 48), torch.randn(48)
    out = torch.ops.fact.gemm(a, b, [bias], handle)
    expected = torch.relu(a @ b + bias)
    assert out.shape == (32, 48) and out.dtype == torch.float32
    assert (out == 0).any() and (out > 0).any()  # the relu did something
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # batched, with a column-major B view
    a3, b3 = torch.randn(3, 32, 16), torch.randn(3, 48, 16).transpose(1, 2)
    out3 = torch.ops.fact.gemm(a3, b3, [bias], handle)
    torch.testing.assert_close(out3, torch.relu(torch.bmm(a3, b3) + bias), rtol=1e-5, atol=1e-5)


def test_fact_gemm_fake_impl_and_opcheck():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    handle = register_kernel(GemmKernel(gemm_spec(BIAS_RELU), "reference"))
    half_out = dict(BIAS_RELU, attrs=dict(BIAS_RELU["attrs"], dtype_out="bf16"))
    handle_bf16 = register_kernel(GemmKernel(gemm_spec(half_out), "reference"))
    a, b, bias = torch.randn(32, 16), torch.randn(16, 48), torch.randn(48)
    a3, b3 = torch.randn(3, 32, 16), torch.randn(3, 16, 48)
    with FakeTensorMode() as mode:
        fa, fb, fbias = mode.from_tensor(a), mode.from_tensor(b), mode.from_tensor(bias)
        fa3, fb3 = mode.from_tensor(a3), mode.from_tensor(b3)
        out = torch.ops.fact.gemm(fa, fb, [fbias], handle)
        out3 = torch.ops.fact.gemm(fa3, fb3, [fbias], handle)
        out_bf16 = torch.ops.fact.gemm(fa, fb, [fbias], handle_bf16)
    assert isinstance(out, FakeTensor)
    assert (out.shape, out.dtype) == ((32, 48), torch.float32)
    assert (out3.shape, out3.dtype) == ((3, 32, 48), torch.float32)
    assert (out_bf16.shape, out_bf16.dtype) == ((32, 48), torch.bfloat16)
    real = torch.ops.fact.gemm(a, b, [bias], handle_bf16)
    assert real.dtype == torch.bfloat16  # the fake agrees with the real op
    for args in [(a, b, [bias], handle), (a3, b3, [bias], handle)]:
        result = torch.library.opcheck(torch.ops.fact.gemm.default, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_kernel_table_rejects_bad_entries():
    spec = gemm_spec(BIAS_RELU)
    with pytest.raises(FactError, match="backend 'triton'"):
        register_kernel(GemmKernel(spec, "triton"))
    with pytest.raises(FactError, match="needs its loaded library"):
        register_kernel(GemmKernel(spec, "cutlass"))
    with pytest.raises(FactError, match="no kernel with handle"):
        kernel_entry(10**9)
    with pytest.raises(NotSupportedError):
        GemmImpl(dict(BIAS_RELU, family="attention"), "reference")


# ---------------------------------------------------------------------------------------------
# 5. Module forms


def test_linear_with_pointwise_tail(engine_available, tmp_path):
    torch.manual_seed(7)
    model, x = LinearTail().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(
        model, [x], implementations=reference_twins, require_faster=False, run_dir=tmp_path / "r"
    )
    (p,) = opt.report["patterns"]
    assert p["family"] == "gemm" and "relu" in p["signature"] and "bias" in p["signature"]
    assert p["chosen"] == "reference:ref" and p["kind"] == "generated"
    (node,) = calls(opt.graph_module, run_gemm_pattern)
    assert node.kwargs["form"] == "linear" and node.kwargs["out_shape"] == [4, 16, 128]
    assert not (targets(opt.graph_module) & {aten.relu.default, aten.linear.default})
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-6


class InPlaceBiasTail(nn.Module):
    """A hand-written tail in the in-place style: a bias expanded against the product, then
    writes into the product's own storage."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(128, 64) / 8)
        self.b = nn.Parameter(torch.randn(128))

    def forward(self, x):
        y = x @ self.w.T
        y = y + self.b.expand_as(y)
        y.add_(1.0)
        F.hardtanh_(y, -2.0, 2.0)
        return y.mul_(0.5)


def test_in_place_tail_runs_in_the_epilogue(engine_available, tmp_path):
    torch.manual_seed(3)
    model, x = InPlaceBiasTail().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(
        model, [x], implementations=reference_twins, require_faster=False, run_dir=tmp_path / "r"
    )
    (p,) = opt.report["patterns"]
    assert p["family"] == "gemm" and p["chosen"] == "reference:ref", p
    assert p["signature"].startswith("gemm[bias+add+hardtanh+scale]:"), p
    left = targets(opt.graph_module)
    assert not left & {aten.add_.Tensor, aten.hardtanh_.default, aten.mul_.Tensor}
    assert aten.matmul.default not in left
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-6


def test_outer_product_operand_is_computed_in_the_epilogue(engine_available, tmp_path):
    torch.manual_seed(9)
    model = FoldedNormLinear().eval()
    args = [torch.randn(4, 16, 64), torch.randn(4, 16, 1), torch.rand(4, 16, 1) + 0.5]
    opt = fact.optimize(
        model, args, implementations=reference_twins, require_faster=False, run_dir=tmp_path / "r"
    )
    (p,) = opt.report["patterns"]
    assert p["chosen"] == "reference:ref"
    (node,) = calls(opt.graph_module, run_gemm_pattern)
    # no PyTorch op is left: the kernel reads mean * rstd (a column), c1, rstd and c2
    assert not (targets(opt.graph_module) & {aten.relu.default, aten.sub.Tensor, aten.add.Tensor})
    assert len(calls(opt.graph_module, aten.mul.Tensor)) == 1  # mean * rstd: 64 values
    fresh = [torch.randn(4, 16, 64), torch.randn(4, 16, 1), torch.rand(4, 16, 1) + 0.5]
    assert rel_err(opt(*fresh), eager(model, *fresh)) < 1e-6


def test_work_on_parameters_alone_is_done_once_and_again_when_they_change(
    engine_available, tmp_path
):
    torch.manual_seed(10)
    model, x = WeightNormLinear().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(
        model, [x], implementations=reference_twins, require_faster=False, run_dir=tmp_path / "r"
    )
    assert len(calls(opt.graph_module, run_gemm_pattern)) == 1
    hoist = opt._hoist
    assert hoist.hoisted_names, "the weight's computation was not hoisted"
    per_call = {n.target for n in hoist.main.graph.nodes if n.op == "call_function"}
    assert not per_call & {aten.div.Tensor, aten.linalg_vector_norm.default}

    computed = []
    prologue = hoist.prologue
    hoist.prologue = lambda *state: computed.append(1) or prologue(*state)
    y = torch.randn_like(x)
    first = opt(y)
    kept = list(hoist.values(opt._program.state_inputs()))
    assert rel_err(opt(y), eager(model, y)) < 1e-6
    assert len(computed) == 1, "the hoisted work ran again with unchanged parameters"
    # an in-place update of a parameter it reads: computed again, into the same tensors
    with torch.no_grad():
        model.g.mul_(2)
    updated = opt(y)
    assert len(computed) == 2
    assert rel_err(updated, first) > 1e-3 and rel_err(updated, eager(model, y)) < 1e-6
    assert all(a is b for a, b in zip(kept, hoist.values(opt._program.state_inputs()), strict=True))
    # a new Parameter assigned to the attribute
    model.v = nn.Parameter(torch.randn(32, 64))
    assert rel_err(opt(y), eager(model, y)) < 1e-6 and len(computed) == 3
    # a parameter the hoisted work does not read: nothing computed again
    with torch.no_grad():
        model.b.add_(1)
    assert rel_err(opt(y), eager(model, y)) < 1e-6 and len(computed) == 3


def test_a_first_call_under_inference_mode_keeps_parameter_work_updatable(
    engine_available, tmp_path
):
    """The work on parameters alone, first computed under torch.inference_mode(), is kept as
    normal tensors: a later update outside it is copied in, not refused for good."""
    torch.manual_seed(38)
    model, x = WeightNormLinear().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    assert opt._hoist.hoisted_names
    with torch.inference_mode():
        assert rel_err(opt(x), eager(model, x)) < 1e-6
    with torch.no_grad():
        model.g.mul_(2)
    assert rel_err(opt(x), eager(model, x)) < 1e-6
    with torch.inference_mode():
        model.g.mul_(0.5)  # an update made under inference mode
        assert rel_err(opt(x), model(x)) < 1e-6


def test_writes_through_data_are_seen_after_refresh(engine_available, tmp_path):
    """`.data` writes bump no version counter: the kept work on parameters and the watched
    masks cannot see them, and opt.refresh() says to look again."""
    torch.manual_seed(39)
    model, x = WeightNormLinear().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    before = opt(x)
    model.g.data.mul_(2)
    assert torch.equal(opt(x), before)  # the documented limit: unseen
    opt.refresh()
    assert rel_err(opt(x), eager(model, x)) < 1e-6 and rel_err(opt(x), before) > 1e-3

    attn = HandWrittenAttention().eval()
    y = torch.randn(2, 32, 64)
    opt = fact.optimize(attn, [y], implementations=attention_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "a", quiet=True)  # fmt: skip
    saved = attn.bias.clone()
    try:
        attn.bias.data.fill_(1.0)  # no mask at all now
        opt.refresh()
        with pytest.warns(UserWarning, match=r"\['bias'\] changed after optimize"):
            assert rel_err(opt(y), eager(attn, y)) < 1e-6
    finally:
        attn.bias.data.copy_(saved)


def test_an_optimized_module_copies_but_refuses_to_be_pickled(ref_opt):
    """A deep copy runs on its own copy of the model; pickling (torch.save) fails at once with
    what to do instead, not later at load time."""
    import copy as copy_mod
    import io
    import pickle

    model, x, opt, _ = ref_opt
    twin = copy_mod.deepcopy(opt)
    assert twin.original is not model and rel_err(twin(x), opt(x)) == 0.0
    for save in (lambda: pickle.dumps(opt), lambda: torch.save(opt, io.BytesIO())):
        with pytest.raises(FactError, match="cannot be pickled.*fact.save"):
            save()


class PlainAttributes(nn.Module):
    """A gain and a tril mask kept as plain tensor attributes, not buffers: torch.export lifts
    them as constants."""

    def __init__(self, seq=16):
        super().__init__()
        self.inner = HandWrittenAttention(seq=seq)
        del self.inner.bias
        self.inner.bias = torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq)
        self.gain = torch.full((64,), 2.0)

    def forward(self, x):
        return self.inner(x) * self.gain


def test_plain_tensor_attributes_are_read_live_and_watched(engine_available, tmp_path):
    torch.manual_seed(40)
    model, x = PlainAttributes().eval(), torch.randn(2, 16, 64)
    opt = fact.optimize(model, [x], implementations=attention_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    assert [a["family"] for a in opt.report["patterns"] if a["chosen"] != "pytorch"].count(
        "attention"
    ) == 1
    model.gain = torch.full((64,), -1.0)  # a new tensor for the attribute
    assert rel_err(opt(x), eager(model, x)) < 1e-6
    model.gain.mul_(3)  # and one updated in place
    assert rel_err(opt(x), eager(model, x)) < 1e-6
    model.inner.bias.fill_(1.0)  # the mask the plan turned into a causal flag
    with pytest.warns(UserWarning, match=r"\['inner.bias'\] changed after optimize"):
        assert rel_err(opt(x), eager(model, x)) < 1e-6


def test_hoisted_values_never_reach_the_caller():
    """A model returning work on its parameters (or a view of it): the caller may write to what
    it gets, and a recomputation must not overwrite it, so that work stays per call."""
    from fact.compose.hoist import Hoist

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 4))

        def forward(self, x):
            w2 = self.w * 2
            return x @ (self.w * 3).t(), w2.t()

    exported = torch.export.export(M(), (torch.randn(3, 4),))
    hoist = Hoist(exported.graph_module, 1)
    assert len(hoist.hoisted_names) == 1  # w * 3; not w * 2, returned through a view
    w, x = exported.state_dict["w"], torch.randn(3, 4)
    _, first = hoist([w], [x])
    first.zero_()
    _, again = hoist([w], [x])
    assert torch.equal(again, (w * 2).t())


def test_hoist_keeps_views_and_random_ops_per_call():
    from fact.compose.hoist import Hoist

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 4))

        def forward(self, x):
            return x @ self.w.t() + torch.rand(8) * (self.w * 2).sum(0).sum()

    exported = torch.export.export(M(), (torch.randn(3, 4),))
    gm = exported.graph_module
    hoist = Hoist(gm, 1)
    # w.t() is a view (free): per call; (w * 2).sum(0).sum() is hoisted; rand stays per call
    assert len(hoist.hoisted_names) == 1 and "sum" in hoist.hoisted_names[0]
    main_targets = [str(n.target) for n in hoist.main.graph.nodes if n.op == "call_function"]
    assert any("rand" in t for t in main_targets) and any("t.default" in t for t in main_targets)
    w, x = exported.state_dict["w"], torch.randn(3, 4)
    torch.manual_seed(0)
    want = gm(w, x)[0]
    torch.manual_seed(0)
    got = hoist([w], [x])[0]
    assert torch.allclose(got, want)


def test_batched_matmul(engine_available, tmp_path):
    torch.manual_seed(8)
    model, x = BatchedMatmul().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(
        model, [x], implementations=reference_twins, require_faster=False, run_dir=tmp_path / "r"
    )
    (p,) = opt.report["patterns"]
    assert p["family"] == "gemm" and p["chosen"] == "reference:ref"
    (node,) = calls(opt.graph_module, run_gemm_pattern)
    assert node.kwargs["form"] == "matmul"
    assert kernel_entry(node.kwargs["kernel"]).spec.problem["batch"] == 4
    y = torch.randn_like(x)
    out = opt(y)
    assert out.shape == (4, 16, 32)
    assert rel_err(out, eager(model, y)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hand_written_rms_norm_runs_as_torch_rms_norm(engine_available, tmp_path, dtype):
    torch.manual_seed(9)
    model = RMSNorm().to(dtype).eval()
    x = torch.randn(4, 16, 64, dtype=dtype)
    opt = fact.optimize(
        model, [x], implementations=reference_twins, require_faster=False, run_dir=tmp_path / "r"
    )
    (p,) = opt.report["patterns"]
    assert p["family"] == "norm" and "rms_norm" in p["signature"]
    assert (p["chosen"], p["kind"]) == ("rms_norm", "library")
    assert p["error"] <= tolerances(dtype, "highest")[0]
    (node,) = calls(opt.graph_module, aten.rms_norm.default)
    assert node.args[3] == pytest.approx(1e-6)
    assert aten.rsqrt.default not in targets(opt.graph_module)
    y = torch.randn_like(x)
    out, ref = opt(y), eager(model, y)
    assert out.dtype == ref.dtype == dtype
    assert rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)


class HandLayerNorm(nn.Module):
    """LayerNorm written out: "bert" as BERT's TensorFlow port writes it (x - u twice, divided
    by sqrt(s + eps), then weight and bias); "var" with x.var(unbiased=False) and the weight
    multiplied first."""

    def __init__(self, form="bert", width=64, eps=1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)
        self.bias = nn.Parameter(torch.randn(width))
        self.form, self.eps = form, eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        if self.form == "var":
            var = x.var(-1, keepdim=True, unbiased=False)
            return self.weight * (x - u) / torch.sqrt(var + self.eps) + self.bias
        s = (x - u).pow(2).mean(-1, keepdim=True)
        return self.weight * ((x - u) / torch.sqrt(s + self.eps)) + self.bias


@pytest.mark.parametrize("form", ["bert", "var"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hand_written_layer_norm_runs_as_torch_layer_norm(engine_available, tmp_path, dtype, form):
    """One norm pattern (not an RMS norm of x - u beside pointwise work), run as torch's
    layer_norm in f32 with the model's weight and bias after it."""
    torch.manual_seed(47)
    model = HandLayerNorm(form).to(dtype).eval()
    x = torch.randn(4, 16, 64, dtype=dtype) * 3 + 1
    opt = fact.optimize(model, [x], require_faster=False, use_cache=False,
                        run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (p,) = opt.report["patterns"]
    assert p["family"] == "norm" and "layer_norm" in p["signature"], p
    assert (p["chosen"], p["kind"]) == ("layer_norm", "library"), p
    assert opt.report["pytorch_nodes"] == []
    assert aten.sqrt.default not in targets(opt.graph_module)
    y = torch.randn_like(x) * 3 + 1
    out, ref = opt(y), eager(model, y)
    assert out.dtype == ref.dtype == dtype
    assert rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_library_impls_apply_by_family_and_kind(ref_opt):
    _, _, _, run_dir = ref_opt
    plan = json.loads((run_dir / "plan.json").read_text())
    for p in plan["patterns"]:
        names = [i.name for i in library_impls(p)]
        assert names == {"attention": ["sdpa"]}.get(p["family"], []), (p["signature"], names)
    norm = next(p for p in plan["patterns"] if p["family"] == "norm")
    with pytest.raises(NotSupportedError, match="already is torch's layer_norm"):
        NormLibrary(norm)


# ---------------------------------------------------------------------------------------------
# Graph surgery


def test_region_and_replace_with_aliases():
    torch.manual_seed(10)
    model, x = TwoLayerMLP().eval(), torch.randn(2, 16, 64)
    program = Program(model, torch.export.export(model, (x,), strict=False))
    graph = program.copy_graph()
    names = [n.name for n in graph.nodes if n.op == "call_function"]
    assert names == ["linear", "relu", "linear_1", "add"]
    # an inner node read outside the pattern cannot be replaced as a whole
    with pytest.raises(FactError, match="also read outside the pattern"):
        region(graph, {"nodes": ["linear", "relu", "linear_1"], "output": "relu"})
    with pytest.raises(FactError, match="stale plan"):
        region(graph, {"nodes": ["linear_9"], "output": "linear_9"})
    reg = region(graph, {"nodes": ["linear", "relu"], "output": "relu"})
    assert [n.name for n in reg.inputs] == ["x", "p_fc1_weight", "p_fc1_bias"]
    with pytest.raises(FactError, match="not an input"):
        reg.input("relu")

    aliases: dict = {}

    def emit_relu_linear(g, r, pattern):
        lin = g.call_function(aten.linear.default, (r.input("x"), r.inputs[1], r.inputs[2]))
        return g.call_function(aten.clamp_min.default, (lin, 0.0))

    new = replace(graph, {"nodes": ["linear", "relu"], "output": "relu"}, emit_relu_linear, aliases)
    assert aliases == {"relu": new} and "val" in new.meta
    # a later pattern that reads the old output name finds the replacement through the alias
    reg2 = region(graph, {"nodes": ["linear_1", "add"], "output": "add"}, aliases)
    assert reg2.input("relu") is new
    names = [n.name for n in graph.nodes if n.op == "call_function"]
    assert "relu" not in names and "linear" not in names
    gm = program.module(graph)
    out = program.unflatten(list(gm(*program.inputs([x]))))
    assert rel_err(out, eager(model, x)) < 1e-6


QKV_PARTS = ["linear", "linear_1", "linear_2"]
QKV_PATTERN = {"family": "horizontal_gemm", "nodes": QKV_PARTS, "anchors": QKV_PARTS,
               "output": "linear", "attrs": {"parts": QKV_PARTS}, "signature": "qkv"}  # fmt: skip


def _qkv_linears(x, wq, bq, wk, wv, bv):
    return F.linear(x, wq, bq), F.linear(x, wk), F.linear(x, wv, bv)


def test_region_subgraph_and_replace_with_several_outputs():
    torch.manual_seed(11)
    model, x = QkvProjections().eval(), torch.randn(2, 8, 64)
    program = Program(model, torch.export.export(model, (x,), strict=False))
    graph = program.copy_graph()
    assert [n.name for n in graph.nodes if n.op == "call_function"] == [*QKV_PARTS, "cat", "add"]
    assert pattern_outputs(QKV_PATTERN) == QKV_PARTS
    assert pattern_outputs({"family": "gemm", "nodes": QKV_PARTS, "output": "linear"}) == ["linear"]
    # every part is read outside the pattern: allowed for outputs, not for inner nodes
    reg = region(graph, QKV_PATTERN)
    assert [n.name for n in reg.outputs] == QKV_PARTS and reg.output is reg.outputs[0]
    assert [n.name for n in reg.inputs] == [
        "x", "p_q_weight", "p_q_bias", "p_k_weight", "p_v_weight", "p_v_bias"]  # fmt: skip
    with pytest.raises(FactError, match=r"nodes \['linear_1', 'linear_2'\] are also read outside"):
        region(graph, {"nodes": QKV_PARTS, "output": "linear"})
    with pytest.raises(FactError, match="pattern output 'cat' is not one of its nodes"):
        region(graph, dict(QKV_PATTERN, attrs={"parts": ["linear", "cat"]}))

    # the standalone subgraph returns every part
    values = program.capture(program.inputs([x]))
    sub, names, _ = subgraph(graph, QKV_PATTERN)
    got = program.module(sub)(*[values[n] for n in names])
    assert isinstance(got, tuple) and len(got) == 3
    assert all(torch.equal(g, values[name]) for g, name in zip(got, QKV_PARTS, strict=True))

    aliases: dict = {}

    def emit(g, r, pattern):
        return g.call_function(_qkv_linears, tuple(r.inputs))

    new = replace(graph, QKV_PATTERN, emit, aliases)
    items = [aliases[name] for name in QKV_PARTS]  # each old part's name -> its getitem
    assert [(i.target, i.args) for i in items] == [(operator.getitem, (new, j)) for j in range(3)]
    assert [tuple(i.meta["val"].shape) for i in items] == [(2, 8, 64), (2, 8, 32), (2, 8, 32)]
    assert [tuple(v.shape) for v in new.meta["val"]] == [(2, 8, 64), (2, 8, 32), (2, 8, 32)]
    assert aten.linear.default not in {n.target for n in graph.nodes}
    graph.lint()
    cat = next(n for n in graph.nodes if n.name == "cat")
    assert cat.args[0] == [items[1], items[2]]
    # a later pattern that reads a part finds its getitem through the alias
    assert region(graph, {"nodes": ["cat"], "output": "cat"}, aliases).input("linear_2") is items[2]
    out = program.unflatten(list(program.module(graph)(*program.inputs([x]))))
    assert torch.equal(out, eager(model, x))


def test_replace_with_several_outputs_moves_up_what_a_later_output_reads():
    """An input of a later output computed after the first one (x * 2) moves up before the one
    call; with an in-place write in between it cannot, and replace refuses."""
    aten_ops = torch.ops.aten

    def late(x, w1, w2):
        return F.linear(x, w1), F.linear(aten_ops.mul.Tensor(x, 2), w2)

    def written(x, w1, w2):
        first = F.linear(x, w1)
        y = aten_ops.mul.Tensor(x, 2)
        aten_ops.add_.Tensor(y, 1)  # after it, the second part reads y + 1
        return first, F.linear(y, w2)

    pattern = {"family": "horizontal_gemm", "nodes": ["linear", "linear_1"],
               "attrs": {"parts": ["linear", "linear_1"]}, "signature": "late"}  # fmt: skip
    graph = fx.symbolic_trace(late).graph
    new = replace(graph, pattern, lambda g, r, p: g.call_function(_qkv_linears, ()))
    order = [n.name for n in graph.nodes]
    assert order.index("mul_tensor") < order.index(new.name)
    graph.lint()
    graph = fx.symbolic_trace(written).graph
    with pytest.raises(
        FactError, match=r"reads \[.mul_tensor.\], computed after its first output linear"
    ):
        replace(graph, pattern, lambda g, r, p: g.call_function(_qkv_linears, ()))


# ---------------------------------------------------------------------------------------------
# 6. Report


def result(name: str, time_us: float, rel: float, max_abs: float, note: str = "") -> dict:
    """One row of a bench's results, as compose/bench.py writes it (back to back at 90 % of the
    per-call time, 20 us of host time per call)."""
    return {
        "name": name,
        "time_us": time_us,
        "back_to_back_us": 0.9 * time_us,
        "host_us": 20.0,
        "rel_error": rel,
        "max_abs_error": max_abs,
        "note": note,
    }


def test_report_writes_markdown_json_and_a_rendered_chart(ref_opt, tmp_path):
    pytest.importorskip("matplotlib")
    _, _, opt, _ = ref_opt
    bench = {
        "fact_bench": 1,
        "problem": "examples/minigpt_block.py",
        "model": "Model",
        "dtype": "float32",
        "precision": "highest",
        "command": "fact bench examples/minigpt_block.py",
        "created": "2025-01-01T00:00:00+00:00",
        "fact_version": fact.__version__,
        "environment": {"gpu": "NVIDIA H200", "torch": torch.__version__, "cuda": "12.8"},
        "reps": 30,
        "results": [
            result("eager", 2000.0, 1.2e-7, 3e-6),
            result("torch.compile", 1500.0, 2.0e-7, 4e-6),
            result("fact", 1000.0, 1.5e-7, 3.5e-6, "CUDA graph replay"),
        ],
        "optimize": json.loads(json.dumps(opt.report, default=str)),
    }
    files = report_mod.write(bench, tmp_path / "report")
    assert set(files) == {"md", "json", "png"}

    md = files["md"].read_text()
    lines = md.splitlines()
    assert (
        "| module | per call (ms) | vs eager | vs torch.compile | back to back (ms) | vs eager "
        "| vs torch.compile | host (us) | max abs error | rel error |" in md
    )
    assert "LayerNorm" not in md  # no fold tried (test_folds.py renders those lines)
    assert (
        "| fact | 1.000 | 2.00x | 1.50x | 0.900 | 2.00x | 1.50x | 20 | 3.50e-06 | 1.50e-07 | - |"
        in lines
    )
    assert (
        "| eager | 2.000 | 1.00x | 0.75x | 1.800 | 1.00x | 0.75x | 20 | 3.00e-06 | 1.20e-07 | - |"
        in lines
    )
    assert (
        "| # | pattern | runs as | PyTorch subgraph (ms) | FACT (ms) | speedup | error | note |"
        in md
    )
    for p in opt.report["patterns"]:
        rows = [ln for ln in lines if ln.startswith(f"| {p['index']} | `{p['signature']}` | ")]
        assert len(rows) == 1, f"no single row for pattern {p['index']}"
        if p["chosen"] == "sdpa":
            assert "| sdpa (library kernel) |" in rows[0]
        elif p["chosen"] == "pytorch":
            assert p["reason"] in rows[0]
        else:
            assert "(generated kernel)" in rows[0]
    assert "FACT replaced 5 of 7 patterns" in md
    assert "passed." in md and "![per-pattern time](report.png)" in md

    assert json.loads(files["json"].read_text()) == bench

    data = files["png"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > height > 100
    assert len(data) > 10_000


def test_guard_runs_the_original_module_where_it_is_faster(ref_opt, monkeypatch):
    """Step 8: every pattern won in context, yet the whole composed module can lose to the
    original (an eager fast path, host time). The guard times both; the slower composed module
    gives way to the original, which then answers every call, and the report says so."""
    import copy as copy_mod

    from fact.compose.optimize import guard

    model, x, opt, _ = ref_opt
    opt = copy_mod.copy(opt)
    slow = copy_mod.copy(opt)
    real_run = opt.run_graph

    def run_graph_slowly(*args, **kwargs):
        time.sleep(0.03)
        return real_run(*args, **kwargs)

    object.__setattr__(slow, "run_graph", run_graph_slowly)
    g = guard(slow, [x])
    # Only the order is asserted: the original's own time moves by several ms on a loaded CPU.
    assert g["chosen"] == "original" and g["fact_us"] > g["original_us"], g
    for who in ("fact", "original"):
        assert len(g[who]["per_call_turns_us"]) == len(g[who]["back_to_back_turns_us"]) == 3
    slow.use_original = True
    calls_made = []
    monkeypatch.setattr(slow, "run_graph", lambda *a, **k: calls_made.append(1))
    assert torch.equal(slow(x), eager(model, x)) and not calls_made

    report = json.loads(json.dumps(opt.report, default=str))
    report["guard"] = g
    md = report_mod.markdown({"problem": "p", "results": [], "optimize": report})
    assert "**The module runs the original model**" in md
    report["guard"] = dict(g, chosen="fact")
    md = report_mod.markdown({"problem": "p", "results": [], "optimize": report})
    assert "runs the original model" not in md


def test_report_note_names_the_runner_up(ref_opt):
    """The note column says which verified candidate came next and its time, so a reader sees
    the margin of each choice (e.g. SDPA chosen over a generated attention kernel)."""
    _, _, opt, _ = ref_opt
    report = json.loads(json.dumps(opt.report, default=str))
    target = report["patterns"][0]
    target.update(chosen="sdpa", kind="library", time_us=189.0, reason="")
    target["candidates"] = [
        {"impl": "cutlass:k_slow", "kind": "generated", "ok": True, "time_us": 260.0},
        {"impl": "cutlass:k_fast", "kind": "generated", "ok": True, "time_us": 234.4},
        {"impl": "cutlass:k_wrong", "kind": "generated", "ok": False, "time_us": 100.0},
        {"impl": "sdpa", "kind": "library", "ok": True, "time_us": 189.0},
    ]
    md = report_mod.markdown({"problem": "p", "results": [], "optimize": report})
    (row,) = [ln for ln in md.splitlines() if ln.startswith(f"| {target['index']} | ")]
    note = [c.strip() for c in row.strip("|").split("|")][7]
    assert note == "next: cutlass:k_fast 0.234 ms"
    target["candidates"] = target["candidates"][2:]  # nothing verified but the choice
    md = report_mod.markdown({"problem": "p", "results": [], "optimize": report})
    (row,) = [ln for ln in md.splitlines() if ln.startswith(f"| {target['index']} | ")]
    assert "next:" not in row


def test_report_says_which_math_an_fp32_attention_kernel_ran(ref_opt):
    """An fp32 pattern's generated kernel says its math (TF32 under "high", 3xTF32 under
    "highest"), as AttentionImpl reads it from the kernel info."""
    _, _, opt, _ = ref_opt
    report = json.loads(json.dumps(opt.report, default=str))
    target = report["patterns"][0]
    target.update(chosen="cutlass:k", kind="generated", time_us=855.0, math="tf32")
    md = report_mod.markdown({"problem": "p", "results": [], "optimize": report})
    (row,) = [ln for ln in md.splitlines() if ln.startswith(f"| {target['index']} | ")]
    assert "| cutlass:k (generated kernel, TF32 math) |" in row
    target["math"] = "3xtf32"
    md = report_mod.markdown({"problem": "p", "results": [], "optimize": report})
    assert "(generated kernel, 3xTF32, fp32-accurate math)" in md
    lib = StubAttentionLibrary(dtype="f32", math="3xtf32")
    pattern = attention_pattern(dtype="f32", out_dtype="f32")
    assert AttentionImpl(pattern, "cutlass", lib, label="k").detail["math"] == "3xtf32"
    bf16 = AttentionImpl(attention_pattern(), "cutlass", StubAttentionLibrary(), label="k")
    assert "math" not in bf16.detail


class ComplexRope(nn.Module):
    """Meta's Llama RoPE: a complex freqs_cis buffer multiplied into Q viewed as complex."""

    def __init__(self, d=32, seq=16):
        super().__init__()
        self.q, self.o = nn.Linear(d, d, bias=False), nn.Linear(d, d)
        f = torch.outer(torch.arange(seq).float(), 1.0 / 10000 ** (torch.arange(0, d, 2) / d))
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(f), f))

    def forward(self, x):
        y = self.q(x)
        b, t, d = y.shape
        yc = torch.view_as_complex(y.float().reshape(b, t, d // 2, 2)) * self.freqs_cis[:t]
        return self.o(torch.view_as_real(yc).flatten(2).type_as(x))


def test_the_float64_reference_keeps_complex_state_complex(engine_available, tmp_path):
    """The end-to-end check's float64 copy of a model with a complex buffer: complex128, not a
    real cast that drops the imaginary part (which made the reference wrong by 40 % and the
    bound, twice eager's error against it, loose enough to pass anything)."""
    torch.manual_seed(44)
    model, x = ComplexRope().eval(), torch.randn(2, 16, 32)
    assert rel_err(model(x), reference_outputs(model, [x])) < 1e-6
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    ver = opt.report["verification"]
    assert ver["reference"] == "float64" and ver["eager_error"] < 1e-6, ver
    assert ver["bound"] == tolerances(torch.float32, torch.get_float32_matmul_precision())[1]


def test_a_reference_that_disagrees_with_eager_is_not_used(ref_opt, monkeypatch):
    """A float64 copy further from eager than the tolerance (a model that computes in its own
    dtype): the check compares with eager under the tolerance instead of loosening its bound."""
    import fact.compose.optimize as optimize_mod

    model, x, opt, run_dir = ref_opt
    plan = json.loads((run_dir / "plan.json").read_text())
    monkeypatch.setattr(
        optimize_mod, "reference_outputs", lambda m, inputs: eager(m, *inputs) * 1.5
    )
    tol = tolerances(torch.float32, "highest")[1]
    _, record = verify_end_to_end(model, opt._program, plan, [], [x], tol, Progress(quiet=True))
    assert record["reference"] == "eager" and record["bound"] == tol, record


class InPlaceTail(nn.Module):
    """A linear whose output is then updated in place (`y += x; y.mul_(0.5)`, as timm's
    LayerScale(inplace=True) writes it)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        y = self.fc(x)
        y += x
        y.mul_(0.5)
        return y


def test_values_written_in_place_later_are_captured_as_computed(engine_available, tmp_path):
    """The per-pattern check compares with each node's value as the graph computed it; an
    in-place op after the GEMM overwrote the captured value, so a correct twin was refused."""
    torch.manual_seed(45)
    model, x = InPlaceTail().eval(), torch.randn(2, 16, 32)
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (p,) = by_family(opt.report, "gemm")
    assert p["chosen"] == "reference:ref", p
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-6


class RaisingGemm(GemmImpl):
    """The reference twin, except that composing it raises (a kernel refused in the module),
    with a message or, as a bare assert does, without one."""

    def __init__(self, pattern, message="refused in the composed module on purpose"):
        super().__init__(pattern, "reference", label="raises")
        self.message = message

    def emit(self, graph, reg, pattern):
        raise RuntimeError(self.message) if self.message else AssertionError()


def test_two_patterns_that_break_the_module_fall_back_and_only_they(ref_opt):
    """With two patterns each making the composed module raise, no single fallback helps; the
    check then composes each pattern alone, drops exactly the two that raise, keeps the good
    ones, and each report row says what raised, names the dropped implementation and no longer
    claims it runs there."""
    model, x, opt, run_dir = ref_opt
    program = opt._program
    plan = json.loads((run_dir / "plan.json").read_text())
    gemms = [i for i, p in enumerate(plan["patterns"]) if p["family"] == "gemm"]
    assert len(gemms) >= 4
    bad = set(gemms[1:3])
    decisions = []
    for i, p in enumerate(plan["patterns"]):
        d = {"index": i, "family": p["family"], "reason": ""}
        if i in gemms:
            impl = RaisingGemm(p) if i in bad else GemmImpl(p, "reference", label="good")
            d.update(impl=impl, chosen=impl.name, kind=impl.kind, error=1e-7)
        decisions.append(d)
    tol = tolerances(torch.float32, "highest")[1]
    gm, record = verify_end_to_end(model, program, plan, decisions, [x], tol, Progress(quiet=True))
    assert record["passed"] is True
    assert record["attempts"][0]["error"] == math.inf
    assert "refused in the composed module on purpose" in record["attempts"][0]["failure"]
    assert sorted(record["attempts"][-1]["patterns"]) == sorted(set(gemms) - bad)
    assert len(record["attempts"]) == 3  # all four, then one dropped at a time
    for i in gemms:
        d = decisions[i]
        if i in bad:
            assert d["fallback"] is True and d["chosen"] == "pytorch", d
            assert d["fallback_from"] == "reference:raises"
            assert d["reason"] == (
                "fell back to PyTorch: the composed module raised RuntimeError: refused in the "
                "composed module on purpose with it"
            )
        else:
            assert not d.get("fallback") and d["chosen"] == "reference:good"
    assert len(calls(gm, run_gemm_pattern)) == len(gemms) - 2


def test_a_failure_without_a_message_falls_back_too(ref_opt):
    """A bare assert in a replacement raises an exception without text: it falls back like any
    other (its first line was looked up in an empty list)."""
    model, x, opt, run_dir = ref_opt
    program = opt._program
    plan = json.loads((run_dir / "plan.json").read_text())
    gemm = next(i for i, p in enumerate(plan["patterns"]) if p["family"] == "gemm")
    decisions = [
        {"index": i, "family": p["family"], "reason": ""} for i, p in enumerate(plan["patterns"])
    ]
    impl = RaisingGemm(plan["patterns"][gemm], message="")
    decisions[gemm].update(impl=impl, chosen=impl.name, kind=impl.kind, error=1e-7)
    tol = tolerances(torch.float32, "highest")[1]
    _, record = verify_end_to_end(model, program, plan, decisions, [x], tol, Progress(quiet=True))
    assert record["passed"] and decisions[gemm]["fallback"] is True
    assert decisions[gemm]["reason"] == (
        "fell back to PyTorch: the composed module raised AssertionError() with it"
    )
    assert decisions[gemm]["kind"] == "pytorch" and decisions[gemm]["time_us"] is None


def test_a_deep_copy_leaves_the_captured_graph_behind(ref_opt):
    """A CUDA graph cannot be copied and writes the original's buffers: the copy has none and
    captures its own when it replays."""
    import copy as copy_mod

    _, x, opt, _ = ref_opt

    class Uncopyable:
        def __deepcopy__(self, memo):
            raise TypeError("cannot pickle 'CUDAGraph' object")

    saved = opt._replay
    object.__setattr__(opt, "_replay", Uncopyable())
    try:
        twin = copy_mod.deepcopy(opt)
    finally:
        object.__setattr__(opt, "_replay", saved)
    assert twin._replay is None and rel_err(twin(x), opt(x)) == 0.0


def test_report_markdown_marks_a_fallback(ref_opt):
    _, _, opt, _ = ref_opt
    report = json.loads(json.dumps(opt.report, default=str))
    target = next(p for p in report["patterns"] if p["family"] == "gemm")
    target["fallback"] = True
    target["reason"] = "fell back to PyTorch: the module's end-to-end error was 0.5 (bound 1e-4)"
    md = report_mod.markdown({"problem": "p", "results": [], "optimize": report})
    (row,) = [ln for ln in md.splitlines() if ln.startswith(f"| {target['index']} | ")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "pytorch (fallback)"
    assert cells[4] == "-" and cells[5] == "-"  # no FACT time, no speedup for a fallback
    assert "fell back to PyTorch" in cells[7]


def _trace(*events):
    """A Chrome trace of device events: (name, start us, duration us)."""
    cats = {"Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
    return [
        {"ph": "X", "cat": cats.get(n.split()[0], "kernel"), "name": n, "ts": ts, "dur": dur}
        for n, ts, dur in events
    ] + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 999.0}]


def test_profile_timeline_splits_calls_at_the_marker_and_finds_the_gaps():
    from fact.compose.bench import split_calls, timeline

    trace = _trace(
        ("fill_flush", 0, 50),
        ("spin_kernel", 50, 20),
        ("norm", 75, 10),  # lead 5
        ("gemm_a", 100, 100),  # gap 15 after norm
        ("Memset (Device)", 150, 2),  # overlaps gemm_a: no gap, no extra busy time
        ("gemm_b", 240, 60),  # gap 40
        ("fill_flush", 400, 50),  # the next call's flush: not this call's
        ("spin_kernel", 450, 20),
        ("norm", 500, 10),  # lead 30
        ("gemm_a", 510, 100),
        ("gemm_b", 680, 60),  # gap 70
    )
    calls = split_calls(trace)
    assert [[e["name"] for e in c] for c in calls] == [
        ["norm", "gemm_a", "Memset (Device)", "gemm_b"],
        ["norm", "gemm_a", "gemm_b"],
    ]
    t = timeline(calls)
    # call 1: span 75..300 = 225, busy 170; call 2: span 500..740 = 240, busy 170
    assert t["busy"] == 170 and t["span"] == (225 + 240) / 2 and t["lead"] == (5 + 30) / 2
    assert t["idle"] == t["span"] - t["busy"]
    # the gaps are the median call's (the longer one of two), largest first
    assert [(g["us"], g["after"], g["before"]) for g in t["gaps"]] == [(70, "gemm_a", "gemm_b")]
    assert timeline([]) == {}


def test_profile_split_drops_the_flush_on_the_markers_stream_only():
    from fact.compose.bench import split_calls

    trace = [
        {"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": 5.0, "args": {"stream": st}}
        for n, ts, st in (
            ("spin_kernel", 0, 7),
            ("gemm", 10, 7),
            ("side_copy", 30, 8),  # the call's work on another stream, after the flush began
            ("fill_flush", 20, 7),
            ("spin_kernel", 40, 7),
            ("norm", 50, 7),
        )
    ]
    assert [[e["name"] for e in c] for c in split_calls(trace)] == [["gemm", "side_copy"], ["norm"]]


def test_bench_rounds_change_which_module_goes_before_which():
    """fact bench's interleaved rounds: every module is timed once a round, and none follows the
    same module (or starts) in every round, so the clock left by one module does not always
    fall on the same next one."""
    from fact.compose.bench import ROUNDS, round_order

    for n in (2, 3, 4):
        items = list(range(n))
        orders = [round_order(items, r) for r in range(ROUNDS)]
        assert all(sorted(o) == items for o in orders)
        for item in items:
            before = {o[o.index(item) - 1] if o.index(item) else None for o in orders}
            assert len(before) > 1, (n, item, orders)


def test_sm_clock_samples_while_the_block_runs_and_the_report_shows_them(ref_opt):
    from fact.compose.bench import SmClock

    readings = iter([1980, 1650, 0, 1545] + [1700] * 10_000)  # 0: a failed read, skipped
    with SmClock(torch.device("cpu"), period_s=0.001, read=lambda: next(readings)) as clock:
        time.sleep(0.05)
    assert clock.samples[:3] == [1980, 1650, 1545] and 0 not in clock.samples
    summary = clock.summary()
    assert summary["min"] == 1545 and summary["max"] == 1980 and summary["median"] == 1700
    with SmClock(torch.device("cpu"), read=None) as none:  # no NVML on this machine
        pass
    assert none.samples == [] and none.summary() is None
    # NVML's clock event reasons with each sample: power cap (0x4) in 3 of 4, idle (0x1) left out
    clocks, masks = iter([1500] * 4 + [0] * 10_000), iter([0x4, 0x4 | 0x1, 0x1, 0x4 | 0x20])
    with SmClock(
        torch.device("cpu"), period_s=0.001, read=lambda: next(clocks), reasons=lambda: next(masks)
    ) as limited:
        time.sleep(0.05)
    assert limited.summary()["limits"] == {"power cap": 0.75, "thermal": 0.25}
    _, _, opt, _ = ref_opt
    report = json.loads(json.dumps(opt.report, default=str))
    rows = [
        {"name": "eager", "time_us": 10.0, "rounds_sm_clock_mhz": [summary, None, summary]},
        {"name": "fact", "time_us": 5.0, "rounds_sm_clock_mhz": [None, None, None]},
        {"name": "capped", "time_us": 5.0, "rounds_sm_clock_mhz": [limited.summary()]},
    ]
    md = report_mod.markdown({"problem": "p", "results": rows, "optimize": report})
    (eager_row,) = [ln for ln in md.splitlines() if ln.startswith("| eager |")]
    assert eager_row.endswith("| 1700 (1545), ?, 1700 (1545) |")
    (fact_row,) = [ln for ln in md.splitlines() if ln.startswith("| fact |")]
    assert fact_row.endswith("| - |")
    (capped_row,) = [ln for ln in md.splitlines() if ln.startswith("| capped |")]
    assert capped_row.endswith("| 1500 power cap thermal |")


def test_report_skips_a_timeline_without_kernels(ref_opt):
    _, _, opt, _ = ref_opt
    report = json.loads(json.dumps(opt.report, default=str))
    profile = {"fact": {"kernels": [], "timeline": {"host": 5.0}, "warning": "the trace shows 0"}}
    bench = {"problem": "p", "results": [], "optimize": report, "profile": profile}
    md = report_mod.markdown(bench)
    assert "| fact | 5 |" not in md and "Warning: the trace shows 0." in md


def test_report_shows_the_profile_timeline_and_kernels(ref_opt):
    _, _, opt, _ = ref_opt
    report = json.loads(json.dumps(opt.report, default=str))
    gaps = [{"us": 41.0, "after": "gemm_a", "before": "fact_pointwise_kernel"}]
    profile = {
        "fact": {
            "kernels": [{"kernel": "gemm_a", "calls": 2.0, "us": 123.4}],
            "timeline": {
                "host": 300.0,
                "lead": 12.0,
                "span": 900.0,
                "busy": 800.0,
                "idle": 100.0,
                "gaps": gaps,
            },
        }
    }
    md = report_mod.markdown(
        {"problem": "p", "results": [], "optimize": report, "profile": profile}
    )
    assert "| fact | 300 | 12 | 900 | 800 | 100 | 41 before `fact_pointwise_kernel` |" in md
    assert "| `gemm_a` | 2 | 123.4 |" in md


# ---------------------------------------------------------------------------------------------
# 7. Errors


def test_optimize_refuses_a_module_that_mutates_a_buffer(engine_available, tmp_path):
    model = Counter().eval()
    with pytest.raises(FactError, match="Counter writes to buffer calls while it runs"):
        fact.optimize(model, [torch.randn(2, 8)], quiet=True, run_dir=tmp_path / "r")
    assert float(model.calls) == 0.0  # and optimize ran nothing with side effects


def test_program_refuses_a_functionalized_buffer_mutation():
    model = Counter().eval()
    exported = torch.export.export(model, (torch.randn(2, 8),), strict=False)
    functional = exported.run_decompositions({})  # the mutation as a BUFFER_MUTATION output
    with pytest.raises(FactError, match=r"Counter mutates its own state .*buffer_mutation"):
        Program(model, functional)


def test_optimize_refuses_training_mode_dropout(engine_available, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train()
    with pytest.raises(FactError, match=r"draws random numbers .*dropout.*model.eval\(\)"):
        fact.optimize(model, [torch.randn(2, 8)], quiet=True, run_dir=tmp_path / "r")


class OptionalMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x, mask=None):
        y = torch.relu(self.fc(x))
        return y if mask is None else y * mask


def test_a_call_unlike_the_examples_runs_the_original_module(engine_available, tmp_path):
    """A call forward takes in another form runs FACT's graph (x by keyword); one of another
    structure than the example's (a default left out, an argument added) runs the original
    module, with one warning naming both structures; one the model does not take fails as
    the model fails."""
    torch.manual_seed(11)
    model, x = OptionalMask().eval(), torch.randn(4, 32)
    mask = torch.rand(4, 32)
    opt = fact.optimize(model, [x, mask], quiet=True, run_dir=tmp_path / "r", require_faster=False)
    assert rel_err(opt(x, mask), eager(model, x, mask)) < 1e-6
    assert rel_err(opt(x=x, mask=mask), eager(model, x, mask)) < 1e-6  # by keyword
    ran = []
    real_forward = model.forward
    model.forward = lambda *a, **k: ran.append(1) or real_forward(*a, **k)
    with pytest.warns(UserWarning) as caught:
        assert rel_err(opt(x), eager(model, x)) < 1e-6  # the default mask, left out
        assert rel_err(opt(x, mask=None), eager(model, x)) < 1e-6
    assert len(ran) == 4  # two calls of the original, two of eager
    (warning,) = [w for w in caught if "FACT" in str(w.message)]
    assert str(warning.message).startswith(
        "FACT: the optimized OptionalMask was built for calls like forward(x, x), as in the "
        "example; got forward(x). Optimize it again with such an example; this call runs the "
        "original module"
    )
    with pytest.raises(TypeError):
        opt(x, mask, x)  # OptionalMask takes no third argument


# ---------------------------------------------------------------------------------------------
# 8. The CPU path without implementations, and the decision cache


def test_cpu_optimize_without_implementations(engine_available, minigpt_module, tmp_path):
    model, x = new_minigpt(minigpt_module, seed=12)
    opt = fact.optimize(model, [x], quiet=True, run_dir=tmp_path / "r", require_faster=False)
    report = opt.report
    gemms = by_family(report, "gemm")
    assert len(gemms) == 4
    for p in gemms:
        assert p["chosen"] == "pytorch" and "no GPU" in p["reason"]
    (attention,) = by_family(report, "attention")
    assert (attention["chosen"], attention["kind"]) == ("sdpa", "library")
    assert report["replaced"] == 1 and report["warm"] is False
    assert not calls(opt.graph_module, run_gemm_pattern)
    assert len(calls(opt.graph_module, SDPA)) == 1
    inputs = fresh_inputs([x], 3)
    assert rel_err(opt(*inputs), eager(model, *inputs)) < 1e-5
    decisions = list((tmp_path / "fact-cache" / "decisions").glob("*.json"))
    assert len(decisions) == 1

    # a second optimize of the same architecture reuses the decisions: nothing is re-planned
    model2, x2 = new_minigpt(minigpt_module, seed=13)
    warm = fact.optimize(model2, [x2], quiet=True, run_dir=tmp_path / "r2", require_faster=False)
    assert warm.report["warm"] is True
    assert any("warm: reusing the decisions" in line for line in warm.report["transcript"])
    assert not (tmp_path / "r2" / "plan.json").exists()
    assert [p["chosen"] for p in warm.report["patterns"]] == [
        p["chosen"] for p in report["patterns"]
    ]
    assert len(calls(warm.graph_module, SDPA)) == 1
    assert rel_err(warm(*inputs), eager(model2, *inputs)) < 1e-5
    assert rel_err(warm(*inputs), opt(*inputs)) > 1e-2  # different weights, its own

    # decisions made while atomic (nondeterministic) reductions were allowed are not reused
    # under torch.use_deterministic_algorithms(True)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        det = fact.optimize(model2, [x2], quiet=True, run_dir=tmp_path / "r3", require_faster=False)
        assert det.report["warm"] is False
    finally:
        torch.use_deterministic_algorithms(was)


def test_cpu_optimize_require_faster_keeps_a_reason(engine_available, minigpt_module, tmp_path):
    model, x = new_minigpt(minigpt_module, seed=14)
    opt = fact.optimize(model, [x], quiet=True, run_dir=tmp_path / "r", use_cache=False)
    (attention,) = by_family(opt.report, "attention")
    if attention["chosen"] == "pytorch":  # CPU timings decide; either way it is explained
        assert "sdpa: not faster than the PyTorch subgraph" in attention["reason"]
    else:
        assert attention["chosen"] == "sdpa" and attention["time_us"] < attention["eager_us"]
    assert not (tmp_path / "fact-cache" / "decisions").exists()  # use_cache=False writes none
    assert rel_err(opt(x), eager(model, x)) < 1e-5


# ---------------------------------------------------------------------------------------------
# 9. The torch.compile backend


@pytest.fixture
def dynamo_reset():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_torch_compile_backend_fact(engine_available, dynamo_reset, monkeypatch):
    import fact.backend  # noqa: F401 - registers backend="fact"
    import fact.compose.optimize as optimize_mod

    built = []
    real_optimize = optimize_mod.optimize

    def spy(*args, **kwargs):
        out = real_optimize(*args, **kwargs)
        built.append(out)
        return out

    monkeypatch.setattr(optimize_mod, "optimize", spy)
    runs = []
    real_forward = OptimizedModule.forward

    def counting_forward(self, *args, **kwargs):
        runs.append(self)
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(OptimizedModule, "forward", counting_forward)
    torch.manual_seed(15)
    model, x = SmallGelu().eval(), torch.randn(4, 32)
    compiled = torch.compile(model, backend="fact")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():  # inference
        warnings.simplefilter("always")
        out = compiled(x)
    assert rel_err(out, eager(model, x)) < 1e-6
    assert built, "torch.compile never called FACT's backend"
    fell_back = [w for w in caught if "FACT could not optimize" in str(w.message)]
    if not fell_back:  # then the composed module is what ran
        assert all(isinstance(m, OptimizedModule) for m in built)
        assert runs and runs[0] is built[0]
    y = torch.randn(4, 32)
    with torch.no_grad():
        assert rel_err(compiled(y), eager(model, y)) < 1e-6


def test_torch_compile_backend_by_name_after_import_fact(engine_available, tmp_path):
    """README's form: `import fact` then torch.compile(model, backend="fact"), in a fresh
    process where torch finds the backend through the package's entry point (which imports
    fact.backend: registering there too was a 'duplicate name: fact')."""
    code = (
        "import torch, fact\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()\n"
        "x = torch.randn(2, 8)\n"
        "with torch.no_grad():\n"
        "    print(float((torch.compile(m, backend='fact')(x) - m(x)).abs().max()))\n"
    )
    env = dict(os.environ, FACT_CACHE_DIR=str(tmp_path / "cache"))
    env["FACT_REGISTRY"] = str(tmp_path / "registry.db")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split()[-1]) < 1e-6


def test_torch_compile_backend_sees_the_models_state(engine_available, dynamo_reset, monkeypatch):
    """Dynamo passes parameters and buffers as graph inputs; the backend hands them back to
    FACT as state, so the tril buffer is known to be a causal mask (the attention pattern is
    found, as by fact.optimize), and updates in place or by a new Parameter are seen."""
    import fact.backend  # noqa: F401
    import fact.compose.optimize as optimize_mod

    built = []
    real_optimize = optimize_mod.optimize
    monkeypatch.setattr(
        optimize_mod, "optimize", lambda *a, **k: built.append(real_optimize(*a, **k)) or built[-1]
    )
    torch.manual_seed(41)
    model, x = HandWrittenAttention().eval(), torch.randn(2, 32, 64)
    compiled = torch.compile(model, backend="fact")
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-6
        (opt,) = built
        (att,) = by_family(opt.report, "attention")
        assert att["chosen"] == "sdpa" and att["signature"].endswith(":causal"), att
        assert dict(opt.original.named_buffers())["bias"] is model.bias
        assert dict(opt.original.named_parameters())["c_proj_weight"] is model.c_proj.weight
        model.c_proj.weight.mul_(2)
        assert rel_err(compiled(x), model(x)) < 1e-6
        model.c_proj.weight = nn.Parameter(torch.randn(64, 64))
        assert rel_err(compiled(x), model(x)) < 1e-6


def test_torch_compile_backend_names_clashing_state_apart(engine_available, dynamo_reset):
    """Parameters a_b, a_b_2 and a.b all want the name a_b (then a_b_2): each gets its own,
    and finding them ends (the suffix used to stay the same while taken)."""
    import fact.backend  # noqa: F401
    from fact.backend import CapturedGraph

    class A(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = nn.Parameter(torch.full((4,), 2.0))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a_b = nn.Parameter(torch.full((4,), 3.0))
            self.a_b_2 = nn.Parameter(torch.full((4,), 5.0))
            self.a = A()

        def forward(self, x):
            return x * self.a_b * self.a_b_2 * self.a.b

    names = []

    def backend(gm, example_inputs):
        names.append([s for s in CapturedGraph(gm, example_inputs).slots if s])
        return gm.forward

    model, x = M(), torch.randn(4)
    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    (slots,) = names
    assert len(slots) == len(set(slots)) == 3, slots


def test_torch_compile_backend_options_and_mode(engine_available, dynamo_reset, monkeypatch):
    """options= are fact.optimize's settings, an unknown one is an error naming the valid
    ones; mode= has no meaning for FACT and says so."""
    import fact.backend  # noqa: F401
    import fact.compose.optimize as optimize_mod

    seen = []
    real_optimize = optimize_mod.optimize
    monkeypatch.setattr(
        optimize_mod, "optimize", lambda *a, **k: seen.append(k) or real_optimize(*a, **k)
    )
    torch.manual_seed(42)
    model, x = SmallGelu().eval(), torch.randn(4, 32)
    compiled = torch.compile(model, backend="fact", options={"candidates": 2, "cuda_graphs": False})
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-6
    assert seen and seen[-1]["candidates"] == 2 and seen[-1]["cuda_graphs"] is False
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"unknown option\(s\) \['candidatez'\]; FACT takes "):
        with torch.no_grad():
            torch.compile(model, backend="fact", options={"candidatez": 2})(x)
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="mode='max-autotune'. has no meaning"), torch.no_grad():
        assert (
            rel_err(torch.compile(model, backend="fact", mode="max-autotune")(x), model(x)) < 1e-6
        )


def test_torch_compile_backend_with_new_sizes(engine_available, dynamo_reset, monkeypatch):
    """A call with another batch size: Dynamo recompiles with symbolic sizes, and FACT
    optimizes that graph for each concrete size at its first call (once per size);
    dynamic=False gives one graph per shape, each optimized."""
    import fact.backend  # noqa: F401
    import fact.compose.optimize as optimize_mod

    shapes = []
    real_optimize = optimize_mod.optimize

    def spy(module, user, **kw):
        shapes.append([tuple(t.shape) for t in user if isinstance(t, torch.Tensor)])
        return real_optimize(module, user, **kw)

    monkeypatch.setattr(optimize_mod, "optimize", spy)
    torch.manual_seed(43)
    model = SmallGelu().eval()
    x4, x8, x6 = torch.randn(4, 32), torch.randn(8, 32), torch.randn(6, 32)
    compiled = torch.compile(model, backend="fact")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # no "runs as captured"
        for x in (x4, x8, x6, x8):
            assert rel_err(compiled(x), model(x)) < 1e-6
    assert shapes == [[(4, 32)], [(8, 32)], [(6, 32)]], shapes
    torch._dynamo.reset()
    static = torch.compile(model, backend="fact", dynamic=False)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")
        for x in (x4, x8, x4):
            assert rel_err(static(x), model(x)) < 1e-6


def test_torch_compile_backend_caps_the_sizes_of_a_dynamic_graph(
    engine_available, dynamo_reset, monkeypatch
):
    """A loop whose sizes never repeat does not optimize at every call: past MAX_SIZES the
    symbolic graph runs as captured, with one warning."""
    import fact.backend  # noqa: F401
    import fact.compose.optimize as optimize_mod

    monkeypatch.setattr(optimize_mod, "MAX_SIZES", 2)
    calls = []
    real_optimize = optimize_mod.optimize
    monkeypatch.setattr(
        optimize_mod, "optimize", lambda *a, **k: calls.append(1) or real_optimize(*a, **k)
    )
    torch.manual_seed(44)
    model = SmallGelu().eval()
    compiled = torch.compile(model, backend="fact")
    with torch.no_grad():
        for batch in (4, 5, 6):  # 4 static; 5 and 6 fill the dynamic graph's table
            x = torch.randn(batch, 32)
            assert rel_err(compiled(x), model(x)) < 1e-6
        with pytest.warns(UserWarning, match="for 2 sizes already"):
            x = torch.randn(7, 32)
            assert rel_err(compiled(x), model(x)) < 1e-6
        x = torch.randn(8, 32)
        assert rel_err(compiled(x), model(x)) < 1e-6
    assert len(calls) == 3
    with pytest.raises(Exception, match=r"unknown option\(s\) \['other_sizes'\]"):
        torch._dynamo.reset()
        torch.compile(model, backend="fact", options={"other_sizes": []})(torch.randn(4, 32))


def test_torch_compile_backend_leaves_training_graphs_alone(engine_available, dynamo_reset):
    """With gradients wanted, FACT (inference only) keeps Dynamo's graph: backward works."""
    import fact.backend  # noqa: F401

    torch.manual_seed(17)
    model, x = SmallGelu().train(), torch.randn(4, 32)
    compiled = torch.compile(model, backend="fact")
    with pytest.warns(UserWarning, match="needs gradients, so it runs as captured"):
        out = compiled(x)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_torch_compile_backend_falls_back_to_the_captured_graph(dynamo_reset, monkeypatch):
    import fact.backend  # noqa: F401
    import fact.compose.optimize as optimize_mod

    def refuse(*args, **kwargs):
        raise FactError("refused on purpose")

    monkeypatch.setattr(optimize_mod, "optimize", refuse)
    torch.manual_seed(16)
    model, x = SmallGelu().eval(), torch.randn(4, 32)
    compiled = torch.compile(model, backend="fact")
    with pytest.warns(UserWarning, match="runs as captured: refused on purpose"), torch.no_grad():
        out = compiled(x)
    assert rel_err(out, eager(model, x)) < 1e-6


def test_torch_compile_backend_survives_any_failure(dynamo_reset, monkeypatch):
    """Not only FactError: whatever optimize raises, the captured graph runs."""
    import fact.backend  # noqa: F401
    import fact.compose.optimize as optimize_mod

    def crash(*args, **kwargs):
        raise RuntimeError("expected m1 and m2 to have the same dtype")

    monkeypatch.setattr(optimize_mod, "optimize", crash)
    torch.manual_seed(18)
    model, x = SmallGelu().eval(), torch.randn(4, 32)
    compiled = torch.compile(model, backend="fact")
    with pytest.warns(UserWarning, match="same dtype"), torch.no_grad():
        out = compiled(x)
    assert rel_err(out, eager(model, x)) < 1e-6


# ---------------------------------------------------------------------------------------------
# 10. fact bench on a machine without a GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_fact_bench_without_cuda_exits_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), CUDA_VISIBLE_DEVICES="")
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "fact", "bench", "examples/minigpt_block.py", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "fact: error:" in proc.stderr and "no CUDA device" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not Path(out).exists()


# ---------------------------------------------------------------------------------------------
# Small helpers of optimize


def test_rel_err_tolerances_and_fresh_inputs():
    a = torch.ones(4)
    assert rel_err(a, a) == 0.0
    assert rel_err(a * 1.01, a) == pytest.approx(0.01)
    assert rel_err(torch.tensor([1.0, float("nan")]), a[:2]) == float("inf")
    assert rel_err(a, torch.ones(5)) == float("inf")
    assert rel_err((a, a), (a,)) == float("inf")
    assert tolerances(torch.bfloat16, "highest") == (2e-2, 2e-2)
    assert tolerances(torch.float32, "highest") == (1e-5, 1e-4)
    assert tolerances(torch.float32, "high") == (2e-3, 5e-3)
    with pytest.raises(FactError, match="precision 'fast'"):
        tolerances(torch.float32, "fast")
    ids = torch.arange(6)
    x = torch.randn(64, 32) * 3 + 5
    fresh = fresh_inputs([x, ids, 7], seed=0)
    assert fresh[1] is ids and fresh[2] == 7
    assert fresh[0].shape == x.shape and fresh[0].dtype == x.dtype
    assert not torch.equal(fresh[0], x)
    assert float(fresh[0].mean()) == pytest.approx(5, abs=0.5)
    assert float(fresh[0].std()) == pytest.approx(3, rel=0.1)
    assert torch.equal(fresh_inputs([x], seed=0)[0], fresh[0])
    assert not torch.equal(fresh_inputs([x], seed=1)[0], fresh[0])


# ---------------------------------------------------------------------------------------------
# 12. Regressions from the review of stage 3


class RMSNormNoCast(nn.Module):
    """Written out without the cast back: the result stays float32 (x.float() * ... * weight)."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):
        h = x.float()
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def test_rms_norm_without_a_cast_back_keeps_float32(engine_available, tmp_path):
    torch.manual_seed(21)
    model = RMSNormNoCast().to(torch.bfloat16).eval()
    x = torch.randn(4, 16, 64, dtype=torch.bfloat16)
    plan = fact.discover(model, [x])
    (norm,) = [p for p in plan["patterns"] if p["family"] == "norm"]
    assert "round_to" not in norm["attrs"]  # nothing rounds before the weight
    opt = fact.optimize(model, [x], require_faster=False, use_cache=False, run_dir=tmp_path / "r",
                        quiet=True)  # fmt: skip
    y = torch.randn_like(x)
    out, ref = opt(y), eager(model, y)
    assert out.dtype == ref.dtype == torch.float32
    assert rel_err(out, ref) < 1e-5


def test_rms_norm_op_without_eps_uses_the_float_epsilon(engine_available, tmp_path):
    """nn.RMSNorm(eps=None) uses the float32 epsilon: a zero row (padding) stays zero."""
    model = nn.Sequential(nn.RMSNorm(64)).eval()
    x = torch.randn(4, 64)
    plan = fact.discover(model, [x])
    (norm,) = [p for p in plan["patterns"] if p["family"] == "norm"]
    assert norm["attrs"]["eps"] == pytest.approx(torch.finfo(torch.float32).eps)
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    zero = torch.zeros(4, 64)
    assert torch.equal(opt(zero), eager(model, zero))


def test_inputs_named_like_builtins_can_be_replaced(engine_available, tmp_path):
    """nn.Sequential's placeholder is `input`, which FX renames in a copy of the graph (to
    `input_1`); the plan still says `input`, so the copy the composition edits keeps the
    exported names, and both linear layers run as their implementations."""
    torch.manual_seed(22)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).eval()
    x = torch.randn(8, 32)
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    assert opt.report["replaced"] == len(opt.report["patterns"]) == 2
    for p in opt.report["patterns"]:
        assert p["chosen"].startswith("reference:") and not p.get("fallback"), p
    assert [a["error"] for a in opt.report["verification"]["attempts"]][0] < 1e-6
    assert rel_err(opt(x), eager(model, x)) < 1e-6


def test_calls_unlike_the_build_run_the_original_module(engine_available, tmp_path):
    """With new_sizes="original" (test_sizes.py has the default, which optimizes for them)."""
    torch.manual_seed(23)
    model, x = SmallGelu().eval(), torch.randn(4, 32)
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True,
                        new_sizes="original")  # fmt: skip
    assert rel_err(opt(x), eager(model, x)) < 1e-6
    other = torch.randn(8, 32)  # another batch size: the kernels' views were built for 4
    with pytest.warns(UserWarning, match="optimized for other input shapes"):
        out = opt(other)
    assert out.shape == (8, 64) and rel_err(out, eager(model, other)) < 1e-6
    model.double()  # parameters change dtype: also the original module
    assert opt(x.double()).dtype == torch.float64


def test_same_values_reloaded_into_a_watched_buffer_keep_the_kernels(ref_opt):
    """load_state_dict of the same checkpoint bumps the mask's version, not its values."""
    model, x, opt, _ = ref_opt
    model.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "changed after optimize" warning
        assert rel_err(opt(x), eager(model, x)) < 1e-5


def test_fresh_inputs_keep_masks_of_minus_infinity():
    mask = torch.zeros(4, 4)
    mask[:, 2:] = -math.inf
    (fresh,) = fresh_inputs([mask], seed=0)
    assert torch.equal(torch.isinf(fresh), torch.isinf(mask))
    assert bool(torch.isfinite(fresh[:, :2]).all()) and not torch.equal(fresh[:, :2], mask[:, :2])


def test_fresh_inputs_shuffle_a_mask_of_zeros_and_ones():
    """A 0/1 padding mask held as floats stays a 0/1 mask, with as many ones, rearranged."""
    mask = torch.ones(8, 32)
    mask[1::2, -12:] = 0
    (fresh,) = fresh_inputs([mask], seed=0)
    assert set(fresh.unique().tolist()) == {0.0, 1.0} and fresh.sum() == mask.sum()
    assert not torch.equal(fresh, mask)
    assert torch.equal(fresh_inputs([mask], seed=0)[0], fresh)
    # an all-ones mask becomes a random 0/1 one; another constant is drawn around its value
    ones, threes = fresh_inputs([torch.ones(8, 32), torch.full((8, 32), 3.0)], seed=0)
    assert set(ones.unique().tolist()) == {0.0, 1.0}
    assert threes.unique().numel() > 100 and abs(float(threes.mean()) - 3.0) < 0.3


def test_dtype_mismatch_is_an_error():
    a = torch.ones(3)
    assert rel_err(a.to(torch.bfloat16), a) == math.inf
    assert rel_err(a, a.double()) == 0.0  # a float64 reference compares any dtype


class GatedMLP(nn.Module):
    """Llama's feed-forward: w2(silu(w1 x) * w3 x), plus the residual."""

    def __init__(self, d: int = 64, h: int = 192):
        super().__init__()
        self.w1 = nn.Linear(d, h, bias=False)
        self.w2 = nn.Linear(h, d, bias=False)
        self.w3 = nn.Linear(d, h, bias=False)

    def forward(self, x):
        return x + self.w2(F.silu(self.w1(x)) * self.w3(x))


def _optimize_gated_mlp_as(impl_class, label, model, x, tmp_path):
    """model optimized with the gated MLP offered only as impl_class's reference twin (the other
    patterns as reference twins), checked to have chosen it."""

    def impls(index, pattern):
        if pattern["family"] == "gated_mlp":
            return [impl_class(pattern, "reference", label=label)]
        return reference_twins(index, pattern)

    opt = fact.optimize(model, [x], implementations=impls, require_faster=False, use_cache=False,
                        run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    chosen = {p["family"]: p["chosen"] for p in opt.report["patterns"]}
    assert chosen["gated_mlp"] == f"reference:{label}", opt.report["patterns"]
    return opt


def test_gated_mlp_runs_as_up_projection_plus_a_fused_gate_gemm(engine_available, tmp_path):
    from fact.compose.impls import GatedGemmImpl

    torch.manual_seed(24)
    model, x = GatedMLP().eval(), torch.randn(2, 16, 64)
    plan = fact.discover(model, [x])
    (gated,) = [p for p in plan["patterns"] if p["family"] == "gated_mlp"]
    lowered = gated["lowered"]  # what stage 2 compiles: the gate GEMM, act(acc) * up fused
    assert lowered["family"] == "gemm" and lowered["epilogue_expr"]["text"] == "silu(acc) * up"
    assert [o["role"] for o in lowered["operands"]] == ["a", "b", "up"]
    assert lowered["signature"] == "gemm[silu+mul]:f32,f32->f32:row,col"

    opt = _optimize_gated_mlp_as(GatedGemmImpl, "gated", model, x, tmp_path)
    gm = opt.graph_module
    assert aten.silu.default not in targets(gm)  # the activation and product are fused
    assert len(calls(gm, aten.linear.default)) == 1  # only the up projection stays PyTorch's
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


def test_gated_mlp_runs_as_two_library_gemms_plus_a_pointwise_tail(engine_available, tmp_path):
    """The plan's `tail` form: both projections stay PyTorch's GEMMs, and silu(gate) * up is one
    fact::pointwise call instead of silu then mul."""
    from fact.compose.impls import GatedTailImpl

    torch.manual_seed(25)
    model, x = GatedMLP().eval(), torch.randn(2, 16, 64)
    plan = fact.discover(model, [x])
    (gated,) = [p for p in plan["patterns"] if p["family"] == "gated_mlp"]
    tail = gated["tail"]
    assert (tail["family"], tail["rule"]) == ("pointwise", "gated_mlp_tail")
    assert tail["epilogue_expr"]["text"] == "silu(gate) * up"
    assert [(o["role"], o["node"]) for o in tail["operands"]] == [
        ("in0", gated["attrs"]["gate"]), ("in1", gated["attrs"]["up"])]  # fmt: skip
    assert tail["signature"] == "pointwise[silu+mul]:f32->f32"

    opt = _optimize_gated_mlp_as(GatedTailImpl, "tail", model, x, tmp_path)
    gm = opt.graph_module
    assert aten.silu.default not in targets(gm)
    assert len(calls(gm, aten.linear.default)) == 2  # both projections: library GEMMs
    assert len(calls(gm, torch.ops.fact.pointwise.default)) == 1
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-5
    # A pattern without a tail (or not gated) is not this implementation's.
    with pytest.raises(NotSupportedError):
        GatedTailImpl({k: v for k, v in gated.items() if k != "tail"}, "reference")


class FusedGateUp(nn.Module):
    """A gated MLP with one projection for gate and up (Phi-3's gate_up_proj), cut by `cut`:
    chunk, split, slices, narrow or negative slices; the gate is the second half with
    `gate_second`."""

    def __init__(self, cut: str, gate_second: bool = False, bias: str = "", d=64, h=96):
        super().__init__()
        self.cut, self.gate_second, self.h = cut, gate_second, h
        self.gate_up = nn.Linear(d, 2 * h, bias=bias == "linear")
        self.bias = nn.Parameter(torch.randn(2 * h)) if bias == "added" else None
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x):
        both = self.gate_up(x)
        if self.bias is not None:  # the bias written out after a bias-free projection
            both = both + self.bias
        if self.cut == "chunk":
            a, b = both.chunk(2, dim=-1)
        elif self.cut == "split":
            a, b = torch.split(both, self.h, dim=-1)
        elif self.cut == "narrow":
            a, b = both.narrow(-1, 0, self.h), both.narrow(-1, self.h, self.h)
        elif self.cut == "negative":
            a, b = both[..., : -self.h], both[..., -self.h :]
        else:
            a, b = both[..., : self.h], both[..., self.h :]
        gate, up = (b, a) if self.gate_second else (a, b)
        return x + self.down(F.silu(gate) * up)


@pytest.mark.parametrize(
    "cut,gate_second",
    [("chunk", False), ("split", True), ("slices", False), ("narrow", True), ("negative", False)],
)
def test_fused_gate_up_projection_is_split_into_a_gated_mlp(
    engine_available, tmp_path, cut, gate_second
):
    """fact.rewrites.gate_up_splits: the one projection becomes a gate and an up linear over
    the two halves of its weight (views of the parameter, so an update is seen), which the
    gated rule plans as one gate GEMM with act(acc) * up fused."""
    from fact.compose.impls import GatedGemmImpl

    torch.manual_seed(26)
    model, x = FusedGateUp(cut, gate_second).eval(), torch.randn(2, 16, 64)
    plan = fact.discover(model, [x])
    (gated,) = [p for p in plan["patterns"] if p["family"] == "gated_mlp"]
    assert gated["problem"]["n"] == 96 and gated["epilogue"] == ["silu", "mul"]
    opt = _optimize_gated_mlp_as(GatedGemmImpl, "gated", model, x, tmp_path)
    transcript = (tmp_path / "r" / "transcript.txt").read_text()
    assert "gated MLP: linear (192 x 64) as a gate and an up linear" in transcript
    assert ("the gate is the second half" in transcript) is gate_second
    assert aten.silu.default not in targets(opt.graph_module)
    for seed in (1, 2):
        (y,) = fresh_inputs([x], seed)
        assert rel_err(opt(y), eager(model, y)) < 1e-5
    with torch.no_grad():  # both halves are views of the one weight
        model.gate_up.weight[:96].mul_(-1.0)
        model.gate_up.weight[96:].mul_(0.5)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


@pytest.mark.parametrize("bias", ["linear", "added"])
def test_fused_gate_up_projection_with_a_bias_is_split_and_still_correct(
    engine_available, tmp_path, bias
):
    """With a bias (the linear's, or a vector added after it) the halves are two biased
    linears (the gated rule leaves biased projections to the GEMM rules: the gate GEMM's
    epilogue adds its bias, applies the activation and multiplies in the up half it reads as
    C)."""
    torch.manual_seed(27)
    model, x = (
        FusedGateUp("chunk", gate_second=bias == "added", bias=bias).eval(),
        torch.randn(2, 16, 64),
    )
    plan = fact.discover(model, [x])
    assert not [p for p in plan["patterns"] if p["family"] == "gated_mlp"]
    epilogues = sorted(p["epilogue"] for p in plan["patterns"] if p["family"] == "gemm")
    assert ["bias", "silu", "mul"] in epilogues, epilogues
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    assert all(p["chosen"] == "reference:ref" for p in opt.report["patterns"]), opt.report
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


class CastBiasGate(nn.Module):
    """A bf16 projection whose f32 bias is cast after it (the bias node comes after the linear)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16, bias=False).to(torch.bfloat16)
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x):
        y = self.proj(x)
        g, u = (y + self.bias.to(y.dtype)).chunk(2, dim=-1)
        return F.silu(g) * u


def test_gate_up_split_with_a_bias_made_after_the_projection(engine_available):
    """Found by a fuzz: the halves' bias slices went in right after the linear, before the
    cast that makes the bias, and the graph did not lint. They now go after the bias add."""
    from fact.rewrites import gate_up_splits

    torch.manual_seed(28)
    model, x = CastBiasGate().eval(), torch.randn(4, 8, dtype=torch.bfloat16)
    program = torch.export.export(model, (x,), strict=False)
    assert len(gate_up_splits(program)) == 1
    opt = fact.optimize(model, [x], require_faster=False, use_cache=False, quiet=True)
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-2  # bf16: the bias is added before rounding


class PromotedBiasGate(nn.Module):
    """bf16 projection + an f32 vector: the add promotes to f32, so it is no bias of the linear."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16, bias=False).to(torch.bfloat16)
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        g, u = (self.proj(x) + self.b).chunk(2, dim=-1)
        return F.silu(g) * u


class VectorWeightGate(nn.Module):
    """F.linear with a 1-D weight: one dot product per row, whose (rows) output is then cut."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))

    def forward(self, x):
        g, u = F.linear(x, self.w).chunk(2, dim=-1)
        return F.silu(g) * u


@pytest.mark.parametrize(
    "model,x",
    [
        (PromotedBiasGate(), torch.randn(4, 8, dtype=torch.bfloat16)),
        (VectorWeightGate(), torch.randn(2, 8, 8)),
    ],
    ids=["promoted_bias", "vector_weight"],
)
def test_gate_up_cuts_that_are_no_fused_projection_are_left_alone(engine_available, model, x):
    """Found by a fuzz: the split took an f32 vector added to a bf16 projection as its bias
    (the result's dtype changed) and cut a 1-D weight's elements as if they were rows."""
    from fact.rewrites import gate_up_splits

    model = model.eval()
    program = torch.export.export(model, (x,), strict=False)
    assert gate_up_splits(program) == []
    opt = fact.optimize(model, [x], require_faster=False, use_cache=False, quiet=True)
    y = opt(x)
    assert y.dtype == eager(model, x).dtype and rel_err(y, eager(model, x)) < 1e-6


def test_a_split_projection_that_is_not_gated_stays_one_linear(engine_available):
    """Only halves meeting in act(gate) * up are split: a fused QKV-like cut read otherwise
    keeps its one GEMM."""

    class NotGated(FusedGateUp):
        def forward(self, x):
            a, b = self.gate_up(x).chunk(2, dim=-1)
            return self.down(F.silu(a) + b)

    model, x = NotGated("chunk").eval(), torch.randn(2, 16, 64)
    plan = fact.discover(model, [x])
    assert sorted(p["problem"]["n"] for p in plan["patterns"] if p["family"] == "gemm") == [64, 192]


# ---------------------------------------------------------------------------------------------
# 13. Generated attention: fact::attention and AttentionImpl (reference backend on CPU)

ATTENTION_OP = torch.ops.fact.attention.default


ATTENTION_MODULES = {
    "hand_written_causal": lambda: HandWrittenAttention(),
    "sdpa_gqa": lambda: GqaAttention(sdpa=True),
    "hand_written_repeat_kv": lambda: GqaAttention(sdpa=False),
}


def attention_twins(index: int, pattern: dict) -> list[Impl]:
    """The PyTorch twin of a generated attention kernel for every attention pattern."""
    if pattern["family"] != "attention":
        return []
    return [AttentionImpl(pattern, "reference", label="ref")]


def test_attention_tail_reads_the_kernels_layout_through_reshapes():
    """The tail after an attention's value (here nn.MultiheadAttention's exported one: permute
    to (seq, batch, heads, dim), then view to (seq * batch, heads * dim)) was traced on eager's
    result. On the H200, SDPA wrote that result in its query's memory order, (seq, batch,
    heads, dim), so the view was legal; FACT's kernels write (batch, seq, heads, dim), where it
    is not ("view size is not compatible", the ViT block's attention in the twenty-sixth
    session). copy_tail copies views as reshapes, which copy only where a view cannot be."""
    from fact.compose.impls import copy_tail
    from fact.compose.program import Region

    aten = torch.ops.aten
    b, h, s, d = 2, 3, 5, 4
    g = fx.Graph()
    value = g.placeholder("value")  # stands in for the SDPA call
    perm = g.call_function(aten.permute.default, (value, [2, 0, 1, 3]))
    merged = g.call_function(aten.view.default, (perm, [s * b, h * d]))
    g.output(merged)
    reg = Region([value, perm, merged], [], merged, {}, [merged])

    out = fx.Graph()
    new = out.placeholder("attn")  # the kernel's output
    out.output(copy_tail(out, reg, value, new))
    gm = fx.GraphModule(torch.nn.Module(), out)
    assert [n.target for n in out.nodes if n.op == "call_function"] == [
        aten.permute.default,
        aten.reshape.default,
    ]
    expected = torch.randn(b, h, s, d)
    kernel_layout = expected.transpose(1, 2).contiguous().transpose(1, 2)  # (b, s, h, d) memory
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        kernel_layout.permute(2, 0, 1, 3).view(s * b, h * d)  # what the copied view would do
    assert torch.equal(gm(kernel_layout), expected.permute(2, 0, 1, 3).reshape(s * b, h * d))
    eager_layout = expected.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    result = gm(eager_layout)  # where the view is legal, the reshape is that view
    assert result.data_ptr() == eager_layout.data_ptr() and torch.equal(
        result, expected.permute(2, 0, 1, 3).reshape(s * b, h * d)
    )


def node_values(gm: fx.GraphModule, inputs) -> dict:
    """Every node's value in one run of the graph."""
    values = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            values[n] = super().run_node(n)
            return values[n]

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return values


class StubAttentionLibrary:
    """Stands in for a loaded attention kernel library (no .so, no GPU): what AttentionImpl
    and fact::attention read of one, can_implement answering `status`."""

    family = "attention"

    def __init__(self, name="fmha_stub", causal=True, dtype="bf16", head_dim=128, status=0,
                 **info):  # fmt: skip
        self.path = Path(f"/nonexistent/{name}.so")
        self.name = name
        self.info = {"family": "attention", "dtype": dtype, "causal": causal,
                     "head_dim": head_dim, "config": {"name": name}, **info}  # fmt: skip
        self.status = status
        self.asked = []

    def attention_can_implement(self, args):
        self.asked.append(args)
        return self.status

    def last_error(self):
        return "head_dim must be a multiple of 16 bytes and at most 128"


def test_fact_attention_reference_op_layout_gqa_and_opcheck():
    from torch._subclasses.fake_tensor import FakeTensorMode

    handle = register_kernel(AttentionKernel(True, 0.3, torch.float32, "reference", label="r"))
    handle_bf16 = register_kernel(AttentionKernel(True, 0.3, torch.bfloat16, "reference"))
    torch.manual_seed(30)
    b, s, h, hkv, d = 2, 24, 4, 2, 16
    qkv = torch.randn(b, s, h + 2 * hkv, d)  # a fused QKV projection, viewed per head in place
    q = qkv[:, :, :h].transpose(1, 2)
    k = qkv[:, :, h : h + hkv].transpose(1, 2)
    v = qkv[:, :, h + hkv :].transpose(1, 2)
    out = torch.ops.fact.attention(q, k, v, handle)
    assert out.shape == (b, h, s, d) and out.dtype == torch.float32
    assert out.stride() == (s * h * d, d, h * d, 1)  # (B, S, H, D)-contiguous, seen as BHSD
    assert out.transpose(1, 2).is_contiguous()  # the model's .contiguous() after it is free
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # query head h reads K/V head h // 2 (repeat_interleave), as the kernels do
    rep = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.3
    )
    torch.testing.assert_close(out, rep, rtol=1e-5, atol=1e-5)
    # top-left causal with fewer queries than keys, as PyTorch's is_causal
    q_short = q[:, :, :10]
    expected = F.scaled_dot_product_attention(
        q_short, k, v, is_causal=True, scale=0.3, enable_gqa=True
    )
    torch.testing.assert_close(torch.ops.fact.attention(q_short, k, v, handle), expected)
    # a head dim that is not contiguous is made so
    q_t = torch.randn(b, h, d, s).transpose(-1, -2)
    assert q_t.stride(-1) != 1
    expected = F.scaled_dot_product_attention(q_t, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(torch.ops.fact.attention(q_t, k, v, handle), expected)
    out_bf16 = torch.ops.fact.attention(q, k, v, handle_bf16)
    assert out_bf16.dtype == torch.bfloat16 and out_bf16.stride() == out.stride()

    with FakeTensorMode() as mode:
        fq, fk, fv = mode.from_tensor(q), mode.from_tensor(k), mode.from_tensor(v)
        fake = torch.ops.fact.attention(fq, fk, fv, handle)
        fake_bf16 = torch.ops.fact.attention(fq, fk, fv, handle_bf16)
    assert (fake.shape, fake.stride(), fake.dtype) == (out.shape, out.stride(), out.dtype)
    assert (fake_bf16.dtype, fake_bf16.stride()) == (torch.bfloat16, out.stride())
    for args in [(q, k, v, handle), (q.contiguous(), k, v, handle_bf16), (q_t, k, v, handle)]:
        result = torch.library.opcheck(ATTENTION_OP, args)
        assert set(result.values()) == {"SUCCESS"}, result

    with pytest.raises(FactError, match=r"fact::attention r: k and v must both be"):
        torch.ops.fact.attention(q, k, v[:, :, :5], handle)
    with pytest.raises(FactError, match="4 query heads are not a multiple of 3"):
        torch.ops.fact.attention(q, torch.randn(b, 3, s, d), torch.randn(b, 3, s, d), handle)
    with pytest.raises(FactError, match="must be 4-D"):
        torch.ops.fact.attention(q[0], k[0], v[0], handle)
    gemm_handle = register_kernel(GemmKernel(gemm_spec(BIAS_RELU), "reference"))
    with pytest.raises(FactError, match="is not an attention kernel"):
        torch.ops.fact.attention(q, k, v, gemm_handle)


def test_fact_attention_cutlass_entry_checks_and_refusals(monkeypatch):
    """The generated-kernel path without a GPU: wrong dtype/device, and can_implement refusing,
    are FactErrors naming the kernel."""
    pytest.importorskip("fact.tune.attention")
    import fact.compose.ops as ops_mod

    lib = StubAttentionLibrary(status=1)  # FACT_NOT_SUPPORTED
    handle = register_kernel(AttentionKernel(True, 0.25, torch.bfloat16, "cutlass", lib, "fmha_a"))
    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    with pytest.raises(FactError, match=r"fact::attention fmha_a: q is torch.float32 on cpu, the "
                       r"kernel reads torch.bfloat16 on CUDA"):  # fmt: skip
        torch.ops.fact.attention(q, k, v, handle)
    # past the device check (no GPU here): the kernel's refusal, with its own message
    monkeypatch.setattr(ops_mod, "_check_dtypes", lambda label, pairs: None)
    monkeypatch.setattr(ops_mod, "_sm_count", lambda device: 132)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    with pytest.raises(FactError, match=r"fact::attention fmha_a: the kernel cannot run q "
                       r"\(1, 4, 8, 16\).*head_dim must be a multiple"):  # fmt: skip
        torch.ops.fact.attention(qb, kb, vb, handle)
    (args,) = lib.asked  # what the kernel was asked: GQA sizes, the output in (B, S, H, D)
    assert (args.batch, args.heads, args.kv_heads, args.seq_q, args.seq_k, args.head_dim) == (
        1, 4, 2, 8, 8, 16)  # fmt: skip
    assert (args.o_stride_b, args.o_stride_h, args.o_stride_s) == (8 * 4 * 16, 16, 4 * 16)
    assert (args.k_stride_h, args.sm_count) == (8 * 16, 132)
    assert args.scale == pytest.approx(0.25)


@pytest.mark.parametrize("form", ["projection", "heads"])
def test_attention_scaled_before_the_product_reads_the_projections(
    engine_available, tmp_path, monkeypatch, form
):
    """Q (CLIP, BART) or Q and K (Whisper) multiplied by a constant before Q @ K^T: the factors
    join the kernel's softmax scale, and the kernel reads the unscaled projections in place, so
    no multiply is left in the graph."""
    import fact.compose.optimize as optimize_mod

    monkeypatch.setattr(optimize_mod, "library_impls", lambda pattern, device=None: [])
    torch.manual_seed(32)
    model, x = ScaledProjectionAttention(form).eval(), torch.randn(2, 32, 64)
    opt = fact.optimize(model, [x], implementations=attention_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (att,) = by_family(opt.report, "attention")
    assert (att["chosen"], att["kind"]) == ("reference:ref", "generated"), att
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    pattern = plan["patterns"][att["index"]]
    assert pattern["attrs"]["scale"] == pytest.approx(16**-0.5)
    assert pattern["epilogue"] == ["scale", "softmax"]
    assert pattern["attrs"]["causal"] is False
    gm = opt.graph_module
    assert len(calls(gm, ATTENTION_OP)) == 1
    assert not (targets(gm) & {aten.mul.Tensor, aten.mul.Scalar})
    assert rel_err(opt(x), eager(model, x)) < 1e-5
    y = torch.randn(2, 32, 64)  # fresh inputs
    assert rel_err(opt(y), eager(model, y)) < 1e-5


def test_attention_over_q_and_k_cast_to_f32_reads_the_bf16_projections(
    engine_available, tmp_path, monkeypatch
):
    """GPT-J's f32 scores over bf16 Q and K: the casts are exact, so the bf16 kernel (here its
    twin) reads the projections in place; the plan's dtype is bf16 and no cast is left."""
    import fact.compose.optimize as optimize_mod

    monkeypatch.setattr(optimize_mod, "library_impls", lambda pattern, device=None: [])
    torch.manual_seed(34)
    model = Float32ScoresAttention().to(torch.bfloat16).eval()
    x = torch.randn(2, 32, 64, dtype=torch.bfloat16)
    opt = fact.optimize(model, [x], implementations=attention_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (att,) = by_family(opt.report, "attention")
    assert att["chosen"] == "reference:ref", att
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    pattern = plan["patterns"][att["index"]]
    assert pattern["attrs"]["dtype"] == "bf16" and pattern["attrs"]["causal"] is True
    assert pattern["epilogue"] == ["causal_mask", "scale", "softmax"]
    gm = opt.graph_module
    assert not (targets(gm) & {aten.to.dtype, aten._to_copy.default, aten.where.self})
    import copy

    exact = copy.deepcopy(model).double()
    for y in (x, torch.randn(2, 32, 64, dtype=torch.bfloat16)):
        assert rel_err(opt(y).float(), eager(exact, y.double()).float()) < 2e-2


@pytest.mark.parametrize("impl", ["twin", "sdpa"])
def test_attention_over_heads_folded_into_the_batch(engine_available, tmp_path, monkeypatch, impl):
    """bmm over [B * H, S, D] (CLIP's and BART's older code): the kernel's twin and SDPA both
    read Q, K, V as [B * H, 1, S, D] and the result is squeezed back; same function as eager.
    Before, both were refused (the twin: not [batch, heads, seq, dim]), and SDPA ran the
    3-D math kernel."""
    import fact.compose.optimize as optimize_mod

    if impl == "twin":
        monkeypatch.setattr(optimize_mod, "library_impls", lambda pattern, device=None: [])
    torch.manual_seed(33)
    model, x = FoldedHeadsAttention().eval(), torch.randn(2, 24, 64)
    twins = attention_twins if impl == "twin" else None
    opt = fact.optimize(model, [x], implementations=twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (att,) = by_family(opt.report, "attention")
    assert att["chosen"] == ("reference:ref" if impl == "twin" else "sdpa"), att
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert plan["patterns"][att["index"]]["problem"]["batch"] == 2 * 4
    gm = opt.graph_module
    assert aten.bmm.default not in targets(gm) and not (targets(gm) & SOFTMAXES)
    for y in (x, torch.randn(2, 24, 64)):
        assert rel_err(opt(y), eager(model, y)) < 1e-5


@pytest.mark.parametrize("form", list(ATTENTION_MODULES))
def test_attention_patterns_run_as_fact_attention(engine_available, tmp_path, monkeypatch, form):
    """Each attention form with the generated kernel's reference twin: one fact::attention in
    the graph reading Q, K and V in place (un-repeated K/V for grouped-query attention), the
    heads merged without a copy, the same function as eager."""
    import fact.compose.optimize as optimize_mod

    monkeypatch.setattr(optimize_mod, "library_impls", lambda pattern, device=None: [])
    torch.manual_seed(31)
    model, x = ATTENTION_MODULES[form]().eval(), torch.randn(2, 32, 64)
    opt = fact.optimize(model, [x], implementations=attention_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (att,) = by_family(opt.report, "attention")
    rule = "attention_sdpa" if form == "sdpa_gqa" else "attention_handwritten"
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert plan["patterns"][att["index"]]["rule"] == rule
    assert (att["chosen"], att["kind"]) == ("reference:ref", "generated"), att
    assert att["error"] <= 1e-5
    gm = opt.graph_module
    (node,) = calls(gm, ATTENTION_OP)
    assert not (targets(gm) & (SOFTMAXES | {SDPA, aten.matmul.default}))
    assert not (targets(gm) & {aten.expand.default, aten.repeat_interleave.self_int})
    kv_heads = 4 if form == "hand_written_causal" else 2
    values = node_values(gm, opt._program.state_inputs() + [x])
    q, k, v = (values[a] for a in node.args[:3])
    assert q.shape == (2, 4, 32, 16) and k.shape == v.shape == (2, kv_heads, 32, 16)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    out = values[node]
    assert out.shape == (2, 4, 32, 16) and out.stride() == (32 * 4 * 16, 16, 4 * 16, 1)
    # what merges the heads afterwards (transpose, contiguous, the view copied as a reshape)
    # reuses the buffer
    merge = {aten.transpose.int, aten.contiguous.default, aten.reshape.default}
    tail, cur = [], node
    while len(cur.users) == 1 and next(iter(cur.users)).target in merge:
        cur = next(iter(cur.users))
        tail.append(cur.target)
    assert aten.transpose.int in tail and aten.reshape.default in tail, tail
    assert values[cur].shape == (2, 32, 64) and values[cur].data_ptr() == out.data_ptr()
    for seed in (1, 2):
        (y,) = fresh_inputs([x], seed)
        assert rel_err(opt(y), eager(model, y)) < 1e-5


@pytest.mark.parametrize(
    ("precision", "rewritten"), [("high", True), ("medium", True), ("highest", False)]
)
def test_tf32_attention_reads_v_from_a_projection_that_writes_v_transposed(
    engine_available, tmp_path, monkeypatch, precision, rewritten
):
    """fp32 under TF32 on Hopper: the fused QKV projection's V part becomes its own GEMM that
    writes V^T (fact.layouts), the q and k parts one linear over the rest of the weight; the
    attention pattern reads V keys-contiguous through a permuted view of it (what the TF32
    kernels read in place) and the module computes the same function. Under `highest` (no
    TF32 kernel reads such a V) the graph stays as traced."""
    import fact.compose.optimize as optimize_mod

    monkeypatch.setattr(optimize_mod, "library_impls", lambda pattern, device=None: [])
    torch.manual_seed(17)
    model, x = HandWrittenAttention().eval(), torch.randn(2, 32, 64)

    def twins(index, pattern):
        return attention_twins(index, pattern) + reference_twins(index, pattern)

    opt = fact.optimize(model, [x], precision=precision, implementations=twins,
                        require_faster=False, use_cache=False, run_dir=tmp_path / "r",
                        quiet=True)  # fmt: skip
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    (att,) = (p for p in plan["patterns"] if p["family"] == "attention")
    gemms = {
        (p["problem"]["m"], p["problem"]["n"]) for p in plan["patterns"] if p["family"] == "gemm"
    }
    gm = opt.graph_module
    (node,) = calls(gm, ATTENTION_OP)
    v = node_values(gm, opt._program.state_inputs() + [x])[node.args[2]]
    assert v.shape == (2, 4, 32, 16)
    # the registry keeps times of a keys-contiguous V apart (its kernels run differently)
    assert att["signature"].endswith(":causal:v_keys") is rewritten, att["signature"]
    if rewritten:
        assert att["attrs"]["v_strides"] == [32, 16 * 2 * 32, 1, 2 * 32]
        assert (64, 2 * 32) in gemms and (2 * 32, 2 * 64) in gemms, gemms  # V^T; q and k
        assert v.stride() == (32, 16 * 2 * 32, 1, 2 * 32)
        assert v.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    else:
        assert att["attrs"]["v_strides"][-1] == 1 and (2 * 32, 3 * 64) in gemms, gemms
        assert v.stride(-1) == 1
    # the optimized module shares the parameters and sees an in-place update of c_attn
    assert all(a is b for a, b in zip(opt.parameters(), model.parameters(), strict=True))
    for seed in (1, 2):
        (y,) = fresh_inputs([x], seed)
        assert rel_err(opt(y), eager(model, y)) < 1e-5
    with torch.no_grad():
        model.c_attn.weight[2 * 64 :].mul_(-1.5)  # the V rows
    (y,) = fresh_inputs([x], 3)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


def test_v_transposed_leaves_sdpa_and_other_dtypes_alone():
    """SDPA's V is not rewritten (its output layout, and the `.contiguous()` the export dropped
    after it, depend on V's layout), nor anything outside fp32 TF32 on Hopper."""
    from fact.layouts import applies_v_transposed, v_transposed
    from fact.tracer import export_module

    assert applies_v_transposed(torch.float32, "high", "sm90")
    assert not applies_v_transposed(torch.float32, "highest", "sm90")
    assert not applies_v_transposed(torch.bfloat16, "high", "sm90")
    assert not applies_v_transposed(torch.float32, "high", "sm80")
    model, x = GqaAttention(sdpa=True).eval(), torch.randn(2, 32, 64)
    program = export_module(model, [x])
    before = [n.target for n in program.graph_module.graph.nodes]
    assert v_transposed(program) == []
    assert [n.target for n in program.graph_module.graph.nodes] == before
    written = export_module(HandWrittenAttention().eval(), [x])
    (line,) = v_transposed(written)
    assert "V^T (64 x 64, keys contiguous)" in line and "rows 0..128" in line
    # 7 tokens: V^T's rows would not be 16-byte multiples (the TF32 kernels' TMA), so V stays
    odd = export_module(HandWrittenAttention().eval(), [torch.randn(3, 7, 64)])
    assert v_transposed(odd) == []


class HeadsKeptAttention(nn.Module):
    """Attention whose output stays (B, H, S, D) and is then viewed as (B*H, S, D): the plan's
    out_layout is bhsd, so the kernel must write a contiguous (B, H, S, D) tensor."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.h = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width // heads, width // heads)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.h))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.view(b * self.h, t, c // self.h))


def test_attention_output_in_the_heads_first_layout(engine_available, tmp_path, monkeypatch):
    import fact.compose.optimize as optimize_mod

    monkeypatch.setattr(optimize_mod, "library_impls", lambda pattern, device=None: [])
    torch.manual_seed(5)
    model, x = HeadsKeptAttention().eval(), torch.randn(2, 32, 64)
    opt = fact.optimize(model, [x], implementations=attention_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (att,) = by_family(opt.report, "attention")
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert plan["patterns"][att["index"]]["attrs"]["out_layout"] == "bhsd"
    assert att["chosen"] == "reference:ref", att
    (node,) = calls(opt.graph_module, ATTENTION_OP)
    out = node_values(opt.graph_module, opt._program.state_inputs() + [x])[node]
    assert out.is_contiguous() and out.shape == (2, 4, 32, 16)
    (y,) = fresh_inputs([x], 3)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


def test_attention_twin_and_library_sdpa_are_both_checked(engine_available, tmp_path):
    """Without a thumb on the scale: the generated twin and PyTorch's SDPA are both verified
    against the hand-written subgraph (even with repeat_kv and an fp32 softmax, whose
    metadata assertion sits inside the pattern); the faster one runs."""
    torch.manual_seed(32)
    model, x = GqaAttention(sdpa=False).eval(), torch.randn(2, 32, 64)
    opt = fact.optimize(model, [x], implementations=attention_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (att,) = by_family(opt.report, "attention")
    assert [c["impl"] for c in att["candidates"]] == ["reference:ref", "sdpa"]
    assert all(c["ok"] and c["error"] <= 1e-5 for c in att["candidates"]), att["candidates"]
    assert att["chosen"] in ("reference:ref", "sdpa")
    assert len(calls(opt.graph_module, ATTENTION_OP) + calls(opt.graph_module, SDPA)) == 1
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


@pytest.mark.parametrize("kind", ["position", "padding", "causal_padding"])
def test_attention_with_an_additive_bias_runs_as_sdpa_with_attn_mask(
    engine_available, tmp_path, kind
):
    """T5's position bias, BERT's padding mask and a decoder's padding mask under its causal
    mask: one attention pattern with a bias step and a bias operand; the FMHA kernels refuse
    it, SDPA takes the bias as its attn_mask (with -inf above the diagonal where the pattern is
    causal, since SDPA takes is_causal or an attn_mask, not both)."""
    torch.manual_seed(35)
    model = BiasedAttention(kind).eval()
    x, mask = torch.randn(2, 24, 64), torch.ones(2, 24)
    mask[1, -8:] = 0
    inputs = [x] if kind == "position" else [x, mask]
    plan = fact.discover(model, inputs)
    assert plan["pytorch_nodes"] == []
    (pattern,) = [p for p in plan["patterns"] if p["family"] == "attention"]
    steps = {
        "position": ["bias", "softmax"],
        "padding": ["scale", "bias", "softmax"],
        "causal_padding": ["scale", "causal_mask", "bias", "softmax"],
    }
    assert pattern["epilogue"] == steps[kind]
    assert pattern["attrs"]["causal"] == (kind == "causal_padding")
    assert [o["role"] for o in pattern["operands"]] == ["q", "k", "v", "bias"]
    assert pattern["attrs"]["bias_shape"] == (
        [1, 4, 24, 24] if kind == "position" else [2, 1, 1, 24]
    )
    with pytest.raises(NotSupportedError, match="an additive score bias"):
        AttentionImpl(pattern, "reference")
    opt = fact.optimize(model, inputs, require_faster=False, use_cache=False,
                        run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (att,) = by_family(opt.report, "attention")
    assert att["chosen"] == "sdpa", att
    (call,) = calls(opt.graph_module, SDPA)
    assert call.kwargs.get("attn_mask") is not None and not call.kwargs.get("is_causal")
    y, m = torch.randn_like(x), torch.ones_like(mask)
    m[0, -5:] = 0
    m[1, :3] = 0  # left padding: under the causal mask, row 0 sees only a padded key
    again = [y] if kind == "position" else [y, m]
    assert rel_err(opt(*again), eager(model, *again)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("floor", ["-inf", "lowest"])
def test_causal_floor_masks_as_the_graph_did(dtype, bias_first, floor):
    """SDPA's one attn_mask for a padding bias and a causal mask gives the graph's softmax in
    every row, also in the rows the padding masks whole (where the floor decides), whichever of
    the two came first and whether the floor is -inf or finfo.min."""
    from fact.compose.impls import causal_floor

    torch.manual_seed(37)
    c = float("-inf") if floor == "-inf" else torch.finfo(dtype).min
    scores = torch.randn(2, 3, 6, 6).to(dtype)
    pad = torch.ones(2, 6)
    pad[0, :2] = 0  # left padding: rows 0 and 1 see only padded keys under the causal mask
    pad[1, -3:] = 0
    bias = ((1 - pad[:, None, None, :]) * torch.finfo(dtype).min).to(dtype)
    keep = torch.ones(6, 6, dtype=torch.bool).tril()
    floor_t = torch.full([], c, dtype=dtype)
    if bias_first:
        graph = torch.where(keep, scores + bias, floor_t)
    else:
        graph = torch.where(keep, scores, floor_t) + bias
    mask = causal_floor(bias, 6, 6, c, bias_first)
    assert mask.dtype == dtype
    torch.testing.assert_close(
        torch.softmax(scores + mask, -1, dtype=torch.float32),
        torch.softmax(graph, -1, dtype=torch.float32),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("padded", [False, True])
def test_hugging_face_gpt2_attention_is_one_attention(engine_available, tmp_path, padded):
    """GPT-2 as Hugging Face's eager path writes it (bench/zoo/gpt2_block.py): scores divided
    by a 0-dim torch.full, masked by torch.where(tril, scores, finfo.min). One causal attention
    pattern with the scale 1/sqrt(d), checked like any other; nothing left to PyTorch. With a
    padding mask (gpt2_padded_block.py) it has a bias too, and only SDPA takes it."""
    from fact.problem import import_problem_module

    torch.manual_seed(36)
    module = import_problem_module(REPO / "bench" / "zoo" / "gpt2_block.py")
    model, x = module.Model(width=64, heads=4, seq=32).eval(), torch.randn(2, 32, 64)
    mask = torch.ones(2, 32)
    mask[1, -9:] = 0
    inputs = [x, mask] if padded else [x]
    plan = fact.discover(model, inputs)
    assert plan["pytorch_nodes"] == []
    (pattern,) = [p for p in plan["patterns"] if p["family"] == "attention"]
    steps = (
        ["scale", "causal_mask", "bias", "softmax"]
        if padded
        else ["scale", "causal_mask", "softmax"]
    )
    assert pattern["epilogue"] == steps
    assert pattern["attrs"]["causal"] is True and pattern["attrs"]["scale"] == pytest.approx(0.25)
    twins = None if padded else attention_twins  # the FMHA twin refuses a bias
    opt = fact.optimize(model, inputs, implementations=twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (att,) = by_family(opt.report, "attention")
    assert att["chosen"] == "sdpa" if padded else att["chosen"] in ("reference:ref", "sdpa")
    assert att["candidates"] and all(c["ok"] for c in att["candidates"]), att
    y, m = torch.randn_like(x), torch.ones_like(mask)
    m[0, :4] = 0  # left padding: the first rows see only padded keys
    again = [y, m] if padded else [y]
    assert rel_err(opt(*again), eager(model, *again)) < 1e-5


def test_sdpa_pattern_has_no_library_twin_but_a_generated_one(engine_available):
    torch.manual_seed(33)
    model, x = GqaAttention(sdpa=True).eval(), torch.randn(2, 32, 64)
    plan = fact.discover(model, [x])
    (pattern,) = [p for p in plan["patterns"] if p["family"] == "attention"]
    assert pattern["rule"] == "attention_sdpa" and pattern["problem"]["kv_heads"] == 2
    assert library_impls(pattern) == []  # the pattern's own op is the PyTorch baseline
    impl = AttentionImpl(pattern, "reference")
    assert impl.name == "reference:attention" and impl.kind == "generated"
    assert impl.detail["causal"] is True and impl.detail["scale"] == pytest.approx(0.25)


def test_training_mode_dropout_keeps_pytorch_with_a_reason(engine_available):
    """The plan of the module in eval mode, checked on its graph in training mode (active
    dropout): the generated twin and SDPA both refuse, and the decision says why."""
    from fact.compose.optimize import choose

    torch.manual_seed(34)
    model, x = HandWrittenAttention(p=0.1), torch.randn(2, 32, 64)
    plan = fact.discover(model.eval(), [x])
    index, pattern = next(
        (i, p) for i, p in enumerate(plan["patterns"]) if p["family"] == "attention"
    )
    assert "dropout" in pattern["nodes"]  # identity in eval mode, part of the pattern
    program = Program(model, torch.export.export(model, (x,), strict=False))
    trained = torch.export.export(model.train(), (x,), strict=False)  # Program refuses this
    (drop,) = [n for n in trained.graph_module.graph.nodes if n.target is aten.dropout.default]
    assert drop.args[1:] == (0.1, True)
    program.graph_module = trained.graph_module
    values = program.capture(program.inputs([x]))
    impls = {index: [AttentionImpl(pattern, "reference", label="ref"), *library_impls(pattern)]}
    (d,) = [
        d
        for d in choose(
            program, plan, impls, values, torch.device("cpu"), 1e-5, False, Progress(quiet=True)
        )
        if d["index"] == index
    ]
    assert d["chosen"] == "pytorch"
    assert [c["impl"] for c in d["candidates"]] == ["reference:ref", "sdpa"]
    for c in d["candidates"]:
        assert not c["ok"]
        assert c["message"] == "NotSupportedError: dropout is an active dropout (training mode)"
    assert d["reason"].startswith("kept PyTorch (reference:ref: NotSupportedError: dropout is")


def test_optimize_refuses_sdpa_dropout_in_training_mode(engine_available, tmp_path):
    model = GqaAttention(sdpa=True, p=0.1).train()
    with pytest.raises(FactError, match=r"draws random numbers .*scaled_dot_product_attention"):
        fact.optimize(model, [torch.randn(2, 32, 64)], quiet=True, run_dir=tmp_path / "r")


def attention_pattern(**attrs) -> dict:
    """A plan attention pattern (as `fact discover` writes one), attrs overridden."""
    return {
        "family": "attention",
        "rule": "attention_sdpa",
        "epilogue": ["scale", "causal_mask", "softmax"],
        "problem": {
            "batch": 2,
            "heads": 4,
            "kv_heads": 2,
            "seq_q": 32,
            "seq_k": 32,
            "head_dim": 64,
            "head_dim_v": 64,
        },
        "attrs": {"causal": True, "scale": 0.125, "dtype": "bf16", "out_dtype": "bf16", **attrs},
        "signature": "attention[scale+causal_mask+softmax]:bf16:causal",
    }


def test_attention_impl_refusals():
    pattern = attention_pattern()
    AttentionImpl(pattern, "cutlass", StubAttentionLibrary(), label="fmha_ok")
    cases = [
        (dict(pattern, epilogue=["scale", "mask_add", "softmax"]), "reference", None,
         r"attention steps \['mask_add'\]"),
        (dict(pattern, problem=dict(pattern["problem"], head_dim_v=32)), "reference", None,
         "head_dim 64 differs from head_dim_v 32"),
        (dict(pattern, family="gemm"), "reference", None, "gemm is not attention"),
        (pattern, "cutlass", StubAttentionLibrary(causal=False), "is not causal; the pattern is"),
        (pattern, "cutlass", StubAttentionLibrary(dtype="f16"), "reads and writes f16"),
        (attention_pattern(out_dtype="f32"), "cutlass", StubAttentionLibrary(), "writes f32"),
        (pattern, "cutlass", StubAttentionLibrary(head_dim=32), "head_dim up to 32, not 64"),
    ]  # fmt: skip
    # The sm80 kernel's info (f32) says it writes (batch, seq, heads, dim) only and runs grouped
    # query heads one launch per K/V head: MHA, GQA (4 over 2) and MQA are all for it.
    f32 = attention_pattern(dtype="f32", out_dtype="f32")
    sm80 = {"out_layouts": ["bs(hd)"], "kv_groups": "one launch per K/V head"}
    mha = dict(f32, problem=dict(f32["problem"], kv_heads=4))
    mqa = dict(f32, problem=dict(f32["problem"], kv_heads=1))
    for ok in (mha, f32, mqa):
        AttentionImpl(ok, "cutlass", StubAttentionLibrary(dtype="f32", **sm80), label="sm80_ok")
    # 48 query heads over each K/V head: whole 16-row blocks fit, 32-row blocks do not
    mqa48 = dict(f32, problem=dict(f32["problem"], heads=48, kv_heads=1))
    gqa96 = dict(f32, problem=dict(f32["problem"], heads=96, kv_heads=2))
    sm80_q16 = dict(sm80, config={"name": "q16", "block_q": 16})
    AttentionImpl(mqa48, "cutlass", StubAttentionLibrary(dtype="f32", **sm80_q16), label="q16")
    sm80_q32 = dict(sm80, config={"name": "q32kv128_ms_tf32", "block_q": 32})
    cases += [
        (mqa48, "cutlass", StubAttentionLibrary(dtype="f32", **sm80_q32),
         "48 query heads over each K/V head is not a whole number of its 32-row blocks"),
        (gqa96, "cutlass", StubAttentionLibrary(dtype="f32", **sm80_q32),
         "48 query heads over each K/V head is not a whole number of its 32-row blocks"),
        (attention_pattern(dtype="f32", out_dtype="f32", out_layout="bhsd"), "cutlass",
         StubAttentionLibrary(dtype="f32", **sm80),
         r"writes its output as bs\(hd\), the model wants bhsd"),
    ]  # fmt: skip
    for case, backend, lib, message in cases:
        with pytest.raises(NotSupportedError, match=message):
            AttentionImpl(case, backend, lib, label="fmha")


def test_generated_impl_makes_attention_libraries_attention_impls(monkeypatch, tmp_path):
    import fact.tune.abi as abi_mod
    from fact.compose.optimize import generated_impl

    libs = {"good.so": StubAttentionLibrary("fmha_good"),
            "acausal.so": StubAttentionLibrary("fmha_acausal", causal=False)}  # fmt: skip
    monkeypatch.setattr(abi_mod, "KernelLibrary", lambda path: libs[Path(path).name])
    impl = generated_impl(attention_pattern(), str(tmp_path / "good.so"), {})
    assert isinstance(impl, AttentionImpl)
    assert (impl.name, impl.kind, impl.library_path) == (
        "cutlass:fmha_good", "generated", str(tmp_path / "good.so"))  # fmt: skip
    entry = kernel_entry(impl.handle)
    assert (entry.backend, entry.causal, entry.scale, entry.out_dtype) == (
        "cutlass", True, 0.125, torch.bfloat16)  # fmt: skip
    with pytest.raises(NotSupportedError, match="fmha_acausal is not causal"):
        generated_impl(attention_pattern(), str(tmp_path / "acausal.so"), {})


def test_tuned_attention_rows_feed_choose_like_gemm_rows():
    from fact.compose.optimize import _generated_rows, _no_impl_reason

    def row(name, time_us):
        return {"kernel": name, "library": f"/k/{name}.so", "time_us": time_us}

    timed = [row("a", 10.0), row("b", 12.0), row("c", 15.0), {"kernel": "pytorch", "time_us": 9}]
    for family in ("attention", "gemm"):
        picked = _generated_rows({"family": family}, timed)
        assert [r["kernel"] for r in picked] == ["a", "b"]  # the tuner's top two
    untimed = [row("a", None), row("b", None), row("c", None)]
    assert len(_generated_rows({"family": "attention"}, untimed)) == 3  # all, checked in context
    assert len(_generated_rows({"family": "norm"}, timed)) == 3
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert _no_impl_reason({"family": "attention"}, cpu).startswith("no GPU")
    assert _no_impl_reason({"family": "attention"}, gpu) == "no usable generated attention kernel"


def test_device_guard_switches_only_to_another_gpu(monkeypatch):
    from fact.tune.harness import device_guard

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for same in (torch.device("cpu"), torch.device("cuda"), torch.device("cuda:0")):
        assert isinstance(device_guard(same), contextlib.nullcontext), same
    guard = device_guard(torch.device("cuda:1"))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1


# ---------------------------------------------------------------------------------------------
# 14. Horizontal GEMMs: fact::gemm_parts and HorizontalGemmImpl (reference backend on CPU)

PARTS_OP = torch.ops.fact.gemm_parts.default

HORIZONTAL = {
    "family": "horizontal_gemm",
    "rule": "horizontal_gemm",
    "anchors": ["q", "k", "v"],
    "nodes": ["q", "k", "v"],
    "output": "q",
    "problem": {"batch": 1, "m": 16, "n": 128, "k": 64, "n_parts": [64, 32, 32]},
    "attrs": {
        "dtype_a": "f32",
        "dtype_b": "f32",
        "dtype_out": "f32",
        "layout_a": "row",
        "layout_b": "col",
        "parts": ["q", "k", "v"],
    },
    "operands": [
        {"node": "x", "role": "a", "type": "f32[16, 64]"},
        {"node": "wq", "role": "b", "type": "f32[64, 64]"},
        {"node": "bq", "role": "bias", "broadcast": "row", "type": "f32[64]"},
        {"node": "wk", "role": "b", "type": "f32[32, 64]"},
        {"node": "wv", "role": "b", "type": "f32[32, 64]"},
        {"node": "bv", "role": "bias", "broadcast": "row", "type": "f32[32]"},
    ],
    "epilogue": ["bias"],
    "signature": "horizontal_gemm[bias]:f32,f32->f32:row,col",
}
HORIZONTAL_NO_BIAS = dict(
    HORIZONTAL,
    operands=[o for o in HORIZONTAL["operands"] if o["role"] != "bias"],
    epilogue=[],
    signature="horizontal_gemm:f32,f32->f32:row,col",
)


def qkv_tensors(seed: int = 31):
    """a [16, 64], the three Linear weights [n_p, 64] and biases (k has none)."""
    torch.manual_seed(seed)
    a = torch.randn(16, 64)
    weights = [torch.randn(64, 64), torch.randn(32, 64), torch.randn(32, 64)]
    return a, weights, [torch.randn(64), None, torch.randn(32)]


def test_fact_gemm_parts_reference_op_fake_and_opcheck():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    handle = register_kernel(GemmKernel(gemm_spec(HORIZONTAL), "reference", label="qkv"))
    a, weights, biases = qkv_tensors()
    outs = torch.ops.fact.gemm_parts(a, weights, biases, handle)
    assert [tuple(o.shape) for o in outs] == [(16, 64), (16, 32), (16, 32)]
    for out, w, b in zip(outs, weights, biases, strict=True):
        torch.testing.assert_close(out, F.linear(a, w, b), rtol=1e-5, atol=1e-5)
    direct = BODIES[PARTS_OP](a, weights, biases, handle)  # what a composed module calls
    assert all(torch.equal(d, o) for d, o in zip(direct, outs, strict=True))

    half_out = dict(HORIZONTAL, attrs=dict(HORIZONTAL["attrs"], dtype_out="bf16"))
    handle_bf16 = register_kernel(GemmKernel(gemm_spec(half_out), "reference"))
    assert {o.dtype for o in PARTS_OP(a, weights, biases, handle_bf16)} == {torch.bfloat16}
    with FakeTensorMode() as mode:
        fa = mode.from_tensor(a)
        fw = [mode.from_tensor(w) for w in weights]
        fb = [mode.from_tensor(b) if b is not None else None for b in biases]
        fakes = PARTS_OP(fa, fw, fb, handle)
        fakes_bf16 = PARTS_OP(fa, fw, fb, handle_bf16)
    assert all(isinstance(f, FakeTensor) for f in fakes)
    assert [tuple(f.shape) for f in fakes] == [(16, 64), (16, 32), (16, 32)]
    assert {f.dtype for f in fakes} == {torch.float32}
    assert {f.dtype for f in fakes_bf16} == {torch.bfloat16}
    result = torch.library.opcheck(PARTS_OP, (a, weights, biases, handle))
    assert set(result.values()) == {"SUCCESS"}, result

    with pytest.raises(FactError, match=r"fact::gemm_parts qkv: a must be \[m, k\] with one bias"):
        PARTS_OP(a, weights, biases[:2], handle)
    with pytest.raises(FactError, match=r"weight 1 is \(32, 48\), not \[n, 64\]"):
        PARTS_OP(a, [weights[0], torch.randn(32, 48), weights[2]], biases, handle)
    with pytest.raises(FactError, match=r"bias 2 is \(64,\), not \[32\]"):
        PARTS_OP(a, weights, [biases[0], None, torch.randn(64)], handle)
    no_bias = register_kernel(GemmKernel(gemm_spec(HORIZONTAL_NO_BIAS), "reference", label="nb"))
    with pytest.raises(FactError, match="fact::gemm_parts nb: the kernel adds no bias"):
        PARTS_OP(a, weights, biases, no_bias)
    outs = PARTS_OP(a, weights, [None] * 3, no_bias)
    torch.testing.assert_close(outs[2], a @ weights[2].t())
    gemm_handle = register_kernel(GemmKernel(gemm_spec(BIAS_RELU), "reference", label="g"))
    with pytest.raises(FactError, match="fact::gemm_parts g: a gemm kernel has no parts"):
        PARTS_OP(a, weights, biases, gemm_handle)
    attention = register_kernel(AttentionKernel(True, 0.3, torch.float32, "reference"))
    with pytest.raises(FactError, match="is not a GEMM kernel"):
        PARTS_OP(a, weights, biases, attention)


class StubGemmLibrary:
    """Stands in for a loaded GEMM-family kernel library (no .so, no GPU): what
    HorizontalGemmImpl and fact::gemm_parts read of one, can_implement answering `status`."""

    family = "gemm"  # the entry points it exports

    def __init__(self, name="hgemm_stub", status=0, family="horizontal_gemm"):
        self.path = Path(f"/nonexistent/{name}.so")
        self.name = name
        self.info = {"family": family, "config": {"name": name}}
        self.status = status
        self.ran = []

    def can_implement(self, args):
        return self.status

    def workspace_size(self, args):
        return 0

    def run(self, args, workspace, nbytes, stream):
        self.ran.append(args)
        return 0

    def check(self, status):
        assert status == 0

    def last_error(self):
        return "every part's n must be a multiple of 8"


def test_fact_gemm_parts_cutlass_reads_the_weights_in_place(monkeypatch):
    """The generated-kernel path without a GPU: the packed arguments point at the Linear
    weights themselves (W_p^T read column-major, no concatenated copy), each part's own output
    and bias; a wrong device and the kernel's refusal are FactErrors naming the kernel."""
    import fact.compose.ops as ops_mod
    from fact.tune.abi import RASTER

    lib = StubGemmLibrary()
    knobs = {"raster": "along_n", "max_swizzle": 4, "splits": 1}
    handle = register_kernel(GemmKernel(gemm_spec(HORIZONTAL), "cutlass", lib, knobs, "hgemm_a"))
    a, weights, biases = qkv_tensors()
    with pytest.raises(FactError, match=r"fact::gemm_parts hgemm_a: A is torch.float32 on cpu, "
                       r"the kernel reads torch.float32 on CUDA"):  # fmt: skip
        PARTS_OP(a, weights, biases, handle)
    monkeypatch.setattr(ops_mod, "_check_dtypes", lambda label, pairs: None)
    monkeypatch.setattr(ops_mod, "_sm_count", lambda device: 132)
    monkeypatch.setattr(ops_mod, "_launch", lambda run, args, n, device: run(args, None, n, None))
    outs = BODIES[PARTS_OP](a, weights, biases, handle)
    (args,) = lib.ran
    assert (args.m, args.n, args.k, args.batch, args.n_parts) == (16, 128, 64, 1, 3)
    assert (args.a, args.lda) == (a.data_ptr(), 64)
    for part, w, out, bias in zip(args.parts[:3], weights, outs, biases, strict=True):
        assert (part.n, part.b, part.ldb) == (w.shape[0], w.data_ptr(), 64)  # the weight itself
        assert (part.d, part.ldd) == (out.data_ptr(), w.shape[0])
        assert (part.bias or 0) == (bias.data_ptr() if bias is not None else 0)
    assert (args.raster, args.max_swizzle, args.splits, args.sm_count) == (
        RASTER["along_n"], 4, 1, 132)  # fmt: skip
    # a weight the kernel cannot read in place is refused, not copied behind the caller's back
    strided = weights[1].t().contiguous().t()
    with pytest.raises(FactError, match="fact::gemm_parts hgemm_a: part 1 B is not column-major"):
        BODIES[PARTS_OP](a, [weights[0], strided, weights[2]], biases, handle)

    refusing = StubGemmLibrary("hgemm_b", status=1)  # FACT_NOT_SUPPORTED
    handle_b = register_kernel(GemmKernel(gemm_spec(HORIZONTAL), "cutlass", refusing, {}, "b"))
    with pytest.raises(FactError, match=r"fact::gemm_parts b: the kernel cannot run "
                       r"\(16, 64\) against weights \(64, 64\), \(32, 64\), \(32, 64\): every "
                       r"part's n must be"):  # fmt: skip
        PARTS_OP(a, weights, biases, handle_b)
    assert not refusing.ran


def test_horizontal_gemm_impl_refusals_and_generated_impl(monkeypatch, tmp_path):
    import fact.tune.abi as abi_mod
    from fact.compose.optimize import _no_impl_reason, generated_impl

    with pytest.raises(NotSupportedError, match="GemmImpl runs gemm, not horizontal_gemm"):
        GemmImpl(HORIZONTAL, "reference")
    with pytest.raises(NotSupportedError, match="HorizontalGemmImpl runs horizontal_gemm, not g"):
        HorizontalGemmImpl(BIAS_RELU, "reference")
    with pytest.raises(NotSupportedError, match=r"epilogue \['bias', 'relu'\]"):
        HorizontalGemmImpl(dict(HORIZONTAL, epilogue=["bias", "relu"]), "reference")

    libs = {"h.so": StubGemmLibrary("hgemm_good"), "g.so": StubGemmLibrary("gemm_x", family="gemm")}
    monkeypatch.setattr(abi_mod, "KernelLibrary", lambda path: libs[Path(path).name])
    impl = generated_impl(HORIZONTAL, str(tmp_path / "h.so"), {"splits": 1})
    assert isinstance(impl, HorizontalGemmImpl)
    assert (impl.name, impl.kind, impl.library_path) == (
        "cutlass:hgemm_good", "generated", str(tmp_path / "h.so"))  # fmt: skip
    entry = kernel_entry(impl.handle)
    assert (entry.backend, entry.spec.problem["n_parts"], entry.knobs) == (
        "cutlass", [64, 32, 32], {"splits": 1})  # fmt: skip
    with pytest.raises(NotSupportedError, match="gemm_x is a gemm kernel; the pattern is horiz"):
        generated_impl(HORIZONTAL, str(tmp_path / "g.so"), {})
    with pytest.raises(NotSupportedError, match="hgemm_good is a horizontal_gemm kernel"):
        generated_impl(BIAS_RELU, str(tmp_path / "h.so"), {})
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert _no_impl_reason(HORIZONTAL, cpu).startswith("no GPU")
    assert _no_impl_reason(HORIZONTAL, gpu) == "no usable generated kernel"


def horizontal_twins(index: int, pattern: dict) -> list[Impl]:
    """The reference twin of a grouped kernel for horizontal GEMM patterns, and of a generated
    kernel for the other GEMM patterns."""
    if pattern["family"] == "horizontal_gemm":
        return [HorizontalGemmImpl(pattern, "reference", label="parts")]
    return reference_twins(index, pattern)


class TransposedQkvWeights(nn.Module):
    """q/k/v weights stored [in, out] (as ports from JAX keep them): each linear reads w.t(),
    a view made in the graph after the first projection."""

    def __init__(self, d=32, h=48):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Parameter(torch.randn(d, h) * 0.1) for _ in range(3))

    def forward(self, x):
        return (F.linear(x, self.wq.t()), F.linear(x, self.wk.t()), F.linear(x, self.wv.t()))


def test_horizontal_gemm_reading_views_made_after_its_first_part(engine_available, tmp_path):
    """The parts' weight views (w.t()) come after the first projection in the graph; they
    move up before the one grouped call, which fell back before ('computed after its first
    output')."""
    torch.manual_seed(46)
    model, x = TransposedQkvWeights().eval(), torch.randn(2, 16, 32)
    opt = fact.optimize(model, [x], implementations=horizontal_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    (p,) = by_family(opt.report, "horizontal_gemm")
    assert p["chosen"] == "reference:parts" and not p.get("fallback"), p
    assert len(calls(opt.graph_module, run_gemm_parts_pattern)) == 1
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-6


def test_horizontal_gemm_runs_as_one_fact_gemm_parts_call(engine_available, tmp_path):
    """q/k/v projections (one without a bias) as one fact::gemm_parts call writing the three
    outputs, reading the live parameters: an in-place update is seen as eager sees it."""
    torch.manual_seed(32)
    model, x = QkvProjections(cat_all=True).eval(), torch.randn(2, 8, 64)
    opt = fact.optimize(model, [x], implementations=horizontal_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    (h,) = [p for p in plan["patterns"] if p["family"] == "horizontal_gemm"]
    assert h["attrs"]["parts"] == QKV_PARTS and h["problem"]["n_parts"] == [64, 32, 32]
    assert [o["role"] for o in h["operands"]] == ["a", "b", "bias", "b", "b", "bias"]
    (p,) = by_family(opt.report, "horizontal_gemm")
    assert (p["chosen"], p["kind"]) == ("reference:parts", "generated"), p
    assert p["error"] <= 1e-6 and opt.report["verification"]["passed"]

    gm = opt.graph_module
    (node,) = calls(gm, run_gemm_parts_pattern)
    assert aten.linear.default not in targets(gm)
    a, weights, biases = node.args
    assert a.name == "x" and [w.name for w in weights] == ["p_q_weight", "p_k_weight", "p_v_weight"]
    assert [b.name if b is not None else None for b in biases] == ["p_q_bias", None, "p_v_bias"]
    assert node.kwargs["out_shapes"] == [[2, 8, 64], [2, 8, 32], [2, 8, 32]]
    assert sorted(u.args[1] for u in node.users if u.target is operator.getitem) == [0, 1, 2]

    y = torch.randn_like(x)
    with torch.no_grad(), _SeenOps() as mode:
        out = opt(y)
    assert [f for f in mode.ops if f.namespace == "fact"] == [PARTS_OP]  # one call, three parts
    assert rel_err(out, eager(model, y)) < 1e-6
    assert _dispatched_fact_ops(lambda: opt(y)) == []  # eagerly, the op's body is called

    before = opt(y)
    with torch.no_grad():  # the composed module shares the parameters: no concatenated copy
        model.k.weight.add_(1)
        model.v.bias.mul_(2)
    after = opt(y)
    assert (after - before).abs().max() > 1  # the update changed the result ...
    assert rel_err(after, eager(model, y)) < 1e-6  # ... exactly as it changed eager's

    traced = []

    def backend(gm, example_inputs):
        traced.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(opt, backend=backend)
        assert torch.equal(compiled(y), after)
        assert traced.count(PARTS_OP) == 1
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# einsum: torch's own decomposition (fact.rewrites.einsums) exposes the GEMM to the rules


class EinsumProjections(nn.Module):
    """Projections written with einsum: a weight as nn.Linear keeps it, with a bias and GELU
    after; a weight kept (in, out) with a ReLU; a batched contraction with a scaled sigmoid."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(48, 32) / 6)
        self.b = nn.Parameter(torch.randn(48))
        self.u = nn.Parameter(torch.randn(48, 64) / 7)
        self.g = nn.Parameter(torch.randn(4, 64, 16) / 8)

    def forward(self, x):
        h = nn.functional.gelu(torch.einsum("bsd,od->bso", x, self.w) + self.b)
        h = torch.relu(torch.einsum("...d,de->...e", h, self.u))
        return torch.sigmoid(torch.einsum("gnd,gde->gne", h.view(4, -1, 64), self.g)) * 2.0


def test_einsum_projections_are_gemms_with_their_tails(engine_available, tmp_path, monkeypatch):
    import fact.compose.optimize as optimize_mod

    monkeypatch.setattr(optimize_mod, "library_impls", lambda pattern, device=None: [])
    torch.manual_seed(43)
    model, x = EinsumProjections().eval(), torch.randn(2, 16, 32)
    plan = fact.discover(model, [x])
    gemms = sorted(
        (tuple(p["epilogue"]), p["problem"].get("batch", 1), p["problem"]["n"])
        for p in plan["patterns"]
        if p["family"] == "gemm"
    )
    assert gemms == [
        (("bias", "gelu_erf"), 1, 48),
        (("relu",), 1, 64),
        (("sigmoid", "scale"), 4, 16),
    ]
    assert len(plan["patterns"]) == 3 and not plan["pytorch_nodes"], plan["pytorch_nodes"]
    opt = fact.optimize(model, [x], precision="highest", implementations=reference_twins,
                        require_faster=False, use_cache=False, run_dir=tmp_path / "r",
                        quiet=True)  # fmt: skip
    assert [p["chosen"] for p in by_family(opt.report, "gemm")] == ["reference:ref"] * 3
    assert "einsum: einsum ('bsd,od->bso') as" in (tmp_path / "r" / "transcript.txt").read_text()
    for seed in (1, 2):
        (y,) = fresh_inputs([x], seed)
        assert rel_err(opt(y), eager(model, y)) < 1e-5
    with torch.no_grad():  # the parameters are shared: an update is seen
        model.w.mul_(-0.5)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


@pytest.mark.parametrize(
    "equation,shapes,want",
    [
        # a projection: no batch dims, m = (b, s), k = d, n = o
        ("bsd,od->bso", [(2, 3, 4), (5, 4)], {"a": [0, 1, 2], "b": [1, 0], "out": [0, 1, 2]}),
        # attention's scores and output: batch (b, h); K is read transposed
        ("bqhd,bkhd->bhqk", [(2, 7, 3, 4), (2, 9, 3, 4)], {"a": [0, 2, 1, 3], "b": [0, 2, 3, 1]}),
        ("bhqk,bkhd->bqhd", [(2, 3, 7, 9), (2, 9, 3, 4)], {"out": [0, 2, 1, 3]}),
        ("...d,de->...e", [(2, 3, 4), (4, 5)], {"a": [0, 1, 2], "m": [2, 3], "n": [5]}),
        ("ij,jk", [(2, 3), (3, 4)], {"m": [2], "k": [3], "n": [4]}),  # implicit output "ik"
        ("ii,ij->j", [(3, 3), (3, 4)], None),  # a diagonal
        ("ij,jk->k", [(2, 3), (3, 4)], None),  # i summed within one operand
        ("i,j->ij", [(2,), (3,)], None),  # an outer product: nothing contracted
        ("bij,bjk->bik", [(1, 2, 3), (4, 3, 5)], None),  # b broadcasts
    ],
)
def test_einsum_matmul_form(equation, shapes, want):
    from fact.rewrites import matmul_form

    form = matmul_form(equation, shapes)
    if want is None:
        assert form is None
    else:
        assert form is not None and {k: form[k] for k in want} == want, form


class EinsumAttention(nn.Module):
    """Causal self-attention written with einsum, heads kept in (b, s, h, d) order."""

    def __init__(self, d: int = 64, heads: int = 4, seq: int = 32):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).bool())

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(c // self.heads)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        return self.out(torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, c))


def test_einsum_attention_is_an_attention_pattern(engine_available, tmp_path, monkeypatch):
    import fact.compose.optimize as optimize_mod

    monkeypatch.setattr(optimize_mod, "library_impls", lambda pattern, device=None: [])
    torch.manual_seed(45)
    model, x = EinsumAttention().eval(), torch.randn(2, 32, 64)
    plan = fact.discover(model, [x])
    (att,) = [p for p in plan["patterns"] if p["family"] == "attention"]
    assert att["epilogue"] == ["scale", "causal_mask", "softmax"] and att["attrs"]["causal"]
    assert not plan["pytorch_nodes"], plan["pytorch_nodes"]

    def twins(index, pattern):
        return attention_twins(index, pattern) + reference_twins(index, pattern)

    opt = fact.optimize(model, [x], implementations=twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    assert [p["chosen"] for p in opt.report["patterns"]] == ["reference:ref"] * 3
    for seed in (1, 2):
        (y,) = fresh_inputs([x], seed)
        assert rel_err(opt(y), eager(model, y)) < 1e-5


class EinsumOtherForms(nn.Module):
    """Two-operand einsums that are no single product: a diagonal, an outer product."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        diagonal = torch.einsum("ii,ij->j", x, self.w)  # (8,)
        return diagonal * torch.einsum("i,j->ij", x[0], x[1, :8])  # (16, 8)


def test_einsums_that_are_no_product_take_torchs_own_decomposition(engine_available, tmp_path):
    torch.manual_seed(46)
    model, x = EinsumOtherForms().eval(), torch.randn(16, 16)
    plan = fact.discover(model, [x])
    assert not [n for n in plan["opaque_nodes"] if n["op"] == "aten.einsum.default"]
    opt = fact.optimize(model, [x], require_faster=False, use_cache=False, run_dir=tmp_path / "r",
                        quiet=True)  # fmt: skip
    transcript = (tmp_path / "r" / "transcript.txt").read_text()
    assert "einsum: einsum ('ii,ij->j') as" in transcript and "linear" not in transcript
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-6


class EinsumThreeOperands(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(32, 24))
        self.b = nn.Parameter(torch.randn(24, 16))

    def forward(self, x):
        return torch.einsum("nd,de,ef->nf", x, self.a, self.b)


def test_einsum_of_three_operands_stays_one_opaque_op(engine_available, tmp_path):
    torch.manual_seed(44)
    model, x = EinsumThreeOperands().eval(), torch.randn(8, 32)
    plan = fact.discover(model, [x])
    assert not [p for p in plan["patterns"] if p["family"] == "gemm"]
    assert [n["op"] for n in plan["opaque_nodes"]] == ["aten.einsum.default"], plan["opaque_nodes"]
    opt = fact.optimize(model, [x], require_faster=False, use_cache=False, run_dir=tmp_path / "r",
                        quiet=True)  # fmt: skip
    y = torch.randn_like(x)
    assert rel_err(opt(y), eager(model, y)) < 1e-6
