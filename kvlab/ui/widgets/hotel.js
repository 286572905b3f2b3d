// The hotel floor plan: rooms = KV blocks, guests = requests, key cards = block tables.
// Self-contained ES module for anywidget: no imports, no network. Colours and legend words come
// from Python (kvlab.widgets.palette), so the widget, its SVG and the plots agree.

// Cached rooms are striped, so no guest's colour can be mistaken for them.
function stripes(color) {
  return `repeating-linear-gradient(135deg, ${color} 0 2px, #ffffff 2px 4px)`;
}

function frameAt(data, step) {
  // player steps are 1-based; a hotel past its schedule holds its last frame
  const k = Math.min(Math.max(step, 1), data.schedule.length);
  return data.schedule[k - 1];
}

function roomStates(data, frameIndex, selected) {
  // Per room: owner guest (-1 free), beds used / reserved for future / never used, key cards
  // holding it, logical index, whether the selected guest holds it, and for a cached room the
  // guest who left it and its place in the free queue.
  // Same arithmetic as frames.room_states and frames.cached_rooms.
  const n = data.num_rooms;
  const size = data.beds_per_room;
  const owner = new Int32Array(n).fill(-1);
  const used = new Int32Array(n);
  const will = new Int32Array(n);
  const booked = new Int32Array(n);
  const refs = new Int32Array(n);
  const logicalOf = new Int32Array(n).fill(-1);
  const picked = new Uint8Array(n);
  const cachedBy = new Int32Array(n).fill(-2); // -2: not cached; -1: cached before the recording
  const queued = new Int32Array(n); // cached rooms ahead of it in the free queue
  const cached = data.frames[frameIndex].cached || [];
  let ahead = 0;
  for (let r = 0; r < cached.length; r += 3) {
    // runs [start, length, guest]: a negative length runs downwards
    const [start, length, guest] = [cached[r], cached[r + 1], cached[r + 2]];
    const direction = length > 0 ? 1 : -1;
    for (let k = 0; k < Math.abs(length); k++) {
      const room = start + direction * k;
      if (cachedBy[room] === -2) {
        cachedBy[room] = guest;
        queued[room] = ahead++;
      }
    }
  }
  const overlap = (lo, end, offset) => Math.max(0, Math.min(lo + size, offset + end) - Math.max(lo, offset));
  for (const [guest, runs, offset, u, f, i] of data.frames[frameIndex].cards) {
    let logical = 0;
    for (let r = 0; r < runs.length; r += 2) {
      for (let room = runs[r]; room < runs[r] + runs[r + 1]; room++) {
        const lo = logical * size;
        if (guest === selected) picked[room] = 1;
        if (owner[room] === -1) {
          owner[room] = guest;
          logicalOf[room] = logical;
        }
        used[room] = Math.max(used[room], overlap(lo, u, offset));
        will[room] = Math.max(will[room], overlap(lo, u + f, offset));
        booked[room] = Math.max(booked[room], overlap(lo, u + f + i, offset));
        refs[room] += 1;
        logical += 1;
      }
    }
  }
  return { owner, used, will, booked, refs, logicalOf, picked, cachedBy, queued };
}

function blockTableText(runs) {
  // "642–689, 700, 702–705": ranges of consecutive rooms in key-card order (frames.block_table_text)
  const parts = [];
  for (let r = 0; r < runs.length; r += 2) {
    parts.push(runs[r + 1] === 1 ? `${runs[r]}` : `${runs[r]}–${runs[r] + runs[r + 1] - 1}`);
  }
  return parts.join(", ");
}

function roomCount(runs) {
  let total = 0;
  for (let r = 1; r < runs.length; r += 2) total += runs[r];
  return total;
}

