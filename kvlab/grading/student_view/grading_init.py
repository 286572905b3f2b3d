"""``kvlab.grading`` in the learner's process under ``kvlab grade``: the checks run in the judge.

``check`` and ``run_checks`` exist so the lab's given cells run; they check nothing here and
say not passed, so a lab goes on with kvlab's own version of an exercise (its check cell is
judged all the same).
"""

from kvlab.grading.expect import CheckFailed


class Checked:
    """What ``check``/``run_checks`` return here: ``ok`` is False (not checked in this process)."""

    ok = False
    passed = False

    def __init__(self, exercise_id):
        self.exercise_id = exercise_id

    def __repr__(self):
        return f"<{self.exercise_id}: checked by kvlab grade's judge, not here>"


def check(exercise_id, obj=None, *args, **kwargs):
    return Checked(exercise_id)


def run_checks(exercise_id, obj=None, *args, **kwargs):
    return Checked(exercise_id)


__all__ = ["CheckFailed", "check", "run_checks"]
