"""One optimize, many sizes (issue 35, item 2): optimize a problem file's model at its own inputs,
then call it at other sequence lengths (dimension DIM of every input, scaled), each size
optimized at its first call (new_sizes="optimize"); time each size per call and back to back
against eager and torch.compile (dynamic=False: one graph per size, as FACT has), and count
the kernels compiled after the first optimize.

    python3 bench/size_sweep.py PROBLEM.py --sizes 128,256,512,1024,2048 [--dim 1] --out DIR

The table goes to DIR/sweep.md and every row to DIR/sweep.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402

import fact  # noqa: E402
from fact import timing  # noqa: E402
from fact.problem import load_problem  # noqa: E402


def at_size(inputs: list, dim: int, size: int) -> list:
    """The inputs with dimension `dim` of every tensor that has it resized to `size` (random
    values of the same kind; integer inputs, token ids, stay below their largest value)."""
    out = []
    for t in inputs:
        if not isinstance(t, torch.Tensor) or t.dim() <= dim:
            out.append(t)
            continue
        shape = list(t.shape)
        shape[dim] = size
        if t.is_floating_point():
            out.append(torch.randn(shape, dtype=t.dtype, device=t.device))
        else:
            high = max(1, int(t.max()) + 1)
            out.append(torch.randint(0, high, shape, dtype=t.dtype, device=t.device))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--sizes", required=True, help="comma-separated sizes of dimension --dim")
    ap.add_argument("--dim", type=int, default=1)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    torch.set_float32_matmul_precision("high")
    problem = load_problem(args.problem, args.dtype)
    model = problem.model.to(device).eval()
    base = [t.to(device) if isinstance(t, torch.Tensor) else t for t in problem.inputs]
    started = time.perf_counter()
    opt = fact.optimize(model, base, run_dir=args.out / "runs", quiet=True)
    first_s = time.perf_counter() - started
    compiled = torch.compile(model, dynamic=False) if not args.no_compile else None
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        data = at_size(base, args.dim, size)
        t0 = time.perf_counter()
        with torch.no_grad():
            opt(*data)  # optimizes this size at its first call (unless it is the example's)
        prepare_s = time.perf_counter() - t0
        fns = {"eager": lambda d=data: model(*d), "fact": lambda d=data: opt(*d)}
        if compiled is not None:
            with torch.no_grad():
                compiled(*data)  # compiles this size's graph
            fns["torch.compile"] = lambda d=data: compiled(*d)
        with torch.no_grad():
            times = timing.take_turns(fns, device, rounds=3)
        row = {
            "size": size,
            "first_call_s": round(prepare_s, 2),
            **{f"{k}_per_call_us": v.per_call_us for k, v in times.items()},
            **{f"{k}_back_to_back_us": v.back_to_back_us for k, v in times.items()},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    sizes = opt.report.get("sizes") or []
    summary = {
        "problem": args.problem,
        "first_optimize_s": round(first_s, 2),
        "compiled_after_first": sum(s.get("compiled") or 0 for s in sizes),
        "sizes": sizes,
        "rows": rows,
        "gpu": torch.cuda.get_device_name(device),
    }
    (args.out / "sweep.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = [
        f"# {args.problem}: one optimize ({first_s:.1f} s), sizes of dimension {args.dim}",
        "",
        f"GPU {summary['gpu']}; kernels compiled after the first optimize: "
        f"{summary['compiled_after_first']}",
        "",
        "| size | first call s | eager pc | compile pc | FACT pc | vs eager | vs compile "
        "| FACT b2b | vs eager | vs compile |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a and b else "-"

    for r in rows:
        e, c, f = (r.get(f"{k}_per_call_us") for k in ("eager", "torch.compile", "fact"))
        eb, cb, fb = (r.get(f"{k}_back_to_back_us") for k in ("eager", "torch.compile", "fact"))
        ms = lambda v: f"{v / 1e3:.3f}" if v else "-"  # noqa: E731
        lines.append(
            f"| {r['size']} | {r['first_call_s']} | {ms(e)} | {ms(c)} | {ms(f)} | {ratio(e, f)} "
            f"| {ratio(c, f)} | {ms(fb)} | {ratio(eb, fb)} | {ratio(cb, fb)} |"
        )
    (args.out / "sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
