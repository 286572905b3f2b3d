"""Course tooling: the `kvlab` Jupyter kernel, `kvlab doctor`, lab generation, JupyterLab defaults,
and ``kvlab start`` (:mod:`~kvlab.course.start`), which copies the labs into a learner's folder
and opens JupyterLab."""
