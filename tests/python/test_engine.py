"""Running the engine: locating it, its exit-status contract, and the CLI commands that use it.

Most tests use a stand-in engine (a small Python script) so that they run before the C++ engine
is built; the tests at the end use the real one and are skipped until it is built.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fact
from fact import engine
from fact.cli import main
from fact.engine import engine_json, find_engine, run_engine
from fact.errors import EngineCrashError, EngineError, EngineNotFoundError
from helpers import EXAMPLES, REPO

FAKE_ENGINE = """\
#!{python}
# A stand-in for fact-engine: logs its arguments and what the graph holds, then acts per MODE.
import json, os, sys
args = sys.argv[1:]
record = {{"args": args}}
if len(args) > 1 and args[1].endswith(".json") and os.path.exists(args[1]):
    with open(args[1]) as f:
        record["nodes"] = len(json.load(f)["nodes"])
with open(os.environ["FAKE_ENGINE_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
mode = os.environ.get("FAKE_ENGINE_MODE", "ok")
if mode == "user":
    print("error: no node named 'nope' in the graph", file=sys.stderr)
    sys.exit(2)
if mode == "crash":
    print("assertion failed: plan.cc:42", file=sys.stderr)
    sys.exit(134)
if mode == "badjson":
    print("plan: 3 kernels")
    sys.exit(0)
if mode == "warn":
    print("warning: registry is empty", file=sys.stderr)
if "--json" in args:
    print(json.dumps({{"subcommand": args[0], "kernels": []}}))
else:
    print("plan for " + args[1])
"""


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """Point FACT_ENGINE at the stand-in; returns a function reading the calls it logged."""
    script = tmp_path / "fact-engine"
    script.write_text(FAKE_ENGINE.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "engine-calls.jsonl"
    monkeypatch.setenv("FACT_ENGINE", str(script))
    monkeypatch.setenv("FAKE_ENGINE_LOG", str(log))
    monkeypatch.delenv("FAKE_ENGINE_MODE", raising=False)

    def calls() -> list[dict]:
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    return calls


@pytest.fixture
def graph_file(tmp_path):
    """A small traced graph on disk."""
    graph = fact.trace(torch.nn.Linear(4, 2), [torch.randn(3, 4)], source="linear")
    return fact.save_graph(graph, tmp_path / "linear.json")


# --- locating the engine ---------------------------------------------------------------------


def test_fact_engine_env_must_name_an_executable(tmp_path, monkeypatch):
    monkeypatch.setenv("FACT_ENGINE", str(tmp_path / "nowhere"))
    with pytest.raises(EngineNotFoundError, match="FACT_ENGINE is set to .*nowhere"):
        find_engine()


def test_engine_not_built_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.delenv("FACT_ENGINE", raising=False)
    monkeypatch.setattr(engine, "BUILD_ENGINE", tmp_path / "build" / "fact-engine")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineNotFoundError) as caught:
        find_engine()
    message = str(caught.value)
    assert "./setup.sh" in message and "cmake -S . -B build" in message


def test_engine_found_in_build_then_path(tmp_path, monkeypatch):
    monkeypatch.delenv("FACT_ENGINE", raising=False)
    built = tmp_path / "build" / "fact-engine"
    built.parent.mkdir()
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    monkeypatch.setattr(engine, "BUILD_ENGINE", built)
    assert find_engine() == built
    on_path = tmp_path / "bin" / "fact-engine"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setattr(engine, "BUILD_ENGINE", tmp_path / "missing")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_engine() == on_path


def test_build_engine_is_in_the_repo():
    assert engine.BUILD_ENGINE == REPO / "build" / "fact-engine"


# --- the exit-status contract ----------------------------------------------------------------


def test_engine_json_passes_json_flag(fake_engine, graph_file):
    plan = engine_json("discover", graph_file, "--arch", "sm80")
    assert plan == {"subcommand": "discover", "kernels": []}
    assert fake_engine()[-1]["args"] == ["discover", str(graph_file), "--arch", "sm80", "--json"]


def test_engine_user_error_carries_its_message(fake_engine, graph_file, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_MODE", "user")
    with pytest.raises(EngineError) as caught:
        run_engine(["explain", str(graph_file), "--node", "nope"])
    assert str(caught.value) == "no node named 'nope' in the graph"


def test_engine_crash_is_an_internal_error(fake_engine, graph_file, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_MODE", "crash")
    with pytest.raises(EngineCrashError) as caught:
        run_engine(["discover", str(graph_file)])
    message = str(caught.value)
    assert "internal error" in message and "exited with status 134" in message
    assert "assertion failed: plan.cc:42" in message


def test_engine_invalid_json_is_an_internal_error(fake_engine, graph_file, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_MODE", "badjson")
    with pytest.raises(EngineCrashError, match="printed invalid JSON"):
        engine_json("discover", graph_file)


def test_engine_warnings_reach_stderr(fake_engine, graph_file, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_ENGINE_MODE", "warn")
    done = run_engine(["print", str(graph_file)])
    assert done.stdout == f"plan for {graph_file}\n"
    assert "warning: registry is empty" in capsys.readouterr().err


# --- CLI commands that run the engine --------------------------------------------------------


def test_cli_discover_graph(fake_engine, graph_file, capsys):
    code = main(["discover", str(graph_file), "--json", "--arch", "sm80", "--gpu", "h100"])
    assert code == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"subcommand": "discover", "kernels": []}
    assert captured.err == ""  # nothing traced, nothing to report
    assert fake_engine()[-1]["args"] == [
        "discover",
        str(graph_file),
        "--arch",
        "sm80",
        "--gpu",
        "h100",
        "--json",
    ]


def test_cli_discover_problem_traces_then_runs(fake_engine, tmp_path, capsys):
    problem = tmp_path / "tiny.py"
    problem.write_text(
        textwrap.dedent(
            """
            import torch
            class Model(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.proj = torch.nn.Linear(4, 4)
                def forward(self, x):
                    return torch.relu(self.proj(x))
            def get_inputs():
                return [torch.randn(2, 4)]
            def get_init_inputs():
                return []
            """
        )
    )
    saved = tmp_path / "saved.json"
    code = main(["discover", str(problem), "--dtype", "bf16", "--save-graph", str(saved)])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("plan for ")
    assert f"tracing {problem} as bf16 ..." in captured.err
    (call,) = fake_engine()
    assert call["args"] == ["discover", str(saved)]
    assert call["nodes"] == len(json.loads(saved.read_text())["nodes"]) == 5

    # without --save-graph the graph lives in a temporary file that is gone afterwards
    assert main(["discover", str(problem), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["subcommand"] == "discover"
    temp_graph = fake_engine()[-1]["args"][1]
    assert fake_engine()[-1]["nodes"] == 5
    assert not os.path.exists(temp_graph)


def test_cli_explain(fake_engine, graph_file, capsys):
    assert main(["explain", str(graph_file), "--node", "linear", "--arch", "sm90"]) == 0
    assert fake_engine()[-1]["args"] == [
        "explain",
        str(graph_file),
        "--node",
        "linear",
        "--arch",
        "sm90",
    ]
    assert capsys.readouterr().out == f"plan for {graph_file}\n"


def test_cli_engine_user_error(fake_engine, graph_file, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_ENGINE_MODE", "user")
    assert main(["explain", str(graph_file), "--node", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "fact: error: no node named 'nope' in the graph\n"
    assert captured.out == ""


def test_cli_engine_missing_fails_before_tracing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FACT_ENGINE", str(tmp_path / "nowhere"))
    assert main(["discover", str(EXAMPLES / "minigpt_block.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fact: error: FACT_ENGINE is set to")
    assert "tracing" not in err


def test_discover_api(fake_engine):
    plan = fact.discover(torch.nn.Linear(4, 4), [torch.randn(2, 4)], dtype="fp16", arch="sm80")
    assert plan == {"subcommand": "discover", "kernels": []}
    args = fake_engine()[-1]["args"]
    assert args[0] == "discover" and args[2:] == ["--arch", "sm80", "--json"]
    with pytest.raises(fact.FactError, match="example inputs are missing"):
        fact.discover(torch.nn.Linear(4, 4))


def test_import_fact_does_not_import_torch():
    code = "import sys, fact, fact.cli, fact.engine; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_python_dash_m_fact():
    done = subprocess.run(
        [sys.executable, "-m", "fact", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == f"fact {fact.__version__}"


# --- the real engine (skipped until it is built) ---------------------------------------------


def test_real_engine_validates_minigpt(engine_available, minigpt, tmp_path):
    _, _, graph = minigpt
    path = fact.save_graph(graph, tmp_path / "minigpt.json")
    done = subprocess.run(
        [str(engine_available), "validate", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_real_engine_discover_json(engine_available, minigpt, tmp_path):
    _, _, graph = minigpt
    path = fact.save_graph(graph, tmp_path / "minigpt.json")
    plan = engine_json("discover", path)
    assert isinstance(plan, dict)


def test_real_engine_refuses_dynamic_graph(engine_available, tmp_path):
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    graph = fact.trace(
        Double(), [torch.randn(4, 3)], dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    path = fact.save_graph(graph, tmp_path / "dynamic.json")
    with pytest.raises(EngineError, match="x"):  # the message names the node
        run_engine(["validate", str(path)])


def test_problem_files_get_the_layout_rewrites_of_their_target(tmp_path, capsys, fake_engine):
    """discover, explain and realize of a problem file, and fact.discover(), plan what
    fact.optimize plans: an fp32 model under TF32 on sm90 gets V^T from its projection
    (fact.layouts). `fact trace` writes the graph as exported unless --arch names a target.
    The graph records the precision it was traced under; torch's is restored afterwards."""
    problem = tmp_path / "attn.py"
    problem.write_text(
        textwrap.dedent(
            """
            import torch
            from attention_modules import HandWrittenAttention
            class Model(HandWrittenAttention):
                pass
            def get_inputs():
                return [torch.randn(2, 32, 64)]
            def get_init_inputs():
                return []
            """
        )
    )
    line = "layout: V of linear as V^T (64 x 64, keys contiguous)"

    def ops(graph_file):
        graph = json.loads(graph_file.read_text())
        return graph["float32_matmul_precision"], [n["op"] for n in graph["nodes"]]

    before = torch.get_float32_matmul_precision()
    cases = [
        (["trace", "--precision", "high"], "high", False),  # the graph as exported
        (["trace", "--precision", "high", "--arch", "sm90"], "high", True),
        (["trace", "--precision", "high", "--arch", "sm80"], "high", False),  # no TF32 FMHA
        (["trace", "--precision", "highest", "--arch", "sm90"], "highest", False),  # fp32-exact
        (["discover", "--precision", "high"], "high", True),  # sm90 unless --arch says else
        (["discover", "--precision", "medium", "--arch", "sm90"], "medium", True),
        (["discover", "--precision", "high", "--arch", "sm80"], "high", False),
    ]
    for i, (args, precision, rewritten) in enumerate(cases):
        out = tmp_path / f"g{i}.json"
        save = ["-o", str(out)] if args[0] == "trace" else ["--save-graph", str(out)]
        assert main([args[0], str(problem), *args[1:], *save]) == 0, args
        err = capsys.readouterr().err
        recorded, graph_ops = ops(out)
        assert recorded == precision and ("aten.addmm.default" in graph_ops) is rewritten, args
        assert (line in err) is rewritten, (args, err)
        assert torch.get_float32_matmul_precision() == before
    assert [c["args"][0] for c in fake_engine()] == ["discover"] * 3
    # the Python API plans the same graph as the CLI (the fake engine logs its node count; the
    # rewrite adds nodes)
    torch.set_float32_matmul_precision("high")
    try:
        assert fact.discover(str(problem))["subcommand"] == "discover"
    finally:
        torch.set_float32_matmul_precision(before)
    assert fake_engine()[-1]["nodes"] == len(ops(tmp_path / "g4.json")[1])
    assert len(ops(tmp_path / "g4.json")[1]) != len(ops(tmp_path / "g0.json")[1])


# ---------------------------------------------------------------------------------------------
# Front-door errors found by a review: each a one-line message, never a traceback


def test_cli_registry_passes_its_options_to_the_engine(engine_available, tmp_path, capsys):
    """`fact registry --registry X list` and `fact registry -h` are the engine's command as
    given (argparse took the options as its own and refused them)."""
    registry = tmp_path / "r.db"
    export = tmp_path / "empty.json"
    export.write_text(json.dumps({"fact_registry_export": 1, "rows": []}))
    assert main(["registry", "import", str(export), "--registry", str(registry)]) == 0
    capsys.readouterr()
    assert main(["registry", "--registry", str(registry), "list"]) == 0
    assert capsys.readouterr().out == f"registry {registry}: no rows\n"
    assert main(["registry", "-h"]) == 0
    assert "list, show, export or import" in capsys.readouterr().out


def test_cli_tune_on_a_damaged_run_says_what_to_do(engine_available, tmp_path, capsys):
    registry = tmp_path / "r.db"
    export = tmp_path / "empty.json"
    export.write_text(json.dumps({"fact_registry_export": 1, "rows": []}))
    assert main(["registry", "import", str(export), "--registry", str(registry)]) == 0
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("[]")
    (run / "plan.json").write_text('{"patterns": [')  # cut short
    capsys.readouterr()
    assert main(["tune", str(run), "--registry", str(registry)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fact: error: cannot read {run / 'plan.json'}: ")
    assert err.rstrip().endswith("run `fact realize` again into a fresh --out")
    not_db = tmp_path / "not.db"
    not_db.write_text("not a database")
    assert main(["tune", str(run), "--registry", str(not_db)]) == 2  # before any tuning
    assert "file is not a database" in capsys.readouterr().err


def test_cli_a_graph_file_that_is_not_text(engine_available, tmp_path, capsys):
    bad = tmp_path / "bin.json"
    bad.write_bytes(b"\xff\xfe")
    assert main(["discover", str(bad)]) == 2
    assert "malformed JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    "inputs, message",
    [
        (None, "must be a tensor or a list (or tuple) of forward's arguments, got NoneType"),
        (3, "got int"),
        ({"x": torch.randn(2, 4)}, r"as a dict: pass forward's arguments as a list"),
    ],
)
def test_trace_refuses_example_inputs_it_cannot_take(inputs, message):
    with pytest.raises(fact.FactError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fact.trace(torch.nn.Linear(4, 4), inputs)


def test_optimize_with_an_unusable_cache_directory(engine_available, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FACT_CACHE_DIR", str(blocker))
    with pytest.raises(fact.FactError, match=r"cannot make the run directory .* \(FACT_CACHE_DIR"):
        fact.optimize(torch.nn.Linear(4, 4).eval(), [torch.randn(2, 4)], quiet=True)
