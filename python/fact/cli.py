"""The `fact` command line: trace a problem file and hand the graph to the engine.

Commands take a problem file (.py, traced here) or a graph already traced (.json, passed straight
to the engine). Results go to stdout; progress and errors go to stderr, so `--json` output can be
piped. Every user error is `fact: error: ...` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fact import __version__
from fact.engine import find_engine, run_engine
from fact.errors import FactError

DTYPE_CHOICES = ("bf16", "fp16", "fp32")
ARCH_CHOICES = ("sm90", "sm80")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 user error, 130 interrupted)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["registry"], ["cache"]):  # the engine's own commands: options untouched
        args = argparse.Namespace(run=_passthrough, command=argv[0], engine_args=argv[1:])
    else:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exc:  # argparse exits on --help and on usage errors
            return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.run(args)
    except FactError as exc:
        print(f"fact: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fact: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # the output could not be written: a closed pipe, a full disk
        if exc.errno not in (errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT):
            raise
        # What is left buffered for stdout would fail again when Python exits: drop it.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if exc.errno != errno.EPIPE:  # `fact ... | head`: the reader left; say nothing more
            print(f"fact: error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fact",
        description="FACT: a kernel-synthesis compiler for PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"fact {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    discover = commands.add_parser(
        "discover",
        help="plan kernels for a problem file or traced graph",
        description="Trace PROBLEM.py (or take GRAPH.json) and print the engine's kernel plan.",
    )
    _add_target(discover)
    _add_dtype(discover)
    discover.add_argument("--json", action="store_true", help="print the plan as JSON")
    _add_arch(discover)
    _add_fold(discover)
    discover.add_argument("--gpu", metavar="NAME", help="target GPU (h200, h100, a100)")
    discover.add_argument(
        "--save-graph", metavar="PATH", type=Path, help="also keep the traced graph at PATH"
    )
    discover.set_defaults(run=_discover)

    bench = commands.add_parser(
        "bench",
        help="eager vs torch.compile vs FACT on a problem file (GPU)",
        description="Optimize PROBLEM.py with FACT, then time eager, torch.compile and FACT in "
        "one process and compare their outputs with the model in float64. Writes report.md, "
        "report.json and report.png into the run directory (--out).",
    )
    bench.add_argument("target", metavar="PROBLEM.py", help="a problem file")
    _add_dtype(bench)
    bench.add_argument("--out", type=Path, help="run directory (default runs/bench-<name>-<dtype>)")
    bench.add_argument(
        "--candidates", type=_at_least(1), default=4, help="kernels per GEMM pattern"
    )
    bench.add_argument("--reps", type=_at_least(1), default=30, help="timed repetitions per module")
    bench.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    bench.add_argument("--no-cuda-graphs", action="store_true", help="no CUDA graph replay")
    _add_fold(bench)
    bench.add_argument("--profile", action="store_true", help="add a per-kernel time profile")
    bench.add_argument(
        "--compare-pdl",
        action="store_true",
        help="also time FACT's modules with plain launches instead of programmatic dependent "
        "ones (PDL), in the same rounds",
    )
    bench.add_argument("-q", "--quiet", action="store_true", help="only the final table")
    bench.set_defaults(run=_bench)

    explain = commands.add_parser(
        "explain",
        help="explain what the engine decided for one node",
        description="Explain the engine's decision for node NAME of PROBLEM.py or GRAPH.json.",
    )
    _add_target(explain)
    explain.add_argument("--node", required=True, metavar="NAME", help="the node's name")
    _add_dtype(explain)
    _add_arch(explain)
    _add_fold(explain)
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")
    explain.set_defaults(run=_explain)

    realize = commands.add_parser(
        "realize",
        help="emit and compile CUTLASS kernels for a plan (no GPU needed)",
        description=(
            "Plan PROBLEM.py (or GRAPH.json), then emit one CUTLASS source per candidate config of "
            "each GEMM-family pattern and compile them in parallel into the kernel cache. The run "
            "directory holds the plan, the sources, the ranked and dropped configs, the compiled "
            "libraries and a manifest for `fact tune`."
        ),
    )
    _add_target(realize)
    _add_dtype(realize)
    realize.add_argument("--out", required=True, type=Path, metavar="RUN_DIR", help="run directory")
    realize.add_argument(
        "--candidates", type=_at_least(1), metavar="N", help="configs per pattern (default 8)"
    )
    realize.add_argument(
        "--configs",
        metavar="NAME,...",
        help="compile exactly these configs (names as in candidates/pattern-N.json, e.g. "
        "t128x256x64_c2x1_coop_tmacoop_sauto_persistent or q128kv128_pp_s5) for every GEMM or "
        "attention pattern of their family they fit, "
        "instead of the ranked top N",
    )
    realize.add_argument(
        "--jobs",
        type=_at_least(1),
        metavar="N",
        help="parallel compiles (default: all at once up to 1.5x the cores, else one a core)",
    )
    realize.add_argument("--cutlass-dir", metavar="DIR", help="CUTLASS source tree")
    _add_fold(realize)
    realize.add_argument("--json", action="store_true", help="print the manifest as JSON")
    realize.set_defaults(run=_realize, save_graph=None)

    tune = commands.add_parser(
        "tune",
        help="verify and time a realize run's kernels on the GPU; record them in the registry",
        description=(
            "Verify every compiled kernel of RUN_DIR (from `fact realize`) against PyTorch on "
            "fresh "
            "random inputs, time the survivors over their launch knobs next to the unfused "
            "PyTorch path, write RUN_DIR/results.json and RUN_DIR/registry_export.json, and import "
            "the measured rows into the registry. Needs an NVIDIA GPU."
        ),
    )
    tune.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="a `fact realize` run directory"
    )
    tune.add_argument(
        "--precision", choices=("highest", "high", "medium"), help="default: the plan's"
    )
    tune.add_argument("--knobs", default="sweep", help="sweep (default), default, or a JSON list")
    tune.add_argument("--registry", metavar="PATH", help="registry file (default ~/.cache/fact)")
    tune.add_argument("--no-import", action="store_true", help="leave the registry untouched")
    tune.add_argument(
        "--retune",
        action="store_true",
        help="measure kernels the registry already has a passed row for (default: skip them)",
    )
    tune.set_defaults(run=_tune)

    registry = commands.add_parser(
        "registry",
        help="list, show, export or import the pattern registry (fact-engine registry ...)",
        description="The pattern registry: list | show ID | export [-o FILE] | import FILE.",
        add_help=False,
    )
    registry.add_argument("engine_args", nargs=argparse.REMAINDER)
    registry.set_defaults(run=_passthrough)

    cache = commands.add_parser(
        "cache",
        help="check or clean the kernel cache (fact-engine cache ...)",
        description="The kernel cache: verify (every kernel against the digest it was built "
        "with; exit 1 when one is damaged) | clean (remove damaged kernels and failed builds).",
        add_help=False,
    )
    cache.add_argument("engine_args", nargs=argparse.REMAINDER)
    cache.set_defaults(run=_passthrough)

    trace = commands.add_parser(
        "trace",
        help="trace a problem file into a graph file",
        description="Trace PROBLEM.py with torch.export and write its FACT graph (JSON).",
    )
    trace.add_argument("problem", metavar="PROBLEM.py", help="problem file")
    _add_dtype(trace)
    trace.add_argument(
        "--arch",
        choices=ARCH_CHOICES,
        help="apply the rewrites fact.optimize applies for this architecture: layouts, and "
        "LayerNorm folds with --fold-norms (default: none, the graph as exported; discover, "
        "explain and realize of a problem file apply those of their target, sm90 unless --arch "
        "says otherwise)",
    )
    _add_fold(trace)
    trace.add_argument(
        "-o", "--output", required=True, type=Path, metavar="GRAPH.json", help="graph file to write"
    )
    trace.set_defaults(run=_trace)

    from fact.agent.cli import add_command as add_agent

    add_agent(commands)
    return parser


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="PROBLEM.py|GRAPH.json", help="problem file, or a graph from `fact trace`"
    )


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum, refused with that said (before any tracing)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _add_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        help="cast the model and its floating-point inputs before tracing (problem files only)",
    )
    parser.add_argument(
        "--precision",
        choices=("highest", "high", "medium"),
        help="float32 matmul precision recorded in the graph (default: torch's current setting): "
        "highest = fp32-accurate, high allows TF32, medium allows bf16 (problem files only)",
    )


def _add_arch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", choices=ARCH_CHOICES, help="target architecture (default sm90)")


def _add_fold(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fold-norms",
        action="store_true",
        help="fold LayerNorms into the GEMMs after them (fact.folds; off by default: on the H200 "
        "they measured no faster, see bench/README.md)",
    )


def _discover(args: argparse.Namespace) -> int:
    extra = _option("--arch", args.arch) + _option("--gpu", args.gpu)
    return _engine_command("discover", args, extra, save_to=args.save_graph)


def _explain(args: argparse.Namespace) -> int:
    extra = ["--node", args.node, *_option("--arch", args.arch)]
    return _engine_command("explain", args, extra, save_to=None)


def _bench(args: argparse.Namespace) -> int:
    from fact.problem import check_problem_path

    check_problem_path(args.target)
    precision = args.precision or "highest"
    out = args.out or Path("runs") / f"bench-{Path(args.target).stem}-{args.dtype or 'fp32'}"
    from fact.compose.bench import run_bench, summary_table

    bench = run_bench(
        args.target,
        dtype=args.dtype,
        precision=precision,
        out=out,
        candidates=args.candidates,
        compile_baseline=not args.no_compile,
        cuda_graphs=not args.no_cuda_graphs,
        reps=args.reps,
        quiet=args.quiet,
        command="fact " + " ".join(sys.argv[1:]),
        profile=args.profile,
        fold_norms=args.fold_norms,
        compare_pdl=args.compare_pdl,
    )
    print(summary_table(bench))
    print(f"report: {out / 'report.md'}")
    return 0


def _realize(args: argparse.Namespace) -> int:
    extra = ["--out", str(args.out), "--cutlass-dir", find_cutlass(args.cutlass_dir)]
    extra += _option("--candidates", None if args.candidates is None else str(args.candidates))
    extra += _option("--configs", args.configs)
    extra += _option("--jobs", None if args.jobs is None else str(args.jobs))
    return _engine_command("realize", args, extra, save_to=None, stream_stderr=True)


def _passthrough(args: argparse.Namespace) -> int:
    """`fact registry ...` and `fact cache ...`: the engine's commands, their options as given."""
    extra = args.engine_args or ["--help"]
    allowed = (1,) if args.command == "cache" else ()  # verify found a damaged kernel
    done = run_engine([args.command, *extra], allowed=allowed)
    sys.stdout.write(done.stdout)
    return done.returncode


