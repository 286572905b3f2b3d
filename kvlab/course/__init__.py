"""Course tooling: where the course's files are (:mod:`~kvlab.course.files`) and ``kvlab start``
(:mod:`~kvlab.course.start`), which copies the labs into a learner's folder and opens JupyterLab."""
