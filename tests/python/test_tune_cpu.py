"""fact.tune without a GPU: the ABI mirror against the C header, the reference semantics against
expr.cpp's function table, the inputs' layouts, and the whole harness (verify, time, the
fault-isolated tune driver, the CLI) driven through fake kernel libraries that gcc builds here
and that compute the GEMM on the host.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fact.errors import FactError
from fact.tune import abi, harness
from fact.tune.abi import FactAttentionArgs, FactGemmArgs, KernelLibrary, Status
from fact.tune.harness import (
    DEFAULT_KNOBS,
    TOL_16BIT_OUTPUT,
    TOL_F32_HIGHEST,
    TOL_F32_TF32,
    attach_advisories,
    check_kernel_info,
    epilogue_shape,
    format_table,
    knob_combinations,
    knob_name,
    load_manifest,
    registry_export,
    rel_err,
    scan_kernels,
    time_kernel,
    time_pytorch,
    tolerance,
    tune,
    verify,
)
from fact.tune.inputs import gemm_args, make_inputs, split_parts, verification_shapes
from fact.tune.reference import (
    FUNCTIONS,
    NotSupportedError,
    as_output,
    eval_epilogue,
    gemm_spec,
    parse_type,
    pytorch_candidate,
    reference,
)
from helpers import ABI_DIRS, REPO, abi_header

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="needs gcc")

# Pattern 0 of `fact discover examples/minigpt_block.py --dtype bf16 --json`, verbatim: the MLP's
# c_fc GEMM with its bias and NewGELU (the tanh GELU written out by hand, recognised by value).
MINIGPT_GELU = json.loads("""
{"family": "gemm", "rule": "gemm_epilogue",
 "problem": {"batch": 1, "k": 768, "m": 65536, "n": 3072},
 "attrs": {"accumulate": "f32", "dtype_a": "bf16", "dtype_b": "bf16", "dtype_out": "bf16",
           "layout_a": "row", "layout_b": "col"},
 "operands": [{"node": "layer_norm_1", "role": "a", "type": "bf16[128, 512, 768]"},
              {"node": "p_mlp_c_fc_weight", "role": "b", "type": "bf16[3072, 768]"},
              {"broadcast": "row", "node": "p_mlp_c_fc_bias", "role": "p_mlp_c_fc_bias",
               "type": "bf16[3072]"}],
 "epilogue": ["bias", "gelu_tanh"],
 "epilogue_expr": {"ssa": [{"id": 0, "op": "acc"}, {"id": 1, "index": 0, "op": "operand"},
                           {"args": [0, 1], "id": 2, "op": "add"},
                           {"args": [2], "id": 3, "op": "gelu_tanh"}],
                   "text": "gelu_tanh(acc + p_mlp_c_fc_bias)"},
 "nodes": ["linear_2", "mul_1", "pow_1", "mul_2", "add_1", "mul_3", "tanh", "add_2", "mul_4"],
 "signature": "gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col"}
""")

# The same GELU as MiniGPT's NewGELU spells it, op by op, before recognition:
# 0.5 * x * (1.0 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3.0)))), x = acc + bias.
HANDWRITTEN_GELU_SSA = [
    {"id": 0, "op": "acc"},
    {"id": 1, "op": "operand", "index": 0},
    {"id": 2, "op": "add", "args": [0, 1]},
    {"id": 3, "op": "constant", "value": 0.5},
    {"id": 4, "op": "mul", "args": [3, 2]},
    {"id": 5, "op": "constant", "value": 3.0},
    {"id": 6, "op": "pow", "args": [2, 5]},
    {"id": 7, "op": "constant", "value": 0.044715},
    {"id": 8, "op": "mul", "args": [7, 6]},
    {"id": 9, "op": "add", "args": [2, 8]},
    {"id": 10, "op": "constant", "value": math.sqrt(2.0 / math.pi)},
    {"id": 11, "op": "mul", "args": [10, 9]},
    {"id": 12, "op": "tanh", "args": [11]},
    {"id": 13, "op": "constant", "value": 1.0},
    {"id": 14, "op": "add", "args": [13, 12]},
    {"id": 15, "op": "mul", "args": [4, 14]},
]

SMALL = {"m": 64, "n": 128, "k": 96}
SMALL_SHAPES = [SMALL, {"m": 40, "n": 24, "k": 56}]


def gemm_pattern(
    dtype="f32",
    layout_a="row",
    layout_b="col",
    batch=1,
    m=64,
    n=128,
    k=96,
    operands=(),
    ssa=None,
    text="acc",
    out=None,
):
    """A hand-made plan pattern; operands: (broadcast, type) pairs in SSA index order."""
    ops = [
        {"role": "a", "node": "x", "type": f"{dtype}[{m}, {k}]"},
        {"role": "b", "node": "w", "type": f"{dtype}[{n}, {k}]"},
    ]
    for i, (kind, typ) in enumerate(operands):
        ops.append({"role": f"op{i}", "node": f"op{i}", "type": typ, "broadcast": kind})
    return {
        "family": "gemm",
        "problem": {"batch": batch, "m": m, "n": n, "k": k},
        "attrs": {
            "dtype_a": dtype,
            "dtype_b": dtype,
            "dtype_out": out or dtype,
            "layout_a": layout_a,
            "layout_b": layout_b,
        },
        "operands": ops,
        "epilogue_expr": {"ssa": ssa or [{"id": 0, "op": "acc"}], "text": text},
        "signature": f"gemm[test]:{dtype}",
    }


def bias_ssa():
    return [
        {"id": 0, "op": "acc"},
        {"id": 1, "op": "operand", "index": 0},
        {"id": 2, "op": "add", "args": [0, 1]},
    ]


# ---------------------------------------------------------------------------------------------
# gcc helpers: the header's layout, and fake kernel libraries.


def compile_c(source: str, out: Path, *flags: str, shared: bool = False) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    includes = [f"-I{d}" for d in ABI_DIRS]
    cmd = [GCC, "-O2", "-std=c11", *includes, str(src), "-o", str(out), *flags, "-lm"]
    if shared:
        cmd[1:1] = ["-shared", "-fPIC"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


# C both fake kernel families share: bf16 <-> float (for `typedef uint16_t elem_t`), and the
# error slot, the last call's arguments (`FAKE_ARGS`) and the ABI's identity functions.
FAKE_BF16_C = r"""
static float load(elem_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static elem_t store(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (elem_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (elem_t)(u >> 16);
}
"""
FAKE_STATE_C = r"""
static char g_error[256] = "";
static FAKE_ARGS g_last;
static void* g_workspace;
static size_t g_workspace_bytes;
static void* g_stream;
static int g_runs;

static int fail(int status, const char* what) {
  snprintf(g_error, sizeof g_error, "%s", what);
  return status;
}

int fact_abi_version(void) { return FAKE_VERSION; }
const char* fact_kernel_name(void) { return FAKE_NAME; }
const char* fact_kernel_info(void) { return FAKE_INFO; }
const char* fact_last_error(void) { return g_error; }

/* Test hook: the arguments of the last run call. */
void fake_last_call(FAKE_ARGS* args, void** workspace, size_t* bytes, void** stream, int* runs) {
  *args = g_last;
  *workspace = g_workspace;
  *bytes = g_workspace_bytes;
  *stream = g_stream;
  *runs = g_runs;
}
"""


def _fake_source(template: str, args_type: str) -> str:
    """A fake kernel's C source with the shared pieces filled in."""
    state = FAKE_STATE_C.replace("FAKE_ARGS", args_type)
    return template.replace("@FAKE_BF16@", FAKE_BF16_C.strip("\n")).replace(
        "@FAKE_STATE@", state.strip("\n")
    )


FAKE_KERNEL_C = r"""
/* A fake FACT kernel library: the C ABI of fact_gemm_abi.h with the GEMM computed on the host
 * (the CPU tests pass host pointers). Behaviour and types are chosen by macros. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fact_gemm_abi.h"

#ifndef FAKE_VERSION
#define FAKE_VERSION FACT_ABI_VERSION
#endif
#ifndef FAKE_NAME
#define FAKE_NAME "fake_kernel"
#endif
#ifndef FAKE_INFO
#define FAKE_INFO "{}"
#endif
#ifndef FAKE_MODE
#define FAKE_MODE 0
#endif
#ifndef FAKE_EPI
#define FAKE_EPI 0 /* 0: acc, 1: acc + row operand 0, 2: gelu_tanh(acc + row operand 0) */
#endif
#ifndef FAKE_A_COL
#define FAKE_A_COL 0
#endif
#ifndef FAKE_B_COL
#define FAKE_B_COL 1
#endif
enum { GOOD, SEGV, WRONG, SKIP_TAIL, NOT_SUPPORTED, HANG, RECORD };

#ifdef FAKE_BF16
typedef uint16_t elem_t;
@FAKE_BF16@
#else
typedef float elem_t;
static float load(elem_t v) { return v; }
static elem_t store(float f) { return f; }
#endif

@FAKE_STATE@

int fact_gemm_can_implement(const FactGemmArgs* p) {
  if (!p || !p->a || !p->b || !p->d) return fail(FACT_INVALID_ARGS, "null operand pointer");
  if (FAKE_MODE == NOT_SUPPORTED || p->m == 7) {
    return fail(FACT_NOT_SUPPORTED, "fake: cannot implement");
  }
  if (FAKE_EPI > 0 && !p->operands[0]) return fail(FACT_INVALID_ARGS, "epilogue operand 0 is null");
  if (p->splits > 1) return fail(FACT_INVALID_ARGS, "split-K needs a stream_k kernel");
  return FACT_OK;
}

size_t fact_gemm_workspace_size(const FactGemmArgs* p) { return 1024 + (size_t)p->m; }

static float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

int fact_gemm_run(const FactGemmArgs* p, void* workspace, size_t workspace_bytes, void* stream) {
  g_last = *p;
  g_workspace = workspace;
  g_workspace_bytes = workspace_bytes;
  g_stream = stream;
  g_runs++;
  const int ok = fact_gemm_can_implement(p);
  if (ok != FACT_OK) return ok;
  if (workspace_bytes < fact_gemm_workspace_size(p)) return fail(FACT_WORKSPACE_TOO_SMALL, "small");
  if (FAKE_MODE == SEGV) raise(SIGSEGV);
  if (FAKE_MODE == HANG) for (;;) pause();
#ifdef FAKE_RUN_SLEEP_US
  usleep(FAKE_RUN_SLEEP_US); /* a slow kernel that still finishes */
#endif
  if (FAKE_MODE == RECORD) return FACT_OK;
  const elem_t* A = (const elem_t*)p->a;
  const elem_t* B = (const elem_t*)p->b;
  const elem_t* bias = (const elem_t*)p->operands[0];
  elem_t* D = (elem_t*)p->d;
  for (int64_t l = 0; l < p->batch; ++l) {
    for (int64_t i = 0; i < p->m; ++i) {
      for (int64_t j = 0; j < p->n; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < p->k; ++k) {
          const int64_t ia = l * p->batch_stride_a + (FAKE_A_COL ? k * p->lda + i : i * p->lda + k);
          const int64_t ib = l * p->batch_stride_b + (FAKE_B_COL ? j * p->ldb + k : k * p->ldb + j);
          acc += load(A[ia]) * load(B[ib]);
        }
        float v = acc;
        if (FAKE_EPI >= 1) v += load(bias[l * p->operand_batch_stride[0] + j]);
        if (FAKE_EPI == 2) v = gelu_tanh(v);
        if (FAKE_MODE == WRONG) v += 1.0f;
        if (FAKE_MODE == SKIP_TAIL && j == p->n - 1) continue;
        D[l * p->batch_stride_d + i * p->ldd + j] = store(v);
      }
    }
  }
  return FACT_OK;
}
"""
FAKE_KERNEL_C = _fake_source(FAKE_KERNEL_C, "FactGemmArgs")

MODES = {"good": 0, "segv": 1, "wrong": 2, "skip_tail": 3, "not_supported": 4, "hang": 5}
MODES["record"] = 6


def kernel_info(pattern: dict, name: str = "fake", scheduler: str = "persistent") -> dict:
    """What emit.cpp's kernel_info JSON says for a kernel built from `pattern`."""
    spec = gemm_spec(pattern)
    return {
        "family": spec.family,
        "dtype_a": spec.dtype_a,
        "dtype_b": spec.dtype_b,
        "dtype_out": spec.dtype_out,
        "layout_a": spec.layout_a,
        "layout_b": spec.layout_b,
        "epilogue": spec.text,
        "operands": [{"kind": o.kind, "dtype": o.dtype} for o in spec.operands],
        "config": {"name": f"{name}_cfg", "tile": [128, 128, 64], "tile_scheduler": scheduler},
    }


@pytest.fixture(scope="session")
def fake_kernels(tmp_path_factory):
    """build(name, pattern, epi, mode='good', **macros) -> path of a fake kernel .so (cached)."""
    if GCC is None:
        pytest.skip("needs gcc")
    folder = tmp_path_factory.mktemp("fake_kernels")
    built: dict[str, Path] = {}

    def build(name, pattern=None, epi=0, mode="good", info=None, **macros):
        if name in built:
            return built[name]
        flags = [f"-DFAKE_NAME={json.dumps(name)}", f"-DFAKE_MODE={MODES[mode]}"]
        flags.append(f"-DFAKE_EPI={epi}")
        if pattern is not None:
            spec = gemm_spec(pattern)
            info = info or kernel_info(pattern, name)
            flags.append(f"-DFAKE_A_COL={int(spec.layout_a == 'col')}")
            flags.append(f"-DFAKE_B_COL={int(spec.layout_b == 'col')}")
            if spec.dtype_a == "bf16":
                flags.append("-DFAKE_BF16")
        if info is not None:
            flags.append(f"-DFAKE_INFO={json.dumps(json.dumps(info))}")
        flags += [f"-D{k}={v}" for k, v in macros.items()]
        built[name] = compile_c(FAKE_KERNEL_C, folder / f"{name}.so", *flags, shared=True)
        return built[name]

    return build


# ---------------------------------------------------------------------------------------------
# abi.py


def _c_layout(tmp_path: Path, struct: type, header: str, extra: str = "") -> dict:
    """Every field's offset and the size of `struct` as gcc lays out the header's typedef."""
    fields = [name for name, _ in struct._fields_]
    name = struct.__name__
    prints = "\n".join(f'  printf("\\"{f}\\": %zu,\\n", offsetof({name}, {f}));' for f in fields)
    source = f"""
#include <stddef.h>
#include <stdio.h>
#include "{header}"
int main(void) {{
  printf("{{\\n");
{prints}
{extra}
  printf("\\"sizeof\\": %zu\\n}}\\n", sizeof({name}));
  return 0;
}}
"""
    exe = compile_c(source, tmp_path / f"layout_{name}")
    return json.loads(subprocess.run([exe], capture_output=True, text=True, check=True).stdout)


def _declared_fields(header: str, name: str) -> list[str]:
    """The field names of `typedef struct NAME {...} NAME;` in the header, in order."""
    text = abi_header(header).read_text()
    body = text[text.index(f"typedef struct {name} {{") : text.index(f"}} {name};")]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S).split("{", 1)[1]
    declared = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        names = re.sub(
            r"^(const\s+)?(int64_t|int32_t|int|void|float|double|FactGemmPart)\s*\*?", "", decl
        )
        declared += [re.sub(r"\[.*\]", "", n).strip() for n in names.split(",")]
    return declared


@needs_gcc
@pytest.mark.parametrize(
    ("struct", "header"),
    [
        (FactGemmArgs, "fact_gemm_abi.h"),
        (abi.FactGemmPart, "fact_gemm_abi.h"),
        (abi.FactNormArgs, "fact_norm_abi.h"),
        (FactAttentionArgs, "fact_attention_abi.h"),
        (abi.FactPointwiseArgs, "fact_pointwise_abi.h"),
    ],
    ids=["gemm", "gemm_part", "norm", "attention", "pointwise"],
)
def test_args_layout_matches_header(tmp_path, struct, header):
    extra = ""
    if struct is FactGemmArgs:
        extra = """
  printf("\\"sizeof_operands\\": %zu,\\n", sizeof(((FactGemmArgs*)0)->operands));
  printf("\\"max_operands\\": %d,\\n", FACT_MAX_EPILOGUE_OPERANDS);
  printf("\\"version\\": %d,\\n", FACT_ABI_VERSION);
  printf("\\"max_parts\\": %d,\\n", FACT_MAX_GEMM_PARTS);"""
    if struct is abi.FactPointwiseArgs:
        extra = """
  printf("\\"max_rank\\": %d,\\n", FACT_POINTWISE_MAX_RANK);
  printf("\\"max_inputs\\": %d,\\n", FACT_POINTWISE_MAX_INPUTS);"""
    c = _c_layout(tmp_path, struct, header, extra)
    fields = [name for name, _ in struct._fields_]
    assert c["sizeof"] == ctypes.sizeof(struct)
    for f in fields:
        assert getattr(struct, f).offset == c[f], f
    # every field of the header is mirrored, in the header's order
    assert _declared_fields(header, struct.__name__) == fields
    if struct is FactGemmArgs:
        ptr = ctypes.sizeof(ctypes.c_void_p)
        assert c["sizeof_operands"] == ptr * abi.FACT_MAX_EPILOGUE_OPERANDS
        assert c["max_operands"] == abi.FACT_MAX_EPILOGUE_OPERANDS == 8
        assert c["version"] == abi.FACT_ABI_VERSION == 7
        assert c["max_parts"] == abi.FACT_MAX_GEMM_PARTS == 8
    if struct is abi.FactPointwiseArgs:
        assert c["max_rank"] == abi.FACT_POINTWISE_MAX_RANK == 8
        assert c["max_inputs"] == abi.FACT_POINTWISE_MAX_INPUTS == 16


@needs_gcc
def test_status_codes_match_header(tmp_path):
    source = """
#include <stdio.h>
#include "fact_gemm_abi.h"
int main(void) {
  printf("%d %d %d %d %d\\n", FACT_OK, FACT_NOT_SUPPORTED, FACT_INVALID_ARGS, FACT_CUDA_ERROR,
         FACT_WORKSPACE_TOO_SMALL);
  return 0;
}
"""
    exe = compile_c(source, tmp_path / "status")
    out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split()
    names = ["OK", "NOT_SUPPORTED", "INVALID_ARGS", "CUDA_ERROR", "WORKSPACE_TOO_SMALL"]
    assert [int(x) for x in out] == [Status[n] for n in names]


def test_kernel_library_end_to_end(fake_kernels):
    info = {"family": "gemm", "config": {"name": "t128x128x64"}}
    lib = KernelLibrary(fake_kernels("recorder", mode="record", info=info))
    assert lib.abi_version == abi.FACT_ABI_VERSION == 7
    assert lib.name == "recorder"
    assert lib.info == info
    args = FactGemmArgs()
    args.m, args.n, args.k, args.batch = 256, 512, 64, 3
    args.a, args.b, args.d = 0x1000, 0x2000, 0x3000
    args.lda, args.ldb, args.ldd = 64, 64, 512
    args.batch_stride_a, args.batch_stride_b, args.batch_stride_d = 1 << 14, 1 << 15, 1 << 17
    args.operands[0], args.operands[7] = 0x4000, 0x5000
    args.operand_ld[7], args.operand_batch_stride[7] = 512, 1 << 17
    args.raster, args.max_swizzle, args.splits, args.sm_count, args.reduction = 2, 4, 1, 132, 1
    assert lib.can_implement(args) == Status.OK
    assert lib.workspace_size(args) == 1024 + 256
    assert lib.run(args, 0xABC0, 4096, 0xDEF0) == Status.OK

    seen = FactGemmArgs()
    ws, nbytes, stream, runs = (
        ctypes.c_void_p(),
        ctypes.c_size_t(),
        ctypes.c_void_p(),
        ctypes.c_int(),
    )
    hook = lib.symbol("fake_last_call")
    hook(
        ctypes.byref(seen),
        ctypes.byref(ws),
        ctypes.byref(nbytes),
        ctypes.byref(stream),
        ctypes.byref(runs),
    )
    assert seen.to_dict() == args.to_dict()  # every field crossed the boundary intact
    assert (ws.value, nbytes.value, stream.value, runs.value) == (0xABC0, 4096, 0xDEF0, 1)

    # a refusal comes back as a status plus the kernel's message
    args.m = 7
    assert lib.can_implement(args) == Status.NOT_SUPPORTED
    assert "cannot implement" in lib.last_error()
    with pytest.raises(abi.KernelStatusError, match="NOT_SUPPORTED: fake: cannot implement"):
        lib.check(lib.run(args, 0xABC0, 4096, None))
    args.m, args.splits = 256, 2
    assert lib.run(args, None, 0, None) == Status.INVALID_ARGS
    assert "split-K" in lib.last_error()


def test_kernel_library_refuses_other_abi_version(fake_kernels):
    path = fake_kernels("version1", FAKE_VERSION=1)
    with pytest.raises(abi.AbiError, match=r"version1\.so: kernel ABI version 1.*speaks version 7"):
        KernelLibrary(path)


@needs_gcc
def test_kernel_library_refuses_foreign_library(tmp_path):
    path = compile_c("int something(void) { return 1; }\n", tmp_path / "foreign.so", shared=True)
    with pytest.raises(abi.AbiError, match="foreign.so: not a FACT kernel library"):
        KernelLibrary(path)
    with pytest.raises(abi.AbiError, match="no such kernel library"):
        KernelLibrary(tmp_path / "missing.so")


# ---------------------------------------------------------------------------------------------
# reference.py: the function table


def _table_entries(source: str) -> dict[str, int]:
    """{"name", {arity, ...}} entries of expr.cpp's functions() table."""
    return {m[0]: int(m[1]) for m in re.findall(r'\{"(\w+)",\s*\{(\d),', source)}


def test_function_table_matches_expr_cpp_and_emit_cpp():
    expr = _table_entries((REPO / "engine/discover/expr.cpp").read_text())
    assert expr, "expr.cpp's table format changed: update _table_entries"
    assert {name: arity for name, (arity, _) in FUNCTIONS.items()} == expr
    emit_cpp = REPO / "engine" / "families" / "gemm" / "emit.cpp"
    emitted = set(re.findall(r'fn == "(\w+)"', emit_cpp.read_text()))
    assert emitted == set(FUNCTIONS)


def _apply(fn: str, args: list[list[float]], params=(), dtype=torch.float64) -> torch.Tensor:
    """fn applied elementwise through eval_epilogue (acc = the first argument column)."""
    cols = [torch.tensor(a, dtype=dtype) for a in args]
    ssa = [{"id": 0, "op": "acc"}]
    ssa += [{"id": i, "op": "operand", "index": i - 1} for i in range(1, len(cols))]
    entry = {"id": len(cols), "op": fn, "args": list(range(len(cols)))}
    if params:
        entry["params"] = list(params)
    return eval_epilogue(ssa + [entry], cols[0], cols[1:], compute_dtype=dtype)


# expr.cpp's functions, transcribed line by line, on Python floats.
def _softplus(x, beta=1.0, threshold=20.0):
    return x if beta * x > threshold else math.log1p(math.exp(beta * x)) / beta


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _p(ps, i, d):
    return ps[i] if i < len(ps) else d


EXPR_CPP = {
    "add": lambda a, p: a[0] + a[1],
    "sub": lambda a, p: a[0] - a[1],
    "mul": lambda a, p: a[0] * a[1],
    "div": lambda a, p: a[0] / a[1],
    "minimum": lambda a, p: min(a[0], a[1]),
    "maximum": lambda a, p: max(a[0], a[1]),
    "pow": lambda a, p: math.pow(a[0], a[1]),
    "where": lambda a, p: a[1] if a[0] != 0 else a[2],
    "eq": lambda a, p: float(a[0] == a[1]),
    "ne": lambda a, p: float(a[0] != a[1]),
    "lt": lambda a, p: float(a[0] < a[1]),
    "le": lambda a, p: float(a[0] <= a[1]),
    "gt": lambda a, p: float(a[0] > a[1]),
    "ge": lambda a, p: float(a[0] >= a[1]),
    "logical_not": lambda a, p: float(a[0] == 0),
    "neg": lambda a, p: -a[0],
    "exp": lambda a, p: math.exp(a[0]),
    "log": lambda a, p: math.log(a[0]),
    "log1p": lambda a, p: math.log1p(a[0]),
    "expm1": lambda a, p: math.expm1(a[0]),
    "sqrt": lambda a, p: math.sqrt(a[0]),
    "rsqrt": lambda a, p: 1.0 / math.sqrt(a[0]),
    "reciprocal": lambda a, p: 1.0 / a[0],
    "abs": lambda a, p: abs(a[0]),
    "square": lambda a, p: a[0] * a[0],
    "erf": lambda a, p: math.erf(a[0]),
    "sin": lambda a, p: math.sin(a[0]),
    "cos": lambda a, p: math.cos(a[0]),
    "tanh": lambda a, p: math.tanh(a[0]),
    "sigmoid": lambda a, p: _sigmoid(a[0]),
    "relu": lambda a, p: max(a[0], 0.0),
    "silu": lambda a, p: a[0] * _sigmoid(a[0]),
    "gelu_erf": lambda a, p: 0.5 * a[0] * (1.0 + math.erf(a[0] / math.sqrt(2.0))),
    "gelu_tanh": lambda a, p: (
        0.5 * a[0] * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (a[0] + 0.044715 * a[0] ** 3)))
    ),
    "mish": lambda a, p: a[0] * math.tanh(_softplus(a[0])),
    "hardswish": lambda a, p: a[0] * min(max(a[0] + 3, 0.0), 6.0) / 6,
    "hardsigmoid": lambda a, p: min(max(a[0] + 3, 0.0), 6.0) / 6,
    "leaky_relu": lambda a, p: a[0] if a[0] >= 0 else a[0] * _p(p, 0, 0.01),
    "hardtanh": lambda a, p: min(max(a[0], _p(p, 0, -1)), _p(p, 1, 1)),
    "clamp": lambda a, p: min(max(a[0], _p(p, 0, -math.inf)), _p(p, 1, math.inf)),
    "softplus": lambda a, p: _softplus(a[0], _p(p, 0, 1), _p(p, 1, 20)),
    "elu": lambda a, p: (
        _p(p, 1, 1) * (a[0] if a[0] > 0 else _p(p, 0, 1) * (math.exp(a[0] * _p(p, 2, 1)) - 1))
    ),
    # expr.cpp evaluates cast as the identity (it only fingerprints values); the model and the
    # kernel (emit.cpp) round to the cast's dtype ("f32" when absent), and so does the reference
    "cast": lambda a, p: torch.tensor(a[0]).float().item(),
}

