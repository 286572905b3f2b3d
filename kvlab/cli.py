"""The ``kvlab`` command: start, doctor, grade, labs, bench, kernel, plan."""

from __future__ import annotations

import argparse
import os
import sys


def _labs(args) -> int:
    from kvlab.core import files
    from kvlab.grading import labgen

    needs = [args.solutions] if args.nbgrader else [args.solutions, args.out]
    if files.checkout_root() is None and None in needs:
        print(
            "kvlab labs: this kvlab is installed from a wheel, which carries the labs but not "
            "their solutions: run it in a git checkout, or pass --solutions DIR (and --out DIR); "
            "`kvlab start` copies the labs for you to work on",
            file=sys.stderr,
        )
        return 2
    args.solutions = args.solutions or labgen.SOLUTIONS_DIR
    args.out = args.out or labgen.LABS_DIR

    if args.nbgrader:
        for path in labgen.export_nbgrader(args.nbgrader, args.solutions):
            print(f"wrote {path}")
        return 0
    if args.check:
        problems = labgen.stale_labs(args.solutions, args.out)
        problems += labgen.dirty_notebooks(sorted(args.solutions.glob("*.ipynb")))
        for p in problems:
            print(p)
        if problems:
            print("run `make labs` (and clear notebook outputs) to fix")
        return 1 if problems else 0
    for path in labgen.write_labs(args.solutions, args.out):
        print(f"wrote {path}")
    return 0


def _plan(args) -> int:
    """Print the capacity and cost plan (or its JSON); bad input exits 2 with the message."""
    import json

    from kvlab.perf.planner import in_words, plan

    try:
        model, log = _plan_inputs(args)
        result = plan(
            model,
            args.gpu,
            num_gpus=args.gpus,
            gpu_memory_utilization=args.utilization,
            workload=args.workload,
            max_seq_len=args.max_seq_len,
            block_size=args.block_size,
            price_per_gpu_hour=args.price,
            target_tokens_per_s=args.target,
            max_num_seqs=args.max_num_seqs,
            min_tokens_per_user=args.min_tokens_per_user,
            users=args.users,
            gpu_memory_gib=args.gpu_memory_gib,
            weights_bytes=None if args.weights_gib is None else args.weights_gib * 2**30,
            max_num_batched_tokens=args.max_num_batched_tokens,
            kv_cache_dtype=args.kv_cache_dtype,
            vllm_log=log,
            prefix_hit_rate=args.prefix_hit_rate,
        )
    except (ValueError, TypeError, OSError) as e:
        print(f"kvlab plan: error: {in_words(str(e), PLAN_FLAGS)}", file=sys.stderr)
        return 2
    try:
        # the summary ends with the `vllm serve` command that realises the plan
        print(json.dumps(result.to_dict(), indent=2) if args.json else result, flush=True)
    except BrokenPipeError:  # `kvlab plan ... | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _plan_inputs(args):
    """The model (a preset, a config.json, or the one the log served) and the log."""
    import json

    from kvlab.models import spec_from_hf_config
    from kvlab.perf.planner import model_for_repo
    from kvlab.perf.vllm_log import read_vllm_log

    log = None
    if args.vllm_log is not None:
        text = sys.stdin.read() if args.vllm_log == "-" else _read_text(args.vllm_log, "--vllm-log")
        log = read_vllm_log(text)
    if args.model is not None and args.model_config is not None:
        raise ValueError("give --model or --model-config, not both")
    if args.model_config is not None:
        text = _read_text(args.model_config, "--model-config")
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--model-config: {args.model_config!r} is not JSON ({e})") from None
        if not isinstance(config, dict):
            raise ValueError(f"--model-config: {args.model_config!r} is not a config.json object")
        quantised = (config.get("quantization_config") or {}).get("quant_method")
        if quantised and args.weights_gib is None:
            raise ValueError(
                f"--model-config: the checkpoint is quantised ({quantised}): its weights are not "
                "its parameters x 2 bytes; give --weights-gib (the weights of one copy, in GiB)"
            )
        # a model's folder holds its config.json; a file named otherwise is named for the model
        path = os.path.abspath(args.model_config)
        stem = os.path.splitext(os.path.basename(path))[0]
        where = os.path.basename(os.path.dirname(path)) if stem == "config" else stem
        name = str(config.get("_name_or_path") or where or config.get("model_type") or "model")
        return spec_from_hf_config(config, name=name), log
    if args.model is not None:
        return args.model, log
    if log is not None and log.model and model_for_repo(log.model):
        return model_for_repo(log.model), log
    said = f" (the log served {log.model!r}, not a preset)" if log and log.model else ""
    raise ValueError(f"--model (a preset) or --model-config (a config.json) is required{said}")


