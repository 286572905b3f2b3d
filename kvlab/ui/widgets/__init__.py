"""The hotel floor plan widget (anywidget) and its static SVG fallback.

The widget classes load on first use, so the plots can share :mod:`kvlab.ui.widgets.palette`
without importing anywidget and ipywidgets.
"""

__all__ = ["HotelFloorPlan", "HotelPlayer", "PlanForm", "animate", "compare"]


def __getattr__(name: str):
    if name == "PlanForm":
        from kvlab.ui.widgets.plan_form import PlanForm

        return PlanForm
    if name in __all__:
        from kvlab.ui.widgets import floorplan

        return getattr(floorplan, name)
    raise AttributeError(f"module 'kvlab.ui.widgets' has no attribute {name!r}")