# expr.cpp's fingerprint samples, plus the tails (softplus's threshold, saturation)
UNARY = [-6.0, -3.1, -1.7, -1.0, -0.55, -0.1, 0.0, 0.05, 0.3, 0.9, 1.4, 2.5, 5.0]
UNARY += [-25.0, -12.0, 12.0, 19.5, 20.5, 25.0]
POSITIVE = [0.05, 0.3, 0.9, 1.4, 2.5, 5.0, 30.0]
GRID = [-2.5, -1.0, 0.0, 0.5, 1.0, 3.0]
PARAMS = {
    "leaky_relu": [(), (0.2,)],
    "hardtanh": [(), (-2.0, 3.0)],
    "clamp": [(), (0.0, math.inf), (-math.inf, 1.5), (-0.5, 0.5)],
    "softplus": [(), (2.0, 10.0), (0.5, 3.0)],
    "elu": [(), (0.5,), (0.5, 1.5, 2.0)],
}


def _cases(fn: str):
    """(args columns, params) cases for one function, inside its domain."""
    arity = FUNCTIONS[fn][0]
    if arity == 1:
        xs = POSITIVE if fn in ("log", "log1p", "sqrt", "rsqrt", "reciprocal") else UNARY
        cols = [xs]
    elif arity == 2:
        pairs = [(a, b) for a in GRID for b in GRID]
        if fn == "div":
            pairs = [(a, b) for a, b in pairs if b != 0]
        if fn == "pow":
            pairs = [(a, b) for a in POSITIVE for b in GRID] + [(-1.5, 3.0), (-2.0, 2.0)]
        cols = [list(c) for c in zip(*pairs, strict=True)]
    else:
        triples = [(c, a, b) for c in (-1.0, 0.0, 2.0) for a in GRID for b in (-0.5, 4.0)]
        cols = [list(c) for c in zip(*triples, strict=True)]
    return [(cols, p) for p in PARAMS.get(fn, [()])]


@pytest.mark.parametrize("fn", sorted(FUNCTIONS))
def test_function_matches_expr_cpp_formula(fn):
    for cols, params in _cases(fn):
        got = _apply(fn, cols, params)
        want = [EXPR_CPP[fn]([c[i] for c in cols], list(params)) for i in range(len(cols[0]))]
        torch.testing.assert_close(
            got,
            torch.tensor(want, dtype=torch.float64),
            rtol=1e-12,
            atol=1e-14,
            msg=f"{fn}{params}",
        )


def test_functions_match_torch_functional():
    x = torch.linspace(-8, 8, 2001, dtype=torch.float64)

    def one(fn, *params):
        return _apply(fn, [x.tolist()], params)

    close = torch.testing.assert_close
    close(one("gelu_tanh"), F.gelu(x, approximate="tanh"))
    close(one("gelu_erf"), F.gelu(x))
    close(one("silu"), F.silu(x))
    close(one("mish"), F.mish(x))
    close(one("softplus"), F.softplus(x))
    close(one("softplus", 2.0, 5.0), F.softplus(x, beta=2.0, threshold=5.0))
    close(one("hardtanh"), F.hardtanh(x))
    close(one("hardtanh", -2.0, 3.0), F.hardtanh(x, -2.0, 3.0))
    close(one("leaky_relu"), F.leaky_relu(x))
    close(one("leaky_relu", 0.2), F.leaky_relu(x, 0.2))
    close(one("elu"), F.elu(x))
    close(one("elu", 0.7), F.elu(x, 0.7))
    close(one("elu", 1.6732632423543772, 1.0507009873554805), F.selu(x))  # selu is an elu
    close(one("hardswish"), F.hardswish(x))
    close(one("hardsigmoid"), F.hardsigmoid(x))
    close(one("sigmoid"), torch.sigmoid(x))
    close(one("relu"), F.relu(x))


def test_clamp_with_infinite_bounds():
    x = [-1e30, -3.0, -0.5, 0.0, 0.5, 3.0, 1e30]
    # nlohmann::json writes the inf bound of clamp_min / clamp_max as null; expr.cpp as "inf"
    lower = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 3.0, 1e30], dtype=torch.float64)
    for params in ([0.0, None], [0.0, math.inf], [0.0, "inf"], [0.0]):
        torch.testing.assert_close(_apply("clamp", [x], params), lower)
    upper = torch.tensor([-1e30, -3.0, -0.5, 0.0, 0.5, 1.0, 1.0], dtype=torch.float64)
    for params in ([None, 1.0], [-math.inf, 1.0], ["-inf", 1.0]):
        torch.testing.assert_close(_apply("clamp", [x], params), upper)
    torch.testing.assert_close(_apply("clamp", [x], []), torch.tensor(x, dtype=torch.float64))
    # the plan's own spelling, from `torch.clamp(linear(x), min=0.0)`
    ssa = [{"id": 0, "op": "acc"}, {"id": 1, "op": "clamp", "args": [0], "params": [0.0, None]}]
    acc = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(eval_epilogue(ssa, acc, []), acc.clamp(min=0))


