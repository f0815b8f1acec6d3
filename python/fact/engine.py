"""Running the C++ engine, `fact-engine`.

The engine is a separate binary (built by ./setup.sh or CMake) so that Python stays a thin front
door: it traces, writes a graph file, and hands it over. The contract is the exit status: 0 ok,
2 a user error whose message ("error: ...") is on stderr, anything else an internal error. Both
failures become `FactError`s carrying the engine's stderr, so the user sees what the engine said.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from fact.errors import EngineCrashError, EngineError, EngineNotFoundError

ENGINE_NAME = "fact-engine"
ENV_VAR = "FACT_ENGINE"

#: <repo root>/build/fact-engine, where `cmake -S . -B build` puts it for a source checkout.
BUILD_ENGINE = Path(__file__).resolve().parents[2] / "build" / ENGINE_NAME

_BUILD_HINT = "run ./setup.sh, or `cmake -S . -B build && cmake --build build -j2`"


def find_engine() -> Path:
    """Locate `fact-engine`: $FACT_ENGINE, else <repo>/build/fact-engine, else PATH."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        path = Path(configured)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise EngineNotFoundError(
            f"{ENV_VAR} is set to {configured}, which is not an executable file; "
            f"point it at a built {ENGINE_NAME} or unset it"
        )
    if BUILD_ENGINE.is_file() and os.access(BUILD_ENGINE, os.X_OK):
        return BUILD_ENGINE
    on_path = shutil.which(ENGINE_NAME)
    if on_path:
        return Path(on_path)
    raise EngineNotFoundError(
        f"the FACT engine ({ENGINE_NAME}) is not built: it is not at {BUILD_ENGINE}, on PATH, "
        f"or named by {ENV_VAR}; {_BUILD_HINT}"
    )


def run_engine(
    args: list[str], *, stream_stderr: bool = False, allowed: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run `fact-engine ARGS`, returning the finished process when it exits 0 (or with one of
    the `allowed` statuses: realize's 1, nothing built).

    The engine's stderr on success (warnings) is passed on to ours; with `stream_stderr` it goes
    straight through while the engine runs (progress of long work such as compiling kernels).
    Exit 2 raises `EngineError` with the engine's message; any other failure raises
    `EngineCrashError`.
    """
    engine = find_engine()
    command = [str(engine), *map(str, args)]
    try:
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=None if stream_stderr else subprocess.PIPE,
            text=True,
            errors="replace",  # the engine may echo a bad byte of a file it could not read
            check=False,
        )
    except OSError as exc:
        raise EngineCrashError(
            f"cannot run {engine}: {exc.strerror or exc}; {_BUILD_HINT}"
        ) from None

    stderr = (done.stderr or "").strip()
    if done.returncode == 0 or done.returncode in allowed:
        if stderr:
            print(stderr, file=sys.stderr)
        return done
    if done.returncode == 2:
        message = stderr.removeprefix("error:").strip() if stderr else ""
        if stream_stderr and not message:
            message = "see the engine's message above"
        raise EngineError(message or f"{ENGINE_NAME} {args[0] if args else ''} refused its input")
    if done.returncode < 0:
        try:
            status = f"was killed by {signal.Signals(-done.returncode).name}"
        except ValueError:
            status = f"was killed by signal {-done.returncode}"
    else:
        status = f"exited with status {done.returncode}"
    detail = f":\n{stderr}" if stderr else " (no message)"
    raise EngineCrashError(
        f"internal error: `{ENGINE_NAME} {' '.join(map(str, args))}` {status}{detail}\n"
        "this is a bug in FACT; please report it with the graph file"
    )


def engine_json(subcommand: str, graph_path: str | os.PathLike, *extra: str) -> Any:
    """Run `fact-engine SUBCOMMAND GRAPH EXTRA... --json` and parse its stdout."""
    args = [subcommand, str(graph_path), *extra, "--json"]
    done = run_engine(args)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise EngineCrashError(
            f"internal error: `{ENGINE_NAME} {' '.join(args)}` printed invalid JSON "
            f"({exc.msg} at line {exc.lineno}); this is a bug in FACT, please report it"
        ) from None
