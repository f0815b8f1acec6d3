"""Many sizes from one optimize (issue 35, item 2): other batch and sequence sizes optimized with
the same kernels, ahead of time (other_sizes, prepare) or at the first call that has them
(new_sizes), and timings reused within power-of-two size buckets. On the CPU with the PyTorch
twins of the generated GEMM kernels."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fact
from fact.compose.impls import GemmImpl
from fact.compose.optimize import pattern_class, rel_err, size_bucket, size_bucket_class
from fact.errors import FactError


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FACT_CACHE_DIR", str(tmp_path / "fact-cache"))


def twins(index: int, pattern: dict) -> list:
    return [GemmImpl(pattern, "reference", label="ref")] if pattern["family"] == "gemm" else []


class Mlp(nn.Module):
    """[batch, seq, 32] -> [batch, seq, 32]: both sizes free."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)

    def forward(self, x):
        return self.down(F.gelu(self.up(x))) + x


def optimize(model, x, tmp_path, **kw):
    return fact.optimize(model, [x], implementations=twins, require_faster=False,
                         use_cache=False, run_dir=tmp_path / "r", quiet=True, **kw)  # fmt: skip


def eager(model, x):
    with torch.no_grad():
        return model(x)


def test_size_buckets_group_nearby_sizes_and_only_sizes():
    assert [size_bucket(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [1, 2, 4, 1024, 1024, 2048]
    p = {
        "family": "gemm",
        "signature": "gemm[bias]:bf16,bf16->bf16:row,col",
        "problem": {"m": 1000, "n": 4096, "k": 4096},
        "operands": [{"role": "a", "type": "bf16[1000,4096]", "strides": [4096, 1]}],
    }
    q = dict(p, problem={"m": 1024, "n": 4096, "k": 4096})
    q["operands"] = [{"role": "a", "type": "bf16[1024,4096]", "strides": [4096, 1]}]
    far = dict(q, problem={"m": 1025, "n": 4096, "k": 4096})
    transposed = dict(q, operands=[{"role": "a", "type": "bf16[1024,4096]", "strides": [1, 1024]}])
    matrix = dict(q, operands=[{"role": "a", "type": "bf16[1,1024,4096]", "strides": [0, 4096, 1]}])
    assert pattern_class(p) != pattern_class(q)
    assert size_bucket_class(p) == size_bucket_class(q) != size_bucket_class(far)
    assert size_bucket_class(transposed) != size_bucket_class(q) != size_bucket_class(matrix)
    assert size_bucket_class(p, ["a"]) != size_bucket_class(q, ["b"])  # other kernels on offer


def test_other_sizes_are_optimized_up_front_with_the_same_kernels(engine_available, tmp_path):
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(2, 16, 32)
    opt = optimize(
        model, x, tmp_path, other_sizes=[[torch.randn(2, 12, 32)], [torch.randn(4, 64, 32)]]
    )
    sizes = opt.report["sizes"]
    assert [s["inputs"] for s in sizes] == ["x: [2, 12, 32]", "x: [4, 64, 32]"]
    assert all(s["replaced"] == s["patterns"] == 2 and s["runs"] == "FACT" for s in sizes), sizes
    # 2 x 12 rows share the 32-row bucket with 2 x 16: the first variant reused the timings
    assert sizes[0]["timed_elsewhere"] == 2 and sizes[1]["timed_elsewhere"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs the original" warning at any prepared size
        for shape in ((2, 16, 32), (2, 12, 32), (4, 64, 32)):
            y = torch.randn(*shape)
            assert rel_err(opt(y), eager(model, y)) < 1e-5
    assert len(opt._variants) == 2
    assert opt.prepare(torch.randn(4, 64, 32)) is opt._variants[next(reversed(opt._variants))]


def test_a_call_at_new_sizes_optimizes_for_them_once(engine_available, tmp_path):
    torch.manual_seed(1)
    model = Mlp().eval()
    opt = optimize(model, torch.randn(2, 16, 32), tmp_path)
    y = torch.randn(3, 10, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = opt(y)
        again = opt(y)
    assert rel_err(out, eager(model, y)) < 1e-5 and torch.equal(out, again)
    assert len(opt._variants) == 1 and len(opt.report["sizes"]) == 1
    variant = next(iter(opt._variants.values()))
    assert variant.report["replaced"] == 2 and not variant.use_original
    # 30 rows and 32 rows: one bucket, so nothing was timed again
    assert [p.get("timed_at", {}).get("m") for p in variant.report["patterns"]] == [32, 32]


def test_new_sizes_original_warns_and_runs_the_original(engine_available, tmp_path):
    torch.manual_seed(2)
    model = Mlp().eval()
    opt = optimize(model, torch.randn(2, 16, 32), tmp_path, new_sizes="original")
    y = torch.randn(2, 20, 32)
    with pytest.warns(UserWarning, match="new sizes are not optimized"):
        out = opt(y)
    assert rel_err(out, eager(model, y)) < 1e-6 and not opt._variants


def test_new_sizes_error_names_the_sizes_and_the_way_out(engine_available, tmp_path):
    torch.manual_seed(3)
    model = Mlp().eval()
    opt = optimize(model, torch.randn(2, 16, 32), tmp_path, new_sizes="error")
    with pytest.raises(FactError, match=r"x: \[2, 20, 32\].*opt.prepare"):
        opt(torch.randn(2, 20, 32))
    opt.prepare(torch.randn(2, 20, 32))  # the way out
    y = torch.randn(2, 20, 32)
    assert rel_err(opt(y), eager(model, y)) < 1e-5


def test_only_sizes_may_differ(engine_available, tmp_path):
    torch.manual_seed(4)
    model = Mlp().eval()
    opt = optimize(model, torch.randn(2, 16, 32), tmp_path)
    with pytest.raises(FactError, match="differ only in their sizes: x is a 2-d"):
        opt.prepare(torch.randn(16, 32))
    with pytest.raises(FactError, match="torch.float64"):
        opt.prepare(torch.randn(2, 16, 32, dtype=torch.float64))
    # a call with another number of dimensions is not a new size: the original runs
    with pytest.warns(UserWarning, match="x is a 2-d torch.float32 tensor on cpu, not a 3-d"):
        opt(torch.randn(16, 32))
    assert not opt._variants
    with pytest.raises(FactError, match="new_sizes must be one of"):
        optimize(model, torch.randn(2, 16, 32), tmp_path, new_sizes="sometimes")


def test_a_size_that_fails_to_optimize_runs_the_original_and_is_not_tried_again(
    engine_available, tmp_path
):
    torch.manual_seed(5)
    model = Mlp().eval()
    opt = optimize(model, torch.randn(2, 16, 32), tmp_path)
    tries = []

    def broken(example):
        tries.append(example)
        raise FactError("no plan today")

    object.__setattr__(opt, "_grow", broken)
    y = torch.randn(2, 24, 32)
    with pytest.warns(UserWarning, match=r"sizes x: \[2, 24, 32\] failed \(FactError: no plan"):
        out = opt(y)
    assert rel_err(out, eager(model, y)) < 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert rel_err(opt(y), eager(model, y)) < 1e-6
    assert len(tries) == 1 and not opt._variants


class TwoSizes(nn.Module):
    """Two GEMMs of different problems whose sizes share power-of-two buckets."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(40, 48)
        self.b = nn.Linear(48, 64)

    def forward(self, x):
        return F.relu(self.b(F.gelu(self.a(x))))


def test_within_one_optimize_only_the_same_problem_shares_timings(engine_available, tmp_path):
    torch.manual_seed(6)
    model = TwoSizes().eval()
    opt = optimize(model, torch.randn(24, 40), tmp_path)
    assert [p.get("timed_as") for p in opt.report["patterns"]] == [None, None]
    opt.prepare(torch.randn(30, 40))  # 30 and 24 rows: one bucket, each pattern its own ranking
    variant = next(iter(opt._variants.values()))
    base = opt.report["patterns"]
    for p in variant.report["patterns"]:  # each on its own layer's timings
        assert p["timed_at"]["m"] == 24 and base[p["timed_as"]]["nodes"] == p["nodes"], p


def test_variants_follow_refresh_use_original_and_pdl(engine_available, tmp_path):
    torch.manual_seed(7)
    model = Mlp().eval()
    opt = optimize(model, torch.randn(2, 16, 32), tmp_path, other_sizes=[[torch.randn(2, 8, 32)]])
    y = torch.randn(2, 8, 32)
    variant = next(iter(opt._variants.values()))
    # a write FACT cannot see (.data), then refresh(): the prepared size sees it too
    with torch.no_grad():
        model.up.weight.data.mul_(2)
    opt.refresh()
    assert rel_err(opt(y), eager(model, y)) < 1e-5
    # the base size running the original does not make the other sizes run it
    opt.use_original = True
    assert not variant.use_original and rel_err(opt(y), eager(model, y)) < 1e-5
    opt.pdl = False
    opt(y)
    assert variant.pdl is False


def test_keyword_calls_grow_and_sizes_are_capped(engine_available, tmp_path):
    torch.manual_seed(8)
    model = Mlp().eval()
    opt = optimize(model, torch.randn(1, 4, 32), tmp_path)
    opt.max_sizes = 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seq in (5, 6):
            y = torch.randn(1, seq, 32)
            assert rel_err(opt(x=y), eager(model, y)) < 1e-5
    assert len(opt._variants) == 2
    y = torch.randn(1, 7, 32)
    with pytest.warns(UserWarning, match="at most max_sizes=2 other sizes"):
        assert rel_err(opt(y), eager(model, y)) < 1e-6
    with pytest.raises(FactError, match="at most max_sizes=2"):
        opt.prepare(y)
    assert len(opt._variants) == 2
