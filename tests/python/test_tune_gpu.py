"""fact.tune on the GPU machine (pytest -m gpu; scripts/gpu_tests.sh). Skipped without CUDA.

Always: the reference and the PyTorch candidate on the device, inputs in device memory, timing
with CUDA events, and fault isolation (a kernel library that crashes the host process; with nvcc,
one whose kernel hits an illegal address, which kills the CUDA context).

With FACT_TEST_KERNELS=manifest.json (compiled kernels, see scripts/gpu_tests.sh): every kernel
is tuned (verify + time, fault-isolated) against its pattern and must pass, then verified and
timed once more in this process through the in-process API.

Fused attention: the float32 reference and SDPA on the device at the models' sizes, and, where
nvcc, CUTLASS and fact-engine are there, attention problems realized with the engine (`fact
realize`) whose every kernel must pass verification: causal MiniGPT-like (fused QKV, head dim
96), grouped-query (8 heads, 2 kv, head dim 128), multi-query, a ragged sequence of 500, and
non-causal with a softmax scale of its own; in bf16 (Hopper's FMHA) and in fp32 (the sm80
kernel, TF32 under "high", 3xTF32 under "highest").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fact.tune.abi import KernelLibrary
from fact.tune.harness import (
    DEFAULT_KNOBS,
    TOL_16BIT_OUTPUT,
    load_manifest,
    rel_err,
    time_kernel,
    time_pytorch,
    tolerance,
    tune,
    verify,
)
from fact.tune.inputs import gemm_args, make_inputs
from fact.tune.reference import as_output, gemm_spec, pytorch_candidate, reference
from helpers import REPO
from test_tune_cpu import (
    FAKE_KERNEL_C,
    LLAMA_ATTENTION,
    MINIGPT_ATTENTION,
    MINIGPT_GELU,
    MODES,
    compile_c,
    kernel_info,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

RAGGED = {"m": 1000, "n": 776, "k": 200}
MEDIUM = {"m": 2048, "n": 3072, "k": 768}


def test_reference_and_pytorch_candidate_on_gpu():
    inputs = make_inputs(MINIGPT_GELU, RAGGED, "cuda")
    assert inputs.A.is_cuda and torch.isnan(inputs.D).all()
    ref = reference(MINIGPT_GELU, inputs.A, inputs.B, inputs.operands)
    assert ref.dtype == torch.float64 and ref.is_cuda
    out = as_output(pytorch_candidate(MINIGPT_GELU, inputs.A, inputs.B, inputs.operands))
    assert out.dtype == torch.bfloat16
    err, why = rel_err(out, ref)
    assert 0 < err < TOL_16BIT_OUTPUT, why
    # the same inputs on the CPU give the same reference (the float64 path is exact enough)
    cpu = reference(
        MINIGPT_GELU, inputs.A.cpu(), inputs.B.cpu(), [t.cpu() for t in inputs.operands]
    )
    torch.testing.assert_close(ref.cpu(), cpu, rtol=1e-10, atol=1e-12)


def test_inputs_args_point_at_device_memory():
    inputs = make_inputs(MINIGPT_GELU, MEDIUM, "cuda")
    args = gemm_args(inputs, {"raster": "along_m", "max_swizzle": 4})
    assert args.a == inputs.A.data_ptr() and args.d == inputs.D.data_ptr()
    assert args.lda == MEDIUM["k"] and args.ldb == MEDIUM["k"] and args.ldd == MEDIUM["n"]
    assert (args.raster, args.max_swizzle) == (1, 4)


def test_time_pytorch_with_events_and_flush():
    t = time_pytorch(MINIGPT_GELU, MEDIUM)
    flops = 2 * MEDIUM["m"] * MEDIUM["n"] * MEDIUM["k"]
    assert 1 < t < 1e5, t
    assert flops / (t * 1e-6) < 2e15  # not faster than the GPU could possibly be
    from fact import timing

    assert timing._FLUSH["cuda"].numel() == timing.FLUSH_BYTES >= 256 << 20


def _fake_segv(tmp_path: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    info = json.dumps(json.dumps(kernel_info(MINIGPT_GELU, "segv_on_gpu")))
    return compile_c(
        FAKE_KERNEL_C,
        tmp_path / "segv.so",
        '-DFAKE_NAME="segv_on_gpu"',
        f"-DFAKE_MODE={MODES['segv']}",
        "-DFAKE_EPI=2",
        "-DFAKE_BF16",
        f"-DFAKE_INFO={info}",
        shared=True,
    )


def test_tune_survives_a_host_crash_with_a_cuda_context(tmp_path):
    rows = tune(MINIGPT_GELU, [_fake_segv(tmp_path)], knobs_list=[DEFAULT_KNOBS], problem=RAGGED)
    assert [(r["kernel"], r["disposition"]) for r in rows] == [
        ("pytorch", "passed"),
        ("segv_on_gpu", "fault"),
    ]
    assert rows[0]["time_us"] > 0 and rows[0]["error"] < TOL_16BIT_OUTPUT


ILLEGAL_ADDRESS_CU = r"""
#include <cuda_runtime.h>
#include "fact_gemm_abi.h"
__global__ void poke(int* p) { *p = 1; }  // a write to an unmapped address: illegal address
static char g_error[64] = "";
extern "C" {
int fact_abi_version(void) { return FACT_ABI_VERSION; }
const char* fact_kernel_name(void) { return "illegal_address"; }
const char* fact_kernel_info(void) { return KERNEL_INFO; }
const char* fact_last_error(void) { return g_error; }
int fact_gemm_can_implement(const FactGemmArgs*) { return FACT_OK; }
size_t fact_gemm_workspace_size(const FactGemmArgs*) { return 0; }
int fact_gemm_run(const FactGemmArgs*, void*, size_t, void* stream) {
  poke<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(reinterpret_cast<int*>(0x10));
  return FACT_OK;
}
}
"""


def _nvcc() -> str | None:
    for candidate in (
        os.environ.get("FACT_TEST_NVCC"),
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def test_tune_survives_an_illegal_address(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs nvcc (set FACT_TEST_NVCC)")
    src = tmp_path / "illegal.cu"
    # the info as a C string literal in the source (nvcc re-splits -D values and loses quotes)
    info = json.dumps(json.dumps(kernel_info(MINIGPT_GELU, "illegal_address")))
    src.write_text(f"#define KERNEL_INFO {info}\n" + ILLEGAL_ADDRESS_CU)
    lib = tmp_path / "illegal.so"
    major, minor = torch.cuda.get_device_capability()
    cmd = [
        nvcc,
        "-shared",
        "-Xcompiler",
        "-fPIC",
        f"-arch=sm_{major}{minor}",
        f"-I{REPO / 'engine/families/gemm'}",
        str(src),
        "-o",
        str(lib),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    segv = _fake_segv(tmp_path)
    details: dict = {}
    rows = tune(
        MINIGPT_GELU, [lib, segv, lib], knobs_list=[DEFAULT_KNOBS], problem=RAGGED, details=details
    )
    assert [r["disposition"] for r in rows] == ["passed", "fault", "fault", "fault"]
    assert "illegal" in rows[1]["message"].lower(), rows[1]["message"]
    assert details["workers"] == 3  # a fresh worker (and CUDA context) after every fault
    assert details["environment"]["gpu"]


# ---------------------------------------------------------------------------------------------
# Compiled kernels from a manifest


def _manifest_cases() -> list:
    path = os.environ.get("FACT_TEST_KERNELS")
    if not path:
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="FACT_TEST_KERNELS unset"))]
    entries, plan_path = load_manifest(path)
    plan_path = plan_path or os.environ.get("FACT_TEST_PLAN")
    plan = json.loads(Path(plan_path).read_text()) if plan_path else {"patterns": []}
    cases = []
    for entry in entries:
        if not entry.get("library"):  # realize's not_supported / compile_error entries
            continue
        pattern = entry.get("pattern")
        if pattern is None:
            if not plan_path:
                raise RuntimeError("FACT_TEST_KERNELS lists pattern_index: set FACT_TEST_PLAN")
            pattern = plan["patterns"][entry["pattern_index"]]
        label = f"{entry.get('pattern_index')}-{entry.get('kernel') or Path(entry['library']).name}"
        cases.append(pytest.param(entry, pattern, id=label))
    if not cases:
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f"no kernels in {path}"))]
    return cases


def _problem_override() -> dict | None:
    text = os.environ.get("FACT_TEST_PROBLEM")
    return json.loads(text) if text else None


@pytest.mark.parametrize(("entry", "pattern"), _manifest_cases())
def test_manifest_kernel(entry, pattern):
    problem = _problem_override()
    precision = os.environ.get("FACT_TEST_PRECISION", "highest")
    rows = tune(pattern, [entry], precision, problem=problem)  # fault-isolated, all knobs
    base, row = rows
    assert row["disposition"] == "passed", row["message"]
    assert row["error"] <= tolerance(pattern, precision)
    print(
        f"\n{row['kernel']}: {row['time_us']:.1f} us (knobs {row['knobs']}), pytorch "
        f"{base['time_us']:.1f} us, rel_err {row['error']:.2e}"
    )
    # it passed in isolation: the in-process API must agree
    lib = KernelLibrary(entry["library"])
    result = verify(lib, pattern, problem, precision)
    assert result["ok"], result["message"]
    if pattern.get("family") == "attention":
        assert lib.family == "attention" and lib.info.get("family") == "attention"
        return
    assert lib.info.get("family") == gemm_spec(pattern).family
    assert time_kernel(lib, pattern, problem, row["knobs"]) > 0
    if (lib.info.get("config") or {}).get("tile_scheduler") == "stream_k":
        _check_reductions(lib, pattern, problem, precision)


def _check_reductions(lib, pattern, problem, precision):
    """A stream-K kernel's deterministic reduction gives the same bits on every run, under each
    decomposition (CUTLASS's heuristic, stream-K forced, data-parallel); the nondeterministic
    one (atomic adds) is as accurate; a forced decomposition with split-K is refused."""
    from fact.tune.abi import Status
    from fact.tune.harness import _launch, resolve_pattern_problem

    spec = gemm_spec(pattern)
    inputs = make_inputs(spec, resolve_pattern_problem(pattern, problem), "cuda")
    ref = reference(spec, inputs.A, inputs.B, inputs.operands)
    outs = {}
    variants = [
        ("deterministic", "heuristic"),
        ("nondeterministic", "heuristic"),
        ("deterministic", "stream_k"),
        ("nondeterministic", "stream_k"),
        ("deterministic", "data_parallel"),
    ]
    for reduction, decomposition in variants:
        for run in range(3):
            inputs.D.fill_(float("nan"))
            knobs = {"splits": 1, "reduction": reduction, "decomposition": decomposition}
            status, message = _launch(lib, inputs, gemm_args(inputs, knobs), inputs.A.device)
            assert status == 0, f"{reduction}, {decomposition}: {message}"
            err, why = rel_err(inputs.D, ref)
            assert err <= tolerance(pattern, precision), f"{reduction}, {decomposition}: {why}"
            outs[reduction, decomposition, run] = inputs.D.clone()
    for decomposition in ("heuristic", "stream_k", "data_parallel"):
        first = outs["deterministic", decomposition, 0]
        assert all(torch.equal(first, outs["deterministic", decomposition, r]) for r in (1, 2))
    args = gemm_args(inputs, {"splits": 2, "decomposition": "stream_k"})
    assert lib.can_implement(args) == Status.INVALID_ARGS
    assert "heuristic decomposition" in lib.last_error()


# ---------------------------------------------------------------------------------------------
# Fused attention


def test_attention_reference_on_gpu_at_model_sizes():
    """The float32 reference at Llama's (B=4, H=32, S=2048, GQA) and MiniGPT's (B=128, H=8,
    S=512, fused QKV) sizes fits in memory, ignores the worker's TF32 setting, agrees with the
    float64 CPU reference, and PyTorch's SDPA sits inside the tolerance."""
    from fact.tune.attention import AttentionSpec, make_inputs, pytorch_attention, reference

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")  # what a worker tuning at "medium" sets
    try:
        for pattern in (LLAMA_ATTENTION, MINIGPT_ATTENTION):
            spec = AttentionSpec.from_pattern(pattern)
            inputs = make_inputs(spec, "cuda")
            torch.cuda.reset_peak_memory_stats()
            ref = reference(spec, inputs.q, inputs.k, inputs.v)
            assert ref.dtype == torch.float32 and ref.is_cuda
            assert torch.cuda.max_memory_allocated() < 24 << 30
            err, why = rel_err(pytorch_attention(spec, inputs.q, inputs.k, inputs.v), ref)
            assert err < tolerance(spec) / 2, why
            # one batch entry against the float64 reference on the CPU
            one = spec.with_problem({"batch": 1})
            cpu = reference(one, *(t[:1].cpu() for t in (inputs.q, inputs.k, inputs.v)))
            torch.testing.assert_close(ref[:1].cpu().double(), cpu, rtol=0, atol=1e-5)
            del inputs, ref
    finally:
        torch.set_float32_matmul_precision(previous)


def test_attention_pytorch_row_on_gpu():
    from fact.tune.attention import evaluate_attention_pytorch

    row = evaluate_attention_pytorch(LLAMA_ATTENTION, problem={"batch": 1, "seq_q": 1024,
                                                               "seq_k": 1024})  # fmt: skip
    assert row["disposition"] == "passed", row["message"]
    assert 0 < row["error"] < tolerance(LLAMA_ATTENTION) and row["time_us"] > 1
    flops = 4 * 32 * 1024 * 1024 * 128 / 2  # causal: half the scores
    assert flops / (row["time_us"] * 1e-6) < 2e15


ATTENTION_PROBLEMS = {
    # MiniGPT's hand-written causal attention, Q, K and V read in place from a fused QKV input
    "causal_fused": """
        import math

        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        B, T, H, D = 2, 256, 4, 96


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

            def forward(self, qkv):
                b, t, c3 = qkv.shape
                c = c3 // 3
                q, k, v = qkv.split(c, dim=2)
                q = q.view(b, t, H, D).transpose(1, 2)
                k = k.view(b, t, H, D).transpose(1, 2)
                v = v.view(b, t, H, D).transpose(1, 2)
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
                att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
                return y.transpose(1, 2).contiguous().view(b, t, c)


        def get_inputs():
            return [torch.randn(B, T, 3 * H * D)]
        """,
    # Llama's grouped-query SDPA: 8 query heads share 2 key/value heads
    "gqa": """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        B, S, H, HK, D = 2, 256, 8, 2, 128


        class Model(nn.Module):
            def forward(self, q, k, v):
                b, s, _ = q.shape
                q = q.view(b, s, H, D).transpose(1, 2)
                k = k.view(b, s, HK, D).transpose(1, 2)
                v = v.view(b, s, HK, D).transpose(1, 2)
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return y.transpose(1, 2).contiguous().view(b, s, H * D)


        def get_inputs():
            return [torch.randn(B, S, H * D), torch.randn(B, S, HK * D),
                    torch.randn(B, S, HK * D)]
        """,
    # multi-query attention: 4 query heads share one key/value head
    "mqa": """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        B, S, H, D = 2, 320, 4, 64


        class Model(nn.Module):
            def forward(self, q, k, v):
                b, s, _ = q.shape
                q = q.view(b, s, H, D).transpose(1, 2)
                k = k.view(b, s, 1, D).transpose(1, 2)
                v = v.view(b, s, 1, D).transpose(1, 2)
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return y.transpose(1, 2).contiguous().view(b, s, H * D)


        def get_inputs():
            return [torch.randn(B, S, H * D), torch.randn(B, S, D), torch.randn(B, S, D)]
        """,
    # non-causal, a softmax scale that is not 1/sqrt(head_dim)
    "scaled": """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        B, S, H, D = 2, 384, 4, 64


        class Model(nn.Module):
            def forward(self, q, k, v):
                b, s, _ = q.shape
                q, k, v = (t.view(b, s, H, D).transpose(1, 2) for t in (q, k, v))
                y = F.scaled_dot_product_attention(q, k, v, scale=0.3)
                return y.transpose(1, 2).contiguous().view(b, s, H * D)


        def get_inputs():
            return [torch.randn(B, S, H * D) for _ in range(3)]
        """,
}

#: realized run -> (problem, --dtype, float32 matmul precision). bf16 runs Hopper's FMHA; fp32
#: under "high" Hopper's FMHA and the sm80 kernel in TF32 (one candidate each; the sm80 kernel
#: runs grouped-query attention one launch per K/V head), under "highest" the sm80 kernel in
#: 3xTF32.
ATTENTION_RUNS = {
    "causal_fused": ("causal_fused", "bf16", "highest"),
    "gqa": ("gqa", "bf16", "highest"),
    "mqa": ("mqa", "bf16", "highest"),
    "scaled": ("scaled", "bf16", "highest"),
    "causal_fused-fp32-high": ("causal_fused", "fp32", "high"),
    "mqa-fp32-high": ("mqa", "fp32", "high"),
    "gqa-fp32-high": ("gqa", "fp32", "high"),
    "scaled-fp32-high": ("scaled", "fp32", "high"),
    "causal_fused-fp32-highest": ("causal_fused", "fp32", "highest"),
    "gqa-fp32-highest": ("gqa", "fp32", "highest"),
}

#: (test id, realized run, sizes on top of its plan's problem, what the plan must say)
ATTENTION_CASES = [
    ("causal-minigpt-d96", "causal_fused", None, {"causal": True, "head_dim": 96, "heads": 4}),
    ("gqa-h8-kv2-d128", "gqa", None, {"causal": True, "heads": 8, "kv_heads": 2}),
    ("mqa-h4-kv1-d64", "mqa", None, {"causal": True, "heads": 4, "kv_heads": 1}),
    ("ragged-seq500", "causal_fused", {"seq_q": 500, "seq_k": 500}, {"causal": True}),
    ("gqa-ragged-seq500", "gqa", {"seq_q": 500, "seq_k": 500}, {"kv_heads": 2}),
    ("noncausal-scale0.3", "scaled", None, {"causal": False, "scale": 0.3}),
    ("noncausal-cross-q200-k333", "scaled", {"seq_q": 200, "seq_k": 333}, {"causal": False}),
    ("fp32-tf32-causal-d96", "causal_fused-fp32-high", None, {"dtype": "f32", "head_dim": 96}),
    ("fp32-tf32-ragged-seq500", "causal_fused-fp32-high", {"seq_q": 500, "seq_k": 500}, {}),
    # head dim 80 on the kernel built for 96 (kMaxK is an upper bound)
    ("fp32-tf32-d80", "causal_fused-fp32-high", {"head_dim": 80, "head_dim_v": 80}, {}),
    ("fp32-tf32-mqa", "mqa-fp32-high", None, {"dtype": "f32", "kv_heads": 1}),
    ("fp32-tf32-gqa-h8-kv2-d128", "gqa-fp32-high", None, {"dtype": "f32", "kv_heads": 2}),
    ("fp32-tf32-gqa-ragged-seq500", "gqa-fp32-high", {"seq_q": 500, "seq_k": 500}, {}),
    # the sm80 kernel's own path for a block left with one query over a shared K/V head (it
    # takes the heads as rows and drops the mask): 321 = 10 x 32 + 1 = 5 x 64 + 1 tokens, and
    # causal with fewer queries than keys (query 32 alone in its block must stop at its diagonal)
    ("fp32-tf32-mqa-one-query-tail", "mqa-fp32-high", {"seq_q": 321, "seq_k": 321}, {}),
    ("fp32-tf32-mqa-causal-q33-k64", "mqa-fp32-high", {"seq_q": 33, "seq_k": 64}, {}),
    ("mqa-causal-q33-k64", "mqa", {"seq_q": 33, "seq_k": 64}, {}),
    (
        "fp32-tf32-noncausal-cross-q200-k333",
        "scaled-fp32-high",
        {"seq_q": 200, "seq_k": 333},
        {"causal": False, "scale": 0.3},
    ),  # fmt: skip
    ("fp32-3xtf32-causal-d96", "causal_fused-fp32-highest", None, {"dtype": "f32"}),
    ("fp32-3xtf32-gqa-h8-kv2-d128", "gqa-fp32-highest", None, {"dtype": "f32", "kv_heads": 2}),
    ("fp32-3xtf32-gqa-ragged-seq500", "gqa-fp32-highest", {"seq_q": 500, "seq_k": 500}, {}),
]


def _realize_prerequisites() -> str | None:
    """Why attention problems cannot be realized here (None when they can)."""
    from fact.cli import find_cutlass
    from fact.engine import find_engine
    from fact.errors import FactError

    if _nvcc() is None:
        return "needs nvcc"
    try:
        find_engine()
        cutlass = Path(find_cutlass(None))
    except FactError as exc:
        return f"needs fact-engine and CUTLASS: {exc}"
    for example in ("88_hopper_fmha", "41_fused_multi_head_attention"):
        if not (cutlass / "examples" / example).is_dir():
            return f"CUTLASS at {cutlass} has no examples/{example}"
    return None


def _attention_run(name: str, folder: Path, log: str = "") -> tuple[dict, list, str]:
    plan = json.loads((folder / "plan.json").read_text())
    patterns = [i for i, p in enumerate(plan["patterns"]) if p["family"] == "attention"]
    assert len(patterns) == 1, f"{name}: the plan has no single attention pattern"
    entries, _ = load_manifest(folder)
    mine = [e for e in entries if e["pattern_index"] == patterns[0]]
    return plan["patterns"][patterns[0]], mine, log


@pytest.fixture(scope="module")
def realized_attention(tmp_path_factory):
    """{run name: (plan pattern, manifest entries, realize's log)}: each of ATTENTION_RUNS
    realized with the engine (2 candidates each, compiled in parallel into one kernel cache).

    FACT_TEST_ATTENTION_RUNS=DIR takes them from DIR/<run> instead (run directories of
    `fact realize DIR/<problem>.py --dtype D --precision P --out DIR/<run>` made elsewhere, e.g.
    on a CPU machine with nvcc: `python tests/python/test_tune_gpu.py DIR` writes the problems
    and prints those commands)."""
    given = os.environ.get("FACT_TEST_ATTENTION_RUNS")
    if given:
        return {name: _attention_run(name, Path(given) / name) for name in ATTENTION_RUNS}
    why = _realize_prerequisites()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("attention_runs")
    env = {**os.environ, "FACT_CACHE_DIR": str(root / "cache")}
    for name, source in ATTENTION_PROBLEMS.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))
    procs = {}
    for name in ATTENTION_RUNS:
        cmd = [sys.executable, "-m", "fact", *_realize_args(root, name), "--json"]
        procs[name] = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    realized = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"fact realize {name}: {err}"
        realized[name] = _attention_run(name, root / name, err)
    return realized


