// The hotel floor plan: rooms = KV blocks, guests = requests, key cards = block tables.
// Self-contained ES module for anywidget: no imports, no network.

function roomStates(data, step, selected) {
  // Per room: owner guest (-1 free), beds holding tokens, key cards holding it, logical index,
  // and whether the selected guest's key card lists it. Same arithmetic as frames.room_states.
  const n = data.num_rooms;
  const size = data.beds_per_room;
  const owner = new Int32Array(n).fill(-1);
  const used = new Int32Array(n);
  const refs = new Int32Array(n);
  const logicalOf = new Int32Array(n).fill(-1);
  const picked = new Uint8Array(n);
  for (const [guest, runs, offset, tokens] of data.frames[step].cards) {
    let logical = 0;
    for (let r = 0; r < runs.length; r += 2) {
      for (let room = runs[r]; room < runs[r] + runs[r + 1]; room++) {
        // beds [offset, offset + tokens) of the guest's drawn rooms hold tokens
        const lo = logical * size;
        const beds = Math.max(0, Math.min(lo + size, offset + tokens) - Math.max(lo, offset));
        if (guest === selected) picked[room] = 1;
        if (owner[room] === -1) {
          owner[room] = guest;
          logicalOf[room] = logical;
        }
        used[room] = Math.max(used[room], beds);
        refs[room] += 1;
        logical += 1;
      }
    }
  }
  return { owner, used, refs, logicalOf, picked };
}