ENGINE_LIB = REPO / "build" / "libfact_engine.a"


@pytest.mark.skipif(
    shutil.which("g++") is None or not ENGINE_LIB.exists(), reason="needs g++ and a built engine"
)
def test_functions_match_engine_eval_function(tmp_path):
    """The C++ reference itself (fact::discover::eval_function), linked from the engine."""
    cases = []  # (fn, args, params)
    for fn in sorted(set(FUNCTIONS) - {"cast"}):  # cast: see EXPR_CPP
        for cols, params in _cases(fn):
            cases += [(fn, [c[i] for c in cols], params) for i in range(len(cols[0]))]
    cases += [("log", [-1.0], ()), ("sqrt", [-4.0], ())]  # NaN in both

    def lit(v: float) -> str:
        return "INFINITY" if v == math.inf else "(-INFINITY)" if v == -math.inf else v.hex()

    def vec(vs) -> str:
        return "{" + ", ".join(lit(float(v)) for v in vs) + "}"

    rows = ",\n".join(f'  {{"{fn}", {vec(a)}, {vec(p)}}}' for fn, a, p in cases)
    source = f"""
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#include "discover/expr.h"
struct Case {{ std::string fn; std::vector<double> args, params; }};
int main() {{
  const std::vector<Case> cases = {{
{rows}
  }};
  for (const auto& c : cases) {{
    std::printf("%.17g\\n", fact::discover::eval_function(c.fn, c.args, c.params));
  }}
}}
"""
    src = tmp_path / "eval.cpp"
    src.write_text(source)
    exe = tmp_path / "eval"
    cmd = ["g++", "-std=c++20", f"-I{REPO / 'engine'}", str(src), str(ENGINE_LIB), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == len(cases)
    for (fn, args, params), text in zip(cases, out, strict=True):
        want = float(text)
        got = _apply(fn, [[a] for a in args], params).item()
        if math.isnan(want):
            assert math.isnan(got), (fn, args, params)
        else:
            assert got == pytest.approx(want, rel=1e-12, abs=1e-14), (fn, args, params)


def test_minigpt_plan_gelu_ssa_matches_gelu_tanh():
    ssa = MINIGPT_GELU["epilogue_expr"]["ssa"]
    acc = torch.randn(48, 64, dtype=torch.float64) * 3
    bias = torch.randn(64, dtype=torch.float64)
    want = F.gelu(acc + bias, approximate="tanh")
    torch.testing.assert_close(eval_epilogue(ssa, acc, [bias]), want)
    torch.testing.assert_close(eval_epilogue(HANDWRITTEN_GELU_SSA, acc, [bias]), want)
    # and the whole pattern: float64 GEMM + epilogue
    inputs = make_inputs(MINIGPT_GELU, {"m": 48, "n": 64, "k": 32}, "cpu")
    A, B, (b,) = inputs.A.double(), inputs.B.double(), inputs.operands
    want = F.gelu(A @ B + b.double(), approximate="tanh")
    torch.testing.assert_close(reference(MINIGPT_GELU, inputs.A, inputs.B, inputs.operands), want)


def test_handwritten_gelu_in_bf16_stays_close():
    """The unfused PyTorch path in bf16 (what the model runs) against the float64 reference."""
    inputs = make_inputs(MINIGPT_GELU, {"m": 96, "n": 64, "k": 128}, "cpu")
    out = pytorch_candidate(MINIGPT_GELU, inputs.A, inputs.B, inputs.operands)
    assert out.dtype == torch.bfloat16
    err, _ = rel_err(out, reference(MINIGPT_GELU, inputs.A, inputs.B, inputs.operands))
    assert 0 < err < TOL_16BIT_OUTPUT


def test_broadcast_kinds():
    m, n = 6, 5
    acc = torch.randn(m, n, dtype=torch.float64)
    row, col = torch.randn(n, dtype=torch.float64), torch.randn(m, dtype=torch.float64)
    scalar, full = torch.tensor([2.5], dtype=torch.float64), torch.randn(m, n, dtype=torch.float64)
    pattern = gemm_pattern(
        m=m,
        n=n,
        k=3,
        operands=[
            ("row", "f64[5]"),
            ("col", "f64[6, 1]"),
            ("scalar", "f64[]"),
            ("full", "f64[6, 5]"),
        ],
        ssa=[
            {"id": 0, "op": "acc"},
            {"id": 1, "op": "operand", "index": 0},
            {"id": 2, "op": "operand", "index": 1},
            {"id": 3, "op": "operand", "index": 2},
            {"id": 4, "op": "operand", "index": 3},
            {"id": 5, "op": "add", "args": [0, 1]},
            {"id": 6, "op": "mul", "args": [5, 2]},
            {"id": 7, "op": "div", "args": [6, 3]},
            {"id": 8, "op": "sub", "args": [7, 4]},
        ],
    )
    A, B = torch.randn(m, 3, dtype=torch.float64), torch.randn(3, n, dtype=torch.float64)
    want = ((A @ B + row[None, :]) * col[:, None]) / 2.5 - full
    # kernel layout (col [m], scalar [1]) and broadcast-ready ([m, 1], 0-dim) give the same
    torch.testing.assert_close(reference(pattern, A, B, [row, col, scalar, full]), want)
    got = reference(pattern, A, B, [row, col[:, None], scalar.reshape(()), full])
    torch.testing.assert_close(got, want)
    ready = [row, col[:, None], scalar, full]
    torch.testing.assert_close(
        eval_epilogue(pattern["epilogue_expr"]["ssa"], acc, ready),
        ((acc + row) * col[:, None]) / 2.5 - full,
    )


def test_batched_reference_and_candidate():
    pattern = gemm_pattern(
        dtype="f32",
        batch=3,
        m=16,
        n=8,
        k=12,
        operands=[("row", "f32[3, 8]"), ("full", "f32[3, 16, 8]")],
        ssa=bias_ssa()
        + [{"id": 3, "op": "operand", "index": 1}, {"id": 4, "op": "mul", "args": [2, 3]}],
    )
    inputs = make_inputs(pattern, device="cpu")
    row, full = inputs.operands
    assert row.shape == (3, 8) and full.shape == (3, 16, 8)  # per-batch operands
    A, B = inputs.A.double(), inputs.B.double()
    want = (torch.bmm(A, B) + row.double()[:, None, :]) * full.double()
    got = reference(pattern, inputs.A, inputs.B, inputs.operands)
    torch.testing.assert_close(got, want)
    cand = pytorch_candidate(pattern, inputs.A, inputs.B, inputs.operands)
    assert cand.dtype == torch.float32 and cand.shape == (3, 16, 8)
    torch.testing.assert_close(cand.double(), want, rtol=1e-5, atol=1e-5)


def test_cast_rounds_in_reference_and_converts_in_candidate():
    ssa = [
        {"id": 0, "op": "acc"},
        {"id": 1, "op": "cast", "args": [0], "dtype": "bf16"},
        {"id": 2, "op": "constant", "value": 1e-3},
        {"id": 3, "op": "add", "args": [1, 2]},
    ]
    acc = torch.randn(32, 16, dtype=torch.float64)
    ref = eval_epilogue(ssa, acc, [], compute_dtype=torch.float64)
    assert ref.dtype == torch.float64
    torch.testing.assert_close(ref, acc.to(torch.bfloat16).double() + 1e-3)
    natural = eval_epilogue(ssa, acc.float(), [])
    assert natural.dtype == torch.bfloat16  # the model's dtype flow: the cast really converts


def test_constants_comparisons_and_where():
    acc = torch.tensor([[-2.0, -0.5, 0.0, 0.5, 2.0]], dtype=torch.float64)
    ssa = [
        {"id": 0, "op": "acc"},
        {"id": 1, "op": "constant", "value": 0.0},
        {"id": 2, "op": "gt", "args": [0, 1]},
        {"id": 3, "op": "constant", "value": "-inf"},
        {"id": 4, "op": "where", "args": [2, 0, 3]},  # masked_fill(acc <= 0, -inf)
        {"id": 5, "op": "exp", "args": [4]},
        {"id": 6, "op": "add", "args": [5, 2]},  # flags add like numbers, not as bools
    ]
    got = eval_epilogue(ssa, acc, [])
    want = torch.tensor([[0.0, 0.0, 0.0, math.exp(0.5) + 1, math.exp(2.0) + 1]])
    torch.testing.assert_close(got, want.double())
    # a function of constants only, and an epilogue that is a constant
    only = [
        {"id": 0, "op": "acc"},
        {"id": 1, "op": "constant", "value": 4.0},
        {"id": 2, "op": "sqrt", "args": [1]},
        {"id": 3, "op": "add", "args": [0, 2]},
    ]
    torch.testing.assert_close(eval_epilogue(only, acc, []), acc + 2)
    const = [{"id": 0, "op": "constant", "value": 1.5}]
    torch.testing.assert_close(eval_epilogue(const, acc, []), torch.full_like(acc, 1.5))
    # a bf16 model keeps bf16 with a Python-scalar constant (no promotion)
    half = [
        {"id": 0, "op": "acc"},
        {"id": 1, "op": "constant", "value": 0.5},
        {"id": 2, "op": "mul", "args": [0, 1]},
    ]
    assert eval_epilogue(half, acc.bfloat16(), []).dtype == torch.bfloat16


def test_scalar_operand_does_not_promote_the_model_dtype():
    pattern = gemm_pattern(
        dtype="bf16",
        m=8,
        n=16,
        k=8,
        operands=[("scalar", "f32[]")],
        ssa=[
            {"id": 0, "op": "acc"},
            {"id": 1, "op": "operand", "index": 0},
            {"id": 2, "op": "mul", "args": [0, 1]},
        ],
    )
    inputs = make_inputs(pattern, device="cpu")
    assert inputs.operands[0].dtype == torch.float32 and inputs.operands[0].shape == (1,)
    out = pytorch_candidate(pattern, inputs.A, inputs.B, inputs.operands)
    assert out.dtype == torch.bfloat16


def test_horizontal_gemm():
    pattern = {
        "family": "horizontal_gemm",
        "problem": {"batch": 1, "k": 32, "m": 16, "n": 48, "n_parts": [32, 8, 8]},
        "attrs": {
            "dtype_a": "f32",
            "dtype_b": "f32",
            "dtype_out": "f32",
            "layout_a": "row",
            "layout_b": "col",
        },
        "operands": [
            {"node": "x", "role": "a", "type": "f32[16, 32]"},
            {"node": "wq", "role": "b", "type": "f32[32, 32]"},
            {"broadcast": "row", "node": "bq", "role": "bias", "type": "f32[32]"},
            {"node": "wk", "role": "b", "type": "f32[8, 32]"},
            {"broadcast": "row", "node": "bk", "role": "bias", "type": "f32[8]"},
            {"node": "wv", "role": "b", "type": "f32[8, 32]"},
            {"broadcast": "row", "node": "bv", "role": "bias", "type": "f32[8]"},
        ],
        "epilogue_expr": None,
        "signature": "horizontal_gemm[bias]:f32,f32->f32:row,col",
    }
    spec = gemm_spec(pattern)
    assert spec.text == "acc + bias" and [o.kind for o in spec.operands] == ["row"]
    inputs = make_inputs(pattern, device="cpu")
    assert inputs.operands[0].shape == (48,)  # the parts' biases, concatenated
    parts = pytorch_candidate(pattern, inputs.A, inputs.B, inputs.operands)
    assert [p.shape[-1] for p in parts] == [32, 8, 8]  # one matmul per part, as the model runs
    ref = reference(pattern, inputs.A, inputs.B, inputs.operands)
    torch.testing.assert_close(as_output(parts).double(), ref, rtol=1e-5, atol=1e-5)
    # The grouped kernel gets each part's column block of B, D and the bias row, in place.
    args = gemm_args(inputs)
    assert args.n_parts == 3 and args.n == 48
    starts = [0, 32, 40]
    for i, (part, start, n) in enumerate(zip(args.parts[:3], starts, [32, 8, 8], strict=True)):
        assert part.n == n, i
        assert part.b == inputs.B.data_ptr() + start * 32 * 4 and part.ldb == 32  # [n, k] rows
        assert part.d == inputs.D.data_ptr() + start * 4 and part.ldd == 48
        assert part.bias == inputs.operands[0].data_ptr() + start * 4
    # Every verification shape keeps three parts, 16-byte aligned but the last.
    shapes = verification_shapes(pattern)
    assert shapes[0]["n_parts"] == [32, 8, 8]
    for s in shapes[1:]:
        assert len(s["n_parts"]) == 3 and sum(s["n_parts"]) == s["n"], s
        assert all(n % 4 == 0 for n in s["n_parts"][:-1]), s
    assert split_parts(8, 3, 4) is None  # too few columns for three aligned parts
    assert split_parts(8, 0, 4) is None
    # n is the parts' sum: another n without parts is refused, not run as one unsplit GEMM
    with pytest.raises(FactError, match="sum of its parts"):
        make_inputs(pattern, {"n": 64}, device="cpu")
    # the group scheduler's default launch runs along M, and is named so
    combos = knob_combinations(pattern, {"tile_scheduler": "group"})
    assert combos[0]["raster"] == "along_m"
    assert all(c["raster"] != "heuristic" for c in combos)
    assert len(combos) == len({json.dumps(c, sort_keys=True) for c in combos})


def test_unsupported_patterns_are_refused():
    with pytest.raises(NotSupportedError, match="family 'attention'"):
        gemm_spec({"family": "attention", "attrs": {}, "operands": []})
    strided = gemm_pattern()
    strided["attrs"]["layout_a"] = "strided"
    with pytest.raises(NotSupportedError, match="strided"):
        gemm_spec(strided)
    assert parse_type("bf16[128, 512, 768]") == ("bf16", (128, 512, 768))
    assert parse_type("f32[]") == ("f32", ())


# ---------------------------------------------------------------------------------------------
# inputs.py


@pytest.mark.parametrize("layout_a", ["row", "col"])
@pytest.mark.parametrize("layout_b", ["row", "col"])
def test_inputs_layouts_and_args(layout_a, layout_b):
    pattern = gemm_pattern(
        dtype="bf16",
        layout_a=layout_a,
        layout_b=layout_b,
        m=40,
        n=24,
        k=16,
        operands=[("row", "bf16[24]"), ("full", "bf16[40, 24]")],
        ssa=bias_ssa(),
    )
    inputs = make_inputs(pattern, device="cpu")
    A, B = inputs.A, inputs.B
    assert A.shape == (40, 16) and B.shape == (16, 24)
    assert A.dtype == B.dtype == torch.bfloat16
    if layout_a == "row":
        assert A.is_contiguous()
    else:  # a transposed view of a contiguous [k, m]
        assert A.t().is_contiguous() and A.stride() == (1, 40)
    if layout_b == "row":
        assert B.is_contiguous()
    else:  # a transposed view of a contiguous [n, k]
        assert B.t().is_contiguous() and B.stride() == (1, 16)
    args = gemm_args(inputs)
    assert (args.m, args.n, args.k, args.batch) == (40, 24, 16, 1)
    assert args.lda == (16 if layout_a == "row" else 40)
    assert args.ldb == (24 if layout_b == "row" else 16)
    assert args.ldd == 24
    assert args.a == A.data_ptr() and args.b == B.data_ptr() and args.d == inputs.D.data_ptr()
    assert args.operands[0] == inputs.operands[0].data_ptr()
    assert args.operands[1] == inputs.operands[1].data_ptr() and args.operand_ld[1] == 24
    assert list(args.operands[2:]) == [None] * 6
    assert (args.raster, args.max_swizzle, args.splits, args.sm_count) == (0, 1, 1, 0)


def test_inputs_fresh_poisoned_and_replayable():
    a = make_inputs(MINIGPT_GELU, SMALL, "cpu")
    b = make_inputs(MINIGPT_GELU, SMALL, "cpu")
    assert a.seed != b.seed and not torch.equal(a.A, b.A)  # fresh every call
    assert torch.isnan(a.D).all() and a.D.shape == (64, 128) and a.D.dtype == torch.bfloat16
    for t in (a.A, a.B, *a.operands):
        assert torch.isfinite(t.float()).all() and (t != 0).float().mean() > 0.9  # not zeros
    again = make_inputs(MINIGPT_GELU, SMALL, "cpu", seed=a.seed)
    assert torch.equal(again.A, a.A) and torch.equal(again.operands[0], a.operands[0])
    # acc ~ N(0, 1) whatever k is: the activation is exercised where it bends
    acc = a.A.double() @ a.B.double()
    assert 0.5 < acc.std().item() < 2.0
    a.D.zero_()
    a.poison()
    assert torch.isnan(a.D).all()


def test_inputs_batched_operand_strides():
    pattern = gemm_pattern(
        dtype="f32",
        layout_a="col",
        batch=4,
        m=16,
        n=8,
        k=12,
        operands=[
            ("row", "f32[8]"),
            ("col", "f32[4, 16, 1]"),
            ("full", "f32[4, 16, 8]"),
            ("scalar", "f32[]"),
        ],
        ssa=bias_ssa(),
    )
    inputs = make_inputs(pattern, device="cpu")
    row, col, full, scalar = inputs.operands
    assert row.shape == (8,) and col.shape == (4, 16) and full.shape == (4, 16, 8)
    assert scalar.shape == (1,)
    args = gemm_args(inputs)
    assert args.batch == 4
    assert args.batch_stride_a == 16 * 12 and args.lda == 16  # col A: [4, k, m] transposed
    assert args.batch_stride_b == 12 * 8 and args.batch_stride_d == 16 * 8
    assert list(args.operand_batch_stride[:4]) == [0, 16, 16 * 8, 0]
    assert list(args.operand_ld[:4]) == [0, 0, 8, 0]


def test_inputs_keep_divisors_away_from_zero():
    ssa = [
        {"id": 0, "op": "acc"},
        {"id": 1, "op": "operand", "index": 0},
        {"id": 2, "op": "div", "args": [0, 1]},
        {"id": 3, "op": "operand", "index": 1},
        {"id": 4, "op": "log", "args": [3]},
        {"id": 5, "op": "add", "args": [2, 4]},
    ]
    pattern = gemm_pattern(operands=[("row", "f32[128]"), ("col", "f32[64]")], ssa=ssa)
    inputs = make_inputs(pattern, device="cpu")
    for t in inputs.operands:
        assert t.min() >= 0.5 and t.max() <= 2.0
    assert torch.isfinite(reference(pattern, inputs.A, inputs.B, inputs.operands)).all()


def test_problem_override_and_verification_shapes():
    inputs = make_inputs(MINIGPT_GELU, {"m": 1000, "n": 776, "k": 200}, "cpu")
    assert inputs.A.shape == (1000, 200) and inputs.D.shape == (1000, 776)
    assert inputs.operands[0].shape == (776,)
    shapes = verification_shapes(MINIGPT_GELU)
    assert shapes[0] == {"batch": 1, "m": 65536, "n": 3072, "k": 768}  # the plan's problem first
    assert {"batch": 1, "m": 1000, "n": 776, "k": 200} in shapes  # ragged tails
    for s in shapes:  # 16-byte alignment of every contiguous extent for bf16
        assert s["n"] % 8 == 0 and s["k"] % 8 == 0
    batched = gemm_pattern(dtype="f32", batch=6)
    assert all(s["batch"] in (6, 3) for s in verification_shapes(batched))


def test_knobs_reach_the_args():
    inputs = make_inputs(MINIGPT_GELU, SMALL, "cpu")
    args = gemm_args(inputs, {"raster": "along_n", "max_swizzle": 8, "splits": 2}, sm_count=132)
    assert (args.raster, args.max_swizzle, args.splits, args.sm_count) == (2, 8, 2, 132)
    assert args.reduction == 0  # deterministic unless asked
    assert gemm_args(inputs, {"raster": 1}).raster == 1
    assert gemm_args(inputs, {"reduction": "nondeterministic"}).reduction == 1
    assert gemm_args(inputs, {"reduction": 1}).reduction == 1
    with pytest.raises(FactError, match="reduction knob 'atomic' is not one of"):
        gemm_args(inputs, {"reduction": "atomic"})
    assert args.decomposition == 0  # CUTLASS's heuristic unless asked
    assert gemm_args(inputs, {"decomposition": "stream_k"}).decomposition == 1
    assert gemm_args(inputs, {"decomposition": "data_parallel"}).decomposition == 2
    with pytest.raises(FactError, match="decomposition knob 'split_k' is not one of"):
        gemm_args(inputs, {"decomposition": "split_k"})


def test_deterministic_mode_overrides_a_tuned_nondeterministic_reduction():
    from fact.compose.ops import launch_knobs

    tuned = {"raster": "along_m", "max_swizzle": 1, "splits": 66, "reduction": "nondeterministic"}
    assert launch_knobs(tuned) is tuned
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert launch_knobs(tuned) == {**tuned, "splits": 1, "reduction": "deterministic"}
        assert launch_knobs(DEFAULT_KNOBS) is DEFAULT_KNOBS
        # a tuned stream-K decomposition stays: with the ordered reduction its bits repeat too
        forced = {**tuned, "splits": 1, "decomposition": "stream_k"}
        assert launch_knobs(forced) == {**forced, "reduction": "deterministic"}
        assert harness._deterministic() is True
    finally:
        torch.use_deterministic_algorithms(was)


# ---------------------------------------------------------------------------------------------
# harness.py, driven through fake kernels


def test_tolerances():
    assert tolerance(MINIGPT_GELU, "highest") == TOL_16BIT_OUTPUT == 2e-2
    f32 = gemm_pattern(dtype="f32")
    assert tolerance(f32, "highest") == TOL_F32_HIGHEST == 1e-5
    assert tolerance(f32, "high") == TOL_F32_TF32 == 2e-3
    assert tolerance(gemm_pattern(dtype="bf16", out="f32"), "high") == TOL_F32_HIGHEST


def test_rel_err_never_passes_nan_or_inf():
    ref = torch.ones(4, 4, dtype=torch.float64)
    assert rel_err(ref.clone(), ref) == (0.0, "")
    out = ref.clone()
    out[1, 2] = math.nan
    err, why = rel_err(out, ref)
    assert math.isinf(err) and "1 of 16" in why and not err <= 1.0
    out[1, 2] = math.inf
    assert math.isinf(rel_err(out, ref)[0])


def test_rel_err_where_the_reference_itself_is_nan_or_inf():
    """log/sqrt of a negative accumulator is NaN in the model too: a kernel must reproduce the
    NaN/Inf where the float64 reference has it, and is measured on the finite rest."""
    ref = torch.tensor([[1.0, math.nan], [math.inf, -math.inf]], dtype=torch.float64)
    out = ref.clone()
    out[0, 0] = 1.01
    err, why = rel_err(out, ref)
    assert abs(err - 0.01) < 1e-12 and "3 elements NaN/Inf as in the reference" in why
    for wrong in (0.0, math.inf, -math.inf):  # NaN expected
        bad = ref.clone()
        bad[0, 1] = wrong
        err, why = rel_err(bad, ref)
        assert math.isinf(err) and "reference is NaN/Inf" in why
    bad = ref.clone()
    bad[1, 0] = math.nan  # +inf expected
    assert math.isinf(rel_err(bad, ref)[0])
    bad = ref.clone()
    bad[0, 0] = math.nan  # finite expected: an unwritten element
    assert "unwritten" in rel_err(bad, ref)[1]


def test_verify_passes_a_correct_kernel(fake_kernels):
    lib = fake_kernels("gelu_good", MINIGPT_GELU, epi=2)
    result = verify(lib, MINIGPT_GELU, SMALL, "highest", device="cpu")  # default shapes
    assert result["ok"], result["message"]
    assert result["disposition"] == "passed"
    assert set(result["rel_err"]) == {"b1_m64_n128_k96", "b1_m1000_n776_k200", "b1_m24_n40_k72"}
    assert all(0 < e < 2e-2 for e in result["rel_err"].values())
    assert len(set(result["seeds"].values())) == 3  # fresh inputs for every shape


def test_verify_batched_col_major_f32(fake_kernels):
    pattern = gemm_pattern(
        dtype="f32",
        layout_a="col",
        layout_b="row",
        batch=3,
        m=48,
        n=40,
        k=24,
        operands=[("row", "f32[3, 40]")],
        ssa=bias_ssa(),
    )
    lib = fake_kernels("f32_batched", pattern, epi=1)
    result = verify(lib, pattern, None, "highest", device="cpu")
    assert result["ok"], result["message"]
    assert max(result["rel_err"].values()) < TOL_F32_HIGHEST
    assert "b3_m1000_n776_k200" in result["rel_err"]


def test_verify_catches_wrong_and_unwritten_output(fake_kernels):
    wrong = fake_kernels("gelu_wrong", MINIGPT_GELU, epi=2, mode="wrong")
    result = verify(wrong, MINIGPT_GELU, SMALL, shapes=SMALL_SHAPES, device="cpu")
    assert not result["ok"] and result["disposition"] == "incorrect"
    assert "rel_err" in result["message"] and "seed" in result["message"]
    tail = fake_kernels("gelu_tail", MINIGPT_GELU, epi=2, mode="skip_tail")
    result = verify(tail, MINIGPT_GELU, SMALL, shapes=SMALL_SHAPES, device="cpu")
    assert result["disposition"] == "incorrect" and "NaN/Inf" in result["message"]
    # a kernel for another epilogue (no bias operand) is refused before it runs
    plain = fake_kernels("plain_bf16", gemm_pattern(dtype="bf16"), epi=0)
    result = verify(plain, MINIGPT_GELU, SMALL, device="cpu")
    assert result["disposition"] == "not_supported" and "epilogue operands" in result["message"]


def test_verify_not_supported_and_skipped_shapes(fake_kernels):
    refuses = fake_kernels("gelu_refuses", MINIGPT_GELU, epi=2, mode="not_supported")
    result = verify(refuses, MINIGPT_GELU, SMALL, device="cpu")
    assert result["disposition"] == "not_supported" and "cannot implement" in result["message"]
    # the fake cannot do m == 7: a later shape it cannot implement is skipped, not failed
    good = fake_kernels("gelu_good", MINIGPT_GELU, epi=2)
    result = verify(good, MINIGPT_GELU, SMALL, shapes=[SMALL, {"m": 7}], device="cpu")
    assert result["ok"] and list(result["skipped"]) == ["b1_m7_n128_k96"]


def test_time_kernel_and_pytorch_on_cpu(fake_kernels):
    lib = fake_kernels("gelu_good", MINIGPT_GELU, epi=2)
    t = time_kernel(lib, MINIGPT_GELU, SMALL, device="cpu")
    assert t > 0
    assert time_pytorch(MINIGPT_GELU, SMALL, device="cpu") > 0
    with pytest.raises(abi.KernelStatusError, match="INVALID_ARGS: split-K"):
        time_kernel(lib, MINIGPT_GELU, SMALL, {"splits": 2}, device="cpu")
    with pytest.raises(Exception, match="at least 20"):
        time_kernel(lib, MINIGPT_GELU, SMALL, reps=5, device="cpu")


def test_knob_combinations_and_info_checks():
    combos = knob_combinations({"search_space": {"raster": ["along_m"], "swizzle": [1, 2]}})
    assert combos[0] == DEFAULT_KNOBS and len(combos) == 3
    stream_k = knob_combinations(None, {"tile_scheduler": "stream_k"})
    # + split-K 2, 4 + the stream-K and data-parallel decompositions + nondeterministic with 3
    # raster orders and with the stream-K decomposition
    assert len(stream_k) == 17
    assert [k["raster"] for k in stream_k if k.get("reduction") == "nondeterministic"] == [
        "heuristic",
        "along_m",
        "along_n",
        "heuristic",
    ]
    assert [knob_name(k) for k in stream_k[-6:]] == [
        "r_heur_s1_k1_sk",
        "r_heur_s1_k1_dp",
        "r_heur_s1_k1_nd",
        "r_m_s1_k1_nd",
        "r_n_s1_k1_nd",
        "r_heur_s1_k1_nd_sk",
    ]
    # PyTorch's deterministic mode keeps the atomic reduction out of the sweep
    deterministic = knob_combinations(None, {"tile_scheduler": "stream_k"}, deterministic=True)
    assert deterministic == stream_k[:13]
    persistent = knob_combinations(None, {"tile_scheduler": "persistent"})
    assert not any("reduction" in k for k in persistent)
    assert knob_combinations(mode="default") == [DEFAULT_KNOBS]
    # an sm80 multistage (3xTF32) kernel: fixed swizzle, no split-K, so the default alone
    multistage = {"kernel_schedule": "multistage", "tile_scheduler": "grid"}
    assert knob_combinations({"search_space": {"swizzle": [1, 2]}}, multistage) == [DEFAULT_KNOBS]
    info = kernel_info(MINIGPT_GELU)
    assert check_kernel_info(info, MINIGPT_GELU) == []
    assert check_kernel_info({**info, "layout_b": "row"}, MINIGPT_GELU)
    assert epilogue_shape("x + (acc + p_attn_c_proj_bias)") == "$+(acc+$)"
    assert epilogue_shape("gelu_tanh(acc + b)") == epilogue_shape("gelu_tanh(acc + c)")
    assert epilogue_shape("clamp(acc, 0, inf) * 1e-05") == "clamp(acc,0,inf)*1e-05"


def test_tune_isolates_faults_and_goes_on(fake_kernels):
    good = fake_kernels("gelu_good", MINIGPT_GELU, epi=2)
    libraries = [
        {"kernel": "good", "library": good, "config": {"name": "good_cfg"}},
        fake_kernels("gelu_segv", MINIGPT_GELU, epi=2, mode="segv"),
        fake_kernels("gelu_wrong", MINIGPT_GELU, epi=2, mode="wrong"),
        fake_kernels("gelu_refuses", MINIGPT_GELU, epi=2, mode="not_supported"),
        {"kernel": "good_again", "library": str(good), "config": {"name": "again"}},
    ]
    details: dict = {}
    seen = []
    rows = tune(
        MINIGPT_GELU,
        libraries,
        "highest",
        [DEFAULT_KNOBS, {"splits": 2}],
        problem=SMALL,
        shapes=SMALL_SHAPES,
        device="cpu",
        progress=seen.append,
        details=details,
    )
    got = [(r["kernel"], r["disposition"]) for r in rows]
    assert got == [
        ("pytorch", "passed"),
        ("good", "passed"),
        ("gelu_segv", "fault"),
        ("gelu_wrong", "incorrect"),
        ("gelu_refuses", "not_supported"),
        ("good_again", "passed"),  # the run went on after the segfault, in a fresh worker
    ]
    assert details["workers"] == 2 and details["environment"]["device"] == "cpu"
    assert len(seen) == len(rows)
    segv = rows[2]
    assert "SIGSEGV" in segv["message"] and segv["time_us"] is None
    for r in rows:
        assert r["signature"] == MINIGPT_GELU["signature"] and r["provenance"] == "tuned"
        assert r["arch"] == "sm90" and r["problem"] == {"batch": 1, **SMALL}
    good_row = rows[1]
    assert good_row["time_us"] > 0 and 0 < good_row["error"] < 2e-2
    assert good_row["knobs"] == DEFAULT_KNOBS and good_row["config"] == {"name": "good_cfg"}
    assert good_row["library"] == str(good)
    # the split-K combination was refused by the (persistent) kernel and skipped, not failed
    assert [k["name"] for k in good_row["knob_times"]] == ["r_heur_s1_k1", "r_heur_s1_k2"]
    assert good_row["knob_times"][1]["time_us"] is None
    assert rows[0]["config"] == {"name": "pytorch"} and rows[0]["library"] is None
    assert rows[0]["time_us"] > 0
    assert rows[3]["time_us"] is None and rows[3]["error"] > 2e-2


def test_tune_times_out_a_hanging_kernel(fake_kernels):
    rows = tune(
        MINIGPT_GELU,
        [
            fake_kernels("gelu_hang", MINIGPT_GELU, epi=2, mode="hang"),
            fake_kernels("gelu_good", MINIGPT_GELU, epi=2),
        ],
        knobs_list=[DEFAULT_KNOBS],
        problem=SMALL,
        shapes=SMALL_SHAPES,
        device="cpu",
        timeout_s=3,
    )
    assert [r["disposition"] for r in rows] == ["passed", "fault", "passed"]
    assert "timed out: no progress for 3 s" in rows[1]["message"]


def test_tune_watchdog_counts_progress_not_the_whole_candidate(fake_kernels):
    """The watchdog restarts at each step (verification, each knob setting): a kernel slower in
    all than the timeout, but never that long between steps, is timed, not killed."""
    slow = fake_kernels("gelu_slow", MINIGPT_GELU, epi=2, FAKE_RUN_SLEEP_US=40_000)
    knobs = [{**DEFAULT_KNOBS, "raster": r} for r in ("heuristic", "along_m", "along_n")]
    knobs += [{**DEFAULT_KNOBS, "max_swizzle": 2}]
    started = time.monotonic()
    rows = tune(
        MINIGPT_GELU,
        [slow],
        knobs_list=knobs,
        problem=SMALL,
        shapes=SMALL_SHAPES,
        device="cpu",
        timeout_s=3,
    )
    took = time.monotonic() - started
    # 4 knob settings x (5 warmup + 20 timed) runs x 40 ms: 4 s of launches alone
    assert took > 4, took
    assert rows[1]["disposition"] == "passed", rows[1]["message"]
    assert len(rows[1]["knob_times"]) == 4


def _plan_with(pattern: dict, problem: dict) -> dict:
    attention = {"family": "attention", "signature": "attention[softmax]:bf16"}
    return {
        "arch": "sm90",
        "float32_matmul_precision": "highest",
        "patterns": [attention, {**pattern, "problem": {"batch": 1, **problem}}],
    }


def test_cli_with_a_realize_run_directory(fake_kernels, tmp_path):
    """`fact-engine realize --out RUN` layout: RUN/plan.json, RUN/lib/*.so, RUN/manifest.json
    with library paths relative to RUN and entries realize could not build."""
    run = tmp_path / "run"
    (run / "lib").mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps(_plan_with(MINIGPT_GELU, SMALL)))
    shutil.copy(fake_kernels("gelu_good", MINIGPT_GELU, epi=2), run / "lib" / "good.so")
    wrong = fake_kernels("gelu_wrong", MINIGPT_GELU, epi=2, mode="wrong")
    sig = MINIGPT_GELU["signature"]
    (run / "manifest.json").write_text(
        json.dumps(
            [
                {
                    "pattern_index": 0,
                    "family": "attention",
                    "status": "not_supported",
                    "detail": "no kernel family for attention on sm90 yet",
                },
                {
                    "pattern_index": 1,
                    "signature": sig,
                    "kernel": "good",
                    "status": "compiled",
                    "library": "lib/good.so",
                    "config": {"name": "g"},
                },
                {
                    "pattern_index": 1,
                    "kernel": "wrong",
                    "library": str(wrong),
                    "config": {"name": "w"},
                },
                {
                    "pattern_index": 1,
                    "kernel": "broken",
                    "status": "compile_error",
                    "config": {"name": "b"},
                    "detail": "nvcc: error",
                },
            ]
        )
    )
    out, export = tmp_path / "results.json", tmp_path / "export.json"
    cmd = [
        sys.executable,
        "-m",
        "fact.tune.harness",
        str(run / "plan.json"),
        "--kernels",
        str(run),
        "--out",
        str(out),
        "--export",
        str(export),
        "--device",
        "cpu",
        "--knobs",
        "default",
        "--shapes",
        json.dumps(SMALL_SHAPES),
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**_env(), "PYTHONPATH": str(REPO / "python")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "pattern 0: no kernel to run (no kernel family for attention" in proc.stderr
    table = proc.stdout.strip().splitlines()
    assert table[0].split() == [
        "pattern",
        "kernel",
        "disposition",
        "rel_err",
        "time_us",
        "vs",
        "pytorch",
    ]
    assert [line.split()[2:4] for line in table[2:]] == [
        ["pytorch", "passed"],
        ["good", "passed"],
        ["wrong", "incorrect"],
        ["broken", "compile_error"],
    ]
    assert table[2].endswith("1.00x") and table[3].endswith("x")
    results = json.loads(out.read_text())
    assert results["fact_tune_results"] == 1 and results["precision"] == "highest"
    assert results["environment"]["device"] == "cpu"
    assert [r["pattern_index"] for r in results["rows"]] == [1, 1, 1, 1]
    assert results["rows"][1]["library"] == str(run / "lib" / "good.so")
    assert results["rows"][3]["message"] == "nvcc: error"
    doc = json.loads(export.read_text())
    assert doc["fact_registry_export"] == 1
    dispositions = [r["disposition"] for r in doc["rows"]]
    assert dispositions == ["passed", "incorrect", "compile_error"]  # no pytorch row
    engine = REPO / "build" / "fact-engine"
    if engine.exists():  # the engine accepts the export as it is
        registry = tmp_path / "registry.db"
        imp = subprocess.run(
            [engine, "registry", "--registry", str(registry), "import", str(export)],
            capture_output=True,
            text=True,
        )
        assert imp.returncode == 0, imp.stderr


def _env() -> dict:
    import os

    return dict(os.environ)


def test_cli_scans_a_kernel_folder(fake_kernels, tmp_path):
    folder = tmp_path / "cache" / "abc123"
    folder.mkdir(parents=True)
    shutil.copy(fake_kernels("gelu_good", MINIGPT_GELU, epi=2), folder / "kernel.so")
    other = gemm_pattern(dtype="bf16")
    (tmp_path / "cache" / "def456").mkdir()
    shutil.copy(fake_kernels("plain_bf16", other, epi=0), tmp_path / "cache/def456/kernel.so")
    plan = _plan_with(MINIGPT_GELU, SMALL)
    entries = scan_kernels(tmp_path / "cache", plan)
    assert [(e["pattern_index"], e["kernel"]) for e in entries] == [(1, "gelu_good")]
    assert entries[0]["config"]["name"] == "gelu_good_cfg"


def test_manifest_formats(tmp_path):
    (tmp_path / "m1.json").write_text(json.dumps([{"pattern_index": 0, "library": "k.so"}]))
    entries, plan = load_manifest(tmp_path / "m1.json")
    assert entries[0]["library"] == str(tmp_path / "k.so") and plan is None
    (tmp_path / "m2.json").write_text(
        json.dumps(
            {
                "plan": "p.json",
                "kernels": [
                    {"pattern_index": 2, "kernel": "x", "library": "/abs/k.so", "config": {}}
                ],
            }
        )
    )
    entries, plan = load_manifest(tmp_path / "m2.json")
    assert entries[0]["library"] == "/abs/k.so" and plan == str(tmp_path / "p.json")
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text("{}")
    (run / "manifest.json").write_text(
        json.dumps(
            [
                {"pattern_index": 0, "kernel": "k", "library": "lib/k.so", "status": "compiled"},
                {"pattern_index": 1, "status": "not_supported", "detail": "attention"},
            ]
        )
    )
    entries, plan = load_manifest(run)
    assert plan == str(run / "plan.json")
    assert [e["library"] for e in entries] == [str(run / "lib/k.so"), None]
    (tmp_path / "bad.json").write_text(json.dumps([{"kernel": "x"}]))
    with pytest.raises(Exception, match="entry 0"):
        load_manifest(tmp_path / "bad.json")


def test_format_table_and_export():
    rows = [
        {
            "pattern_index": 0,
            "signature": "s",
            "kernel": "pytorch",
            "disposition": "passed",
            "time_us": 200.0,
            "error": 3e-3,
        },
        {
            "pattern_index": 0,
            "signature": "s",
            "kernel": "k1",
            "disposition": "passed",
            "time_us": 100.0,
            "error": 1e-3,
            "arch": "sm90",
            "problem": {},
            "config": {},
            "provenance": "tuned",
        },
        {
            "pattern_index": 0,
            "signature": "s",
            "kernel": "k2",
            "disposition": "fault",
            "time_us": None,
            "error": None,
        },
    ]
    lines = format_table(rows).splitlines()
    assert lines[3].split()[-1] == "2.00x" and lines[4].split()[-3:] == ["-", "-", "-"]
    assert len(lines) == 5
    assert [r["disposition"] for r in registry_export(rows)["rows"]] == ["passed", "fault"]
    # realize's ptxas advisories follow their kernel into its row, its message and the table
    serialized = "C7511: wgmma.mma_async instructions are serialized"
    entries = [{"kernel": "k1", "advisories": [serialized]}, {"kernel": "k2"}]
    rows[1]["message"] = "3 knobs"
    attach_advisories(rows, entries)
    assert rows[1]["advisories"] == [serialized]
    assert rows[1]["message"] == f"3 knobs; ptxas {serialized}"
    assert "advisories" not in rows[0] and "advisories" not in rows[2]
    lines = format_table(rows).splitlines()
    assert lines[5:] == [f"k1: ptxas {serialized}"]


# ---------------------------------------------------------------------------------------------
# Fused attention (attention.py), driven through fake attention kernels

FAKE_ATTENTION_C = r"""
/* A fake FACT attention kernel: the C ABI of fact_attention_abi.h computed on the host in
 * float from bf16 tensors (the CPU tests pass host pointers). Behaviour is chosen by macros. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fact_attention_abi.h"

#define FAKE_VERSION FACT_ABI_VERSION
#ifndef FAKE_NAME
#define FAKE_NAME "fake_attention"
#endif
#ifndef FAKE_INFO
#define FAKE_INFO "{}"
#endif
#ifndef FAKE_MODE
#define FAKE_MODE 0
#endif
#ifndef FAKE_CAUSAL
#define FAKE_CAUSAL 1
#endif
#ifndef FAKE_HEAD_DIM
#define FAKE_HEAD_DIM 128
#endif
enum { GOOD, SEGV, WRONG, SKIP_TAIL, NOT_SUPPORTED, HANG, RECORD, GQA_MOD, NO_MASK, SQRT_SCALE };

typedef uint16_t elem_t;
@FAKE_BF16@

@FAKE_STATE@

int fact_attention_can_implement(const FactAttentionArgs* a) {
  if (!a || !a->q || !a->k || !a->v || !a->o) return fail(FACT_INVALID_ARGS, "null q, k, v or o");
  if (a->kv_heads <= 0 || a->heads % a->kv_heads) return fail(FACT_INVALID_ARGS, "bad kv_heads");
  if (FAKE_MODE == NOT_SUPPORTED || a->seq_q == 7) {
    return fail(FACT_NOT_SUPPORTED, "fake: cannot implement");
  }
  if (a->head_dim > FAKE_HEAD_DIM) return fail(FACT_NOT_SUPPORTED, "head_dim too large");
  if (FAKE_CAUSAL && a->seq_q > a->seq_k) return fail(FACT_NOT_SUPPORTED, "more queries than keys");
  return FACT_OK;
}

size_t fact_attention_workspace_size(const FactAttentionArgs* a) {
  return (size_t)(a->batch * a->heads * a->seq_q) * sizeof(float);
}

int fact_attention_run(const FactAttentionArgs* a, void* workspace, size_t workspace_bytes,
                       void* stream) {
  g_last = *a;
  g_workspace = workspace;
  g_workspace_bytes = workspace_bytes;
  g_stream = stream;
  g_runs++;
  const int ok = fact_attention_can_implement(a);
  if (ok != FACT_OK) return ok;
  if (!workspace || workspace_bytes < fact_attention_workspace_size(a)) {
    return fail(FACT_WORKSPACE_TOO_SMALL, "workspace too small");
  }
  if (FAKE_MODE == SEGV) raise(SIGSEGV);
  if (FAKE_MODE == HANG) for (;;) pause();
  if (FAKE_MODE == RECORD) return FACT_OK;
  const elem_t* Q = (const elem_t*)a->q;
  const elem_t* K = (const elem_t*)a->k;
  const elem_t* V = (const elem_t*)a->v;
  elem_t* O = (elem_t*)a->o;
  float* lse = (float*)workspace;
  float* p = (float*)malloc(sizeof(float) * (size_t)a->seq_k);
  const int64_t group = a->heads / a->kv_heads;
  const float scale = FAKE_MODE == SQRT_SCALE ? 1.0f / sqrtf((float)a->head_dim) : a->scale;
  for (int64_t b = 0; b < a->batch; ++b) {
    for (int64_t h = 0; h < a->heads; ++h) {
      const int64_t hk = FAKE_MODE == GQA_MOD ? h % a->kv_heads : h / group;
      for (int64_t s = 0; s < a->seq_q; ++s) {
        const elem_t* q = Q + b * a->q_stride_b + h * a->q_stride_h + s * a->q_stride_s;
        const int64_t last = (FAKE_CAUSAL && FAKE_MODE != NO_MASK) ? s : a->seq_k - 1;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t <= last; ++t) {
          const elem_t* k = K + b * a->k_stride_b + hk * a->k_stride_h + t * a->k_stride_s;
          float dot = 0.0f;
          for (int64_t d = 0; d < a->head_dim; ++d) dot += load(q[d]) * load(k[d]);
          p[t] = dot * scale;
          if (p[t] > mx) mx = p[t];
        }
        for (int64_t t = 0; t <= last; ++t) {
          p[t] = expf(p[t] - mx);
          sum += p[t];
        }
        lse[(b * a->heads + h) * a->seq_q + s] = mx + logf(sum);
        elem_t* o = O + b * a->o_stride_b + h * a->o_stride_h + s * a->o_stride_s;
        for (int64_t d = 0; d < a->head_dim; ++d) {
          float acc = 0.0f;
          for (int64_t t = 0; t <= last; ++t) {
            acc += p[t] * load(V[b * a->v_stride_b + hk * a->v_stride_h + t * a->v_stride_s + d]);
          }
          float out = acc / sum;
          if (FAKE_MODE == WRONG) out += 0.5f;
          if (FAKE_MODE == SKIP_TAIL && s == a->seq_q - 1) continue;
          o[d] = store(out);
        }
      }
    }
  }
  free(p);
  return FACT_OK;
}
"""
FAKE_ATTENTION_C = _fake_source(FAKE_ATTENTION_C, "FactAttentionArgs")

ATTENTION_MODES = {
    "good": 0,
    "segv": 1,
    "wrong": 2,
    "skip_tail": 3,
    "not_supported": 4,
    "hang": 5,
    "record": 6,
    "gqa_mod": 7,  # query head h reads kv head h % kv_heads (interleaved, not grouped)
    "no_mask": 8,  # a causal kernel that forgets the mask
    "sqrt_scale": 9,  # 1/sqrt(head_dim) instead of the pattern's scale
}

# The attention pattern of `fact discover examples/minigpt_block.py --dtype bf16 --json`
# (estimates and search space left out): hand-written causal attention reading Q, K and V in
# place from the c_attn output, writing (b, s, h*d).
MINIGPT_ATTENTION = json.loads("""
{"family": "attention", "rule": "attention_handwritten",
 "anchors": ["softmax"], "epilogue": ["scale", "causal_mask", "softmax"],
 "attrs": {"causal": true, "dtype": "bf16", "k_source": "linear",
           "k_strides": [1179648, 96, 2304, 1], "out_dtype": "bf16", "out_layout": "bs(hd)",
           "q_source": "linear", "q_strides": [1179648, 96, 2304, 1],
           "scale": 0.10206207261596577, "softmax_dtype": "bf16", "v_source": "linear",
           "v_strides": [1179648, 96, 2304, 1]},
 "operands": [{"node": "linear", "role": "q", "type": "bf16[128, 512, 2304]"},
              {"node": "linear", "role": "k", "type": "bf16[128, 512, 2304]"},
              {"node": "linear", "role": "v", "type": "bf16[128, 512, 2304]"}],
 "output": "view_3",
 "problem": {"batch": 128, "head_dim": 96, "head_dim_v": 96, "heads": 8, "kv_heads": 8,
             "seq_k": 512, "seq_q": 512},
 "signature": "attention[scale+causal_mask+softmax]:bf16:causal"}
""")

# The same from examples/llama3_block.py: SDPA with grouped-query attention (32 heads, 8 kv).
LLAMA_ATTENTION = json.loads("""
{"family": "attention", "rule": "attention_sdpa",
 "anchors": ["scaled_dot_product_attention"], "epilogue": ["scale", "causal_mask", "softmax"],
 "attrs": {"causal": true, "dtype": "bf16", "k_source": "add_2",
           "k_strides": [2097152, 128, 1024, 1], "out_dtype": "bf16", "out_layout": "bs(hd)",
           "q_source": "add_1", "q_strides": [8388608, 128, 4096, 1],
           "scale": 0.08838834764831843, "softmax_dtype": "bf16", "v_source": "linear_2",
           "v_strides": [2097152, 128, 1024, 1]},
 "operands": [{"node": "add_1", "role": "q", "type": "bf16[4, 32, 2048, 128]"},
              {"node": "add_2", "role": "k", "type": "bf16[4, 8, 2048, 128]"},
              {"node": "linear_2", "role": "v", "type": "bf16[4, 2048, 1024]"}],
 "output": "view_3",
 "problem": {"batch": 4, "head_dim": 128, "head_dim_v": 128, "heads": 32, "kv_heads": 8,
             "seq_k": 2048, "seq_q": 2048},
 "signature": "attention[scale+causal_mask+softmax]:bf16:causal"}
""")

#: Small sizes for the fake kernels (they compute on the host).
ATT_SMALL = {"batch": 2, "heads": 4, "kv_heads": 2, "seq_q": 40, "seq_k": 40, "head_dim": 32}


def attention_pattern(causal=True, scale=None, dtype="bf16", fused=False, **sizes):
    """A hand-made attention pattern (ATT_SMALL's sizes unless given)."""
    problem = {**ATT_SMALL, **sizes}
    problem.setdefault("head_dim_v", problem["head_dim"])
    steps = ["scale", "causal_mask", "softmax"] if causal else ["scale", "softmax"]
    sources = ["qkv", "qkv", "qkv"] if fused else ["q", "k", "v"]
    return {
        "family": "attention",
        "rule": "attention_sdpa",
        "epilogue": steps,
        "attrs": {
            "causal": causal,
            "dtype": dtype,
            "out_dtype": dtype,
            "out_layout": "bs(hd)",
            "scale": scale if scale is not None else 1.0 / math.sqrt(problem["head_dim"]),
            **{f"{r}_source": s for r, s in zip("qkv", sources, strict=True)},
        },
        "problem": problem,
        "signature": f"attention[{'+'.join(steps)}]:{dtype}" + (":causal" if causal else ""),
    }


def attention_info(name: str, causal: bool = True, head_dim: int = 128, dtype: str = "bf16"):
    """What attention.cpp's kernel_info JSON says."""
    return {
        "family": "attention",
        "dtype": dtype,
        "causal": causal,
        "head_dim": head_dim,
        "config": {
            "name": f"{name}_cfg",
            "block_q": 128,
            "block_kv": 128,
            "schedule": "cooperative",
            "stages_kv": 5,
            "mma_warpgroups": 2,
            "mainloop_locked": False,
        },
    }


@pytest.fixture(scope="session")
def fake_attention(tmp_path_factory):
    """build(name, mode='good', causal=True, head_dim=128, info=None) -> a fake .so (cached)."""
    if GCC is None:
        pytest.skip("needs gcc")
    folder = tmp_path_factory.mktemp("fake_attention")
    built: dict[str, Path] = {}

    def build(name, mode="good", causal=True, head_dim=128, info=None):
        if name not in built:
            info = info or attention_info(name, causal, head_dim)
            flags = [
                f"-DFAKE_NAME={json.dumps(name)}",
                f"-DFAKE_MODE={ATTENTION_MODES[mode]}",
                f"-DFAKE_CAUSAL={int(causal)}",
                f"-DFAKE_HEAD_DIM={head_dim}",
                f"-DFAKE_INFO={json.dumps(json.dumps(info))}",
            ]
            built[name] = compile_c(FAKE_ATTENTION_C, folder / f"{name}.so", *flags, shared=True)
        return built[name]

    return build


def test_attention_library_end_to_end(fake_attention):
    lib = KernelLibrary(fake_attention("att_recorder", mode="record"))
    assert lib.family == "attention" and lib.name == "att_recorder"
    assert lib.info["config"]["name"] == "att_recorder_cfg"
    args = FactAttentionArgs()
    sizes = (3, 32, 8, 500, 777, 128)
    args.batch, args.heads, args.kv_heads, args.seq_q, args.seq_k, args.head_dim = sizes
    strides = iter(range(1000, 1012))
    for r, ptr in zip("qkvo", (0x1000, 0x2000, 0x3000, 0x4000), strict=True):
        setattr(args, r, ptr)
        for dim in "bhs":
            setattr(args, f"{r}_stride_{dim}", next(strides) << 20)  # beyond 32 bits
    args.scale, args.sm_count = 0.125, 132
    assert lib.attention_can_implement(args) == Status.OK
    assert lib.attention_workspace_size(args) == 3 * 32 * 500 * 4
    assert lib.attention_run(args, 0xABC0, 1 << 20, 0xDEF0) == Status.OK
    seen = FactAttentionArgs()
    ws, nbytes, stream, runs = (
        ctypes.c_void_p(),
        ctypes.c_size_t(),
        ctypes.c_void_p(),
        ctypes.c_int(),
    )
    lib.symbol("fake_last_call")(
        ctypes.byref(seen), ctypes.byref(ws), ctypes.byref(nbytes), ctypes.byref(stream),
        ctypes.byref(runs),
    )  # fmt: skip
    assert seen.to_dict() == args.to_dict()  # every field crossed the boundary intact
    assert seen.to_dict()["o_stride_s"] == 1011 << 20 and seen.scale == 0.125
    assert (ws.value, nbytes.value, stream.value, runs.value) == (0xABC0, 1 << 20, 0xDEF0, 1)
    args.seq_q = 7
    assert lib.attention_can_implement(args) == Status.NOT_SUPPORTED
    assert "cannot implement" in lib.last_error()
    assert lib.attention_run(args, None, 0, None) == Status.NOT_SUPPORTED


def test_attention_library_family_checks(fake_attention, fake_kernels):
    gemm = KernelLibrary(fake_kernels("gelu_good", MINIGPT_GELU, epi=2))
    with pytest.raises(abi.AbiError, match="a gemm kernel library has no fact_attention_run"):
        gemm.attention_run(FactAttentionArgs())
    # attention entry points, but the info names another family: refused at load
    liar = fake_attention("att_liar", info={"family": "gemm"})
    with pytest.raises(abi.AbiError, match="says family 'gemm'"):
        KernelLibrary(liar)


def test_attention_spec_from_plan_patterns():
    from fact.tune.attention import AttentionSpec

    mini = AttentionSpec.from_pattern(MINIGPT_ATTENTION)
    assert (mini.dtype, mini.causal, mini.fused_qkv, mini.out_layout) == (
        "bf16", True, True, "bs(hd)")  # fmt: skip
    assert mini.scale == pytest.approx(1 / math.sqrt(96))
    assert mini.problem == MINIGPT_ATTENTION["problem"] and mini.group == 1
    assert mini.signature == MINIGPT_ATTENTION["signature"]
    llama = AttentionSpec.from_pattern(LLAMA_ATTENTION)
    assert not llama.fused_qkv and llama.group == 4 and llama.head_dim == 128
    assert llama.label == "b4_h32_kv8_q2048_k2048_d128"
    # a problem override: only attention sizes count; head_dim alone sets head_dim_v too
    small = AttentionSpec.from_pattern(LLAMA_ATTENTION, {"seq_q": 500, "seq_k": 500, "m": 3})
    assert (small.seq_q, small.seq_k, small.heads) == (500, 500, 32)
    assert "m" not in small.problem
    assert small.with_problem({"head_dim": 64}).problem["head_dim_v"] == 64
    assert small.with_problem(None) == small
    with pytest.raises(FactError, match="seq_q=0 must be an integer >= 1"):
        small.with_problem({"seq_q": 0})


def _changed(pattern: dict, **changes) -> dict:
    out = json.loads(json.dumps(pattern))
    for key, value in changes.items():
        where, name = key.split("__")
        if value is None:
            out[where].pop(name)
        else:
            out[where][name] = value
    return out


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"problem__head_dim_v": 64}, "value head dim 64 differs from the query's 96"),
        ({"attrs__dtype": "f8", "attrs__out_dtype": "f8"}, "attention in 'f8'"),
        ({"attrs__out_dtype": "f32"}, "attention output in 'f32' from 'bf16'"),
        ({"problem__kv_heads": 3}, "heads 8 is not a multiple of kv_heads 3"),
        ({"attrs__scale": None}, "without a positive constant softmax scale"),
        ({"attrs__scale": -0.5}, "without a positive constant softmax scale"),
        ({"attrs__out_layout": "sbhd"}, "output layout 'sbhd'"),
    ],
)
def test_attention_spec_refusals(changes, why):
    from fact.tune.attention import AttentionSpec

    with pytest.raises(NotSupportedError, match=re.escape(why)):
        AttentionSpec.from_pattern(_changed(MINIGPT_ATTENTION, **changes))


