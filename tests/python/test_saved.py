"""fact.save and fact.load (fact.compose.saved) on the CPU: the folder, loading in a new process
without planning anew, and every way a saved module is refused. Kernels on the GPU:
test_compose_gpu.py."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import fact
from fact.errors import FactError
from helpers import REPO


class Mlp(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


@pytest.fixture(scope="module")
def saved(engine_available, tmp_path_factory):
    """An MLP optimized on the CPU (every pattern stays PyTorch: nothing can be timed) and
    saved; a fresh copy of the folder for each test that damages it."""
    torch.manual_seed(0)
    model, x = Mlp().eval(), torch.randn(2, 8, 32)
    root = tmp_path_factory.mktemp("saved")
    opt = fact.optimize(model, [x], run_dir=root / "run", quiet=True, use_cache=False)
    folder = fact.save(opt, root / "mlp.fact")
    torch.save(model.state_dict(), root / "weights.pt")
    return model, x, opt, folder


def copy_of(folder: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(folder, tmp_path / folder.name))


def edit_manifest(folder: Path, **changes) -> None:
    path = folder / "module.json"
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def test_the_folder_holds_the_decisions_inputs_and_what_it_was_saved_for(saved):
    model, x, opt, folder = saved
    assert sorted(p.name for p in folder.iterdir()) == [
        "decisions.json", "inputs.pt", "kernels", "module.json"
    ]  # fmt: skip
    manifest = json.loads((folder / "module.json").read_text())
    assert manifest["format"] == "fact.module" and manifest["fact"] == fact.__version__
    assert manifest["torch"] == torch.__version__ and manifest["device"] == "cpu"
    assert manifest["options"]["precision"] == torch.get_float32_matmul_precision()
    assert len(manifest["graph_sha256"]) == 64
    decisions = json.loads((folder / "decisions.json").read_text())
    assert len(decisions["decisions"]) == len(opt.report["patterns"]) >= 1
    (inputs,) = [torch.load(folder / "inputs.pt", weights_only=True)]
    assert len(inputs) == 1 and torch.equal(inputs[0], x)


def test_a_new_process_loads_it_without_planning(saved, tmp_path):
    model, x, _, folder = saved
    script = f"""
