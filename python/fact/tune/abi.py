"""ctypes mirror of the FACT kernel C ABI, version 7 (engine/families/gemm/fact_gemm_abi.h; for
row-norm kernels fact_norm_abi.h, for fused attention kernels fact_attention_abi.h, for pointwise
kernels fact_pointwise_abi.h).

The headers are authoritative: `FactGemmArgs`, `FactNormArgs`, `FactAttentionArgs` and
`FactPointwiseArgs` below list their fields in the same order with the same C types, and
tests/python/test_tune_cpu.py compiles the headers with gcc to check every offset.
Nothing here needs torch or a GPU: a `KernelLibrary` only dlopens the .so and calls its exported
functions; pointers are plain integers (device addresses on a GPU, host addresses in the CPU
tests' fake kernels).
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
from pathlib import Path
from typing import Any

from fact.errors import FactError

FACT_ABI_VERSION = 7
FACT_MAX_EPILOGUE_OPERANDS = 8
FACT_MAX_GEMM_PARTS = 8
FACT_POINTWISE_MAX_RANK = 8
FACT_POINTWISE_MAX_INPUTS = 16


class Status(enum.IntEnum):
    """enum FactStatus: what fact_gemm_can_implement and fact_gemm_run return."""

    OK = 0
    NOT_SUPPORTED = 1  # the kernel cannot implement this problem (alignment, sizes)
    INVALID_ARGS = 2  # a null pointer, a missing operand, a bad knob
    CUDA_ERROR = 3  # a CUDA call failed; the message says which
    WORKSPACE_TOO_SMALL = 4


def status_name(code: int) -> str:
    """'NOT_SUPPORTED' for 1; codes outside the enum print as numbers (a broken kernel)."""
    try:
        return Status(code).name
    except ValueError:
        return f"status {code}"


_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_N = FACT_MAX_EPILOGUE_OPERANDS

#: Run-time raster knob: LaunchKnobs' names (engine/families/gemm/config.h) to the ABI's ints.
RASTER = {"heuristic": 0, "along_m": 1, "along_n": 2}
#: Run-time reduction knob of stream-K kernels: how partial sums of a split tile are added.
REDUCTION = {"deterministic": 0, "nondeterministic": 1}
#: Run-time decomposition knob of stream-K kernels: how output tiles are shared out over the
#: persistent CTAs (CUTLASS's heuristic; stream-K whenever the last wave is partial; data-parallel).
DECOMPOSITION = {"heuristic": 0, "stream_k": 1, "data_parallel": 2}


def nondeterministic(knobs: dict[str, Any]) -> bool:
    """Whether LaunchKnobs JSON asks for the atomic stream-K reduction (by name or ABI int)."""
    return knobs.get("reduction") in ("nondeterministic", REDUCTION["nondeterministic"])


class FactGemmPart(ctypes.Structure):
    """typedef struct FactGemmPart: one part of a horizontally fused GEMM,
    D_p[m, n] = A[m, k] @ B_p[k, n] (+ bias_p[n])."""

    _fields_ = [
        ("n", _I64),
        ("b", _PTR),
        ("ldb", _I64),
        ("d", _PTR),
        ("ldd", _I64),
        ("bias", _PTR),
    ]


class FactGemmArgs(ctypes.Structure):
    """typedef struct FactGemmArgs: D[l, m, n] = epilogue(sum_k A[l, m, k] * B[l, k, n], ...).

    Sizes, leading dimensions and batch strides are in elements; pointers are integers.
    """

    _fields_ = [
        ("m", _I64),
        ("n", _I64),
        ("k", _I64),
        ("batch", _I64),
        ("a", _PTR),
        ("lda", _I64),
        ("batch_stride_a", _I64),
        ("b", _PTR),
        ("ldb", _I64),
        ("batch_stride_b", _I64),
        ("d", _PTR),
        ("ldd", _I64),
        ("batch_stride_d", _I64),
        ("operands", _PTR * _N),
        ("operand_ld", _I64 * _N),
        ("operand_batch_stride", _I64 * _N),
        ("raster", ctypes.c_int),
        ("max_swizzle", ctypes.c_int),
        ("splits", ctypes.c_int),
        ("sm_count", ctypes.c_int),
        ("reduction", ctypes.c_int),
        ("decomposition", ctypes.c_int),
        ("pdl", ctypes.c_int),  # 1: a programmatic dependent launch (see the header)
        ("n_parts", ctypes.c_int),
        ("parts", FactGemmPart * FACT_MAX_GEMM_PARTS),
    ]

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (arrays as lists; null pointers as 0)."""
        out: dict[str, Any] = {}
        for name, _ in self._fields_:
            value = getattr(self, name)
            if isinstance(value, ctypes.Array) and name == "parts":
                value = [{f: getattr(p, f) or 0 for f, _ in FactGemmPart._fields_} for p in value]
            elif isinstance(value, ctypes.Array):
                value = [v or 0 for v in value]
            elif value is None:
                value = 0
            out[name] = value
        return out


