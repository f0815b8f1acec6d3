import json, sys, torch
sys.path.insert(0, "python")
from fact.tune.attention import AttentionSpec, make_inputs, reference, run_kernel
from fact.tune.harness import rel_err
run = sys.argv[1]
plan = json.load(open(f"{run}/plan.json"))
man = json.load(open(f"{run}/manifest.json"))
pattern = plan["patterns"][man[0]["pattern_index"]]
spec = AttentionSpec.from_pattern(pattern)
x = make_inputs(spec, "cuda")
lib = f"{run}/{man[0]['library']}"
ws = torch.empty(1 << 26, dtype=torch.uint8, device="cuda")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    run_kernel(lib, x.q, x.k, x.v, x.o, spec, ws)  # warm-up outside capture
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
x.o.fill_(float("nan"))
with torch.cuda.graph(g):
    run_kernel(lib, x.q, x.k, x.v, x.o, spec, ws)
x.o.fill_(float("nan"))
g.replay(); torch.cuda.synchronize()
err, why = rel_err(x.o, reference(spec, x.q, x.k, x.v))
print(f"graph replay {man[0]['kernel']}: rel_err {err:.3g} {why}", "OK" if err < 2e-2 else "FAIL")