def _tune(args: argparse.Namespace) -> int:
    from fact.tune.runs import unmeasured

    run = args.run_dir
    if not (run / "manifest.json").is_file() or not (run / "plan.json").is_file():
        raise FactError(f"{run} is not a `fact realize` run directory (no manifest.json/plan.json)")
    registry = _option("--registry", args.registry)
    kernels = run
    if not args.retune:
        pending = unmeasured(run, registry)
        if pending is not None:
            if not pending:
                print(
                    f"every kernel of {run} already has a verified measurement in the registry; "
                    "nothing to tune (--retune measures them again)",
                    file=sys.stderr,
                )
                return 0
            kernels = run / "manifest.pending.json"
            kernels.write_text(json.dumps(pending, indent=1))
    from fact.tune import harness  # imports torch: only when there is something to measure

    argv = [str(run / "plan.json"), "--kernels", str(kernels), "--out", str(run / "results.json")]
    argv += ["--export", str(run / "registry_export.json"), "--knobs", args.knobs]
    argv += _option("--precision", args.precision)
    status = harness.main(argv)
    if status != 0 or args.no_import:
        return status
    done = run_engine(["registry", "import", str(run / "registry_export.json"), *registry])
    sys.stdout.write(done.stdout)
    return 0


def find_cutlass(hint: str | None) -> str:
    """CUTLASS's source tree: --cutlass-dir, $CUTLASS_DIR, or the nvidia-cutlass wheel's copy."""
    for candidate in (hint, os.environ.get("CUTLASS_DIR")):
        if candidate:
            return candidate
    try:
        import cutlass_library  # the nvidia-cutlass wheel carries the full source tree
    except ImportError:
        raise FactError(
            "CUTLASS not found: pass --cutlass-dir, set CUTLASS_DIR, or run ./setup.sh "
            "(it installs the nvidia-cutlass wheel, which ships CUTLASS's source)"
        ) from None
    return str(Path(cutlass_library.__file__).parent / "source")