def _realize_args(root: Path, run: str) -> list[str]:
    problem, dtype, precision = ATTENTION_RUNS[run]
    return ["realize", str(root / f"{problem}.py"), "--dtype", dtype, "--precision", precision,
            "--candidates", "2", "--out", str(root / run)]  # fmt: skip


@pytest.mark.parametrize(
    ("run", "sizes", "expect"),
    [pytest.param(*case[1:], id=case[0]) for case in ATTENTION_CASES],
)
def test_realized_attention_kernels_pass(realized_attention, run, sizes, expect):
    pattern, entries, log = realized_attention[run]
    _, dtype, precision = ATTENTION_RUNS[run]
    for key, value in expect.items():
        attr = key in ("causal", "scale", "dtype")
        got = pattern["attrs"][key] if attr else pattern["problem"][key]
        assert got == (value if key == "dtype" else pytest.approx(value)), (key, got)
    built = [e for e in entries if e.get("library")]
    assert built, f"the engine built no attention kernel: {entries} {log[-2000:]}"
    assert all(e.get("family", "attention") == "attention" for e in built)
    if dtype == "fp32" and precision == "highest":  # the sm80 kernel, fp32-accurate
        assert all(e["kernel"].endswith("_ms_3xtf32") for e in built), built
    elif dtype == "fp32":  # TF32: Hopper's FMHA and the sm80 kernel
        kinds = sorted("sm80" if e["kernel"].endswith("_ms_tf32") else "hopper" for e in built)
        assert kinds == ["hopper", "sm80"], built
        assert all(e["kernel"].endswith("_tf32") for e in built), built
    rows = tune(pattern, built, precision, problem=sizes)  # fault-isolated
    base, *kernels = rows
    assert base["kernel"] == "pytorch" and base["disposition"] == "passed", base["message"]
    tol = tolerance(pattern, precision)
    for row in kernels:
        assert row["disposition"] == "passed", f"{row['kernel']}: {row['message']}"
        assert 0 < row["error"] <= tol and row["time_us"] > 0 and row["knobs"] == {}
        if sizes:
            assert all(row["problem"][k] == v for k, v in sizes.items())
        print(
            f"\n{row['kernel']}: {row['time_us']:.1f} us (sdpa {base['time_us']:.1f} us), "
            f"rel_err {row['error']:.2e}, max {max(row['verify']['max_rel_err'].values()):.2e}"
        )
    # in process too: each kernel on fresh inputs, and through run_kernel directly
    from fact.tune.attention import AttentionSpec, make_inputs, reference, run_kernel

    spec = AttentionSpec.from_pattern(pattern, sizes)
    for entry in built:
        inputs = make_inputs(spec, "cuda")
        run_kernel(entry["library"], inputs.q, inputs.k, inputs.v, inputs.o, spec)
        torch.cuda.synchronize()
        err, why = rel_err(inputs.o, reference(spec, inputs.q, inputs.k, inputs.v))
        assert err <= tol, f"{entry['kernel']}: rel_err {err:.3g} {why}"


