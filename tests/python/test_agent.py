"""The agent (fact.agent) against a local mock of a chat-completions endpoint on loopback that
replays scripted answers in the exact shape such an endpoint returns: the happy path ends with an
accepted lowering in the registry that a later plan uses with the server gone; every gate rejects
its bad answer; transport faults fall back to the catalog and say so; the budget stops a run;
and the default path makes no connection."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fact.agent import lowering
from fact.agent.client import AgentError, Budget, BudgetExhausted, Client, Settings
from fact.agent.propose import proposals, propose
from helpers import REPO

HARDSHRINK = lowering.EXAMPLE  # the prompt's worked example: a lowering the gates accept

PROBLEM = """
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 128)
    def forward(self, x):
        return F.hardshrink(self.fc(x), lambd=0.3)
def get_inputs():
    return [torch.randn(32, 64)]
def get_init_inputs():
    return []
"""


def completion(content: str, finish: str = "stop") -> dict:
    """A chat-completions answer, as OpenAI-compatible servers return it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "mock",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],  # fmt: skip
        "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
    }


class MockEndpoint:
    """Answers POST /v1/chat/completions from a script: (status, body) per request, where body
    is a dict (sent as JSON), bytes (sent as is) or "hang" (no answer before the timeout)."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                outer.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"),
                     "body": json.loads(self.rfile.read(length))}
                )  # fmt: skip
                status, body = outer.script.pop(0) if outer.script else (500, b"no script")
                if body == "hang":
                    threading.Event().wait(3)
                    return
                data = json.dumps(body).encode() if isinstance(body, dict) else body
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def problem(tmp_path) -> Path:
    path = tmp_path / "shrink.py"
    path.write_text(PROBLEM)
    return path


@pytest.fixture
def registry(tmp_path, monkeypatch) -> str:
    path = tmp_path / "registry.db"
    monkeypatch.setenv("FACT_REGISTRY", str(path))
    monkeypatch.setenv("FACT_CACHE_DIR", str(tmp_path / "cache"))
    return str(path)


def client_for(url: str, tmp_path: Path, mode: str = "live", **budget) -> Client:
    settings = Settings(url=url, model="mock", key="sk-secret", timeout_s=1.0)
    return Client(settings, mode, tmp_path / "responses", Budget(**budget),
                  transcripts=tmp_path / "transcripts" if mode == "record" else None)  # fmt: skip


def plan_of(problem: Path, tmp_path: Path) -> dict:
    from fact.engine import engine_json
    from fact.problem import load_problem
    from fact.tracer import save_graph, trace

    loaded = load_problem(str(problem), None)
    path = save_graph(trace(loaded.model, loaded.inputs), tmp_path / "g.json")
    return engine_json("discover", path)


def test_an_accepted_lowering_is_kept_and_used_without_the_server(
    engine_available, problem, registry, tmp_path
):
    before = plan_of(problem, tmp_path)
    assert [p["epilogue"] for p in before["patterns"]] == [["bias"]]
    answer = "Here it is:\n```json\n" + json.dumps(HARDSHRINK) + "\n```"
    with MockEndpoint([(200, completion(answer))]) as server:
        client = client_for(server.url, tmp_path, mode="record")
        summary = propose(str(problem), tmp_path / "run", client, log=lambda s: None)
    assert summary["ops"] == {"hardshrink": "accepted"}
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-secret"
    assert (
        "aten::hardshrink(Tensor self, Scalar lambd=0.5)"
        in request["body"]["messages"][1]["content"]
    )
    (row,) = proposals(registry, "lowering", "accepted")
    assert row["key"] == "hardshrink" and [g["gate"] for g in row["gates"]] == [
        "schema", "numeric", "plan"
    ]  # fmt: skip
    assert row["provenance"]["endpoint_host"] == "127.0.0.1"
    assert "sk-secret" not in json.dumps(row) and "sk-secret" not in json.dumps(
        [json.loads(p.read_text()) for p in (tmp_path / "transcripts").iterdir()]
    )
    transcript = (tmp_path / "run" / "transcript.txt").read_text()
    assert "gate numeric: passed" in transcript and "proposal 1 accepted" in transcript
    # The server is gone: the next plan takes the lowering from the registry.
    after = plan_of(problem, tmp_path)
    assert [p["epilogue"] for p in after["patterns"]] == [["bias", "hardshrink"]]
    assert after["lowerings"] == ["hardshrink"]
    # ... and a second run finds nothing left to ask for.
    again = propose(str(problem), tmp_path / "run2", None, log=lambda s: None)
    assert again["ops"] == {}


def test_replay_answers_from_the_cache_and_never_connects(
    engine_available, problem, registry, tmp_path
):
    with MockEndpoint([(200, completion(json.dumps(HARDSHRINK)))]) as server:
        url = server.url
        propose(str(problem), tmp_path / "r1", client_for(url, tmp_path), log=lambda s: None)
    rows = proposals(registry)
    from fact.agent.propose import set_status

    set_status(rows[0]["id"], "rejected", registry)
    with no_connections():
        with pytest.raises(AgentError, match="replay: no cached answer"):
            client_for(url, tmp_path, mode="replay").complete(
                [{"role": "user", "content": "other"}], lowering.TEMPLATE
            )
        text = client_for(url, tmp_path, mode="replay").complete(
            lowering.messages("hardshrink"), lowering.TEMPLATE
        )
    assert json.loads(text) == HARDSHRINK


WRONG_AT_BRANCH = json.loads(json.dumps(HARDSHRINK))
WRONG_AT_BRANCH["ssa"][4]["op"] = "lt"  # keeps x where |x| == lambd
WRONG_DEFAULT = json.loads(json.dumps(HARDSHRINK))
WRONG_DEFAULT["params"][0]["default"] = 0.6  # F.hardshrink(x) would shrink by 0.6, not 0.5
HUGE = json.loads(json.dumps(HARDSHRINK))
HUGE["ssa"] += [{"id": i, "op": "neg", "args": [i - 1]} for i in range(6, 10_006)]
SMUGGLED = json.loads(json.dumps(HARDSHRINK))
SMUGGLED["ssa"][3]["op"] = 'abs(x)); system("rm -rf /"); (('
SMUGGLED_NUMBER = json.loads(json.dumps(HARDSHRINK))
SMUGGLED_NUMBER["ssa"][2]["value"] = '0.0f); asm("trap;"); float y = (0.0'


@pytest.mark.parametrize(
    ("answer", "gate", "why"),
    [
        (WRONG_AT_BRANCH, "numeric", "differs from aten.hardshrink in float64 at (0.5"),
        (WRONG_DEFAULT, "schema", "aten.hardshrink's default is 0.5"),
        (HUGE, "schema", "at most 256"),
        (SMUGGLED, "schema", "not a function of the vocabulary"),
        (SMUGGLED_NUMBER, "schema", "must be a number"),
        ({**HARDSHRINK, "inputs": ["input"]}, "schema", "not the schema's"),
    ],
    ids=[
        "wrong_at_a_branch_point",
        "wrong_default",
        "10000_nodes",
        "source_as_a_name",
        "source_as_a_number",
        "wrong_arguments",
    ],  # fmt: skip
)
def test_each_gate_rejects_its_bad_answer(
    engine_available, problem, registry, tmp_path, answer, gate, why
):
    with MockEndpoint([(200, completion(json.dumps(answer)))]) as server:
        summary = propose(str(problem), tmp_path / "run", client_for(server.url, tmp_path),
                          log=lambda s: None)  # fmt: skip
    assert summary["ops"] == {"hardshrink": "rejected"}
    (row,) = proposals(registry, "lowering")
    assert row["status"] == "rejected"
    failed = [g for g in row["gates"] if not g["passed"]]
    assert failed[0]["gate"] == gate and why in failed[0]["why"], row["gates"]
    assert not proposals(registry, "lowering", "accepted")
    assert [p["epilogue"] for p in plan_of(problem, tmp_path)["patterns"]] == [["bias"]]


def test_a_lowering_that_changes_another_ops_meaning_fails_numerics():
    """A relu proposed as hardshrink's lowering: right at many points, wrong at others."""
    relu = {
        "op": "hardshrink",
        "inputs": ["self"],
        "params": [{"name": "lambd", "default": 0.5}],
        "ssa": [{"id": 0, "op": "input", "index": 0}, {"id": 1, "op": "relu", "args": [0]}],
    }
    ok, why = lowering.numeric_gate("hardshrink", relu)
    assert not ok and "differs from aten.hardshrink" in why


