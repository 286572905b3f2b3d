"""Lab 08's form: pick a model, GPUs, a workload, a context and a price; the planner's summary, table
and pictures follow at once.

The outputs are an HTML widget and a PNG image widget (nothing is printed, so nothing leaks into
the notebook's text output), and the form also renders as static HTML: where no widget can run
(GitHub, nbviewer, nbval) the plan of the form's starting values is shown instead.

Displayed in a notebook the form makes two outputs: first the static page (the plan as HTML, its
picture inlined), then the widget. An HTML export (``jupyter nbconvert --to html``) of an executed
notebook picks the widget's view whenever the widget state was saved, and that view needs
JavaScript from a CDN, so offline it is blank; the static page beside it still shows the plan. A
style in the static page hides it wherever the widget itself rendered (JupyterLab, Notebook 7, an
export whose widget script loaded), so a live notebook shows the form once. MathJax is kept off
the static page: JupyterLab and an export typeset HTML outputs, and the plan's prices
("$0.027–$0.054") would read as math.

Starting values are checked like the planner's arguments, with the same names (``gpu="h100"`` and
``model="llama-3-8b"`` as :func:`kvlab.perf.planner.plan` takes them); a bad one raises a
ValueError naming it and what was expected.
"""

from __future__ import annotations

import base64
import html
import io

import ipywidgets as widgets

from kvlab.models import PRESETS
from kvlab.perf import gpus as gpu_catalogue
from kvlab.perf.gpus import CATALOGUE
from kvlab.perf.planner import MAX_TARGET_TOKENS_PER_S, MAX_TOKENS_PER_USER, in_words, plan
from kvlab.perf.planner import WORKLOADS as NAMED_WORKLOADS

CONTEXTS = (2048, 4096, 8192, 32768)
GPU_COUNTS = (1, 2, 4, 8)
MAX_NUM_SEQS = 1_000_000  # the form's box
WORKLOADS = tuple((words, name) for name, (_, words) in NAMED_WORKLOADS.items())
# the planner's argument names as the form labels them, for its messages
LABELS = {
    "num_gpus": "GPUs",
    "gpu_memory_utilization": "the share of memory used",
    "max_seq_len": "context",
    "price_per_gpu_hour": "$ per GPU-hour",
    "target_tokens_per_s": "target tokens/s",
    "max_num_seqs": "max requests at once",
    "min_tokens_per_user": "min tokens/s per user",
    "weights_bytes": "weights",
    "overhead_bytes": "overhead",
}
# classes MathJax skips: version 3 (JupyterLab, Notebook 7), version 2 (nbconvert's templates)
NO_MATH = "mathjax_ignore tex2jax_ignore"
# hides the static page where the widget next to it rendered (see the module docstring)
HIDE_WHERE_WIDGETS_RUN = (
    "<style>.jp-OutputArea-child:has(.kvlab-static-plan):has(+ .jp-OutputArea-child "
    ".widget-vbox){display:none}</style>"
)


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _contexts(model: str, extra: int | None = None) -> list[int]:
    """The context choices a model supports (its own limit when it is shorter than all of them),
    with ``extra`` (a context the caller asked for) among them when the model supports it."""
    limit = PRESETS[model].max_context
    fits = [c for c in CONTEXTS if limit is None or c <= limit]
    if extra is not None and (limit is None or extra <= limit) and extra not in fits:
        fits = sorted([*fits, extra])
    return fits or [limit]


def _model_name(model) -> str:
    if isinstance(model, str):
        for name in PRESETS:
            if name.lower() == model.strip().lower():
                return name
    raise ValueError(f"model must be one of {', '.join(PRESETS)}, got {model!r}")


def _gpu_name(gpu) -> str:
    try:
        return gpu_catalogue.lookup(gpu).name
    except (TypeError, ValueError):
        raise ValueError(
            f"gpu must be one of {', '.join(CATALOGUE)} (or a spelling kvlab.perf.gpus.lookup "
            f"takes, e.g. 'h100'), got {gpu!r}"
        ) from None


def _choose(name: str, value, choices, what: str):
    if isinstance(value, bool) or value not in choices:
        raise ValueError(
            f"{name} must be one of {', '.join(map(str, choices))} ({what}), got {value!r}"
        )
    return value


