"""Course tooling: the `kvlab` Jupyter kernel, `kvlab doctor`, lab generation, JupyterLab defaults."""
