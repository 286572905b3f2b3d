"""What the learner's process sees of ``kvlab.grading`` under ``kvlab grade``.

The graders (checks, references, slips) are hidden from that process by the sandbox; these
files are bound in their place (``kvlab.grading.judge.student_view``), so that a lab's given
cells still import what they use: ``check`` and ``run_checks`` (the judge runs the checks; here
they say so), Lab 05's and Lab 09's launchers, and Lab 09's ``almost_free_tokens``, which the
judge computes (:func:`kvlab.grading.judge_child.served`) and refuses to the learner's code
while it is checked. Nothing here imports a grader.
"""