class AbiError(FactError):
    """A file is not a loadable FACT kernel library of this ABI version."""


class KernelStatusError(FactError):
    """A kernel call returned a status other than FACT_OK."""

    def __init__(self, status: int, message: str, library: str = ""):
        self.status = status
        self.kernel_message = message
        where = f"{library}: " if library else ""
        super().__init__(f"{where}{status_name(status)}: {message or '(no message)'}")


class FactNormArgs(ctypes.Structure):
    """typedef struct FactNormArgs (abi/fact_norm_abi.h): out[r] = norm(x[r]) (* w) (+ b)."""

    _fields_ = [
        ("rows", _I64),
        ("cols", _I64),
        ("x", _PTR),
        ("ldx", _I64),
        ("weight", _PTR),
        ("bias", _PTR),
        ("out", _PTR),
        ("ldout", _I64),
        ("eps", ctypes.c_double),
        ("rstd", _PTR),  # statistics kernels: rstd[r]; out[r] is the mean
        ("pdl", ctypes.c_int),  # as FactGemmArgs.pdl
    ]


class FactAttentionArgs(ctypes.Structure):
    """typedef struct FactAttentionArgs (abi/fact_attention_abi.h): fused attention, forward.

    O[b, h, s] = softmax(scale * Q[b, h, s] . K[b, hk, :] (+ causal mask)) @ V[b, hk, :] with
    hk = h // (heads // kv_heads). Strides are in elements (the last dim is contiguous, except
    V's where v_stride_d is above 1: then its keys are, v_stride_s == 1); pointers are integers;
    sm_count 0 = query the device; v_stride_d 0 = 1.
    """

    _fields_ = [
        ("batch", _I64),
        ("heads", _I64),
        ("kv_heads", _I64),
        ("seq_q", _I64),
        ("seq_k", _I64),
        ("head_dim", _I64),
        ("q", _PTR),
        ("q_stride_b", _I64),
        ("q_stride_h", _I64),
        ("q_stride_s", _I64),
        ("k", _PTR),
        ("k_stride_b", _I64),
        ("k_stride_h", _I64),
        ("k_stride_s", _I64),
        ("v", _PTR),
        ("v_stride_b", _I64),
        ("v_stride_h", _I64),
        ("v_stride_s", _I64),
        ("o", _PTR),
        ("o_stride_b", _I64),
        ("o_stride_h", _I64),
        ("o_stride_s", _I64),
        ("scale", ctypes.c_float),
        ("sm_count", ctypes.c_int),
        ("v_stride_d", _I64),
    ]

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (null pointers as 0)."""
        return {name: getattr(self, name) or 0 for name, _ in self._fields_}


_RANK, _INPUTS = FACT_POINTWISE_MAX_RANK, FACT_POINTWISE_MAX_INPUTS


class FactPointwiseArgs(ctypes.Structure):
    """typedef struct FactPointwiseArgs (abi/fact_pointwise_abi.h): out[i] = f(inputs at i).

    out is contiguous in shape[:rank]; input j is read at index i through strides[j][:rank]
    (elements; 0 where it broadcasts). The last dim is the model's last dim (the one the
    kernel's slices and concatenations act on); the others may come in any order.
    """

    _fields_ = [
        ("rank", ctypes.c_int32),
        ("n_inputs", ctypes.c_int32),
        ("shape", _I64 * _RANK),
        ("out", _PTR),
        ("inputs", _PTR * _INPUTS),
        ("strides", (_I64 * _RANK) * _INPUTS),
        ("pdl", ctypes.c_int32),  # as FactGemmArgs.pdl
    ]

    def to_dict(self) -> dict[str, Any]:
        """The used part of every field as plain Python values (null pointers as 0)."""
        rank, n = self.rank, self.n_inputs
        return {
            "rank": rank,
            "n_inputs": n,
            "shape": list(self.shape[:rank]),
            "out": self.out or 0,
            "inputs": [p or 0 for p in self.inputs[:n]],
            "strides": [list(self.strides[j][:rank]) for j in range(n)],
        }


# name -> (restype, argtypes): what every kernel library exports, then per kernel family.
_COMMON: dict[str, tuple[Any, list[Any]]] = {
    "fact_abi_version": (ctypes.c_int, []),
    "fact_kernel_name": (ctypes.c_char_p, []),
    "fact_kernel_info": (ctypes.c_char_p, []),
    "fact_last_error": (ctypes.c_char_p, []),
}
_FAMILIES: dict[str, dict[str, tuple[Any, list[Any]]]] = {
    "gemm": {
        "fact_gemm_can_implement": (ctypes.c_int, [ctypes.POINTER(FactGemmArgs)]),
        "fact_gemm_workspace_size": (ctypes.c_size_t, [ctypes.POINTER(FactGemmArgs)]),
        "fact_gemm_run": (
            ctypes.c_int,
            [ctypes.POINTER(FactGemmArgs), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p],
        ),
    },
    "norm": {
        "fact_norm_can_implement": (ctypes.c_int, [ctypes.POINTER(FactNormArgs)]),
        "fact_norm_run": (ctypes.c_int, [ctypes.POINTER(FactNormArgs), ctypes.c_void_p]),
    },
    "attention": {
        "fact_attention_can_implement": (ctypes.c_int, [ctypes.POINTER(FactAttentionArgs)]),
        "fact_attention_workspace_size": (
            ctypes.c_size_t,
            [ctypes.POINTER(FactAttentionArgs)],
        ),
        "fact_attention_run": (
            ctypes.c_int,
            [ctypes.POINTER(FactAttentionArgs), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p],
        ),
    },
    "pointwise": {
        "fact_pointwise_can_implement": (ctypes.c_int, [ctypes.POINTER(FactPointwiseArgs)]),
        "fact_pointwise_run": (ctypes.c_int, [ctypes.POINTER(FactPointwiseArgs), ctypes.c_void_p]),
    },
}


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", errors="replace") if raw else ""


def whole_library(path: Path) -> str:
    """Empty when `path` is a whole 64-bit ELF image (its section header table, written last,
    lies within the file); otherwise what is wrong. A cheap check before dlopen: a kernel cut
    short by a full disk or a broken copy would load and then fault when a page past its end is
    touched, killing the process."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return "is not a 64-bit ELF shared library"
    shoff = int.from_bytes(head[0x28:0x30], "little")
    shentsize = int.from_bytes(head[0x3A:0x3C], "little")
    shnum = int.from_bytes(head[0x3C:0x3E], "little")
    if shoff == 0 or shoff + shentsize * shnum > size:
        return f"is cut short ({size} bytes; its section table ends at {shoff + shentsize * shnum})"
    return ""