@pytest.mark.parametrize(
    ("run", "sizes"),
    [
        ("causal_fused-fp32-high", None),
        ("causal_fused-fp32-high", {"seq_q": 500, "seq_k": 500}),
        ("causal_fused", None),
    ],  # fmt: skip
)
def test_attention_v_with_its_keys_contiguous(realized_attention, run, sizes):
    """V laid out as a projection that writes V^T leaves it, (kv_heads*dim, batch*seq)
    row-major: Hopper's TF32 kernels read it in place (no transpose, no workspace for one) and
    match the reference; kernels that read V's head dim contiguous refuse it."""
    from fact.tune.attention import (
        AttentionSpec,
        KernelStatusError,
        args_for,
        as_keys_contiguous,
        make_inputs,
        reference,
        run_kernel,
    )

    pattern, entries, _ = realized_attention[run]
    spec = AttentionSpec.from_pattern(pattern, sizes)
    _, _, precision = ATTENTION_RUNS[run]
    tol = tolerance(pattern, precision)
    for entry in (e for e in entries if e.get("library")):
        lib = KernelLibrary(entry["library"])
        x = make_inputs(spec, "cuda")
        v = as_keys_contiguous(x.v)
        b, hk, sk, d = x.v.shape
        assert v.stride() == (sk, d * b * sk, 1, b * sk) and torch.equal(v, x.v)
        x.o.fill_(float("nan"))
        if not lib.info.get("v_keys_contiguous"):
            with pytest.raises(KernelStatusError, match="contiguous head dim"):
                run_kernel(lib, x.q, x.k, v, x.o, spec)
            continue
        natural = lib.attention_workspace_size(args_for(x.q, x.k, x.v, x.o, spec.scale))
        in_place = lib.attention_workspace_size(args_for(x.q, x.k, v, x.o, spec.scale))
        assert in_place < natural, (in_place, natural)  # no transposed copy of V
        run_kernel(lib, x.q, x.k, v, x.o, spec)
        torch.cuda.synchronize()
        err, why = rel_err(x.o, reference(spec, x.q, x.k, x.v))
        assert err <= tol, f"{entry['kernel']}: rel_err {err:.3g} {why}"
        print(f"\n{entry['kernel']} with V keys-contiguous: rel_err {err:.2e}")


if __name__ == "__main__":  # write the attention problems for FACT_TEST_ATTENTION_RUNS
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, source in ATTENTION_PROBLEMS.items():
        (out / f"{name}.py").write_text(textwrap.dedent(source))
    for run in ATTENTION_RUNS:
        print("fact " + " ".join(_realize_args(out, run)))
