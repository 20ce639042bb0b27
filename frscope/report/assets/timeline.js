/* frscope collective timeline: vanilla JS drawing on a <canvas>. No dependencies, no network access
 * except, on the operator's live page, the job's own data and event URLs.
 *
 * Data: {report, timeline, live, status} in <script id="frscope-data" type="application/json">
 * (timeline shape: frscope/report/timeline.py and docs/timeline.md).
 * Everything that comes from a dump (paths, names, stacks) is put in the page with textContent only.
 *
 * window.frscope is a small API for people and tests: state(), setOps(), setGroup(), setRanks(),
 * setRankRange(), setStates(), setMode(), zoomToStuck(), reset(), cellAt(rank, seq), jump(), load(data).
 *
 * frscope/report/html.py puts this file, timeline_panels.js (findings panel, status, live updates) and
 * timeline_list.js (own times, list view, filters, start-up) in one closure: they share its functions
 * and state.
 */

  var OP_COLORS = {
    ALLREDUCE: [0, 114, 178], BROADCAST: [230, 159, 0], REDUCE: [86, 180, 233], ALLGATHER: [0, 158, 115],
    REDUCE_SCATTER: [204, 121, 167], ALLTOALL: [128, 100, 180], GATHER: [140, 86, 75], SCATTER: [160, 160, 30],
    BARRIER: [110, 110, 110], SEND: [23, 170, 190], RECV: [31, 130, 120], COALESCED: [90, 60, 150],
    OTHER: [60, 60, 60]
  };
  var ST_COMPLETED = 0, ST_SCHEDULED = 1, ST_STARTED = 2, ST_IN_FLIGHT = 3, ST_NOT_ENTERED = 4,
    ST_NOT_RECORDED = 5, ST_NO_DUMP = 6;
  var STATE_TEXT = ["completed", "scheduled (queued, not started)", "started", "in flight (the rank waits here)",
    "never entered", "not recorded (evicted from the ring buffer)", "no dump from this rank"];
  var ABSENT_RGB = {4: [226, 229, 234], 5: [243, 244, 246], 6: [190, 194, 201]};
  var GUTTER_L = 70, GUTTER_T = 40, PAD_R = 10, PAD_B = 6;
  var HATCH = 1, PLAIN = 0;

  var R = null, T = null, LIVE = null, STATUS = {}, REVISION = null;
  var S = {group: 0, ops: null, ranks: null, rankText: "", states: null, mode: "seq", view: null, hover: null, pinned: null};
  var D = null; // derived data for the shown group
  var LAST = {drawnCells: 0, drawnByOp: {}, renderMs: 0, highlighted: [], stuckVisible: false, cols: 0, rows: 0,
    axisSpanMs: null, waitMs: null};
  var colOfX = null, rowOfY = null, geo = null;

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (!Object.prototype.hasOwnProperty.call(attrs, k) || attrs[k] == null) continue;
        if (k === "text") e.textContent = String(attrs[k]);
        else if (k === "class") e.className = attrs[k];
        else e.setAttribute(k, attrs[k]);
      }
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c == null) continue;
      e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return e;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
  function mix(c, w, t) { return [Math.round(c[0] * (1 - t) + w[0] * t), Math.round(c[1] * (1 - t) + w[1] * t),
    Math.round(c[2] * (1 - t) + w[2] * t)]; }
  function pack(c) { return ((255 << 24) | (c[2] << 16) | (c[1] << 8) | c[0]) >>> 0; }
  function fmtRanks(ranks) {
    if (!ranks || !ranks.length) return "none";
    var s = ranks.slice().sort(function (a, b) { return a - b; }), out = [], lo = s[0], prev = s[0];
    for (var i = 1; i <= s.length; i++) {
      if (i < s.length && s[i] === prev + 1) { prev = s[i]; continue; }
      out.push(lo === prev ? String(lo) : lo + "-" + prev);
      if (i < s.length) { lo = s[i]; prev = s[i]; }
    }
    return out.join(", ");
  }
  function fmtMs(ms) {
    if (ms == null) return "-";
    if (Math.abs(ms) >= 60000) return (ms / 60000).toFixed(1) + " min";
    if (Math.abs(ms) >= 1000) return (ms / 1000).toFixed(2) + " s";
    return ms.toFixed(ms < 10 ? 2 : 1) + " ms";
  }
  function str(i) { return (T.strings && T.strings[i]) || ""; }
  function opLabelOfCell(cell) {
    var op = T.cells[cell][0];
    return op < 0 ? null : T.op_labels[T.op_label_of[op]];
  }

  /* ---------- derived data for one group ---------- */

  function derive() {
    var g = T.groups[S.group];
    var ncols = g.seqs.length;
    var dense = new Array(g.patterns.length);
    var rows = [];
    for (var i = 0; i < g.ranks.length; i++) {
      var r = g.ranks[i];
      if (!S.ranks || rankIn(S.ranks, r)) rows.push(i);
    }
    var culprit = {};
    (T.culprit_ranks || []).forEach(function (r) { culprit[r] = true; });
    var culpritRows = [], posOf = new Int32Array(g.ranks.length).fill(-1);
    rows.forEach(function (ri, pos) { posOf[ri] = pos; if (culprit[g.ranks[ri]]) culpritRows.push(pos); });
    var lags = new Map();
    for (var j = 0; j + 2 < g.lags.length; j += 3) lags.set(g.lags[j] * ncols + g.lags[j + 1], g.lags[j + 2]);
    var findingCols = g.finding_cols || [];
    // Time mode: where each column starts and ends (ms since t0), and the columns ordered by start.
    var starts = g.col_t_ms, ends = new Array(ncols), order = [];
    var capturedMax = 0;
    for (var k in (T.captured_ms || {})) capturedMax = Math.max(capturedMax, T.captured_ms[k]);
    for (var c = 0; c < ncols; c++) if (starts[c] != null) order.push(c);
    order.sort(function (a, b) { return starts[a] - starts[b]; });
    for (var o = 0; o < order.length; o++) {
      var col = order[o], s0 = starts[col], next = o + 1 < order.length ? starts[order[o + 1]] : null;
      var dur = g.col_dur_ms[col], cell = g.col_cell[col];
      var e;
      if (cell >= 0 && T.cells[cell][1] === ST_IN_FLIGHT && capturedMax > s0) e = capturedMax;
      else if (dur != null && dur > 0) e = s0 + dur;
      else if (next != null && next > s0) e = next;
      else e = s0 + 1;
      ends[col] = Math.max(e, s0 + 0.001);
    }
    // An in-flight collective stretches to when the recorders were read (seconds or minutes later).
    var tMin = order.length ? starts[order[0]] : 0, tMax = tMin + 1;
    order.forEach(function (c2) { tMax = Math.max(tMax, ends[c2]); });
    D = {g: g, ncols: ncols, dense: dense, rows: rows, posOf: posOf, culpritRows: culpritRows, lags: lags, findingCols: findingCols,
      starts: starts, ends: ends, order: order, tMin: tMin, tMax: tMax,
      hasTime: order.length > 0};
    buildColors();
  }

  function patternArray(p) {
    var a = D.dense[p];
    if (!a) {
      a = Int32Array.from(D.g.col_cell);
      var runs = D.g.patterns[p];
      for (var i = 0; i + 2 < runs.length; i += 3) a.fill(runs[i + 2], runs[i], runs[i] + runs[i + 1]);
      D.dense[p] = a;
    }
    return a;
  }

  function buildColors() {
    var n = T.cells.length, white = [255, 255, 255], black = [0, 0, 0];
    var color = new Uint32Array(n), hatch = new Uint32Array(n), kind = new Uint8Array(n), label = new Int16Array(n);
    for (var i = 0; i < n; i++) {
      var cell = T.cells[i], op = cell[0], st = cell[1];
      if (S.states && !S.states.has(st)) { label[i] = op < 0 ? -1 : T.op_label_of[op]; color[i] = 0; continue; }
      if (op < 0) {
        label[i] = -1;
        var a = ABSENT_RGB[st] || [230, 230, 230];
        color[i] = pack(a);
        hatch[i] = pack(mix(a, black, 0.25));
        kind[i] = st === ST_NO_DUMP ? HATCH : PLAIN;
        continue;
      }
      var lab = T.op_labels[T.op_label_of[op]];
      label[i] = T.op_label_of[op];
      if (S.ops && !S.ops.has(lab)) { color[i] = 0; continue; }
      var base = OP_COLORS[lab] || OP_COLORS.OTHER;
      var c = st === ST_SCHEDULED ? mix(base, white, 0.62) : st === ST_STARTED ? mix(base, white, 0.3) : base;
      color[i] = pack(c);
      if (st === ST_IN_FLIGHT) { kind[i] = HATCH; hatch[i] = pack(mix(base, black, 0.55)); }
    }
    D.color = color; D.hatch = hatch; D.kind = kind; D.label = label;
  }

  /* ---------- view ---------- */

  function fullView() {
    if (S.mode === "time" && D.hasTime) return {x0: D.tMin, x1: D.tMax, r0: 0, r1: D.rows.length};
    return {x0: 0, x1: Math.max(D.ncols, 1), r0: 0, r1: D.rows.length};
  }
  function isFullView(v) {
    var f = fullView(), eps = 1e-6 * Math.max(1, Math.abs(f.x1 - f.x0));
    return Math.abs(v.x0 - f.x0) <= eps && Math.abs(v.x1 - f.x1) <= eps && v.r0 <= 0 && v.r1 >= f.r1;
  }
  function defaultView() {
    // Time mode opens on everything, up to when the recorders were read: a 14 s wait is 14 s of the
    // axis (labelled with its length), and the history before it is a zoom away.
    return fullView();
  }
  function clampView(v) {
    var f = fullView(), minX = S.mode === "time" ? (f.x1 - f.x0) / 5000 : Math.min(3, f.x1);
    var span = Math.max(minX, Math.min(v.x1 - v.x0, f.x1 - f.x0));
    var x0 = Math.max(f.x0, Math.min(v.x0, f.x1 - span));
    var rspan = Math.max(Math.min(2, f.r1), Math.min(v.r1 - v.r0, f.r1));
    var r0 = Math.max(0, Math.min(v.r0, f.r1 - rspan));
    return {x0: x0, x1: x0 + span, r0: r0, r1: r0 + rspan};
  }

  /* ---------- drawing ---------- */

  function canvasHeight() {
    var n = D ? D.rows.length : 1;
    var h = GUTTER_T + PAD_B + Math.max(n * 18, 120);
    return Math.max(200, Math.min(h, Math.round(window.innerHeight * 0.72)));
  }

  function mapColumns(W, view) {
    var map = new Int32Array(W).fill(-1), spanX = (view.x1 - view.x0) / W;
    var pri = D.findingCols;
    if (S.mode === "time" && D.hasTime) {
      var order = D.order, j = 0, starts = D.starts, ends = D.ends;
      for (var x = 0; x < W; x++) {
        var t = view.x0 + (x + 0.5) * spanX, tEnd = view.x0 + (x + 1) * spanX;
        while (j + 1 < order.length && starts[order[j + 1]] <= t) j++;
        var best = -1;
        // the column under the pixel's centre, or the latest one that starts inside the pixel
        for (var q = j; q >= 0 && q > j - 4; q--) { if (starts[order[q]] <= t && t < ends[order[q]]) { best = order[q]; break; } }
        if (best < 0 && j + 1 < order.length && starts[order[j + 1]] < tEnd) best = order[j + 1];
        map[x] = best;
      }
      for (var p = 0; p < pri.length; p++) {
        var cp = pri[p];
        if (D.starts[cp] == null) continue;
        var xp = Math.floor((D.starts[cp] - view.x0) / spanX);
        if (xp >= 0 && xp < W) map[xp] = cp;
      }
      return map;
    }
    for (var x2 = 0; x2 < W; x2++) {
      var c = Math.floor(view.x0 + (x2 + 0.5) * spanX);
      map[x2] = c >= 0 && c < D.ncols ? c : -1;
    }
    if (spanX > 1) { // several columns per pixel: never lose a finding's column
      for (var p2 = 0; p2 < pri.length; p2++) {
        var xq = Math.floor((pri[p2] + 0.5 - view.x0) / spanX);
        if (xq >= 0 && xq < W) map[xq] = pri[p2];
      }
    }
    return map;
  }

  function mapRows(H, view) {
    var map = new Int32Array(H).fill(-1), spanY = (view.r1 - view.r0) / H;
    for (var y = 0; y < H; y++) {
      var r = Math.floor(view.r0 + (y + 0.5) * spanY);
      map[y] = r >= 0 && r < D.rows.length ? r : -1;
    }
    if (spanY > 1) { // several ranks per pixel: culprit rows always win their pixel
      D.culpritRows.forEach(function (pos) {
        var yq = Math.floor((pos + 0.5 - view.r0) / spanY);
        if (yq >= 0 && yq < H) map[yq] = pos;
      });
    }
    return map;
  }

  function render() {
    if (!D) return;
    var t0 = performance.now();
    var canvas = $("fr-canvas");
    canvas.style.height = canvasHeight() + "px";
    var dpr = window.devicePixelRatio || 1;
    var cssW = Math.max(200, canvas.clientWidth), cssH = canvas.clientHeight;
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(cssH * dpr);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    var px0 = Math.round(GUTTER_L * dpr), py0 = Math.round(GUTTER_T * dpr);
    var W = Math.max(1, canvas.width - px0 - Math.round(PAD_R * dpr));
    var H = Math.max(1, canvas.height - py0 - Math.round(PAD_B * dpr));
    S.view = clampView(S.view || defaultView());
    var view = S.view;
    geo = {dpr: dpr, px0: px0, py0: py0, W: W, H: H, view: view};
    colOfX = mapColumns(W, view);
    rowOfY = mapRows(H, view);
    var pxPerRow = H / (view.r1 - view.r0), gapY = pxPerRow >= 6;
    // a one-pixel gap after every column drawn at least 6 pixels wide
    var gapAt = new Uint8Array(W), runStart = 0, minRun = Math.round(6 * dpr);
    for (var gx = 1; gx <= W; gx++) {
      if (gx === W || colOfX[gx] !== colOfX[runStart]) {
        if (gx < W && gx - runStart >= minRun && colOfX[runStart] >= 0) gapAt[gx - 1] = 1;
        runStart = gx;
      }
    }

    var img = ctx.createImageData(W, H), u32 = new Uint32Array(img.data.buffer);
    u32.fill(0xffffffff);
    var color = D.color, hatch = D.hatch, kind = D.kind, g = D.g, rows = D.rows, rowPattern = g.row_pattern;
    var lastRow = -2, arr = null;
    for (var y = 0; y < H; y++) {
      var ri = rowOfY[y];
      if (ri < 0) continue;
      if (gapY && y + 1 < H && rowOfY[y + 1] !== ri) continue;
      if (ri !== lastRow) { arr = patternArray(rowPattern[rows[ri]]); lastRow = ri; }
      var base = y * W;
      for (var x = 0; x < W; x++) {
        var c = colOfX[x];
        if (c < 0) continue;
        if (gapAt[x]) continue;
        var cell = arr[c];
        if (cell < 0) continue;
        var col = color[cell];
        if (col === 0) continue;
        u32[base + x] = (kind[cell] === HATCH && ((x + y) & 7) < 3) ? hatch[cell] : col;
      }
    }
    ctx.putImageData(img, px0, py0);
    countDrawn(view);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    drawOverlays(ctx, cssW, cssH, view);
    LAST.renderMs = Math.round((performance.now() - t0) * 10) / 10;
    publish();
  }

  function visibleColumnRange() {
    var lo = Infinity, hi = -1;
    for (var x = 0; x < colOfX.length; x++) { var c = colOfX[x]; if (c >= 0) { if (c < lo) lo = c; if (c > hi) hi = c; } }
    return hi < 0 ? null : [lo, hi];
  }

  function countDrawn(view) {
    // Cells in view whose op is shown, by op label; rows that share a pattern are counted once.
    var byOp = {}, total = 0;
    var range = S.mode === "time" ? visibleColumnRange()
      : [Math.max(0, Math.floor(view.x0)), Math.min(D.ncols, Math.ceil(view.x1)) - 1];
    if (range && range[1] < range[0]) range = null;
    var r0 = Math.max(0, Math.floor(view.r0)), r1 = Math.min(D.rows.length, Math.ceil(view.r1));
    LAST.rows = Math.max(0, r1 - r0);
    LAST.cols = range ? range[1] - range[0] + 1 : 0;
    if (range) {
      var perPattern = new Map();
      for (var r = r0; r < r1; r++) {
        var p = D.g.row_pattern[D.rows[r]];
        perPattern.set(p, (perPattern.get(p) || 0) + 1);
      }
      var counts = new Float64Array(T.op_labels.length);
      perPattern.forEach(function (n, p) {
        var a = patternArray(p);
        for (var c = range[0]; c <= range[1]; c++) {
          var cell = a[c];
          if (cell < 0 || D.color[cell] === 0) continue;
          var lab = D.label[cell];
          if (lab >= 0) counts[lab] += n;
        }
      });
      for (var i = 0; i < counts.length; i++) if (counts[i] > 0) { byOp[T.op_labels[i]] = counts[i]; total += counts[i]; }
    }
    LAST.drawnCells = total;
    LAST.drawnByOp = byOp;
  }

  function yOfRow(pos, view) { return GUTTER_T + (pos - view.r0) / (view.r1 - view.r0) * (geo.H / geo.dpr); }
  function xOfCol(c, view) {
    var w = geo.W / geo.dpr;
    if (S.mode === "time" && D.hasTime) {
      return [GUTTER_L + (D.starts[c] - view.x0) / (view.x1 - view.x0) * w,
        GUTTER_L + (D.ends[c] - view.x0) / (view.x1 - view.x0) * w];
    }
    return [GUTTER_L + (c - view.x0) / (view.x1 - view.x0) * w, GUTTER_L + (c + 1 - view.x0) / (view.x1 - view.x0) * w];
  }

  function drawOverlays(ctx, cssW, cssH, view) {
    var plotW = geo.W / geo.dpr, plotH = geo.H / geo.dpr, g = D.g;
    var rowH = plotH / (view.r1 - view.r0);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    // rank labels: as dense as legible; culprits always
    var step = Math.max(1, Math.ceil(13 / rowH)), r0 = Math.max(0, Math.floor(view.r0)), r1 = Math.min(D.rows.length, Math.ceil(view.r1));
    var culpritYs = D.culpritRows.map(function (pos) { return yOfRow(pos + 0.5, view); });
    ctx.fillStyle = "#5b6475";
    ctx.textAlign = "right";
    for (var r = r0; r < r1; r++) {
      if (r % step !== 0) continue;
      var y = yOfRow(r + 0.5, view);
      if (y < GUTTER_T || y > GUTTER_T + plotH) continue;
      if (culpritYs.some(function (cy) { return Math.abs(cy - y) < 12 && D.culpritRows.indexOf(r) < 0; })) continue;
      ctx.fillText(String(g.ranks[D.rows[r]]), GUTTER_L - 16, y);
    }
    // per-rank live status dots
    if (rowH >= 3 && STATUS && Object.keys(STATUS).length) {
      for (var rs = r0; rs < r1; rs++) {
        var st = STATUS[String(g.ranks[D.rows[rs]])];
        if (!st) continue;
        ctx.fillStyle = statusColor(st.state);
        ctx.fillRect(GUTTER_L - 11, yOfRow(rs, view) + Math.max(0, rowH / 2 - 3), 6, Math.min(6, rowH));
      }
    }
    // column axis
    ctx.textAlign = "center";
    ctx.fillStyle = "#5b6475";
    ctx.textBaseline = "alphabetic";
    var flagCol = primaryColumn(), flagX = null;
    if (flagCol >= 0) {
      var fx = xOfCol(flagCol, view);
      flagX = S.mode === "time" ? fx[0] + Math.min((fx[1] - fx[0]) / 2, 8) : (fx[0] + fx[1]) / 2;
    }
    var ticks = axisTicks(view, plotW).filter(function (t) { return flagX == null || Math.abs(t.x - flagX) > 45; });
    ctx.strokeStyle = "#d8dce3";
    ctx.lineWidth = 1;
    ticks.forEach(function (t) {
      ctx.fillText(t.text, t.x, GUTTER_T - 8);
      ctx.beginPath(); ctx.moveTo(t.x + 0.5, GUTTER_T - 5); ctx.lineTo(t.x + 0.5, GUTTER_T); ctx.stroke();
    });
    LAST.axisSpanMs = S.mode === "time" && D.hasTime ? view.x1 - view.x0 : null;
    LAST.waitMs = null;
    var flagCell = flagCol >= 0 ? D.g.col_cell[flagCol] : -1;
    if (S.mode === "time" && D.hasTime && flagCell >= 0 && T.cells[flagCell][1] === ST_IN_FLIGHT) {
      // The stuck collective's wait, written over its span on the axis.
      var waitMs = D.ends[flagCol] - D.starts[flagCol], wx = xOfCol(flagCol, view);
      var left = Math.max(wx[0], GUTTER_L), right = Math.min(wx[1], GUTTER_L + plotW);
      LAST.waitMs = waitMs;
      if (right - left > 80) {
        ctx.fillStyle = "#c62828";
        ctx.fillText("in flight " + fmtMs(waitMs) + " until the capture", (left + right) / 2, GUTTER_T - 22);
        ctx.fillStyle = "#5b6475";
      }
    }
    ctx.textAlign = "left";
    ctx.fillText(S.mode === "time" ? "time" : "rank \\ #", 4, GUTTER_T - 8);
    // late marks
    if (D.lags.size && rowH >= 4) {
      ctx.fillStyle = "#111";
      D.lags.forEach(function (lag, key) {
        var row = Math.floor(key / D.ncols), col = key % D.ncols, pos = D.posOf[row];
        if (pos < r0 || pos >= r1) return;
        var xs = xOfCol(col, view);
        if (xs[1] < GUTTER_L || xs[0] > GUTTER_L + plotW || xs[1] - xs[0] < 3) return;
        var yy = yOfRow(pos, view);
        ctx.beginPath(); ctx.moveTo(xs[0], yy); ctx.lineTo(xs[0] + Math.min(7, rowH), yy); ctx.lineTo(xs[0], yy + Math.min(7, rowH));
        ctx.fill();
      });
    }
    drawOwnTimes(ctx, view, r0, r1, rowH, plotW, plotH);
    ctx.save();
    ctx.beginPath(); ctx.rect(GUTTER_L - 2, GUTTER_T - 2, plotW + 4, plotH + 4); ctx.clip();
    // finding columns (the stuck collective first)
    var stuckVisible = false, primaryCol = primaryColumn();
    D.findingCols.forEach(function (c) {
      var xs = xOfCol(c, view);
      if (xs[1] < GUTTER_L || xs[0] > GUTTER_L + plotW) return;
      var x0 = xs[0], w = Math.max(3, xs[1] - xs[0]);
      if (c === primaryCol) stuckVisible = true;
      ctx.fillStyle = "rgba(198, 40, 40, 0.08)";
      ctx.fillRect(x0 - 1, GUTTER_T, w + 2, plotH);
      ctx.setLineDash(c === primaryCol ? [5, 3] : [2, 3]);
      ctx.strokeStyle = "#c62828";
      ctx.lineWidth = 2;
      ctx.strokeRect(x0 - 1, GUTTER_T + 1, w + 2, plotH - 2);
    });
    ctx.setLineDash([]);
    ctx.restore();
    if (primaryCol >= 0) { // a flag above the axis: the stuck collective stays findable when it is one pixel wide
      var xsP = xOfCol(primaryCol, view), xm = S.mode === "time" ? xsP[0] + Math.min((xsP[1] - xsP[0]) / 2, 8) : (xsP[0] + xsP[1]) / 2;
      if (xm >= GUTTER_L - 1 && xm <= GUTTER_L + plotW + 1) {
        ctx.fillStyle = "#c62828";
        ctx.beginPath(); ctx.moveTo(xm - 5, GUTTER_T - 9); ctx.lineTo(xm + 5, GUTTER_T - 9); ctx.lineTo(xm, GUTTER_T - 2); ctx.fill();
        ctx.font = "bold 11px system-ui, sans-serif";
        ctx.textBaseline = "alphabetic";
        var label = "stuck #" + g.seqs[primaryCol], tw = ctx.measureText(label).width;
        ctx.fillStyle = "#fff";
        var lx = Math.min(Math.max(xm - tw / 2, GUTTER_L), cssW - tw - 2);
        ctx.fillRect(lx - 2, GUTTER_T - 26, tw + 4, 14);
        ctx.fillStyle = "#c62828";
        ctx.textAlign = "left";
        ctx.fillText(label, lx, GUTTER_T - 15);
      }
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(GUTTER_L - 2, GUTTER_T - 2, plotW + 4, plotH + 4); ctx.clip();
    // culprit rows
    var highlighted = [];
    D.culpritRows.forEach(function (pos) {
      if (pos + 1 <= view.r0 || pos >= view.r1) return;
      highlighted.push(g.ranks[D.rows[pos]]);
      var y0 = yOfRow(pos, view), h = Math.max(3, rowH);
      if (rowH < 3) y0 -= (3 - rowH) / 2;
      ctx.strokeStyle = "#c62828";
      ctx.lineWidth = 2;
      ctx.strokeRect(GUTTER_L, y0, plotW, h);
    });
    // hovered / pinned cell
    [S.pinned, S.hover].forEach(function (h, i) {
      if (!h || h.group !== S.group) return;
      var pos = D.posOf[h.row];
      if (pos < 0) return;
      var xs = xOfCol(h.col, view), y0 = yOfRow(pos, view);
      ctx.strokeStyle = i === 0 ? "#1f5fa8" : "#000";
      ctx.lineWidth = 1.5;
      ctx.strokeRect(xs[0] - 1, y0 - 1, Math.max(3, xs[1] - xs[0]) + 2, Math.max(3, rowH) + 2);
    });
    ctx.restore();
    // culprit labels on top of everything
    ctx.font = "bold 11px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    D.culpritRows.forEach(function (pos) {
      if (pos + 1 <= view.r0 || pos >= view.r1) return;
      var y = yOfRow(pos + 0.5, view);
      ctx.fillStyle = "#fdecea";
      ctx.fillRect(2, y - 7, GUTTER_L - 14, 14);
      ctx.fillStyle = "#c62828";
      ctx.fillText("\u25B6 " + g.ranks[D.rows[pos]], GUTTER_L - 16, y);
    });
    LAST.highlighted = highlighted;
    LAST.stuckVisible = stuckVisible;
  }

  function columnView(c, r0, r1) {
    // a view around column c (and rows r0..r1): the stuck collective, or one jumped to
    if (S.mode === "time" && D.hasTime && D.starts[c] != null) {
      var span = Math.max((D.ends[c] - D.starts[c]) * 3, (D.tMax - D.tMin) / 50);
      return clampView({x0: D.starts[c] - span / 2, x1: D.starts[c] + span / 2, r0: r0, r1: r1});
    }
    return clampView({x0: c - 30, x1: c + 10, r0: r0, r1: r1});
  }

  function primaryColumn() {
    var p = T.primary;
    if (!p || p.group !== D.g.name) return -1;
    var i = D.g.seqs.indexOf(p.seq);
    return i;
  }

  function axisTicks(view, plotW) {
    var out = [], span = view.x1 - view.x0, n = Math.max(2, Math.floor(plotW / 90));
    if (S.mode === "time" && D.hasTime) {
      var raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), stepT = mag;
      [1, 2, 5, 10].some(function (m) { stepT = m * mag; return stepT >= raw; });
      for (var t = Math.ceil(view.x0 / stepT) * stepT; t <= view.x1; t += stepT) {
        out.push({x: GUTTER_L + (t - view.x0) / span * plotW, text: fmtMs(t)});
      }
      return out;
    }
    var stepC = Math.max(1, Math.ceil(span / n));
    var mag2 = Math.pow(10, Math.floor(Math.log10(stepC)));
    [1, 2, 5, 10].some(function (m) { if (m * mag2 >= stepC) { stepC = m * mag2; return true; } return false; });
    for (var c = Math.ceil(view.x0 / stepC) * stepC; c < view.x1; c += stepC) {
      if (c >= D.ncols) break;
      out.push({x: GUTTER_L + (c + 0.5 - view.x0) / span * plotW, text: "#" + D.g.seqs[c]});
    }
    return out;
  }

  function statusColor(state) {
    return {ok: "#2e7d32", progressing: "#2e7d32", idle: "#7cb342", stalled: "#ef6c00", blocked: "#ef6c00",
      unreachable: "#9e9e9e", missing: "#424242", failed: "#c62828", dead: "#c62828"}[state] || "#9e9e9e";
  }

  /* ---------- details ---------- */

  function cellInfo(groupIdx, row, col) {
    var g = T.groups[groupIdx], ncols = g.seqs.length;
    if (row < 0 || row >= g.ranks.length || col < 0 || col >= ncols) return null;
    var cellId;
    if (D && D.g === g) cellId = patternArray(g.row_pattern[row])[col];
    else {
      cellId = g.col_cell[col];
      var runs = g.patterns[g.row_pattern[row]];
      for (var i = 0; i + 2 < runs.length; i += 3) if (col >= runs[i] && col < runs[i] + runs[i + 1]) cellId = runs[i + 2];
    }
    if (cellId == null || cellId < 0) return null;
    var cell = T.cells[cellId], rank = g.ranks[row], op = cell[0];
    var info = {
      rank: rank, group: g.name, group_desc: g.desc, seq: g.seqs[col], state: T.states[cell[1]],
      state_text: STATE_TEXT[cell[1]], op: op >= 0 ? T.op_names[op] : null, op_label: op >= 0 ? T.op_labels[T.op_label_of[op]] : null,
      input_sizes: str(cell[2]), input_dtypes: str(cell[3]), output_sizes: str(cell[4]), output_dtypes: str(cell[5]),
      call_site: str(cell[6]), entries: cell[7], majority: cellId === g.col_cell[col],
      created_ms: g.col_t_ms[col], duration_ms: g.col_dur_ms[col], late_ms: null, culprit: (T.culprit_ranks || []).indexOf(rank) >= 0
    };
    for (var j = 0; j + 2 < g.lags.length; j += 3) if (g.lags[j] === row && g.lags[j + 1] === col) info.late_ms = g.lags[j + 2];
    addOwnTimes(info, groupIdx, row, col);
    if (info.state === "in_flight" && info.created_ms != null && T.captured_ms && T.captured_ms[String(rank)] != null) {
      info.waiting_ms = T.captured_ms[String(rank)] - info.created_ms - (info.late_ms || 0);
    }
    return info;
  }

  function detailLines(info) {
    var lines = [["rank", info.rank + (info.culprit ? "  (culprit)" : "")],
      ["group", info.group + (info.group_desc ? " (" + info.group_desc + ")" : "")],
      ["collective", "#" + info.seq + (info.op ? "  " + info.op + " [" + info.op_label + "]" : "")],
      ["state", info.state_text + (info.majority ? "" : "  \u2260 majority")]];
    if (info.op) {
      lines.push(["input", (info.input_sizes || "-") + "  " + (info.input_dtypes || "")]);
      lines.push(["output", (info.output_sizes || "-") + "  " + (info.output_dtypes || "")]);
      if (info.entries > 1) lines.push(["coalesced", info.entries + " ops share this sequence id"]);
      ownTimeLines(info, lines);
      if (info.waiting_ms != null) lines.push(["waiting", fmtMs(info.waiting_ms) + " until the recorder was read"]);
      lines.push(["call site", info.call_site || "not recorded (no stack in this dump)"]);
    }
    var live = STATUS[String(info.rank)];
    if (live) lines.push(["rank status", live.state + (live.detail ? ": " + live.detail : "")]);
    return lines;
  }

  function hit(evt) {
    if (!geo) return null;
    var rect = $("fr-canvas").getBoundingClientRect();
    var x = Math.floor((evt.clientX - rect.left) * geo.dpr) - geo.px0, y = Math.floor((evt.clientY - rect.top) * geo.dpr) - geo.py0;
    if (x < 0 || y < 0 || x >= geo.W || y >= geo.H) return null;
    var c = colOfX[x], r = rowOfY[y];
    if (c < 0 || r < 0) return null;
    return {group: S.group, row: D.rows[r], col: c, cx: evt.clientX - rect.left, cy: evt.clientY - rect.top};
  }

  function showTooltip(h) {
    var tip = $("fr-tooltip");
    var info = h && cellInfo(h.group, h.row, h.col);
    if (!info) { tip.hidden = true; return; }
    tip.textContent = detailLines(info).map(function (l) { return l[0] + ": " + l[1]; }).join("\n");
    tip.hidden = false;
    var wrap = $("fr-canvas-wrap").clientWidth;
    tip.style.left = Math.min(h.cx + 14, Math.max(0, wrap - 470)) + "px";
    tip.style.top = (h.cy + 16) + "px";
  }

  function showDetails(h) {
    var box = $("fr-details");
    clear(box);
    var info = h && cellInfo(h.group, h.row, h.col);
    if (!info) { box.appendChild(el("div", {class: "hint", text: "Click a cell for its details; wheel to zoom (shift: ranks), drag to pan, double-click to reset."})); return; }
    var table = el("table");
    detailLines(info).forEach(function (l) { table.appendChild(el("tr", null, el("td", {text: l[0]}), el("td", {text: l[1]}))); });
    box.appendChild(table);
  }

  /* ---------- toolbar ---------- */

  function buildToolbar() {
    fillGroups();
    var ops = $("fr-ops");
    clear(ops);
    T.op_labels.forEach(function (lab) {
      var cb = el("input", {type: "checkbox", value: lab, "data-op": lab});
      cb.checked = !S.ops || S.ops.has(lab);
      cb.addEventListener("change", function () { readOps(); });
      ops.appendChild(el("label", null, cb, el("span", {class: "swatch", style: "background:" + rgb(OP_COLORS[lab] || OP_COLORS.OTHER)}), lab));
    });
    var states = $("fr-states");
    clear(states);
    var sample = [0, 114, 178], white = [255, 255, 255];
    [["completed", rgb(sample)], ["started", rgb(mix(sample, white, 0.3))], ["scheduled", rgb(mix(sample, white, 0.62))],
      ["in flight", "repeating-linear-gradient(135deg," + rgb(sample) + " 0 3px," + rgb(mix(sample, [0, 0, 0], 0.55)) + " 3px 5px)"],
      ["never entered", rgb(ABSENT_RGB[4])], ["evicted", rgb(ABSENT_RGB[5])], ["no dump", rgb(ABSENT_RGB[6])]]
      .forEach(function (s) { states.appendChild(el("span", null, el("span", {class: "swatch", style: "background:" + s[1]}), s[0])); });
    states.appendChild(el("span", null, el("span", {class: "swatch", style: "border:2px solid #c62828;background:#fff"}), "culprit rank / stuck collective"));
    if (T.lags && T.groups.some(function (g) { return g.lags.length; })) states.appendChild(el("span", {text: "\u25E4 late > " + fmtMs(T.lag_threshold_ms)}));
    var timeOpt = $("fr-mode-time");
    timeOpt.disabled = !T.groups.some(function (g) { return g.col_t_ms.some(function (t) { return t != null; }); });
    $("fr-sampled").textContent = D && D.g.sampled ? "showing " + D.g.seqs.length + " of " + (D.g.seqs.length + D.g.columns_dropped) + " collectives (sampled; finding columns and the last ones always kept)" : "";
  }

  function readOps() {
    var boxes = $("fr-ops").querySelectorAll("input[type=checkbox]"), on = new Set(), all = true;
    boxes.forEach(function (b) { if (b.checked) on.add(b.value); else all = false; });
    S.ops = all ? null : on;
    buildColors();
    render();
    changed();
  }

  function wire() {
    $("fr-group").addEventListener("change", function () { api.setGroup(+this.value, true); });
    $("fr-ranks").addEventListener("change", function () {
      var text = this.value;
      try { parseRankList(text); } catch (err) { this.setCustomValidity(err.message); this.title = err.message; return; }
      this.setCustomValidity(""); this.title = "";
      api.setRanks(text);
    });
    $("fr-mode-seq").addEventListener("change", function () { api.setMode("seq"); });
    $("fr-mode-time").addEventListener("change", function () { api.setMode("time"); });
    $("fr-zoom-stuck").addEventListener("click", function () { api.zoomToStuck(); });
    $("fr-reset").addEventListener("click", function () { api.reset(); });
    $("fr-ops-all").addEventListener("click", function () { api.setOps(null); });
    var canvas = $("fr-canvas"), drag = null;
    canvas.addEventListener("mousemove", function (e) {
      if (drag) {
        var v = S.view, dx = (e.clientX - drag.x) * geo.dpr / geo.W * (v.x1 - v.x0), dy = (e.clientY - drag.y) * geo.dpr / geo.H * (v.r1 - v.r0);
        if (Math.abs(e.clientX - drag.x) + Math.abs(e.clientY - drag.y) > 2) drag.moved = true;
        S.view = clampView({x0: drag.v.x0 - dx, x1: drag.v.x1 - dx, r0: drag.v.r0 - dy, r1: drag.v.r1 - dy});
        schedule();
        return;
      }
      var h = hit(e);
      S.hover = h;
      showTooltip(h);
      schedule();
    });
    canvas.addEventListener("mouseleave", function () { S.hover = null; $("fr-tooltip").hidden = true; schedule(); });
    canvas.addEventListener("mousedown", function (e) { drag = {x: e.clientX, y: e.clientY, v: S.view, moved: false}; });
    window.addEventListener("mouseup", function (e) {
      if (drag && !drag.moved && e.target === canvas) { S.pinned = hit(e); showDetails(S.pinned); schedule(); }
      drag = null;
    });
    canvas.addEventListener("dblclick", function () { api.reset(); });
    canvas.addEventListener("wheel", function (e) {
      e.preventDefault();
      var h = hit(e), v = S.view, f = e.deltaY > 0 ? 1.25 : 0.8;
      var rect = canvas.getBoundingClientRect();
      if (e.shiftKey) {
        var fy = Math.min(1, Math.max(0, ((e.clientY - rect.top) * geo.dpr - geo.py0) / geo.H)), ry = v.r0 + fy * (v.r1 - v.r0);
        S.view = clampView({x0: v.x0, x1: v.x1, r0: ry - (ry - v.r0) * f, r1: ry + (v.r1 - ry) * f});
      } else {
        var fx = Math.min(1, Math.max(0, ((e.clientX - rect.left) * geo.dpr - geo.px0) / geo.W)), cx = v.x0 + fx * (v.x1 - v.x0);
        S.view = clampView({x0: cx - (cx - v.x0) * f, x1: cx + (v.x1 - cx) * f, r0: v.r0, r1: v.r1});
      }
      S.hover = h;
      schedule();
    }, {passive: false});
    var resizeTimer = null;
    window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(render, 100); });
  }

  var pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; render(); });
  }

  function publish() {
    var canvas = $("fr-canvas");
    canvas.setAttribute("data-drawn-cells", String(LAST.drawnCells));
    canvas.setAttribute("data-drawn-ops", JSON.stringify(LAST.drawnByOp));
    canvas.setAttribute("data-culprit-ranks", JSON.stringify(T.culprit_ranks || []));
    canvas.setAttribute("data-highlighted-ranks", JSON.stringify(LAST.highlighted));
    canvas.setAttribute("data-group", D.g.name);
    canvas.setAttribute("data-render-ms", String(LAST.renderMs));
    canvas.setAttribute("data-stuck-visible", String(LAST.stuckVisible));
    document.body.setAttribute("data-revision", REVISION == null ? "" : String(REVISION));
    document.body.setAttribute("data-ready", "true");
  }

  function defaultGroup() {
    var p = T.primary, idx = 0;
    if (p) T.groups.forEach(function (g, i) { if (g.name === p.group) idx = i; });
    else {
      var best = -1;
      T.groups.forEach(function (g, i) { if (g.ranks.length > best) { best = g.ranks.length; idx = i; } });
    }
    return idx;
  }

  var api = {
    load: function (data) {
      var sameGroup = T && D && data.timeline && data.timeline.groups && S.group < data.timeline.groups.length &&
        data.timeline.groups[S.group].name === D.g.name;
      R = data.report || null;
      LIVE = data.live || LIVE;
      STATUS = data.status || {};
      REVISION = data.revision != null ? data.revision : REVISION;
      var tl = data.timeline;
      renderHeader(tl);
      renderFindings();
      renderPerf(data.perf || null);
      if (!tl || !tl.groups || !tl.groups.length) {
        T = tl || null;
        $("fr-timeline-body").hidden = true;
        $("fr-empty").hidden = false;
        document.body.setAttribute("data-ready", "true");
        document.body.setAttribute("data-revision", REVISION == null ? "" : String(REVISION));
        return;
      }
      $("fr-timeline-body").hidden = false;
      $("fr-empty").hidden = true;
      // a view the person zoomed or panned is kept; one showing everything follows the new data (live)
      var keepView = sameGroup && S.view && !isFullView(S.view);
      T = tl;
      if (!sameGroup) S.group = defaultGroup();
      var view = S.view;
      derive();
      S.view = keepView ? view : null;
      if (S.pinned && S.pinned.group === S.group) showDetails(S.pinned); else { S.pinned = null; showDetails(null); }
      buildToolbar();
      render();
      changed();
    },
    state: function () {
      return {
        group: D ? D.g.name : null, mode: S.mode, ops: S.ops ? Array.from(S.ops).sort() : null,
        ranks: S.rankText, states: S.states ? Array.from(S.states).map(function (i) { return T.states[i]; }).sort() : null,
        rankRange: rankRangeOf(S.ranks), view: S.view, drawnCells: LAST.drawnCells, drawnByOp: LAST.drawnByOp,
        culpritRanks: T ? (T.culprit_ranks || []) : [], highlightedRanks: LAST.highlighted, stuckVisible: LAST.stuckVisible,
        stuck: T ? T.primary : null, axisSpanMs: LAST.axisSpanMs, ownMarks: LAST.ownMarks || 0, waitMs: LAST.waitMs, renderMs: LAST.renderMs, rows: LAST.rows, cols: LAST.cols, revision: REVISION,
        verdict: R ? R.verdict : null, status: STATUS
      };
    },
    setOps: function (labels) {
      S.ops = labels == null ? null : new Set(labels);
      $("fr-ops").querySelectorAll("input[type=checkbox]").forEach(function (b) { b.checked = !S.ops || S.ops.has(b.value); });
      buildColors();
      render();
      changed();
    },
    setGroup: function (which, fromUi) {
      var idx = typeof which === "number" && fromUi ? which : -1;
      if (idx < 0) T.groups.forEach(function (g, i) { if (g.name === String(which)) idx = i; });
      if (idx < 0) throw new Error("no group " + which);
      S.group = idx; S.view = null; S.pinned = null;
      $("fr-group").value = String(idx);
      derive(); showDetails(null); buildToolbar(); render(); changed();
    },
    setRankRange: function (lo, hi) { api.setRanks(lo == null ? "" : lo + "-" + hi); },
    setRanks: function (text) {
      // a rank list like the CLI's --rank (0-7,12); throws on bad input, naming the bad part
      var ranges = parseRankList(text || "");
      S.ranks = ranges.length ? ranges : null; S.rankText = ranges.length ? String(text).trim() : ""; S.view = null;
      $("fr-ranks").value = S.rankText;
      derive(); render(); changed();
    },
    setStates: function (names) {
      S.states = names == null ? null : new Set(names.map(function (n) {
        var i = T.states.indexOf(n);
        if (i < 0) throw new Error("no state " + n + " (one of " + T.states.join(", ") + ")");
        return i;
      }));
      syncStateBoxes(); buildColors(); render(); changed();
    },
    setMode: function (mode) {
      S.mode = mode === "time" ? "time" : "seq"; S.view = null;
      $("fr-mode-" + S.mode).checked = true;
      render();
    },
    zoomToStuck: function () {
      var c = primaryColumn();
      if (c < 0 && D.findingCols.length) c = D.findingCols[0];
      if (c < 0) return;
      S.view = columnView(c, 0, D.rows.length);
      render();
    },
    reset: function () { S.view = null; render(); },
    cellAt: function (rank, seq, group) {
      var gi = group == null ? S.group : -1;
      if (gi < 0) T.groups.forEach(function (g, i) { if (g.name === String(group)) gi = i; });
      var g = T.groups[gi];
      return cellInfo(gi, g.ranks.indexOf(rank), g.seqs.indexOf(seq));
    },
    cellBox: function (rank, seq) {
      // where a cell is drawn, in CSS pixels relative to the canvas (null when not in view)
      var row = D.g.ranks.indexOf(rank), col = D.g.seqs.indexOf(seq), pos = row < 0 ? -1 : D.posOf[row];
      if (pos < 0 || col < 0 || !geo) return null;
      var xs = xOfCol(col, geo.view), y0 = yOfRow(pos, geo.view), y1 = yOfRow(pos + 1, geo.view);
      if (xs[1] < GUTTER_L || xs[0] > GUTTER_L + geo.W / geo.dpr || y1 < GUTTER_T || y0 > GUTTER_T + geo.H / geo.dpr) return null;
      return {x: xs[0], y: y0, w: xs[1] - xs[0], h: y1 - y0, cx: (xs[0] + xs[1]) / 2, cy: (y0 + y1) / 2};
    },
    render: render
  };
  window.frscope = api;

  function start() {
    var node = $("frscope-data");
    var data = JSON.parse(node.textContent);
    SYNTAX = data.syntax || SYNTAX;
    wire();
    wireList();
    api.load(data);
    if (data.live) startLive(data.live);
  }
