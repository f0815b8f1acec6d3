"""Held-out workloads (bench/heldout/): `fact bench` on each problem file in one process, then
one table: eager, torch.compile and FACT under both protocols (per call: L2 flushed, the GPU
idle, synchronized; back to back: 20 calls, one synchronize), the host's time per call, the
error against float64, and what optimize chose.

    python3 bench/heldout.py --out DIR [--dtype bf16] [--precision high] PROBLEM.py ...

Each problem's report (markdown, JSON, chart) goes to DIR/<problem>/; the table to DIR/heldout.md
and DIR/heldout.json. A problem that fails is listed with its error and the others go on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402

from fact.compose.bench import run_bench  # noqa: E402
from fact.compose.optimize import compiled_count  # noqa: E402


def _row(name: str, bench: dict) -> dict:
    rows = {r["name"]: r for r in bench["results"]}
    opt = bench.get("optimize") or {}
    out = {"problem": name, "seconds": opt.get("seconds"), "warm": opt.get("warm")}
    for who in ("eager", "torch.compile", "fact"):
        r = rows.get(who) or {}
        out[who] = {
            "per_call_us": r.get("time_us"),
            "back_to_back_us": r.get("back_to_back_us"),
            "host_us": r.get("host_us"),
            "rel_error": r.get("rel_error"),
        }
    out["replaced"] = f"{opt.get('replaced', 0)}/{len(opt.get('patterns') or [])}"
    if opt.get("run_dir"):  # kernels built for this problem now, not taken from the cache
        out["compiled"] = compiled_count(Path(opt["run_dir"]))
    out["chosen"] = [p.get("chosen") for p in opt.get("patterns") or []]
    out["mode"] = (
        "original"
        if (opt.get("guard") or {}).get("chosen") == "original"
        else ("graph" if opt.get("cuda_graphs") else "launches")
    )
    return out


def bandwidth(problem_path: str, dtype: str, device: torch.device) -> dict:
    """The bytes a problem must move (its inputs read once, its output written once) and the
    back-to-back time of a device-to-device copy of as many bytes (read plus written): the
    floor a memory-bound module is held against."""
    import statistics

    from fact import timing
    from fact.problem import load_problem

    problem = load_problem(problem_path, dtype)
    model = problem.model.to(device).eval()
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in problem.inputs]
    with torch.no_grad():
        out = model(*inputs)
    moved = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
    moved += out.numel() * out.element_size()
    src = torch.empty(moved // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_us = statistics.median(timing.back_to_back_times(lambda: dst.copy_(src), device))
    return {"bytes": moved, "copy_us": copy_us}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def table(rows: list[dict]) -> str:
    head = (
        "| problem | eager pc | compile pc | FACT pc | vs eager | vs compile | eager b2b | "
        "compile b2b | FACT b2b | vs eager | vs compile | host eager/compile/FACT us | "
        "replaced | runs | optimize s (compiled) |"
    )
    lines = [head, "|" + " --- |" * 15]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['problem']} | error: {r['error'][:150]} |" + " |" * 13)
            continue
        e, c, f = r["eager"], r["torch.compile"], r["fact"]

        def ms(v):
            return f"{v / 1e3:.3f}" if v else "-"

        def us(v):
            return f"{v:.0f}" if v is not None else "-"

        lines.append(
            f"| {r['problem']} | {ms(e['per_call_us'])} | {ms(c['per_call_us'])} | "
            f"{ms(f['per_call_us'])} | {_ratio(e['per_call_us'], f['per_call_us'])} | "
            f"{_ratio(c['per_call_us'], f['per_call_us'])} | {ms(e['back_to_back_us'])} | "
            f"{ms(c['back_to_back_us'])} | {ms(f['back_to_back_us'])} | "
            f"{_ratio(e['back_to_back_us'], f['back_to_back_us'])} | "
            f"{_ratio(c['back_to_back_us'], f['back_to_back_us'])} | "
            f"{us(e['host_us'])}/{us(c['host_us'])}/{us(f['host_us'])} | {r['replaced']} | "
            f"{r['mode']} | {r['seconds']} ({r.get('compiled', '-')}) |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--runs", type=Path, help="run directories (kernels, logs); reports are copied to --out"
    )
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--precision", default="high")
    ap.add_argument("--candidates", type=int, default=4)
    ap.add_argument(
        "--bandwidth",
        action="store_true",
        help="for pointwise_* and norm_* problems, also time a copy of the bytes they move",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in args.problems:
        name = Path(path).stem
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            torch._dynamo.reset()
            run = (args.runs or args.out) / name
            bench = run_bench(
                path,
                dtype=args.dtype,
                precision=args.precision,
                out=run,
                candidates=args.candidates,
                quiet=True,
                command=" ".join(sys.argv),
            )
            rows.append(_row(name, bench))
            if args.bandwidth and name.startswith(("pointwise_", "norm_")):
                rows[-1]["bandwidth"] = bandwidth(path, args.dtype, torch.device("cuda"))
            if args.runs:
                (args.out / name).mkdir(parents=True, exist_ok=True)
                for f in ("report.md", "report.json", "optimize.json", "transcript.txt"):
                    if (run / f).is_file():
                        shutil.copy(run / f, args.out / name / f)
        except Exception as exc:  # noqa: BLE001 - one problem's failure is its row
            traceback.print_exc()
            rows.append({"problem": name, "error": f"{type(exc).__name__}: {exc}"})
        print(f"== {name}: {time.perf_counter() - started:.0f} s", flush=True)
        (args.out / "heldout.json").write_text(json.dumps(rows, indent=1, default=str))
        (args.out / "heldout.md").write_text(table(rows) + "\n")
        torch.cuda.empty_cache()
    print(table(rows))
    for r in rows:
        bw = r.get("bandwidth")
        if bw and "error" not in r:
            gb = bw["bytes"] / 1e9
            t = {who: r[who]["back_to_back_us"] for who in ("eager", "torch.compile", "fact")}
            copy_tbs = gb / bw["copy_us"] * 1e3
            print(
                f"{r['problem']}: {gb:.2f} GB moved; copy {copy_tbs:.2f} TB/s; "
                + ", ".join(
                    f"{who} {gb / us * 1e6 / 1e3:.2f} TB/s ({bw['copy_us'] / us:.0%} of copy)"
                    for who, us in t.items()
                    if us
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