def test_attention_kernel_info_math_follows_the_precision():
    """A TF32 kernel (the sm80 kernel under "high") does not fit a pattern tuned under "highest";
    a 3xTF32 one fits any precision."""
    from fact.tune.attention import AttentionSpec, check_kernel_info

    spec = AttentionSpec.from_pattern(
        _changed(MINIGPT_ATTENTION, attrs__dtype="f32", attrs__out_dtype="f32")
    )
    info = {"family": "attention", "dtype": "f32", "causal": True, "head_dim": 96}
    assert check_kernel_info({**info, "math": "tf32"}, spec, "high") == []
    assert check_kernel_info({**info, "math": "tf32"}, spec) == []  # no precision: not checked
    (why,) = check_kernel_info({**info, "math": "tf32"}, spec, "highest")
    assert "fp32-accurate" in why
    for precision in ("highest", "high", "medium"):
        assert check_kernel_info({**info, "math": "3xtf32"}, spec, precision) == []


def test_attention_spec_refuses_other_families_and_steps():
    from fact.tune.attention import AttentionSpec

    with pytest.raises(NotSupportedError, match="family 'gemm' is not attention"):
        AttentionSpec.from_pattern(MINIGPT_GELU)
    bad = {**MINIGPT_ATTENTION, "epilogue": ["scale", "causal_mask", "softmax", "alibi"]}
    with pytest.raises(NotSupportedError, match=r"step\(s\) \['alibi'\]"):
        AttentionSpec.from_pattern(bad)
    with pytest.raises(NotSupportedError, match="heads 8 is not a multiple of kv_heads 3"):
        AttentionSpec.from_pattern(MINIGPT_ATTENTION, {"kv_heads": 3})
    # the harness (and `fact tune`, and optimize's tune_run) tunes attention besides GEMMs
    from fact.tune.reference import GEMM_FAMILIES

    assert set(harness.TUNED_FAMILIES) == {*GEMM_FAMILIES, "attention"}


