"""Pointwise regions (plan family "pointwise") without a GPU: the reference semantics of their SSA
(slice_last, cat_last, broadcasting, casts), fact::pointwise with the reference backend and its
fake, how a launch's FactPointwiseArgs are packed (dim order, strides, broadcasts), the
generated-kernel path through a fake kernel library that gcc builds here and that computes RoPE
on the host, PointwiseImpl's refusals, and the composition of a RoPE module on CPU.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import fact
from fact.compose.impls import Impl, PointwiseImpl
from fact.compose.ops import (
    PointwiseKernel,
    dense_strides,
    kernel_entry,
    output_order,
    pointwise_args,
    pointwise_layout,
    pointwise_out,
    register_kernel,
)
from fact.compose.optimize import fresh_inputs, rel_err
from fact.errors import FactError
from fact.tune.abi import FactPointwiseArgs, KernelLibrary
from fact.tune.reference import NotSupportedError, eval_epilogue, eval_pointwise
from helpers import ABI_DIRS, REPO
from pointwise_modules import RopeProjection, apply_rope, rope_tables

POINTWISE_OP = torch.ops.fact.pointwise.default
GCC = shutil.which("gcc")  # FactPointwiseArgs against the header: test_tune_cpu.py


def rope_ssa(half: int) -> list[dict]:
    """The plan's SSA of q * cos + cat(-q[..., half:], q[..., :half]) * sin (operands q, cos,
    sin), as the engine writes it."""
    return [
        {"id": 0, "op": "operand", "index": 0},
        {"id": 1, "op": "operand", "index": 1},
        {"id": 2, "op": "mul", "args": [0, 1]},
        {"id": 3, "op": "slice_last", "args": [0], "params": [half, half]},
        {"id": 4, "op": "neg", "args": [3]},
        {"id": 5, "op": "slice_last", "args": [0], "params": [0, half]},
        {"id": 6, "op": "cat_last", "args": [4, 5], "params": [half, half]},
        {"id": 7, "op": "operand", "index": 2},
        {"id": 8, "op": "mul", "args": [6, 7]},
        {"id": 9, "op": "add", "args": [2, 8]},
    ]


def rope_pattern(b=2, h=4, s=32, d=16, dtype="bf16", n_inputs=3) -> dict:
    """A plan pointwise pattern for RoPE on q [b, h, s, d] viewed (b, s, h, d) in memory, as
    the engine writes one (n_inputs > 3 adds unused inputs, for the refusals)."""
    operands = [
        {"role": "in0", "node": "transpose", "type": f"{dtype}[{b}, {h}, {s}, {d}]"},
        {"role": "in1", "node": "to", "type": f"{dtype}[{s}, {d}]"},
        {"role": "in2", "node": "to_1", "type": f"{dtype}[{s}, {d}]"},
    ]
    operands += [
        {"role": f"in{i}", "node": f"extra_{i}", "type": f"{dtype}[{d}]"}
        for i in range(3, n_inputs)
    ]
    return {
        "family": "pointwise",
        "rule": "pointwise_region",
        "signature": f"pointwise[mul+neg+cat+add]:{dtype}->{dtype}",
        "anchors": ["add"],
        "nodes": ["mul", "slice_3", "slice_4", "neg", "cat", "mul_1", "add"],
        "output": "add",
        "operands": operands,
        "epilogue": ["mul", "slice", "neg", "cat", "mul", "add"],
        "epilogue_expr": {"text": "q * cos + cat(-q[h:], q[:h]) * sin", "ssa": rope_ssa(d // 2)},
        "problem": {"numel": b * h * s * d, "cols": d},
        "attrs": {
            "dtype_out": dtype,
            "shape": [b, h, s, d],
            "strides": [s * h * d, d, h * d, 1],
        },
    }


def rope_inputs(b=2, h=4, s=32, d=16, dtype=torch.float32, seed=0):
    """q [b, h, s, d] as a transposed view of a (b, s, h, d) projection, cos and sin [s, d]."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=gen, dtype=torch.float64).to(dtype).transpose(1, 2)
    cos, sin = rope_tables(s, d)
    return q, cos.to(dtype), sin.to(dtype)


# ---------------------------------------------------------------------------------------------
# The SSA's meaning: reference.eval_pointwise


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_ssa_equals_the_rope_formula(dtype):
    q, cos, sin = rope_inputs(dtype=dtype)
    out = eval_pointwise(rope_ssa(8), [q, cos, sin], q.shape, compute_dtype=dtype)
    assert out.shape == q.shape and out.dtype == dtype
    expected = apply_rope(q, cos, sin)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    # the halves really move: the cat the other way round, cat(q[:h], -q[h:]), differs
    swapped = [e if e["id"] != 6 else dict(e, args=[5, 4]) for e in rope_ssa(8)]
    wrong = eval_pointwise(swapped, [q, cos, sin], q.shape, compute_dtype=dtype)
    assert not torch.allclose(wrong, expected)


