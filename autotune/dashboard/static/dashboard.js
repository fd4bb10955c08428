// Draws every figure of the page with plotly.js (served from the installed plotly package: no CDN).
// Figures arrive as inert JSON blocks (<script type="application/json">); a click on a point whose
// customdata is a trial link opens that trial. Only same-site /study/ links are followed.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  // A page of a study or trial still running reloads itself every data-refresh-s seconds, until the reader
  // zooms, pans, drags or hides a trace: then it says so and waits, so that the view is not undone under them.
  var refresh = document.getElementById("refresh");
  var timer = null;
  function pause() {
    if (timer === null) { return; }
    window.clearTimeout(timer);
    timer = null;
    refresh.textContent = "auto-refresh paused while you look at a chart: reload the page for new runs";
  }
  if (refresh) {
    var seconds = parseInt(refresh.getAttribute("data-refresh-s"), 10);
    if (seconds > 0) {
      timer = window.setTimeout(function () { window.location.reload(); }, seconds * 1000);
      refresh.textContent = "this page reloads every " + seconds + " s while the study runs";
    }
  }
  document.querySelectorAll("div.chart[data-figure]").forEach(function (div) {
    var source = document.getElementById(div.getAttribute("data-figure"));
    if (!source || typeof Plotly === "undefined") { return; }
    var figure = JSON.parse(source.textContent);
    Plotly.newPlot(div, figure.data, figure.layout, config).then(function () {
      div.setAttribute("data-rendered", "1");
    });
    div.on("plotly_relayout", function (change) {  // a zoom, a pan, an autoscale by the reader; not a resize
      if (Object.keys(change || {}).some(function (key) { return /^(xaxis|yaxis|dragmode)/.test(key); })) { pause(); }
    });
    div.on("plotly_legendclick", function () { pause(); return true; });
    // dragging a parallel-categories dimension or category restyles the trace, at the drag's end; a drag in
    // any chart (a zoom box, a dimension moved) pauses from its first move, so no reload lands mid-drag
    div.on("plotly_restyle", function () { pause(); });
    div.addEventListener("pointermove", function (event) { if (event.buttons & 1) { pause(); } });
    div.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      var link = point && point.customdata;
      if (typeof link === "string" && link.indexOf("/study/") === 0) { window.location.assign(link); }
    });
  });
});