def _bounded(name: str, value, most: float, what: str, *, integer: bool = False) -> float:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0 <= value <= most:
        kind = "an int" if integer else "a number"
        raise ValueError(f"{name} must be {kind} from 0 to {most:,.0f} ({what}), got {value!r}")
    return value


# a label gets 7 px a character, the longest ("max at once (0: vLLM's)") whole: at 110 px two were
# cut ("max at once (…", "min tokens/s e…")
LABEL_PX = 170
STYLE = {"description_width": f"{LABEL_PX}px"}


def _field() -> widgets.Layout:
    return widgets.Layout(width=f"{LABEL_PX + 220}px")


def _choice(description: str, options, value) -> widgets.Dropdown:
    return widgets.Dropdown(
        options=options,
        value=value,
        description=description,
        style=STYLE,
        layout=_field(),
    )


def _number(kind, description: str, value, most, step):
    """A number box from 0 to ``most`` (values outside are clamped by the widget)."""
    return kind(
        value=value,
        min=0,
        max=most,
        step=step,
        description=description,
        style=STYLE,
        layout=_field(),
    )


class PlanForm(widgets.VBox):
    """The planner as a form: every change re-plans and redraws (a fraction of a second)."""

    def __init__(
        self,
        model: str = "Llama-3-8B",
        gpu: str = "H100-80GB",
        num_gpus: int = 1,
        workload: str = "sharegpt",
        max_seq_len: int = 8192,
        target_tokens_per_s: float = 0.0,
        max_num_seqs: int = 0,
        min_tokens_per_user: float = 0.0,
    ):
        # every starting value checked before any widget exists: a bad one raises, naming it
        model, gpu = _model_name(model), _gpu_name(gpu)
        _choose("num_gpus", num_gpus, GPU_COUNTS, "GPUs per copy of the model")
        _choose("workload", workload, [name for _, name in WORKLOADS], "the kinds of request")
        contexts = _contexts(model)
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 2:
            raise ValueError(f"max_seq_len must be an int >= 2 (tokens), got {max_seq_len!r}")
        limit = PRESETS[model].max_context
        if limit is not None and max_seq_len > limit:
            raise ValueError(
                f"max_seq_len must be at most {model}'s context of {limit:,} tokens, got "
                f"{max_seq_len:,}"
            )
        _bounded(
            "target_tokens_per_s", target_tokens_per_s, MAX_TARGET_TOKENS_PER_S, "0: no target"
        )
        _bounded("max_num_seqs", max_num_seqs, MAX_NUM_SEQS, "0: vLLM's default", integer=True)
        _bounded("min_tokens_per_user", min_tokens_per_user, MAX_TOKENS_PER_USER, "0: none")
        contexts = _contexts(model, max_seq_len)  # a context asked for is kept, not rounded
        self.model = _choice("model", list(PRESETS), model)
        self.gpu = _choice("GPU", list(CATALOGUE), gpu)
        self.num_gpus = _choice("GPUs", list(GPU_COUNTS), num_gpus)
        self.workload = _choice("workload", WORKLOADS, workload)
        self.max_seq_len = _choice("context (tokens)", contexts, max_seq_len)
        price = CATALOGUE[gpu].price_per_hour or 0.0
        self.price = _number(widgets.BoundedFloatText, "$ per GPU-hour", price, 1000.0, 0.1)
        self.target = _number(
            widgets.BoundedFloatText,
            "target tokens/s",
            target_tokens_per_s,
            MAX_TARGET_TOKENS_PER_S,
            1000.0,
        )
        self.max_num_seqs = _number(
            widgets.BoundedIntText,
            "max at once (0: vLLM's)",
            max_num_seqs,
            MAX_NUM_SEQS,
            64,
        )
        self.min_tokens_per_user = _number(
            widgets.BoundedFloatText,
            "min tokens/s each",
            min_tokens_per_user,
            MAX_TOKENS_PER_USER,
            5.0,
        )
        self.summary = widgets.HTML()
        self.picture = widgets.Image(format="png", layout=widgets.Layout(max_width="760px"))
        self.plan = None
        self.error: str | None = None
        self._quiet = False
        self.model.observe(self._model_changed, "value")
        self.gpu.observe(self._gpu_changed, "value")
        left = [self.model, self.gpu, self.num_gpus, self.workload]
        right = [self.max_seq_len, self.price, self.target, self.max_num_seqs]
        right.append(self.min_tokens_per_user)
        for control in left[2:] + right:
            control.observe(self._changed, "value")
        controls = widgets.HBox([widgets.VBox(left), widgets.VBox(right)])
        super().__init__([controls, self.summary, self.picture])
        self.update()

    # --- callbacks: keep dependent choices in step, then re-plan once ---------------------------
    def _model_changed(self, change) -> None:
        contexts = _contexts(change["new"])
        keep = self.max_seq_len.value
        self._quiet = True
        self.max_seq_len.options = contexts
        self.max_seq_len.value = keep if keep in contexts else contexts[-1]
        self._quiet = False
        self.update()

    def _gpu_changed(self, change) -> None:
        self._quiet = True
        self.price.value = CATALOGUE[change["new"]].price_per_hour or 0.0
        self._quiet = False
        self.update()

    def _changed(self, change) -> None:
        if not self._quiet:
            self.update()

    # --- outputs ---------------------------------------------------------------------------------
    def update(self) -> None:
        """Plan the form's values; show the plan, or say plainly why there is none."""
        from kvlab.ui import viz

        try:
            self.plan = plan(
                self.model.value,
                self.gpu.value,
                num_gpus=self.num_gpus.value,
                workload=self.workload.value,
                max_seq_len=self.max_seq_len.value,
                price_per_gpu_hour=self.price.value,
                target_tokens_per_s=self.target.value or None,
                max_num_seqs=self.max_num_seqs.value or None,
                min_tokens_per_user=self.min_tokens_per_user.value or None,
            )
        except (ValueError, TypeError) as problem:
            self.plan, self.error = None, in_words(str(problem), LABELS)
            self.summary.value = (
                f'<p style="color:#c62828"><b>No plan:</b> {html.escape(self.error)}</p>'
            )
            self.picture.value = b""
            return
        self.error = None
        self.summary.value = self.summary_html()
        self.picture.value = _png(viz.plot_plan(self.plan))

    def summary_html(self) -> str:
        """The plan's summary and table as HTML (empty without a plan)."""
        if self.plan is None:
            return ""
        header, rows = self.plan._formatted_rows()
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
        )
        lines = "".join(f"<p>{html.escape(line)}</p>" for line in self.plan.summary.splitlines())
        return f'{lines}<table class="kvlab-plan"><tr>{head}</tr>{body}</table>'

    def static_html(self) -> str:
        """The form's current plan as HTML with its picture inlined (no widget needed), in a block
        MathJax leaves alone (its prices' dollar signs are not math)."""
        if self.plan is None:
            return f'<div class="{NO_MATH}">{self.summary.value}</div>'
        picture = base64.b64encode(self.picture.value).decode("ascii")
        page = f'{self.summary_html()}<img src="data:image/png;base64,{picture}"/>'
        return f'<div class="{NO_MATH}">{page}</div>'

    def __repr__(self) -> str:
        return (
            f"PlanForm(model={self.model.value!r}, gpu={self.gpu.value!r}, "
            f"num_gpus={self.num_gpus.value}, workload={self.workload.value!r}, "
            f"max_seq_len={self.max_seq_len.value}, price={self.price.value:g}, "
            f"target={self.target.value:g}, max_num_seqs={self.max_num_seqs.value}, "
            f"min_tokens_per_user={self.min_tokens_per_user.value:g})"
        )

    def _repr_mimebundle_(self, **kwargs):
        data = dict(super()._repr_mimebundle_(**kwargs))
        data["text/plain"] = repr(self)
        data["text/html"] = self.static_html()
        return data

    def static_page(self) -> str:
        """The static page shown beside the widget: :meth:`static_html` in a marked block, with
        the style that hides it where the widget rendered."""
        return f'{HIDE_WHERE_WIDGETS_RUN}<div class="kvlab-static-plan">{self.static_html()}</div>'

    def _ipython_display_(self) -> None:
        """Two outputs: the static page (what an HTML export without widgets shows), then the
        widget (its view and a text line, no second copy of the page)."""
        from IPython.display import display

        display(
            {"text/html": self.static_page(), "text/plain": f"{self!r}: its plan as a page"},
            raw=True,
        )
        view = dict(super()._repr_mimebundle_())
        view["text/plain"] = repr(self)
        display(view, raw=True)
