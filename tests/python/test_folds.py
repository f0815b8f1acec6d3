"""LayerNorms folded into the GEMMs after them (fact/folds.py): the rewrite computes the same
function, refuses what it cannot fold, and fact.optimize keeps a fold only when its kernels run
(checked on the CPU with PyTorch twins of the kernels)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import fact
from fact import folds
from fact.compose import report
from fact.compose.impls import GemmImpl, NormImpl, run_gemm_pattern
from fact.tracer import export_module

aten = torch.ops.aten


class PreNormMlp(nn.Module):
    """x + proj(relu(fc(ln(x)))), a LayerNorm with a weight and a bias that are not 1 and 0."""

    def __init__(self, width: int = 64, hidden: int = 128):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, hidden)
        self.proj = nn.Linear(hidden, width)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.normal_()

    def forward(self, x):
        return x + self.proj(torch.relu(self.fc(self.ln(x))))


class PreNormQkv(nn.Module):
    """One LayerNorm read by three projections (no bias on the norm)."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(64, bias=False)
        self.q, self.k, self.v = (nn.Linear(64, 32) for _ in range(3))

    def forward(self, x):
        h = self.ln(x)
        return self.q(h) * self.k(h) + self.v(h)


class NormAlsoResidual(nn.Module):
    """The normalised value is also added back: it must be written, so nothing is folded."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        h = self.ln(x)
        return h + self.fc(h)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("make", [PreNormMlp, PreNormQkv])
def test_folded_program_computes_the_same_function(make, dtype):
    torch.manual_seed(0)
    model = make().eval().to(dtype)
    x = torch.randn(4, 16, 64, dtype=dtype) + 0.5
    program = export_module(model, [x])
    records = folds.fold_norms(program)
    assert len(records) == 1
    gemms = records[0]["gemms"]
    assert len(gemms) == (3 if make is PreNormQkv else 1)
    assert aten.layer_norm.default not in targets(program.graph_module)
    assert aten.native_layer_norm.default in targets(program.graph_module)
    fresh = torch.randn(4, 16, 64, dtype=dtype) * 2 + 1.0
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(fresh.double())
        got = program.module()(fresh)
        eager = model(fresh)
    bound = 1e-5 if dtype == torch.float32 else 1.5e-2
    assert rel_err(got, ref) < bound
    assert rel_err(got, ref) < 3 * rel_err(eager, ref) + 1e-6


def test_a_norm_read_by_anything_but_linears_is_not_folded():
    model, x = NormAlsoResidual().eval(), torch.randn(2, 8, 64)
    program = export_module(model, [x])
    assert folds.fold_norms(program) == []
    assert aten.layer_norm.default in targets(program.graph_module)


def test_a_linear_whose_weight_is_computed_is_not_folded():
    class ComputedWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(64)
            self.w = nn.Parameter(torch.randn(32, 64))

        def forward(self, x):
            return nn.functional.linear(self.ln(x), self.w * 2)

    program = export_module(ComputedWeight().eval(), [torch.randn(2, 8, 64)])
    assert folds.fold_norms(program) == []


class StackedNorms(nn.Module):
    """Two pre-norm layers in a row: the second LayerNorm reads the first fold's output; and
    the last linear's output is what the module returns (an LM head)."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(64), nn.LayerNorm(64)
        self.fc1, self.head = nn.Linear(64, 64), nn.Linear(64, 48)
        with torch.no_grad():
            for ln in (self.ln1, self.ln2):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.normal_()

    def forward(self, x):
        return self.head(self.ln2(torch.relu(self.fc1(self.ln1(x)))))


def test_a_norm_of_a_folded_linear_and_a_returned_linear_fold_too():
    torch.manual_seed(4)
    model, x = StackedNorms().eval(), torch.randn(2, 8, 64)
    program = export_module(model, [x])
    records = folds.fold_norms(program)
    assert [r["gemms"][0]["linear"] for r in records] == ["linear", "linear_1"]
    assert records[0]["weight_bytes"] == 64 * 64 * 4
    fresh = torch.randn(2, 8, 64)
    with torch.no_grad():
        assert rel_err(program.module()(fresh), model(fresh)) < 1e-5


def test_skipped_norms_are_not_folded():
    model, x = StackedNorms().eval(), torch.randn(2, 8, 64)
    program = export_module(model, [x])
    (record,) = folds.fold_norms(program, skip={"layer_norm"})
    assert record["norm"] == "layer_norm_1"
    assert aten.layer_norm.default in targets(program.graph_module)


def test_folds_apply_to_16_bit_models_and_to_fp32_only_when_fp32_accurate():
    assert folds.applies(torch.bfloat16, "high", "sm90") and folds.applies(
        torch.float16, "high", "sm80"
    )
    assert folds.applies(torch.float32, "highest", "sm90")
    # TF32 rounds x itself, an error mean * c1 does not cancel
    assert not folds.applies(torch.float32, "high", "sm90")
    assert not folds.applies(torch.float64, "highest", "sm90")