def _naive_attention(q, k, v, scale, causal):
    """Row by row in float64, the way the ABI header words it."""
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    group = h // hk
    out = torch.zeros(b, h, sq, v.shape[-1], dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    for bi in range(b):
        for hi in range(h):
            kh = hi // group
            for s in range(sq):
                keys = range(min(s + 1, sk)) if causal else range(sk)
                logits = torch.stack([scale * torch.dot(q[bi, hi, s], k[bi, kh, t]) for t in keys])
                p = torch.exp(logits - logits.max())
                p = p / p.sum()
                out[bi, hi, s] = sum(p[i] * v[bi, kh, t] for i, t in enumerate(keys))
    return out


@pytest.mark.parametrize(
    ("sizes", "causal", "scale"),
    [
        ({"heads": 4, "kv_heads": 4, "seq_q": 9, "seq_k": 9}, True, None),
        ({"heads": 6, "kv_heads": 2, "seq_q": 5, "seq_k": 11}, True, None),  # GQA, seq_q < seq_k
        ({"heads": 4, "kv_heads": 1, "seq_q": 7, "seq_k": 13}, False, 0.7),
        ({"heads": 2, "kv_heads": 2, "seq_q": 12, "seq_k": 12}, False, None),
    ],
    ids=["mha-causal", "gqa-causal-short-q", "mqa-scale", "mha"],
)
def test_attention_reference_matches_naive(sizes, causal, scale):
    from fact.tune.attention import AttentionSpec, make_inputs, reference

    pattern = attention_pattern(causal=causal, scale=scale, batch=2, head_dim=16, **sizes)
    spec = AttentionSpec.from_pattern(pattern)
    inputs = make_inputs(spec, "cpu")
    ref = reference(spec, inputs.q, inputs.k, inputs.v)
    assert ref.dtype == torch.float64 and ref.shape == inputs.o.shape
    naive = _naive_attention(inputs.q, inputs.k, inputs.v, spec.scale, causal)
    torch.testing.assert_close(ref, naive, rtol=1e-12, atol=1e-12)
    # PyTorch's SDPA in float64 agrees (top-left causal mask, grouped heads)
    sdpa = F.scaled_dot_product_attention(
        inputs.q.double(), inputs.k.double(), inputs.v.double(), is_causal=causal,
        scale=spec.scale, enable_gqa=spec.group > 1,
    )  # fmt: skip
    torch.testing.assert_close(ref, sdpa, rtol=1e-10, atol=1e-12)
    # chunked to one head at a time, and in float32: the same numbers
    tiny = reference(spec, inputs.q, inputs.k, inputs.v, budget_bytes=1)
    torch.testing.assert_close(tiny, ref, rtol=0, atol=0)
    f32 = reference(spec, inputs.q, inputs.k, inputs.v, dtype=torch.float32)
    assert f32.dtype == torch.float32
    torch.testing.assert_close(f32.double(), ref, rtol=1e-5, atol=1e-6)


def test_attention_reference_chunks_over_batch_and_heads():
    from fact.tune.attention import AttentionSpec, make_inputs, reference

    spec = AttentionSpec.from_pattern(attention_pattern(batch=5, heads=6, kv_heads=3, seq_q=16,
                                                        seq_k=16, head_dim=8))  # fmt: skip
    inputs = make_inputs(spec, "cpu")
    full = reference(spec, inputs.q, inputs.k, inputs.v)
    per_head = 2 * 16 * 16 * 8
    for budget in (per_head, 4 * per_head, 6 * per_head, 13 * per_head):  # heads, batches
        out = reference(spec, inputs.q, inputs.k, inputs.v, budget_bytes=budget)
        torch.testing.assert_close(out, full, rtol=0, atol=0)


def test_attention_inputs_layouts():
    from fact.tune.attention import AttentionSpec, make_inputs

    spec = AttentionSpec.from_pattern(MINIGPT_ATTENTION, {"batch": 2, "seq_q": 24, "seq_k": 24})
    inputs = make_inputs(spec, "cpu")  # the plan's layout: one fused QKV buffer
    b, s, h, d = 2, 24, 8, 96
    for t in (inputs.q, inputs.k, inputs.v, inputs.o):
        assert t.shape == (b, h, s, d) and t.dtype == torch.bfloat16 and t.stride(-1) == 1
    assert inputs.q.stride() == (s * 3 * h * d, d, 3 * h * d, 1)
    assert inputs.k.data_ptr() - inputs.q.data_ptr() == h * d * 2
    assert inputs.v.data_ptr() - inputs.k.data_ptr() == h * d * 2
    assert inputs.o.stride() == (s * h * d, d, h * d, 1) and torch.isnan(inputs.o).all()
    assert not torch.isnan(inputs.q.float()).any()
    # separate projections (B, S, H, D) each, GQA
    gqa = AttentionSpec.from_pattern(LLAMA_ATTENTION, {"batch": 1, "seq_q": 16, "seq_k": 16})
    sep = make_inputs(gqa, "cpu")
    assert sep.q.stride() == (16 * 32 * 128, 128, 32 * 128, 1)
    assert sep.k.shape == (1, 8, 16, 128) and sep.k.stride() == (16 * 8 * 128, 128, 8 * 128, 1)
    assert sep.k.untyped_storage().data_ptr() != sep.v.untyped_storage().data_ptr()
    fused = make_inputs(gqa, "cpu", layout="fused")  # (B, S, H + 2 Hk, D)
    assert fused.k.stride() == (16 * 48 * 128, 128, 48 * 128, 1)
    assert fused.v.data_ptr() - fused.q.data_ptr() == 40 * 128 * 2
    # fresh values every call; a seed replays them
    again = make_inputs(spec, "cpu")
    assert again.seed != inputs.seed and not torch.equal(again.q, inputs.q)
    replay = make_inputs(spec, "cpu", seed=inputs.seed)
    assert torch.equal(replay.q, inputs.q) and torch.equal(replay.v, inputs.v)
    bhsd = make_inputs(AttentionSpec.from_pattern(
        _changed(MINIGPT_ATTENTION, attrs__out_layout="bhsd"), {"batch": 1, "seq_q": 8,
                                                                 "seq_k": 8}), "cpu")  # fmt: skip
    assert bhsd.o.is_contiguous() and bhsd.o.shape == (1, 8, 8, 96)


# MiniGPT's attention in fp32 after fact.layouts: V is a view of the V^T projection's output
MINIGPT_ATTENTION_VT = _changed(
    MINIGPT_ATTENTION, attrs__dtype="f32", attrs__out_dtype="f32", attrs__softmax_dtype="f32",
    attrs__q_strides=[786432, 96, 1536, 1], attrs__k_strides=[786432, 96, 1536, 1],
    attrs__v_source="addmm", attrs__v_strides=[512, 6291456, 1, 65536],
)  # fmt: skip


class _RecordingAttentionLibrary:
    """Stands in for an attention kernel library on the CPU: runs record the V they were given
    (pointer and values) instead of launching anything."""

    family = "attention"
    name = "fmha_recording"

    def __init__(self, **info):
        self.info = {"family": "attention", **info}
        self.runs = []

    def attention_workspace_size(self, args):
        return 0

    def attention_run(self, args, ptr, nbytes, stream):
        self.runs.append(args.v)
        return 0


def test_attention_tuner_makes_v_as_the_plan_lays_it_out():
    """A plan whose V has its keys contiguous (a projection wrote V^T) is tuned on such a V: the
    TF32 Hopper kernels read it in place; any other kernel reads a copy with the head dim
    contiguous, made on every call as fact::attention makes it (so its time includes it)."""
    from fact.tune.attention import AttentionSpec, _Launch, make_inputs, v_keys_contiguous

    assert not AttentionSpec.from_pattern(MINIGPT_ATTENTION).v_keys
    spec = AttentionSpec.from_pattern(MINIGPT_ATTENTION_VT, {"batch": 2, "seq_q": 8, "seq_k": 8})
    assert spec.v_keys and spec.fused_qk and not spec.fused_qkv
    inputs = make_inputs(spec, "cpu")
    b, s, h, d = 2, 8, 8, 96
    assert inputs.v.shape == (b, h, s, d) and v_keys_contiguous(inputs.v)
    assert inputs.v.stride() == (s, d * b * s, 1, b * s)  # (H * D, B * S) row-major, viewed
    # q and k: one linear over the rest of the weight, (B, S, 2 H, D), as the plan has them
    plan = MINIGPT_ATTENTION_VT["attrs"]
    for t, name in ((inputs.q, "q"), (inputs.k, "k")):
        assert list(t.stride()) == [s * 2 * h * d] + plan[f"{name}_strides"][1:], name
    assert inputs.k.data_ptr() - inputs.q.data_ptr() == h * d * 4
    # a kernel that reads V so: in place, its head-dim stride in the args
    reads = _RecordingAttentionLibrary(v_keys_contiguous=True)
    launch = _Launch(reads, inputs.q, inputs.k, inputs.v, inputs.o, spec.scale, copy_v=True)
    launch()
    assert reads.runs == [inputs.v.data_ptr()]
    assert (launch.args.v_stride_s, launch.args.v_stride_d) == (1, b * s)
    # any other kernel: in the tuner's launches a head-dim-contiguous copy, refreshed on every
    # call; in a plain launch (run_kernel) V as it is (the kernel refuses it)
    other = _RecordingAttentionLibrary()
    plain = _Launch(other, inputs.q, inputs.k, inputs.v, inputs.o, spec.scale)
    assert plain.tensors[2] is inputs.v and plain.args.v_stride_d == b * s
    launch = _Launch(other, inputs.q, inputs.k, inputs.v, inputs.o, spec.scale, copy_v=True)
    copy = launch.tensors[2]
    assert copy.is_contiguous() and copy.data_ptr() != inputs.v.data_ptr()
    assert launch.args.v_stride_s == d
    inputs.v.fill_(3.0)
    launch()
    assert other.runs == [copy.data_ptr()] and torch.equal(copy, inputs.v)


def test_attention_args_for_the_fused_qkv_view():
    """MiniGPT's Q, K, V are views of the c_attn output: the args carry the plan's strides and
    pointers a head block apart; the output is written as (b, s, h*d)."""
    from fact.tune.attention import AttentionSpec, args_for, make_inputs

    spec = AttentionSpec.from_pattern(MINIGPT_ATTENTION, {"batch": 2})
    inputs = make_inputs(spec, "cpu")
    args = args_for(inputs.q, inputs.k, inputs.v, inputs.o, spec.scale, sm_count=132)
    plan = MINIGPT_ATTENTION["attrs"]
    for r in "qkv":
        got = [getattr(args, f"{r}_stride_{x}") for x in "bhs"]
        assert got == plan[f"{r}_strides"][:3], r
    assert (args.o_stride_b, args.o_stride_h, args.o_stride_s) == (512 * 768, 96, 768)
    assert args.k - args.q == 768 * 2 and args.v - args.k == 768 * 2
    assert args.o == inputs.o.data_ptr()
    assert (args.batch, args.heads, args.kv_heads, args.seq_q, args.seq_k, args.head_dim) == (
        2, 8, 8, 512, 512, 96)  # fmt: skip
    assert args.scale == pytest.approx(spec.scale) and args.sm_count == 132
    # what the ABI cannot express is refused before a kernel sees it
    q, k, v, o = inputs.q, inputs.k, inputs.v, inputs.o
    with pytest.raises(FactError, match="head dim must be contiguous"):
        args_for(q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3), o.transpose(2, 3), 1.0)
    with pytest.raises(FactError, match="must be q's shape"):
        args_for(q, k, v, o[:, :4], 1.0)
    with pytest.raises(FactError, match="is not a multiple of 3 key/value heads"):
        args_for(q, k[:, :3], v[:, :3], o, 1.0)
    with pytest.raises(FactError, match="is torch.float32"):
        args_for(q, k, v.float(), o, 1.0)
    assert args.v_stride_d == 0  # V's head dim contiguous: ABI version 4's default


