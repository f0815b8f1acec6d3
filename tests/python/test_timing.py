"""The timing protocols (fact.timing) and the decision rule every choice of optimize follows: an
implementation, CUDA graph replay or the composed module is kept only where it wins under both
protocols, per call and back to back.

The protocols' GPU paths run in the GPU tests; here the CPU paths (wall clock) and the decision
rule, with the timings of each candidate scripted.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fact
from fact import timing
from fact.compose import optimize as optimize_mod
from fact.compose.impls import GemmImpl
from fact.errors import FactError
from fact.timing import Timing

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FACT_CACHE_DIR", str(tmp_path / "fact-cache"))


def test_beats_needs_both_protocols():
    base = Timing(100.0, 100.0)
    assert Timing(90.0, 95.0).beats(base)
    assert not Timing(90.0, 101.0).beats(base)  # faster per call, slower back to back
    assert not Timing(101.0, 50.0).beats(base)  # the other way round
    assert not Timing(100.0, 100.0).beats(base)  # a tie keeps what was there
    assert not Timing(99.8, 99.7).beats(base)  # so do differences within the noise
    assert Timing(90.0, 100.3).beats(base)  # a clear win and a tie
    assert not Timing(97.0, 97.0).beats(base, tie=0.05)
    assert Timing(90.0, 90.0).score() < Timing(80.0, 120.0).score()


def test_protocols_on_the_cpu_count_calls():
    calls = []
    per_call = timing.per_call_times(lambda: calls.append(1), CPU, reps=20, warmup=2)
    assert len(per_call) == 20 and len(calls) == 22 and all(t >= 0 for t in per_call)
    calls.clear()
    b2b = timing.back_to_back_times(lambda: calls.append(1), CPU, rounds=3, calls=7, warmup=1)
    assert len(b2b) == 3 and len(calls) == 1 + 3 * 7
    with pytest.raises(FactError, match="at least 20 repetitions"):
        timing.per_call_times(lambda: None, CPU, reps=5)


def test_take_turns_alternates_and_takes_medians(monkeypatch):
    order = []

    def turn(fn, device, reps):
        fn()
        return {"a": (10.0, 20.0), "b": (30.0, 40.0)}[order[-1]]

    monkeypatch.setattr(timing, "measure_turn", turn)
    times = timing.take_turns(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, CPU, rounds=3
    )
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert times["a"].per_call_us == 10.0 and times["b"].back_to_back_us == 40.0
    assert times["a"].per_call_turns == [10.0] * 3


class LinearRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 48)

    def forward(self, x):
        return F.relu(self.fc(x))


def _twins(index, pattern):
    return [GemmImpl(pattern, "reference", label="ref")] if pattern["family"] == "gemm" else []


def _scripted(monkeypatch, script):
    """optimize's take_turns answering from `script`: {key kind: Timing}, where the key kind is
    "pytorch" for the subgraph (and the original module) and "other" for everything else."""

    def fake(fns, device, errors=None):
        return {k: script["pytorch" if k == "pytorch" else "other"] for k in fns}

    monkeypatch.setattr(optimize_mod, "take_turns", fake)


@pytest.mark.parametrize(
    "candidate, kept",
    [
        (Timing(50.0, 50.0), True),
        (Timing(50.0, 150.0), False),  # faster per call only
        (Timing(150.0, 50.0), False),  # faster back to back only
    ],
)
def test_a_pattern_is_replaced_only_where_it_wins_under_both(
    engine_available, tmp_path, monkeypatch, candidate, kept
):
    _scripted(monkeypatch, {"pytorch": Timing(100.0, 100.0), "other": candidate})
    model, x = LinearRelu().eval(), torch.randn(8, 32)
    opt = fact.optimize(model, [x], implementations=_twins, run_dir=tmp_path / "r", quiet=True)
    (p,) = opt.report["patterns"]
    assert (p["chosen"] == "reference:ref") is kept, p
    if not kept:
        assert "not faster than the PyTorch subgraph under both protocols" in p["reason"]
    assert p["eager_timing"]["per_call_us"] == 100.0
    assert p["candidates"][0]["timing"]["back_to_back_us"] == candidate.back_to_back_us


def _composed(tmp_path) -> tuple[nn.Module, torch.Tensor, optimize_mod.OptimizedModule]:
    model, x = LinearRelu().eval(), torch.randn(8, 32)
    opt = fact.optimize(
        model, [x], implementations=_twins, require_faster=False, run_dir=tmp_path / "r",
        quiet=True,
    )  # fmt: skip
    return model, x, opt


@pytest.mark.parametrize(
    "fact_t, chosen",
    [
        (Timing(50.0, 50.0), "fact"),
        (Timing(50.0, 101.0), "original"),
        (Timing(101.0, 50.0), "original"),
        (Timing(100.0, 100.0), "original"),
    ],
)
def test_the_guard_keeps_the_composed_module_only_where_it_wins_under_both(
    engine_available, tmp_path, monkeypatch, fact_t, chosen
):
    _, x, opt = _composed(tmp_path)
    monkeypatch.setattr(
        optimize_mod,
        "take_turns",
        lambda fns, device, errors=None: {"pytorch": Timing(100.0, 100.0), "fact": fact_t},
    )
    g = optimize_mod.guard(opt, [x])
    assert g["chosen"] == chosen, g
    assert g["fact"]["back_to_back_us"] == fact_t.back_to_back_us


def test_replay_is_kept_only_where_it_wins_under_both(engine_available, tmp_path, monkeypatch):
    _, x, opt = _composed(tmp_path)
    monkeypatch.setattr(
        optimize_mod,
        "take_turns",
        lambda fns, device, errors=None: {True: Timing(40.0, 120.0), False: Timing(100.0, 100.0)},
    )
    r = optimize_mod.choose_replay(opt, [x])
    assert r["chosen"] == "launches" and not opt.cuda_graphs and opt._replay is None
    monkeypatch.setattr(
        optimize_mod,
        "take_turns",
        lambda fns, device, errors=None: {True: Timing(40.0, 90.0), False: Timing(100.0, 100.0)},
    )
    assert optimize_mod.choose_replay(opt, [x])["chosen"] == "cuda_graph"


def test_identical_patterns_are_timed_once(engine_available, tmp_path, monkeypatch):
    """The layers of a model repeat their patterns: each class is timed once, and the others
    verify on their own values and reuse its times."""

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([LinearRelu() for _ in range(3)])
            self.mix = nn.Linear(48, 32)

        def forward(self, x):
            for layer in self.layers:
                x = self.mix(layer(x))
            return x

    timed = []

    def fake(fns, device, errors=None):
        timed.append(len(fns))
        return {k: Timing(100.0, 100.0) if k == "pytorch" else Timing(50.0, 50.0) for k in fns}

    monkeypatch.setattr(optimize_mod, "take_turns", fake)
    model, x = Stack().eval(), torch.randn(8, 32)
    opt = fact.optimize(model, [x], implementations=_twins, run_dir=tmp_path / "r", quiet=True)
    patterns = opt.report["patterns"]
    assert len(patterns) == 6 and all(p["chosen"] == "reference:ref" for p in patterns)
    assert len(timed) == 2  # relu layers once, the mixing linear once
    shared = [p for p in patterns if "timed_as" in p]
    assert len(shared) == 4 and all(p["timed_as"] != p["index"] for p in shared)
    with torch.no_grad():
        want = model(x)
    assert torch.allclose(opt(x), want, atol=1e-5)


def test_a_candidate_that_fails_while_timed_is_dropped_alone():
    def broken():
        raise RuntimeError("an illegal memory access")

    errors: dict = {}
    fns = {"pytorch": lambda: None, 1: broken, 2: lambda: None}
    times = timing.take_turns(fns, CPU, errors=errors)
    assert set(times) == {"pytorch", 2} and "illegal memory access" in errors[1]
    with pytest.raises(RuntimeError):
        timing.take_turns({"pytorch": lambda: None, 1: broken}, CPU)
