"""Lab 09 in the learner's process under ``kvlab grade``: launchers and kvlab's figures only."""
