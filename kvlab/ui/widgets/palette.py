"""The course's colours, in one place: the hotel widget, its SVG and the matplotlib pictures all
read them, so a colour means the same thing everywhere.

Guests get colours per trace: two guests whose bookings ever sit next to each other in the floor
plan never share a colour (same-coloured neighbours would look like one booking and hide the gap
between them, which is what Lab 02 is about).
"""

from __future__ import annotations

import colorsys

from kvlab.core.trace import Trace, intervals

COLORS = {
    "used": "#2e7d32",  # beds with guests: token states (plots of shares; floor plans use the guest's colour)
    "future": "#f9a825",  # booked beds a guest will use later
    "internal": "#c62828",  # booked beds nobody will ever use
    "free": "#b0bec5",  # free share in plots of shares
    "vacant": "#ffffff",  # a free bed in a floor plan
    "edge": "#d0d7de",  # room borders in a floor plan
    "shared": "#000000",  # outline of a room on several key cards
    "cached": "#26c6da",  # stripes of a free room still holding a past guest's tokens (prefix caching)
    "accent": "#1565c0",
}

# The words the legends use, shared by the widget, the SVG and the plots.
WASTE_LABELS = {
    "used": "used: beds holding tokens",
    "future": "reserved for future tokens",
    "internal": "internal fragmentation: booked, never used",
    "free": "free",
}
LEGEND = {
    "used": "tokens (the guest's colour)",
    "future": "reserved for future tokens",
    # a cache that is not told how long answers get counts every empty booked bed as future
    "future_unknown": "empty, for future tokens (answer lengths unknown)",
    "internal": "booked, never used",
    "free": "free",
    "shared": "shared room (on several key cards)",
    "cached": "cached (striped): free, kept for a guest with the same prefix",
}

# Guests' colours: no red, orange or yellow, so amber (future) and red (internal) stay unambiguous,
# and never striped like cached rooms (whose stripes are cyan).
# Next entries differ in hue and lightness: neighbours usually take next entries.
GUEST_PALETTE = (
    "#1f77b4",  # blue
    "#98df8a",  # light green
    "#9467bd",  # purple
    "#17becf",  # cyan
    "#8c564b",  # brown
    "#aec7e8",  # light blue
    "#2ca02c",  # green
    "#e377c2",  # pink
    "#393b79",  # navy
    "#c5b0d5",  # lavender
    "#637939",  # olive
    "#7f7f7f",  # grey
    "#00838f",  # teal
    "#f7b6d2",  # light pink
)
GOLDEN = 0.6180339887498949


def extra_color(k: int) -> str:
    """The k-th colour beyond the palette, for a guest whose neighbours took all of it: hues from
    green through blue to magenta only (never amber or red), spread by the golden ratio."""
    hue = (90 + 240 * ((k + 1) * GOLDEN % 1)) / 360
    lightness = (0.34, 0.45, 0.56)[k % 3]
    r, g, b = colorsys.hls_to_rgb(hue, lightness, 0.6)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def neighbours(trace: Trace, group: int = 1, near: dict | None = None) -> dict:
    """Guest -> the guests whose bookings came within ``2 * group - 2`` trace rooms of theirs in
    some frame: close enough to be drawn in adjacent rooms when ``group`` trace rooms make one
    drawn room (touching bookings when ``group`` is 1). Adds to ``near`` when given."""
    reach = 2 * group - 2
    near = {} if near is None else near
    previous = None
    for frame in trace.frames:
        if frame.tables == previous:  # a decode step that took no new room
            continue
        previous = frame.tables
        runs = sorted(
            (start, start + length, guest)
            for guest, table in frame.tables.items()
            for start, length in intervals(table)
        )
        for i, (_, end, guest) in enumerate(runs):
            near.setdefault(guest, set())
            for start, _, other in runs[i + 1 :]:
                if start - end > reach:
                    break
                if other != guest:
                    near[guest].add(other)
                    near.setdefault(other, set()).add(guest)
    return near


def guest_colors(trace: Trace, group: int = 1) -> dict:
    """Guest -> colour, stable for the whole trace; guests drawn next to each other differ."""
    return shared_guest_colors([(trace, group)])


def shared_guest_colors(hotels: list[tuple[Trace, int]]) -> dict:
    """One colour per guest across several ``(trace, group)`` hotels shown together, so a guest
    looks the same in each; in none of them do neighbours share a colour.

    Greedy in order of first appearance; each guest prefers a different starting colour, so the
    palette is spread over the hotel instead of piling onto its first entries.
    """
    near: dict = {}
    for trace, group in hotels:
        neighbours(trace, group, near)
    order = dict.fromkeys(g for trace, _ in hotels for frame in trace.frames for g in frame.tables)
    colors: dict = {}
    n = len(GUEST_PALETTE)
    for position, guest in enumerate(order):
        taken = {colors[other] for other in near.get(guest, ()) if other in colors}
        choices = (GUEST_PALETTE[(position + j) % n] for j in range(n))
        color = next((c for c in choices if c not in taken), None)
        k = 0
        while color is None:
            color = extra_color(k) if extra_color(k) not in taken else None
            k += 1
        colors[guest] = color
    return colors