def _trace(args: argparse.Namespace) -> int:
    if args.fold_norms and args.arch is None:
        raise FactError("--fold-norms is one of the rewrites for a target: give --arch too")
    _trace_problem(
        args.problem, args.dtype, args.output, args.precision, args.arch, args.fold_norms
    )
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _engine_command(
    subcommand: str,
    args: argparse.Namespace,
    extra: list[str],
    save_to: Path | None,
    stream_stderr: bool = False,
) -> int:
    """Get a graph for args.target, run `fact-engine SUBCOMMAND` on it, print its stdout."""
    is_graph = _check_target(args.target, args.dtype, save_to)
    if is_graph and args.precision is not None:
        raise FactError(
            f"--precision applies to problem files; {args.target} recorded its precision when "
            "it was traced"
        )
    find_engine()  # fail before a long trace, not after
    arch = getattr(args, "arch", None) or "sm90"  # realize has no --arch: it builds for sm90
    fold = bool(getattr(args, "fold_norms", False))
    if is_graph and fold:
        raise FactError(
            f"--fold-norms applies to problem files; {args.target} was rewritten (or not) when it "
            "was traced (trace the problem file again with --arch and --fold-norms)"
        )
    with _graph_file(
        args.target, is_graph, args.dtype, save_to, args.precision, arch, fold
    ) as graph_path:
        json_flag = ["--json"] if args.json else []
        try:
            done = run_engine(
                [subcommand, str(graph_path), *extra, *json_flag],
                stream_stderr=stream_stderr,
                allowed=(1,) if subcommand == "realize" else (),  # every compile failed
            )
        except FactError as exc:  # name the user's file, not the temporary graph traced from it
            if is_graph or save_to is not None:
                raise
            text = str(exc).replace(
                f"fact-engine print {graph_path}",
                f"fact trace {args.target} -o graph.json` and `fact-engine print graph.json",
            )
            raise type(exc)(text.replace(str(graph_path), str(args.target))) from None
    sys.stdout.write(done.stdout)
    sys.stdout.flush()
    if done.returncode:
        return done.returncode
    return 0


