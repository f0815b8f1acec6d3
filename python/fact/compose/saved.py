"""Saved modules: an optimized module as a folder another process (on another machine with the
same GPU architecture) loads without compiling, tuning or timing anything.

    fact.save(opt, "mlp.fact")          # after fact.optimize
    opt = fact.load("mlp.fact", model)  # in a new process, with the original model

The folder holds what optimize decided and the kernels it chose; the model's weights stay the
model's (load reads them live, as optimize's module does). Layout:

    module.json      what was saved and for what: FACT, torch and CUDA versions, the GPU and
                     its architecture, precision, the traced graph's digest, the kernels' digests
    decisions.json   the plan and one decision per pattern (kernel paths relative to the folder)
    inputs.pt        the example inputs optimize was given (tensors on the CPU)
    kernels/         the chosen kernel libraries

load traces the model again and refuses (FactError, saying what differs and what to do) unless
it traces to the saved graph, the kernels match their digests and this GPU, FACT and torch are
the ones it was saved with; `fallback=True` returns the original model with a warning instead.
The composed module is checked against float64 end to end on fresh inputs, as optimize checks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fact import __version__
from fact.compose.report import json_ready
from fact.errors import FactError

FORMAT = "fact.module"
VERSION = 1


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _gpu(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"device": "cpu"}
    major, minor = torch.cuda.get_device_capability(device)
    return {"device": "cuda", "gpu": torch.cuda.get_device_name(device), "sm": f"sm{major}{minor}"}


def save(opt: Any, folder: str | os.PathLike[str]) -> Path:
    """Write `opt` (a module fact.optimize returned) to `folder` (made if missing; an existing
    saved module there is replaced). Returns the folder."""
    from fact.compose.optimize import OptimizedModule

    if not isinstance(opt, OptimizedModule) or not hasattr(opt, "_decided"):
        raise FactError(
            f"fact.save takes a module fact.optimize returned, not {type(opt).__name__}"
        )
    decided = opt._decided
    if opt._variants:
        warnings.warn(
            f"fact.save keeps the module at its example's sizes; the {len(opt._variants)} other "
            "sizes it was optimized for (other_sizes, prepare) are not saved, and the loaded "
            "module runs the original at them",
            stacklevel=2,
        )
    out = Path(folder)
    if out.exists() and not (out / "module.json").is_file() and any(out.iterdir()):
        raise FactError(
            f"{out} exists and is not a saved FACT module: save into a new or empty folder"
        )
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "kernels").mkdir(parents=True)
        kernels: dict[str, str] = {}
        rows = []
        for d in decided["decisions"]:
            row = {k: v for k, v in d.items() if k != "impl"}
            impl = d.get("impl")
            if impl is not None and not d.get("fallback"):
                row["impl_spec"] = _saved_impl(impl, d, tmp / "kernels", kernels)
            rows.append(row)
        doc = {"fact_decisions": 1, "plan": decided["plan"], "decisions": rows}
        (tmp / "decisions.json").write_text(json.dumps(json_ready(doc)))
        example = decided["example"]  # on the host already
        try:
            torch.save(example, tmp / "inputs.pt")
        except Exception as exc:  # an input torch.save cannot write: say which
            raise FactError(f"the example inputs cannot be saved ({exc})") from None
        report = opt.report
        device = torch.device(
            "cuda" if str(report.get("device", "cpu")).startswith("cuda") else "cpu"
        )
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "model": report.get("model"),
            "saved": time.strftime("%Y-%m-%d %H:%M:%S"),
            "fact": __version__,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            **_gpu(device),
            "dtype": report.get("dtype"),
            "options": decided["options"],
            "graph_sha256": decided["graph_sha256"],
            "kernels": kernels,
            "report": {k: report.get(k) for k in ("replay", "guard", "cuda_graphs") if k in report},
            "patterns": len(rows),
            "replaced": report.get("replaced"),
        }
        (tmp / "module.json").write_text(json.dumps(json_ready(manifest), indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)  # never half a saved module under the name
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _saved_impl(impl: Any, d: Mapping[str, Any], kernels_dir: Path, kernels: dict) -> dict:
    """The decision's implementation as the folder keeps it: a generated kernel's library is
    copied in (named by its digest); a library implementation (cuBLASLt) is kept by name."""
    spec = {"name": impl.name, "kind": impl.kind, "detail": impl.detail}
    if impl.kind == "library":  # found again by name where it is loaded (cuBLASLt, SDPA)
        return spec
    found = [
        Path(p)
        for p in (getattr(impl, "library_path", None), getattr(impl, "cached_library", None))
        if p
    ]
    if not found:
        raise FactError(
            f"pattern {d.get('index')} ({d.get('signature')}) runs {impl.name}, an "
            "implementation passed to optimize (implementations=...), which a saved module "
            "cannot carry"
        )
    library = next((p for p in found if p.is_file()), None)
    if library is None:
        raise FactError(
            f"the kernel {impl.name} of pattern {d.get('index')} is gone from "
            f"{' and '.join(map(str, found)) or 'its run'}: optimize again, then save"
        )
    digest = _sha256(library)
    name = f"kernels/{digest[:16]}-{library.name}"
    if name not in kernels:
        shutil.copyfile(library, kernels_dir / Path(name).name)
        kernels[name] = digest
    spec["library"] = name
    return spec


def load(
    folder: str | os.PathLike[str],
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor | None = None,
    *,
    fallback: bool = False,
    quiet: bool = False,
) -> nn.Module:
    """The module saved in `folder`, on `model` (the model it was optimized from, or one with
    the same structure: its weights are read live). `example_inputs` default to the saved
    ones. FactError when it cannot run here; with `fallback`, a warning and `model` itself."""
    try:
        return _load(Path(folder), model, example_inputs, quiet)
    except FactError as exc:
        if not fallback:
            raise
        warnings.warn(f"FACT: {exc}; running the original module", stacklevel=2)
        return model


def _load(folder: Path, model: nn.Module, example_inputs: Any, quiet: bool) -> nn.Module:
    from fact.compose.optimize import Progress, _optimize_once

    manifest = read_manifest(folder)
    if example_inputs is None:
        try:
            example = torch.load(folder / "inputs.pt", weights_only=True)
        except Exception as exc:
            raise FactError(f"{folder / 'inputs.pt'} cannot be read ({exc})") from None
        device = torch.device("cuda" if manifest["device"] == "cuda" else "cpu")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise FactError(f"{folder} was saved for a GPU ({manifest.get('gpu')}); this "
                            "process has no CUDA device")  # fmt: skip
        example = [t.to(device) if isinstance(t, torch.Tensor) else t for t in example]
    else:
        from fact.tracer import example_list

        example = example_list(example_inputs)
    device = next((t.device for t in example if isinstance(t, torch.Tensor)), torch.device("cpu"))
    check_compatible(manifest, folder, device)
    options = manifest["options"]
    started = time.perf_counter()
    opt, dropped = _optimize_once(
        model, example, Progress(quiet), None, started,
        fold_norms=bool(options.get("fold_norms")), fold_skip=options.get("fold_skip") or {},
        precision=options["precision"], arch=options["arch"], candidates=0, cuda_graphs=True,
        use_cache=False, require_faster=True, implementations=None,
        saved={"folder": str(folder), "graph_sha256": manifest["graph_sha256"],
               "report": manifest.get("report") or {},
               "kernel": lambda name: checked_kernel(manifest, folder, name)},
    )  # fmt: skip
    if opt is None:  # the saved decisions are final: no fold is dropped on load
        raise FactError(f"the saved module in {folder} drops folds it was saved with: {dropped}")
    opt.report["loaded_from"] = str(folder)
    return opt


def checked_kernel(manifest: Mapping[str, Any], folder: Path, name: str) -> str | None:
    """The path of kernel `name` of the folder, its digest checked again just before it is
    loaded; None when the manifest does not list it (a decision naming another file)."""
    digest = manifest["kernels"].get(name)
    if digest is None:
        return None
    path = folder / name
    if _sha256(path) != digest:
        raise FactError(f"kernel {path} does not match the digest it was saved with: the "
                        "folder was changed or damaged; save the module again")  # fmt: skip
    return str(path)


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / "module.json"
    if not path.is_file():
        what = "does not exist" if not folder.exists() else "has no module.json"
        raise FactError(f"{folder} {what}: not a module saved with fact.save")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FactError(f"{path} cannot be read ({exc}): save the module again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FactError(f'{path} is not a saved FACT module (no "format": "{FORMAT}")')
    if manifest.get("version") != VERSION:
        raise FactError(
            f"{path} is format version {manifest.get('version')}; this FACT reads version "
            f"{VERSION}: save it again with this FACT"
        )
    missing = [
        k
        for k in ("options", "graph_sha256", "kernels", "device", "fact", "torch")
        if k not in manifest
    ]
    if missing:
        raise FactError(f"{path} lacks {', '.join(missing)}: save the module again")
    return manifest


def check_compatible(manifest: Mapping[str, Any], folder: Path, device: torch.device) -> None:
    """FactError naming the first thing that differs between the saved module and here."""
    saved_for = f"{folder} was saved"
    if manifest["fact"] != __version__:
        raise FactError(f"{saved_for} by FACT {manifest['fact']}; this is FACT {__version__}: "
                        "optimize and save again with this one")  # fmt: skip
    if manifest["torch"] != torch.__version__:
        raise FactError(f"{saved_for} with torch {manifest['torch']}; this process has torch "
                        f"{torch.__version__}: optimize and save again with it")  # fmt: skip
    if manifest["device"] != device.type:
        raise FactError(f"{saved_for} for {manifest['device']} inputs; these are on {device.type}")
    if device.type == "cuda":
        here = _gpu(device)
        if manifest.get("sm") != here["sm"]:
            raise FactError(
                f"{saved_for} for {manifest.get('gpu')} ({manifest.get('sm')}); this GPU is "
                f"{here['gpu']} ({here['sm']}): its kernels do not run here, optimize again"
            )
        if manifest.get("cuda") != torch.version.cuda:
            raise FactError(f"{saved_for} with CUDA {manifest.get('cuda')}; torch here uses CUDA "
                            f"{torch.version.cuda}: optimize and save again")  # fmt: skip
    for name, digest in manifest["kernels"].items():
        path = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts or not path.is_file():
            raise FactError(f"{saved_for} with kernel {name}, which is not in the folder: "
                            "copy the whole folder")  # fmt: skip
        if _sha256(path) != digest:
            raise FactError(f"kernel {path} does not match the digest it was saved with: the "
                            "folder was changed or damaged; save the module again")  # fmt: skip
