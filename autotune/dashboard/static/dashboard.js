// Draws every figure of the page with plotly.js (served from the installed plotly package: no CDN).
// Figures arrive as inert JSON blocks (<script type="application/json">); a click on a point whose
// customdata is a trial link opens that trial. Only same-site /study/ links are followed.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  document.querySelectorAll("div.chart[data-figure]").forEach(function (div) {
    var source = document.getElementById(div.getAttribute("data-figure"));
    if (!source || typeof Plotly === "undefined") { return; }
    var figure = JSON.parse(source.textContent);
    Plotly.newPlot(div, figure.data, figure.layout, config).then(function () {
      div.setAttribute("data-rendered", "1");
    });
    div.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      var link = point && point.customdata;
      if (typeof link === "string" && link.indexOf("/study/") === 0) { window.location.assign(link); }
    });
  });
});
