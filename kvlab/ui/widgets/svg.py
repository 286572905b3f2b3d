"""A deterministic SVG of one player step: the static fallback that GitHub, nbviewer and nbval see.

Same colours and words as the widget: a room fills from the bottom with the guest's tokens, then
amber beds reserved for future tokens, then red beds never used; a thin strip in the guest's
colour along the top says whose room it is; shared rooms are outlined in black; cached rooms
(free, still holding a past guest's tokens) are striped in cyan.
"""

from __future__ import annotations

from html import escape

from kvlab.ui.widgets.frames import cached_rooms, frame_at, room_states

CELL, GAP, LABEL, TOP = 12, 1, 28, 46
CHAR = 4.8  # rough width of one 9-px sans-serif character, to lay out captions and the legend
HOTEL_WIDTH = 470  # each hotel's width when several are drawn side by side


CACHED_FILL = "url(#kvh-cached)"


def _stripes(data: dict) -> str:
    """The striped fill of cached rooms (one id for every hotel: they all draw it alike)."""
    color = data["palette"]["cached"]
    return (
        '<defs><pattern id="kvh-cached" width="4" height="4" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="4" height="4" fill="#ffffff"/>'
        f'<rect width="2" height="4" fill="{color}"/></pattern></defs>'
    )


def _caption(data: dict, step: int) -> tuple[str, str]:
    frame = data["frames"][frame_at(data, step)]
    m = frame["metrics"]
    who = "" if frame["guest"] is None else f" {frame['guest']}"
    note = f" ({frame['note']})" if frame["note"] else ""
    event = "decode step" if frame["event"] == "step" else frame["event"]
    clock = f" · t = {frame['time']:.2f} s" if data.get("timed", True) else ""
    first = f"step {step}/{len(data['schedule'])}{clock} · {event}{who}{note}"
    second = (
        f"{m['guests']} guest{'' if m['guests'] == 1 else 's'} · rooms used {m['rooms_used']}/{data['num_rooms']} · "
        f"{m['percent_used']}% of beds hold tokens"
    )
    if m["largest_free_run"] is not None:
        second += f" · largest free extent {m['largest_free_run']:,} beds"
    if "rooms_cached" in m:
        n = m["rooms_cached"]
        second += f" · {n} room{'' if n == 1 else 's'} cached"
    return first, second


def _legend(
    data: dict, states: list, cached: bool, width: float, y: float
) -> tuple[list[str], float]:
    """Swatches in the widget's words, wrapped to ``width``; returns the parts and the height.
    The tokens swatch shows colours of guests in the picture."""
    guests = [s.guest for s in states if s.guest >= 0]
    colors = list(dict.fromkeys(data["colors"][g] for g in guests))[:3] or [
        data["palette"]["vacant"]
    ]
    items = [("used", colors)]
    if data.get("has_future", True):
        items.append(("future", [data["palette"]["future"]]))
    if data.get("has_internal", True):
        items.append(("internal", [data["palette"]["internal"]]))
    items.append(("free", [data["palette"]["vacant"]]))
    if cached:
        items.append(("cached", [CACHED_FILL]))
    if any(s.refs > 1 for s in states):
        items.append(("shared", [data["palette"]["vacant"]]))
    parts, x, line = [], 2.0, 0
    for kind, swatch in items:
        label = data["legend"][kind]
        need = 10 * len(swatch) + 4 + CHAR * len(label) + 10
        if x > 2 and x + need > width:
            x, line = 2.0, line + 1
        top = y + 12 * line
        for k, color in enumerate(swatch):
            stroke = data["palette"]["shared"] if kind == "shared" else data["palette"]["edge"]
            parts.append(
                f'<rect x="{x + 10 * k:g}" y="{top:g}" width="9" height="9" fill="{color}" '
                f'stroke="{stroke}"/>'
            )
        x += 10 * len(swatch) + 3
        parts.append(f'<text x="{x:g}" y="{top + 8:g}" font-size="9">{escape(label)}</text>')
        x += CHAR * len(label) + 10
    return parts, 12 * (line + 1)


