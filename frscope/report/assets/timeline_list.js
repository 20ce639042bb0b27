  /* frscope timeline, part 3 (same closure as timeline.js, see frscope/report/html.py): each rank's own
   * times, the rank-list / state / group filters, jump to a rank or a sequence id, and the list view.
   *
   * The list holds one line per collective of the shown group (2,000 at most per recorder, but the DOM
   * only ever holds the lines in view: it scrolls virtually), with the spread across ranks that
   * frscope/report/rank_times.py computed: durations min / median / max, the slowest rank, the last
   * rank to arrive and what it cost the next-latest.
   */

  var SYNTAX = null; // {rank_part, max_rank}: the CLI's rank-list grammar (frscope/report/filters.py)
  var OWN = {of: null, rows: new Map()};
  var L = {sort: "seq", focusRank: null, selectedSeq: null, order: null, of: null, rowsOf: null, rowsKey: null};
  var LIST_ROW_PX = 22, LIST_LIMIT_GROUPS = 200;

  /* ---------- rank lists: 0-7,12 (the same grammar as `frscope analyze --rank`) ---------- */

  function parseRankList(text) {
    // [[lo, hi], ...] sorted and merged; throws an Error naming the bad part
    var part = new RegExp("^(?:" + (SYNTAX ? SYNTAX.rank_part : "\\s*([0-9]+)\\s*(?:-\\s*([0-9]+)\\s*)?") + ")$");
    var max = SYNTAX ? SYNTAX.max_rank : 1048576, ranges = [];
    String(text == null ? "" : text).split(",").forEach(function (p) {
      if (!p.trim()) return;
      var m = part.exec(p), lo = m ? parseInt(m[1], 10) : NaN, hi = m && m[2] != null ? parseInt(m[2], 10) : lo;
      if (!m || hi < lo || hi >= max) throw new Error("bad rank range '" + p.trim() + "' (expected e.g. 0-7,12)");
      ranges.push([lo, hi]);
    });
    ranges.sort(function (a, b) { return a[0] - b[0]; });
    var out = [];
    ranges.forEach(function (r) {
      var last = out[out.length - 1];
      if (last && r[0] <= last[1] + 1) last[1] = Math.max(last[1], r[1]); else out.push(r.slice());
    });
    return out;
  }
  function rankIn(ranges, r) {
    for (var i = 0; i < ranges.length; i++) if (r >= ranges[i][0] && r <= ranges[i][1]) return true;
    return false;
  }
  function rankRangeOf(ranges) { return ranges && ranges.length ? [ranges[0][0], ranges[ranges.length - 1][1]] : [null, null]; }

  /* ---------- each rank's own times ---------- */

  function fmtPrecise(ms) {
    if (ms == null || isNaN(ms)) return "-";
    var a = Math.abs(ms);
    if (a < 1) return Math.round(ms * 1000) + " \u00b5s";
    if (a < 1000) return ms.toFixed(3) + " ms";
    if (a < 60000) return (ms / 1000).toFixed(3) + " s";
    return (ms / 60000).toFixed(2) + " min";
  }

  function ownRow(gi, kind, row) {
    // one rank's row of rank_times[kind], expanded ([v, n]: n copies of v) into a Float64Array (NaN: none)
    if (OWN.of !== T) { OWN.of = T; OWN.rows = new Map(); }
    var key = gi + "|" + kind + "|" + row, got = OWN.rows.get(key);
    if (got !== undefined) return got;
    var rt = T.groups[gi].rank_times, src = rt && rt[kind] ? rt[kind][row] : null, out = null;
    if (src) {
      out = new Float64Array(T.groups[gi].seqs.length - rt.first_col).fill(NaN);
      var k = 0;
      for (var i = 0; i < src.length; i++) {
        var v = src[i];
        if (Array.isArray(v)) { if (v[0] != null) out.fill(v[0], k, k + v[1]); k += v[1]; } else { if (v != null) out[k] = v; k += 1; }
      }
    }
    if (OWN.rows.size > 4096) OWN.rows.clear();
    OWN.rows.set(key, out);
    return out;
  }

  function ownTimes(gi, row, col) {
    var g = T.groups[gi], rt = g.rank_times;
    if (!rt || col < rt.first_col) return null;
    var i = col - rt.first_col, out = {};
    var c = ownRow(gi, "created_us", row), q = ownRow(gi, "queued_us", row), d = ownRow(gi, "dur_us", row);
    if (c && !isNaN(c[i]) && g.col_t_ms[col] != null) out.created = g.col_t_ms[col] + c[i] / 1000;
    if (q && !isNaN(q[i]) && out.created != null) out.started = out.created + q[i] / 1000;
    if (d && !isNaN(d[i])) {
      out.duration = d[i] / 1000;
      var from = out.started != null ? out.started : out.created;
      if (from != null) out.ended = from + out.duration;
    }
    return out;
  }

  function addOwnTimes(info, gi, row, col) {
    var g = T.groups[gi];
    function at(name) { return g[name] ? g[name][col] : null; }
    info.dur_min_ms = at("col_dur_min_ms"); info.dur_max_ms = at("col_dur_max_ms"); info.slowest_rank = at("col_slowest_rank");
    info.last_rank = at("col_last_rank"); info.spread_ms = at("col_spread_ms"); info.last_wait_ms = at("col_last_wait_ms");
    var own = ownTimes(gi, row, col);
    info.own_times = own ? "kept" : g.rank_times ? "older than the kept window (the last " + (g.seqs.length - g.rank_times.first_col) + " collectives)" : "not recorded";
    info.own_created_ms = own ? own.created : null;
    info.own_started_ms = own ? own.started : null;
    info.own_ended_ms = own ? own.ended : null;
    info.own_duration_ms = own ? own.duration : null;
  }

  function ownTimeLines(info, lines) {
    if (info.own_created_ms != null) {
      var d = info.created_ms != null ? info.own_created_ms - info.created_ms : null;
      lines.push(["created", fmtPrecise(info.own_created_ms) + " this rank" + (d != null ? " (" + (d >= 0 ? "+" : "") + fmtPrecise(d) + " vs the group's median)" : "")]);
    } else if (info.created_ms != null) {
      lines.push(["created", fmtPrecise(info.created_ms) + " (median of the group; this rank's own: " + info.own_times + ")"]);
    }
    if (info.own_started_ms != null) lines.push(["started", fmtPrecise(info.own_started_ms) + " (" + fmtPrecise(info.own_started_ms - info.own_created_ms) + " after created)"]);
    if (info.own_ended_ms != null) lines.push(["ended", fmtPrecise(info.own_ended_ms)]);
    if (info.own_duration_ms != null) lines.push(["duration", fmtPrecise(info.own_duration_ms) + " this rank"]);
    if (info.late_ms != null) lines.push(["late", "this rank +" + fmtMs(info.late_ms) + " after the median"]);
    if (info.dur_min_ms != null) {
      lines.push(["durations", "min " + fmtPrecise(info.dur_min_ms) + " / median " + fmtPrecise(info.duration_ms) + " / max " +
        fmtPrecise(info.dur_max_ms) + (info.slowest_rank != null ? "  (slowest: rank " + info.slowest_rank + ")" : "")]);
    } else if (info.duration_ms != null) lines.push(["duration", fmtPrecise(info.duration_ms) + " (median)"]);
    if (info.last_rank != null && info.spread_ms) {
      lines.push(["last to arrive", "rank " + info.last_rank + ", " + fmtPrecise(info.spread_ms) + " after the first" +
        (info.last_wait_ms != null ? ", " + fmtPrecise(info.last_wait_ms) + " after the next-latest" : "")]);
    }
  }

  var OWN_MARKS_MAX = 6000;

  function drawOwnTimes(ctx, view, r0, r1, rowH, plotW, plotH) {
    // Time axis, zoomed in: each rank's own creation (a tick) and duration (a bar) over the cells, which
    // sit at the group's median; a late rank's tick stands apart. Only where the timeline kept own times,
    // and only when few enough cells are in view to draw one by one.
    LAST.ownMarks = 0;
    var g = D.g, rt = g.rank_times;
    if (S.mode !== "time" || !D.hasTime || !rt || rowH < 4) return;
    var range = visibleColumnRange();
    if (!range) return;
    var c0 = Math.max(range[0], rt.first_col), c1 = range[1];
    if (c1 < c0 || (r1 - r0) * (c1 - c0 + 1) > OWN_MARKS_MAX) return;
    var span = view.x1 - view.x0, count = 0, barH = Math.max(2, rowH * 0.22);
    ctx.save();
    ctx.beginPath(); ctx.rect(GUTTER_L, GUTTER_T, plotW, plotH); ctx.clip();
    ctx.fillStyle = "rgba(17, 17, 17, 0.85)";
    for (var r = r0; r < r1; r++) {
      var row = D.rows[r], y0 = yOfRow(r, view);
      for (var c = c0; c <= c1; c++) {
        var own = ownTimes(S.group, row, c);
        if (!own || own.created == null) continue;
        var x = GUTTER_L + (own.created - view.x0) / span * plotW;
        if (x < GUTTER_L - 2 || x > GUTTER_L + plotW + 2) continue;
        ctx.fillRect(x - 0.75, y0 + 1, 1.5, Math.max(2, rowH - 2));
        if (own.duration != null) {
          var from = own.started != null ? own.started : own.created;
          var xs = GUTTER_L + (from - view.x0) / span * plotW;
          ctx.fillRect(xs, y0 + (rowH - barH) / 2, Math.max(1, own.duration / span * plotW), barH);
        }
        count++;
      }
    }
    ctx.restore();
    LAST.ownMarks = count;
  }

  /* ---------- where the time goes (frscope analyze --perf) ---------- */

  function renderPerf(P) {
    var box = $("fr-perf");
    clear(box);
    box.hidden = !P;
    if (!P) return;
    box.appendChild(el("h2", {text: "Where the time goes"}));
    box.appendChild(el("div", {class: "perf-headline", text: P.headline}));
    var t = el("table", {class: "perf"});
    t.appendChild(el("tr", null, el("th", {text: "rank"}), el("th", {text: "costs"}), el("th", {text: "last at"}), el("th", {text: "median gap"})));
    (P.costs || []).slice(0, 8).forEach(function (c) {
      var tr = el("tr", {"data-rank": String(c.rank)}, el("td", {text: String(c.rank)}), el("td", {text: fmtMs(c.cost_ms)}),
        el("td", {text: c.last_count + "/" + c.collectives}), el("td", {text: fmtMs(c.median_gap_ms)}));
      tr.addEventListener("click", function () { try { jump("rank " + c.rank); } catch (e) { /* not in a drawn group */ } });
      t.appendChild(tr);
    });
    if ((P.costs || []).length) box.appendChild(t);
    var rows = el("table", {class: "perf"});
    rows.appendChild(el("tr", null, el("th", {text: "group"}), el("th", {text: "op"}), el("th", {text: "size"}), el("th", {text: "wait"}),
      el("th", {text: "transfer"}), el("th", {text: "GB/s"})));
    (P.rows || []).slice(0, 10).forEach(function (r) {
      rows.appendChild(el("tr", null, el("td", {text: r.group}), el("td", {text: r.op_label}), el("td", {text: r.size_bucket}),
        el("td", {text: fmtMs(r.wait_ms)}), el("td", {text: fmtMs(r.transfer_ms)}), el("td", {text: r.bandwidth_gbps == null ? "-" : r.bandwidth_gbps.toFixed(2)})));
    });
    box.appendChild(rows);
    box.appendChild(el("div", {class: "hint", text: "wait: rank-time waiting for late peers (compute side); transfer: once all were there (network side), " +
      (P.timing === "durations" ? "from the ranks' durations" : "not recorded (" + P.timing + " only)")}));
  }

  /* ---------- group search, state filter ---------- */

  function groupLabel(g) {
    return g.name + (g.desc && g.desc !== "undefined" ? " (" + g.desc + ")" : "") + " \u2014 " + g.ranks.length + " ranks, " +
      (g.seq_range ? "#" + g.seq_range[0] + "-" + g.seq_range[1] : "no collectives");
  }

  function groupMatches() {
    var q = ($("fr-group-search").value || "").trim().toLowerCase(), out = [];
    T.groups.forEach(function (g, i) { if (!q || groupLabel(g).toLowerCase().indexOf(q) >= 0) out.push(i); });
    return out;
  }

  function fillGroups() {
    // 5,000 groups do not fit a <select>: the matches of the search box, LIST_LIMIT_GROUPS at most
    var sel = $("fr-group"), matches = groupMatches(), shown = matches.slice(0, LIST_LIMIT_GROUPS);
    if (shown.indexOf(S.group) < 0) shown.unshift(S.group);
    clear(sel);
    shown.forEach(function (i) { sel.appendChild(el("option", {value: String(i), text: groupLabel(T.groups[i])})); });
    var more = matches.length - shown.filter(function (i) { return matches.indexOf(i) >= 0; }).length;
    if (more > 0) sel.appendChild(el("option", {value: "", disabled: "disabled", text: "\u2026 " + more + " more: refine the search"}));
    sel.value = String(S.group);
    var q = $("fr-group-search").value.trim();
    $("fr-group-search").hidden = T.groups.length < 2;
    $("fr-group-count").textContent = T.groups.length < 2 ? "" : q ? matches.length + " of " + T.groups.length + " groups" : T.groups.length + " groups";
  }

  function buildStateFilter() {
    var box = $("fr-state-filter");
    if (box.getAttribute("data-built") === "true") return;
    clear(box);
    box.appendChild(el("span", {class: "hint", text: "states"}));
    ["completed", "started", "scheduled", "in_flight", "not_entered", "not_recorded", "no_dump"].forEach(function (name) {
      var cb = el("input", {type: "checkbox", value: name, "data-state": name});
      cb.checked = true;
      cb.addEventListener("change", function () {
        var on = [], all = true;
        box.querySelectorAll("input[type=checkbox]").forEach(function (b) { if (b.checked) on.push(b.value); else all = false; });
        api.setStates(all ? null : on);
      });
      box.appendChild(el("label", null, cb, name.replace("_", " ")));
    });
    box.setAttribute("data-built", "true");
  }

  function syncStateBoxes() {
    $("fr-state-filter").querySelectorAll("input[type=checkbox]").forEach(function (b) {
      b.checked = !S.states || S.states.has(T.states.indexOf(b.value));
    });
  }

  /* ---------- jump to a rank or a sequence id ---------- */

  function jump(text) {
    var t = String(text == null ? "" : text).trim().toLowerCase(), m, g = D.g;
    if ((m = /^(?:#|seq\s*#?)\s*(\d+)$/.exec(t))) return jumpSeq(+m[1]);
    if ((m = /^(?:rank\s*|r)(\d+)$/.exec(t))) return jumpRank(+m[1]);
    if ((m = /^(\d+)$/.exec(t))) return g.seqs.indexOf(+m[1]) >= 0 ? jumpSeq(+m[1]) : jumpRank(+m[1]);
    throw new Error("expected #SEQ or rank N, e.g. #340 or rank 12");
  }

  function jumpSeq(seq) {
    var col = D.g.seqs.indexOf(seq);
    if (col < 0) throw new Error("no collective #" + seq + " in group " + D.g.name + (D.g.sampled ? " (sampled: not every collective is shown)" : ""));
    var row = L.focusRank != null ? D.g.ranks.indexOf(L.focusRank) : (D.rows.length ? D.rows[0] : -1);
    L.selectedSeq = seq;
    var pos = row >= 0 ? D.posOf[row] : -1;
    S.view = columnView(col, S.view ? S.view.r0 : 0, S.view ? S.view.r1 : D.rows.length);
    if (pos >= 0) { S.pinned = {group: S.group, row: row, col: col}; showDetails(S.pinned); }
    render();
    renderList(true);
    return {group: D.g.name, seq: seq};
  }

  function jumpRank(rank) {
    var row = D.g.ranks.indexOf(rank);
    if (row < 0) {
      var other = -1;
      T.groups.forEach(function (g, i) { if (other < 0 && g.ranks.indexOf(rank) >= 0) other = i; });
      if (other < 0) throw new Error("no rank " + rank + " in any group");
      api.setGroup(other, true);
      row = D.g.ranks.indexOf(rank);
    }
    if (D.posOf[row] < 0) api.setRanks(""); // hidden by the rank filter: show every rank again
    var pos = D.posOf[row], span = Math.min(D.rows.length, 24);
    L.focusRank = rank;
    var r0 = Math.max(0, Math.min(pos - span / 2, D.rows.length - span));
    S.view = clampView({x0: S.view ? S.view.x0 : 0, x1: S.view ? S.view.x1 : D.ncols, r0: r0, r1: r0 + span});
    var col = L.selectedSeq != null ? D.g.seqs.indexOf(L.selectedSeq) : D.ncols - 1;
    if (col < 0) col = D.ncols - 1;
    S.pinned = {group: S.group, row: row, col: col};
    showDetails(S.pinned);
    render();
    renderList(false);
    return {group: D.g.name, rank: rank};
  }

  /* ---------- the list view ---------- */

  function listData() {
    // per column of the shown group: which states and op labels occur among the shown ranks
    if (L.of === D && L.order) return;
    var g = D.g, n = D.ncols, stateBits = new Uint8Array(n), opBits = new Uint32Array(n), covered = new Int32Array(n);
    var perPattern = new Map();
    D.rows.forEach(function (ri) { var p = g.row_pattern[ri]; perPattern.set(p, (perPattern.get(p) || 0) + 1); });
    perPattern.forEach(function (count, p) {
      var runs = g.patterns[p];
      for (var i = 0; i + 2 < runs.length; i += 3) {
        var cell = T.cells[runs[i + 2]], sb = 1 << cell[1], ob = cell[0] >= 0 ? 1 << T.op_label_of[cell[0]] : 0;
        for (var c = runs[i]; c < runs[i] + runs[i + 1]; c++) { stateBits[c] |= sb; opBits[c] |= ob; covered[c] += count; }
      }
    });
    for (var c2 = 0; c2 < n; c2++) {
      var cc = g.col_cell[c2];
      if (cc >= 0 && covered[c2] < D.rows.length) {
        stateBits[c2] |= 1 << T.cells[cc][1];
        if (T.cells[cc][0] >= 0) opBits[c2] |= 1 << T.op_label_of[T.cells[cc][0]];
      }
    }
    L.of = D; L.stateBits = stateBits; L.opBits = opBits; L.differ = covered; L.order = null;
  }

  function listOrder() {
    listData();
    var opMask = 0, stMask = 0, out = [];
    if (S.ops) T.op_labels.forEach(function (lab, i) { if (S.ops.has(lab)) opMask |= 1 << i; });
    if (S.states) S.states.forEach(function (i) { stMask |= 1 << i; });
    for (var c = 0; c < D.ncols; c++) {
      if (S.ops && !(L.opBits[c] & opMask)) continue;
      if (S.states && !(L.stateBits[c] & stMask)) continue;
      out.push(c);
    }
    var g = D.g, key = null;
    if (L.sort === "duration") key = function (c) { var v = (g.col_dur_max_ms || [])[c]; return v == null ? (g.col_dur_ms[c] == null ? -1 : g.col_dur_ms[c]) : v; };
    else if (L.sort === "wait") key = function (c) { var v = (g.col_last_wait_ms || [])[c]; return v == null ? -1 : v; };
    else if (L.sort === "spread") key = function (c) { var v = (g.col_spread_ms || [])[c]; return v == null ? -1 : v; };
    if (key) out.sort(function (a, b) { return key(b) - key(a) || a - b; });
    L.order = out;
    return out;
  }

  function listCells(c) {
    var g = D.g, cell = g.col_cell[c], tc = cell >= 0 ? T.cells[cell] : null;
    var op = tc && tc[0] >= 0 ? T.op_names[tc[0]] : "-";
    var st = tc ? T.states[tc[1]].replace("_", " ") : "-";
    if (L.differ[c] > 0) st += " \u00b7 " + L.differ[c] + " differ";
    function at(name) { return g[name] ? g[name][c] : null; }
    var durs = at("col_dur_min_ms") != null ? fmtPrecise(at("col_dur_min_ms")) + " / " + fmtPrecise(g.col_dur_ms[c]) + " / " + fmtPrecise(at("col_dur_max_ms")) : "-";
    var last = at("col_last_rank") != null && at("col_spread_ms") ? at("col_last_rank") + " (+" + fmtPrecise(at("col_last_wait_ms") != null ? at("col_last_wait_ms") : at("col_spread_ms")) + ")" : "-";
    var out = ["#" + g.seqs[c], op, g.name, tc ? str(tc[2]) : "", tc ? str(tc[3]) : "", durs,
      at("col_slowest_rank") != null ? String(at("col_slowest_rank")) : "-", last, st, fmtPrecise(g.col_t_ms[c])];
    if (L.focusRank != null) {
      var row = g.ranks.indexOf(L.focusRank), own = row >= 0 ? ownTimes(S.group, row, c) : null;
      out.push(!own ? "-" : own.duration != null ? fmtPrecise(own.duration) : own.created != null ? (own.created - g.col_t_ms[c] >= 0 ? "+" : "") + fmtPrecise(own.created - g.col_t_ms[c]) : "-");
    }
    return out;
  }

  var LIST_HEAD = ["seq", "op", "group", "sizes", "dtypes", "duration min / median / max", "slowest", "last to arrive (wait)", "state", "created (median)"];

  function renderList(scrollToSelected) {
    if (!D) return;
    var order = listOrder(), vp = $("fr-list-viewport"), body = $("fr-list-rows");
    var head = LIST_HEAD.concat(L.focusRank != null ? ["rank " + L.focusRank + " (own)"] : []);
    var hr = $("fr-list-head");
    if (hr.getAttribute("data-cols") !== head.join("|")) {
      clear(hr);
      head.forEach(function (h) { hr.appendChild(el("span", {text: h})); });
      hr.setAttribute("data-cols", head.join("|"));
    }
    $("fr-list-spacer").style.height = (order.length * LIST_ROW_PX) + "px";
    if (scrollToSelected && L.selectedSeq != null) {
      var idx = order.indexOf(D.g.seqs.indexOf(L.selectedSeq));
      if (idx >= 0) vp.scrollTop = Math.max(0, idx * LIST_ROW_PX - vp.clientHeight / 2);
    }
    var first = Math.max(0, Math.floor(vp.scrollTop / LIST_ROW_PX) - 5);
    var last = Math.min(order.length, first + Math.ceil((vp.clientHeight || 300) / LIST_ROW_PX) + 10);
    // Rows still in the window keep their elements (a scroll re-renders the window while a click may be
    // under way: a row replaced between mousedown and mouseup would swallow the click). They are made anew
    // only when what a row shows changes: other data, or the focused rank's column.
    var contentKey = L.focusRank == null ? "" : String(L.focusRank);
    if (L.rowsOf !== D || L.rowsKey !== contentKey) { clear(body); L.rowsOf = D; L.rowsKey = contentKey; }
    var kept = {};
    Array.prototype.slice.call(body.children).forEach(function (row) { kept[row.getAttribute("data-col")] = row; });
    body.style.top = (first * LIST_ROW_PX) + "px";
    var rows = [];
    for (var i = first; i < last; i++) {
      var c = order[i], seq = D.g.seqs[c], line = kept[String(c)];
      if (line) delete kept[String(c)];
      else {
        line = el("div", {"data-seq": String(seq), "data-col": String(c)});
        listCells(c).forEach(function (t) { line.appendChild(el("span", {text: t})); });
      }
      line.className = "fr-list-row" + (seq === L.selectedSeq ? " selected" : "") + (D.findingCols.indexOf(c) >= 0 ? " finding" : "");
      rows.push(line);
    }
    Object.keys(kept).forEach(function (k) { body.removeChild(kept[k]); });
    rows.forEach(function (row, j) { if (body.children[j] !== row) body.insertBefore(row, body.children[j] || null); });
    var list = $("fr-list");
    list.setAttribute("data-count", String(order.length));
    list.setAttribute("data-first-seqs", JSON.stringify(order.slice(0, 5).map(function (c2) { return D.g.seqs[c2]; })));
    $("fr-list-count").textContent = order.length + " of " + D.ncols + " collectives" + (D.g.sampled ? " (sampled)" : "");
  }

  var listPending = false;
  function changed() {
    // after a load or a filter change: the list, the group box and the state boxes follow
    if (!D) return;
    buildStateFilter();
    syncStateBoxes();
    L.order = null;
    if (L.focusRank != null && D.g.ranks.indexOf(L.focusRank) < 0) L.focusRank = null;
    if (listPending) return;
    listPending = true;
    requestAnimationFrame(function () { listPending = false; renderList(false); });
  }

  function wireList() {
    var search = $("fr-group-search");
    search.addEventListener("input", function () { fillGroups(); });
    search.addEventListener("keydown", function (e) {
      if (e.key !== "Enter") return;
      var m = groupMatches();
      if (m.length) api.setGroup(m[0], true);
    });
    var jumpBox = $("fr-jump");
    jumpBox.addEventListener("keydown", function (e) {
      if (e.key !== "Enter") return;
      try { jump(this.value); this.setCustomValidity(""); $("fr-jump-msg").textContent = ""; } catch (err) {
        this.setCustomValidity(err.message); $("fr-jump-msg").textContent = err.message;
      }
    });
    $("fr-list-sort").addEventListener("change", function () { L.sort = this.value; L.order = null; renderList(false); });
    var scrollPending = false;
    $("fr-list-viewport").addEventListener("scroll", function () {
      if (scrollPending) return;
      scrollPending = true;
      requestAnimationFrame(function () { scrollPending = false; renderList(false); });
    });
    $("fr-list-rows").addEventListener("click", function (e) {
      var line = e.target.closest ? e.target.closest(".fr-list-row") : null;
      if (line) jumpSeq(+line.getAttribute("data-seq"));
    });
    api.jump = jump;
    api.setListSort = function (sort) { L.sort = sort; $("fr-list-sort").value = sort; L.order = null; renderList(false); };
    api.list = function () {
      listOrder();
      return {count: L.order.length, seqs: L.order.map(function (c) { return D.g.seqs[c]; }), sort: L.sort, focusRank: L.focusRank,
        selectedSeq: L.selectedSeq, domRows: $("fr-list-rows").childElementCount};
    };
    api.parseRanks = function (text) { return parseRankList(text); };
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
