// Small canvas line charts for the target page (no third-party code). Data comes from
// /target/N/series.json?range=R, already downsampled on the server (at most ~600 points per series).
(function () {
  "use strict";
  var root = document.getElementById("charts");
  if (!root) { return; }
  var tid = root.getAttribute("data-target");
  var range = "1h";
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
  var CHARTS = null;
  var last = null;

  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) { return "–"; }
    var a = Math.abs(v);
    if (a >= 1e6) { return (v / 1e6).toFixed(1) + "M"; }
    if (a >= 1e4) { return (v / 1e3).toFixed(0) + "k"; }
    if (a >= 100) { return v.toFixed(0); }
    if (a >= 1) { return v.toFixed(1); }
    if (a === 0) { return "0"; }
    return v.toPrecision(2);
  }
  function tlabel(t, span) {
    var d = new Date(t * 1000);
    var hh = String(d.getHours()).padStart(2, "0"), mm = String(d.getMinutes()).padStart(2, "0");
    if (span <= 900) { return hh + ":" + mm + ":" + String(d.getSeconds()).padStart(2, "0"); }
    return hh + ":" + mm;
  }

  function draw(fig, spec, doc) {
    var canvas = fig.querySelector("canvas");
    var legend = fig.querySelector(".legend");
    var dpr = window.devicePixelRatio || 1;
    var w = canvas.clientWidth || 560, h = canvas.clientHeight || 200;
    canvas.width = w * dpr; canvas.height = h * dpr;
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    var pad = { l: 48, r: 10, t: 8, b: 22 };
    var x0 = doc.start, x1 = doc.end, first = null;
    Object.keys(doc.series).forEach(function (k) { var t = doc.series[k].t; if (t.length && (first === null || t[0] < first)) { first = t[0]; } });
    if (first !== null && first > x0) { x0 = Math.max(x0, first - Math.max(2, (x1 - first) * 0.03)); }  // less data than the range: fit it
    var ymax = 0, any = false;
    var lines = [];
    spec.signals.forEach(function (pair, i) {
      var s = doc.series[pair[0]];
      if (!s || !s.t.length) { return; }
      lines.push({ label: pair[1], s: s, color: COLORS[i % COLORS.length] });
      (s.max || s.v).forEach(function (v) { if (v !== null && v > ymax) { ymax = v; } any = any || v !== null; });
    });
    var ref = doc.lines[spec.id];
    if (ref && ref.value > ymax) { ymax = ref.value; }
    if (spec.ref && spec.ref > ymax) { ymax = spec.ref; }
    if (spec.ymax) { ymax = Math.max(ymax, spec.ymax); }
    if (ymax <= 0) { ymax = 1; }
    ymax *= 1.08;
    var X = function (t) { return pad.l + (t - x0) / Math.max(1, x1 - x0) * (w - pad.l - pad.r); };
    var Y = function (v) { return h - pad.b - v / ymax * (h - pad.t - pad.b); };
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#e5e7eb"; ctx.fillStyle = "#6b7280"; ctx.lineWidth = 1;
    for (var g = 0; g <= 4; g++) {
      var v = ymax / 1.08 * g / 4, y = Y(v);
      ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(w - pad.r, y); ctx.stroke();
      ctx.textAlign = "right"; ctx.fillText(fmt(v), pad.l - 4, y + 4);
    }
    ctx.textAlign = "center";
    for (var k = 0; k <= 4; k++) {
      var t = x0 + (x1 - x0) * k / 4;
      ctx.textAlign = k === 0 ? "left" : (k === 4 ? "right" : "center");
      ctx.fillText(tlabel(t, x1 - x0), X(t), h - 6);
    }
    function hline(val, color, label) {
      ctx.save(); ctx.setLineDash([5, 4]); ctx.strokeStyle = color; ctx.beginPath();
      ctx.moveTo(pad.l, Y(val)); ctx.lineTo(w - pad.r, Y(val)); ctx.stroke(); ctx.restore();
      ctx.fillStyle = color; ctx.textAlign = "right"; ctx.fillText(label, w - pad.r - 2, Y(val) - 3);
    }
    if (spec.ref) { hline(spec.ref, "#991b1b", "full " + spec.ref); }
    if (ref) { hline(ref.value, "#92400e", ref.label + " " + fmt(ref.value)); }
    var drawn = 0;
    lines.forEach(function (ln) {
      var s = ln.s;
      if (s.min && s.max) {  // downsampled: shade the min–max band
        ctx.fillStyle = ln.color + "22";
        for (var i = 0; i < s.t.length; i++) {
          if (s.min[i] === null) { continue; }
          ctx.fillRect(X(s.t[i]) - 0.5, Y(s.max[i]), 1.5, Math.max(1, Y(s.min[i]) - Y(s.max[i])));
        }
      }
      ctx.strokeStyle = ln.color; ctx.lineWidth = 1.6; ctx.beginPath();
      var pen = false;
      for (var j = 0; j < s.t.length; j++) {
        var val = s.v[j];
        if (val === null) { pen = false; continue; }
        var px = X(s.t[j]), py = Y(val);
        if (pen) { ctx.lineTo(px, py); } else { ctx.moveTo(px, py); pen = true; }
        drawn++;
      }
      if (s.t.length === 1 && s.v[0] !== null) { ctx.fillStyle = ln.color; ctx.fillRect(X(s.t[0]) - 2, Y(s.v[0]) - 2, 4, 4); }
      ctx.stroke();
    });
    fig.setAttribute("data-points", String(drawn));
    legend.textContent = "";
    if (!lines.length) {
      ctx.fillStyle = "#9ca3af"; ctx.textAlign = "center";
      ctx.fillText("no data in this range", w / 2, h / 2);
    }
    lines.forEach(function (ln) {
      var item = document.createElement("span");
      var sw = document.createElement("i"); sw.style.background = ln.color;
      item.appendChild(sw);
      var lastv = null;
      for (var q = ln.s.v.length - 1; q >= 0; q--) { if (ln.s.v[q] !== null) { lastv = ln.s.v[q]; break; } }
      item.appendChild(document.createTextNode(ln.label + " " + fmt(lastv)));
      legend.appendChild(item);
    });
  }

  function render() {
    if (!last || !CHARTS) { return; }
    root.querySelectorAll("figure.chart").forEach(function (fig) {
      var spec = CHARTS[fig.getAttribute("data-chart")];
      if (spec) { draw(fig, spec, last); }
    });
    root.setAttribute("data-drawn", String(Date.now()));
  }

  function load() {
    var get = function (u) { return fetch(u, { credentials: "same-origin", cache: "no-store" }).then(function (r) { return r.json(); }); };
    var specs = CHARTS ? Promise.resolve(null) : get("/target/" + tid + ".json");
    specs.then(function (doc) {
      if (doc) { CHARTS = {}; doc.charts.forEach(function (c) { CHARTS[c.id] = c; }); }
      return get("/target/" + tid + "/series.json?range=" + range);
    }).then(function (doc) { last = doc; render(); }).catch(function () {});
  }

  document.querySelectorAll("#zoom button").forEach(function (b) {
    b.addEventListener("click", function () {
      range = b.getAttribute("data-range");
      document.querySelectorAll("#zoom button").forEach(function (o) { o.classList.toggle("on", o === b); });
      load();
    });
  });
  window.addEventListener("resize", render);
  load();
  setInterval(load, Math.max(1, window.diagnoserInterval || 5) * 1000);
})();