def test_the_gates_refuse_what_is_exact_only_in_float64_or_not_an_expression():
    """log(1 + x) for log1p cancels in float32, where the kernels compute; an in-place op
    returns its written input, which no expression is; an op without an IEEE answer at inf."""
    log1p = {
        "op": "log1p",
        "inputs": ["self"],
        "params": [],
        "ssa": [{"id": 0, "op": "input", "index": 0}, {"id": 1, "op": "constant", "value": 1.0},
                {"id": 2, "op": "add", "args": [0, 1]}, {"id": 3, "op": "log", "args": [2]}],
    }  # fmt: skip
    ok, why = lowering.numeric_gate("log1p", log1p)
    assert not ok and "in float32" in why
    identity = {"op": "exp2_", "inputs": ["self"], "params": [],
                "ssa": [{"id": 0, "op": "input", "index": 0}]}  # fmt: skip
    (verdict,) = lowering.gates("exp2_", identity)
    assert not verdict["passed"] and "writes or aliases its input" in verdict["why"]
    hypot = {
        "op": "hypot",
        "inputs": ["self", "other"],
        "params": [],
        "ssa": [{"id": 0, "op": "input", "index": 0}, {"id": 1, "op": "input", "index": 1},
                {"id": 2, "op": "mul", "args": [0, 0]}, {"id": 3, "op": "mul", "args": [1, 1]},
                {"id": 4, "op": "add", "args": [2, 3]}, {"id": 5, "op": "sqrt", "args": [4]}],
    }  # fmt: skip
    ok, why = lowering.numeric_gate("hypot", hypot)  # hypot(inf, nan) is inf
    assert not ok and "inf" in why


