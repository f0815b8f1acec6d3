"""Each of PyTorch's scaled_dot_product_attention backends at the attention shapes of
BENCHMARKS.md, on the GPU machine: which library kernel is the fastest FACT could offer.

FACT's library candidate for an attention pattern calls `F.scaled_dot_product_attention`
and lets PyTorch's dispatcher pick a backend (flash on the H200 for these shapes). This
script times the dispatcher's choice and each backend forced (flash, cuDNN, memory-efficient)
on the models' own layouts: Q, K, V as strided views of the fused QKV projection's output
(MiniGPT) or of separate projections with grouped-query K/V (Llama, `enable_gqa`). Each
result is checked against the math backend in float32 first (relative error). Times: CUDA
events, median of the repetitions, L2 flushed before each (`fact.tune.harness.time_fn`).

    python3 bench/sdpa_backends.py [--reps 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from fact.tune import harness  # noqa: E402

BACKENDS = {
    "dispatcher": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def minigpt(dtype):
    b, s, h, d = 128, 512, 8, 96
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=dtype)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [b, h, s, d] views
    return "MiniGPT b128 s512 h8 d96 causal", q, k, v, {}


def llama(dtype):
    b, s, h, hk, d = 4, 2048, 32, 8, 128
    q = torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype).transpose(1, 2)
    v = torch.randn(b, s, hk, d, device="cuda", dtype=dtype).transpose(1, 2)
    return "Llama b4 s2048 h32/8 d128 causal", q, k, v, {"enable_gqa": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for make in (minigpt, llama):
        name, q, k, v, kw = make(torch.bfloat16)
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=True, **kw
            )
        for backend, which in BACKENDS.items():
            row = {"shape": name, "backend": backend}

            def call(which=which, q=q, k=k, v=v, kw=kw):
                if which is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
                with sdpa_kernel(which):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)

            try:
                out = call()
                torch.cuda.synchronize()
            except RuntimeError as e:  # the backend refuses these inputs
                row["error"] = str(e).splitlines()[0][:160]
                rows.append(row)
                continue
            row["rel_err"] = ((out.float() - ref).norm() / ref.norm()).item()
            times = harness.time_fn(call, reps=args.reps, warmup=5, flush=True, device=device)
            row["time_us"] = statistics.median(times)
            rows.append(row)
    print(
        f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
        f"{torch.cuda.get_device_name()}; bf16, causal; median of {args.reps}, L2 flushed"
    )
    print("| shape | backend | time (us) | rel err vs math f32 |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['shape']} | {r['backend']} | refused: {r['error']} | |")
        else:
            print(f"| {r['shape']} | {r['backend']} | {r['time_us']:.1f} | {r['rel_err']:.2e} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sdpa_backends.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
