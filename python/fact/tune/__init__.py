"""fact.tune: load compiled kernels through the C ABI, verify them, time them.

    abi        ctypes mirror of engine/families/*/fact_*_abi.h; KernelLibrary (no torch)
    reference  what a plan pattern computes: float64 reference, unfused PyTorch candidate
    inputs     fresh random inputs laid out for a kernel; FactGemmArgs over them
    attention  fused attention patterns: spec, inputs, reference, FactAttentionArgs, the
               kernel's and SDPA's verification and timing (the harness dispatches there)
    harness    verify / time_kernel / time_pytorch, and the fault-isolated `tune` driver
               (also the CLI: python -m fact.tune.harness PLAN.json --kernels ... --out ...)

Names load on first use, so that `fact.tune.abi` (and the CLI's --help) do not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "KernelLibrary": "fact.tune.abi",
    "FactGemmArgs": "fact.tune.abi",
    "FactAttentionArgs": "fact.tune.abi",
    "AttentionSpec": "fact.tune.attention",
    "Status": "fact.tune.abi",
    "eval_epilogue": "fact.tune.reference",
    "reference": "fact.tune.reference",
    "pytorch_candidate": "fact.tune.reference",
    "make_inputs": "fact.tune.inputs",
    "gemm_args": "fact.tune.inputs",
    "verify": "fact.tune.harness",
    "time_kernel": "fact.tune.harness",
    "time_pytorch": "fact.tune.harness",
    "tune": "fact.tune.harness",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fact.tune' has no attribute {name!r}")
