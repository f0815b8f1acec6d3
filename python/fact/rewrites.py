"""The rewrites an exported program gets before it is planned, for a target: fact.layouts (a
producer writes the layout its consumer's kernels read) and fact.folds (LayerNorms folded into
the GEMMs after them). `fact.optimize` and the CLI's discover, explain and realize of a problem
file apply the same ones, so both plan the same graph."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from fact import folds, layouts


def apply(
    program: torch.export.ExportedProgram,
    dtype: torch.dtype,
    precision: str,
    arch: str,
    *,
    fold_norms: bool = False,
    fold_skip: Collection[str] = (),
) -> tuple[list[str], list[dict[str, Any]]]:
    """Rewrite `program` in place for a `dtype` model under `precision` on `arch` (with
    LayerNorm folds only when `fold_norms`, and none of the norms in `fold_skip`). Returns a
    line per rewrite ("layout: ...", "fold: ..."), and the folds' records (folds.fold_norms)
    for the check that they pay."""
    lines = [f"layout: {line}" for line in layouts.rewrite(program, dtype, precision, arch)]
    records: list[dict[str, Any]] = []
    if fold_norms and folds.applies(dtype, precision, arch):
        records = folds.fold_norms(program, skip=fold_skip)
        lines += [f"fold: {folds.describe(r)}" for r in records]
    return lines, records
