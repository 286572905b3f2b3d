"""``HotelFloorPlan``: the KV cache as a hotel, animated from a recorded trace (anywidget)."""

from __future__ import annotations

import math
import pathlib

import anywidget
import ipywidgets as widgets
import traitlets

from kvlab.core.trace import Trace
from kvlab.core.validate import positive_int
from kvlab.ui.widgets.frames import align, check_trace, display_group, encode, key_step
from kvlab.ui.widgets.palette import shared_guest_colors
from kvlab.ui.widgets.svg import frame_svg, player_svg

HERE = pathlib.Path(__file__).parent


class HotelFloorPlan(anywidget.AnyWidget):
    """Floors of rooms (KV blocks) with guests (requests) in their colours, their key cards
    (block tables), a legend and per-step metrics. ``step`` (1-based) picks what it shows.

    ``schedule`` (trace frame indices, one per step; see :func:`~kvlab.ui.widgets.frames.align`)
    replaces ``steps_only`` and ``every`` when several hotels must play in step; ``colors``
    (guest -> colour) lets them share one colouring.
    """

    _esm = HERE / "hotel.js"
    _css = HERE / "hotel.css"
    data = traitlets.Dict().tag(sync=True)
    step = traitlets.Int(1).tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    rooms_per_floor = traitlets.Int(32).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)

    def __init__(
        self,
        trace: Trace,
        title: str = "",
        room_size: int | None = None,
        rooms_per_floor: int | None = None,
        step: int | None = None,
        steps_only: bool = False,
        every: int = 1,
        schedule: list[int] | None = None,
        colors: dict | None = None,
    ):
        data = encode(trace, room_size, steps_only, every, schedule, colors)
        if rooms_per_floor is None:
            rooms_per_floor = min(64, max(8, round(data["num_rooms"] ** 0.5 * 1.5)))
        positive_int("rooms_per_floor", rooms_per_floor)
        steps = len(data["schedule"])
        if step is not None and (
            isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= steps
        ):
            raise ValueError(f"step must be an int in 1..{steps}, got {step!r}")
        super().__init__(data=data, title=title, rooms_per_floor=rooms_per_floor)
        self.step = self.start_step = 1 if step is None else step
        # what the static SVG shows until someone moves the step: the step asked for, else the
        # first key event or the fullest moment (never an empty hotel at step 1)
        self.picture_step = key_step([data]) if step is None else step

    @traitlets.validate("step")
    def _valid_step(self, proposal):
        step = proposal["value"]
        steps = len(self.data.get("schedule", ())) if self.data else 0
        if steps and not 1 <= step <= steps:
            raise ValueError(f"step must be in 1..{steps}, got {step}")
        return step

    @property
    def num_steps(self) -> int:
        return len(self.data["schedule"])

    @property
    def num_frames(self) -> int:
        return len(self.data["frames"])

    def svg_step(self) -> int:
        """The step the static SVG shows: the current one once moved, else :attr:`picture_step`."""
        return self.step if self.step != self.start_step else self.picture_step

    def __repr__(self) -> str:
        return (
            f"HotelFloorPlan(kind={self.data['kind']!r}, rooms={self.data['num_rooms']}, "
            f"beds_per_room={self.data['beds_per_room']}, steps={self.num_steps}, step={self.step})"
        )

    def to_svg(self, step: int | None = None) -> str:
        """The floor plan at one step (1-based) as SVG text; needs no browser."""
        step = self.svg_step() if step is None else step
        if not 1 <= step <= self.num_steps:
            raise ValueError(f"step must be in 1..{self.num_steps}, got {step}")
        return frame_svg(self.data, step, self.rooms_per_floor, self.title)

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
        data = dict(data)
        data["text/plain"] = repr(self)
        data["image/svg+xml"] = self.to_svg()
        return data, metadata


# Play's pace when none is given: a whole animation plays in about PLAY_SECONDS (10-30 s tells a
# story; 2 s is a blur, 4 minutes nobody watches), skipping steps when frames would pass too fast.
PLAY_SECONDS = 20
FASTEST_MS, SLOWEST_MS = 50, 2000


def play_pace(num_steps: int) -> tuple[int, int]:
    """(interval_ms, step) so that ``num_steps`` steps play in 10-30 s when they can: one step
    at most every two seconds (time to read its caption), a frame at most every 50 ms, every
    k-th step for long traces."""
    positive_int("num_steps", num_steps)
    moves = max(1, num_steps - 1)
    interval = min(SLOWEST_MS, max(FASTEST_MS, round(PLAY_SECONDS * 1000 / moves)))
    stride = 1
    if moves * interval > 1.5 * PLAY_SECONDS * 1000:
        stride = math.ceil(moves * FASTEST_MS / (PLAY_SECONDS * 1000))
    return interval, stride


