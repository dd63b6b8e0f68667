
(function () {
  "use strict";
  var CONFIG = {displaylogo: false, responsive: true};
  function loadPlotly() {
    if (window.Plotly) { return Promise.resolve(window.Plotly); }
    var packed = document.getElementById("pd-plotlyjs");
    if (!packed) { return Promise.reject(new Error("plotly.js did not load (no network for --cdn?)")); }
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser cannot unpack the inlined plotly.js; " +
                                      "write the report with --cdn"));
    }
    var bin = atob(packed.textContent.trim());
    var bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(function (src) {
      var s = document.createElement("script");
      s.textContent = src;
      document.head.appendChild(s);
      return window.Plotly;
    });
  }
  function drawAll(P) {
    var tpl = JSON.parse(document.getElementById("pd-template").textContent);
    var divs = document.querySelectorAll("div.pd-plot");
    var done = [];
    for (var i = 0; i < divs.length; i++) {
      var fig = JSON.parse(document.getElementById(divs[i].id + "-data").textContent);
      fig.layout.template = tpl;
      done.push(P.newPlot(divs[i], fig.data, fig.layout, CONFIG));
    }
    return Promise.all(done);
  }
  loadPlotly().then(drawAll).then(function () {
    document.body.setAttribute("data-plots", "drawn");
  }).catch(function (err) {
    document.body.setAttribute("data-plots", "failed");
    var divs = document.querySelectorAll("div.pd-plot");
    for (var i = 0; i < divs.length; i++) {
      divs[i].textContent = "Figure not drawn: " + err.message;
      divs[i].className += " pd-err";
    }
  });
  function key(cell) {
    var v = cell.getAttribute("data-v");
    var s = v === null ? cell.textContent : v;
    var n = parseFloat(s);
    return (v !== null || /^-?[\d.,]+$/.test(s.trim())) && !isNaN(n) ? n : s.toLowerCase();
  }
  function sortBy(table, col, th) {
    var asc = th.getAttribute("aria-sort") !== "ascending";
    var heads = table.tHead.rows[0].cells;
    for (var h = 0; h < heads.length; h++) { heads[h].removeAttribute("aria-sort"); }
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a.cells[col]), y = key(b.cells[col]);
      var c = (typeof x === typeof y) ? (x < y ? -1 : x > y ? 1 : 0)
                                      : (typeof x === "number" ? -1 : 1);
      return asc ? c : -c;
    });
    for (var r = 0; r < rows.length; r++) { body.appendChild(rows[r]); }
  }
  var tables = document.querySelectorAll("table.pd-sort");
  for (var t = 0; t < tables.length; t++) {
    (function (table) {
      var heads = table.tHead.rows[0].cells;
      for (var c = 0; c < heads.length; c++) {
        (function (col, th) {
          th.title = "sort";
          th.addEventListener("click", function () { sortBy(table, col, th); });
        })(c, heads[c]);
      }
    })(tables[t]);
  }
})();
