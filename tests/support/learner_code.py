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
