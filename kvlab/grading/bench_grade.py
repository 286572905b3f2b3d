"""``kvlab bench grade``: a synthetic class (:mod:`kvlab.grading.synthetic`) graded three ways,
every score checked against what it should be.

1. by the judge, ``--jobs 2``: the gradebook must be right and no cheat may earn a point;
2. by the judge in 3 shards run side by side, merged: the same gradebook;
3. the self-reported way (``--kernel kvlab``, the grader before the judge), for the time it
   took and the cheats that worked there (a file planted in kvlab's package is left out of this
   run: nothing would stop it writing into the package);
4. ``kvlab grade class``'s throughput on a class of mixed labs (solved and unsolved Labs 00,
   03, 05, 06), idle and with a busy process per core beside it: notebooks per minute each way
   (target >= 3 on 2 cores), and the same scores both ways.

Figures, not asserts: submissions per minute each way, the judge's cost per submission.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UNSAFE_BEFORE = ("plant_file",)  # would write into this checkout's kvlab/ without the sandbox


def _timed(submissions, **options) -> tuple[list[dict], float]:
    from kvlab.grading.classroom import grade_submissions

    started = time.monotonic()
    records = grade_submissions(submissions, progress=False, **options)
    return records, time.monotonic() - started


def _rate(n: int, seconds: float) -> dict:
    return {
        "submissions": n,
        "seconds": round(seconds, 1),
        "per_minute": round(60 * n / seconds, 1),
        "seconds_per_submission": round(seconds / n, 2),
    }


def _cheats_that_worked(expected, records) -> list[str]:
    from kvlab.grading.synthetic import CHEATS, compare

    return sorted({line.split("/")[0] for line in compare(expected, records)} & set(CHEATS))


def grade(
    labs=None, jobs: int = 2, shards: int = 3, before: bool = True, throughput: bool = True
) -> dict:
    from kvlab.grading import synthetic
    from kvlab.grading.classroom import discover, gradebook_csv, load_grades, merge_documents

    labs = tuple(labs or synthetic.LABS)
    for trace in synthetic.TRACES:
        trace.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvlab-bench-grade-") as tmp:
        root = Path(tmp)
        expected = synthetic.build_class(root / "class", labs=labs)
        found = discover([root / "class"]).submissions
        print(
            f"kvlab bench grade: {len(found)} submissions ({len(labs)} labs x "
            f"{len(synthetic.VARIANTS)} kinds), --jobs {jobs}",
            file=sys.stderr,
        )

        judged, judge_s = _timed(found, jobs=jobs)
        wrong = synthetic.compare(expected, judged)
        single = gradebook_csv(judged)

        started = time.monotonic()
        runs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kvlab",
                    "grade",
                    str(root / "class"),
                    "--shard",
                    f"{k}/{shards}",
                    "--out",
                    str(root / f"shard-{k}"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for k in range(1, shards + 1)
        ]
        codes = [run.wait() for run in runs]
        shard_s = time.monotonic() - started
        merged = merge_documents(
            [(f"shard-{k}", load_grades(root / f"shard-{k}")) for k in range(1, shards + 1)]
        )
        merged_csv = gradebook_csv(merged["notebooks"])
        same = merged_csv == single and codes == [0] * shards
        differ = sorted(set(merged_csv.splitlines()) ^ set(single.splitlines()))

        report = {
            "benchmark": "grade",
            "machine": f"{_cores()} cores",
            "labs": list(labs),
            "kinds": list(synthetic.VARIANTS),
            "judge": _rate(len(found), judge_s) | {"jobs": jobs},
            "judge_gradebook_right": not wrong,
            "judge_mismatches": wrong[:20],
            "judge_cheats_that_worked": _cheats_that_worked(expected, judged),
            "shards": _rate(len(found), shard_s) | {"processes": shards},
            "shards_merged_equal_one_run": same,
            "shard_exit_codes": codes,
            "shard_rows_that_differ": differ[:20],
            "shards_mismatches": synthetic.compare(expected, merged["notebooks"])[:20],
            "traces_left_by_cheats": [str(t) for t in synthetic.TRACES if t.exists()],
        }
        if before:
            kept = [s for s in found if s.student not in UNSAFE_BEFORE]
            old, old_s = _timed(kept, jobs=jobs, kernel_name="kvlab")
            shown = [e for e in expected if e.student not in UNSAFE_BEFORE]
            report["self_reported"] = _rate(len(kept), old_s) | {"jobs": jobs}
            report["self_reported_cheats_that_worked"] = _cheats_that_worked(shown, old)
            judged_kept = [r for r in judged if r["student"] not in UNSAFE_BEFORE]
            judged_kept_s = sum(r.get("seconds", 0) for r in judged_kept)
            old_kept_s = sum(r.get("seconds", 0) for r in old)
            report["judge_cost_per_submission"] = round(judged_kept_s / old_kept_s - 1, 3)
            report["wall_time_ratio"] = round((judge_s / len(found)) / (old_s / len(kept)), 3)
    if throughput:
        report["class_throughput"] = class_throughput(jobs=jobs)
    report["results"] = {
        "judge: submissions per minute": report["judge"]["per_minute"],
        "shards merged: submissions per minute": report["shards"]["per_minute"],
    }
    if throughput:
        for how in ("idle", "loaded"):
            figure = report["class_throughput"][how]["per_minute"]
            report["results"][f"kvlab grade class, {how}: notebooks per minute"] = figure
    if before:
        report["results"]["self-reported: submissions per minute"] = report["self_reported"][
            "per_minute"
        ]
    report["targets"] = {
        "every score as it should be": (not wrong, not wrong),
        "no cheat earns a point": (
            report["judge_cheats_that_worked"] or "none",
            not report["judge_cheats_that_worked"],
        ),
        "shards merged = one run": (same, same),
    }
    if throughput:
        t = report["class_throughput"]
        for how in ("idle", "loaded"):
            report["targets"][f">= 3 notebooks per minute, {how}"] = (
                t[how]["per_minute"],
                t[how]["per_minute"] >= 3,
            )
        report["targets"]["same scores idle and loaded"] = (
            t["same_scores_idle_and_loaded"],
            t["same_scores_idle_and_loaded"],
        )
    if before:
        cost = report["wall_time_ratio"] - 1
        report["targets"]["judge costs <= 25% more wall time per submission"] = (
            f"{cost:+.0%}",
            cost <= 0.25,
        )
    return report


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


BURN = """import sys, time, select
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:  # busy, and gone when its parent closes stdin or the time is up
    if select.select([sys.stdin], [], [], 0)[0]:
        break
    sum(range(20000))