def _room(x: float, y: float, cell: float, size: int, state, data: dict, cached: bool) -> list[str]:
    palette = data["palette"]
    box = f'x="{x:g}" y="{y:g}" width="{cell:g}" height="{cell:g}"'
    if state.guest < 0:
        fill = CACHED_FILL if cached else palette["vacant"]
        return [f'<rect {box} fill="{fill}" stroke="{palette["edge"]}"/>']
    color = data["colors"][state.guest]
    full = state.used + state.future + state.internal == size
    parts = [] if full else [f'<rect {box} fill="{palette["vacant"]}"/>']
    bottom = y + cell
    for beds, fill in (
        (state.used, color),
        (state.future, palette["future"]),
        (state.internal, palette["internal"]),
    ):
        h = round(cell * beds / size, 2)
        if h:
            parts.append(
                f'<rect x="{x:g}" y="{bottom - h:g}" width="{cell:g}" height="{h:g}" fill="{fill}"/>'
            )
            bottom -= h
    if state.used < size:  # whose room, even when no bed holds a token yet
        strip = 2 if cell >= 8 else 1
        parts.append(
            f'<rect x="{x:g}" y="{y:g}" width="{cell:g}" height="{strip}" fill="{color}"/>'
        )
    if state.refs > 1:
        parts.append(
            f'<rect {box} fill="none" stroke="{palette["shared"]}" stroke-width="1.5"/>'
            f'<text x="{x + cell - 1:g}" y="{y + min(cell, 9) - 1:g}" font-size="{min(cell, 9) - 1:g}" '
            f'text-anchor="end" font-weight="bold" fill="#ffffff" stroke="#000000" '
            f'stroke-width="0.8" paint-order="stroke">{state.refs}</text>'
        )
    return parts


def hotel_svg(
    data: dict, step: int, rooms_per_floor: int, title: str = "", cell: float = CELL
) -> tuple[list[str], float, float]:
    """One hotel at player step ``step`` (1-based): its SVG elements, width and height."""
    index = frame_at(data, step)
    states = room_states(data, index)
    cached = {room for room in cached_rooms(data, index) if states[room].guest < 0}
    size = data["beds_per_room"]
    floors = -(-data["num_rooms"] // rooms_per_floor)
    first, second = _caption(data, step)
    pitch = cell + GAP
    width = LABEL + rooms_per_floor * pitch
    width = max(width, CHAR * max(len(first), len(second)))
    parts = [_stripes(data)] if cached else []
    parts += [
        f'<text x="2" y="12" font-size="11" font-weight="bold">{escape(title or "hotel floor plan")}</text>',
        f'<text x="2" y="26" font-size="9">{escape(first)}</text>',
        f'<text x="2" y="38" font-size="9">{escape(second)}</text>',
    ]
    for floor in range(floors):
        y = TOP + floor * pitch
        parts.append(
            f'<text x="{LABEL - 4}" y="{y + min(cell, 9):g}" font-size="8" text-anchor="end">{floor}</text>'
        )
    for room, state in enumerate(states):
        floor, col = divmod(room, rooms_per_floor)
        x, y = LABEL + col * pitch, TOP + floor * pitch
        parts += _room(x, y, cell, size, state, data, room in cached)
    legend, legend_height = _legend(data, states, bool(cached), width, TOP + floors * pitch + 6)
    return parts + legend, width, TOP + floors * pitch + 8 + legend_height


def _svg(parts: list[str], width: float, height: float) -> str:
    width, height = round(width), round(height)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">'
    )
    return "\n".join([head, *parts, "</svg>"])


def frame_svg(data: dict, step: int, rooms_per_floor: int, title: str = "") -> str:
    """One hotel at player step ``step`` (1-based) as SVG text."""
    parts, width, height = hotel_svg(data, step, rooms_per_floor, title)
    return _svg(parts, width, height)


def player_svg(hotels: list[tuple[dict, int, str]], step: int) -> str:
    """Hotels ``(data, rooms_per_floor, title)`` side by side at one player step, as SVG text;
    several hotels shrink their rooms to about :data:`HOTEL_WIDTH` pixels each."""
    if len(hotels) == 1:
        data, per_floor, title = hotels[0]
        return frame_svg(data, step, per_floor, title)
    parts, x, height = [], 0.0, 0.0
    for data, per_floor, title in hotels:
        cell = max(3, min(CELL, (HOTEL_WIDTH - LABEL) // per_floor - GAP))
        inner, width, h = hotel_svg(data, step, per_floor, title, cell)
        parts += [f'<g transform="translate({x:g},0)">', *inner, "</g>"]
        x, height = x + width + 24, max(height, h)
    return _svg(parts, x - 24, height)
