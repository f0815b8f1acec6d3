"""Graphs handed over by other people (issue 32): names that could smuggle text into generated
source are refused at load, names never reach the emitted kernels (so renaming a node does not
change a kernel or its cache key), and a region of 12,000 chained ops is planned, explained and
realized without overflowing the engine's stack."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fact

FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; fi
exit 1
"""


def _engine(engine, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(engine), *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def _fake_nvcc(tmp_path: Path) -> Path:
    """An nvcc that reports a version and fails every compile: realize emits its sources and
    stops there, in seconds."""
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True)
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    return nvcc


def _cutlass() -> str:
    from fact.cli import find_cutlass

    try:
        return find_cutlass(None)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"needs CUTLASS's headers: {exc}")


class Tails(nn.Module):
    """A GEMM with an epilogue (and its tail), a row norm, a pointwise region and attention."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x, y):
        h = torch.relu(self.fc(x) * 0.5 + y)
        q = h.view(1, 8, 2, 32).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(8, 64)
        return self.norm(a) * torch.sigmoid(y) + 1.0


@pytest.fixture(scope="module")
def graph() -> dict:
    """Tails traced once: the graph JSON as `fact trace` writes it."""
    torch.manual_seed(0)
    model = Tails().eval().to(torch.bfloat16)
    traced = fact.trace(model, [torch.randn(8, 64).bfloat16(), torch.randn(8, 64).bfloat16()])
    return json.loads(json.dumps(traced))


def _renamed(graph: dict, prefix: str) -> dict:
    """The same graph with every node renamed (references follow)."""
    names = {n["name"]: f"{prefix}{i}" for i, n in enumerate(graph["nodes"])}

    def walk(value):
        if isinstance(value, dict):
            if set(value) >= {"node"} and value["node"] in names:
                return {**value, "node": names[value["node"]]}
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    out = walk(graph)
    for node, old in zip(out["nodes"], graph["nodes"], strict=True):
        node["name"] = names[old["name"]]
    return out


@pytest.mark.parametrize(
    "bad",
    [chr(c) for c in range(32)]
    + [chr(127), '"', "'", "`", "\\", "/", "*", "#", ";", "$", "(", ")", "{", "}", "<", ">", " "],
)
def test_a_node_name_outside_the_identifier_set_is_refused(engine_available, graph, tmp_path, bad):
    evil = _renamed(graph, f"x{bad}#include <cstdlib>{bad}static int p=std::system(0);{bad}//")
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(evil))
    done = _engine(engine_available, "validate", path)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "node #0" in done.stderr and "letters, digits" in done.stderr, done.stderr
    assert "\n" not in done.stderr.strip() and "\r" not in done.stderr  # one line, no raw bytes


def test_names_never_reach_the_kernels(engine_available, graph, tmp_path):
    """Renamed nodes: every emitted source (GEMM, its tail, norm, pointwise) is byte for byte
    the same, and holds no name; so are the kernels' cache keys."""
    nvcc, cutlass = _fake_nvcc(tmp_path), _cutlass()
    sources = []
    for label, g in (("plain", graph), ("renamed", _renamed(graph, "zq_marker_"))):
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps(g))
        run = tmp_path / f"run-{label}"
        done = _engine(
            engine_available, "realize", path, "--out", run, "--nvcc", nvcc, "--cutlass-dir",
            cutlass, "--cache-dir", tmp_path / f"cache-{label}", "--candidates", "1", "--quiet",
        )  # fmt: skip
        assert done.returncode in (0, 1), done.stderr  # every compile fails on purpose
        files = {p.name: p.read_text() for p in sorted((run / "src").glob("*.cu"))}
        families = {name.split("_")[1] for name in files}
        assert {"gemm", "pointwise", "layer", "attention"} <= families, sorted(files)
        sources.append(files)
        manifest = json.loads((run / "manifest.json").read_text())
        sources[-1]["keys"] = sorted(e.get("cache_key", "") for e in manifest)
    assert sources[0] == sources[1]
    for name, text in sources[1].items():
        if name != "keys":
            assert "zq_marker" not in text, name


