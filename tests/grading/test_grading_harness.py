"""The check harness's reporting rules, on made-up exercises: hints only for diagnosed mistakes,
knock-on failures folded, class exercises judged method by method, Triton's import-order failure
explained as such."""

from kvlab.grading import Status, run_checks
from kvlab.grading.expect import CheckFailed, plural
from kvlab.grading.registry import exercise
from kvlab.grading.report import FAIL_MARK, NO_DIAGNOSIS, PASS_MARK, SAME_PROBLEM
from kvlab.ops.runtime import TRITON_TOO_EARLY_MARK

# --- a function exercise: twice its input ------------------------------------------------------

double = exercise("zz.double", "double a number")


def _expect_double(fn, x):
    got = fn(x)
    if got == 2 * x:
        return
    if got == x + 2:  # a diagnosed mistake: the same cause in every check it breaks
        raise CheckFailed("wrong", input=f"x={x}", expected=2 * x, got=got, hint="× 2, not + 2")
    raise CheckFailed("wrong", input=f"x={x}", expected=2 * x, got=got)


@double.check("small numbers")
def _small(fn):
    _expect_double(fn, 3)


@double.check("zero")
def _zero(fn):
    _expect_double(fn, 0)


@double.check("a long input")
def _long(fn):
    if fn(10**6) != 2 * 10**6:
        raise CheckFailed("wrong", input="a list of 10,000 numbers", replay="make_case(seed=7)")


def details(result) -> list[list[str]]:
    return [o.details for o in result.outcomes]


def test_a_diagnosed_mistake_is_explained_once_then_folded():
    result = run_checks("zz.double", lambda x: x + 2)
    first, second, third = details(result)
    assert "hint:     × 2, not + 2" in first
    assert second == [f"{SAME_PROBLEM} (“small numbers”)", "input:    x=0"]
    assert third[0] == "wrong"  # not recognised: never another mistake's hint
    assert f"note:     {NO_DIAGNOSIS}" in third and not any(d.startswith("hint:") for d in third)
    assert "replay:   make_case(seed=7)" in third


def test_an_unknown_mistake_gets_the_neutral_line_not_a_guess():
    result = run_checks("zz.double", lambda x: 7)
    small, zero, long = details(result)
    for d in (small, zero):
        assert d[-1] == f"note:     {NO_DIAGNOSIS}: compare expected with got"
    assert long[-1] == f"note:     {NO_DIAGNOSIS}"  # nothing shown to compare


def test_the_same_exception_at_the_same_line_is_folded():
    def broken(x):
        return x.bit_count_please()

    result = run_checks("zz.double", broken)
    first, second, _ = details(result)
    assert first[0].startswith("AttributeError") and "bit_count_please" in first[1]
    assert second[0].startswith(SAME_PROBLEM)


def test_an_unwritten_function_says_so_once():
    def stub(x):
        raise NotImplementedError

    result = run_checks("zz.double", stub)
    assert result.status is Status.NOT_IMPLEMENTED and "not implemented yet" in result.report()


def test_not_implemented_from_a_library_is_an_ordinary_error():
    """torch and Triton raise NotImplementedError for their own reasons: not "write your code"."""

    def uses_a_module_without_forward(x):
        import torch

        return torch.nn.Module()(x)

    result = run_checks("zz.double", uses_a_module_without_forward)
    assert result.status is Status.FAILED
    assert result.outcomes[0].details[0].startswith("NotImplementedError")
    assert "at line" in result.outcomes[0].details[1]


def test_an_unwritten_helper_is_named():
    def helper(x):
        raise NotImplementedError

    def double_it(x):
        return helper(x) * 2

    result = run_checks("zz.double", double_it)
    assert result.status is Status.NOT_IMPLEMENTED
    assert "(`helper` still raises NotImplementedError)" in " ".join(result.report().split())
    assert all(len(line) <= 96 for line in result.report().splitlines())  # wrapped on words


def test_a_lambda_inside_an_unwritten_function_names_the_function():
    def double_it(x):
        return [(lambda: (_ for _ in ()).throw(NotImplementedError()))() for _ in [x]][0]

    result = run_checks("zz.double", double_it)
    assert result.status is Status.NOT_IMPLEMENTED