def test_silu_times_b_broadcasts_like_pytorch():
    ssa = [
        {"id": 0, "op": "operand", "index": 0},
        {"id": 1, "op": "silu", "args": [0]},
        {"id": 2, "op": "operand", "index": 1},
        {"id": 3, "op": "mul", "args": [1, 2]},
    ]
    a, b = torch.randn(4, 1, 8), torch.randn(3, 8)
    out = eval_pointwise(ssa, [a, b], (4, 3, 8))
    assert out.shape == (4, 3, 8)
    torch.testing.assert_close(out, F.silu(a) * b)
    # a value narrower than the output is expanded to it (the kernel writes every element)
    torch.testing.assert_close(
        eval_pointwise(ssa, [a, b[:1]], (4, 3, 8)), (F.silu(a) * b[:1]).expand(4, 3, 8)
    )
    with pytest.raises(FactError, match=r"shaped \[4, 3, 8\], which does not broadcast to the "
                       r"output \[4, 5, 8\]"):  # fmt: skip
        eval_pointwise(ssa, [a, b], (4, 5, 8))


def test_slice_last_and_cat_last_edges():
    x = torch.arange(12.0).reshape(2, 6)
    narrow = [{"id": 0, "op": "operand", "index": 0},
              {"id": 1, "op": "slice_last", "args": [0], "params": [2, 3]}]  # fmt: skip
    torch.testing.assert_close(eval_pointwise(narrow, [x], (2, 3)), x[:, 2:5])
    # a last dim of 1 broadcasts along it: every slice of it is itself
    col = torch.randn(2, 1)
    torch.testing.assert_close(eval_pointwise(narrow, [col], (2, 3)), col.expand(2, 3))
    with pytest.raises(FactError, match=r"slice_last \[5, 8\) is outside a last dim of 6"):
        eval_pointwise([narrow[0], dict(narrow[1], params=[5, 3])], [x], (2, 3))
    with pytest.raises(FactError, match="slice_last needs parameter 1"):
        eval_pointwise([narrow[0], dict(narrow[1], params=[5])], [x], (2, 3))
    # cat_last broadcasts the pieces except along the last dim; a piece of width 1 (or a
    # constant) fills its size
    cat = [
        {"id": 0, "op": "operand", "index": 0},
        {"id": 1, "op": "operand", "index": 1},
        {"id": 2, "op": "constant", "value": 2.5},
        {"id": 3, "op": "cat_last", "args": [0, 1, 2], "params": [3, 2, 1]},
    ]
    a, b = torch.randn(4, 1, 3), torch.randn(5, 1)
    out = eval_pointwise(cat, [a, b], (4, 5, 6))
    expected = torch.cat([a.expand(4, 5, 3), b.expand(4, 5, 2), torch.full((4, 5, 1), 2.5)], -1)
    torch.testing.assert_close(out, expected)
    with pytest.raises(FactError, match="cat_last arg 0 has a last dim of 3, its size says 4"):
        eval_pointwise(cat[:3] + [dict(cat[3], params=[4, 2, 1])], [a, b], (4, 5, 7))
    with pytest.raises(FactError, match="cat_last of 3 args has 2 sizes"):
        eval_pointwise(cat[:3] + [dict(cat[3], params=[3, 2])], [a, b], (4, 5, 6))
    # a pointwise SSA has no accumulator; epilogues still have theirs
    with pytest.raises(FactError, match="reads acc, but a pointwise expression has no"):
        eval_pointwise([{"id": 0, "op": "acc"}], [x], (2, 6))
    acc = torch.randn(3, 6)
    sliced = eval_epilogue(
        [{"id": 0, "op": "acc"}, {"id": 1, "op": "slice_last", "args": [0], "params": [0, 6]}],
        acc,
        [],
    )
    torch.testing.assert_close(sliced, acc)


def test_casts_round_inside_a_float32_evaluation():
    ssa = [
        {"id": 0, "op": "operand", "index": 0},
        {"id": 1, "op": "cast", "args": [0], "dtype": "bf16"},
        {"id": 2, "op": "operand", "index": 1},
        {"id": 3, "op": "mul", "args": [1, 2]},
    ]
    a, b = torch.randn(8, 16), torch.randn(16)
    out = eval_pointwise(ssa, [a, b], (8, 16))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, a.to(torch.bfloat16).float() * b, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# fact::pointwise, reference backend, and its fake


def rope_kernel(dtype=torch.float32, backend="reference", library=None, label="rope") -> int:
    entry = PointwiseKernel(rope_ssa(8), [dtype] * 3, dtype, 16, backend, library, label)
    return register_kernel(entry)


