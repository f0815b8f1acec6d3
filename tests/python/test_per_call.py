"""The composed module's per-call path (issue 31: host time before the first launch is what a
synchronizing caller pays): state read through the dicts of the modules that hold it, calls of
plain leaves flattened without pytree. What must survive the shortcuts: a swapped submodule, a
new parameter assigned to an attribute, an in-place update, calls with keywords or nested
arguments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fact
from fact.compose.impls import GemmImpl


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FACT_CACHE_DIR", str(tmp_path / "fact-cache"))


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(16, 32)
        self.second = nn.Linear(32, 8)

    def forward(self, x, scale=1.0):
        return self.second(F.relu(self.first(x))) * scale


def _twins(index, pattern):
    return [GemmImpl(pattern, "reference", label="ref")] if pattern["family"] == "gemm" else []


def _optimized(tmp_path):
    torch.manual_seed(0)
    model, x = Two().eval(), torch.randn(4, 16)
    opt = fact.optimize(
        model, [x], implementations=_twins, require_faster=False, run_dir=tmp_path / "r",
        quiet=True,
    )  # fmt: skip
    assert opt.report["replaced"] == 2
    return model, x, opt


def _eager(model, *args, **kwargs):
    with torch.no_grad():
        return model(*args, **kwargs)


def test_a_swapped_submodule_is_read_at_the_next_call(engine_available, tmp_path):
    model, x, opt = _optimized(tmp_path)
    assert torch.allclose(opt(x), _eager(model, x), atol=1e-6)
    model.first = nn.Linear(16, 32)  # same shapes, other weights (a LoRA merge, a reload)
    assert torch.allclose(opt(x), _eager(model, x), atol=1e-6)
    model.second.weight = nn.Parameter(torch.randn(8, 32))  # a new parameter on the attribute
    assert torch.allclose(opt(x), _eager(model, x), atol=1e-6)
    with torch.no_grad():
        model.second.bias.add_(1.0)  # in place
    assert torch.allclose(opt(x), _eager(model, x), atol=1e-6)


def test_calls_that_are_not_plain_leaves_still_bind(engine_available, tmp_path):
    model, x, opt = _optimized(tmp_path)
    assert opt._program._plain_arity == 1
    assert torch.allclose(opt(x=x), _eager(model, x), atol=1e-6)  # by keyword
    with pytest.warns(UserWarning, match="runs the original module"):
        assert torch.allclose(opt(x, 2.0), _eager(model, x, 2.0), atol=1e-6)  # another arity


def test_a_call_with_grad_enabled_runs_without_it_and_restores_it(engine_available, tmp_path):
    model, x, opt = _optimized(tmp_path)
    assert torch.is_grad_enabled()
    y = opt(x.requires_grad_())
    assert not y.requires_grad and torch.is_grad_enabled()
    assert torch.allclose(y, _eager(model, x), atol=1e-6)
    # a size that cannot be optimized: the original module runs, and raises
    with pytest.raises(RuntimeError), pytest.warns(UserWarning, match="failed"):
        opt(torch.randn(4, 15))
    assert torch.is_grad_enabled()
    with torch.no_grad():
        opt(x)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()


def test_a_dtype_change_of_the_model_after_optimize_is_seen(engine_available, tmp_path):
    # the signature reads dtypes of the state at every call: .double() keeps the Parameter
    # objects (and their version counters) and swaps their storage
    model, x, opt = _optimized(tmp_path)
    model.double()
    with pytest.warns(UserWarning, match="runs the original module"):
        y = opt(x.double())
    assert y.dtype == torch.float64
    assert torch.allclose(y, _eager(model, x.double()), atol=1e-9)