def twins_with_stats(index: int, pattern: dict) -> list:
    """PyTorch twins of the GEMM kernels and of the row-statistics kernel."""
    if pattern["family"] == "gemm":
        return [GemmImpl(pattern, "reference", label="ref")]
    if pattern["family"] == "norm" and (pattern.get("attrs") or {}).get("stats"):
        return [NormImpl(pattern, "reference", label="stats")]
    return []


def gemm_twins(index: int, pattern: dict) -> list:
    return [GemmImpl(pattern, "reference", label="ref")] if pattern["family"] == "gemm" else []


def test_only_the_folds_that_do_not_pay_are_dropped(engine_available, tmp_path):
    """Twins for the GEMMs everywhere, for the statistics of the second norm only: the first
    fold is dropped, the second kept."""

    def twins(index: int, pattern: dict) -> list:
        x = next((o["node"] for o in pattern["operands"] if o.get("role") == "x"), None)
        if pattern["family"] == "norm" and x != "x":  # not the first norm: it reads the input
            return [NormImpl(pattern, "reference", label="stats")]
        return gemm_twins(index, pattern)

    torch.manual_seed(5)
    model, x = StackedNorms().eval(), torch.randn(2, 8, 64)
    opt = fact.optimize(
        model, [x], implementations=twins, require_faster=False, run_dir=tmp_path, fold_norms=True
    )
    assert [d.split(":")[0] for d in opt.report["folds_dropped"]] == ["layer_norm"]
    assert len(opt.report["folds"]) == 1 and opt.report["folds"][0].startswith("layer_norm_1 ")
    fresh = torch.randn(2, 8, 64)
    with torch.no_grad():
        assert rel_err(opt(fresh), model(fresh)) < 1e-5


def test_optimize_keeps_a_fold_whose_kernels_run(engine_available, tmp_path):
    torch.manual_seed(1)
    model, x = PreNormMlp().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(
        model, [x], implementations=twins_with_stats, require_faster=False,
        run_dir=tmp_path / "r", fold_norms=True,
    )  # fmt: skip
    assert opt.report["folds"] and opt.report["folds_dropped"] == []
    gm = opt.graph_module
    assert torch.ops.fact.norm_stats.default in targets(gm)
    assert not {aten.layer_norm.default, aten.native_layer_norm.default} & set(targets(gm))
    gemms = [n for n in gm.graph.nodes if n.target is run_gemm_pattern]
    assert len(gemms) == 2
    # the derived weights (W * gamma, the column sums) are computed once, not per call
    per_call = targets(opt._hoist.main)
    assert aten.sum.dim_IntList not in per_call and aten.mv.default not in per_call
    y = torch.randn_like(x) * 3 + 1
    with torch.no_grad():
        assert rel_err(opt(y), model(y)) < 1e-5
        # the LayerNorm's weight updated in place: the folded weights follow
        model.ln.weight.mul_(1.5)
        model.ln.bias.add_(0.25)
        assert rel_err(opt(y), model(y)) < 1e-5


def test_optimize_plans_again_without_a_fold_whose_kernels_do_not_run(engine_available, tmp_path):
    """Without a kernel for the row statistics, the fold would leave PyTorch a LayerNorm plus a
    heavier epilogue: optimize plans the module again as written."""
    torch.manual_seed(2)
    model, x = PreNormMlp().eval(), torch.randn(4, 16, 64)
    run = tmp_path / "r"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    opt = fact.optimize(
        model, [x], implementations=gemm_twins, require_faster=False, run_dir=run, fold_norms=True
    )
    (line,) = opt.report["folds_dropped"]
    assert line.startswith("layer_norm: ") and "row statistics run in PyTorch" in line
    assert not opt.report["folds"]
    assert aten.layer_norm.default in targets(opt.graph_module)
    # the folded attempt stays where it ran; the plan without the fold goes beside it
    assert (run / "notes.txt").read_text() == "mine" and (run / "plan.json").is_file()
    assert "layer_norm" in json.loads((run / "folds-dropped.json").read_text())
    saved = json.loads((run / "replan-1" / "optimize.json").read_text())
    assert saved["folds_dropped"] == opt.report["folds_dropped"]
    assert opt.report["run_dir"] == str(run / "replan-1")
    assert any(
        "planning again without the folds of layer_norm" in t for t in opt.report["transcript"]
    )
    md = report.markdown({"results": [], "optimize": opt.report})
    dropped = "LayerNorm folds tried and dropped (their kernels did not all run), planned again"
    assert f"{dropped} without: {line}." in md
    y = torch.randn_like(x)
    with torch.no_grad():
        assert rel_err(opt(y), model(y)) < 1e-5


def test_optimize_folds_nothing_unless_asked(engine_available, tmp_path):
    """Folds are off by default (they measured no faster on the H200): with kernels for the
    statistics available, the LayerNorm still runs as a norm and the report lists no fold."""
    torch.manual_seed(4)
    model, x = PreNormMlp().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(
        model, [x], implementations=twins_with_stats, require_faster=False, run_dir=tmp_path
    )
    assert opt.report["folds"] == [] and opt.report["folds_dropped"] == []
    assert torch.ops.fact.norm_stats.default not in targets(opt.graph_module)
    assert not any(t.startswith("fold: ") for t in opt.report["transcript"])
