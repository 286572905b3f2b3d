"""The graders' slipped schedulers are kvlab's: each slip of Lab 06's and Lab 09's step is a
subclass of kvlab's Scheduler that overrides one of its hooks (or puts two such slips together),
and with no slip put in, the graders' references serve random days (admissions, preemption by
recompute and by swap, max_batch, token budgets, chunked prefill) as kvlab's Scheduler.step does,
step by step."""

import pytest
from scheduler_days import random_days, serve

from kvlab.grading import lab06, lab09
from kvlab.grading.lab06.references import slipped
from kvlab.serving.scheduler import Scheduler

DAYS = random_days(200)
REFERENCES = {"06": lab06.slipped_step, "09": lab09.slipped_budget_step}


@pytest.mark.parametrize("lab", sorted(REFERENCES))
def test_the_graders_reference_with_no_slip_is_kvlabs_step(lab):
    for k, day in enumerate(DAYS):
        want = serve(day, schedule=Scheduler.step)
        assert serve(day, schedule=REFERENCES[lab]) == want, (k, day)


def _own(variant: type) -> set[str]:
    """The names a class defines itself (not its docstring, nor whether its step is inlined,
    which Scheduler works out for each subclass)."""
    return {name for name in vars(variant) if not name.startswith("__") and name != "_inline"}


@pytest.mark.parametrize(
    "slip",
    [*lab06.STEP_SLIPS, *lab09.SLIPS],
    ids=lambda slip: repr(slip.answer),
)
def test_every_slip_is_kvlabs_scheduler_with_one_hook_changed(slip):
    variant = slip.answer.variant
    assert isinstance(slip.answer, slipped) and issubclass(variant, Scheduler)
    slips = [_own(base) for base in variant.__mro__ if base is not Scheduler and _own(base)]
    # one decision, or two slips put together (the old order: admit first, no first token)
    assert 1 <= len(slips) <= 2 and all(len(names) == 1 for names in slips), slips
    hooks = set().union(*slips)
    assert all(hasattr(Scheduler, hook) for hook in hooks), hooks  # a hook of kvlab's, no new one


def test_a_slip_runs_on_the_given_schedulers_state():
    """``slipped(variant)`` steps the scheduler it is given: what the variant's step changed,
    the scheduler holds (one state), and the scheduler stays kvlab's."""
    day = DAYS[3]
    via_slip = serve(day, schedule=lab06.slipped_step)
    assert via_slip == serve(day)  # kvlab's engine, its own step
    with pytest.raises(TypeError, match="variant must be a subclass of Scheduler"):
        slipped(object)
