"""The hotel floor plan widget (anywidget) and its static SVG fallback."""

from kvlab.widgets.floorplan import HotelFloorPlan, HotelPlayer, animate, compare

__all__ = ["HotelFloorPlan", "HotelPlayer", "animate", "compare"]
