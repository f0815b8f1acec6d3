"""fact.tune on the GPU machine (pytest -m gpu; scripts/gpu_tests.sh). Skipped without CUDA.

Always: the reference and the PyTorch candidate on the device, inputs in device memory, timing
with CUDA events, and fault isolation (a kernel library that crashes the host process; with nvcc,
one whose kernel hits an illegal address, which kills the CUDA context).

With FACT_TEST_KERNELS=manifest.json (compiled kernels, see scripts/gpu_tests.sh): every kernel
is tuned (verify + time, fault-isolated) against its pattern and must pass, then verified and
timed once more in this process through the in-process API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from fact.tune.abi import KernelLibrary
from fact.tune.harness import (
    DEFAULT_KNOBS,
    FLUSH_BYTES,
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
from test_tune_cpu import FAKE_KERNEL_C, MINIGPT_GELU, MODES, compile_c, kernel_info

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
    from fact.tune import harness

    assert harness._FLUSH["cuda"].numel() == FLUSH_BYTES >= 256 << 20


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
        f"-I{REPO / 'engine/realize/abi'}",
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
    assert lib.info.get("family") == gemm_spec(pattern).family
    result = verify(lib, pattern, problem, precision)
    assert result["ok"], result["message"]
    assert time_kernel(lib, pattern, problem, row["knobs"]) > 0
