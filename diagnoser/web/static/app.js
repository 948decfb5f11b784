// Live updates without reload. Every element with data-src is refreshed each interval from its fragment
// URL (rendered and escaped by Jinja2 on the server; no visitor input is involved). Elements that share a
// URL share one request: the fragment holds a part per element id (e.g. #top and #panels of a target),
// or is the element's whole content. Parts are morphed in (vendor/idiomorph.min.js), not replaced, so
// what the reader did stays: an opened or closed <details> keeps its state (the server's "open" never
// overrides the reader's), and the scroll position, focus and text selection survive the refresh.
(function () {
  "use strict";
  var interval = parseFloat(document.body.getAttribute("data-interval")) || 5;
  var live = document.getElementById("live");
  var busy = {};

  function keepReaderState(attr, node) {
    return !(attr === "open" && node.tagName === "DETAILS");
  }
  function utc(d) { return d.toISOString().slice(11, 19) + " UTC"; }

  function apply(el, html) {
    var tpl = document.createElement("template");
    tpl.innerHTML = html;  // parsed inert: a template's content runs no script and loads nothing
    var part = el.id ? tpl.content.getElementById(el.id) : null;
    var content = part ? part.innerHTML : html;
    if (window.Idiomorph) {
      window.Idiomorph.morph(el, content, { morphStyle: "innerHTML", callbacks: { beforeAttributeUpdated: keepReaderState } });
    } else {
      el.innerHTML = content;
    }
  }

  function refresh() {
    if (document.hidden) { return; }  // a background tab asks for nothing; it catches up when shown
    var groups = {};
    document.querySelectorAll("[data-src]").forEach(function (el) {
      var url = el.getAttribute("data-src");
      (groups[url] = groups[url] || []).push(el);
    });
    Object.keys(groups).forEach(function (url) {
      if (busy[url]) { return; }  // the previous answer is still on its way
      busy[url] = true;
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
        .then(function (html) {
          groups[url].forEach(function (el) { apply(el, html); });
          document.dispatchEvent(new CustomEvent("diagnoser:refreshed"));
          if (live) { live.classList.remove("stale"); live.textContent = "live · updated " + utc(new Date()); }
        })
        .catch(function () { if (live) { live.classList.add("stale"); live.textContent = "connection lost · retrying"; } })
        .then(function () { busy[url] = false; });
    });
  }
  window.diagnoserInterval = interval;
  setInterval(refresh, Math.max(1, interval) * 1000);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } });
})();
