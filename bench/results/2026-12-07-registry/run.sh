#!/usr/bin/env bash
# A team registry of a million rows (issue 32): import, then a discover that looks a pattern up
# among 100k rows of its signature. CPU only (the 2-core machine).
set -euo pipefail
python3 - <<'PY'
import json
sig = "gemm[bias+relu]:f32,f32->f32:row,col"
with open("/tmp/reg1m.json", "w") as f:
    f.write('{"fact_registry_export": 1, "schema_version": 2, "rows": [')
    for i in range(1000000):
        f.write(("," if i else "") + json.dumps({
            "signature": sig if i % 10 == 0 else f"gemm[x{i % 97}]:bf16,bf16->bf16:row,col",
            "arch": "sm90", "problem": {"batch": 1, "m": 64 + i, "n": 4096, "k": 4096},
            "config": {"name": "t128x128x64_c1x1_pp_tma_sauto_persistent"}, "time_us": 100.0 + i * 1e-3,
            "error": 1e-3, "disposition": "passed", "provenance": "tuned", "created": "2026-01-01 00:00:00"}))
    f.write("]}")
PY
rm -f /tmp/r1m.db*
/usr/bin/time -f "import: %e s, %M KB" build/fact-engine registry --registry /tmp/r1m.db import /tmp/reg1m.json
cat > /tmp/lk.py <<'PY'
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self): super().__init__(); self.fc = nn.Linear(4096, 4096)
    def forward(self, x): return torch.relu(self.fc(x))
def get_inputs(): return [torch.randn(64, 4096)]
def get_init_inputs(): return []
PY
.venv/bin/fact trace /tmp/lk.py -o /tmp/lk.json > /dev/null
/usr/bin/time -f "discover with the registry: %e s" build/fact-engine discover /tmp/lk.json --registry /tmp/r1m.db | tail -2