def test_fact_pointwise_reference_op_follows_the_traced_strides_and_its_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, cos, sin = rope_inputs()
    handle = rope_kernel()
    traced = apply_rope(q, cos, sin)  # eager: laid out (b, s, h, d) like q
    assert traced.stride() == (2048, 16, 64, 1)
    out = torch.ops.fact.pointwise([q, cos, sin], handle, list(traced.shape), list(traced.stride()))
    assert out.shape == traced.shape and out.stride() == traced.stride()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, traced, rtol=1e-6, atol=1e-6)
    # strides that are not dense (or whose last dim is not contiguous): a contiguous output
    for strides in ([4096, 16, 64, 1], [2048, 512, 1, 16]):
        other = torch.ops.fact.pointwise([q, cos, sin], handle, list(q.shape), strides)
        assert other.is_contiguous()
        torch.testing.assert_close(other, traced, rtol=1e-6, atol=1e-6)
    # bf16 in and out: float32 inside, one rounding at the end
    qb, cb, sb = (t.to(torch.bfloat16) for t in (q, cos, sin))
    handle_bf16 = rope_kernel(torch.bfloat16)
    out_bf16 = torch.ops.fact.pointwise(
        [qb, cb, sb], handle_bf16, list(q.shape), list(traced.stride())
    )
    assert out_bf16.dtype == torch.bfloat16
    expected = apply_rope(qb.float(), cb.float(), sb.float()).to(torch.bfloat16)
    assert torch.equal(out_bf16, expected)

    with FakeTensorMode() as mode:
        fq, fc, fs = (mode.from_tensor(t) for t in (q, cos, sin))
        fake = torch.ops.fact.pointwise([fq, fc, fs], handle, list(q.shape), list(traced.stride()))
        fake_c = torch.ops.fact.pointwise([fq, fc, fs], handle, list(q.shape), [4096, 16, 64, 1])
    assert (fake.shape, fake.stride(), fake.dtype) == (out.shape, out.stride(), out.dtype)
    assert fake_c.is_contiguous()
    for strides in (list(traced.stride()), [4096, 16, 64, 1]):
        args = ([q, cos, sin], handle, list(q.shape), strides)
        result = torch.library.opcheck(POINTWISE_OP, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_fact_pointwise_refuses_wrong_inputs():
    q, cos, sin = rope_inputs()
    handle = rope_kernel(label="rope_f32")
    shape, strides = list(q.shape), [2048, 16, 64, 1]
    with pytest.raises(FactError, match=r"fact::pointwise rope_f32: in1 is torch.float64, the "
                       r"kernel reads torch.float32"):  # fmt: skip
        torch.ops.fact.pointwise([q, cos.double(), sin], handle, shape, strides)
    with pytest.raises(FactError, match="the kernel reads 3 inputs, 2 were given"):
        torch.ops.fact.pointwise([q, cos], handle, shape, strides)
    # the columns each input was traced with: a narrower input would be read past its rows
    checked = register_kernel(
        PointwiseKernel(
            rope_ssa(8),
            [torch.float32] * 3,
            torch.float32,
            16,
            "reference",
            label="rope_cols",
            input_cols=[16, 16, 16],
        )  # fmt: skip
    )
    with pytest.raises(FactError, match=r"in2 has a last dim of 8, the kernel reads 16 columns"):
        torch.ops.fact.pointwise([q, cos, sin[..., :8]], checked, shape, strides)
    from fact.compose.ops import NormKernel

    norm = register_kernel(NormKernel("rms_norm", 16, 1e-6, torch.float32, "reference"))
    with pytest.raises(FactError, match=f"kernel {norm} is not a pointwise kernel"):
        torch.ops.fact.pointwise([q, cos, sin], norm, shape, strides)


def test_output_allocation_rule():
    assert dense_strides([2, 4, 32, 16], [2048, 16, 64, 1])  # (b, s, h, d) in memory
    assert dense_strides([2, 4, 32, 16], [2048, 512, 16, 1])  # contiguous
    assert dense_strides([2, 1, 32, 16], [512, 7, 16, 1])  # a size-1 dim: any stride
    assert not dense_strides([2, 4, 32, 16], [4096, 16, 64, 1])  # gaps
    assert not dense_strides([2, 4, 32, 16], [2048, 512, 1, 32])  # last dim not contiguous
    assert not dense_strides([4, 4], [4, 4])  # overlap
    out = pointwise_out([2, 4, 32, 16], [2048, 16, 64, 1], torch.bfloat16, torch.device("cpu"))
    assert out.stride() == (2048, 16, 64, 1) and out.dtype == torch.bfloat16
    assert pointwise_out([4, 4], [4, 4], torch.float32, torch.device("cpu")).is_contiguous()


# ---------------------------------------------------------------------------------------------
# FactPointwiseArgs: dim order and strides


def test_layout_of_a_transposed_input_broadcast_tables_and_a_bshd_output():
    b, h, s, d = 2, 4, 32, 16
    q, cos, sin = rope_inputs(b, h, s, d)  # q: (b, s, h, d) in memory, seen (b, h, s, d)
    out = torch.empty(b, s, h, d).transpose(1, 2)  # the traced output's layout
    assert output_order(out) == [0, 2, 1, 3]
    shape, strides = pointwise_layout(out, [q, cos, sin])
    assert shape == [b, s, h, d]  # the output is contiguous in the kernel's dim order
    assert strides[0] == [s * h * d, h * d, d, 1]  # q read in place: it is (b, s, h, d) too
    assert strides[1] == strides[2] == [0, d, 0, 1]  # [S, D] broadcast over batch and heads
    # a contiguous output: the identity order, the transposed input read across
    contiguous = torch.empty(b, h, s, d)
    shape, strides = pointwise_layout(contiguous, [q, cos])
    assert shape == [b, h, s, d]
    assert strides == [[s * h * d, d, h * d, 1], [0, 0, d, 1]]
    # size-1 dims broadcast (stride 0) whatever their stride; a last dim may differ (slices)
    bias = torch.randn(1, h, 1, 2 * d)[..., :d]
    wide = torch.randn(b, h, s, 2 * d)
    shape, strides = pointwise_layout(contiguous, [bias, wide])
    assert strides == [[0, 2 * d, 0, 1], [h * s * 2 * d, s * 2 * d, 2 * d, 1]]
    # a 0-dim output is one element of rank 1
    assert pointwise_layout(torch.empty(()), [torch.tensor(2.0)]) == ([1], [[0]])


def test_layout_refusals():
    out = torch.empty(2, 4, 8)
    with pytest.raises(FactError, match=r"in1 of shape \[3, 8\] does not broadcast to the "
                       r"output's \[2, 4, 8\] \(dim 1\)"):  # fmt: skip
        pointwise_layout(out, [torch.randn(4, 8), torch.randn(3, 8)])
    with pytest.raises(FactError, match=r"in0 has rank 4 \(\[1, 2, 4, 8\]\), more than"):
        pointwise_layout(out, [torch.randn(1, 2, 4, 8)])
    with pytest.raises(FactError, match="not dense with a contiguous last dim"):
        pointwise_layout(torch.empty(8, 4).t(), [torch.randn(4, 8)])


def test_args_packing():
    q, cos, sin = rope_inputs()
    out = torch.empty(2, 32, 4, 16).transpose(1, 2)
    args = pointwise_args(out, [q, cos, sin])
    assert isinstance(args, FactPointwiseArgs)
    packed = args.to_dict()
    assert packed["rank"] == 4 and packed["n_inputs"] == 3
    assert packed["shape"] == [2, 32, 4, 16]
    assert packed["out"] == out.data_ptr()
    assert packed["inputs"] == [q.data_ptr(), cos.data_ptr(), sin.data_ptr()]
    assert packed["strides"] == [[2048, 64, 16, 1], [0, 16, 0, 1], [0, 16, 0, 1]]
    # views with an offset are read from their first element
    view = torch.randn(64, 16)[32:]
    args = pointwise_args(torch.empty(32, 16), [view])
    assert args.inputs[0] == view.data_ptr() != view.untyped_storage().data_ptr()
    with pytest.raises(FactError, match="beyond the ABI's 8 dims and 16 inputs"):
        pointwise_args(torch.empty(2, 4), [torch.randn(4)] * 17)


# ---------------------------------------------------------------------------------------------
# The generated-kernel path: a fake pointwise kernel library on the host

FAKE_ROPE_C = r"""
/* A fake FACT pointwise kernel library: the C ABI of fact_pointwise_abi.h computing RoPE,
 * q * cos + rotate_half(q) * sin over float32 host pointers, the way the header words it. */
#include <stdint.h>
#include <stdio.h>
#include "fact_pointwise_abi.h"

static char last_error[256];
static FactPointwiseArgs last_call;

int fact_abi_version(void) { return FACT_ABI_VERSION; }
const char* fact_kernel_name(void) { return "fake_rope"; }
const char* fact_kernel_info(void) {
  return "{\"family\": \"pointwise\", \"inputs\": [\"f32\", \"f32\", \"f32\"], "
         "\"dtype_out\": \"f32\", \"cols\": 16, \"rank\": 4, \"config\": {\"name\": \"fake\"}}";
}
const char* fact_last_error(void) { return last_error; }
void fake_last_call(FactPointwiseArgs* out) { *out = last_call; }

int fact_pointwise_can_implement(const FactPointwiseArgs* a) {
  if (!a || a->n_inputs != 3) {
    snprintf(last_error, sizeof last_error, "n_inputs must be 3");
    return FACT_INVALID_ARGS;
  }
  if (a->rank < 1 || a->rank > FACT_POINTWISE_MAX_RANK || a->shape[a->rank - 1] % 2) {
    snprintf(last_error, sizeof last_error, "the last dim must be even");
    return FACT_NOT_SUPPORTED;
  }
  return FACT_OK;
}

int fact_pointwise_run(const FactPointwiseArgs* a, void* stream) {
  (void)stream;
  int status = fact_pointwise_can_implement(a);
  if (status != FACT_OK) return status;
  last_call = *a;
  const int r = a->rank;
  const int64_t cols = a->shape[r - 1], half = cols / 2;
  int64_t n = 1;
  for (int d = 0; d < r; ++d) n *= a->shape[d];
  const float* in[3] = {a->inputs[0], a->inputs[1], a->inputs[2]};
  float* out = a->out;
  for (int64_t i = 0; i < n; ++i) {
    int64_t base[3] = {0, 0, 0}, rest = i / cols;
    for (int d = r - 2; d >= 0; --d) {
      const int64_t idx = rest % a->shape[d];
      rest /= a->shape[d];
      for (int j = 0; j < 3; ++j) base[j] += idx * a->strides[j][d];
    }
    const int64_t c = i % cols, other = c < half ? c + half : c - half;
    const float x = in[0][base[0] + c * a->strides[0][r - 1]];
    const float y = in[0][base[0] + other * a->strides[0][r - 1]];
    const float rot = c < half ? -y : y;
    out[i] = x * in[1][base[1] + c * a->strides[1][r - 1]] +
             rot * in[2][base[2] + c * a->strides[2][r - 1]];
  }
  return FACT_OK;
}
"""


@pytest.fixture(scope="module")
def fake_rope_library(tmp_path_factory) -> Path:
    if GCC is None:
        pytest.skip("needs gcc")
    folder = tmp_path_factory.mktemp("fake_pointwise")
    src, lib = folder / "fake_rope.c", folder / "fake_rope.so"
    src.write_text(FAKE_ROPE_C)
    includes = [f"-I{d}" for d in ABI_DIRS]
    cmd = [GCC, "-O2", "-std=c11", "-shared", "-fPIC", *includes, str(src), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return lib


def _host_dtype_check(monkeypatch):
    """The fake kernel reads host memory: let fact::pointwise hand it CPU tensors (the dtype is
    still checked)."""
    import fact.compose.ops as ops_mod

    def check(label, pairs):
        for name, t, dtype in pairs:
            if t.dtype != dtype:
                raise FactError(f"{label}: {name} is {t.dtype}, the kernel reads {dtype}")

    monkeypatch.setattr(ops_mod, "_check_dtypes", check)


def test_generated_kernel_path_through_a_host_library(fake_rope_library, monkeypatch):
    lib = KernelLibrary(fake_rope_library)
    assert lib.family == "pointwise" and lib.name == "fake_rope"
    assert lib.info["inputs"] == ["f32"] * 3
    with pytest.raises(FactError, match="a pointwise kernel library has no fact_attention_run"):
        lib.attention_run(None)
    impl = PointwiseImpl(rope_pattern(dtype="f32"), "cutlass", lib, label=lib.name)
    assert (impl.name, impl.kind) == ("generated:fake_rope", "generated")
    q, cos, sin = rope_inputs()
    traced = apply_rope(q, cos, sin)
    shape, strides = list(traced.shape), list(traced.stride())
    # on the CPU the real check refuses host tensors, naming the input
    with pytest.raises(FactError, match=r"fact::pointwise fake_rope: in0 is torch.float32 on cpu, "
                       r"the kernel reads torch.float32 on CUDA"):  # fmt: skip
        torch.ops.fact.pointwise([q, cos, sin], impl.handle, shape, strides)
    _host_dtype_check(monkeypatch)
    out = torch.ops.fact.pointwise([q, cos, sin], impl.handle, shape, strides)
    assert out.stride() == traced.stride()
    torch.testing.assert_close(out, traced, rtol=1e-6, atol=1e-6)
    seen = FactPointwiseArgs()
    lib.symbol("fake_last_call")(ctypes.byref(seen))
    assert seen.to_dict()["shape"] == [2, 32, 4, 16]
    assert seen.to_dict()["strides"] == [[2048, 64, 16, 1], [0, 16, 0, 1], [0, 16, 0, 1]]
    # a contiguous output and a contiguous q: another dim order, the same values
    out = torch.ops.fact.pointwise(
        [q.contiguous(), cos, sin], impl.handle, shape, [2048, 512, 16, 1]
    )
    assert out.is_contiguous()
    torch.testing.assert_close(out, traced, rtol=1e-6, atol=1e-6)
    # inputs narrower than traced never reach the kernel
    odd = torch.randn(2, 4, 32, 15)
    odd_args = ([odd, cos[:, :15], sin[:, :15]], impl.handle, [2, 4, 32, 15], [1920, 480, 15, 1])
    with pytest.raises(FactError, match=r"in0 has a last dim of 15, the kernel reads 16 columns"):
        torch.ops.fact.pointwise(*odd_args)
    # without that check, the kernel's refusal comes back with its own message, the kernel and
    # the shapes named
    kernel_entry(impl.handle).input_cols = None
    with pytest.raises(FactError, match=r"fact::pointwise fake_rope: the kernel cannot run an "
                       r"output of \[2, 4, 32, 15\].*in0 \[2, 4, 32, 15\].*the last dim must be "
                       r"even"):  # fmt: skip
        torch.ops.fact.pointwise(*odd_args)
    # an empty output launches nothing
    empty = torch.ops.fact.pointwise(
        [q[:0], cos, sin], impl.handle, [0, 4, 32, 16], [2048, 16, 64, 1]
    )
    assert empty.shape == (0, 4, 32, 16)
    with pytest.raises(FactError, match="in2 is torch.bfloat16, the kernel reads torch.float32"):
        torch.ops.fact.pointwise([q, cos, sin.bfloat16()], impl.handle, shape, strides)


# ---------------------------------------------------------------------------------------------
# PointwiseImpl: what it refuses, and generated_impl's dispatch


class StubPointwiseLibrary:
    """Stands in for a loaded pointwise kernel library (no .so, no GPU): what PointwiseImpl
    and fact::pointwise read of one."""

    family = "pointwise"

    def __init__(self, name="pw_stub", inputs=("bf16",) * 3, dtype_out="bf16", cols=16, rank=4):
        self.path = Path(f"/nonexistent/{name}.so")
        self.name = name
        self.info = {"family": "pointwise", "inputs": list(inputs), "dtype_out": dtype_out,
                     "cols": cols, "rank": rank, "config": {"name": name}}  # fmt: skip


def test_pointwise_impl_refusals():
    pattern = rope_pattern()
    PointwiseImpl(pattern, "cutlass", StubPointwiseLibrary(), label="pw_ok")
    impl = PointwiseImpl(pattern, "reference")
    assert impl.name == "reference:pointwise" and impl.detail == {"backend": "reference"}
    entry = kernel_entry(impl.handle)
    assert entry.inputs == [torch.bfloat16] * 3 and entry.cols == 16
    assert entry.out_dtype == torch.bfloat16
    rank9 = dict(pattern, attrs=dict(pattern["attrs"], shape=[1] * 5 + [2, 4, 32, 16]))
    no_acc = dict(pattern, epilogue_expr={"ssa": [{"id": 0, "op": "acc"}]})
    roles = dict(pattern, operands=pattern["operands"][::-1])
    cases = [
        (rope_pattern(n_inputs=17), "reference", None,
         "reads 17 inputs; its kernels read 1 to 16"),
        (rank9, "reference", None, "rank-9 output; its kernels handle up to 8 dims"),
        (dict(pattern, family="norm"), "reference", None, "norm is not pointwise"),
        (dict(pattern, epilogue_expr=None), "reference", None, "has no epilogue_expr"),
        (no_acc, "reference", None, "reads an accumulator"),
        (roles, "reference", None, r"operand roles \['in2', 'in1', 'in0'\], not in0..inN-1"),
        (pattern, "cutlass", StubPointwiseLibrary(inputs=("bf16", "f32", "f32")),
         r"pw reads \['bf16', 'f32', 'f32'\]; the pattern's inputs are \['bf16', 'bf16', 'bf16'\]"),
        (pattern, "cutlass", StubPointwiseLibrary(dtype_out="f32"), "pw writes f32; the pattern"),
        (pattern, "cutlass", StubPointwiseLibrary(cols=128), "pw writes 128 columns; the pattern"),
        (pattern, "cutlass", StubPointwiseLibrary(rank=3), "pw is built for rank 3"),
    ]  # fmt: skip
    for case, backend, lib, message in cases:
        with pytest.raises((NotSupportedError, FactError), match=message):
            PointwiseImpl(case, backend, lib, label="pw")
    # 17 inputs, past the impl: the ABI has room for 16
    with pytest.raises(NotSupportedError, match="reads 17 inputs"):
        PointwiseImpl(rope_pattern(n_inputs=17), "cutlass", StubPointwiseLibrary(), label="pw")


def test_generated_impl_makes_pointwise_libraries_pointwise_impls(monkeypatch, tmp_path):
    import fact.tune.abi as abi_mod
    from fact.compose.optimize import _generated_rows, _no_impl_reason, generated_impl

    libs = {"good.so": StubPointwiseLibrary("pw_good"),
            "f32.so": StubPointwiseLibrary("pw_f32", inputs=("f32",) * 3)}  # fmt: skip
    monkeypatch.setattr(abi_mod, "KernelLibrary", lambda path: libs[Path(path).name])
    impl = generated_impl(rope_pattern(), str(tmp_path / "good.so"), {})
    assert isinstance(impl, PointwiseImpl)
    assert (impl.name, impl.kind, impl.library_path) == (
        "generated:pw_good", "generated", str(tmp_path / "good.so"))  # fmt: skip
    assert kernel_entry(impl.handle).backend == "cutlass"
    with pytest.raises(NotSupportedError, match="pw_f32 reads"):
        generated_impl(rope_pattern(), str(tmp_path / "f32.so"), {})
    # like norms: every built kernel is checked in context (tuning times none of them)
    rows = [{"kernel": k, "library": f"/k/{k}.so", "time_us": None} for k in "abc"]
    assert len(_generated_rows({"family": "pointwise"}, rows)) == 3
    timed = [dict(r, time_us=1.0) for r in rows]
    assert len(_generated_rows({"family": "pointwise"}, timed)) == 3
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert _no_impl_reason({"family": "pointwise"}, cpu).startswith("no GPU")
    assert _no_impl_reason({"family": "pointwise"}, gpu) == "no usable generated pointwise kernel"


def test_pointwise_is_not_tuned_by_the_harness():
    from fact.tune.harness import TUNED_FAMILIES

    assert "pointwise" not in TUNED_FAMILIES


# ---------------------------------------------------------------------------------------------
# Composition on CPU: a RoPE module with the reference twin (needs the engine)


def pointwise_twins(index: int, pattern: dict) -> list[Impl]:
    """The PyTorch twin of a generated pointwise kernel for every pointwise pattern."""
    if pattern["family"] != "pointwise":
        return []
    return [PointwiseImpl(pattern, "reference", label="ref")]


def _calls(gm: fx.GraphModule, target) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_rope_regions_run_as_fact_pointwise(engine_available, tmp_path, dtype):
    """Llama's RoPE on Q and K: each region is one plan pattern of family pointwise, its twin
    replaces it (one fact::pointwise reading the transposed projections and the [S, D] tables
    in place), the outputs keep eager's layout and the module its function."""
    torch.manual_seed(40)
    model = RopeProjection().to(dtype).eval()
    x = torch.randn(2, 32, 64, dtype=dtype)
    plan = fact.discover(model, [x])
    assert sum(p["family"] == "pointwise" for p in plan["patterns"]) == 2, plan["patterns"]
    opt = fact.optimize(model, [x], implementations=pointwise_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    regions = [p for p in opt.report["patterns"] if p["family"] == "pointwise"]
    assert len(regions) == 2, opt.report["patterns"]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for p in regions:
        assert (p["chosen"], p["kind"]) == ("reference:ref", "generated"), p
        assert p["error"] <= tol
    gm = opt.graph_module
    nodes = _calls(gm, POINTWISE_OP)
    assert len(nodes) == 2
    assert not _calls(gm, torch.ops.aten.cat.default)
    for node in nodes:
        inputs, _, shape, strides = node.args
        assert [a.meta["val"].shape[-1] for a in inputs] == [16, 16, 16]
        assert shape[1:] in ([4, 32, 16], [2, 32, 16])
        assert strides[-2:] == [shape[1] * 16, 1]  # (b, s, h, d) in memory, as eager
    (y,) = fresh_inputs([x], 1)
    with torch.no_grad():
        got, want = opt(y), model(y)
    for g, w in zip(got, want, strict=True):
        assert g.stride() == w.stride()
    assert rel_err(got, want) <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_pointwise_impl_replaces_a_plan_pattern_in_the_graph(dtype):
    """Without the engine: the RoPE pattern on Q written by hand for the exported graph (what
    discover writes for it), replaced by the reference twin through fact::pointwise."""
    from fact.compose.optimize import compose
    from fact.compose.program import Program

    torch.manual_seed(41)
    model = RopeProjection().to(dtype).eval()
    x = torch.randn(2, 32, 64, dtype=dtype)
    program = Program(model, torch.export.export(model, (x,), strict=False))
    names = {n.name for n in program.graph_module.graph.nodes}
    pattern = rope_pattern(dtype={torch.float32: "f32", torch.bfloat16: "bf16"}[dtype])
    assert set(pattern["nodes"]) | {"transpose", "to", "to_1"} <= names
    plan = {"patterns": [pattern]}
    impl = PointwiseImpl(pattern, "reference", label="ref")
    gm = compose(program, plan, [{"index": 0, "impl": impl}])
    (node,) = _calls(gm, POINTWISE_OP)
    assert [a.name for a in node.args[0]] == ["transpose", "to", "to_1"]
    assert node.args[2:] == ([2, 4, 32, 16], [2048, 16, 64, 1])
    assert len(_calls(gm, torch.ops.aten.cat.default)) == 1  # K's region is still PyTorch's
    with torch.no_grad():
        q_out, k_out = gm(*program.state_inputs(), x)
        q_ref, k_ref = model(x)
    assert q_out.stride() == q_ref.stride() == (2048, 16, 64, 1)
    assert rel_err(q_out, q_ref) <= (1e-6 if dtype == torch.float32 else 1e-2)
    assert torch.equal(k_out, k_ref)
    # the traced output's shape and dtype must be what the kernel writes
    wrong = PointwiseImpl(rope_pattern(dtype="f16"), "reference", label="f16")
    with pytest.raises(NotSupportedError, match=r"transpose \(in0\) is torch\.\w+, the pointwise "
                       r"kernel reads torch.float16"):  # fmt: skip
        compose(program, plan, [{"index": 0, "impl": wrong}])
    other = rope_pattern(s=64, dtype=pattern["attrs"]["dtype_out"])
    other_impl = PointwiseImpl(other, "reference", label="s64")
    with pytest.raises(NotSupportedError, match=r"is shaped \[2, 4, 32, 16\], the plan says "
                       r"\[2, 4, 64, 16\]"):  # fmt: skip
        compose(program, plan, [{"index": 0, "impl": other_impl}])


# ---------------------------------------------------------------------------------------------
# Real generated kernels (built with nvcc, no GPU needed): their info and can_implement

REALIZE_ROPE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, seq=64, dim=32):
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        emb = torch.outer(torch.arange(seq).float(), inv).repeat(1, 2)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x):
        q = x.transpose(1, 2)
        half = q.shape[-1] // 2
        rot = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * self.cos + rot * self.sin


def get_inputs():
    return [torch.randn(2, 64, 4, 32)]
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA toolkit)")
def test_realized_pointwise_kernels_fit_pointwise_impl(engine_available, tmp_path):
    """`fact realize` of RoPE on a transposed view: the generated libraries' fact_kernel_info()
    fits the pattern as PointwiseImpl reads it, and their can_implement (host code, no GPU)
    takes the args fact::pointwise packs and refuses another last dim, saying why."""
    import os
    import sys

    from fact.compose.optimize import generated_impl
    from fact.tune.abi import Status

    problem = tmp_path / "rope.py"
    problem.write_text(REALIZE_ROPE)
    res = subprocess.run(
        [sys.executable, "-m", "fact", "realize", str(problem), "--dtype", "bf16",
         "--candidates", "1", "--out", str(tmp_path / "run"), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "FACT_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    manifest = json.loads(res.stdout)
    assert {e["family"] for e in manifest} == {"pointwise"}
    assert [e["status"] for e in manifest] == ["compiled"] * len(manifest), manifest
    run = tmp_path / "run"
    (pattern,) = json.loads((run / "plan.json").read_text())["patterns"]
    assert pattern["family"] == "pointwise" and pattern["attrs"]["shape"] == [2, 4, 64, 32]
    for e in manifest:
        impl = generated_impl(pattern, str(run / e["library"]), {})
        entry = kernel_entry(impl.handle)
        lib = entry.library
        assert lib.family == "pointwise" and impl.name == f"generated:{lib.name}"
        assert (lib.info["inputs"], lib.info["dtype_out"], lib.info["cols"], lib.info["rank"]) == (
            ["bf16"] * 3, "bf16", 32, 4)  # fmt: skip
        assert entry.inputs == [torch.bfloat16] * 3 and entry.cols == 32
        # host tensors: can_implement only reads the args
        q = torch.randn(2, 64, 4, 32, dtype=torch.bfloat16).transpose(1, 2)
        cos, sin = (t.bfloat16() for t in rope_tables(64, 32))
        out = pointwise_out([2, 4, 64, 32], pattern["attrs"]["strides"], torch.bfloat16, q.device)
        status = lib.pointwise_can_implement(pointwise_args(out, [q, cos, sin]))
        assert status == Status.OK, lib.last_error()
        narrow = torch.empty(2, 4, 64, 16, dtype=torch.bfloat16)
        args = pointwise_args(narrow, [q[..., :16], cos[:, :16], sin[:, :16]])
        assert lib.pointwise_can_implement(args) == Status.NOT_SUPPORTED
        assert "generated for a last dim of 32" in lib.last_error()


def test_inputs_unlike_the_traced_layout_are_copied_first():
    """A kernel generated to read an input as contiguous aligned vectors (the traced layout)
    gets a contiguous copy of a differently laid out view; broadcast and strided inputs are
    read as they come."""
    from fact.compose.ops import _contiguous_copies

    info = {"access": ["contiguous", "broadcast", "strided"], "vec": 8}
    base = torch.randn(4, 64, dtype=torch.bfloat16)
    col = torch.randn(4, 1, dtype=torch.bfloat16)
    assert _contiguous_copies(info, [base, col, base.t()]) == (False, False, False)
    assert _contiguous_copies(info, [base.t().contiguous().t(), col, base]) == (True, False, False)
    offset = torch.randn(4 * 64 + 1, dtype=torch.bfloat16)[1:].view(4, 64)  # 2 bytes off
    assert _contiguous_copies(info, [offset, col, base]) == (True, False, False)
    rows = torch.randn(4, 68, dtype=torch.bfloat16)[:, :64]  # rows 68 apart: not on 8s
    assert _contiguous_copies(info, [rows, col, base]) == (True, False, False)
    assert _contiguous_copies({"vec": 8}, [rows, col, base]) == (False, False, False)


def test_zoo_regions_access_kinds_and_composition(engine_available, tmp_path):
    """PointwiseZoo's four regions: a transposed (strided) input against a broadcast column, a
    one-column slice kept as a broadcast operand under a boolean mask, f32 inputs cast to bf16
    with rows of 12, and the SwiGLU product; each composed through its twin matches eager."""
    from pointwise_modules import PointwiseZoo, zoo_inputs

    model, x = PointwiseZoo().eval(), zoo_inputs(dtype=torch.bfloat16)
    plan = fact.discover(model, x)
    assert plan["pytorch_nodes"] == []
    found = {p["output"]: p for p in plan["patterns"]}
    assert {p["family"] for p in found.values()} == {"pointwise"} and len(found) == 4
    access = {
        out: dict(zip([o["node"] for o in p["operands"]], p["attrs"]["access"], strict=True))
        for out, p in found.items()
    }
    assert access["add"] == {"transpose": "strided", "col": "broadcast", "a": "contiguous"}
    assert access["where"] == {"a": "contiguous", "slice_1": "broadcast", "m": "contiguous"}
    assert access["to"] == {"f": "contiguous"}
    assert access["mul_3"] == {"gate": "contiguous", "up": "contiguous"}
    opt = fact.optimize(model, x, implementations=pointwise_twins, require_faster=False,
                        use_cache=False, run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    assert [p["chosen"] for p in opt.report["patterns"]] == ["reference:ref"] * 4
    assert len(_calls(opt.graph_module, POINTWISE_OP)) == 4
    y = zoo_inputs(dtype=torch.bfloat16, seed=1)
    with torch.no_grad():
        got, want = opt(*y), model(*y)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert rel_err(g.float(), w.float()) < 2e-2
