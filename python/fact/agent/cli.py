"""`fact agent`: propose | check | list | accept | reject | export (see fact.agent)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fact.errors import FactError


def add_command(commands: argparse._SubParsersAction) -> None:
    agent = commands.add_parser(
        "agent",
        help="let an LLM propose lowerings for ops the catalog lacks; FACT's checks decide",
        description="The agent (off unless asked): an OpenAI-compatible endpoint "
        "(FACT_AGENT_URL, FACT_AGENT_MODEL, FACT_AGENT_KEY), or answers pasted into a file, "
        "proposes lowerings; FACT's gates (schema, float64 against ATen, the plan) decide, and "
        "the registry keeps the verdict. Accepted lowerings are used by every later plan.",
    )
    actions = agent.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser("propose", help="ask for lowerings of a problem's unknown ops")
    p.add_argument("problem", metavar="PROBLEM.py")
    p.add_argument("--task", default="lowering", help="lowering (the one task so far)")
    p.add_argument("--out", type=Path, required=True, help="folder for prompts and transcript")
    p.add_argument("--max-calls", type=int, default=8, help="requests at most (default 8)")
    p.add_argument("--max-tokens", type=int, default=50_000, help="tokens at most")
    p.add_argument("--max-seconds", type=float, default=600.0, help="wall time at most")
    p.add_argument(
        "--mode",
        choices=("live", "record", "replay"),
        default="live",
        help="live: ask and cache; record: also keep transcripts; replay: cache only",
    )
    p.add_argument("--dry-run", action="store_true", help="write the prompts, send nothing")
    p.add_argument("--answers", type=Path, help="answers pasted from any chat model (JSON)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--registry", help="pattern registry (default: $FACT_REGISTRY)")
    p.set_defaults(run=_propose)
    c = actions.add_parser("check", help="run the gates again on proposals saved as JSON files")
    c.add_argument("folder", type=Path, help="folder of proposal JSON files (one per op)")
    c.set_defaults(run=_check)
    ls = actions.add_parser("list", help="the registry's proposals")
    ls.add_argument("--status", choices=("accepted", "rejected", "proposed"))
    ls.add_argument("--registry")
    ls.set_defaults(run=_list)
    for name, status in (("accept", "accepted"), ("reject", "rejected")):
        a = actions.add_parser(name, help=f"mark a proposal {status}")
        a.add_argument("id", type=int)
        a.add_argument("--registry")
        a.set_defaults(run=_set, status=status)
    i = actions.add_parser(
        "import",
        help="check a file of lowerings (data/lowerings.json) and keep the verdicts",
        description="Run FACT's gates on each lowering of FILE (a JSON list, as `fact agent "
        "export` writes) and store the verdicts in the registry: how the shipped table "
        "(data/lowerings.json, imported by setup.sh) enters a registry. Exit 1 if any fails.",
    )
    i.add_argument("file", type=Path)
    i.add_argument("--registry")
    i.set_defaults(run=_import)
    e = actions.add_parser("export", help="accepted lowerings as one JSON file, for review")
    e.add_argument("-o", "--output", type=Path, required=True)
    e.add_argument("--registry")
    e.set_defaults(run=_export)


def _propose(args: argparse.Namespace) -> int:
    from fact.agent.client import Answers, Budget, Client, Settings
    from fact.agent.propose import propose
    from fact.compose.optimize import cache_root

    if args.task != "lowering":
        raise FactError(f"--task {args.task}: the agent's one task so far is lowering")
    answers = Answers(args.answers) if args.answers else None
    client = None
    if answers is None and not args.dry_run:
        budget = Budget(args.max_calls, args.max_tokens, args.max_seconds)
        transcripts = args.out / "transcripts" if args.mode == "record" else None
        client = Client(Settings.from_env(), args.mode, cache_root() / "agent" / "responses",
                        budget, log=lambda line: print(f"  {line}", file=sys.stderr),
                        transcripts=transcripts)  # fmt: skip
    summary = propose(args.problem, args.out, client, answers, dtype=args.dtype,
                      registry=args.registry, dry_run=args.dry_run,
                      log=lambda line: print(line, file=sys.stderr))  # fmt: skip
    print(json.dumps(summary["ops"], indent=1))
    return 0


def _check(args: argparse.Namespace) -> int:
    from fact.agent.lowering import gates, parse

    files = sorted(args.folder.glob("*.json"))
    if not files:
        raise FactError(f"{args.folder} holds no proposal JSON files")
    failed = 0
    for path in files:
        try:
            doc = parse(path.read_text())
        except (OSError, FactError) as exc:
            print(f"{path.name}: {exc}")
            failed += 1
            continue
        results = gates(str(doc.get("op")), doc)
        ok = all(r["passed"] for r in results) and len(results) == 3
        failed += 0 if ok else 1
        verdicts = "; ".join(f"{r['gate']} {'ok' if r['passed'] else 'FAILED ' + r['why']}"
                             for r in results)  # fmt: skip
        print(f"{path.name}: {'passes' if ok else 'fails'}: {verdicts}")
    return 1 if failed else 0


def _list(args: argparse.Namespace) -> int:
    from fact.agent.propose import proposals

    rows = proposals(args.registry, "", args.status or "")
    if not rows:
        print("no proposals")
        return 0
    for r in rows:
        failed = [g["gate"] for g in r["gates"] if not g.get("passed")]
        why = f" (failed {', '.join(failed)})" if failed else ""
        src = r["provenance"].get("model") or r["provenance"].get("source", "")
        print(f"{r['id']:>4}  {r['kind']:<9} {r['key']:<20} {r['status']:<9}{why}  {src}  "
              f"{r['created']}")  # fmt: skip
    return 0


def _set(args: argparse.Namespace) -> int:
    from fact.agent.propose import proposals, set_status

    rows = {r["id"]: r for r in proposals(args.registry)}
    if args.id not in rows:
        raise FactError(f"no proposal {args.id} (see `fact agent list`)")
    gates = rows[args.id]["gates"]
    passed = [g.get("gate") for g in gates if g.get("passed")] == ["schema", "numeric", "plan"]
    if args.status == "accepted" and not (passed and len(gates) == 3):
        raise FactError(
            f"proposal {args.id} failed FACT's gates; only a proposal that passed them can be "
            "accepted (fact agent check reruns them on a file)"
        )
    set_status(args.id, args.status, args.registry)
    print(f"proposal {args.id} {args.status}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from fact.agent.lowering import gates
    from fact.agent.propose import canonical, proposals, store

    try:
        doc = json.loads(args.file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FactError(f"{args.file} cannot be read ({exc})") from None
    if not isinstance(doc, list) or not all(isinstance(x, dict) for x in doc):
        raise FactError(f"{args.file}: a JSON list of lowerings, as `fact agent export` writes")
    decided = {canonical(r["payload"]): r for r in proposals(args.registry, "lowering")}
    failed = 0
    for lowering in doc:
        name = str(lowering.get("op"))
        before = decided.get(canonical(lowering))
        if before is not None:
            print(f"{name}: proposal {before['id']}, {before['status']} already")
            failed += before["status"] == "rejected"
            continue
        results = gates(name, lowering)
        ok = [r["gate"] for r in results if r["passed"]] == ["schema", "numeric", "plan"]
        proposal = {"kind": "lowering", "key": name[:64] or "?", "payload": lowering,
                    "status": "accepted" if ok else "rejected", "gates": results,
                    "provenance": {"source": f"file {args.file.name}"}}  # fmt: skip
        pid = store(proposal, args.registry)
        why = "" if ok else ": " + "; ".join(r["why"] for r in results if not r["passed"])
        print(f"{name}: proposal {pid} {proposal['status']}{why}")
        failed += not ok
    return 1 if failed else 0


def _export(args: argparse.Namespace) -> int:
    from fact.agent.propose import proposals

    rows = proposals(args.registry, "lowering", "accepted")
    doc = [r["payload"] for r in rows]
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(doc)} accepted lowering(s) to {args.output}")
    return 0