class KernelLibrary:
    """One generated kernel .so, loaded with dlopen and driven through the C ABI.

    Construction checks that every ABI symbol is exported and that fact_abi_version() is
    FACT_ABI_VERSION, so a stale or foreign library fails here, naming the file, rather than
    misreading the struct later.
    `family` ("gemm", "norm", "attention" or "pointwise") is told by the entry points the library
    exports (an attention or pointwise library whose fact_kernel_info() names another family is
    refused).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.is_file():
            raise AbiError(f"{self.path}: no such kernel library")
        why = whole_library(self.path)
        if why:  # dlopen of a truncated file can succeed and fault (SIGBUS) later
            raise AbiError(
                f"{self.path}: {why}; it will not be loaded (`fact cache verify` checks the kernel "
                "cache, `fact cache clean` removes damaged kernels, and realize builds them again)"
            )
        try:
            # RTLD_LOCAL: kernels built from the same template export the same symbol names;
            # each library must keep its own.
            self._dll = ctypes.CDLL(str(self.path.resolve()), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as exc:
            raise AbiError(f"{self.path}: cannot load the kernel library: {exc}") from exc
        self.family = next(
            (f for f, sigs in _FAMILIES.items() if hasattr(self._dll, next(iter(sigs)))), "gemm"
        )
        for name, (restype, argtypes) in {**_COMMON, **_FAMILIES[self.family]}.items():
            try:
                fn = getattr(self._dll, name)
            except AttributeError:
                raise AbiError(
                    f"{self.path}: not a FACT kernel library (it does not export {name})"
                ) from None
            fn.restype = restype
            fn.argtypes = argtypes
        version = self._dll.fact_abi_version()
        if version != FACT_ABI_VERSION:
            raise AbiError(
                f"{self.path}: kernel ABI version {version}, but this FACT speaks version "
                f"{FACT_ABI_VERSION}; rebuild the kernel with this FACT"
            )
        self.abi_version = version
        self._info: dict[str, Any] | None = None
        family = self.family
        if family in ("attention", "pointwise") and self.info.get("family") not in (None, family):
            raise AbiError(
                f"{self.path}: exports the {family} entry points but fact_kernel_info() says "
                f"family {self.info.get('family')!r}"
            )

    @property
    def name(self) -> str:
        """fact_kernel_name()."""
        return _text(self._dll.fact_kernel_name())

    @property
    def info(self) -> dict[str, Any]:
        """fact_kernel_info() parsed: family, dtypes, layouts, epilogue, operands, config."""
        if self._info is None:
            raw = _text(self._dll.fact_kernel_info())
            try:
                self._info = json.loads(raw) if raw else {}
            except json.JSONDecodeError as exc:
                raise AbiError(f"{self.path}: fact_kernel_info() is not JSON: {exc}") from exc
        return self._info

    def can_implement(self, args: FactGemmArgs) -> int:
        """fact_gemm_can_implement(): a Status code (message in last_error())."""
        return int(self._dll.fact_gemm_can_implement(ctypes.byref(args)))

    def workspace_size(self, args: FactGemmArgs) -> int:
        """fact_gemm_workspace_size(): bytes of device workspace fact_gemm_run needs."""
        return int(self._dll.fact_gemm_workspace_size(ctypes.byref(args)))

    def run(
        self,
        args: FactGemmArgs,
        workspace_ptr: int | None = None,
        workspace_bytes: int = 0,
        stream_ptr: int | None = None,
    ) -> int:
        """fact_gemm_run(): enqueue the GEMM on the stream; returns a Status code.

        The launch is asynchronous on a GPU: a fault shows up at the next synchronization.
        """
        return int(
            self._dll.fact_gemm_run(
                ctypes.byref(args), workspace_ptr or None, workspace_bytes, stream_ptr or None
            )
        )

    def norm_can_implement(self, args: FactNormArgs) -> int:
        """fact_norm_can_implement() of a row-norm kernel: a Status code."""
        return int(self._dll.fact_norm_can_implement(ctypes.byref(args)))

    def norm_run(self, args: FactNormArgs, stream_ptr: int | None = None) -> int:
        """fact_norm_run(): enqueue the norm on the stream; returns a Status code."""
        return int(self._dll.fact_norm_run(ctypes.byref(args), stream_ptr or None))

    def _family_call(self, family: str, name: str) -> Any:
        if self.family != family:
            raise AbiError(f"{self.path}: a {self.family} kernel library has no {name}()")
        return getattr(self._dll, name)

    def attention_can_implement(self, args: FactAttentionArgs) -> int:
        """fact_attention_can_implement() of an attention kernel: a Status code."""
        fn = self._family_call("attention", "fact_attention_can_implement")
        return int(fn(ctypes.byref(args)))

    def attention_workspace_size(self, args: FactAttentionArgs) -> int:
        """fact_attention_workspace_size(): bytes of device workspace fact_attention_run needs."""
        fn = self._family_call("attention", "fact_attention_workspace_size")
        return int(fn(ctypes.byref(args)))

    def attention_run(
        self,
        args: FactAttentionArgs,
        workspace_ptr: int | None = None,
        workspace_bytes: int = 0,
        stream_ptr: int | None = None,
    ) -> int:
        """fact_attention_run(): enqueue the attention on the stream; returns a Status code."""
        fn = self._family_call("attention", "fact_attention_run")
        return int(
            fn(ctypes.byref(args), workspace_ptr or None, workspace_bytes, stream_ptr or None)
        )

    def pointwise_can_implement(self, args: FactPointwiseArgs) -> int:
        """fact_pointwise_can_implement() of a pointwise kernel: a Status code."""
        fn = self._family_call("pointwise", "fact_pointwise_can_implement")
        return int(fn(ctypes.byref(args)))

    def pointwise_run(self, args: FactPointwiseArgs, stream_ptr: int | None = None) -> int:
        """fact_pointwise_run(): enqueue the pointwise kernel on the stream; a Status code."""
        fn = self._family_call("pointwise", "fact_pointwise_run")
        return int(fn(ctypes.byref(args), stream_ptr or None))

    def last_error(self) -> str:
        """fact_last_error(): the message of the last failed call on this thread."""
        return _text(self._dll.fact_last_error())

    def check(self, status: int) -> None:
        """Raise KernelStatusError (with the kernel's message) unless status is FACT_OK."""
        if status != Status.OK:
            raise KernelStatusError(status, self.last_error(), str(self.path))

    def symbol(self, name: str) -> Any:
        """Any other exported function, for tests and diagnostics."""
        return getattr(self._dll, name)

    def __repr__(self) -> str:
        return f"KernelLibrary({str(self.path)!r})"