function cardText(runs, limit) {
  const rooms = [];
  for (let r = 0; r < runs.length && rooms.length <= limit; r += 2) {
    for (let room = runs[r]; room < runs[r] + runs[r + 1] && rooms.length <= limit; room++) {
      rooms.push(room);
    }
  }
  const total = runs.reduce((sum, v, i) => (i % 2 ? sum + v : sum), 0);
  return rooms.slice(0, limit).join(", ") + (total > limit ? `, … (${total} rooms)` : "");
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "kvh";
  const title = document.createElement("div");
  title.className = "kvh-title";
  const metrics = document.createElement("div");
  metrics.className = "kvh-metrics";
  const body = document.createElement("div");
  body.className = "kvh-body";
  const plan = document.createElement("div");
  plan.className = "kvh-plan";
  const cards = document.createElement("div");
  cards.className = "kvh-cards";
  const tip = document.createElement("div");
  tip.className = "kvh-tip";
  body.append(plan, cards);
  root.append(title, metrics, body, tip);
  el.appendChild(root);

  let data = null;
  let rooms = [];
  let state = null;
  let shown = null; // what each room shows now, to touch only rooms that change

  function build() {
    data = model.get("data");
    const perFloor = model.get("rooms_per_floor");
    plan.innerHTML = "";
    plan.style.gridTemplateColumns = `3.2em repeat(${perFloor}, 1fr)`;
    const small = data.num_rooms <= 256;
    root.classList.toggle("kvh-small", small);
    rooms = [];
    for (let room = 0; room < data.num_rooms; room++) {
      if (room % perFloor === 0) {
        const label = document.createElement("div");
        label.className = "kvh-floor";
        label.textContent = `${room / perFloor}`;
        label.title = `floor ${room / perFloor}: rooms ${room}–${Math.min(room + perFloor, data.num_rooms) - 1}`;
        plan.appendChild(label);
      }
      const cell = document.createElement("div");
      cell.className = "kvh-room";
      cell.dataset.room = room;
      const fill = document.createElement("div");
      fill.className = "kvh-fill";
      const badge = document.createElement("span");
      badge.className = "kvh-badge";
      cell.append(fill, badge);
      if (small) {
        const number = document.createElement("span");
        number.className = "kvh-number";
        number.textContent = room;
        cell.appendChild(number);
      }
      plan.appendChild(cell);
      rooms.push({ cell, fill, badge });
    }
    shown = new Array(data.num_rooms).fill("");
    title.textContent = model.get("title");
    root.dataset.rooms = data.num_rooms;
    draw();
  }

  function draw() {
    const started = performance.now();
    const step = Math.min(model.get("step"), data.frames.length - 1);
    const frame = data.frames[step];
    const selected = model.get("selected");
    const selectedIndex = data.guests.indexOf(selected);
    state = roomStates(data, step, selectedIndex);
    const size = data.beds_per_room;
    for (let room = 0; room < data.num_rooms; room++) {
      const owner = state.owner[room];
      const key = `${owner}|${state.used[room]}|${state.refs[room]}|${selectedIndex}|${state.picked[room]}`;
      if (shown[room] === key) continue;
      shown[room] = key;
      const { cell, fill, badge } = rooms[room];
      if (owner === -1) {
        cell.className = "kvh-room kvh-free";
        cell.style.backgroundColor = "";
        fill.style.height = "0";
        badge.textContent = "";
        continue;
      }
      const color = data.colors[owner];
      cell.className = "kvh-room kvh-booked";
      if (state.refs[room] > 1) cell.classList.add("kvh-shared");
      if (selectedIndex >= 0) cell.classList.add(state.picked[room] ? "kvh-picked" : "kvh-dim");
      cell.style.backgroundColor = color + "40";
      fill.style.backgroundColor = color;
      fill.style.height = `${(100 * state.used[room]) / size}%`;
      badge.textContent = state.refs[room] > 1 ? `${state.refs[room]}` : "";
    }
    const m = frame.metrics;
    const who = frame.guest === null ? "" : ` ${frame.guest}`;
    const note = frame.note ? ` (${frame.note})` : "";
    metrics.innerHTML = "";
    const items = [
      ["step", `${step + 1} / ${data.frames.length}`],
      ["t", `${frame.time.toFixed(2)} s`],
      ["event", `${frame.event}${who}${note}`],
      ["rooms used", `${m.rooms_used} / ${data.num_rooms}`],
      ["beds used", `${m.beds_used.toLocaleString()} / ${data.capacity.toLocaleString()}`],
      ["utilization", `${(100 * m.utilization).toFixed(1)}%`],
      ["largest free run", `${m.largest_free_run.toLocaleString()} beds`],
    ];
    for (const [label, value] of items) {
      const item = document.createElement("span");
      item.className = "kvh-metric";
      item.dataset.metric = label;
      if (label === "event") item.classList.add(`kvh-event-${frame.event.replace(/ /g, "-")}`);
      item.innerHTML = `<b>${label}</b> `;
      item.append(value);
      metrics.appendChild(item);
    }
    cards.innerHTML = "";
    const header = document.createElement("div");
    header.className = "kvh-cards-title";
    header.textContent = `key cards (${frame.cards.length} guests)`;
    cards.appendChild(header);
    for (const [guest, runs] of frame.cards) {
      const row = document.createElement("div");
      row.className = "kvh-card";
      if (guest === selectedIndex) row.classList.add("kvh-card-picked");
      row.dataset.guest = data.guests[guest];
      const chip = document.createElement("span");
      chip.className = "kvh-chip";
      chip.style.backgroundColor = data.colors[guest];
      const name = document.createElement("b");
      name.textContent = data.guests[guest];
      row.append(chip, name, ` → ${cardText(runs, 12)}`);
      cards.appendChild(row);
    }
    void plan.offsetHeight; // force style and layout, so the timing covers them
    const elapsed = performance.now() - started;
    root.dataset.step = step;
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
    const room = Number(cell.dataset.room);
    const owner = state.owner[room];
    tip.textContent =
      owner < 0
        ? `room ${room}: free`
        : `room ${room}: ${data.guests[owner]}, logical block ${state.logicalOf[room]}, ` +
          `${state.used[room]}/${data.beds_per_room} beds used` +
          (state.refs[room] > 1 ? `, on ${state.refs[room]} key cards` : "");
    tip.style.visibility = "visible";
  });
  plan.addEventListener("mouseleave", () => {
    tip.style.visibility = "hidden";
  });
  plan.addEventListener("mouseout", (event) => {
    if (!event.relatedTarget || !event.relatedTarget.closest(".kvh-room")) tip.style.visibility = "hidden";
  });

  model.on("change:step", draw);
  model.on("change:selected", draw);
  model.on("change:data", build);
  model.on("change:rooms_per_floor", build);
  build();
  return () => {
    model.off("change:step", draw);
    model.off("change:selected", draw);
    model.off("change:data", build);
    model.off("change:rooms_per_floor", build);
  };
}

export default { render };
