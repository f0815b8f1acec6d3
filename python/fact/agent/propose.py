"""`fact agent propose`: for each ATen op a problem's plan leaves to PyTorch because the catalog
lacks it, ask for a lowering (fact.agent.lowering), run FACT's gates, and keep the verdict in the
registry's proposals table. Accepted lowerings are used by every later plan, with no LLM.

Ops are asked for in order of the elements they compute in the traced graph (most first); an op
the registry already holds an accepted lowering for, or rejected this very answer for, costs no
request. Every step goes to the run's transcript (`transcript.txt` in --out)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fact.agent import lowering
from fact.agent.client import AgentError, Answers, Client
from fact.errors import FactError

# ---------------------------------------------------------------------------------------------
# The registry's proposals table, through the engine (one owner of the registry file)


def _registry_args(registry: str | None) -> list[str]:
    return ["--registry", registry] if registry else []


def proposals(registry: str | None = None, kind: str = "", status: str = "") -> list[dict]:
    from fact.engine import run_engine

    args = ["registry", "proposals", *_registry_args(registry)]
    if kind:
        args += ["--kind", kind]
    if status:
        args += ["--status", status]
    return json.loads(run_engine(args).stdout)


def store(doc: dict[str, Any], registry: str | None = None) -> int:
    """Store a proposal document; its id."""
    import tempfile

    from fact.engine import run_engine

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        done = run_engine(["registry", "propose", *_registry_args(registry), f.name])
    finally:
        Path(f.name).unlink(missing_ok=True)
    return int(json.loads(done.stdout)["id"])


def set_status(proposal_id: int, status: str, registry: str | None = None) -> None:
    from fact.engine import run_engine

    run_engine(["registry", "proposal-status", *_registry_args(registry), str(proposal_id), status])


def accepted_digest(registry: str | None = None) -> str:
    """A digest of the accepted lowerings: part of optimize's decision key, since they change
    what the planner does."""
    rows = proposals(registry, "lowering", "accepted")
    text = json.dumps(sorted(json.dumps(r["payload"], sort_keys=True) for r in rows))
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# One run


def opaque_ops(plan: dict[str, Any], graph: dict[str, Any]) -> list[tuple[str, int]]:
    """(ATen op, elements it computes) for the plan's opaque nodes, most elements first."""
    sizes: dict[str, int] = {}
    nodes = {n["name"]: n for n in graph["nodes"]}
    for n in plan.get("opaque_nodes") or []:
        target = n.get("op", "")
        if not target.startswith("aten."):
            continue
        name = target.split(".")[1]
        outs = nodes.get(n["name"], {}).get("outputs") or []
        numel = sum(math.prod(o.get("shape") or [1]) for o in outs if isinstance(o, dict))
        sizes[name] = sizes.get(name, 0) + int(numel)
    return sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))