def test_marks_are_text_glyphs():
    report = run_checks("zz.double", lambda x: 2 * x if x else 1).report()
    assert PASS_MARK in report and FAIL_MARK in report
    assert not any(ord(ch) > 0x1F000 for ch in report), "no emoji: legible without an emoji font"


def test_plural():
    assert plural(1, "room") == "1 room" and plural(2, "room") == "2 rooms"
    assert plural(1_000, "guest") == "1,000 guests" and plural(0, "party", "parties") == "0 parties"


# --- a class exercise: a counter with three methods ----------------------------------------------

counter = exercise("zz.counter", "a counter", expects="class")


@counter.check("start at zero")
def _start(cls):
    if cls().value() != 0:
        raise CheckFailed("a new counter holds 0")


@counter.check("add")
def _add(cls):
    c = cls()
    c.add(3)
    if c.value() != 3:
        raise CheckFailed("add(3) then value() is 3")


@counter.check("reset")
def _reset(cls):
    c = cls()
    c.add(3)
    c.reset()
    if c.value() != 0:
        raise CheckFailed("reset() brings it back to 0")


@counter.check("add after reset")
def _again(cls):
    c = cls()
    c.reset()
    c.add(1)
    if c.value() != 1:
        raise CheckFailed("counting starts again after reset()")


class Partial:
    def __init__(self):
        self.n = 0

    def value(self):
        return self.n

    def add(self, k):
        self.n += k

    def reset(self):
        raise NotImplementedError


def test_a_class_gets_credit_for_the_methods_written():
    result = run_checks("zz.counter", Partial)
    assert result.status is Status.FAILED and result.passed == 2 and result.unwritten == ["reset"]
    report = result.report()
    assert report.splitlines()[0].endswith("2/4 checks passed (still to write: `reset`)")
    single = run_checks("zz.double", lambda x: 2 * x).report()
    assert "3/3 checks passed" in single
    assert "not implemented yet: `reset` still raises NotImplementedError" in report
    assert "needs `reset`, which is not written yet" in report


def test_a_class_with_nothing_written_is_not_implemented():
    class Stub:
        def __init__(self):
            raise NotImplementedError

    result = run_checks("zz.counter", Stub)
    assert result.status is Status.NOT_IMPLEMENTED
    assert "(`__init__` still raises NotImplementedError)" in result.report()


def test_a_lab_module_that_fails_to_import_can_be_retried(monkeypatch, tmp_path):
    import sys

    import pytest

    from kvlab.grading import registry

    broken = tmp_path / "kvlab_broken_lab.py"
    broken.write_text(
        "from kvlab.grading.registry import exercise\n"
        "exercise('yy.first', 'first')\n"
        "raise RuntimeError('a bug in the lab module')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    real_import = registry.importlib.import_module
    monkeypatch.setattr(
        registry.importlib,
        "import_module",
        lambda name: (
            real_import("kvlab_broken_lab") if name == "kvlab.grading.labyy" else real_import(name)
        ),
    )
    for _ in range(2):  # the same error each time, never "defined twice"
        with pytest.raises(RuntimeError, match="a bug in the lab module"):
            registry.load_lab("yy")
        sys.modules.pop("kvlab_broken_lab", None)
    assert "yy.first" not in registry.EXERCISES


# --- Triton imported too early -------------------------------------------------------------------

kernel_like = exercise("zz.kernel_like", "a kernel launch")


@kernel_like.check("one launch")
def _launch_one(fn):
    fn()


@kernel_like.check("another launch")
def _launch_two(fn):
    fn()


def test_triton_imported_too_early_is_not_blamed_on_the_learner():
    def launch():
        try:
            raise RuntimeError(f"Cannot call @triton.jit'd {TRITON_TOO_EARLY_MARK}")
        except RuntimeError as e:
            raise ValueError("InterpreterError wrapping it") from e

    first, second = details(run_checks("zz.kernel_like", launch))
    assert first[0].startswith("Triton was imported before kvlab chose its interpreter")
    assert "not a mistake in your code" in first[0] and "kvlab (Python 3)" in first[1]
    assert second[0].startswith(SAME_PROBLEM)


def test_warnings_are_named_as_warnings_not_as_printing():
    """NumPy inside Triton's interpreter warns; the learner printed nothing."""
    import warnings

    def noisy_double(x):
        for _ in range(1000):
            warnings.warn("invalid value encountered in divide", RuntimeWarning, stacklevel=1)
        return 2 * x

    result = run_checks("zz.double", noisy_double)
    assert result.ok and result.printed_chars == 0
    assert result.warnings == ["RuntimeWarning: invalid value encountered in divide"]
    report = result.report()
    assert "note: 1 warning during the checks (hidden), e.g. RuntimeWarning: invalid" in report
    assert "printed" not in report


def test_grading_lists_exercises_in_the_notebooks_order():
    from pathlib import Path

    import nbformat

    from kvlab.grading.notebook import expected_exercises

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('check("00.decode_step", f)')]
    # the checked one first, then the lab's exercise whose check cell is missing
    assert expected_exercises(nb, Path("00_mine.ipynb")) == ["00.decode_step", "00.kv_bytes"]


