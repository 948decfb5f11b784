// The target page's charts, drawn by uPlot (vendor/uPlot.iife.min.js, MIT). Data comes from
// /target/N/series.json?range=R, downsampled on the server (mean per bucket, with its min-max band).
//
// What each chart gives the reader:
// - y ticks at 1, 2 or 5 x 10^n; a second axis on the right where units differ (ITL in ms beside TTFT in s);
// - times in UTC, like the evidence and the findings;
// - hover: the legend reads every series at the cursor (the latest values otherwise), and the cursor is
//   synced across the charts;
// - shaded bands where a finding at warning or above fires now (colour by severity, the rules named at the
//   band's start in labels that never overlap), listed above the charts with the ones that fired earlier;
// - drag across a chart to zoom all of them, double-click (or "reset zoom") to follow the range again; the
//   zoom survives the live refresh, and so does the range picked.
(function () {
  "use strict";
  var root = document.getElementById("charts");
  if (!root || !window.uPlot) { return; }
  var uPlot = window.uPlot;
  var tid = root.getAttribute("data-target");
  var range = "1h";
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
  var SEV = { critical: [185, 28, 28], warning: [180, 83, 9], info: [29, 78, 216] };
  var INCRS = [];
  for (var e = -6; e <= 9; e++) { [1, 2, 5].forEach(function (m) { INCRS.push(+(m + "e" + e)); }); }
  var WHOLE = INCRS.filter(function (v) { return v >= 1; });  // counts (requests, tokens) tick at whole numbers
  function incrsFor(unit) { return unit === "requests" || unit === "tokens" ? WHOLE : INCRS; }
  var specs = null, doc = null, zoom = null;
  var plots = {};  // chart id -> {u, layout}

  function decimals(step) { return step >= 1 ? 0 : Math.min(6, Math.ceil(-Math.log10(step) - 1e-9)); }
  function num(v, digits) {
    if (v === null || v === undefined || isNaN(v)) { return "–"; }
    var a = Math.abs(v);
    if (a >= 1e6) { return (v / 1e6).toFixed(2) + "M"; }
    if (a >= 1e4) { return (v / 1e3).toFixed(1) + "k"; }
    if (digits !== undefined) { return v.toFixed(digits); }
    if (a >= 100 || Number.isInteger(v)) { return v.toFixed(0); }
    if (a >= 10) { return v.toFixed(1); }
    if (a === 0) { return "0"; }
    return v.toPrecision(3).replace(/\.?0+$/, "");
  }
  function ticks(u, splits, axisIdx, space, incr) {  // one unit per axis: 0 200 400 … or 0 5k 10k …
    var top = Math.max.apply(null, splits.map(Math.abs));
    var div = top >= 1e6 ? 1e6 : (top >= 1e4 ? 1e3 : 1), suf = div === 1e6 ? "M" : (div === 1e3 ? "k" : "");
    var d = decimals((incr || 1) / div);
    var out = splits.map(function (v) { return v === 0 ? "0" : (v / div).toFixed(d) + suf; });
    (u._ticks = u._ticks || {})[axisIdx] = { splits: splits, incr: incr, labels: out };  // published for the tests (publish())
    return out;
  }
  function pad2(n) { return String(n).padStart(2, "0"); }
  function hms(t) { var d = new Date(t * 1000); return pad2(d.getUTCHours()) + ":" + pad2(d.getUTCMinutes()) + ":" + pad2(d.getUTCSeconds()); }
  function timeTicks(u, splits) {  // 24-hour UTC clock; seconds on short spans, the date on long ones
    var span = u.scales.x.max - u.scales.x.min;
    var out = splits.map(function (t) {
      var d = new Date(t * 1000), hm = pad2(d.getUTCHours()) + ":" + pad2(d.getUTCMinutes());
      if (span <= 600) { return hm + ":" + pad2(d.getUTCSeconds()); }
      if (span > 86400) { return pad2(d.getUTCMonth() + 1) + "-" + pad2(d.getUTCDate()) + " " + hm; }
      return hm;
    });
    (u._ticks = u._ticks || {})[0] = { splits: splits, labels: out };
    return out;
  }
  function publish(fig) {  // what was drawn, as attributes a test (or a curious reader) can check
    return function (u) {
      fig.setAttribute("data-ticks", JSON.stringify(u._ticks || {}));
      fig.setAttribute("data-bands", String(u._bands || 0));
      fig.setAttribute("data-axes", u.axes.slice(1).map(function (a) { return a.scale + ":" + (a.label || ""); }).join(","));
    };
  }
  function utcDate(ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); }
  function rgba(c, a) { return "rgba(" + c[0] + "," + c[1] + "," + c[2] + "," + a + ")"; }

  function viewRange() {
    if (zoom) { return zoom; }
    var x0 = doc.start, x1 = doc.end, first = null;
    Object.keys(doc.series).forEach(function (k) { var t = doc.series[k].t; if (t.length && (first === null || t[0] < first)) { first = t[0]; } });
    if (first !== null && first > x0) { x0 = Math.max(x0, first - Math.max(2, (x1 - first) * 0.03)); }  // less data than the range: fit it
    return [x0, x1];
  }

  // the table uPlot draws: [times, series…]; a downsampled series adds its min and max (a band)
  function build(spec) {
    var tables = [], series = [], bands = [], latest = [null], drawn = 0;
    var axes = spec.axes || { y: { unit: "" } };
    spec.signals.forEach(function (sig, i) {
      var s = doc.series[sig[0]];
      if (!s || !s.t.length) { return; }
      var axis = sig[2] || "y", f = (axes[axis] && axes[axis].factor) || 1;
      var scale = function (arr) { return arr.map(function (v) { return v === null ? null : v * f; }); };
      var color = COLORS[i % COLORS.length];
      var unit = (axes[axis] && axes[axis].unit) || "";
      var lastv = null;
      for (var q = s.v.length - 1; q >= 0; q--) { if (s.v[q] !== null) { lastv = s.v[q] * f; break; } }
      s.v.forEach(function (v) { if (v !== null) { drawn++; } });
      var cols = [s.t, scale(s.v)];
      series.push({ label: sig[1], scale: axis, stroke: color, width: 1.6, points: { show: s.t.length < 3 }, spanGaps: false,
                    unit: unit, value: valueFn(unit) });
      latest.push(lastv);
      if (s.min && s.max) {
        cols.push(scale(s.max), scale(s.min));
        var hiIdx = series.length + 1;  // uPlot's index of the max series (0 is time)
        series.push({ label: sig[1] + " max", scale: axis, stroke: "transparent", points: { show: false }, band: true, value: valueFn(unit) });
        series.push({ label: sig[1] + " min", scale: axis, stroke: "transparent", points: { show: false }, band: true, value: valueFn(unit) });
        bands.push({ series: [hiIdx, hiIdx + 1], fill: color + "22" });
        latest.push(null, null);
      }
      tables.push(cols);
    });
    var data = tables.length ? uPlot.join(tables) : [[]];
    return { data: data, series: series, bands: bands, latest: latest, drawn: drawn, layout: series.map(function (s) { return s.label + "|" + s.scale; }).join(",") };
  }
  function valueFn(unit) {
    return function (u, v, si, idx) {
      if (idx === null || idx === undefined) { v = u._latest ? u._latest[si] : v; }
      return v === null || v === undefined ? "–" : num(v) + (unit && unit !== "requests" ? " " + unit : "");
    };
  }

  function yRange(spec, axis) {
    return function (u, lo, hi) {
      var top = hi === null || hi === undefined || isNaN(hi) ? 0 : hi;
      if (axis === "y") {
        var ref = doc.lines[spec.id];
        if (ref && ref.value > top) { top = ref.value; }
        if (spec.ref && spec.ref > top) { top = spec.ref; }
        if (spec.ymax) { top = Math.max(top, spec.ymax); }
      }
      if (top <= 0) { top = 1; }
      return [0, top * 1.08];
    };
  }

  function spans() {  // findings that fired at about the same time share one label
    var out = [];
    (doc.marks || []).slice().sort(function (a, b) { return a.start - b.start; }).forEach(function (m) {
      var end = m.end === null ? doc.end : m.end, g = out[out.length - 1];
      if (g && m.start - g.start <= Math.max(5, (doc.end - doc.start) / 100)) {
        if (g.rules.indexOf(m.rule) < 0) { g.rules.push(m.rule); }
        g.end = Math.max(g.end, end);
        if ((SEV_RANK[m.severity] || 0) > (SEV_RANK[g.severity] || 0)) { g.severity = m.severity; }
      } else {
        out.push({ start: m.start, end: end, rules: [m.rule], severity: m.severity });
      }
    });
    return out;
  }
  var SEV_RANK = { info: 1, warning: 2, critical: 3 };
  function marksHook(u) {  // shaded bands where findings at warning or above fire now, under the lines
    var ctx = u.ctx, b = u.bbox, xs = u.scales.x, dpr = devicePixelRatio || 1;
    var groups = spans();
    u._bands = groups.filter(function (g) { return g.end >= xs.min && g.start <= xs.max; }).length;
    ctx.save();
    ctx.beginPath(); ctx.rect(b.left, b.top, b.width, b.height); ctx.clip();
    groups.forEach(function (g) {
      var s = Math.max(g.start, xs.min), en = Math.min(g.end, xs.max);
      if (en < s) { return; }
      var c = SEV[g.severity] || SEV.warning;
      var x0 = u.valToPos(s, "x", true), x1 = u.valToPos(en, "x", true);
      ctx.fillStyle = rgba(c, 0.09);
      ctx.fillRect(x0, b.top, Math.max(2 * dpr, x1 - x0), b.height);
      if (g.start >= xs.min) {  // the moment it fired: a solid edge
        ctx.fillStyle = rgba(c, 0.85);
        ctx.fillRect(x0, b.top, 2 * dpr, b.height);
      }
    });
    ctx.restore();
  }
  // the rules' names at each band's start, as elements over the plot: laid out in up to three rows so that
  // no two overlap (a label with no room in any row is left out; the legend above the charts names it)
  function labelsHook(u) {
    var over = u.over, xs = u.scales.x, W = over.clientWidth;
    over.querySelectorAll(".band-label").forEach(function (el) { el.remove(); });
    var rowsEnd = [-1e9, -1e9, -1e9], shown = [];
    spans().forEach(function (g) {
      if (g.end < xs.min || g.start > xs.max) { return; }
      var c = SEV[g.severity] || SEV.warning;
      var el = document.createElement("span");
      el.className = "band-label sev-" + g.severity;
      el.textContent = g.rules.join(", ");
      el.title = g.rules.join(", ") + " (" + g.severity + ") since " + hms(g.start);
      el.style.color = rgba(c, 1);
      over.appendChild(el);
      var w = el.offsetWidth, x = Math.max(0, u.valToPos(Math.max(g.start, xs.min), "x") + 3);
      if (x + w > W) {  // near the right edge: cut the name to the room beside its band (the title has it whole)
        if (W - x >= Math.min(w, 56)) { el.style.maxWidth = (W - x) + "px"; w = W - x; } else { x = Math.max(0, W - w); }
      }
      var row = -1;
      for (var r = 0; r < rowsEnd.length; r++) { if (x >= rowsEnd[r] + 4) { row = r; break; } }
      if (row < 0) { el.remove(); return; }
      rowsEnd[row] = x + w;
      el.style.left = x + "px";
      el.style.top = (row * 14) + "px";
      shown.push(g.rules.join(", "));
    });
    u.root.parentNode.setAttribute("data-labels", JSON.stringify(shown));
  }
  function refHook(spec) {  // reference lines: the pool full, max_running_requests
    return function (u) {
      var lines = [];
      if (spec.ref) { lines.push([spec.ref, "#991b1b", "full " + spec.ref]); }
      var ref = doc.lines[spec.id];
      if (ref) { lines.push([ref.value, "#92400e", ref.label + " " + num(ref.value)]); }
      var ctx = u.ctx, b = u.bbox;
      lines.forEach(function (l) {
        var y = u.valToPos(l[0], "y", true);
        ctx.save(); ctx.setLineDash([5 * devicePixelRatio, 4 * devicePixelRatio]); ctx.strokeStyle = l[1]; ctx.lineWidth = devicePixelRatio;
        ctx.beginPath(); ctx.moveTo(b.left, y); ctx.lineTo(b.left + b.width, y); ctx.stroke(); ctx.restore();
        ctx.save(); ctx.fillStyle = l[1]; ctx.font = (10 * devicePixelRatio) + "px system-ui, sans-serif"; ctx.textAlign = "right";
        ctx.textBaseline = "bottom"; ctx.fillText(l[2], b.left + b.width - 4, y - 2); ctx.restore();
      });
      if (!u.data[0].length) {
        ctx.save(); ctx.fillStyle = "#9ca3af"; ctx.textAlign = "center"; ctx.font = (12 * devicePixelRatio) + "px system-ui, sans-serif";
        ctx.fillText("no data in this range", b.left + b.width / 2, b.top + b.height / 2); ctx.restore();
      }
    };
  }

  function size(fig) {
    var w = Math.max(200, fig.querySelector(".plot").clientWidth || fig.clientWidth - 16);
    return { width: w, height: window.innerWidth < 600 ? 170 : 200 };
  }

  function setZoom(z) {
    zoom = z;
    document.getElementById("unzoom").hidden = !z;
    var r = viewRange();
    Object.keys(plots).forEach(function (id) { plots[id].u.setScale("x", { min: r[0], max: r[1] }); });
    root.setAttribute("data-view", r[0] + "," + r[1]);
    root.setAttribute("data-zoomed", z ? "yes" : "no");
  }

  function create(fig, spec, b) {
    var axes = spec.axes || { y: { unit: "" } };
    var yAxes = [{ scale: "y", size: 50, space: 24, incrs: incrsFor(axes.y.unit), values: ticks, label: axes.y.unit && axes.y.unit !== "requests" ? axes.y.unit : "", labelSize: 14, labelGap: 0, grid: { stroke: "#eef0f3" } }];
    var scales = { x: { time: true, auto: false, range: function (u, lo, hi) { return [lo, hi]; } }, y: { range: yRange(spec, "y") } };
    if (axes.y2) {
      yAxes.push({ scale: "y2", side: 1, size: 50, space: 24, incrs: incrsFor(axes.y2.unit), values: ticks, label: axes.y2.unit, labelSize: 14, labelGap: 0, grid: { show: false } });
      scales.y2 = { range: yRange(spec, "y2") };
    }
    var opts = {
      width: size(fig).width, height: size(fig).height,
      tzDate: utcDate,
      scales: scales,
      series: [{ label: "UTC", value: function (u, t, si, idx) {
        if (idx === null || idx === undefined) { var x = u.data[0]; return x.length ? hms(x[x.length - 1]) + " (latest)" : "–"; }
        return hms(t);
      } }].concat(b.series),
      bands: b.bands,
      axes: [{ grid: { stroke: "#eef0f3" }, space: 60, values: timeTicks }].concat(yAxes),
      legend: { live: true },
      cursor: { sync: { key: "diagnoser-" + tid }, drag: { x: true, y: false, setScale: false },
                bind: { dblclick: function () { return function () { setZoom(null); return null; }; } } },
      hooks: {
        drawClear: [marksHook],
        draw: [refHook(spec), labelsHook, publish(fig)],
        setSelect: [function (u) {  // the reader dragged across a chart: zoom every chart to that window
          if (u.select.width < 4) { return; }
          var lo = u.posToVal(u.select.left, "x"), hi = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          if (hi > lo) { setZoom([lo, hi]); }
        }],
      },
    };
    var u = new uPlot(opts, b.data, fig.querySelector(".plot"));
    u._latest = b.latest;
    u.root.querySelectorAll(".u-legend .u-series").forEach(function (row, i) {  // the min/max series of a band are not shown
      if (i > 0 && b.series[i - 1].band) { row.style.display = "none"; }
    });
    return u;
  }

  function render() {
    if (!doc || !specs) { return; }
    var empty = Object.keys(doc.series).every(function (k) { return !doc.series[k].t.length; });
    root.hidden = empty;  // six empty frames say less than one sentence
    var none = document.getElementById("no-data");
    if (none) { none.hidden = !empty; }
    if (empty) { legendMarks(); return; }
    var r = viewRange();
    root.querySelectorAll("figure.chart").forEach(function (fig) {
      var id = fig.getAttribute("data-chart"), spec = specs[id];
      if (!spec) { return; }
      var b = build(spec), p = plots[id];
      if (!p || p.layout !== b.layout) {
        if (p) { p.u.destroy(); }
        p = plots[id] = { u: create(fig, spec, b), layout: b.layout };
      } else {
        p.u._latest = b.latest;
        p.u.setData(b.data, false);
      }
      p.u.setScale("x", { min: r[0], max: r[1] });
      fig.setAttribute("data-points", String(b.drawn));
    });
    legendMarks();
    root.setAttribute("data-view", r[0] + "," + r[1]);
    root.setAttribute("data-drawn", String(Date.now()));
  }

  function legendMarks() {
    var el = document.getElementById("marks-legend");
    if (!el) { return; }
    var gs = spans().slice(-4), past = (doc.resolved_marks || []).slice(-4);
    var parts = [];
    if (gs.length) {
      parts.push("Shaded where findings at warning or above fire now: " + gs.map(function (g) {
        return g.rules.join(", ") + " since " + hms(g.start);
      }).join(" · "));
    }
    if (past.length) {
      parts.push("Fired earlier, resolved (not shaded): " + past.map(function (m) {
        return m.rule + " " + hms(m.start) + " → " + hms(m.end);
      }).join(" · "));
    }
    el.textContent = parts.join(". ");
    el.hidden = !parts.length;
  }

  function load() {
    var get = function (u) { return fetch(u, { credentials: "same-origin", cache: "no-store" }).then(function (r) { return r.json(); }); };
    var first = specs ? Promise.resolve(null) : get("/target/" + tid + ".json");
    first.then(function (d) {
      if (d) { specs = {}; d.charts.forEach(function (c) { specs[c.id] = c; }); }
      return get("/target/" + tid + "/series.json?range=" + range);
    }).then(function (d) { doc = d; render(); }).catch(function () {});
  }

  document.querySelectorAll("#zoom button[data-range]").forEach(function (b) {
    b.addEventListener("click", function () {
      range = b.getAttribute("data-range");
      document.querySelectorAll("#zoom button[data-range]").forEach(function (o) { o.classList.toggle("on", o === b); });
      zoom = null;
      document.getElementById("unzoom").hidden = true;
      load();
    });
  });
  document.getElementById("unzoom").addEventListener("click", function () { setZoom(null); });
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () {
      root.querySelectorAll("figure.chart").forEach(function (fig) {
        var p = plots[fig.getAttribute("data-chart")];
        if (p) { p.u.setSize(size(fig)); }
      });
    }, 100);
  });
  load();
  setInterval(load, Math.max(1, window.diagnoserInterval || 5) * 1000);
})();
