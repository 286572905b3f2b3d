"""Lab 08's pieces without a browser: the planner form's callbacks re-plan and redraw, bad set-ups
say why instead of raising, the static rendering carries the plan; the brief's text, picture and
files; the plan plot."""

import matplotlib
import pytest

matplotlib.use("Agg")

from kvlab.perf.gpus import CATALOGUE  # noqa: E402
from kvlab.perf.planner import plan  # noqa: E402
from kvlab.ui.brief import brief_figure, brief_markdown, write_brief  # noqa: E402
from kvlab.ui.widgets import PlanForm  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def form():
    return PlanForm(target_tokens_per_s=20_000)


def test_the_form_starts_with_a_plan(form):
    assert form.plan is not None and form.error is None
    assert form.plan.setup.startswith("Llama-3-8B on H100-80GB")
    assert "Paged (vLLM): about" in form.summary.value and "<table" in form.summary.value
    assert bytes(form.picture.value).startswith(PNG)
    assert form.price.value == CATALOGUE["H100-80GB"].price_per_hour


def test_each_control_re_plans(form):
    before = form.summary.value
    form.gpu.value = "H200-141GB"  # the price follows the GPU, then one new plan
    assert form.price.value == CATALOGUE["H200-141GB"].price_per_hour
    assert form.plan.gpu.name == "H200-141GB" and form.summary.value != before
    form.price.value = 10.0
    assert form.plan.price_per_gpu_hour == 10.0 and "$10.00 per GPU-hour" in form.summary.value
    form.workload.value = "alpaca"
    assert "Alpaca-like" in form.plan.setup
    form.target.value = 0.0
    assert form.plan.target_tokens_per_s is None and form.plan.paged.gpus_needed is None
    picture = bytes(form.picture.value)
    form.max_seq_len.value = 2048
    assert form.plan.max_seq_len == 2048 and bytes(form.picture.value) != picture
    form.max_num_seqs.value = 64
    assert form.plan.max_num_seqs == 64 and form.plan.paged.concurrency == 64
    form.max_num_seqs.value = 0
    assert form.plan.max_num_seqs is None


def test_a_set_up_that_cannot_run_says_why_and_recovers():
    form = PlanForm(model="Llama-3-70B", gpu="L4-24GB")
    assert form.plan is None and "No plan:" in form.summary.value
    assert "raise GPUs" in form.error and "num_gpus" not in form.error
    assert bytes(form.picture.value) == b""
    form.gpu.value, form.num_gpus.value = "H200-141GB", 8
    assert form.plan is not None and form.plan.num_gpus == 8


def test_contexts_follow_the_model():
    form = PlanForm(max_seq_len=8192)
    form.model.value = "OPT-13B"  # trained for 2,048 tokens
    assert form.max_seq_len.options == (2048,) and form.plan.max_seq_len == 2048
    form.model.value = "Mistral-7B"
    assert 32768 in form.max_seq_len.options and form.max_seq_len.value == 2048


def test_the_static_rendering_shows_the_plan(form):
    bundle = form._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == repr(form) and "0x" not in bundle["text/plain"]
    assert "<table" in bundle["text/html"] and "data:image/png;base64," in bundle["text/html"]


def test_bad_starting_values_name_the_argument():
    with pytest.raises(ValueError, match="model must be one of"):
        PlanForm(model="GPT-9")
    with pytest.raises(ValueError, match="gpu must be one of"):
        PlanForm(gpu="TPU")


@pytest.fixture(scope="module")
def plans():
    return {
        "An 8B model on one H100": plan("Llama-3-8B", "H100-80GB", target_tokens_per_s=20_000),
        "A 70B model on 8 H200s": plan("Llama-3-70B", "H200-141GB", num_gpus=8, max_seq_len=8192),
    }


def test_the_brief_tells_the_story_and_gives_each_plan(plans):
    text = brief_markdown(plans)
    assert text.startswith("# KV-cache memory: the leader's brief")
    assert "What it does not buy" in text and "20–38%" in text
    assert text.index("**Bottom line**") < text.index("**The hotel.**")
    assert "about 15× as many requests at once" in text
    assert (
        "- A 70B model on 8 H200s: more requests, not more tokens per second: the GPUs' arithmetic"
        in text
    )
    for name, p in plans.items():
        assert f"### {name}" in text and p._verdict() in text
        assert f"| vLLM (paged) | {p.paged.concurrency:,.0f} | 99% |" in text
        assert "| cache |" not in text  # no internal names in a leader's table
    assert "H100-80GB $2.90" in text  # the prices are shown as assumptions
    with pytest.raises(ValueError, match="at least one"):
        brief_markdown({})
    with pytest.raises(TypeError, match=r"plans\['x'\] must be a kvlab.perf.planner.Plan"):
        brief_markdown({"x": 1})


def test_the_brief_is_written_as_markdown_and_png(plans, tmp_path):
    md, png = write_brief(plans, tmp_path / "out")
    assert md.read_text().startswith("# KV-cache memory") and "leader_brief.png" in md.read_text()
    assert png.read_bytes().startswith(PNG)
    fig = brief_figure(plans)
    assert len(fig.axes) == 4
    bars = [p.get_height() for p in fig.axes[0].patches]
    assert bars == [r["concurrency"] for r in plans["An 8B model on one H100"].table()]


def test_the_brief_says_why_a_set_up_gains_nothing():
    capped = plan("Llama-3-8B", "H100-80GB", max_num_seqs=32, gpu_memory_utilization=0.95)
    text = brief_markdown({"Capped": capped})
    assert "Where memory is the limit" not in text
    assert "Capped: more requests, not more tokens per second: the cap of 32 requests" in text
    assert "95% of GPU memory used" in text and "Prices per GPU-hour are assumptions" in text
    free = plan("Llama-3-8B", "H100-80GB", price_per_gpu_hour=0.0)
    assert "H100-80GB $0.00" in brief_markdown({"Free": free})  # a price of 0 is a price