def _read_text(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:  # a log may hold stray bytes
            return f.read()
    except OSError as e:
        raise ValueError(f"{flag}: cannot read {path!r}: {e.strerror or e}") from None


# the planner's argument names as `kvlab plan` spells them, for its error messages
PLAN_FLAGS = {
    "num_gpus": "--gpus",
    "gpu_memory_utilization": "--utilization",
    "max_seq_len": "--max-seq-len",
    "block_size": "--block-size",
    "price_per_gpu_hour": "--price",
    "target_tokens_per_s": "--target",
    "max_num_seqs": "--max-num-seqs",
    "min_tokens_per_user": "--min-tokens-per-user",
    "users": "--users",
    "gpu_memory_gib": "--gpu-memory-gib",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "kv_cache_dtype": "--kv-cache-dtype",
    "vllm_log": "--vllm-log",
    "prefix_hit_rate": "--prefix-hit-rate",
    "weights_bytes": "--weights-gib",
    "overhead_bytes": "overhead",
}


def build_parser() -> argparse.ArgumentParser:
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="kvlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser(
        "start",
        help="copy the labs into a folder (never over your edits) and open JupyterLab there",
    )
    start.add_argument("dir", nargs="?", default="kvlab-labs", help="where (./kvlab-labs)")
    start.add_argument("--no-lab", action="store_true", help="only copy; do not start JupyterLab")
    start.add_argument("--port", type=int, help="JupyterLab's port (default: Jupyter's, 8888)")
    doctor = sub.add_parser("doctor", help="check that this environment can run the course")
    doctor.add_argument(
        "--quick",
        action="store_true",
        help="skip starting the kvlab Jupyter kernel (a few seconds)",
    )

    grade = sub.add_parser("grade", help="run notebooks headlessly and score their exercises")
    grade.add_argument("paths", nargs="+", help="notebooks, or folders of submissions")
    grade.add_argument("--json", action="store_true", help="print JSON instead of a table")
    grade.add_argument("--cell-timeout", type=int, default=300, help="seconds per cell (300)")
    grade.add_argument(
        "--jobs", type=int, default=1, help="notebooks graded at once, each in its own kernel (1)"
    )
    grade.add_argument(
        "--kernel",
        default=None,
        help="grade the old, self-reported way, the whole notebook in this registered Jupyter "
        "kernel (default: none: the sandboxed judge runs the instructor's copy of each lab with "
        "the submission's exercise cells)",
    )
    grade.add_argument(
        "--out",
        metavar="DIR",
        help="grade PATHS as a class (folders of student folders or STUDENT_NN.ipynb files): "
        "write gradebook.csv, grades.json and feedback/STUDENT.md into this folder",
    )
    grade.add_argument(
        "--shard",
        metavar="K/N",
        help="grade only the K-th of N slices of the class (1-based; writes grades.json only)",
    )
    grade.add_argument(
        "--merge",
        action="store_true",
        help="PATHS are the shards' grades.json (or their folders): combine them into --out",
    )
    grade.add_argument(
        "--roster",
        metavar="CSV",
        help="class grading: a CSV of folder name -> student id (header folder,id): "
        "gradebook_wide.csv gets an id column and a row for every student of the roster",
    )
    grade.add_argument(
        "--student",
        action="append",
        metavar="NAME",
        help="class grading: grade only this student (repeatable) and merge the new rows into "
        "the class already graded in --out",
    )
    grade.add_argument(
        "--notebook-timeout",
        type=float,
        metavar="SECONDS",
        default=1800,
        help="class grading: seconds for one notebook, kernel start included (1800)",
    )

    kernel = sub.add_parser(
        "kernel", help="register the 'kvlab (Python 3)' Jupyter kernel for this environment"
    )
    where = kernel.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="in your user's Jupyter folder")
    where.add_argument("--prefix", help="under this prefix (default: this environment)")

    bench = sub.add_parser("bench", help="run a benchmark, print figures, write JSON")
    bench.add_argument(
        "name",
        choices=[
            "allocator",
            "serve",
            "chunked-prefill",
            "fleet",
            "attention",
            "attention-sweep",
            "attention-grid",
            "grade",
        ],
        help="what to measure",
    )
    bench.add_argument("--out", help="JSON path (default: benchmarks/NAME.json)")
    bench.add_argument("--budget", type=float, help="attention-sweep: seconds before it stops")
    bench.add_argument(
        "--requests", type=int, help="serve: requests in the timed run (default 100,000)"
    )
    bench.add_argument(
        "--tiny", action="store_true", help="attention-grid: tiny shapes (the CPU dry run)"
    )

    from kvlab.models import PRESETS
    from kvlab.perf.gpus import CATALOGUE

    plan = sub.add_parser(
        "plan",
        help="capacity and cost of a model on GPUs: contiguous vs paged KV cache",
        epilog=f"models: {', '.join(PRESETS)}; GPUs: {', '.join(CATALOGUE)} (prices are "
        "assumptions: pass --price)",
    )
    plan.add_argument("--model", help="a model preset, e.g. Llama-3-8B")
    plan.add_argument(
        "--model-config",
        metavar="FILE",
        help="a Hugging Face config.json instead of a preset (layers, heads, sizes, dtype)",
    )
    plan.add_argument(
        "--vllm-log",
        metavar="FILE",
        help="a vLLM start-up log ('-': stdin): plan with the memory it measured and compare "
        "the blocks it printed; a log with only its KV size, blocks or tokens plans with those "
        "(the rest predicted, and said so), and one whose server would not start says by how much",
    )
    plan.add_argument("--gpu", required=True, help="a GPU preset, e.g. H100-80GB")
    plan.add_argument("--gpus", type=int, help="GPUs per copy, tensor parallel (1, or the log's)")
    plan.add_argument("--workload", default="sharegpt", help="sharegpt or alpaca (sharegpt)")
    plan.add_argument("--max-seq-len", type=int, help="longest request (default: the model's)")
    plan.add_argument("--block-size", type=int, help="tokens per KV block (16, or the log's)")
    plan.add_argument(
        "--weights-gib",
        type=float,
        metavar="X",
        help="the weights of one copy in GiB (a quantised model; default: parameters x 2 bytes)",
    )
    plan.add_argument(
        "--kv-cache-dtype",
        help="auto (the model's dtype), fp8 (1 byte: half the KV bytes), fp8_e4m3, fp8_e5m2, "
        "int8_per_token_head, fp8_per_token_head, nvfp4, bfloat16, ...: vLLM's choices",
    )
    plan.add_argument(
        "--max-num-batched-tokens",
        type=int,
        metavar="N",
        help="tokens per step, which sizes vLLM's activation memory (default: vLLM's, 8192 on "
        "GPUs of 70 GiB or more other than the A100, else 2048)",
    )
    plan.add_argument(
        "--utilization", type=float, help="share of GPU memory to use (0.9, or the log's)"
    )
    plan.add_argument("--price", type=float, help="dollars per GPU-hour (default: catalogue's)")
    plan.add_argument(
        "--target", type=float, help="generated tokens/s to size GPUs (replicas x --gpus) for"
    )
    plan.add_argument(
        "--prefix-hit-rate",
        type=float,
        default=0.0,
        metavar="H",
        help="share of prompt tokens served from a prefix cache, 0 to <1 (0)",
    )
    plan.add_argument(
        "--max-num-seqs",
        type=int,
        help="cap on requests running at once (default: vLLM's, 1024 on GPUs of 70 GiB or more "
        "other than the A100, else 256; 0: no cap)",
    )
    plan.add_argument(
        "--min-tokens-per-user",
        type=float,
        metavar="S",
        help="cap the requests at once so that each gets at least S generated tokens/s",
    )
    plan.add_argument(
        "--users", type=int, metavar="N", help="size GPUs for N requests at once (each at >= S)"
    )
    plan.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="X",
        help="a GPU not in the catalogue: --gpu's bandwidth, FLOP/s and price with X GiB of memory "
        "(or the total your vLLM log prints)",
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")

    labs = sub.add_parser("labs", help="write learner notebooks from the solutions")
    labs.add_argument("--solutions", type=Path, help="default: the course's solutions/")
    labs.add_argument("--out", type=Path, help="default: the course's labs/")
    labs.add_argument("--check", action="store_true", help="only report stale labs; exit 1 if any")
    labs.add_argument(
        "--nbgrader",
        type=Path,
        metavar="DIR",
        help="instead, write an nbgrader course: DIR/source/<lab>/<lab>.ipynb (labs/ untouched)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "start":
        from kvlab.course.start import main as start

        return start(args.dir, lab=not args.no_lab, port=args.port)
    if args.command == "doctor":
        from kvlab.course.doctor import main as doctor

        return doctor(start_kernel=not args.quick)
    if args.command == "grade":
        if args.out or args.shard or args.merge or args.student or args.roster:
            from kvlab.grading.classroom import main as grade_class

            return grade_class(
                args.paths,
                out=args.out,
                jobs=args.jobs,
                shard=args.shard,
                merge=args.merge,
                cell_timeout=args.cell_timeout,
                notebook_timeout=args.notebook_timeout,
                kernel_name=args.kernel,
                as_json=args.json,
                roster=args.roster,
                students=args.student,
            )
        from kvlab.grading.notebook import main as grade

        if any(os.path.isdir(p) for p in args.paths):
            print(
                "kvlab grade: tip: --out DIR grades a folder of submissions as a class "
                "(gradebook.csv, grades.json, feedback per student)",
                file=sys.stderr,
            )
        return grade(args.paths, args.json, args.cell_timeout, args.kernel, args.jobs)
    if args.command == "kernel":
        from kvlab.course.jupyter_kernel import install

        print(f"registered the kvlab kernel in {install(user=args.user, prefix=args.prefix)}")
        return 0
    if args.command == "bench":
        from kvlab.grading.bench_grade import grade
        from kvlab.perf.bench import main as bench

        more = {"grade": grade}
        return bench(args.name, args.out, args.budget, args.requests, args.tiny, more=more)
    if args.command == "plan":
        return _plan(args)
    return _labs(args)


if __name__ == "__main__":
    sys.exit(main())
