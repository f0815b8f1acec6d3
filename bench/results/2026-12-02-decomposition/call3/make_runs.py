"""Run folders for bench/gemm_bench.py from call 1's realized kernels and the edited copies
build_variants.sh made (.device/epi/*.so): each holds the plan, the unedited kernels to compare
against, and the variants under their parent's name plus `_epi128xN`. Run from the repo root
after build_variants.sh."""

import json
import shutil
from pathlib import Path

BASE = Path(".device/epi")


def make(run, src, keep, variants):
    d = BASE / run
    (d / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(src) / "plan.json", d / "plan.json")
    manifest = json.loads((Path(src) / "manifest.json").read_text())
    out = []
    for e in manifest:
        if e["config"]["name"] in keep:
            lib = Path(src) / e["library"]
            shutil.copy(lib, d / "lib" / lib.name)
            out.append({**e, "library": "lib/" + lib.name})
    for so, parent, epi in variants:
        e = next(x for x in manifest if x["config"]["name"] == parent)
        shutil.copy(BASE / f"{so}.so", d / "lib" / f"{so}.so")
        out.append(
            {
                **e,
                "kernel": e["kernel"] + f"_epi128x{epi}",
                "library": f"lib/{so}.so",
                "cache_key": None,
            }
        )
    (d / "manifest.json").write_text(json.dumps(out, indent=1))


C256 = "t128x256x64_c2x1_coop_tmacoop_sauto_persistent"
C256T = "t128x256x32_c2x1_coop_tmacoop_sauto_persistent_tf32"
make(
    "square_bf16",
    ".device/sk/gemm_square_bf16",
    [C256, "t256x128x64_c1x2_coop_tmacoop_sauto_persistent"],
    [
        ("bf16_t128x256_epi64", C256, 64),
        ("bf16_t128x256_epi128", C256, 128),
        ("bf16_t256x128_epi64", "t256x128x64_c1x2_coop_tmacoop_sauto_persistent", 64),
    ],
)
make(
    "square_tn_tf32",
    ".device/sk/gemm_square_tn_tf32",
    [C256T],
    [("tf32_t128x256_epi64", C256T, 64)],
)
make(
    "batched_bf16",
    ".device/sk/gemm_batched_bf16",
    [C256, "t128x128x64_c2x1_pp_tma_sauto_persistent"],
    [("bf16_t128x256_epi64", C256, 64), ("bf16_t128x256_epi128", C256, 128)],
)
make(
    "batched_tn_tf32",
    ".device/sk/gemm_batched_tn_tf32",
    [C256T, "t128x128x32_c2x1_pp_tma_sauto_persistent_tf32"],
    [("tf32_t128x256_epi64", C256T, 64)],
)
