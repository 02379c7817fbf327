/// The console's static assets, built into the binary (plain HTML, CSS and JavaScript; no
/// build step, no third-party code). docs/console.md describes the pages.
enum ConsoleAssets {
    /// Escapes text for HTML.
    static func escape(_ text: String) -> String {
        var out = ""
        for c in text {
            switch c {
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "&": out += "&amp;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.append(c)
            }
        }
        return out
    }

    static func loginPage(error: String?) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><title>Tether console — sign in</title>
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <link rel="stylesheet" href="/console/app.css"></head>
        <body class="login">
        <form method="post" action="/console/login" class="login-box">
        <h1>Tether console</h1>
        <p>Enter the server's admin secret (<code>--admin-secret</code>).</p>
        \(error.map { "<p class=\"error\" id=\"login-error\">\(escape($0))</p>" } ?? "")
        <input type="password" name="secret" id="secret" autocomplete="current-password" placeholder="admin secret" autofocus required>
        <button type="submit" id="login">Sign in</button>
        </form>
        </body></html>
        """
    }

    static func appPage(csrfToken: String) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><title>Tether console</title>
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <meta name="csrf-token" content="\(escape(csrfToken))">
        <link rel="stylesheet" href="/console/app.css"></head>
        <body>
        <header>
          <strong>Tether console</strong>
          <nav>
            <a href="#overview" data-view="overview">Overview</a>
            <a href="#channels" data-view="channels">Channels</a>
            <a href="#clients" data-view="clients">Clients</a>
            <a href="#try" data-view="try">Try it</a>
          </nav>
          <span id="live" class="live">connecting…</span>
          <form method="post" action="/console/logout" class="logout"><input type="hidden" name="csrf" value="\(escape(csrfToken))"><button type="submit">Sign out</button></form>
        </header>
        <main>
        <section id="view-overview" class="view">
          <div class="cards">
            <div class="card"><span class="label">Long-poll clients</span><span class="value" id="ov-longpoll">–</span></div>
            <div class="card"><span class="label">WebSocket connections</span><span class="value" id="ov-websocket">–</span></div>
            <div class="card"><span class="label">Sessions kept</span><span class="value" id="ov-kept">–</span></div>
            <div class="card"><span class="label">Publishes / s</span><span class="value" id="ov-publishes">–</span></div>
            <div class="card"><span class="label">Deliveries / s</span><span class="value" id="ov-deliveries">–</span></div>
            <div class="card"><span class="label">p99 delivery</span><span class="value" id="ov-p99">–</span></div>
            <div class="card"><span class="label">Store size</span><span class="value" id="ov-store">–</span></div>
            <div class="card"><span class="label">Retention</span><span class="value small" id="ov-retention">–</span></div>
          </div>
          <div class="charts">
            <figure><figcaption>Publishes and deliveries per second (2 min)</figcaption><canvas id="chart-rate" width="560" height="160"></canvas></figure>
            <figure><figcaption>Connections: long-poll, WebSocket, kept</figcaption><canvas id="chart-conn" width="560" height="160"></canvas></figure>
            <figure><figcaption>p99 delivery latency (ms)</figcaption><canvas id="chart-p99" width="560" height="160"></canvas></figure>
          </div>
          <p class="muted" id="ov-totals"></p>
        </section>
        <section id="view-channels" class="view">
          <div class="toolbar"><input id="channel-search" placeholder="channel name or wildcard (chat.*)" value="*"></div>
          <table id="channels-table"><thead><tr><th>Keyset</th><th>Channel</th><th>Occupancy</th><th>Msgs / min</th><th>In memory</th><th>Last messages</th><th>Presence events</th></tr></thead><tbody></tbody></table>
          <p class="muted" id="channels-empty"></p>
        </section>
        <section id="view-clients" class="view">
          <div class="split">
            <div><table id="clients-table"><thead><tr><th>uuid</th><th>State</th><th>Transport</th><th>Address</th><th>Channels</th><th>Delivered</th></tr></thead><tbody></tbody></table>
            <p class="muted" id="clients-empty"></p></div>
            <div id="client-detail" class="detail"><p class="muted">Select a client to see its connections and timeline.</p></div>
          </div>
        </section>
        <section id="view-try" class="view">
          <div class="split">
            <div class="panel">
              <h2>Publish</h2>
              <label>Keyset <select id="try-keyset"></select></label>
              <label>Channel <input id="publish-channel" value="console-demo"></label>
              <label>Message (JSON) <textarea id="publish-message" rows="3">{"text":"hello from the console"}</textarea></label>
              <label>Auth key or token (optional) <input id="try-auth"></label>
              <button id="publish-button">Publish</button>
              <pre id="publish-result" class="result"></pre>
            </div>
            <div class="panel">
              <h2>Subscribe</h2>
              <label>Channel <input id="subscribe-channel" value="console-demo"></label>
              <button id="subscribe-button">Subscribe</button> <button id="unsubscribe-button">Stop</button>
              <p class="muted" id="subscribe-status">Not subscribed.</p>
              <ol id="try-received" class="received"></ol>
            </div>
          </div>
        </section>
        </main>
        <script src="/console/app.js"></script>
        </body></html>
        """
    }

    static let stylesheet = #"""
    :root { --bg:#f6f7f9; --fg:#1d2330; --muted:#6b7385; --line:#dde1e8; --accent:#2f6fde; --ok:#1f9d55; --bad:#d64545; --warn:#c98a00; }
    * { box-sizing: border-box; }
    body { margin:0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--fg); }
    header { display:flex; align-items:center; gap:24px; padding:10px 20px; background:#1d2330; color:#fff; }
    header nav a { color:#cfd6e4; text-decoration:none; margin-right:16px; padding:4px 0; }
    header nav a.active { color:#fff; border-bottom:2px solid #7aa7ff; }
    .live { margin-left:auto; font-size:12px; color:#cfd6e4; }
    .live.on::before { content:"●"; color:#4ade80; margin-right:4px; }
    .logout button { background:none; border:1px solid #556; color:#cfd6e4; border-radius:4px; padding:3px 8px; cursor:pointer; }
    main { padding:20px; }
    .view { display:none; } .view.active { display:block; }
    .cards { display:grid; grid-template-columns:repeat(4, minmax(150px, 1fr)); gap:12px; }
    .card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:12px 14px; display:flex; flex-direction:column; }
    .card .label { color:var(--muted); font-size:12px; } .card .value { font-size:24px; font-weight:600; } .card .value.small { font-size:14px; }
    .charts { display:grid; grid-template-columns:repeat(3, 1fr); gap:12px; margin-top:16px; }
    figure { margin:0; background:#fff; border:1px solid var(--line); border-radius:8px; padding:10px; }
    figcaption { font-size:12px; color:var(--muted); margin-bottom:6px; } canvas { width:100%; height:160px; }
    table { border-collapse:collapse; width:100%; background:#fff; border:1px solid var(--line); }
    th, td { text-align:left; padding:6px 10px; border-bottom:1px solid var(--line); vertical-align:top; }
    th { font-size:12px; color:var(--muted); font-weight:600; background:#fafbfc; }
    tr.selectable { cursor:pointer; } tr.selected { background:#eaf1ff; }
    .toolbar { margin-bottom:10px; } .toolbar input { width:360px; padding:6px 8px; border:1px solid var(--line); border-radius:4px; }
    .muted { color:var(--muted); }
    .msg { font-family: ui-monospace, monospace; font-size:12px; white-space:pre-wrap; word-break:break-all; }
    .split { display:grid; grid-template-columns: 1fr 1fr; gap:16px; }
    .detail, .panel { background:#fff; border:1px solid var(--line); border-radius:8px; padding:12px 16px; }
    .detail dl { display:grid; grid-template-columns: 140px 1fr; gap:4px 10px; margin:0 0 10px; } .detail dt { color:var(--muted); }
    .timeline { list-style:none; padding:0; margin:0; border-left:2px solid var(--line); }
    .timeline li { padding:3px 0 3px 12px; position:relative; }
    .timeline li::before { content:""; position:absolute; left:-6px; top:9px; width:10px; height:10px; border-radius:50%; background:var(--muted); }
    .timeline li.ev-connected::before, .timeline li.ev-session-opened::before { background:var(--ok); }
    .timeline li.ev-resumed::before, .timeline li.ev-catch-up::before { background:var(--accent); }
    .timeline li.ev-dropped::before, .timeline li.ev-expired::before, .timeline li.ev-kicked::before { background:var(--bad); }
    .timeline li.ev-access-denied::before, .timeline li.ev-rate-limited::before, .timeline li.ev-reconnect-attempt::before { background:var(--warn); }
    .timeline .when { color:var(--muted); font-size:12px; margin-right:8px; font-variant-numeric: tabular-nums; }
    .timeline .type { font-weight:600; margin-right:6px; }
    .state-on { color:var(--ok); font-weight:600; } .state-off { color:var(--bad); }
    label { display:block; margin:8px 0; font-size:12px; color:var(--muted); }
    label input, label select, label textarea { display:block; width:100%; margin-top:3px; padding:6px 8px; border:1px solid var(--line); border-radius:4px; font:inherit; color:var(--fg); }
    button { background:var(--accent); color:#fff; border:0; border-radius:4px; padding:6px 14px; cursor:pointer; font:inherit; }
    button.secondary { background:#e7ebf2; color:var(--fg); }
    .result { background:#f3f5f8; padding:8px; border-radius:4px; min-height:1.5em; }
    .received { font-family: ui-monospace, monospace; font-size:12px; }
    body.login { display:flex; align-items:center; justify-content:center; height:100vh; }
    .login-box { background:#fff; padding:28px; border:1px solid var(--line); border-radius:10px; width:340px; }
    .login-box input { width:100%; padding:8px; margin:8px 0 12px; border:1px solid var(--line); border-radius:4px; }
    .error { color:var(--bad); }
    """#

    static let script = #"""
    "use strict";
    (function () {
      const csrf = document.querySelector('meta[name="csrf-token"]').content;
      const $ = (s) => document.querySelector(s);
      const el = (tag, attrs, ...children) => {
        const e = document.createElement(tag);
        for (const [k, v] of Object.entries(attrs || {})) { if (k === "class") e.className = v; else e.setAttribute(k, v); }
        for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
        return e;
      };
      async function api(path, options) {
        const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
        if (opts.method && opts.method !== "GET") { opts.headers["X-CSRF-Token"] = csrf; opts.headers["Content-Type"] = "application/json"; }
        const response = await fetch("/admin/v1/" + path, opts);
        if (response.status === 401) { location.reload(); throw new Error("signed out"); }
        const body = await response.json();
        if (!response.ok) throw new Error(body.error || response.status);
        return body;
      }
      const time = (ms) => new Date(ms).toLocaleTimeString([], { hour12: false });
      const bytes = (n) => n > 1e9 ? (n / 1e9).toFixed(2) + " GB" : n > 1e6 ? (n / 1e6).toFixed(1) + " MB" : (n / 1e3).toFixed(0) + " kB";

      // Views (#overview, #channels, #clients/<uuid>, #try)
      let view = "overview", selectedClient = null;
      function route() {
        const [name, arg] = (location.hash.slice(1) || "overview").split("/");
        view = ["overview", "channels", "clients", "try"].includes(name) ? name : "overview";
        selectedClient = view === "clients" && arg ? decodeURIComponent(arg) : selectedClient;
        document.querySelectorAll(".view").forEach((v) => v.classList.toggle("active", v.id === "view-" + view));
        document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === view));
        refresh();
      }
      window.addEventListener("hashchange", route);

      // Overview
      function chart(canvas, series, colors, labels) {
        const ctx = canvas.getContext("2d"), w = canvas.width, h = canvas.height;
        ctx.clearRect(0, 0, w, h);
        const max = Math.max(1, ...series.flat().filter((v) => v != null));
        ctx.strokeStyle = "#e5e8ee"; ctx.fillStyle = "#6b7385"; ctx.font = "11px system-ui";
        for (let i = 0; i <= 2; i++) { const y = 8 + (h - 24) * i / 2; ctx.beginPath(); ctx.moveTo(34, y); ctx.lineTo(w, y); ctx.stroke();
          ctx.fillText(String(Math.round(max * (1 - i / 2) * 10) / 10), 0, y + 4); }
        series.forEach((points, i) => {
          ctx.strokeStyle = colors[i]; ctx.lineWidth = 2; ctx.beginPath();
          points.forEach((v, x) => { const px = 34 + (w - 36) * x / Math.max(1, points.length - 1), py = 8 + (h - 24) * (1 - (v || 0) / max);
            x ? ctx.lineTo(px, py) : ctx.moveTo(px, py); });
          ctx.stroke(); ctx.fillStyle = colors[i]; ctx.fillText(labels[i], 40 + i * 90, h - 2);
        });
      }
      function renderOverview(o) {
        $("#ov-longpoll").textContent = o.connections["long-poll"];
        $("#ov-websocket").textContent = o.connections["websocket"];
        $("#ov-kept").textContent = o.keptSessions;
        $("#ov-publishes").textContent = o.publishesPerSecond.toFixed(1);
        $("#ov-deliveries").textContent = o.deliveriesPerSecond.toFixed(1);
        $("#ov-p99").textContent = o.p99DeliveryMilliseconds == null ? "–" : "≤ " + o.p99DeliveryMilliseconds + " ms";
        $("#ov-store").textContent = bytes(o.storeBytes);
        $("#ov-retention").textContent = Object.entries(o.retentionHours).map(([k, h]) => k + ": " + h + " h").join(", ");
        $("#ov-totals").textContent = o.publishesTotal + " publishes and " + o.deliveriesTotal + " deliveries since start; " +
          o.clientsRecorded + " clients in the flight recorder; up " + o.uptimeSeconds + " s.";
        const s = o.series;
        chart($("#chart-rate"), [s.map((p) => p.publishes), s.map((p) => p.deliveries)], ["#2f6fde", "#1f9d55"], ["publishes", "deliveries"]);
        chart($("#chart-conn"), [s.map((p) => p.longPolls), s.map((p) => p.webSockets), s.map((p) => p.kept)], ["#2f6fde", "#1f9d55", "#c98a00"], ["long-poll", "websocket", "kept"]);
        chart($("#chart-p99"), [s.map((p) => p.p99)], ["#d64545"], ["p99 ms"]);
      }

      // Channels
      async function loadChannels() {
        const q = $("#channel-search").value.trim() || "*";
        const channels = await api("channels?q=" + encodeURIComponent(q));
        const body = $("#channels-table tbody"); body.replaceChildren();
        const list = (msgs) => el("div", {}, ...msgs.map((m) => el("div", { class: "msg" }, (m.publisher ? m.publisher + ": " : "") + m.payload)));
        for (const c of channels) {
          body.append(el("tr", { "data-channel": c.channel }, el("td", {}, c.subscribeKey), el("td", {}, c.channel), el("td", {}, c.occupancy),
            el("td", {}, c.messagesPerMinute), el("td", {}, c.heldInMemory), el("td", {}, list(c.lastMessages)), el("td", {}, list(c.presenceEvents))));
        }
        $("#channels-empty").textContent = channels.length ? "" : "No channel matches " + q + ".";
      }
      $("#channel-search").addEventListener("input", () => loadChannels().catch(() => {}));

      // Clients
      async function loadClients() {
        const clients = await api("clients");
        const body = $("#clients-table tbody"); body.replaceChildren();
        for (const c of clients) {
          const row = el("tr", { class: "selectable" + (c.uuid === selectedClient ? " selected" : ""), "data-uuid": c.uuid },
            el("td", {}, c.uuid), el("td", { class: c.connected ? "state-on" : "state-off" }, c.connected ? "connected" : "away"),
            el("td", {}, c.transport || "–"), el("td", {}, c.address || "–"), el("td", {}, c.channels.concat(c.groups).join(", ")), el("td", {}, c.delivered));
          row.addEventListener("click", () => { location.hash = "clients/" + encodeURIComponent(c.uuid); });
          body.append(row);
        }
        $("#clients-empty").textContent = clients.length ? "" : "No client has connected yet.";
        if (selectedClient) {
          const c = clients.find((x) => x.uuid === selectedClient);
          if (c) renderClient(c);
        }
      }
      function renderClient(c) {
        const d = $("#client-detail"); d.replaceChildren();
        d.append(el("h2", {}, c.uuid));
        const dl = el("dl", {});
        const row = (k, v) => dl.append(el("dt", {}, k), el("dd", {}, v));
        row("State", c.connected ? "connected" : "away"); row("Transport", c.transport || "–"); row("Remote address", c.address || "–");
        row("Connections", c.longPolls + " long-poll, " + c.webSockets + " WebSocket"); row("Session", c.session || "–");
        row("Channels", c.channels.concat(c.groups).join(", ") || "–"); row("Cursor", c.cursor);
        row("Ping RTT", c.pingMilliseconds == null ? "unknown" : c.pingMilliseconds + " ms"); row("Delivered", c.delivered);
        d.append(dl);
        const kick = el("button", { id: "kick-button" }, "Kick (close connections)");
        kick.addEventListener("click", () => api("clients/" + encodeURIComponent(c.uuid) + "/kick", { method: "POST", body: "{}" }).then(refresh));
        const end = el("button", { id: "end-session-button", class: "secondary" }, "End kept session");
        end.addEventListener("click", () => api("clients/" + encodeURIComponent(c.uuid) + "/end-session", { method: "POST", body: "{}" }).then(refresh));
        d.append(kick, " ", end, el("h3", {}, "Timeline"));
        const ol = el("ol", { class: "timeline", id: "timeline" });
        for (const e of c.timeline.slice().reverse()) {
          ol.append(el("li", { class: "ev-" + e.type, "data-type": e.type }, el("span", { class: "when" }, time(e.at)), el("span", { class: "type" }, e.type), e.detail));
        }
        d.append(ol);
      }

      // Try it
      let keysets = [], subscription = null;
      async function loadKeysets() {
        keysets = await api("keysets");
        const select = $("#try-keyset"); select.replaceChildren();
        for (const k of keysets) select.append(el("option", { value: k.subscribeKey }, (k.name || k.subscribeKey) + (k.accessManager ? " (access manager)" : "")));
      }
      $("#publish-button").addEventListener("click", async () => {
        const out = $("#publish-result");
        try {
          const r = await api("publish", { method: "POST", body: JSON.stringify({ subscribeKey: $("#try-keyset").value, channel: $("#publish-channel").value,
            message: $("#publish-message").value, auth: $("#try-auth").value || undefined }) });
          out.textContent = "Sent, timetoken " + r.timetoken;
        } catch (e) { out.textContent = "Refused: " + e.message; }
      });
      async function subscribeLoop(token) {
        const key = keysets.find((k) => k.subscribeKey === $("#try-keyset").value) || keysets[0];
        const channel = $("#subscribe-channel").value, auth = $("#try-auth").value;
        let tt = "0";
        $("#subscribe-status").textContent = "Subscribed to " + channel + " (long-poll, uuid tether-console-viewer).";
        while (subscription === token) {
          const url = "/v2/subscribe/" + encodeURIComponent(key.subscribeKey) + "/" + encodeURIComponent(channel) + "/0?uuid=tether-console-viewer&tt=" + tt +
            (auth ? "&auth=" + encodeURIComponent(auth) : "");
          try {
            const r = await fetch(url, { signal: token.signal });
            const body = await r.json();
            if (!r.ok) { $("#subscribe-status").textContent = "Refused: " + r.status + " " + (body.message || ""); return; }
            tt = body.t.t;
            for (const m of body.m || []) $("#try-received").prepend(el("li", { "data-timetoken": m.p.t }, time(Date.now()) + "  " + m.c + "  " + JSON.stringify(m.d)));
          } catch (e) { if (subscription !== token) return; await new Promise((r) => setTimeout(r, 1000)); }
        }
      }
      $("#subscribe-button").addEventListener("click", () => {
        if (subscription) subscription.abort();
        const token = new AbortController(); subscription = token; subscribeLoop(token);
      });
      $("#unsubscribe-button").addEventListener("click", () => { if (subscription) subscription.abort(); subscription = null; $("#subscribe-status").textContent = "Not subscribed."; });

      // Live updates: the overview arrives as server-sent events; the open view is reloaded with it.
      let lastRefresh = 0;
      function refresh() {
        lastRefresh = Date.now();
        if (view === "channels") loadChannels().catch(() => {});
        if (view === "clients") loadClients().catch(() => {});
        if (view === "overview") api("overview").then(renderOverview).catch(() => {});
      }
      const events = new EventSource("/admin/v1/events");
      events.addEventListener("overview", (e) => {
        $("#live").textContent = "live"; $("#live").classList.add("on");
        renderOverview(JSON.parse(e.data));
        if (Date.now() - lastRefresh > 900) refresh();
      });
      events.onerror = () => { $("#live").textContent = "reconnecting…"; $("#live").classList.remove("on"); };
      loadKeysets().catch(() => {});
      route();
    })();
    """#
}
