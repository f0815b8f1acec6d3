"""Do sustained bf16 GEMMs lose clock speed on this GPU? Times a burst of 5 and then 60 calls of
four of Llama-3-8B's gate/up projections (8192x4096 @ 4096x14336, about 5 ms a call), each call
after an L2 flush and a short backlog as fact bench times modules, while nvidia-smi samples the
SM clock, the power draw and the temperature every 20 ms.

    python3 bench/clock_drop.py     # on the GPU machine; prints per-call times and the samples

Written to explain why `fact bench --profile` (5 calls) sees shorter spans than the timed rounds
(20 calls each): see bench/README.md, fifth session.
"""

import subprocess
import time

import torch

a = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def block():  # 4 big GEMMs, about 5 ms: one Llama block's worth of GEMM work
    for _ in range(4):
        torch.nn.functional.linear(a, w)


query = "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu"
smi = subprocess.Popen(
    ["nvidia-smi", query, "--format=csv,noheader", "-lms", "20"], stdout=subprocess.PIPE, text=True
)
time.sleep(1.0)
for label, reps in (("burst", 5), ("sustained", 60)):
    time.sleep(1.0)
    ts = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda._sleep(40000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        block()
        e.record()
        ts.append((s, e))
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in ts]
    print(
        label,
        "first/median/last ms:",
        round(ms[0], 3),
        round(sorted(ms)[len(ms) // 2], 3),
        round(ms[-1], 3),
        "all:",
        [round(x, 2) for x in ms[::5]],
    )
time.sleep(0.3)
smi.terminate()
out = smi.communicate()[0].strip().splitlines()
print("nvidia-smi samples (every 20 ms):", len(out))
for line in out[::4]:
    print(line)
