"""A learner's code as the grading tests hand it in: a solution with slips put in, run from a file
outside kvlab as a notebook cell is; and the failures and hints a check run gives it."""

import pathlib
import tempfile


def learner(source: str, name: str, *edits: str, header: str):
    """``name`` from ``header + source`` with ``edits`` ("old => new", every occurrence) made."""
    for edit in edits:
        old, new = edit.split(" => ")
        assert old in source, old
        source = source.replace(old, new)
    path = pathlib.Path(tempfile.mkdtemp(prefix="kvlab-learner-")) / "cell.py"
    path.write_text(header + source)
    namespace = {}
    exec(compile(header + source, str(path), "exec"), namespace)
    return namespace[name]


def failures(result):
    return [o for o in result.outcomes if not o.passed]


def hints_of(result) -> list[str]:
    return [
        d[len("hint:") :].strip()
        for o in failures(result)
        for d in o.details
        if d.startswith("hint:")
    ]


def assert_only_hint(result, hint: str) -> None:
    """The first failure has exactly this hint, and every later one either folds into it or
    gives the same hint (never another)."""
    from kvlab.grading import Status
    from kvlab.grading.report import SAME_PROBLEM

    assert result.status is Status.FAILED, result.report()
    first, *later = failures(result)
    mine = [d for d in first.details if d.startswith("hint:")]
    assert len(mine) == 1 and " ".join(mine[0].split()) == "hint: " + hint, result.report()
    for o in later:
        folded = o.details[0].startswith(SAME_PROBLEM)
        hinted = [" ".join(d.split()) for d in o.details if d.startswith("hint:")]
        assert folded or hinted in ([], ["hint: " + hint]), result.report()
    assert set(" ".join(h.split()) for h in hints_of(result)) <= {hint}, result.report()
