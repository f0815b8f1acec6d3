"""Where the ViT-B/16 block's time goes: eager (nn.MultiheadAttention's fused inference path)
against its exported graph, kernel by kernel, and SDPA's backends on the two memory orders of
Q, K and V (the fast path's (batch, heads, seq, dim) and the exported graph's (seq, batch,
heads, dim)).

    python3 bench/vit_kernels.py [bench/zoo/vit_block.py] [--fact]

Prints each module's kernels in one call (torch.profiler) and a table of SDPA times last.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from fact import layouts  # noqa: E402
from fact.problem import load_problem  # noqa: E402
from fact.tune.harness import time_fn  # noqa: E402


def kernels(label: str, fn) -> None:
    with torch.no_grad():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    rows = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows[e.name[:110]] += e.device_time_total
    print(f"{label}: {sum(rows.values()):.1f} us of kernels")
    for name, us in rows.items():
        print(f"  {us:8.1f} us  {name}")


def us(fn) -> float:
    with torch.no_grad():
        return statistics.median(
            time_fn(fn, reps=50, warmup=5, flush=True, device=torch.device("cuda"))
        )


def main() -> int:
    path = next((a for a in sys.argv[1:] if not a.startswith("-")), None) or str(
        REPO / "bench/zoo/vit_block.py"
    )
    problem = load_problem(path, "bf16")
    model = problem.model.to("cuda").eval()
    x = problem.inputs[0].to("cuda")
    with torch.no_grad():
        program = torch.export.export(model, (x,))
        exported = program.module()
        lines = layouts.rewrite(program, x.dtype, "high", "sm90")
        in_place = program.module()
    print("\n".join(lines) or "fact.layouts: nothing rewritten")
    kernels("eager (fast path)", lambda: model(x))
    kernels("exported graph", lambda: exported(x))
    kernels("exported graph after fact.layouts' rewrites", lambda: in_place(x))
    if "--fact" in sys.argv:  # FACT's composed module too (compiles its kernels: minutes)
        import fact

        opt = fact.optimize(model, [x], quiet=True)
        opt.use_original = False
        kernels("FACT composed (use_original = False)", lambda: opt(x))

    b, s, e = x.shape
    h = model.attn.num_heads
    d = e // h
    qkv = torch.randn(3, s, b, e, device="cuda", dtype=x.dtype)  # the graph's clone
    graph_order = [t.view(s, b * h, d).transpose(0, 1).view(b, h, s, d) for t in qkv]
    fast_order = [t.permute(1, 0, 2).reshape(b, s, h, d).transpose(1, 2).contiguous() for t in qkv]
    table = []
    for backend in (
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    ):
        for order, qkv3 in (("(s,b,h,d)", graph_order), ("(b,h,s,d)", fast_order)):
            try:
                with sdpa_kernel([backend]):
                    t = us(lambda qkv3=qkv3: F.scaled_dot_product_attention(*qkv3))
                table.append((backend.name, order, f"{t:.1f}"))
            except RuntimeError as err:
                table.append((backend.name, order, f"refused: {str(err)[:60]}"))
    for order, qkv3 in (("(s,b,h,d)", graph_order), ("(b,h,s,d)", fast_order)):
        table.append(
            ("default", order, f"{us(lambda qkv3=qkv3: F.scaled_dot_product_attention(*qkv3)):.1f}")
        )
    table.append(("eager block", "", f"{us(lambda: model(x)):.1f}"))
    table.append(("exported block", "", f"{us(lambda: exported(x)):.1f}"))
    table.append(("exported, rewritten", "", f"{us(lambda: in_place(x)):.1f}"))
    print(f"{'SDPA backend':22} {'Q/K/V order':12} us")
    for row in table:
        print(f"{row[0]:22} {row[1]:12} {row[2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