def test_attention_args_for_v_with_its_keys_contiguous():
    """V as a projection that writes V^T leaves it, (heads*dim, batch*seq) row-major: keys
    contiguous, so v_stride_s is 1 and v_stride_d carries the head-dim stride; q and k still need
    their head dim contiguous, and a V contiguous in neither is refused."""
    from fact.compose.ops import AttentionKernel, _reads_v_keys_contiguous
    from fact.tune.attention import args_for, v_keys_contiguous

    b, h, s, d = 2, 3, 16, 8
    q = torch.randn(b, h, s, d)
    vt = torch.randn(h * d, b * s)
    v = vt.view(h, d, b, s).permute(
        2, 0, 3, 1
    )  # (b, h, s, d): v[b, h, t, e] = vt[h*d + e, b*s + t]
    assert v.shape == q.shape and v_keys_contiguous(v) and not v_keys_contiguous(q)
    assert not v_keys_contiguous(torch.randn(b, h, s, 1).expand(b, h, s, d))  # head-dim stride 0
    args = args_for(q, q, v, torch.empty_like(q), 1.0)
    assert (args.v_stride_b, args.v_stride_h, args.v_stride_s, args.v_stride_d) == (
        s,
        d * b * s,
        1,
        b * s,
    )
    assert args.v == vt.data_ptr() and args.k_stride_s == d
    strided = torch.randn(b, h, d, s, 2)[..., 0].permute(0, 1, 3, 2)  # keys and dims 2 apart
    with pytest.raises(FactError, match="head dim must be contiguous or, for v, the keys"):
        args_for(q, q, strided, q, 1.0)
    with pytest.raises(FactError, match=r"attention k: the head dim must be contiguous \(shape"):
        args_for(q, v, v, q, 1.0)

    class Library:
        def __init__(self, info):
            self.info = info

    def entry(info):
        return AttentionKernel(True, 1.0, torch.float32, "cutlass", library=Library(info))

    assert _reads_v_keys_contiguous(entry({"math": "tf32", "v_keys_contiguous": True}))
    assert not _reads_v_keys_contiguous(entry({"dtype": "bf16"}))
    assert not _reads_v_keys_contiguous(AttentionKernel(True, 1.0, torch.float32, "reference"))


