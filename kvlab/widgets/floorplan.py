"""``HotelFloorPlan``: the KV cache as a hotel, animated from a recorded trace (anywidget)."""

from __future__ import annotations

import pathlib

import anywidget
import ipywidgets as widgets
import traitlets

from kvlab.trace import Trace
from kvlab.widgets.frames import encode
from kvlab.widgets.svg import frame_svg

HERE = pathlib.Path(__file__).parent


class HotelFloorPlan(anywidget.AnyWidget):
    """Floors of rooms (KV blocks) with guests (requests) in their colours, their key cards
    (block tables), and per-frame metrics. Step through frames by setting ``step``."""

    _esm = HERE / "hotel.js"
    _css = HERE / "hotel.css"
    data = traitlets.Dict().tag(sync=True)
    step = traitlets.Int(0).tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    rooms_per_floor = traitlets.Int(32).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)

    def __init__(
        self,
        trace: Trace,
        title: str = "",
        room_size: int | None = None,
        rooms_per_floor: int | None = None,
        step: int = 0,
        steps_only: bool = False,
        every: int = 1,
    ):
        data = encode(trace, room_size, steps_only, every)
        if rooms_per_floor is None:
            rooms_per_floor = min(64, max(8, round(data["num_rooms"] ** 0.5 * 1.5)))
        if rooms_per_floor < 1:
            raise ValueError(f"rooms_per_floor must be >= 1, got {rooms_per_floor}")
        super().__init__(data=data, title=title, rooms_per_floor=rooms_per_floor)
        self.step = step

    @traitlets.validate("step")
    def _valid_step(self, proposal):
        step = proposal["value"]
        frames = len(self.data.get("frames", ())) if self.data else 0
        if frames and not 0 <= step < frames:
            raise ValueError(f"step must be in 0..{frames - 1}, got {step}")
        return step

    @property
    def num_frames(self) -> int:
        return len(self.data["frames"])

    def __repr__(self) -> str:
        return (
            f"HotelFloorPlan(kind={self.data['kind']!r}, rooms={self.data['num_rooms']}, "
            f"beds_per_room={self.data['beds_per_room']}, frames={self.num_frames}, step={self.step})"
        )

    def to_svg(self, step: int | None = None) -> str:
        """The floor plan of one frame as SVG text; needs no browser."""
        step = self.step if step is None else step
        if not 0 <= step < self.num_frames:
            raise ValueError(f"step must be in 0..{self.num_frames - 1}, got {step}")
        return frame_svg(self.data, step, self.rooms_per_floor, self.title)

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
        data = dict(data)
        data["text/plain"] = repr(self)
        data["image/svg+xml"] = self.to_svg()
        return data, metadata


class HotelPlayer(widgets.VBox):
    """A Play button and a step slider linked in the browser to one or more floor plans."""

    def __init__(self, hotels: list[HotelFloorPlan], interval_ms: int = 200):
        frames = min(h.num_frames for h in hotels)
        self.hotels = hotels
        self.play = widgets.Play(
            value=0, min=0, max=frames - 1, interval=interval_ms, description="play"
        )
        self.slider = widgets.IntSlider(value=0, min=0, max=frames - 1, description="step")
        self._links = [widgets.jslink((self.play, "value"), (self.slider, "value"))]
        self._links += [widgets.jslink((self.slider, "value"), (h, "step")) for h in hotels]
        views = hotels[0] if len(hotels) == 1 else widgets.HBox(hotels)
        super().__init__([widgets.HBox([self.play, self.slider]), views])

    def __repr__(self) -> str:
        return f"HotelPlayer({', '.join(map(repr, self.hotels))})"

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        data = dict(data)
        data["text/plain"] = repr(self)
        data["image/svg+xml"] = self.hotels[0].to_svg()
        return data


def animate(trace: Trace, title: str = "", interval_ms: int = 200, **options) -> HotelPlayer:
    """A playable floor plan of a trace: ``animate(manager.trace)`` as a cell's last line.

    ``options`` go to :class:`HotelFloorPlan` (``room_size``, ``rooms_per_floor``, ``step``).
    """
    return HotelPlayer([HotelFloorPlan(trace, title=title, **options)], interval_ms)


def compare(
    traces: dict[str, Trace], interval_ms: int = 200, steps_only: bool = True, **options
) -> HotelPlayer:
    """Several traces side by side, driven by one Play button (up to the shortest trace).

    By default only the per-step frames of each replay are kept, so the views stay in step.
    """
    if not traces:
        raise ValueError("traces must name at least one trace")
    hotels = [
        HotelFloorPlan(t, title=name, steps_only=steps_only, **options)
        for name, t in traces.items()
    ]
    return HotelPlayer(hotels, interval_ms)
