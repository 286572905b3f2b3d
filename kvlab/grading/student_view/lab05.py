"""Lab 05's launcher in the learner's process under ``kvlab grade`` (the checks are the judge's)."""

from kvlab.grading.blame import explain_exception
from kvlab.grading.limits import CheckTimeout, ChildCrashed, can_fork, in_child_process
from kvlab.ops.kernels import launch_paged_decode
from kvlab.ops.runtime import kernel_mode


def launch_isolated(fn, *args, timeout: float = 60.0):
    """``launch_paged_decode(fn, *args)``, in a forked child under Triton's interpreter:
    ``(output, None)`` or ``(None, what went wrong)``."""

    def launch():
        try:
            return launch_paged_decode(fn, *args), None
        except Exception as error:
            return None, f"it raised {explain_exception(error)[0]}"

    if kernel_mode() != "interpreter" or not can_fork():
        return launch()
    try:
        return in_child_process(launch, timeout)
    except CheckTimeout:
        return None, f"it did not finish within {timeout:g} s"
    except ChildCrashed as crash:
        return None, f"it crashed its process ({crash.how})"