def test_a_persons_rejection_stands_when_the_same_answer_comes_again(
    engine_available, problem, registry, tmp_path
):
    from fact.agent.client import Answers
    from fact.agent.propose import set_status

    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"hardshrink": json.dumps(HARDSHRINK)}))
    propose(str(problem), tmp_path / "a", None, Answers(answers), log=lambda s: None)
    (row,) = proposals(registry)
    set_status(row["id"], "rejected", registry)
    respelt = json.loads(json.dumps(HARDSHRINK))
    for e in respelt["ssa"]:
        del e["id"]
    respelt["ssa"][2]["value"] = 0  # 0 for 0.0: the same answer
    answers.write_text(json.dumps({"hardshrink": json.dumps(respelt)}))
    summary = propose(str(problem), tmp_path / "b", None, Answers(answers), log=lambda s: None)
    assert summary["ops"] == {"hardshrink": "rejected before"}
    assert [r["status"] for r in proposals(registry)] == ["rejected"]


def test_a_redirect_is_not_followed(tmp_path):
    script = [(302, b"")]
    with MockEndpoint(script) as server:
        client = client_for(server.url, tmp_path)
        with pytest.raises(AgentError, match="HTTP 302"):
            client.complete([{"role": "user", "content": "x"}], "t")


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ([(429, b'{"error": "rate limited"}')], "HTTP 429"),
        ([(500, b"oops")], "HTTP 500"),
        ([(200, "hang")], "could not be reached"),
        ([(200, b'{"choices": [{"message": {"content": "{\\"op\\": "')], "not JSON"),
        ([(200, b"<html>busy</html>")], "not JSON"),
        ([(200, completion("{}", finish="length"))], "cut off"),
        ([(200, completion("I cannot help")), (200, completion("still no"))], "not usable"),
    ],
    ids=["429", "500", "timeout", "truncated", "html", "length", "no_json_twice"],
)
def test_transport_faults_fall_back_to_the_catalog(
    engine_available, problem, registry, tmp_path, script, message
):
    with MockEndpoint(script) as server:
        summary = propose(str(problem), tmp_path / "run", client_for(server.url, tmp_path),
                          log=lambda s: None)  # fmt: skip
    assert (
        summary["ops"]["hardshrink"].startswith("no answer")
        and message in summary["ops"]["hardshrink"]
    ), summary
    assert "the op stays in PyTorch" in (tmp_path / "run" / "transcript.txt").read_text()
    assert not proposals(registry, "lowering", "accepted")