class HotelPlayer(widgets.VBox):
    """A Play button and a step slider (steps 1..n, linked in the browser) driving one or more
    floor plans; clicking a guest in one plan selects it in all of them.

    Several plans sit side by side while the notebook is wide enough, and stack when it is not.
    Play moves every ``play_step``-th step each ``interval_ms``; by default both are chosen from
    the number of steps (:func:`play_pace`), so every animation plays in about 20 s.
    """

    def __init__(
        self,
        hotels: list[HotelFloorPlan],
        interval_ms: int | None = None,
        play_step: int | None = None,
    ):
        if not hotels:
            raise ValueError("hotels must hold at least one HotelFloorPlan")
        steps = {h.num_steps for h in hotels}
        if len(steps) != 1:
            raise ValueError(
                f"hotels must play the same number of steps (align their traces), got {sorted(steps)}"
            )
        (n,) = steps
        interval, stride = play_pace(n)
        interval_ms = interval if interval_ms is None else positive_int("interval_ms", interval_ms)
        play_step = stride if play_step is None else positive_int("play_step", play_step)
        self.hotels = hotels
        start = hotels[0].step
        self.play = widgets.Play(
            value=start, min=1, max=n, interval=interval_ms, step=play_step, description="play"
        )
        self.slider = widgets.IntSlider(
            value=start,
            min=1,
            max=n,
            description="step",
            layout=widgets.Layout(flex="1 1 auto", max_width="640px"),
        )
        self._links = [widgets.jslink((self.play, "value"), (self.slider, "value"))]
        self._links += [widgets.jslink((self.slider, "value"), (h, "step")) for h in hotels]
        self._links += [
            widgets.jslink((hotels[0], "selected"), (h, "selected")) for h in hotels[1:]
        ]
        if len(hotels) == 1:
            views = hotels[0]
        else:
            for h in hotels:
                h.layout = widgets.Layout(flex="1 1 430px", min_width="300px")
            views = widgets.Box(
                hotels,
                layout=widgets.Layout(
                    display="flex", flex_flow="row wrap", align_items="flex-start"
                ),
            )
            views.add_class("kvh-compare")
        controls = widgets.HBox([self.play, self.slider], layout=widgets.Layout(width="100%"))
        super().__init__([controls, views])

    def svg_step(self) -> int:
        """The current step once moved, else the step worth a picture for all hotels together."""
        if self.slider.value != self.hotels[0].start_step:
            return self.slider.value
        if len(self.hotels) == 1:
            return self.hotels[0].picture_step
        return key_step([h.data for h in self.hotels])

    def to_svg(self, step: int | None = None) -> str:
        """Every hotel at one step (1-based), side by side, as SVG text."""
        step = self.svg_step() if step is None else step
        if not 1 <= step <= self.slider.max:
            raise ValueError(f"step must be in 1..{self.slider.max}, got {step}")
        return player_svg([(h.data, h.rooms_per_floor, h.title) for h in self.hotels], step)

    def __repr__(self) -> str:
        return f"HotelPlayer({', '.join(map(repr, self.hotels))})"

    def _repr_mimebundle_(self, **kwargs):
        data = dict(super()._repr_mimebundle_(**kwargs))
        data["text/plain"] = repr(self)
        data["image/svg+xml"] = self.to_svg()
        return data


def animate(
    trace: Trace,
    title: str = "",
    interval_ms: int | None = None,
    play_step: int | None = None,
    **options,
) -> HotelPlayer:
    """A playable floor plan of a trace: ``animate(manager.trace)`` as a cell's last line.

    ``options`` go to :class:`HotelFloorPlan` (``room_size``, ``rooms_per_floor``, ``step``,
    ``every``, ``steps_only``). Play's pace (``interval_ms``, ``play_step``) is chosen so the
    whole trace plays in about 20 s unless given.
    """
    return HotelPlayer([HotelFloorPlan(trace, title=title, **options)], interval_ms, play_step)


def compare(
    traces: dict[str, Trace],
    interval_ms: int | None = None,
    steps_only: bool = True,
    every: int = 1,
    play_step: int | None = None,
    **options,
) -> HotelPlayer:
    """Several traces side by side, driven by one Play button until the longest one ends (the
    others hold their last frame); it plays in about 20 s unless ``interval_ms`` /
    ``play_step`` say otherwise.

    By default only the per-step frames of each replay are kept, lined up by time, so the views
    show the same moment; ``every`` keeps every n-th of those steps (and each trace's last).
    A guest has one colour in every view.
    """
    if not isinstance(traces, dict) or not traces:
        raise ValueError("traces must be a dict naming at least one trace")
    for name, trace in traces.items():
        check_trace(trace, f"traces[{name!r}]")
    schedules = align(list(traces.values()), every, steps_only)
    groups = [display_group(t, options.get("room_size")) for t in traces.values()]
    colors = shared_guest_colors(list(zip(traces.values(), groups, strict=True)))
    hotels = [
        HotelFloorPlan(trace, title=name, schedule=schedule, colors=colors, **options)
        for (name, trace), schedule in zip(traces.items(), schedules, strict=True)
    ]
    return HotelPlayer(hotels, interval_ms, play_step)
