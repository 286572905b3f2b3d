"""Lab 09's ``almost_free_tokens`` in the learner's process under ``kvlab grade``: the judge
computes it for the lab's given cells, and refuses it to the learner's code under a check."""

from kvlab.grading.judge_child import served


def almost_free_tokens(spec, gpu, batch, context, **options):
    return served(
        "kvlab.grading.lab09.roofline.almost_free_tokens", spec, gpu, batch, context, **options
    )