function plural(n, word) {
  return `${n.toLocaleString()} ${word}${n === 1 ? "" : "s"}`;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function legend(data) {
  // the same categories and colours as the matplotlib floor plans
  const box = element("div", "kvh-legend");
  const chip = (color, extra) => {
    const c = element("span", "kvh-chip" + (extra ? ` ${extra}` : ""));
    c.style.background = color;
    return c;
  };
  const item = (kind, chips) => {
    const node = element("span", "kvh-legend-item");
    node.dataset.kind = kind;
    node.append(...chips, data.legend[kind]);
    box.appendChild(node);
  };
  const colors = [...new Set(data.colors)].slice(0, 3);
  item("used", (colors.length ? colors : [data.palette.vacant]).map((c) => chip(c)));
  if (data.has_future !== false) item("future", [chip(data.palette.future)]);
  if (data.has_internal !== false) item("internal", [chip(data.palette.internal)]);
  item("free", [chip(data.palette.vacant, "kvh-chip-free")]);
  if (data.has_cached) item("cached", [chip(stripes(data.palette.cached), "kvh-chip-free")]);
  if (data.has_shared) item("shared", [chip(data.palette.vacant, "kvh-chip-shared")]);
  return box;
}

function render({ model, el }) {
  const root = element("div", "kvh");
  const title = element("div", "kvh-title");
  const metrics = element("div", "kvh-metrics");
  const body = element("div", "kvh-body");
  const plan = element("div", "kvh-plan");
  const cards = element("div", "kvh-cards");
  const tip = element("div", "kvh-tip");
  let legendBox = element("div");
  body.append(plan, cards);
  root.append(title, metrics, legendBox, body, tip);
  el.appendChild(root);

  let data = null;
  let rooms = [];
  let state = null;
  let shown = null; // what each room shows now, to touch only rooms that change
  let finished = 1; // the first step showing the hotel's last frame

  function build() {
    data = model.get("data");
    const perFloor = model.get("rooms_per_floor");
    plan.innerHTML = "";
    plan.style.gridTemplateColumns = `2.4em repeat(${perFloor}, minmax(0, 1fr))`;
    const small = data.num_rooms <= 96;
    root.classList.toggle("kvh-small", small);
    root.classList.toggle("kvh-paged", data.paged);
    rooms = [];
    for (let room = 0; room < data.num_rooms; room++) {
      if (room % perFloor === 0) {
        const label = element("div", "kvh-floor", `${room / perFloor}`);
        label.title = `floor ${room / perFloor}: rooms ${room}–${Math.min(room + perFloor, data.num_rooms) - 1}`;
        plan.appendChild(label);
      }
      const cell = element("div", "kvh-room");
      cell.dataset.room = room;
      const badge = element("span", "kvh-badge");
      cell.appendChild(badge);
      if (small) cell.appendChild(element("span", "kvh-number", `${room}`));
      plan.appendChild(cell);
      rooms.push({ cell, badge });
    }
    shown = new Array(data.num_rooms).fill("");
    const last = data.schedule[data.schedule.length - 1];
    finished = data.schedule.indexOf(last) + 1;
    title.textContent = model.get("title");
    const fresh = legend(data);
    legendBox.replaceWith(fresh);
    legendBox = fresh;
    root.dataset.rooms = data.num_rooms;
    root.dataset.steps = data.schedule.length;
    draw();
  }

  function paintRoom(room, selectedIndex, present) {
    const owner = state.owner[room];
    const cached = owner === -1 && state.cachedBy[room] !== -2;
    const key = `${owner}|${state.used[room]}|${state.will[room]}|${state.booked[room]}|${state.refs[room]}|${present ? selectedIndex : -1}|${state.picked[room]}|${cached}`;
    if (shown[room] === key) return;
    shown[room] = key;
    const { cell, badge } = rooms[room];
    if (owner === -1) {
      cell.className = cached ? "kvh-room kvh-cached" : "kvh-room kvh-free";
      cell.style.background = cached ? stripes(data.palette.cached) : "";
      cell.style.boxShadow = "";
      badge.textContent = "";
      if (present) cell.classList.add("kvh-dim");
      return;
    }
    const size = data.beds_per_room;
    const color = data.colors[owner];
    const p = data.palette;
    const [a, b, c] = [state.used[room], state.will[room], state.booked[room]].map((v) => (100 * v) / size);
    // from the bottom: the guest's tokens, beds reserved for future tokens, beds never used, free
    cell.style.background =
      `linear-gradient(to top, ${color} 0 ${a}%, ${p.future} ${a}% ${b}%, ` +
      `${p.internal} ${b}% ${c}%, ${p.vacant} ${c}% 100%)`;
    cell.style.boxShadow = `inset 0 3px 0 ${color}`; // whose room, even when no bed holds a token yet
    cell.className = "kvh-room kvh-booked";
    if (state.refs[room] > 1) cell.classList.add("kvh-shared");
    if (present) cell.classList.add(state.picked[room] ? "kvh-picked" : "kvh-dim");
    badge.textContent = state.refs[room] > 1 ? `${state.refs[room]}` : "";
  }

  function header(step, frame) {
    const m = frame.metrics;
    const steps = data.schedule.length;
    const held = step > finished && steps > 1;
    const who = frame.guest === null ? "" : ` ${frame.guest}`;
    const note = frame.note ? ` (${frame.note})` : "";
    const event = frame.event === "step" ? "decode step" : frame.event;
    const items = [
      ["step", `${step} / ${steps}` + (held ? ` (finished at step ${finished}: last frame held)` : "")],
      ...(data.timed === false ? [] : [["t", `${frame.time.toFixed(2)} s`]]),
      ["event", `${event}${who}${note}`],
      ["guests", `${m.guests}`],
      ["rooms used", `${m.rooms_used} / ${data.num_rooms}` + (m.rooms_shared ? ` (${m.rooms_shared} shared)` : "")],
      ["beds holding tokens", `${m.beds_used.toLocaleString()} / ${data.capacity.toLocaleString()} (${m.percent_used}%)`],
    ];
    if (m.largest_free_run !== null) items.push(["largest free extent", `${m.largest_free_run.toLocaleString()} beds`]);
    if (data.has_cached) items.push(["rooms cached", `${m.rooms_cached}`]);
    metrics.innerHTML = "";
    for (const [label, value] of items) {
      const item = element("span", "kvh-metric");
      item.dataset.metric = label;
      if (label === "event") item.classList.add(`kvh-event-${frame.event.replace(/ /g, "-")}`);
      item.append(element("b", "", label), ` ${value}`);
      metrics.appendChild(item);
    }
    root.dataset.held = held ? "1" : "0";
  }

  function keyCards(frame, selectedIndex) {
    cards.innerHTML = "";
    const what = data.paged ? "key cards" : "bookings";
    cards.appendChild(element("div", "kvh-cards-title", `${what} (${plural(frame.cards.length, "guest")})`));
    for (const [guest, runs] of frame.cards) {
      const row = element("div", "kvh-card");
      if (guest === selectedIndex) row.classList.add("kvh-card-picked");
      row.dataset.guest = data.guests[guest];
      const chip = element("span", "kvh-chip");
      chip.style.backgroundColor = data.colors[guest];
      const count = roomCount(runs);
      const rooms = count ? `${count === 1 ? "room" : "rooms"} ${blockTableText(runs)}` : "no room drawn";
      row.append(chip, element("b", "", data.guests[guest]), ` → ${rooms}`);
      cards.appendChild(row);
    }
  }

  function draw() {
    const started = performance.now();
    const step = Math.min(Math.max(model.get("step"), 1), data.schedule.length);
    const frameIndex = frameAt(data, step);
    const frame = data.frames[frameIndex];
    const selectedIndex = data.guests.indexOf(model.get("selected"));
    const present = selectedIndex >= 0 && frame.cards.some((card) => card[0] === selectedIndex);
    state = roomStates(data, frameIndex, selectedIndex);
    for (let room = 0; room < data.num_rooms; room++) paintRoom(room, selectedIndex, present);
    header(step, frame);
    keyCards(frame, selectedIndex);
    if (selectedIndex >= 0 && !present) {
      tip.textContent = `${data.guests[selectedIndex]} is not in this hotel at this step`;
      tip.style.visibility = "visible";
    } else if (tip.dataset.kind === "absent") {
      tip.style.visibility = "hidden";
    }
    tip.dataset.kind = selectedIndex >= 0 && !present ? "absent" : "";
    void plan.offsetHeight; // force style and layout, so the timing covers them
    const elapsed = performance.now() - started;
    root.dataset.step = step;
    root.dataset.frame = frameIndex;
    root.dataset.guests = frame.cards.length;
    root.dataset.lastRenderMs = elapsed.toFixed(2);
    root.dataset.draws = Number(root.dataset.draws || 0) + 1;
    if (root.dataset.draws > 1) {
      root.dataset.maxStepMs = Math.max(Number(root.dataset.maxStepMs || 0), elapsed).toFixed(2);
    }
  }

  function pick(guest) {
    model.set("selected", model.get("selected") === guest ? "" : guest);
    model.save_changes();
  }

  function describe(room) {
    const owner = state.owner[room];
    const size = data.beds_per_room;
    const where = data.paged || size === 1 ? `room ${room}` : `room ${room} (beds ${(room * size).toLocaleString()}–${((room + 1) * size - 1).toLocaleString()})`;
    if (owner < 0 && state.cachedBy[room] !== -2) return describeCached(room, where);
    if (owner < 0) return `${where}: free`;
    const used = state.used[room];
    const future = state.will[room] - used;
    const never = state.booked[room] - state.will[room];
    const whose = data.paged ? `${data.guests[owner]}, logical block ${state.logicalOf[room]}` : `${data.guests[owner]}'s booking`;
    let text = `${where}: ${whose}; ${used}/${size} beds hold tokens`;
    if (future) text += `, ${future} reserved for future tokens`;
    if (never) text += `, ${never} never used`;
    if (state.refs[room] > 1) text += `; shared: on ${state.refs[room]} key cards`;
    return text;
  }

  function describeCached(room, where) {
    const by = state.cachedBy[room];
    const beds = plural(data.beds_per_room, "token");
    const kept = by >= 0 ? `${data.guests[by]}'s ${beds}` : `${beds} from before the recording`;
    const ahead = state.queued[room];
    const when = ahead === 0 ? "next to be overwritten" : `overwritten after ${plural(ahead, "other cached room")}`;
    return `${where}: cached: free, but still holds ${kept}; a guest with the same prefix can move in without recomputing them; ${when} when a room is needed`;
  }

  cards.addEventListener("click", (event) => {
    const row = event.target.closest(".kvh-card");
    if (row) pick(row.dataset.guest);
  });
  plan.addEventListener("click", (event) => {
    const cell = event.target.closest(".kvh-room");
    if (cell && state && state.owner[cell.dataset.room] >= 0) {
      pick(data.guests[state.owner[cell.dataset.room]]);
    }
  });
  plan.addEventListener("mouseover", (event) => {
    const cell = event.target.closest(".kvh-room");
    if (!cell || !state) return;
    tip.textContent = describe(Number(cell.dataset.room));
    tip.dataset.kind = "room";
    tip.style.visibility = "visible";
  });
  plan.addEventListener("mouseout", (event) => {
    if (!event.relatedTarget || !event.relatedTarget.closest(".kvh-room")) {
      tip.style.visibility = "hidden";
    }
  });

  model.on("change:step", draw);
  model.on("change:selected", draw);
  model.on("change:data", build);
  model.on("change:rooms_per_floor", build);
  model.on("change:title", build);
  build();
  return () => {
    model.off("change:step", draw);
    model.off("change:selected", draw);
    model.off("change:data", build);
    model.off("change:rooms_per_floor", build);
    model.off("change:title", build);
  };
}

export default { render };