def test_attention_tolerance():
    assert tolerance(MINIGPT_ATTENTION, "highest") == tolerance(LLAMA_ATTENTION, "medium")
    assert tolerance(MINIGPT_ATTENTION) == harness.TOL_ATTENTION == 1e-2
    # f32 attention (the sm80 kernel: TF32 or 3xTF32 MMAs) takes its precision's f32 threshold
    f32 = _changed(MINIGPT_ATTENTION, attrs__dtype="f32", attrs__out_dtype="f32")
    assert tolerance(f32, "highest") == harness.TOL_F32_HIGHEST
    assert tolerance(f32, "high") == harness.TOL_F32_TF32
    assert tolerance(f32, "medium") == harness.TOL_F32_TF32  # the same TF32 kernel as "high"
    with pytest.raises(NotSupportedError):
        tolerance(_changed(MINIGPT_ATTENTION, attrs__dtype="f8", attrs__out_dtype="f8"))
    with pytest.raises(FactError, match="precision"):
        tolerance(MINIGPT_ATTENTION, "low")


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to TF32 (10 mantissa bits, to nearest), as a tensor core reads fp32 operands."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).to(x.dtype)


def test_attention_tolerance_is_sensible_for_tf32():
    """Attention with both GEMMs in TF32 (operands rounded, float64 accumulation) sits well
    inside the f32 threshold of precision "high"; a wrong causal mask is far out."""
    from fact.tune.attention import AttentionSpec, make_inputs, reference

    f32 = _changed(MINIGPT_ATTENTION, attrs__dtype="f32", attrs__out_dtype="f32")
    sizes = {"batch": 1, "heads": 2, "kv_heads": 2, "seq_q": 256, "seq_k": 256}
    spec = AttentionSpec.from_pattern(f32, sizes)
    inputs = make_inputs(spec, "cpu", seed=3)
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    ref = reference(spec, inputs.q, inputs.k, inputs.v)
    tol = tolerance(spec, "high")

    def attention(mask_offset: int) -> torch.Tensor:
        scores = _tf32(q) @ _tf32(k).transpose(-2, -1) * spec.scale
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool).tril(mask_offset)
        p = torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1)
        return _tf32(p) @ _tf32(v)

    tf32, _ = rel_err(attention(0), ref)
    assert 1e-4 < tf32 < tol / 2, tf32
    off_by_one, _ = rel_err(attention(1), ref)
    assert off_by_one > 10 * tol


def test_attention_tolerance_is_sensible_for_bf16():
    """PyTorch's SDPA in bf16 (and rounding the exact result to bf16) sit well inside the
    tolerance; an off-by-one causal mask, a wrong scale or a wrong head mapping are far out."""
    from fact.tune.attention import AttentionSpec, make_inputs, pytorch_attention, reference

    spec = AttentionSpec.from_pattern(LLAMA_ATTENTION, {"batch": 1, "seq_q": 256, "seq_k": 256})
    inputs = make_inputs(spec, "cpu", seed=1)
    ref = reference(spec, inputs.q, inputs.k, inputs.v)
    tol = tolerance(spec)
    rounded, _ = rel_err(ref.to(torch.bfloat16), ref)
    sdpa, _ = rel_err(pytorch_attention(spec, inputs.q, inputs.k, inputs.v), ref)
    assert 5e-4 < rounded < 3e-3 and 5e-4 < sdpa < 4e-3 and 2 * sdpa < tol
    q, k, v = inputs.q, inputs.k, inputs.v
    off_by_one = torch.ones(256, 256, dtype=torch.bool).tril(1)  # sees one key too many
    wrong = [
        F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=off_by_one,
                                       scale=spec.scale, enable_gqa=True),
        F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                       scale=1.1 * spec.scale, enable_gqa=True),
        F.scaled_dot_product_attention(q.double(), k.repeat(1, 4, 1, 1).double(),
                                       v.repeat(1, 4, 1, 1).double(), is_causal=True,
                                       scale=spec.scale),
    ]  # fmt: skip
    for out in wrong:
        assert rel_err(out, ref)[0] > 3 * tol


def _att_candidate(path, name=None):
    return {"kernel": name, "library": str(path), "config": None}


