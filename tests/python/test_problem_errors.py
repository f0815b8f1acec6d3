"""Loading problem files: good ones load and cast; each bad one is a FactError naming the file.

Through the CLI the same mistakes exit 2 with `fact: error: ...` on stderr and no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fact.cli import main
from fact.errors import FactError, ProblemError
from fact.problem import load_problem
from helpers import EXAMPLES

GOOD = """
import torch
from torch import nn

class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, ids):
        return self.drop(self.proj(x)) + ids.unsqueeze(-1)

def get_inputs():
    return [torch.randn(2, 8), torch.arange(2)]

def get_init_inputs():
    return [8]
"""

BAD = {
    "syntax_error": ("def f(:\n    pass\n", "raised SyntaxError: invalid syntax"),
    "import_raises": ("raise RuntimeError('no GPU here')\n", "raised RuntimeError: no GPU here"),
    "missing_module": (
        "import no_such_module_for_fact\n",
        "raised ModuleNotFoundError: No module named 'no_such_module_for_fact'",
    ),
    "exits": ("import sys\nsys.exit(3)\n", "raised SystemExit: 3"),
    "no_model": ("def get_inputs():\n    return []\n", "defines no `Model`"),
    "model_not_module": (
        "Model = 3\ndef get_inputs():\n    return []\n",
        "`Model` in {path} is an int, not an nn.Module subclass",
    ),
    "no_get_inputs": (
        "import torch\nclass Model(torch.nn.Module):\n    pass\n",
        "defines no `get_inputs()`",
    ),
    "get_inputs_not_list": (
        "import torch\nclass Model(torch.nn.Module):\n    pass\n"
        "def get_inputs():\n    return torch.randn(2)\n",
        "get_inputs() in {path} returned a Tensor; it must return a list of tensors",
    ),
    "get_inputs_non_tensor": (
        "import torch\nclass Model(torch.nn.Module):\n    pass\n"
        "def get_inputs():\n    return [torch.randn(2), 'x']\n",
        "returned a str at position 1; every example input must be a tensor, a number",
    ),
    "get_inputs_raises": (
        "import torch\nclass Model(torch.nn.Module):\n    pass\n"
        "def get_inputs():\n    raise ValueError('no data for batch 0')\n",
        "get_inputs() in {path} raised ValueError: no data for batch 0",
    ),
    "model_init_raises": (
        "import torch\nclass Model(torch.nn.Module):\n"
        "    def __init__(self, n):\n        super().__init__()\n"
        "def get_inputs():\n    return []\n",
        "Model(*get_init_inputs()) in {path} raised TypeError:",
    ),
    "init_inputs_not_list": (
        "import torch\nclass Model(torch.nn.Module):\n    pass\n"
        "def get_inputs():\n    return []\ndef get_init_inputs():\n    return 8\n",
        "get_init_inputs() in {path} returned an int",
    ),
}


@pytest.fixture(params=sorted(BAD))
def bad_problem(request, tmp_path):
    source, expected = BAD[request.param]
    path = tmp_path / f"{request.param}.py"
    path.write_text(source)
    return path, expected.format(path=path)


def test_bad_problem_is_a_problem_error(bad_problem):
    path, expected = bad_problem
    with pytest.raises(ProblemError) as caught:
        load_problem(path)
    message = str(caught.value)
    assert str(path) in message
    assert expected in message
    assert "Traceback" not in message


def test_bad_problem_through_cli(bad_problem, tmp_path, capsys):
    path, expected = bad_problem
    out = tmp_path / "graph.json"
    assert main(["trace", str(path), "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error_line = captured.err.splitlines()[-1]
    assert error_line.startswith("fact: error: ")
    assert str(path) in error_line and expected in captured.err
    assert "Traceback" not in captured.err
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("missing.py", "problem file {path} not found"),
        ("notes.txt", "{path} is not a Python file (.py)"),
        ("folder.py", "{path} is a folder, not a problem file"),
        ("graph.json", "a traced graph (.json) goes to `fact discover`"),
    ],
)
def test_path_errors(tmp_path, name, expected):
    path = tmp_path / name
    if name == "folder.py":
        path.mkdir()
    elif name != "missing.py":
        path.write_text("{}")
    with pytest.raises(ProblemError) as caught:
        load_problem(path)
    assert expected.format(path=path) in str(caught.value)


def test_good_problem_loads_in_eval_mode(tmp_path):
    path = tmp_path / "good.py"
    path.write_text(textwrap.dedent(GOOD))
    problem = load_problem(path)
    assert problem.name == "Model"
    assert problem.path == path
    assert not problem.model.training
    assert problem.model.proj.in_features == 8  # get_init_inputs() reached the constructor
    assert [t.dtype for t in problem.inputs] == [torch.float32, torch.int64]


def test_dtype_casts_model_and_float_inputs_only(tmp_path):
    path = tmp_path / "good.py"
    path.write_text(textwrap.dedent(GOOD))
    problem = load_problem(path, "bf16")
    assert problem.model.proj.weight.dtype == torch.bfloat16
    assert [t.dtype for t in problem.inputs] == [torch.bfloat16, torch.int64]
    with pytest.raises(FactError, match="unknown dtype 'int4'"):
        load_problem(path, "int4")


def test_get_init_inputs_is_optional(tmp_path):
    path = tmp_path / "no_init.py"
    path.write_text(
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x + 1\ndef get_inputs():\n    return (torch.randn(3),)\n"
    )
    assert len(load_problem(path).inputs) == 1


def test_problem_may_import_a_helper_beside_it(tmp_path):
    (tmp_path / "shared_layers_for_fact_test.py").write_text("WIDTH = 5\n")
    path = tmp_path / "uses_helper.py"
    path.write_text(
        "import torch\nfrom shared_layers_for_fact_test import WIDTH\n"
        "class Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
        "def get_inputs():\n    return [torch.randn(WIDTH)]\n"
    )
    assert load_problem(path).inputs[0].shape == (5,)


def test_cli_trace_writes_graph(tmp_path, capsys):
    path = tmp_path / "good.py"
    path.write_text(textwrap.dedent(GOOD))
    out = tmp_path / "good.json"
    assert main(["trace", str(path), "--dtype", "fp16", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"tracing {path} as fp16 ..." in captured.err
    assert "traced " in captured.err and " nodes in " in captured.err
    graph = json.loads(out.read_text())
    assert graph["source"] == str(path)
    assert graph["dtype"] == "f16"
    dropout = [n for n in graph["nodes"] if n["op"] == "aten.dropout.default"]
    assert dropout and dropout[0]["args"][1:] == [0.5, False]  # eval mode: train=False


def test_cli_trace_of_data_dependent_model(tmp_path, capfd):
    path = tmp_path / "branchy.py"
    path.write_text(
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        if x.max() > 0:\n            return x\n        return -x\n"
        "def get_inputs():\n    return [torch.randn(4)]\n"
    )
    assert main(["trace", str(path), "-o", str(tmp_path / "g.json")]) == 2
    err = capfd.readouterr().err
    assert f"fact: error: torch.export could not trace Model ({path})" in err
    assert "if x.max() > 0:" in err and "hint:" in err
    assert "Traceback" not in err


def test_cli_usage_errors(tmp_path, capsys):
    graph = tmp_path / "g.json"
    graph.write_text("{}")
    assert main(["discover", str(graph), "--dtype", "bf16"]) == 2
    assert "traced already" in capsys.readouterr().err
    assert main(["discover", str(tmp_path / "model.onnx")]) == 2
    assert "neither a problem file (.py) nor a traced graph (.json)" in capsys.readouterr().err
    assert main(["discover", str(tmp_path / "absent.json")]) == 2
    assert "graph file" in capsys.readouterr().err
    assert main(["trace", str(graph), "-o", str(tmp_path / "x.json")]) == 2
    assert "is a graph already" in capsys.readouterr().err
    assert main(["trace", str(EXAMPLES / "minigpt_block.py")]) == 2  # -o is required
    assert "-o" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["--version"]) == 0
    assert "fact 0.1.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["realize", "--candidates", "0"],
        ["realize", "--jobs", "-1"],
        ["bench", "--reps", "0"],
        ["bench", "--candidates", "x"],
    ],
)
def test_cli_counts_below_one_are_refused_before_tracing(tmp_path, capsys, args):
    """A count of 0 (or not a number) is refused by the front door with the option named,
    before the model is traced; the engine's own message for it was a range up to 1.8e308."""
    command, *rest = args
    target = str(EXAMPLES / "minigpt_block.py")
    assert main([command, target, "--out", str(tmp_path / "r"), *rest]) == 2
    err = capsys.readouterr().err
    assert f"argument {rest[0]}" in err and ("at least 1" in err or "whole number" in err), err
    assert "tracing" not in err and not (tmp_path / "r").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_cli_output_that_cannot_be_written_is_one_line(engine_available):
    """`fact discover ... > /dev/full`: one line naming the failure, exit status 1, no
    traceback (before: an OSError traceback from the write, and another at exit)."""
    graph = Path(__file__).resolve().parents[1] / "cpp" / "data" / "mlp_block.json"
    env = dict(os.environ, FACT_ENGINE=str(engine_available))
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "fact", "discover", str(graph)], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "fact: error: cannot write the output: No space left on device"
    )
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
