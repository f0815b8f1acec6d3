"""The report of `fact bench` and `fact.optimize`: markdown, JSON and a PNG chart of each
pattern's time before (its PyTorch subgraph) and after (what FACT runs there)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _ms(us: float | None) -> str:
    return f"{us / 1e3:.3f}" if isinstance(us, (int, float)) and math.isfinite(us) else "-"


def _x(num: float | None, den: float | None) -> str:
    if not num or not den:
        return "-"
    return f"{num / den:.2f}x"


def _err(e: Any) -> str:
    return f"{e:.2e}" if isinstance(e, (int, float)) else "-"


def json_ready(obj: Any) -> Any:
    """JSON-ready copy of a report: non-finite floats as strings ("inf", "nan"), keys as
    strings, other objects (dtypes, devices) by str()."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def markdown(bench: Mapping[str, Any]) -> str:
    """The human-readable report: the headline table, then one row per pattern."""
    opt = bench.get("optimize") or {}
    env = bench.get("environment") or {}
    rows = bench.get("results") or []
    fact = next((r for r in rows if r["name"] == "fact"), {})
    lines = [
        f"# FACT bench: {bench.get('problem')} ({bench.get('dtype')}, "
        f"float32 matmul precision {bench.get('precision')})",
        "",
        f"Command: `{bench.get('command')}`",
        "",
        f"Device: {env.get('gpu', env.get('device', '?'))}; torch {env.get('torch')}; "
        f"CUDA {env.get('cuda')}; FACT {bench.get('fact_version')}.",
        "Times: one forward call on the problem's own inputs (get_inputs()), two ways: per call "
        "(L2 flushed, the GPU idle, CUDA events around the call, synchronized: what benchmark "
        "sets and latency-bound callers see) and back to back (20 calls between two events, "
        "one synchronize: a throughput loop). The modules take turns over three rounds; medians "
        "of the round medians. Host: the host's time per call while the GPU is busy. Errors: "
        "||out - ref|| / ||ref|| against the model in float64 on the same inputs.",
        "",
        "| module | per call (ms) | vs eager | vs torch.compile | back to back (ms) | vs eager "
        "| vs torch.compile | host (us) | max abs error | rel error | SM clock per round (MHz) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def base(name: str, key: str) -> float | None:
        return next((r.get(key) for r in rows if r["name"] == name), None)

    for r in rows:
        pc, b2b = r.get("time_us"), r.get("back_to_back_us")
        host = r.get("host_us")
        lines.append(
            f"| {r['name']} | {_ms(pc)} | {_x(base('eager', 'time_us'), pc)} | "
            f"{_x(base('torch.compile', 'time_us'), pc)} | {_ms(b2b)} | "
            f"{_x(base('eager', 'back_to_back_us'), b2b)} | "
            f"{_x(base('torch.compile', 'back_to_back_us'), b2b)} | "
            f"{f'{host:.0f}' if host is not None else '-'} | {_err(r.get('max_abs_error'))} | "
            f"{_err(r.get('rel_error'))} | {_clocks(r.get('rounds_sm_clock_mhz'))} |"
        )
    if fact.get("note"):
        lines += ["", fact["note"]]
    lines += [
        "",
        f"FACT replaced {opt.get('replaced', 0)} of {len(opt.get('patterns') or [])} patterns "
        f"({'warm: decisions reused' if opt.get('warm') else 'cold'}, "
        f"{opt.get('seconds', 0):.1f} s to optimize; CUDA graph replay "
        f"{'on' if opt.get('cuda_graphs') else 'off'}).",
    ]
    guard = opt.get("guard") or {}
    if guard.get("chosen") == "original":
        f_t, o_t = guard.get("fact") or {}, guard.get("original") or {}
        lines += [
            "",
            "**The module runs the original model**: in optimize's last check the composed "
            "module did not beat the original under both protocols (per call "
            f"{_ms(f_t.get('per_call_us', guard.get('fact_us')))} against "
            f"{_ms(o_t.get('per_call_us', guard.get('original_us')))} ms, back to back "
            f"{_ms(f_t.get('back_to_back_us'))} against {_ms(o_t.get('back_to_back_us'))} ms, on "
            "the example inputs; set `use_original = False` to run FACT's kernels anyway).",
        ]
    lines += [
        "",
        "| # | pattern | runs as | PyTorch subgraph (ms) | FACT (ms) | speedup | error | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in opt.get("patterns") or []:
        chosen = p.get("chosen") if not p.get("fallback") else "pytorch (fallback)"
        kind = {"generated": "generated kernel", "library": "library kernel"}.get(p.get("kind"), "")
        math = {"tf32": "TF32", "3xtf32": "3xTF32, fp32-accurate"}.get(p.get("math") or "")
        kind = f"{kind}, {math} math" if kind and math else kind
        runs_as = f"{chosen} ({kind})" if kind and not p.get("fallback") else chosen
        after = p.get("time_us") if not p.get("fallback") else None
        note = "; ".join(n for n in (p.get("reason") or "", _runner_up(p)) if n)
        lines.append(
            f"| {p['index']} | `{p.get('signature')}` | {runs_as} | {_ms(p.get('eager_us'))} | "
            f"{_ms(after)} | {_x(p.get('eager_us'), after)} | {_err(p.get('error'))} | "
            f"{note.replace('|', '/')} |"
        )
    if opt.get("folds"):
        lines += [
            "",
            "LayerNorms folded into the GEMMs after them: " + "; ".join(opt["folds"]) + ".",
        ]
    if opt.get("folds_dropped"):
        lines += [
            "",
            "LayerNorm folds tried and dropped (their kernels did not all run), planned again "
            "without: " + "; ".join(opt["folds_dropped"]) + ".",
        ]
    nodes = opt.get("pytorch_nodes") or []
    if nodes:
        lines += ["", f"Nodes no pattern covers (they run as PyTorch ops): {', '.join(nodes)}."]
    ver = opt.get("verification") or {}
    if ver:
        lines += [
            "",
            f"End-to-end check before the module was returned: error {_err(ver.get('error'))} "
            f"against {ver.get('reference')} (eager {_err(ver.get('eager_error'))}, bound "
            f"{_err(ver.get('bound'))}): {'passed' if ver.get('passed') else 'FAILED'}.",
        ]
    profiles = bench.get("profile") or {}
    if profiles:
        lines += [
            "",
            "GPU timeline per forward (torch.profiler, L2 flushed and a backlog before each call "
            "as when timed; the profiler slows the host, so host-bound gaps read larger than "
            "they are): lead is the wait for the first kernel, span from the first kernel's "
            "start to the last one's end, busy the time some kernel ran, idle the rest of the "
            "span; host is the time the host took to issue the call, without the profiler.",
            "",
            "| module | host (us) | lead (us) | span (us) | busy (us) | idle (us) "
            "| largest gaps (us) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, prof in profiles.items():
            t = prof.get("timeline") or {}
            if "span" not in t:  # no kernel ran
                continue
            gaps = ", ".join(f"{g['us']:.0f} before `{g['before'][:40]}`" for g in t["gaps"][:3])
            lines.append(
                f"| {name} | {t.get('host', 0):.0f} | {t['lead']:.0f} | {t['span']:.0f} | "
                f"{t['busy']:.0f} | {t['idle']:.0f} | {gaps or '-'} |"
            )
    for name, prof in profiles.items():
        lines += [
            "",
            f"Where the time goes in {name} (torch.profiler, device time per forward):",
            "",
            "| kernel | calls | us |",
            "| --- | --- | --- |",
        ]
        lines += [f"| `{r['kernel']}` | {r['calls']:g} | {r['us']:.1f} |" for r in prof["kernels"]]
        if prof.get("warning"):
            lines += ["", f"Warning: {prof['warning']}."]
    return "\n".join(lines) + "\n"


def _clocks(rounds: Sequence[Mapping[str, Any] | None] | None) -> str:
    """Each round's median SM clock, with the lowest sample where it dipped, and what NVML said
    held the clock back in at least a quarter of the samples: "1980, 1650 (1545) power cap"."""
    if not rounds or not any(rounds):
        return "-"
    cells = []
    for c in rounds:
        if not c:
            cells.append("?")
            continue
        cell = f"{c['median']} ({c['min']})" if c["min"] < c["median"] - 50 else str(c["median"])
        limits = [name for name, share in (c.get("limits") or {}).items() if share >= 0.25]
        cells.append(" ".join([cell, *limits]))
    return ", ".join(cells)


def _runner_up(pattern: Mapping[str, Any]) -> str:
    """The fastest verified candidate that was not chosen ("next: <impl> 0.234 ms"), so a
    reader sees by how much the choice won; empty when there is none (an implementation the
    end-to-end check dropped is no runner-up)."""
    taken = (pattern.get("chosen"), pattern.get("fallback_from"))
    others = [
        c
        for c in pattern.get("candidates") or []
        if c.get("ok") and c.get("time_us") and c.get("impl") not in taken
    ]
    if not others:
        return ""
    best = min(others, key=lambda c: c["time_us"])
    return f"next: {best['impl']} {_ms(best['time_us'])} ms"


def chart(patterns: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path | None:
    """A bar chart of each measured pattern's time before and after; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    measured = [p for p in patterns if p.get("eager_us")]
    labels = [f"{p['index']}: {(p.get('signature') or '').split(':')[0]}" for p in measured]
    before = [p["eager_us"] / 1e3 for p in measured]
    after = [
        (p.get("time_us") if p.get("time_us") and not p.get("fallback") else p["eager_us"]) / 1e3
        for p in measured
    ]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(measured) + 2), 4.5))
    xs = range(len(measured))
    ax.bar([x - 0.2 for x in xs], before, width=0.4, label="PyTorch subgraph")
    ax.bar([x + 0.2 for x in xs], after, width=0.4, label="FACT")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("time (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(bench: Mapping[str, Any], folder: Path) -> dict[str, Path]:
    """report.md, report.json and report.png (when matplotlib is installed) into folder."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {"md": folder / "report.md", "json": folder / "report.json"}
    png = chart(
        (bench.get("optimize") or {}).get("patterns") or [],
        folder / "report.png",
        f"{bench.get('problem')} ({bench.get('dtype')}): per-pattern time",
    )
    if png is not None:
        out["png"] = png
    out["md"].write_text(markdown(bench) + ("\n![per-pattern time](report.png)\n" if png else ""))
    out["json"].write_text(json.dumps(bench, indent=1, default=str) + "\n")
    return out