def test_evaluate_attention_kernel_with_fakes(fake_attention):
    from fact.tune.attention import evaluate_attention_kernel

    pattern = attention_pattern(causal=True)
    kw = dict(device="cpu", problem=None, precision="highest")
    good = evaluate_attention_kernel(_att_candidate(fake_attention("att_good")), pattern, **kw)
    assert good["disposition"] == "passed", good["message"]
    assert good["kernel"] == "att_good" and good["config"]["name"] == "att_good_cfg"
    assert 0 < good["error"] < 5e-3 and good["time_us"] > 0 and good["knobs"] == {}
    assert good["problem"] == pattern["problem"] and good["signature"] == pattern["signature"]
    assert good["verify"]["max_rel_err"]["b2_h4_kv2_q40_k40_d32"] < 1e-2
    for mode in ("wrong", "gqa_mod", "no_mask", "skip_tail"):
        row = evaluate_attention_kernel(
            _att_candidate(fake_attention(f"att_{mode}", mode)), pattern, **kw
        )
        assert row["disposition"] == "incorrect", (mode, row)
        assert row["time_us"] is None and "rel_err" in row["message"] and "seed" in row["message"]
        if mode == "skip_tail":
            assert "NaN/Inf" in row["message"]
    # a non-default scale reaches the kernel (the sqrt_scale fake would pass otherwise)
    scaled = attention_pattern(causal=False, scale=0.3)
    row = evaluate_attention_kernel(
        _att_candidate(fake_attention("att_plain", causal=False)), scaled, **kw
    )
    assert row["disposition"] == "passed", row["message"]
    row = evaluate_attention_kernel(
        _att_candidate(fake_attention("att_plain_sqrt", "sqrt_scale", causal=False)), scaled, **kw
    )
    assert row["disposition"] == "incorrect"


def test_evaluate_attention_kernel_refusals(fake_attention, fake_kernels):
    from fact.tune.attention import evaluate_attention_kernel

    pattern = attention_pattern(causal=True)
    kw = dict(device="cpu")
    refuses = evaluate_attention_kernel(
        _att_candidate(fake_attention("att_refuses", "not_supported")), pattern, **kw
    )
    assert refuses["disposition"] == "not_supported"
    assert "NOT_SUPPORTED: fake: cannot implement" in refuses["message"]
    # a non-causal kernel for a causal pattern, a kernel for smaller heads, a GEMM kernel
    for path, why in [
        (fake_attention("att_plain", causal=False), "causal: kernel False, pattern True"),
        (fake_attention("att_d16", head_dim=16), "head_dim: kernel serves up to 16"),
        (fake_kernels("gelu_good", MINIGPT_GELU, epi=2), "a gemm kernel library"),
    ]:
        row = evaluate_attention_kernel(_att_candidate(path), pattern, **kw)
        assert row["disposition"] == "not_supported" and why in row["message"], row["message"]
    missing = evaluate_attention_kernel(_att_candidate("/nonexistent/k.so", "gone"), pattern, **kw)
    assert missing["disposition"] == "not_supported" and missing["kernel"] == "gone"
    # later shapes the kernel cannot implement are skipped (the fake refuses seq_q == 7)
    good = evaluate_attention_kernel(
        _att_candidate(fake_attention("att_good")), pattern,
        shapes=[{"seq_q": 7, "seq_k": 7}, {"seq_q": 23, "seq_k": 57}], **kw,
    )  # fmt: skip
    assert good["disposition"] == "passed", good["message"]
    assert list(good["verify"]["skipped"]) == ["b2_h4_kv2_q7_k7_d32"]
    assert set(good["verify"]["rel_err"]) == {"b2_h4_kv2_q40_k40_d32", "b2_h4_kv2_q23_k57_d32"}
    # but the problem itself must run
    row = evaluate_attention_kernel(
        _att_candidate(fake_attention("att_good")), pattern, problem={"seq_q": 7, "seq_k": 7}, **kw
    )
    assert row["disposition"] == "not_supported" and row["problem"]["seq_q"] == 7


def test_run_kernel_and_its_errors(fake_attention):
    from fact.tune.attention import AttentionSpec, make_inputs, reference, run_kernel

    spec = AttentionSpec.from_pattern(attention_pattern(fused=True))
    inputs = make_inputs(spec, "cpu")
    run_kernel(fake_attention("att_good"), inputs.q, inputs.k, inputs.v, inputs.o, spec)
    err, _ = rel_err(inputs.o, reference(spec, inputs.q, inputs.k, inputs.v))
    assert err < 5e-3
    with pytest.raises(abi.KernelStatusError, match=r"kernel att_refuses .*NOT_SUPPORTED: fake"):
        run_kernel(
            fake_attention("att_refuses", "not_supported"), inputs.q, inputs.k, inputs.v,
            inputs.o, spec,
        )  # fmt: skip
    small = torch.empty(16, dtype=torch.uint8)
    with pytest.raises(FactError, match="workspace of 16 bytes, it needs 1280"):
        run_kernel(fake_attention("att_good"), inputs.q, inputs.k, inputs.v, inputs.o, spec, small)


def test_harness_dispatches_attention_in_process(fake_attention):
    """evaluate_kernel / evaluate_pytorch / verify take the attention path for attention
    patterns (the GEMM path would refuse them: no dtype_a)."""
    from fact.tune.harness import evaluate_kernel, evaluate_pytorch

    pattern = attention_pattern(causal=True)
    steps = []  # the watchdog's progress reports
    row = evaluate_kernel(
        _att_candidate(fake_attention("att_good")), pattern, knobs_list=[DEFAULT_KNOBS],
        device="cpu", problem={"seq_q": 24, "seq_k": 24}, on_progress=steps.append,
    )  # fmt: skip
    assert row["disposition"] == "passed", row["message"]
    assert row["problem"] == {**pattern["problem"], "seq_q": 24, "seq_k": 24}
    assert steps == ["verified"]
    torch_row = evaluate_pytorch(pattern, device="cpu", on_progress=steps.append)
    assert steps == ["verified", "verified"]
    assert torch_row["kernel"] == "pytorch" and torch_row["disposition"] == "passed"
    assert torch_row["config"] == {"name": "pytorch"} and torch_row["library"] is None
    assert 0 < torch_row["error"] < 5e-3 and torch_row["time_us"] > 0
    result = verify(fake_attention("att_gqa_mod", "gqa_mod"), pattern, device="cpu")
    assert result["disposition"] == "incorrect" and not result["ok"]


def test_tune_attention_isolates_faults(fake_attention):
    pattern = attention_pattern(causal=True, fused=True)
    good = fake_attention("att_good")
    libraries = [
        {"kernel": "good", "library": good, "config": {"name": "good_cfg"}},
        fake_attention("att_segv", "segv"),
        fake_attention("att_wrong", "wrong"),
        fake_attention("att_refuses", "not_supported"),
        str(good),
    ]
    details: dict = {}
    rows = tune(pattern, libraries, "high", device="cpu", details=details)
    assert [(r["kernel"], r["disposition"]) for r in rows] == [
        ("pytorch", "passed"),
        ("good", "passed"),
        ("att_segv", "fault"),
        ("att_wrong", "incorrect"),
        ("att_refuses", "not_supported"),
        ("att_good", "passed"),  # after the segfault, in a fresh worker
    ]
    assert details["workers"] == 2
    assert "SIGSEGV" in rows[2]["message"] and rows[2]["problem"] == pattern["problem"]
    for r in rows:
        assert r["signature"] == pattern["signature"] and r["problem"] == pattern["problem"]
    assert rows[1]["time_us"] > 0 and rows[1]["knobs"] == {} and rows[1]["error"] < 5e-3
    assert rows[5]["config"]["name"] == "att_good_cfg"
    export = registry_export(rows)["rows"]
    assert [r["disposition"] for r in export] == [
        "passed", "fault", "incorrect", "not_supported", "passed"]  # fmt: skip
    with pytest.raises(NotSupportedError, match="heads 4 is not a multiple of kv_heads 3"):
        tune(pattern, [good], problem={"kv_heads": 3}, device="cpu")


def test_cli_tunes_attention_patterns(fake_attention, fake_kernels, tmp_path):
    """The CLI over a plan with an attention and a GEMM pattern and a folder of kernels: each
    kernel is matched to its pattern by its info and tuned there."""
    folder = tmp_path / "cache"
    for name, path in [
        ("a", fake_attention("att_good")),
        ("b", fake_attention("att_plain", causal=False)),  # serves no pattern of the plan
        ("c", fake_kernels("gelu_good", MINIGPT_GELU, epi=2)),
    ]:
        (folder / name).mkdir(parents=True)
        shutil.copy(path, folder / name / "kernel.so")
    plan = _plan_with(MINIGPT_GELU, SMALL)
    plan["patterns"][0] = attention_pattern(causal=True)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    entries = scan_kernels(folder, plan)
    assert [(e["pattern_index"], e["kernel"]) for e in entries] == [
        (0, "att_good"),
        (1, "gelu_good"),
    ]
    out, export = tmp_path / "results.json", tmp_path / "export.json"
    cmd = [sys.executable, "-m", "fact.tune.harness", str(tmp_path / "plan.json"), "--kernels",
           str(folder), "--out", str(out), "--export", str(export), "--device", "cpu", "--knobs",
           "default", "--shapes", json.dumps(SMALL_SHAPES)]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=REPO,
        env={**_env(), "PYTHONPATH": str(REPO / "python")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["pattern_index"], r["kernel"], r["disposition"]) for r in rows] == [
        (0, "pytorch", "passed"),
        (0, "att_good", "passed"),
        (1, "pytorch", "passed"),
        (1, "gelu_good", "passed"),
    ]
    assert rows[1]["problem"] == plan["patterns"][0]["problem"] and rows[1]["knobs"] == {}
    doc = json.loads(export.read_text())
    assert [r["config"]["name"] for r in doc["rows"]] == ["att_good_cfg", "gelu_good_cfg"]
    engine = REPO / "build" / "fact-engine"
    if engine.exists():  # the engine takes attention rows as they are
        imp = subprocess.run(
            [engine, "registry", "--registry", str(tmp_path / "r.db"), "import", str(export)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert imp.returncode == 0, imp.stderr


def _measures(pattern: dict) -> dict:
    """A manifest entry's "measures", as realize writes it for a kernel of `pattern`."""
    return {k: pattern[k] for k in ("family", "signature", "problem")}


def test_tune_run_tunes_a_kernel_shared_by_two_patterns_for_each(
    engine_available, fake_attention, tmp_path
):
    """Two patterns of one signature but different sizes rank the same configs, so realize lists
    the same kernel for both. Each pattern gets its own tuning row at its own problem (keyed by
    pattern and kernel, not kernel alone, which once tuned the second pattern's entries twice
    and left the first with no verified kernel)."""
    from fact.engine import run_engine
    from fact.tune.runs import tune_run

    run = tmp_path / "run"
    (run / "lib").mkdir(parents=True)
    short = attention_pattern(causal=True)
    longer = attention_pattern(causal=True, seq_q=96, seq_k=96)
    assert short["signature"] == longer["signature"] and short["problem"] != longer["problem"]
    (run / "plan.json").write_text(json.dumps({"arch": "sm90", "patterns": [short, longer]}))
    shutil.copy(fake_attention("att_good"), run / "lib" / "good.so")
    manifest = [
        {"pattern_index": i, "family": "attention", "kernel": "good", "status": "compiled",
         "library": "lib/good.so", "config": attention_info("good")["config"],
         "measures": _measures(p)}
        for i, p in enumerate((short, longer))
    ]  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest))
    registry = ["--registry", str(tmp_path / "r.db")]
    seed = tmp_path / "seed.json"  # a registry that exists (an empty one), as after setup
    seed.write_text(json.dumps({"fact_registry_export": 1, "schema_version": 2, "rows": []}))
    run_engine(["registry", "import", str(seed), *registry])
    best = tune_run(run, "highest", registry=registry, device="cpu")
    assert sorted(best) == [0, 1]
    for index in (0, 1):
        assert [(r["kernel"], r.get("source")) for r in best[index]] == [
            ("good", "tuned"),
            ("pytorch", None),
        ]
    rows = json.loads((run / "results.json").read_text())["rows"]
    problems = {r["pattern_index"]: r["problem"] for r in rows if r["kernel"] == "good"}
    assert problems == {0: short["problem"], 1: longer["problem"]}


def test_tune_run_tunes_repeated_patterns_once(engine_available, fake_attention, tmp_path):
    """The layers of a model repeat their patterns (same signature, same problem): a kernel is
    tuned once for all of them, and every repeat takes the first one's rows, not a registry
    lookup that might miss."""
    from fact.engine import run_engine
    from fact.tune.runs import tune_run

    run = tmp_path / "run"
    (run / "lib").mkdir(parents=True)
    layer = attention_pattern(causal=True)
    (run / "plan.json").write_text(json.dumps({"arch": "sm90", "patterns": [layer] * 3}))
    shutil.copy(fake_attention("att_good"), run / "lib" / "good.so")
    manifest = [
        {"pattern_index": i, "family": "attention", "kernel": "good", "status": "compiled",
         "library": "lib/good.so", "config": attention_info("good")["config"],
         "measures": _measures(layer)}
        for i in range(3)
    ]  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest))
    registry = ["--registry", str(tmp_path / "r.db")]
    seed = tmp_path / "seed.json"
    seed.write_text(json.dumps({"fact_registry_export": 1, "schema_version": 2, "rows": []}))
    run_engine(["registry", "import", str(seed), *registry])
    best = tune_run(run, "highest", registry=registry, device="cpu")
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert sorted({r["pattern_index"] for r in rows}) == [0]  # tuned once
    for index in range(3):
        assert [(r["kernel"], r.get("source")) for r in best[index] if r["kernel"] == "good"] == [
            ("good", "tuned")
        ]


def test_tune_run_measures_attention_kernels(engine_available, fake_attention, tmp_path):
    """A realize run directory with an attention pattern: its kernels are tuned (rows with
    time_us and error, source "tuned"), the registry keeps them, and a second call reads them
    from there (source "registry") without running anything."""
    from fact.tune.runs import tune_run

    run = tmp_path / "run"
    (run / "lib").mkdir(parents=True)
    pattern = attention_pattern(causal=True)
    (run / "plan.json").write_text(json.dumps({"arch": "sm90", "patterns": [pattern]}))
    shutil.copy(fake_attention("att_good"), run / "lib" / "good.so")
    shutil.copy(fake_attention("att_wrong", "wrong"), run / "lib" / "wrong.so")
    manifest = [
        {"pattern_index": 0, "family": "attention", "kernel": k, "status": "compiled",
         "library": f"lib/{k}.so", "config": attention_info(k)["config"],
         "measures": _measures(pattern)}
        for k in ("good", "wrong")
    ]  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest))
    registry = ["--registry", str(tmp_path / "registry.db")]
    best = tune_run(run, "highest", registry=registry, device="cpu")
    assert list(best) == [0]
    rows = best[0]
    assert [(r["kernel"], r.get("source")) for r in rows] == [("good", "tuned"), ("pytorch", None)]
    assert rows[0]["time_us"] > 0 and 0 < rows[0]["error"] < 5e-3 and rows[0]["knobs"] == {}
    assert rows[0]["library"] == str(run / "lib" / "good.so") and rows[1]["time_us"] > 0
    results = json.loads((run / "results.json").read_text())
    assert [r["disposition"] for r in results["rows"]] == ["passed", "passed", "incorrect"]
    # warm: the registry has the passed row; the wrong kernel is measured again (no passed row)
    (run / "lib" / "wrong.so").unlink()
    (run / "manifest.json").write_text(json.dumps(manifest[:1]))
    again = tune_run(run, "highest", registry=registry, device="cpu")
    assert [(r["kernel"], r["source"]) for r in again[0]] == [("good", "registry")]
    assert again[0][0]["time_us"] == rows[0]["time_us"]
