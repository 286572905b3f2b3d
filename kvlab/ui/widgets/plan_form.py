"""Lab 08's form: pick a model, GPUs, a workload, a context and a price; the planner's summary, table
and pictures follow at once.

The outputs are an HTML widget and a PNG image widget (nothing is printed, so nothing leaks into
the notebook's text output), and the form also renders as static HTML: where no widget can run
(GitHub, nbviewer, nbval) the plan of the form's starting values is shown instead.
"""

from __future__ import annotations

import base64
import html
import io

import ipywidgets as widgets

from kvlab.models import PRESETS
from kvlab.perf.gpus import CATALOGUE
from kvlab.perf.planner import WORKLOADS as NAMED_WORKLOADS
from kvlab.perf.planner import in_words, plan

CONTEXTS = (2048, 4096, 8192, 32768)
WORKLOADS = tuple((words, name) for name, (_, words) in NAMED_WORKLOADS.items())
# the planner's argument names as the form labels them, for its messages
LABELS = {
    "num_gpus": "GPUs",
    "gpu_memory_utilization": "the share of memory used",
    "max_seq_len": "context",
    "price_per_gpu_hour": "$ per GPU-hour",
    "target_tokens_per_s": "target tokens/s",
    "max_num_seqs": "max requests at once",
    "weights_bytes": "weights",
    "overhead_bytes": "overhead",
}


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _contexts(model: str) -> list[int]:
    """The context choices a model supports (its own limit when it is shorter than all of them)."""
    limit = PRESETS[model].max_context
    fits = [c for c in CONTEXTS if limit is None or c <= limit]
    return fits or [limit]


STYLE = {"description_width": "110px"}


def _choice(description: str, options, value) -> widgets.Dropdown:
    return widgets.Dropdown(
        options=options,
        value=value,
        description=description,
        style=STYLE,
        layout=widgets.Layout(width="330px"),
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
        layout=widgets.Layout(width="330px"),
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
    ):
        if model not in PRESETS:
            raise ValueError(f"model must be one of {', '.join(PRESETS)}, got {model!r}")
        if gpu not in CATALOGUE:
            raise ValueError(f"gpu must be one of {', '.join(CATALOGUE)}, got {gpu!r}")
        contexts = _contexts(model)
        self.model = _choice("model", list(PRESETS), model)
        self.gpu = _choice("GPU", list(CATALOGUE), gpu)
        self.num_gpus = _choice("GPUs", [1, 2, 4, 8], num_gpus)
        self.workload = _choice("workload", WORKLOADS, workload)
        context = max_seq_len if max_seq_len in contexts else contexts[-1]
        self.max_seq_len = _choice("context (tokens)", contexts, context)
        price = CATALOGUE[gpu].price_per_hour or 0.0
        self.price = _number(widgets.BoundedFloatText, "$ per GPU-hour", price, 1000.0, 0.1)
        self.target = _number(
            widgets.BoundedFloatText, "target tokens/s", target_tokens_per_s, 1e9, 1000.0
        )
        self.max_num_seqs = _number(
            widgets.BoundedIntText, "max at once (0: no cap)", max_num_seqs, 1_000_000, 64
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
        """The form's current plan as HTML with its picture inlined (no widget needed)."""
        if self.plan is None:
            return self.summary.value
        picture = base64.b64encode(self.picture.value).decode("ascii")
        return f'{self.summary_html()}<img src="data:image/png;base64,{picture}"/>'

    def __repr__(self) -> str:
        return (
            f"PlanForm(model={self.model.value!r}, gpu={self.gpu.value!r}, "
            f"num_gpus={self.num_gpus.value}, workload={self.workload.value!r}, "
            f"max_seq_len={self.max_seq_len.value}, price={self.price.value:g}, "
            f"target={self.target.value:g}, max_num_seqs={self.max_num_seqs.value})"
        )

    def _repr_mimebundle_(self, **kwargs):
        data = dict(super()._repr_mimebundle_(**kwargs))
        data["text/plain"] = repr(self)
        data["text/html"] = self.static_html()
        return data
