// Live updates without reload: every element with data-src is re-fetched each interval and replaced by
// the server-rendered fragment (escaped by Jinja2 on the server; no visitor input is involved).
(function () {
  "use strict";
  var interval = parseFloat(document.body.getAttribute("data-interval")) || 5;
  var live = document.getElementById("live");
  function refresh() {
    var nodes = document.querySelectorAll("[data-src]");
    nodes.forEach(function (el) {
      fetch(el.getAttribute("data-src"), { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
        .then(function (html) {
          var open = el.querySelector("details[open]") !== null;
          el.innerHTML = html;
          if (open) { var d = el.querySelector("details"); if (d) { d.open = true; } }
          if (live) { live.classList.remove("stale"); live.textContent = "live · updated " + new Date().toLocaleTimeString(); }
        })
        .catch(function () { if (live) { live.classList.add("stale"); live.textContent = "connection lost · retrying"; } });
    });
  }
  window.diagnoserInterval = interval;
  setInterval(refresh, Math.max(1, interval) * 1000);
})();
