"""Why optimize's guard timed the ViT block's original module slower than `fact bench` did.

On the H200 (twenty-sixth session) the guard timed the original 633-646 us where the bench's
eager row, the same module object a minute later, ran 452-460 us; so the guard kept a composed
module that is 1.4x slower than eager. nn.MultiheadAttention's fused inference path
(torch._native_multi_head_attention) is what makes eager fast here. This counts that path's
calls and times the original before optimize, inside the guard and after it.

    python3 bench/guard_check.py [bench/zoo/vit_block.py]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402

import fact  # noqa: E402
from fact.compose import optimize as opt_mod  # noqa: E402
from fact.problem import load_problem  # noqa: E402

calls = {"n": 0}
_real = torch._native_multi_head_attention


def _counting(*args, **kwargs):
    calls["n"] += 1
    return _real(*args, **kwargs)


torch._native_multi_head_attention = _counting


def timed(label: str, fn, device) -> None:
    calls["n"] = 0
    with torch.no_grad():
        fn()
        n = calls["n"]
        us = opt_mod.time_us(fn, device)
    print(f"{label}: {us:.1f} us, fused MHA path calls in one call: {n}", flush=True)


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else str(REPO / "bench/zoo/vit_block.py")
    device = torch.device("cuda")
    problem = load_problem(path, "bf16")
    model = problem.model.to(device).eval()
    inputs = [t.to(device) for t in problem.inputs]
    timed("before optimize", lambda: model(*inputs), device)
    real_guard = opt_mod.guard

    def spying_guard(opt, example):
        timed("inside the guard, opt.original(*example)", lambda: opt.original(*example), device)
        timed("inside the guard, model(*inputs)", lambda: model(*inputs), device)
        g = real_guard(opt, example)
        print(f"guard: fact {g['fact_us']:.1f} us, original {g['original_us']:.1f} us", flush=True)
        return g

    opt_mod.guard = spying_guard
    opt = fact.optimize(model, inputs, quiet=True)
    for p in opt.report["patterns"]:
        why = (p.get("reason") or "")[:160]
        print(f"pattern {p['index']} {p['signature']}: {p['chosen']} {why}", flush=True)
    timed("after optimize", lambda: model(*inputs), device)
    timed("after optimize, the optimized module", lambda: opt(*inputs), device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