def test_a_bad_answer_gets_one_repair_turn(engine_available, problem, registry, tmp_path):
    script = [(200, completion("Sure! The lowering is below.")),
              (200, completion(json.dumps(HARDSHRINK)))]  # fmt: skip
    with MockEndpoint(script) as server:
        summary = propose(str(problem), tmp_path / "run", client_for(server.url, tmp_path),
                          log=lambda s: None)  # fmt: skip
    assert summary["ops"] == {"hardshrink": "accepted"}
    assert len(server.requests) == 2
    assert "not usable" in server.requests[1]["body"]["messages"][-1]["content"]


def test_the_budget_stops_before_a_request(tmp_path):
    with MockEndpoint([(200, completion("{}"))] * 5) as server:
        client = client_for(server.url, tmp_path, max_calls=2)
        for i in range(2):
            client.complete([{"role": "user", "content": f"q{i}"}], "t")
        with pytest.raises(BudgetExhausted, match="2 calls"):
            client.complete([{"role": "user", "content": "q3"}], "t")
    assert len(server.requests) == 2
    with MockEndpoint([(200, completion("x" * 400))] * 5) as server:
        client = client_for(server.url, tmp_path, max_tokens=100)
        client.complete([{"role": "user", "content": "a"}], "t")
        with pytest.raises(BudgetExhausted, match="100 tokens"):
            client.complete([{"role": "user", "content": "b"}], "t")


def test_dry_run_and_answers_need_no_endpoint(engine_available, problem, registry, tmp_path):
    with no_connections():
        summary = propose(str(problem), tmp_path / "dry", None, dry_run=True, log=lambda s: None)
        assert summary["ops"] == {"hardshrink": "prompt written"}
        chat = json.loads((tmp_path / "dry" / "prompt-hardshrink.json").read_text())
        assert chat[0]["role"] == "system" and "hardshrink" in chat[1]["content"]
        from fact.agent.client import Answers

        answers = tmp_path / "answers.json"
        answers.write_text(json.dumps({"hardshrink": json.dumps(HARDSHRINK)}))
        summary = propose(str(problem), tmp_path / "pasted", None, Answers(answers),
                          log=lambda s: None)  # fmt: skip
    assert summary["ops"] == {"hardshrink": "accepted"}
    assert proposals(registry, "lowering", "accepted")[0]["provenance"]["source"] == "answers file"


def test_no_endpoint_is_a_clear_error(tmp_path):
    with pytest.raises(AgentError, match="FACT_AGENT_URL"):
        Client(Settings(), "live", tmp_path, Budget())


class no_connections:  # noqa: N801
    """Any socket connection in the block fails the test."""

    def __enter__(self):
        self.saved = socket.socket.connect

        def refuse(sock, address):
            raise AssertionError(f"a connection to {address} was made")

        socket.socket.connect = refuse
        return self

    def __exit__(self, *exc):
        socket.socket.connect = self.saved


def test_the_default_path_makes_no_connection(engine_available, registry, tmp_path):
    import torch

    import fact

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Hardshrink()).eval()
    with no_connections():
        opt = fact.optimize(model, [torch.randn(4, 16)], run_dir=tmp_path / "r", quiet=True,
                            use_cache=False)  # fmt: skip
        fact.discover(model, [torch.randn(4, 16)])
    assert opt.report["patterns"]