import sys, torch
sys.path.insert(0, {str(REPO / "tests" / "python")!r})
import fact
from test_saved import Mlp
model = Mlp().eval()
model.load_state_dict(torch.load({str(folder.parent / "weights.pt")!r}))
opt = fact.load({str(folder)!r}, model, quiet=True)
x = torch.load({str(folder / "inputs.pt")!r})[0]
torch.save(opt(x), {str(tmp_path / "out.pt")!r})
print("\\n".join(opt.report["transcript"]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded the decisions in" in done.stdout and "nothing to compile or tune" in done.stdout
    for step in ("planning", "realiz", "tuning", "capturing the module's intermediate values"):
        assert step not in done.stdout, done.stdout
    with torch.no_grad():
        assert torch.allclose(torch.load(tmp_path / "out.pt"), model(x), atol=1e-6)


def test_load_reads_the_models_live_weights(saved):
    model, x, _, folder = saved
    other = Mlp().eval()  # same structure, other weights
    opt = fact.load(folder, other, quiet=True)
    with torch.no_grad():
        assert torch.allclose(opt(x), other(x), atol=1e-6)
        assert opt.report["loaded_from"] == str(folder)


def test_another_model_or_shape_is_refused(saved):
    _, x, _, folder = saved
    with pytest.raises(FactError, match="does not trace to the graph saved in"):
        fact.load(folder, Mlp(d=16).eval(), [torch.randn(2, 8, 16)], quiet=True)
    with pytest.raises(FactError, match="does not trace to the graph saved in"):
        fact.load(folder, Mlp().eval(), [torch.randn(3, 8, 32)], quiet=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fact": "0.0.1"}, "saved by FACT 0.0.1; this is FACT"),
        ({"torch": "1.0.0"}, "saved with torch 1.0.0; this process has torch"),
        ({"device": "cuda", "gpu": "NVIDIA H100", "sm": "sm90"}, "saved for a GPU"),
        ({"version": 99}, "format version 99"),
        ({"format": "other"}, "is not a saved FACT module"),
    ],
)
def test_a_module_saved_for_something_else_is_refused(saved, tmp_path, change, message):
    _, _, _, folder = saved
    folder = copy_of(folder, tmp_path)
    edit_manifest(folder, **change)
    with pytest.raises(FactError, match=message):
        fact.load(folder, Mlp().eval(), quiet=True)


def test_damaged_or_missing_kernels_are_refused(saved, tmp_path):
    _, _, _, folder = saved
    folder = copy_of(folder, tmp_path)
    (folder / "kernels" / "k.so").write_bytes(b"not the kernel")
    edit_manifest(folder, kernels={"kernels/k.so": "0" * 64})
    with pytest.raises(FactError, match="does not match the digest"):
        fact.load(folder, Mlp().eval(), quiet=True)
    edit_manifest(folder, kernels={"kernels/gone.so": "0" * 64})
    with pytest.raises(FactError, match="not in the folder: copy the whole folder"):
        fact.load(folder, Mlp().eval(), quiet=True)
    edit_manifest(folder, kernels={"../weights.pt": "0" * 64})
    with pytest.raises(FactError, match="not in the folder"):
        fact.load(folder, Mlp().eval(), quiet=True)


def test_fallback_returns_the_original_with_a_warning(saved, tmp_path):
    _, x, _, folder = saved
    model = Mlp(d=16).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fact.load(folder, model, [torch.randn(2, 8, 16)], fallback=True, quiet=True)
    assert got is model
    assert any("running the original module" in str(w.message) for w in caught)


def test_bad_folders_and_arguments(saved, tmp_path):
    _, _, opt, folder = saved
    with pytest.raises(FactError, match="does not exist: not a module saved with fact.save"):
        fact.load(tmp_path / "nowhere", Mlp().eval())
    (tmp_path / "empty").mkdir()
    with pytest.raises(FactError, match="has no module.json"):
        fact.load(tmp_path / "empty", Mlp().eval())
    damaged = copy_of(folder, tmp_path)
    (damaged / "module.json").write_text("{")
    with pytest.raises(FactError, match="cannot be read"):
        fact.load(damaged, Mlp().eval())
    with pytest.raises(FactError, match="takes a module fact.optimize returned"):
        fact.save(Mlp(), tmp_path / "x")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FactError, match="is not a saved FACT module"):
        fact.save(opt, tmp_path / "taken")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_saving_again_replaces_the_folder(saved, tmp_path):
    _, _, opt, folder = saved
    target = copy_of(folder, tmp_path)
    (target / "kernels" / "stale.so").write_bytes(b"old")
    fact.save(opt, target)
    assert not (target / "kernels" / "stale.so").exists()
    assert not list(tmp_path.glob(".*tmp*"))


def test_implementations_passed_to_optimize_cannot_be_saved(engine_available, tmp_path):
    from test_compose_cpu import LinearTail, reference_twins

    model, x = LinearTail().eval(), torch.randn(4, 16, 64)
    opt = fact.optimize(model, [x], implementations=reference_twins, require_faster=False,
                        run_dir=tmp_path / "r", quiet=True)  # fmt: skip
    with pytest.raises(FactError, match="implementations=.*cannot carry"):
        fact.save(opt, tmp_path / "m.fact")
    assert not (tmp_path / "m.fact").exists()


def test_a_decision_naming_a_kernel_outside_the_checked_ones_is_refused(saved, tmp_path):
    """decisions.json is part of the folder too: a kernel path it names must be one of the
    manifest's digested kernels, never a file elsewhere."""
    _, _, _, folder = saved
    folder = copy_of(folder, tmp_path)
    (tmp_path / "elsewhere.so").write_bytes(b"not checked")
    doc = json.loads((folder / "decisions.json").read_text())
    doc["decisions"][0]["impl_spec"] = {
        "name": "k", "kind": "generated", "detail": {},
        "library": str(tmp_path / "elsewhere.so"), "cached_library": str(tmp_path / "elsewhere.so"),
    }  # fmt: skip
    doc["decisions"][0].pop("fallback", None)
    (folder / "decisions.json").write_text(json.dumps(doc))
    with pytest.raises(FactError, match="names kernel .*elsewhere.so.*not one it holds"):
        fact.load(folder, Mlp().eval(), quiet=True)
