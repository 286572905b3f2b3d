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
    form.max_num_seqs.value = 0  # 0: vLLM's default for the GPU (an H200 here: 1,024)
    assert form.plan.max_num_seqs == 1024 and form.plan.max_num_seqs_source == "vllm-default"
    form.min_tokens_per_user.value = 60.0
    assert form.plan.min_tokens_per_user == 60 and form.plan.tokens_per_user >= 60
    form.min_tokens_per_user.value = 0.0
    assert form.plan.min_tokens_per_user is None


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
    with pytest.raises(ValueError, match=r"num_gpus must be one of 1, 2, 4, 8 .*got 3"):
        PlanForm(num_gpus=3)
    with pytest.raises(ValueError, match="max_seq_len must be at most OPT-13B's context of 2,048"):
        PlanForm(model="OPT-13B", max_seq_len=5000)
    with pytest.raises(ValueError, match="workload must be one of sharegpt, alpaca"):
        PlanForm(workload="wiki")
    with pytest.raises(ValueError, match="target_tokens_per_s must be a number from 0 to 1,000,"):
        PlanForm(target_tokens_per_s=1e300)
    with pytest.raises(ValueError, match="max_num_seqs must be an int from 0"):
        PlanForm(max_num_seqs=-1)


def test_starting_values_are_kept_and_take_the_planners_names():
    form = PlanForm(gpu="h100", model="llama-3-8b", max_seq_len=5000)
    assert form.gpu.value == "H100-80GB" and form.model.value == "Llama-3-8B"
    assert form.max_seq_len.value == 5000 and form.plan.max_seq_len == 5000  # not rounded up
    assert 5000 in form.max_seq_len.options


def test_an_html_export_without_widgets_still_shows_the_plan(form):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    with capture_output() as shown:
        form._ipython_display_()
    static, view = (o.data for o in shown.outputs)
    # first the page, with the plan and its picture, marked and hidden where widgets render
    assert set(static) == {"text/html", "text/plain"}
    assert (
        '<div class="kvlab-static-plan">' in static["text/html"] and "<table" in static["text/html"]
    )
    assert "data:image/png;base64," in static["text/html"] and ".widget-vbox" in static["text/html"]
    assert 'class="mathjax_ignore tex2jax_ignore"' in static["text/html"]  # prices are not math
    # then the widget, with no second copy of the page
    assert "application/vnd.jupyter.widget-view+json" in view and "text/html" not in view


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
    bottom = text[: text.index("**The hotel.**")]
    # against the best contiguous booking first (1.0x where vLLM's cap of 1,024 binds both,
    # 1.9x on the H100), then against max-length booking (3x and 15x)
    assert "Paging fits 1.0–1.9× as many requests at once as the best contiguous booking" in bottom
    assert bottom.index("best contiguous booking") < bottom.index("3–15× as many as booking")
    assert "vLLM, SGLang, TensorRT-LLM and TGI all page already" in bottom
    assert "max_num_seqs" in bottom and "prefix caching" in bottom
    assert "What is left to decide" in text
    assert (
        "- A 70B model on 8 H200s: more requests, not more tokens per second: the GPUs' arithmetic"
        in text
    )
    for name, p in plans.items():
        assert f"### {name}" in text and p._verdict() in text
        assert f"| vLLM (paged) | {p.paged.concurrency:,.0f} | " in text
        assert p.vllm_command() in text
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


def test_the_brief_goes_where_the_notebook_runs(monkeypatch, tmp_path):
    from kvlab.ui.brief import brief_directory

    shell, kernel = tmp_path / "shell", tmp_path / "kernel"
    shell.mkdir(), kernel.mkdir()
    monkeypatch.chdir(kernel)  # a headless runner starts the kernel beside the source notebook
    monkeypatch.setenv("PWD", str(shell))
    monkeypatch.delenv("KVLAB_BRIEF_DIR", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert brief_directory() == shell / "leader_brief"  # where the command was run
    monkeypatch.setenv("JPY_SESSION_NAME", str(kernel / "08.ipynb"))
    assert brief_directory() == kernel / "leader_brief"  # JupyterLab: beside the notebook
    monkeypatch.setenv("KVLAB_BRIEF_DIR", str(tmp_path / "out"))
    assert brief_directory() == tmp_path / "out"
