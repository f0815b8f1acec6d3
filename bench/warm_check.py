"""Warm means warm (issue 31, item 6): optimize a problem's model, then optimize a deep copy of
it (and a fresh instance with the same weights) in the same process; the copies must reuse the
first run's decisions: nothing compiled or tuned, the same choices.

    python3 bench/warm_check.py PROBLEM.py [--dtype bf16] [--precision high]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402

import fact  # noqa: E402
from fact.problem import load_problem  # noqa: E402


def compiled(run_dir: str) -> int:
    """Kernels the run compiled (not taken from the cache), from its manifest."""
    path = Path(run_dir) / "manifest.json"
    if not path.is_file():
        return 0
    return sum(1 for e in json.loads(path.read_text()) if e.get("status") == "compiled")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--precision", default="high")
    args = ap.parse_args()
    problem = load_problem(args.problem, args.dtype)
    model = problem.model.cuda().eval()
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.inputs]
    twin = load_problem(args.problem, args.dtype).model.cuda().eval()
    twin.load_state_dict(model.state_dict())
    rows = []
    for label, m in (("original", model), ("deepcopy", copy.deepcopy(model)), ("rebuilt", twin)):
        start = time.perf_counter()
        opt = fact.optimize(m, inputs, precision=args.precision, quiet=True)
        r = opt.report
        rows.append(
            {
                "module": label,
                "seconds": round(time.perf_counter() - start, 1),
                "warm": r["warm"],
                "compiled": 0 if r["warm"] else compiled(r["run_dir"]),
                "replaced": r["replaced"],
                "chosen": [p["chosen"] for p in r["patterns"]],
                "why": [line for line in r["transcript"] if "cold:" in line or "warm:" in line],
            }
        )
    for row in rows:
        print(
            f"{row['module']:9} {row['seconds']:7.1f} s  warm={row['warm']!s:5} "
            f"compiled={row['compiled']:3} replaced={row['replaced']}  {row['why']}"
        )
    same = all(row["chosen"] == rows[0]["chosen"] for row in rows)
    print(f"same choices: {same}")
    return 0 if same and all(row["warm"] for row in rows[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
