"""Run directories of `fact realize`: what in them the registry has not measured yet."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from fact.engine import run_engine
from fact.errors import EngineError, FactError
from fact.tune.harness import TUNED_FAMILIES  # GEMMs, attention; not norms, pointwise


def tuned_pattern(pattern: dict, entry: dict | None = None) -> dict:
    """The pattern a manifest entry's kernel computes (docs/plan-format.md): for a gated MLP its
    lowered GEMM, or its pointwise `tail` for the kernels realize built for that form."""
    if entry is not None and (entry.get("config") or {}).get("form") == "tail":
        return pattern["tail"]
    return pattern.get("lowered") or pattern


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FactError(
            f"cannot read {path}: {exc}; run `fact realize` again into a fresh --out"
        ) from None


def _tuning_key(entry: dict) -> tuple:
    """What a kernel is tuned for: what it computes (signature and problem), and the kernel."""
    m = entry["measures"]
    return (m["signature"], json.dumps(m["problem"], sort_keys=True), entry["kernel"])


def _key(entry: dict) -> tuple[int, str]:
    """A manifest entry's key: one kernel can serve several patterns (same signature, other
    sizes), each tuned at its own problem."""
    return (entry["pattern_index"], entry["kernel"])


def measured(run: Path, registry: list[str]) -> dict[tuple[int, str], dict | None]:
    """The registry's fastest passed row for each built kernel of a `fact realize` run, by
    (pattern index, kernel): {time_us, error, knobs, config, provenance}, or None where the
    registry has not timed that kernel at that problem and arch. One engine command answers
    (`fact-engine registry measured RUN`); EngineError when the registry cannot be read or
    does not exist."""
    doc = json.loads(run_engine(["registry", "measured", str(run), *registry]).stdout)
    return {_key(k): k["row"] for k in doc["kernels"]}


def _registry_rows(
    run: Path, registry: list[str], strict: bool
) -> tuple[list[dict], dict[tuple[int, str], dict | None] | None]:
    """The run's manifest, and measured() for it, or None when there is no registry to ask
    yet. A registry that cannot be read raises EngineError when `strict`, else it is warned
    about and counts as none."""
    manifest = _read_json(run / "manifest.json")
    stale = [e.get("kernel") for e in manifest if e.get("library") and "measures" not in e]
    if stale:  # the run's fault, not the registry's: say so whatever `strict` is
        raise FactError(
            f'{run / "manifest.json"}: kernels {stale} have no "measures" (an older fact '
            "realize wrote it); run `fact realize` again into a fresh --out"
        )
    try:
        return manifest, measured(run, registry)
    except EngineError as exc:
        if "does not exist" not in str(exc):  # a damaged registry is a hint lost, not an error
            if strict:
                raise
            warnings.warn(
                f"FACT: the pattern registry cannot be read ({exc}); tuning every kernel. "
                "`fact registry salvage -o rows.json` keeps its readable rows",
                stacklevel=3,
            )
        return manifest, None  # no registry to ask: everything is new


def unmeasured(run: Path, registry: list[str], strict: bool = True) -> list[dict] | None:
    """The run's manifest entries that the registry has no passed row for (same signature,
    arch, problem and config), or None when there is no registry to ask yet. A registry that
    cannot be read raises EngineError when `strict` (`fact tune`, which will write into it:
    say so before tuning), else it is warned about and counts as none (optimize's tuning)."""
    manifest, rows = _registry_rows(run, registry, strict)
    if rows is None:
        return None
    return [e for e in manifest if e.get("library") and rows.get(_key(e)) is None]


def tune_run(
    run: Path,
    precision: str,
    *,
    registry: list[str] | None = None,
    progress=None,
    device: str = "cuda",
) -> dict[int, list[dict]]:
    """Tune what the registry has not measured yet in a `fact realize` run directory, import
    the results into the registry, and return, per pattern index, the verified kernels of this
    run from fastest to slowest: {kernel, library, config, time_us, error, knobs, source}.

    Kernels measured before come from the registry (source "registry", with the launch knobs
    they were timed with); kernels measured now carry their best knobs. The PyTorch
    candidate's time, when tuned now, is in the row with kernel "pytorch". device: where the
    tuning workers run (the CPU tests' fake kernels use "cpu").
    """
    from fact.tune import harness

    registry = list(registry or [])
    plan = json.loads((run / "plan.json").read_text())
    arch = plan.get("arch", "sm90")
    entries, _ = harness.load_manifest(run)  # library paths resolved against the run
    built = [e for e in entries if e.get("library")]
    # What the registry had before this run's tuning; what it tunes now is in `fresh` below.
    _, known = _registry_rows(run, registry, strict=False)
    pending = built if known is None else [e for e in built if known.get(_key(e)) is None]
    # GEMM-family and attention kernels go through the harness; the others (row norms,
    # pointwise regions) are verified and timed where they run, in the composed module's
    # context, and listed untimed below.
    pending = [e for e in pending if e["measures"]["family"] in TUNED_FAMILIES]
    # A model's layers repeat their patterns: a kernel is tuned once per (signature, problem),
    # and the other patterns with that problem take the first one's rows below.
    fresh: list[dict] = []
    seen: dict[tuple, int] = {}
    for index in sorted({e["pattern_index"] for e in pending}):
        pattern = tuned_pattern(plan["patterns"][index])
        entries = []
        for e in pending:
            if e["pattern_index"] != index:
                continue
            if seen.setdefault(_tuning_key(e), index) == index:
                entries.append(e)
        if not entries:
            if progress:
                progress(f"tuning pattern {index}: the same kernels and problem as an earlier one")
            continue
        if progress:
            progress(f"tuning pattern {index} {pattern.get('signature')}: {len(entries)} kernels")
        rows = harness.tune(pattern, entries, precision, arch=arch, device=device)
        for row in rows:
            row["pattern_index"] = index
        fresh += rows
    if fresh:
        results = {"fact_tune_results": 1, "arch": arch, "precision": precision, "rows": fresh}
        (run / "results.json").write_text(json.dumps(harness.json_safe(results), indent=2) + "\n")
        export = run / "registry_export.json"
        export.write_text(
            json.dumps(harness.json_safe(harness.registry_export(fresh, "fact optimize")), indent=2)
        )
        try:
            run_engine(["registry", "import", str(export), *registry])
        except EngineError as exc:  # the results stay in the run directory
            warnings.warn(
                f"FACT: this run's measurements could not be stored in the registry ({exc}); "
                f"they are in {export} (`fact registry import` it into a readable registry)",
                stacklevel=2,
            )
    known = known or {}
    best: dict[int, list[dict]] = {}
    for entry in built:
        index = entry["pattern_index"]
        if entry["measures"]["family"] not in TUNED_FAMILIES:
            best.setdefault(index, []).append(
                {
                    "time_us": None,
                    "error": None,
                    "knobs": {},
                    "source": "realize",
                    "kernel": entry["kernel"],
                    "library": entry["library"],
                    "cached_library": entry.get("cached_library"),
                    "config": entry["config"],
                }
            )
            continue
        tuned_as = seen.get(_tuning_key(entry), index)  # a repeated pattern: the first's
        mine = [
            r
            for r in fresh
            if r.get("pattern_index") == tuned_as and r.get("library") == entry["library"]
        ]
        if mine:
            row = mine[0]
            if row.get("disposition") != "passed":
                continue
            cand = {
                "time_us": row.get("time_us"),
                "error": row.get("error"),
                "knobs": row.get("knobs") or {},
                "source": "tuned",
            }
        else:
            row = known.get(_key(entry))
            if row is None:
                continue
            cand = {
                "time_us": row.get("time_us"),
                "error": row.get("error"),
                "knobs": row.get("knobs") or {},
                "source": "registry",
            }
        cand.update(
            kernel=entry["kernel"],
            library=entry["library"],
            cached_library=entry.get("cached_library"),
            config=entry["config"],
        )
        best.setdefault(index, []).append(cand)
    for index, rows in best.items():
        rows.sort(key=lambda r: r.get("time_us") or float("inf"))
        torch_rows = [
            r for r in fresh if r.get("pattern_index") == index and r["kernel"] == "pytorch"
        ]
        if torch_rows and torch_rows[0].get("time_us"):
            rows.append({"kernel": "pytorch", "time_us": torch_rows[0]["time_us"]})
    return best
