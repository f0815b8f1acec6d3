"""Shared fixtures. Nothing here needs the C++ engine: tests that do ask for `engine_available`."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import EXAMPLES


@pytest.fixture(scope="session")
def engine_available() -> Path:
    """The built fact-engine binary; skips the test when it is not built."""
    from fact.engine import find_engine
    from fact.errors import EngineNotFoundError

    try:
        return find_engine()
    except EngineNotFoundError as exc:
        pytest.skip(f"needs fact-engine: {exc}")


@pytest.fixture(scope="session")
def minigpt():
    """The MiniGPT example in bf16: (problem, ExportedProgram, graph), traced once per run."""
    from fact.problem import load_problem
    from fact.tracer import export_module, graph_from_program

    path = EXAMPLES / "minigpt_block.py"
    problem = load_problem(path, "bf16")
    program = export_module(problem.model, problem.inputs, source=str(path))
    graph = graph_from_program(program, source=str(path), model=problem.name)
    return problem, program, graph


@pytest.fixture(autouse=True, scope="session")
def _private_registry(tmp_path_factory):
    """Tests never read or write the user's pattern registry (~/.cache/fact/registry.db)."""
    import os

    old = os.environ.get("FACT_REGISTRY")
    os.environ["FACT_REGISTRY"] = str(tmp_path_factory.mktemp("registry") / "registry.db")
    yield
    if old is None:
        os.environ.pop("FACT_REGISTRY", None)
    else:
        os.environ["FACT_REGISTRY"] = old
