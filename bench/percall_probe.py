"""Where a composed module's per-call time goes (issue 31, item 1): for each problem file, the
host's time per call at each layer of the call path, from the module's forward down to the
kernel library's C entry points, and the GPU timeline's lead (the time from the call's start to
its first kernel) for eager and the composed module.

    python3 bench/percall_probe.py --out DIR PROBLEM.py ...

Layers timed: host wall time per call with the GPU kept busy (so no launch waits; median of
200) and with the GPU idle, and the per-call protocol's time (fact.timing.per_call_times: L2
flushed, events, synchronized; median of 30):
  eager                 the original module
  composed              the optimized module's forward (guards, flatten, graph, kernels)
  run_graph             the composed graph alone (no guards, flatten or unflatten)
  launch (python)       PreparedGemm.launch: output allocation, argument copy, ctypes call
  fact_gemm_run         the C entry point alone, through ctypes (can_implement, workspace
                        size, CUTLASS initialize, launch)
  can_implement, workspace_size   its first two steps alone
Then cProfile of the composed forward, and torch.profiler's lead for eager and composed.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402

from fact.compose import ops  # noqa: E402
from fact.compose.bench import kernel_profile  # noqa: E402
from fact.compose.optimize import optimize  # noqa: E402
from fact.problem import load_problem  # noqa: E402
from fact.timing import per_call_times  # noqa: E402

BUSY_CYCLES = 20_000_000  # about 10 ms of backlog: the host never waits on the GPU


def host_us(fn, reps: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        if i % 20 == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(BUSY_CYCLES)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def idle_host_us(fn, reps: int = 50) -> float:
    """Host time per call with the GPU idle before it (synchronized)."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def probe(path: str, out: Path, graphs: bool = False) -> dict:
    problem = load_problem(path, "bf16")
    model = problem.model.cuda().eval()
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.inputs]
    opt = optimize(model, inputs, run_dir=out / Path(path).stem, quiet=True, cuda_graphs=graphs)
    guard = (opt.report.get("guard") or {}).get("chosen")
    opt.use_original = False
    seen = {}
    real = ops.PreparedGemm.launch

    def spy(self, a, b, operands):
        seen.setdefault("gemm", (self, a, b, list(operands)))
        return real(self, a, b, operands)

    ops.PreparedGemm.launch = spy
    with torch.no_grad():
        opt(*inputs)
    ops.PreparedGemm.launch = real
    flat = list(inputs)
    state = opt._program.state_inputs()
    layers = {}
    device = torch.device("cuda")
    with torch.no_grad():
        layers["eager"] = lambda: model(*inputs)
        layers["composed"] = lambda: opt(*inputs)
        layers["run_graph"] = lambda: opt.run_graph(flat, state)
        if "gemm" in seen:
            p, a, b, operands = seen["gemm"]
            d = torch.empty(p.out_shape, dtype=p.out_dtype, device=p.device)
            args = ops.FactGemmArgs.from_buffer_copy(p.args)
            args.a, args.b, args.d = a.data_ptr(), b.data_ptr(), d.data_ptr()
            for i, t in enumerate(operands):
                args.operands[i] = t.data_ptr()
            ws = torch.empty(max(p.workspace, 1), dtype=torch.uint8, device=p.device)
            stream = torch.cuda.current_stream().cuda_stream
            dll = p.lib._dll
            layers["launch (python)"] = lambda: p.launch(a, b, operands)
            layers["fact_gemm_run"] = lambda: dll.fact_gemm_run(
                ctypes.byref(args),
                ctypes.c_void_p(ws.data_ptr()),
                p.workspace,
                ctypes.c_void_p(stream),
            )
            layers["can_implement"] = lambda: dll.fact_gemm_can_implement(ctypes.byref(args))
            layers["workspace_size"] = lambda: dll.fact_gemm_workspace_size(ctypes.byref(args))
        row = {"problem": Path(path).stem, "mode": "graph" if opt.cuda_graphs else "launches"}
        row["guard"] = guard
        for name, fn in layers.items():
            row[name] = {
                "busy_us": host_us(fn),
                "idle_us": idle_host_us(fn),
                "per_call_us": statistics.median(per_call_times(fn, device, reps=30)),
            }
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        torch.cuda._sleep(BUSY_CYCLES * 5)
        prof.enable()
        for _ in range(300):
            opt(*inputs)
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        row["cprofile"] = text.getvalue()
        for name in ("eager", "composed"):
            tl = kernel_profile(layers[name], device, iters=9)["timeline"]
            row[name]["lead_us"] = tl.get("lead")
            row[name]["span_us"] = tl.get("span")
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="let optimize choose CUDA graph replay where it measures faster (as users get it); "
        "without it the module launches its kernels, so the layers below it can be compared",
    )
    ap.add_argument("problems", nargs="+")
    ns = ap.parse_args()
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in ns.problems:
        try:
            rows.append(probe(path, out, ns.graphs))
        except Exception as e:  # noqa: BLE001 - the others go on
            rows.append({"problem": path, "error": repr(e)})
    (out / "probe.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(f"== {r['problem']} ({r.get('mode')}; the guard chose {r.get('guard')})")
        if "error" in r:
            print(r["error"])
            continue
        print(r["cprofile"][:6000])
    head = ("problem", "layer", "busy us", "idle us", "per call", "lead us", "span us")
    print("{:24} {:18} {:>8} {:>8} {:>8} {:>8} {:>8}".format(*head))
    nan = float("nan")
    for r in rows:
        for name, v in r.items():
            if isinstance(v, dict):
                print(
                    f"{r['problem']:24} {name:18} {v['busy_us']:8.1f} {v['idle_us']:8.1f} "
                    f"{v['per_call_us']:8.1f} "
                    f"{v.get('lead_us') or nan:8.1f} {v.get('span_us') or nan:8.1f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
