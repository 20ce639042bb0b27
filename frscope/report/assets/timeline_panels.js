  /* frscope timeline, part 2 (same closure as timeline.js, see frscope/report/html.py): the findings
   * panel, the header, the ranks' status now, and the live page's updates (operator web UI only). */

  /* ---------- findings panel ---------- */

  function frameLines(frames, max) {
    var pre = el("div", {class: "stack"});
    (frames || []).slice(0, max || 14).forEach(function (f, i) {
      var lib = /\/torch\/|site-packages|dist-packages|\/lib\/python3|<frozen /.test(f.filename);
      var line = el("div", {class: lib ? null : "user", text: f.name + "  " + f.filename + ":" + f.line});
      pre.appendChild(line);
      if (i === 0 && !frames.length) pre.appendChild(el("div", {text: "(empty)"}));
    });
    if (frames && frames.length > (max || 14)) pre.appendChild(el("div", {text: "... " + (frames.length - (max || 14)) + " more frames"}));
    return pre;
  }

  function findingNode(f, consequence) {
    var box = el("div", {class: "finding" + (consequence ? " consequence" : ""), "data-category": f.category});
    box.appendChild(el("div", null, el("span", {class: "cat", text: f.category}), " ",
      el("span", {class: "bucket", text: "(" + f.bucket + ")" + (f.ambiguous ? " - no majority: culprits are candidates" : "")})));
    box.appendChild(el("div", {class: "summary", text: f.summary}));
    var dl = el("dl");
    function row(k, v) { if (v != null && v !== "") { dl.appendChild(el("dt", {text: k})); dl.appendChild(el("dd", {text: v})); } }
    row("culprit ranks", fmtRanks(f.culprit_ranks));
    var pg = f.process_group || {};
    row("group", pg.name + (pg.desc && pg.desc !== "undefined" ? " (" + pg.desc + ")" : "") + ", " + (pg.ranks || []).length + " ranks");
    if (f.op) row("collective", f.op + (f.collective_seq_id != null ? " #" + f.collective_seq_id : "") + (f.p2p_seq_id != null ? " p2p #" + f.p2p_seq_id : ""));
    if (f.input_sizes) row("sizes", JSON.stringify(f.input_sizes));
    if (f.input_dtypes) row("dtypes", f.input_dtypes.join(", "));
    if (f.stalled_for_s != null) row("stalled for", fmtMs(f.stalled_for_s * 1000));
    if (f.late_by_ms != null) row("late by", fmtMs(f.late_by_ms));
    box.appendChild(dl);
    if (f.evidence && f.evidence.length) {
      var ul = el("ul");
      f.evidence.forEach(function (e) { ul.appendChild(el("li", {text: e})); });
      box.appendChild(ul);
    }
    Object.keys(f.culprit_stacks || {}).slice(0, 2).forEach(function (r) {
      box.appendChild(el("div", {class: "hint", text: "rank " + r + " now (most recent call first):"}));
      box.appendChild(frameLines(f.culprit_stacks[r]));
    });
    Object.keys(f.culprit_frames || {}).slice(0, 2).forEach(function (r) {
      box.appendChild(el("div", {class: "hint", text: "rank " + r + " enqueued the op from:"}));
      box.appendChild(frameLines(f.culprit_frames[r]));
    });
    (f.consequences || []).forEach(function (c) {
      var det = el("details", null, el("summary", {text: "consequence: " + c.category}));
      det.appendChild(findingNode(c, true));
      box.appendChild(det);
    });
    return box;
  }

  function renderHeader(tl) {
    var v = $("fr-verdict");
    var healthy = !R || R.healthy;
    v.textContent = R ? R.verdict : LIVE && tl && tl.groups && tl.groups.length
      ? "No diagnosis (nothing to diagnose so far): the collectives below come live from the job's sidecars."
      : "No report yet: waiting for the first diagnosis.";
    v.className = R ? (healthy ? "ok" : "bad") : "";
    var meta = [];
    if (R) {
      meta.push((R.ranks_loaded || []).length + " of " + R.world_size + " ranks loaded");
      if (R.missing_ranks && R.missing_ranks.length) meta.push("missing: " + fmtRanks(R.missing_ranks));
      if (R.backend) meta.push(R.backend);
      if (R.versions && R.versions.length) meta.push("format " + R.versions.join(", "));
      meta.push((R.groups || []).length + " process groups");
    }
    $("fr-meta").textContent = meta.join(" \u00b7 ");
    if (LIVE && LIVE.title) document.title = LIVE.title + (R && !R.healthy ? " \u2014 stuck" : "");
  }

  function renderFindings() {
    var box = $("fr-findings-body");
    clear(box);
    if (!R) { box.appendChild(el("div", {class: "hint", text: "No diagnosis yet."})); renderStatus(); return; }
    if (!R.findings || !R.findings.length) box.appendChild(el("div", {class: "healthy", text: R.verdict}));
    (R.findings || []).forEach(function (f) { box.appendChild(findingNode(f, false)); });
    if (R.problems && R.problems.length) {
      var det = el("details", {class: "problems"}, el("summary", {text: R.problems.length + " file(s) with problems"}));
      var ul = el("ul");
      R.problems.forEach(function (p) { ul.appendChild(el("li", {text: p.source + (p.rank != null ? " (rank " + p.rank + ")" : "") + ": " + p.message})); });
      det.appendChild(ul);
      box.appendChild(det);
    }
    renderStatus();
  }

  function renderStatus() {
    var box = $("fr-status");
    clear(box);
    var keys = Object.keys(STATUS || {});
    if (!keys.length) return;
    var by = {};
    keys.forEach(function (k) { var s = STATUS[k].state || "unknown"; (by[s] = by[s] || []).push(+k); });
    box.appendChild(el("h2", {text: "Ranks now"}));
    // "stalled: 1 rank (0)", never "stalled: 0": a bare rank list read as a count once (a 2-rank hang
    // showed "ok: 1, stalled: 0" beside rank 0's stalled dot)
    Object.keys(by).sort().forEach(function (s) {
      var n = by[s].length;
      box.appendChild(el("span", {class: "pill", "data-state": s, "data-count": String(n), "data-ranks": fmtRanks(by[s])},
        el("span", {class: "swatch", style: "background:" + statusColor(s)}),
        " " + s + ": " + n + (n === 1 ? " rank" : " ranks") + " (" + fmtRanks(by[s]) + ")"));
    });
  }

  /* ---------- live updates (operator web UI only) ---------- */

  function startLive(live) {
    var badge = $("fr-live");
    badge.hidden = false;
    if (live.trace_url) { $("fr-trace").href = live.trace_url; $("fr-trace").hidden = false; }
    if (live.bundle_url) { $("fr-bundle").href = live.bundle_url; $("fr-bundle").hidden = false; }
    function mark(ok, text) { badge.textContent = text; badge.className = ok ? "live" : "live stale"; }
    mark(true, "\u25CF live");
    var fetching = false, wanted = null, timer = null;
    function refresh(rev) {
      if (rev != null && rev === REVISION) return;
      if (fetching) { wanted = rev; return; }
      fetching = true;
      fetch(live.data_url, {headers: {Accept: "application/json"}, cache: "no-store"}).then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      }).then(function (data) {
        api.load(data);
        mark(true, "\u25CF live \u00b7 updated " + new Date().toLocaleTimeString());
      }).catch(function (err) {
        mark(false, "\u25CF disconnected (" + err.message + "), retrying");
      }).then(function () {
        fetching = false;
        if (wanted != null && wanted !== REVISION) { var w = wanted; wanted = null; refresh(w); }
      });
    }
    function poll() {
      if (timer) return;
      timer = setInterval(function () {
        fetch(live.summary_url, {cache: "no-store"}).then(function (r) { return r.json(); })
          .then(function (s) { refresh(s.revision); }).catch(function (err) { mark(false, "\u25CF disconnected (" + err.message + ")"); });
      }, (live.poll_s || 3) * 1000);
    }
    if (window.EventSource && live.events_url) {
      var es = new EventSource(live.events_url), errors = 0;
      es.addEventListener("job", function (ev) {
        errors = 0;
        var msg = JSON.parse(ev.data);
        refresh(msg.revision);
      });
      es.onerror = function () {
        errors += 1;
        mark(false, "\u25CF reconnecting");
        // CLOSED: the browser gave up (an HTTP error, a proxy that does not stream); else it retries
        if (es.readyState === 2 || errors >= 3) { es.close(); poll(); }
      };
    } else {
      poll();
    }
  }