def test_a_region_of_twelve_thousand_ops_neither_crashes_nor_hangs(engine_available, tmp_path):
    base = {
        "format": "fact.graph",
        "version": 1,
        "source": "chain",
        "model": "Chain",
        "dtype": "f32",
        "float32_matmul_precision": "highest",
    }
    ty = [{"dtype": "f32", "shape": [8, 64], "strides": [64, 1]}]
    nodes = [{"name": "x", "op": "placeholder", "kind": "input", "target": "x", "outputs": ty}]
    for i in range(12_000):
        op = "aten.mul.Tensor" if i % 2 == 0 else "aten.add.Tensor"
        prev = nodes[-1]["name"]
        nodes.append(
            {"name": f"n{i}", "op": op, "kind": "call", "module": "",
             "args": [{"node": prev}, 1.0001 if i % 2 == 0 else 0.001], "kwargs": {},
             "outputs": ty}
        )  # fmt: skip
    path = tmp_path / "chain.json"
    path.write_text(json.dumps({**base, "nodes": nodes, "outputs": [{"node": "n11999"}]}))
    done = _engine(engine_available, "discover", path, "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    (pattern,) = json.loads(done.stdout)["patterns"]
    assert pattern["family"] == "pointwise" and len(pattern["nodes"]) == 12_000
    assert len(pattern["epilogue_expr"]["text"]) < 5000  # capped, not 12,000 ops written out
    done = _engine(engine_available, "explain", path, "--node", "n6000", timeout=120)
    assert done.returncode == 0 and "covered by pattern" in done.stdout, done.stderr
    done = _engine(
        engine_available, "realize", path, "--out", tmp_path / "run", "--nvcc",
        _fake_nvcc(tmp_path), "--cutlass-dir", _cutlass(), "--cache-dir", tmp_path / "cache",
        "--json", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(done.stdout)
    assert entry["status"] == "not_supported" and "at most 1024" in entry["detail"]


def _fake_cutlass(root: Path, patch: str = "") -> Path:
    """A CUTLASS tree as far as emission needs one (its version header and one more)."""
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "tools" / "util" / "include").mkdir(parents=True)
    (root / "include" / "cutlass" / "cutlass.h").write_text("// cutlass\n" + patch)
    (root / "include" / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n"
    )
    return root


def test_kernel_keys_follow_the_headers_not_where_they_lie(engine_available, graph, tmp_path):
    """The kernel cache moves between machines: the same source against the same CUTLASS
    headers in another folder has the same key; other headers give another key."""
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    nvcc = _fake_nvcc(tmp_path)

    def keys(cutlass: Path, label: str) -> list[str]:
        run = tmp_path / f"run-{label}"
        done = _engine(
            engine_available, "realize", path, "--out", run, "--nvcc", nvcc, "--cutlass-dir",
            cutlass, "--cache-dir", tmp_path / f"cache-{label}", "--candidates", "1", "--quiet",
        )  # fmt: skip
        assert done.returncode in (0, 1), done.stderr
        manifest = json.loads((run / "manifest.json").read_text())
        return sorted(e["cache_key"] for e in manifest if e.get("cache_key"))

    here = keys(_fake_cutlass(tmp_path / "a" / "cutlass"), "a")
    moved = keys(_fake_cutlass(tmp_path / "elsewhere" / "tree"), "b")
    patched = keys(_fake_cutlass(tmp_path / "c" / "cutlass", patch="// patched\n"), "c")
    assert here == moved and len(here) >= 3
    assert not set(here) & set(patched)


@pytest.mark.parametrize(
    "body, detail",
    [
        ("echo 'kernel.cu(1): error: no such thing' >&2; exit 1", "error: no such thing"),
        ("kill -9 $$", "killed by signal 9"),
        ("sleep 30", "compile timeout of 1 s"),
    ],
    ids=["error", "signal", "hang"],
)
def test_realize_that_builds_nothing_fails_and_says_why(
    engine_available, graph, tmp_path, body, detail
):
    """Exit 1 when no kernel was built; each manifest row's detail says what happened to its
    compile (the error, the signal, the timeout) and names the log that was kept."""
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(FAKE_NVCC.replace("exit 1\n", f"{body}\n"))
    nvcc.chmod(0o755)
    start = time.perf_counter()
    done = _engine(
        engine_available, "realize", path, "--out", tmp_path / "run", "--nvcc", nvcc,
        "--cutlass-dir", _cutlass(), "--cache-dir", tmp_path / "cache", "--candidates", "1",
        "--compile-timeout", "1", "--json",
    )  # fmt: skip
    assert time.perf_counter() - start < 25  # a hung compile is stopped, not waited for
    assert done.returncode == 1 and "no kernel was built" in done.stderr, done.stderr
    rows = [e for e in json.loads(done.stdout) if e["status"] == "compile_error"]
    assert rows
    for row in rows:
        assert detail in row["detail"], row["detail"]
        log = row["detail"].rsplit("its log: ", 1)[1]
        assert Path(log).is_file(), log


class Region(nn.Module):
    """One pointwise region: a kernel that compiles in seconds."""

    def forward(self, x):
        return torch.sigmoid(x) * 2.0 + x


def test_a_damaged_cached_kernel_is_rebuilt_never_loaded(engine_available, tmp_path):
    from fact.tune.abi import AbiError, KernelLibrary

    graph = json.loads(json.dumps(fact.trace(Region().eval(), [torch.randn(4, 64)])))
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    cache = tmp_path / "cache"

    def realize(run: str) -> list[dict]:
        done = _engine(
            engine_available, "realize", path, "--out", tmp_path / run, "--cutlass-dir",
            _cutlass(), "--cache-dir", cache, "--json", timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr

    first, _ = realize("run1")
    if any(e["status"] == "compile_error" for e in first):
        pytest.skip(f"no working nvcc here: {first[0].get('detail')}")
    entry = cache / first[0]["cache_key"]
    library = entry / "kernel.so"
    data = library.read_bytes()
    library.write_bytes(data[: len(data) // 2])  # a full disk, a broken copy

    verify = _engine(engine_available, "cache", "--cache-dir", cache, "verify")
    assert verify.returncode == 1 and "damaged" in verify.stdout, verify.stdout
    with pytest.raises(AbiError, match="cut short"):
        KernelLibrary(library)

    again, stderr = realize("run2")
    status = {e["cache_key"]: e["status"] for e in again}
    assert status.pop(first[0]["cache_key"]) == "compiled"  # the damaged one: not "cached"
    assert set(status.values()) == {"cached"}
    assert "building it again" in stderr
    KernelLibrary(library)  # whole again: it loads
    assert _engine(engine_available, "cache", "--cache-dir", cache, "verify").returncode == 0

    # a new file in its place: writing into the one this process has loaded would change the
    # pages it maps
    broken = entry / "kernel.so.new"
    broken.write_bytes(b"\x7fELF" + b"\0" * 100)
    broken.replace(entry / "kernel.so")
    clean = _engine(engine_available, "cache", "--cache-dir", cache, "clean")
    assert clean.returncode == 0 and "1 damaged" in clean.stdout and not entry.exists(), clean


def _edited(graph: dict, tmp_path: Path, edit) -> Path:
    doc = json.loads(json.dumps(graph))
    edit(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return path


def _node(doc: dict, op_prefix: str) -> dict:
    return next(n for n in doc["nodes"] if n["op"].startswith(op_prefix))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["nodes"][0]["outputs"][0].update(dtype="zzz"), "unknown dtype 'zzz'"),
        (
            lambda d: d["nodes"][0]["outputs"][0].update(shape=[64, 63], strides=[63, 1]),
            "cannot give",
        ),
        (
            lambda d: _node(d, "aten.linear").update(args=_node(d, "aten.linear")["args"][:1]),
            "needs a tensor weight",
        ),
        (
            lambda d: d["nodes"][-1].update(args=[{"node": d["nodes"][0]["name"]}, 1e999]),
            "number overflow",
        ),
    ],
    ids=["dtype", "weight-shape", "arg-count", "1e999"],
)
def test_inconsistent_graphs_are_user_errors(engine_available, graph, tmp_path, edit, message):
    """Refused with exit 2 and the node named, never planned (and never exit 3)."""
    path = _edited(graph, tmp_path, edit)
    text = path.read_text().replace("1e+999", "1e999").replace("Infinity", "1e999")
    path.write_text(text)
    done = _engine(engine_available, "validate", path)
    assert done.returncode == 2 and message in done.stderr, (done.returncode, done.stderr)


class Counting(nn.Module):
    """Writes its own buffer every call: no inference module FACT composes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("count", torch.zeros(16))

    def forward(self, x):
        self.count.add_(1.0)
        return torch.relu(self.fc(x)) + self.count


def test_discover_refuses_what_optimize_refuses(engine_available, tmp_path, monkeypatch):
    monkeypatch.setenv("FACT_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.randn(4, 16)
    with pytest.raises(fact.FactError) as planned:
        fact.discover(Counting().eval(), [x])
    with pytest.raises(fact.FactError) as optimized:
        fact.optimize(Counting().eval(), [x], quiet=True, run_dir=tmp_path / "r")
    assert str(planned.value) == str(optimized.value)
    assert "count" in str(planned.value) and "without side effects" in str(planned.value)


class Scaled(nn.Module):
    """forward takes a number, a flag and an optional tensor besides its input."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, scale, use_relu, bias=None):
        y = self.fc(x) * scale
        if use_relu:
            y = torch.relu(y)
        return y + bias if bias is not None else y


def test_numbers_flags_and_none_are_constants_of_the_trace(engine_available, tmp_path, monkeypatch):
    monkeypatch.setenv("FACT_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model, x = Scaled().eval(), torch.randn(4, 16)
    plan = fact.discover(model, [x, 2.0, True, None])
    assert [p["epilogue"] for p in plan["patterns"]] == [["bias", "scale", "relu"]]
    opt = fact.optimize(model, [x, 2.0, True, None], quiet=True, run_dir=tmp_path / "r")
    with torch.no_grad():
        assert torch.allclose(opt(x, 2.0, True, None), model(x, 2.0, True, None), atol=1e-6)
        with pytest.warns(UserWarning, match="other values of its non-tensor arguments"):
            assert torch.allclose(opt(x, 3.0, False, None), model(x, 3.0, False, None))


def _fact(*args, env=None) -> subprocess.CompletedProcess:
    import os
    import sys

    return subprocess.run(
        [sys.executable, "-m", "fact", *map(str, args)], capture_output=True, text=True,
        timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_messages_name_the_users_file_and_real_flags(engine_available, tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(
        "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.relu(x) * 2\n\ndef get_inputs():\n    return [torch.randn(4, 8)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    done = _fact("explain", problem, "--node", "nosuch")
    assert done.returncode == 2 and str(problem) in done.stderr, done.stderr
    assert "/tmp/fact-" not in done.stderr and "fact trace" in done.stderr, done.stderr
    folder = _engine(engine_available, "validate", tmp_path)
    assert folder.returncode == 2 and "a folder, not a graph file" in folder.stderr
    graph = tmp_path / "g.json"
    assert _fact("trace", problem, "-o", graph).returncode == 0
    nvcc = _engine(
        engine_available, "realize", graph, "--out", tmp_path / "o", "--nvcc",
        tmp_path / "no-nvcc", "--cutlass-dir", _cutlass(),
    )  # fmt: skip
    assert nvcc.returncode == 2 and "put its nvcc on PATH" in nvcc.stderr, nvcc.stderr


def test_a_reused_run_directory_holds_only_this_plans_kernels(engine_available, graph, tmp_path):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    run = tmp_path / "run"
    (run / "src").mkdir(parents=True)
    (run / "lib").mkdir()
    (run / "src" / "fact_gemm_old.cu").write_text("// another plan's kernel\n")
    (run / "lib" / "fact_gemm_old.so").write_bytes(b"old")
    (run / "notes.txt").write_text("mine")
    _engine(
        engine_available, "realize", path, "--out", run, "--nvcc", _fake_nvcc(tmp_path),
        "--cutlass-dir", _cutlass(), "--cache-dir", tmp_path / "cache", "--candidates", "1",
    )  # fmt: skip
    assert not (run / "src" / "fact_gemm_old.cu").exists()
    assert not (run / "lib" / "fact_gemm_old.so").exists()
    assert (run / "notes.txt").read_text() == "mine"  # not realize's: left alone
    assert list((run / "src").glob("fact_*.cu"))