def propose(
    problem: str,
    out: Path,
    client: Client | None,
    answers: Answers | None = None,
    *,
    dtype: str | None = None,
    registry: str | None = None,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run task 1 (lowerings) on a problem file. Returns a summary: per op, what happened."""
    from fact.problem import load_problem
    from fact.tracer import trace

    loaded = load_problem(problem, dtype)
    graph = trace(loaded.model, loaded.inputs, source=problem)
    return propose_for_graph(graph, out, client, answers, source=problem, registry=registry,
                             dry_run=dry_run, log=log)  # fmt: skip


def propose_for_graph(
    graph: dict[str, Any],
    out: Path,
    client: Client | None,
    answers: Answers | None = None,
    *,
    source: str = "",
    registry: str | None = None,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Task 1 on a traced graph (a problem file's, or the module fact.optimize traced)."""
    from fact.engine import engine_json
    from fact.tracer import save_graph

    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        log(line)

    started = time.monotonic()
    graph_path = save_graph(graph, out / "graph.json")
    plan = engine_json("discover", graph_path, *_registry_args(registry))
    ops = opaque_ops(plan, graph)
    say(f"{source or graph.get('model')}: {len(ops)} ATen op(s) the catalog lacks: "
        + (", ".join(f"{op} ({n} elements)" for op, n in ops) or "none"))  # fmt: skip
    every = proposals(registry, "lowering")
    known = {r["key"] for r in every if r["status"] == "accepted"}
    decided = {canonical(r["payload"]): r for r in every}  # the same answer again: no new verdict
    summary: dict[str, Any] = {"problem": source, "ops": {}}
    for name, _ in ops:
        if name in known:
            say(f"{name}: an accepted lowering is in the registry already")
            summary["ops"][name] = "known"
            continue
        try:
            chat = lowering.messages(name)
            lowering.signature_of(name)
        except FactError as exc:
            say(f"{name}: not asked ({exc})")
            summary["ops"][name] = "not elementwise"
            continue
        if dry_run:
            path = out / f"prompt-{name}.json"
            path.write_text(json.dumps(chat, indent=1))
            say(f"{name}: prompt written to {path} (dry run: nothing sent)")
            summary["ops"][name] = "prompt written"
            continue
        try:
            verdict = _ask(name, chat, client, answers, decided, registry, say)
        except AgentError as exc:
            say(f"{name}: no proposal ({exc}); the op stays in PyTorch")
            summary["ops"][name] = f"no answer: {exc}"
            if "budget" in str(exc):
                break
            continue
        summary["ops"][name] = verdict
    summary["seconds"] = round(time.monotonic() - started, 2)
    (out / "transcript.txt").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def for_optimize(graph: dict[str, Any], agent: Any, run: Path, log: Callable[[str], None]) -> None:
    """fact.optimize(..., agent=...): "live", "record" or "replay" (the endpoint from
    FACT_AGENT_*), or a dict of propose's settings ({"mode", "max_calls", "max_tokens",
    "max_seconds", "answers"}). Whatever it proposes is decided by the gates before the plan;
    a fault leaves the catalog as it is."""
    from fact.agent.client import Budget, Settings
    from fact.compose.optimize import cache_root

    spec = {"mode": agent} if isinstance(agent, str) else dict(agent)
    unknown = set(spec) - {"mode", "max_calls", "max_tokens", "max_seconds", "answers"}
    if unknown:
        raise FactError(f"agent settings {sorted(unknown)}: mode, max_calls, max_tokens, "
                        "max_seconds, answers")  # fmt: skip
    answers = Answers(Path(spec["answers"])) if spec.get("answers") else None
    client = None
    if answers is None:
        budget = Budget(int(spec.get("max_calls", 8)), int(spec.get("max_tokens", 50_000)),
                        float(spec.get("max_seconds", 600.0)))  # fmt: skip
        client = Client(Settings.from_env(), str(spec.get("mode", "live")),
                        cache_root() / "agent" / "responses", budget, log=log)  # fmt: skip
    propose_for_graph(graph, run, client, answers, log=lambda line: log(f"agent: {line}"))


def canonical(payload: Any) -> str:
    """A lowering's text up to spelling (ids, 1 vs 1.0): one answer, one verdict."""
    if not isinstance(payload, dict):
        return json.dumps(payload, sort_keys=True)

    def numbers(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return [numbers(x) for x in v] if isinstance(v, list) else v
        return float(v)

    ssa = [
        {k: numbers(v) if k in ("value", "params") else v for k, v in e.items() if k != "id"}
        for e in payload.get("ssa") or []
        if isinstance(e, dict)
    ]
    params = [
        {k: numbers(v) for k, v in p.items()} if isinstance(p, dict) else p
        for p in payload.get("params") or []
    ]
    return json.dumps(dict(payload, ssa=ssa, params=params), sort_keys=True)


def _ask(name, chat, client, answers, decided, registry, say) -> str:
    """One op: an answer (one repair turn where it does not parse), the gates, the registry."""
    source = "answers file" if answers is not None else "endpoint"
    text = (
        answers.complete(name)
        if answers is not None
        else client.complete(chat, lowering.TEMPLATE, lowering.SCHEMA)
    )
    try:
        doc = lowering.parse(text)
    except FactError as exc:
        if answers is not None or client is None:
            raise AgentError(f"the answer is not usable: {exc}") from None
        say(f"{name}: the answer is not usable ({exc}); asking once more")
        text = client.complete(
            lowering.repair_messages(chat, text, str(exc)), lowering.TEMPLATE, lowering.SCHEMA
        )
        try:
            doc = lowering.parse(text)
        except FactError as again:
            raise AgentError(f"the repaired answer is not usable either: {again}") from None
    before = decided.get(canonical(doc))
    if before is not None:  # a verdict (or a person's decision) stands
        say(f"{name}: this answer is proposal {before['id']}, {before['status']}; not checked")
        return f"{before['status']} before"
    results = lowering.gates(name, doc)
    passed = all(r["passed"] for r in results) and [r["gate"] for r in results] == [
        "schema", "numeric", "plan"
    ]  # fmt: skip
    for r in results:
        say(f"{name}: gate {r['gate']}: {'passed' if r['passed'] else 'FAILED'}"
            + (f" ({r['why']})" if r["why"] else ""))  # fmt: skip
    provenance = {
        "source": source,
        "template": lowering.TEMPLATE,
        "prompt_sha256": hashlib.sha256(json.dumps(chat).encode()).hexdigest(),
        "response_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    if client is not None and answers is None:
        provenance.update(client.settings.public())
    proposal = {
        "kind": "lowering",
        "key": name,
        "payload": doc,
        "status": "accepted" if passed else "rejected",
        "gates": results,
        "provenance": provenance,
    }
    try:
        pid = store(proposal, registry)
    except FactError as exc:  # the engine's own check refused what the gates let through
        say(f"{name}: the registry refused the proposal ({exc})")
        return "refused by the registry"
    say(f"{name}: proposal {pid} {proposal['status']}")
    return proposal["status"]