# --- long report lines wrap on words (JupyterLab wraps output mid-word) -------------------------

wordy = exercise("zz.wordy", "a check whose hint is a long sentence about servers and key cards")
LONG_HINT = (
    "for i in range(len(block_table)) the servers read every room on the key card, "
    "then the guest's last room, whose empty beds must never be read: mask them by token"
)


@wordy.check("a title long enough to need a second line when it is printed beside its mark " * 2)
def _wordy(fn):
    if fn(1) != 2:
        raise CheckFailed("wrong", input="x=1", expected=[2] * 40, got=fn(1), hint=LONG_HINT)


def test_long_report_lines_wrap_on_words_under_the_label():
    from kvlab.grading.report import REPORT_WIDTH

    result = run_checks("zz.wordy", lambda x: 3)
    hint = next(d for d in result.outcomes[0].details if d.startswith("hint:"))
    assert hint == f"hint:     {LONG_HINT}"  # the details themselves stay whole
    lines = result.report().splitlines()
    assert all(len(line) <= REPORT_WIDTH for line in lines), lines
    start = next(i for i, line in enumerate(lines) if line.startswith("   hint:"))
    continued = lines[start + 1]
    assert continued.startswith(" " * 13) and not continued.startswith(" " * 14)
    # nothing lost, no word cut: joining the lines on spaces gives the hint back
    joined = " ".join(line.strip() for line in lines[start : start + 3])
    assert LONG_HINT in joined.removeprefix("hint: ").strip()
    title = next(i for i, line in enumerate(lines) if line.startswith(FAIL_MARK))
    assert lines[title + 1].startswith("  ") and not lines[title + 1].startswith("   ")
    # an unbreakable word stays whole (longer than a line, it is left to the browser)
    from kvlab.grading.report import wrap

    assert wrap("got:      " + "x" * 200, "   ") == ["   got:      " + "x" * 200]
    assert wrap("got:      ab " + "x" * 200, "   ") == ["   got:      ab", " " * 13 + "x" * 200]
    assert wrap("short line", "   ") == ["   short line"]
    code = (
        "hint:     "
        + "word " * 14
        + "`if seq.status != SequenceStatus.RUNNING: continue`, then more"
    )
    assert [line.count("`") for line in wrap(code, "   ")] == [0, 2]  # the code moves down whole
    assert wrap("a\nb", "   ") == ["   a", "   b"]


def test_a_wrong_type_is_named_once():
    import pytest
    import torch

    from kvlab.grading.expect import expect_type

    for value, got in (([torch.zeros(2)], "list [tensor([0., 0.])]"), ("3", "str '3'")):
        with pytest.raises(CheckFailed) as e:
            expect_type(value, int, "the count")
        assert e.value.got == got


def test_a_key_error_reads_as_its_message():
    from kvlab.grading.blame import explain_exception

    try:
        {}["x"]
    except KeyError as e:
        assert explain_exception(e)[0] == "KeyError: 'x'"  # a missing key keeps its quotes
    error = KeyError("seq_id 'dan' is not in the block manager")
    assert explain_exception(error) == ["KeyError: seq_id 'dan' is not in the block manager"]