def test_cli_list_accept_reject_export(engine_available, problem, registry, tmp_path, capsys):
    from fact.agent.client import Answers
    from fact.cli import main

    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"hardshrink": json.dumps(WRONG_AT_BRANCH)}))
    propose(str(problem), tmp_path / "a", None, Answers(answers), log=lambda s: None)
    answers.write_text(json.dumps({"hardshrink": json.dumps(HARDSHRINK)}))
    propose(str(problem), tmp_path / "b", None, Answers(answers), log=lambda s: None)
    assert main(["agent", "list"]) == 0
    listed = capsys.readouterr().out
    assert "rejected  (failed numeric)" in listed and "accepted" in listed
    bad, good = (r["id"] for r in proposals(registry))
    assert main(["agent", "accept", str(bad)]) == 2
    assert "failed FACT's gates" in capsys.readouterr().err
    assert main(["agent", "reject", str(good)]) == 0
    assert not proposals(registry, "lowering", "accepted")
    assert main(["agent", "accept", str(good)]) == 0
    assert main(["agent", "export", "-o", str(tmp_path / "low.json")]) == 0
    assert json.loads((tmp_path / "low.json").read_text())[0]["op"] == "hardshrink"
    (tmp_path / "check").mkdir()
    (tmp_path / "check" / "good.json").write_text(json.dumps(HARDSHRINK))
    assert main(["agent", "check", str(tmp_path / "check")]) == 0
    (tmp_path / "check" / "bad.json").write_text(json.dumps(WRONG_AT_BRANCH))
    assert main(["agent", "check", str(tmp_path / "check")]) == 1
    assert main(["agent", "accept", "999"]) == 2


def test_accepted_lowerings_are_part_of_the_decision_key(
    engine_available, problem, registry, tmp_path
):
    from fact.agent.client import Answers
    from fact.compose.optimize import _lowerings_digest

    before = _lowerings_digest()
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"hardshrink": json.dumps(HARDSHRINK)}))
    propose(str(problem), tmp_path / "a", None, Answers(answers), log=lambda s: None)
    assert _lowerings_digest() != before


def test_the_shipped_lowerings_pass_the_gates(engine_available, registry, tmp_path):
    """data/lowerings.json (imported by setup.sh) enters a registry through the same gates."""
    from fact.cli import main

    assert main(["agent", "import", str(REPO / "data" / "lowerings.json")]) == 0
    rows = proposals(registry, "lowering")
    shipped = json.loads((REPO / "data" / "lowerings.json").read_text())
    assert len(rows) == len(shipped) and {r["status"] for r in rows} == {"accepted"}
    assert main(["agent", "import", str(REPO / "data" / "lowerings.json")]) == 0  # again: no-op
    assert len(proposals(registry, "lowering")) == len(shipped)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([WRONG_AT_BRANCH]))
    assert main(["agent", "import", str(bad)]) == 1


def test_optimize_asks_the_agent_when_told_and_plans_what_passed(
    engine_available, registry, tmp_path, monkeypatch
):
    import torch

    import fact

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Hardshrink(0.3)).eval()
    x = torch.randn(8, 32)
    plain = fact.optimize(model, [x], run_dir=tmp_path / "r0", quiet=True, use_cache=False)
    assert not any("hardshrink" in p["signature"] for p in plain.report["patterns"])
    with MockEndpoint([(200, completion(json.dumps(HARDSHRINK)))]) as server:
        monkeypatch.setenv("FACT_AGENT_URL", server.url)
        monkeypatch.setenv("FACT_AGENT_MODEL", "mock")
        opt = fact.optimize(model, [x], run_dir=tmp_path / "r1", quiet=True, use_cache=False,
                            agent={"mode": "live", "max_calls": 2})  # fmt: skip
    assert len(server.requests) == 1
    assert any(p["signature"].startswith("gemm[bias+hardshrink]") for p in opt.report["patterns"])
    assert any("agent: hardshrink: proposal" in line for line in opt.report["transcript"])
    with torch.no_grad():
        assert torch.allclose(opt(x), model(x))
    with pytest.raises(fact.FactError, match="agent settings"):
        fact.optimize(model, [x], quiet=True, agent={"mode": "live", "temperature": 2})
