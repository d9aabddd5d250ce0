/* compare.html: draws a group's rows (the status changes of one transition, or the cases in one run only) when it is
   first opened, from the lists embedded by harness/report/compare_page.py; each case links to NEW's index.html. */
(function () {
  "use strict";
  var dataEl = document.getElementById("compare-data");
  if (!dataEl) { return; }
  var D = JSON.parse(dataEl.textContent), ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"};
  function esc(s) { return String(s).replace(/[&<>"']/g, function (ch) { return ESC[ch]; }); }
  function badge(status) { return '<span class="badge s-' + esc(status) + '">' + esc(status) + "</span>"; }
  function reason(text) { return '<td><div class="reason-cell">' + esc(text) + "</div></td>"; }
  function link(id) {
    var code = "<code>" + esc(id) + "</code>";
    if (D.index === null) { return code; }
    var fragment = encodeURIComponent(D.anchor + id).replace(/%2F/g, "/").replace(/%40/g, "@").replace(/%2B/g, "+")
      .replace(/%3A/g, ":").replace(/%3D/g, "=");
    return '<a href="' + esc(D.index) + "#" + esc(fragment) + '">' + code + "</a>";
  }
  function row(kind, values) {
    var v = values.map(function (k) { return D.s[k]; });
    if (kind === "change") {
      return "<tr><td>" + link(v[0]) + "</td><td>" + badge(v[1]) + "</td><td>" + badge(v[2]) + "</td>" +
        reason(v[3]) + reason(v[4]) + "</tr>";
    }
    return "<tr><td>" + link(v[0]) + "</td><td>" + badge(v[1]) + "</td>" + reason(v[2]) + "</tr>";
  }
  function build(group) {
    var target = group.querySelector(".rows"), kind = group.getAttribute("data-kind");
    if (target.hasChildNodes()) { return; }
    var head = kind === "change" ? "<thead><tr><th scope=\"col\">case</th><th scope=\"col\">old</th>" +
      "<th scope=\"col\">new</th><th scope=\"col\">old reason</th><th scope=\"col\">new reason</th></tr></thead>" : "";
    var rows = D.lists[group.getAttribute("data-list")].map(function (values) { return row(kind, values); });
    target.innerHTML = '<table class="cases">' + head + "<tbody>" + rows.join("") + "</tbody></table>";
  }
  document.addEventListener("toggle", function (e) {
    if (e.target.open && e.target.matches && e.target.matches("details.lazy")) { build(e.target); }
  }, true);
  document.documentElement.setAttribute("data-ready", "1");
})();
