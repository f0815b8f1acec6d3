"""The pattern registry under load (issue 32): concurrent first writers of a new file, and an
import whose duplicate check is one indexed lookup a row (it scanned every row of a signature,
so 20k rows took 8 s and 200k more than ten minutes)."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest


def _export(path, rows: int, start: int = 0, created: str | None = None) -> None:
    doc = {
        "fact_registry_export": 1,
        "schema_version": 2,
        "rows": [
            {
                "signature": "gemm[bias]:bf16,bf16->bf16:row,col",
                "arch": "sm90",
                "problem": {"batch": 1, "m": 64 + i, "n": 4096, "k": 4096},
                "config": {"name": "t128x128x64_c1x1_pp_tma_sauto_persistent"},
                "time_us": 100.0 + i,
                "error": 1e-3,
                "disposition": "passed",
                "provenance": "tuned",
                **({"created": created} if created else {}),
            }
            for i in range(start, start + rows)
        ],
    }
    path.write_text(json.dumps(doc))


def _import(engine, registry, export) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(engine), "registry", "--registry", str(registry), "import", str(export)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_concurrent_first_writers_of_a_new_registry_all_succeed(engine_available, tmp_path):
    registry = tmp_path / "team.db"
    exports = []
    for k in range(4):
        exports.append(tmp_path / f"part{k}.json")
        _export(exports[-1], 50, start=100 * k)
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda e: _import(engine_available, registry, e), exports))
    assert all(d.returncode == 0 for d in done), [d.stderr for d in done]
    listed = subprocess.run(
        [str(engine_available), "registry", "--registry", str(registry), "export"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert len(json.loads(listed.stdout)["rows"]) == 200


def test_a_large_import_takes_an_indexed_lookup_a_row(engine_available, tmp_path):
    export = tmp_path / "big.json"
    _export(export, 40_000, created="2026-01-01 00:00:00")
    registry = tmp_path / "big.db"
    start = time.perf_counter()
    first = _import(engine_available, registry, export)
    again = _import(engine_available, registry, export)  # every row a duplicate now
    elapsed = time.perf_counter() - start
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert "40000 imported" in first.stdout, first.stdout
    assert "40000 already present" in again.stdout, again.stdout
    assert elapsed < 20, f"two imports of 40k rows took {elapsed:.1f} s"


def test_a_seed_row_never_replaces_a_measured_one(engine_available, tmp_path):
    """Re-running ./setup.sh imports the seed again: it must keep every tuned row (a seed row
    without a timestamp counted as "now" and replaced measurements)."""
    registry, seed, tuned = tmp_path / "r.db", tmp_path / "seed.json", tmp_path / "tuned.json"
    _export(seed, 3)
    doc = json.loads(seed.read_text())
    for row in doc["rows"]:
        row["provenance"] = "seed"
    seed.write_text(json.dumps(doc))
    _export(tuned, 1, created="2026-12-01 10:00:00")
    assert _import(engine_available, registry, seed).returncode == 0
    assert "1 updated" in _import(engine_available, registry, tuned).stdout
    again = _import(engine_available, registry, seed)
    assert "0 imported, 0 updated" in again.stdout and "3 already present" in again.stdout, again
    rows = json.loads(
        subprocess.run(
            [str(engine_available), "registry", "--registry", str(registry), "export"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # fmt: skip
    )["rows"]
    assert sorted(r["provenance"] for r in rows) == ["seed", "seed", "tuned"]


def _discover(registry, tmp_path) -> subprocess.CompletedProcess:
    problem = tmp_path / "problem.py"
    problem.write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.fc = nn.Linear(64, 64)\n\n"
        "    def forward(self, x):\n        return torch.relu(self.fc(x))\n\n"
        "def get_inputs():\n    return [torch.randn(8, 64)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    import os
    import sys

    return subprocess.run(
        [sys.executable, "-m", "fact", "discover", str(problem), "--json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "FACT_REGISTRY": str(registry)},
    )  # fmt: skip


def test_a_damaged_registry_is_a_warning_not_an_error(engine_available, tmp_path):
    """The registry is a hint: discovery goes on without one that cannot be read, says so once
    with how to recover, and salvage keeps the rows that can still be read."""
    registry, export = tmp_path / "team.db", tmp_path / "rows.json"
    _export(export, 3000, created="2026-01-01 00:00:00")
    assert _import(engine_available, registry, export).returncode == 0
    data = bytearray(registry.read_bytes())
    start = len(data) // 2
    data[start : start + 8192] = b"\xa5" * 8192  # a few pages of garbage
    registry.write_bytes(bytes(data))
    done = _discover(registry, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["patterns"], done.stdout
    salvaged = tmp_path / "salvaged.json"
    out = subprocess.run(
        [str(engine_available), "registry", "--registry", str(registry), "salvage", "-o",
         str(salvaged)], capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(salvaged.read_text())["rows"]
    assert 0 < len(rows) <= 3000, out.stdout

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 1000)
    done = _discover(garbage, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cannot be read" in done.stderr and "salvage" in done.stderr, done.stderr
    assert done.stderr.count("warning: the pattern registry") == 1


def test_a_row_can_be_deleted(engine_available, tmp_path):
    registry, export = tmp_path / "r.db", tmp_path / "rows.json"
    _export(export, 3)
    assert _import(engine_available, registry, export).returncode == 0

    def engine(*args):
        return subprocess.run(
            [str(engine_available), "registry", "--registry", str(registry), *args],
            capture_output=True, text=True,
        )  # fmt: skip

    assert "row 2 deleted (2 rows left)" in engine("delete", "2").stdout
    gone = engine("delete", "2")
    assert gone.returncode == 2 and "no row with id 2" in gone.stderr


@pytest.mark.parametrize(
    "change, field",
    [
        ({"time_us": -5.0}, "time_us"),
        ({"time_us": 0.0}, "time_us above 0"),
        ({"error": -1.0}, "error"),
        ({"created": "yesterday"}, "created"),
        ({"signature": "gemm[bias]\u0000:bf16"}, "signature"),
        ({"arch": "sm90\nsm80"}, "arch"),
        ({"config": {"name": "t\u0000x"}}, "NUL"),
    ],
)
def test_implausible_rows_are_refused_and_nothing_is_written(
    engine_available, tmp_path, change, field
):
    registry, export = tmp_path / "r.db", tmp_path / "rows.json"
    _export(export, 2)
    doc = json.loads(export.read_text())
    doc["rows"][1].update(change)
    export.write_text(json.dumps(doc))
    done = _import(engine_available, registry, export)
    assert done.returncode == 2 and field in done.stderr, done.stderr
    assert not registry.exists()  # checked before the file is even created
