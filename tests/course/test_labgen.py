import nbformat
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.grading.labgen import (
    BEGIN,
    END,
    LABS_DIR,
    SOLUTIONS_DIR,
    dirty_notebooks,
    make_lab,
    stale_labs,
    strip_solution,
    write_labs,
)


def test_region_becomes_a_stub_at_the_marker_indent():
    source = f"def f(x):\n    {BEGIN}\n    y = x + 1\n    return y\n    {END}\n\nprint(f)"
    out, found = strip_solution(source)
    assert found
    assert out == "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError\n\nprint(f)"


def test_markdown_regions_become_an_answer_prompt():
    out, found = strip_solution(f"Why?\n{BEGIN}\nBecause.\n{END}", cell_type="markdown")
    assert found and out == "Why?\nYOUR ANSWER HERE"


@pytest.mark.parametrize(
    "source, match",
    [
        (f"{BEGIN}\nx = 1", "never closed"),
        (f"x = 1\n{END}", "without a"),
        (f"{BEGIN}\n{BEGIN}\n{END}\n{END}", "inside another"),
    ],
)
def test_unbalanced_markers_are_errors_that_say_where(source, match):
    with pytest.raises(ValueError, match=match):
        strip_solution(source, where="nb.ipynb, cell 3")


lines = st.lists(
    st.text(alphabet=st.characters(blacklist_characters="\n\r"), max_size=30).filter(
        lambda s: "SOLUTION" not in s
    ),
    max_size=8,
)


@given(before=lines, solution=lines, after=lines)
def test_only_the_region_changes(before, solution, after):
    source = "\n".join([*before, BEGIN, *solution, END, *after])
    out, found = strip_solution(source)
    assert found
    assert out == "\n".join([*before, "# YOUR CODE HERE", "raise NotImplementedError", *after])
    unchanged, found = strip_solution("\n".join(before))
    assert not found and unchanged == "\n".join(before)


def _notebook(*sources):
    nb = nbformat.v4.new_notebook()
    for i, s in enumerate(sources):
        cell = nbformat.v4.new_code_cell(s)
        cell.id = f"c{i}"
        cell.outputs = [nbformat.v4.new_output("stream", text="hi")]
        cell.execution_count = 3
        nb.cells.append(cell)
    nb.metadata["widgets"] = {"state": {}}
    return nb


def test_make_lab_strips_outputs_and_tags_exercises(tmp_path):
    nb = _notebook(f"def f():\n    {BEGIN}\n    return 1\n    {END}", "check('00.x', f)")
    lab = make_lab(nb, points={"00.x": 2}.__getitem__)
    assert "widgets" not in lab.metadata
    assert all(c.outputs == [] and c.execution_count is None for c in lab.cells)
    assert lab.cells[0].metadata["tags"] == ["raises-exception"]
    assert "tags" not in lab.cells[1].metadata
    assert nb.cells[0].outputs, "the solution notebook itself is not modified"
    nbformat.write(nb, tmp_path / "solution.ipynb")
    nbformat.write(lab, tmp_path / "lab.ipynb")
    assert len(dirty_notebooks([tmp_path / "solution.ipynb"])) == 3  # widgets + 2 cells
    assert dirty_notebooks([tmp_path / "lab.ipynb"]) == []


def test_write_labs_is_deterministic_and_removes_orphans(tmp_path):
    sols, labs = tmp_path / "solutions", tmp_path / "labs"
    sols.mkdir()
    nbformat.write(_notebook(f"{BEGIN}\nx = 1\n{END}"), sols / "07_demo.ipynb")
    labs.mkdir()
    (labs / "99_orphan.ipynb").write_text("{}")
    written = write_labs(sols, labs)
    assert [p.name for p in written] == ["07_demo.ipynb"]
    assert not (labs / "99_orphan.ipynb").exists()
    first = (labs / "07_demo.ipynb").read_bytes()
    write_labs(sols, labs)
    assert (labs / "07_demo.ipynb").read_bytes() == first
    assert stale_labs(sols, labs) == []
    (labs / "07_demo.ipynb").write_text(first.decode().replace("NotImplementedError", "pass"))
    assert stale_labs(sols, labs) == ["labs/07_demo.ipynb differs from its solution"]


# --- the repository itself --------------------------------------------------------------------


def test_committed_labs_are_up_to_date():
    assert stale_labs() == [], "run `make labs` and commit labs/"


def test_every_solution_has_a_lab_and_exercises():
    solutions = sorted(p.name for p in SOLUTIONS_DIR.glob("[0-9][0-9]_*.ipynb"))
    assert solutions, "no solution notebooks found"
    assert solutions == sorted(p.name for p in LABS_DIR.glob("*.ipynb"))


def _split_solution_lines(solution) -> tuple[set[str], set[str]]:
    """(lines inside solution regions, lines outside them) of a solution notebook."""
    inside_lines, outside_lines = set(), set()
    for cell in solution.cells:
        inside = False
        for line in cell.source.splitlines():
            if line.strip() in (BEGIN, END):
                inside = line.strip() == BEGIN
            else:
                (inside_lines if inside else outside_lines).add(line.strip())
    return inside_lines, outside_lines


def test_no_solution_text_leaks_into_labs():
    for lab_path in sorted(LABS_DIR.glob("*.ipynb")):
        lab = nbformat.read(lab_path, as_version=4)
        solution = nbformat.read(SOLUTIONS_DIR / lab_path.name, as_version=4)
        lab_lines = {line.strip() for c in lab.cells for line in c.source.splitlines()}
        assert not any("BEGIN SOLUTION" in x or "END SOLUTION" in x for x in lab_lines)
        inside, outside = _split_solution_lines(solution)
        # a line only the solution regions contain must not appear in the lab
        leaks = {x for x in inside - outside if len(x) > 12} & lab_lines
        assert not leaks, f"{lab_path.name} leaks: {sorted(leaks)}"


def test_committed_notebooks_are_clean():
    notebooks = sorted(SOLUTIONS_DIR.glob("*.ipynb")) + sorted(LABS_DIR.glob("*.ipynb"))
    assert dirty_notebooks(notebooks) == []


def test_notebooks_open_with_the_kvlab_kernel():
    for path in sorted(SOLUTIONS_DIR.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "kvlab"
        nbformat.validate(nb)


def test_every_exercise_has_one_check_cell_the_judge_recognises():
    """The judge finds a check cell by its whole source (``check("NN.x", name)`` alone): a cell
    that imports ``check`` first runs as a given cell, and its exercise is graded "not run"."""
    from kvlab.grading.judge import CHECK_CELL
    from kvlab.grading.registry import load_lab

    for lab_path in sorted(LABS_DIR.glob("*.ipynb")):
        lab = nbformat.read(lab_path, as_version=4)
        code = [c.source for c in lab.cells if c.cell_type == "code"]
        found = [m.group(1) for m in map(CHECK_CELL.match, code) if m]
        calls = [s for s in code if s.lstrip().startswith("check(") or "\ncheck(" in s]
        assert len(calls) == len(found), f"{lab_path.name}: a check cell holds more than the call"
        expected = [ex.id for ex in load_lab(lab_path.name[:2])]
        assert sorted(found) == sorted(expected), lab_path.name