def _check_target(target: str, dtype: str | None, save_to: Path | None) -> bool:
    """Check the target and the options that go with it; True for a graph, False for a problem."""
    path = Path(target)
    if path.suffix == ".json":
        if dtype is not None:
            raise FactError(
                f"--dtype applies to problem files; {target} is a graph, traced already "
                "(trace the problem file again with --dtype to change it)"
            )
        if save_to is not None:
            raise FactError(f"--save-graph applies to problem files; {target} is a graph already")
        if not path.is_file():
            raise FactError(f"graph file {target} not found")
        return True
    if path.suffix != ".py":
        raise FactError(f"{target} is neither a problem file (.py) nor a traced graph (.json)")
    from fact.problem import check_problem_path

    check_problem_path(path)
    return False


@contextlib.contextmanager
def _graph_file(
    target: str,
    is_graph: bool,
    dtype: str | None,
    save_to: Path | None,
    precision: str | None = None,
    arch: str | None = None,
    fold_norms: bool = False,
) -> Iterator[Path]:
    """Yield a graph file for target: the .json itself, or a fresh trace of the .py (with the
    rewrites for `arch`)."""
    if is_graph:
        yield Path(target)
    elif save_to is not None:
        _trace_problem(target, dtype, save_to, precision, arch, fold_norms)
        yield save_to
    else:
        with tempfile.TemporaryDirectory(prefix="fact-") as folder:
            graph_path = Path(folder) / (Path(target).stem + ".json")
            _trace_problem(target, dtype, graph_path, precision, arch, fold_norms)
            yield graph_path


def _trace_problem(
    problem: str,
    dtype: str | None,
    output: Path,
    precision: str | None = None,
    arch: str | None = None,
    fold_norms: bool = False,
) -> None:
    """Load, trace and save a problem file, with progress on stderr. With `arch`, the program
    gets the rewrites fact.optimize gives it for that target (tracer.trace), LayerNorm folds
    only with `fold_norms`."""
    import torch  # loads only when needed

    from fact.problem import check_problem_path, load_problem
    from fact.tracer import save_graph, trace

    if Path(problem).suffix == ".json":
        raise FactError(f"{problem} is a graph already; `fact trace` takes a problem file (.py)")
    check_problem_path(problem)
    as_dtype = f" as {dtype}" if dtype else ""
    print(f"tracing {problem}{as_dtype} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    previous = torch.get_float32_matmul_precision()
    if precision is not None:  # the graph records it; restored for the caller afterwards
        torch.set_float32_matmul_precision(precision)
    try:
        loaded = load_problem(problem, dtype)
        graph = trace(
            loaded.model,
            loaded.inputs,
            source=str(problem),
            arch=arch,
            fold_norms=fold_norms,
            on_rewrite=lambda line: print(line, file=sys.stderr, flush=True),
        )
    finally:
        torch.set_float32_matmul_precision(previous)
    elapsed = time.perf_counter() - start
    save_graph(graph, output)
    print(f"traced {len(graph['nodes'])} nodes in {elapsed:.1f}s", file=sys.stderr, flush=True)


def _option(flag: str, value: str | None) -> list[str]:
    return [flag, value] if value is not None else []


if __name__ == "__main__":
    sys.exit(main())