"""


def _burners(n: int, seconds: float) -> list:
    """``n`` processes that keep a core busy each, for at most ``seconds`` (bounded, and they
    stop as soon as their stdin is closed)."""
    return [
        subprocess.Popen([sys.executable, "-c", BURN, str(seconds)], stdin=subprocess.PIPE)
        for _ in range(n)
    ]


def class_throughput(labs=("00", "03", "05", "06"), kinds=("solution", "unsolved"), jobs=2):
    """``kvlab grade class``'s rate on a class of mixed labs, on the machine as it is ("idle":
    whatever else runs there, its load average said) and with one busy process per core beside
    it ("loaded"); the scores must be the same both ways (CPU-time limits)."""
    from kvlab.grading import synthetic
    from kvlab.grading.classroom import discover, gradebook_csv

    report = {"labs": list(labs), "kinds": list(kinds), "jobs": jobs, "cores": _cores()}
    with tempfile.TemporaryDirectory(prefix="kvlab-bench-throughput-") as tmp:
        expected = synthetic.build_class(Path(tmp) / "class", labs=labs, kinds=kinds)
        found = discover([Path(tmp) / "class"]).submissions
        gradebooks = {}
        for how in ("idle", "loaded"):
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            burners = _burners(_cores(), 3600) if how == "loaded" else []
            try:
                records, seconds = _timed(found, jobs=jobs)
            finally:
                for b in burners:
                    b.stdin.close()
                    b.wait()
            gradebooks[how] = gradebook_csv(records)
            report[how] = _rate(len(found), seconds) | {
                "load_average_before": None if load is None else round(load, 2),
                "burners": len(burners),
                "gradebook_right": not synthetic.compare(expected, records),
            }
    report["same_scores_idle_and_loaded"] = gradebooks["idle"] == gradebooks["loaded"]
    report["target >= 3 per minute"] = {
        how: report[how]["per_minute"] >= 3 for how in ("idle", "loaded")
    }
    return report
