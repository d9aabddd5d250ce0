/* Appended to a report page by tests/report_pages.py: runs the test's setup (in place of the SETUP comment), then
   records what a person would see, as JSON in a pre element. Shown: computed display not "none" and a box;
   in view: shown and inside the first screen. A test's setup may define window.__probe for more, and window.__wait
   to be recorded later than 300 ms after it. */
(function () {
  "use strict";
  function shown(el) {
    var box = el.getBoundingClientRect();
    return getComputedStyle(el).display !== "none" && el.getClientRects().length > 0 && box.width > 0 &&
      box.height > 0;
  }
  function inView(el) {
    var box = el.getBoundingClientRect();
    return shown(el) && box.top >= 0 && box.bottom <= window.innerHeight && box.right <= window.innerWidth;
  }
  function box(el) { var b = el.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; }
  // For a test's own window.__probe: the same measures of what is shown.
  window.__seen = {shown: shown, inView: inView, box: box};
  function idOf(el) { return decodeURIComponent(el.getAttribute("href").slice(1)); }
  function matrixBox() {  // the box around every shown matrix table, in page coordinates
    var out = null;
    document.querySelectorAll("table.matrix").forEach(function (m) {
      var b = m.getBoundingClientRect();
      var box = [b.left + scrollX, b.top + scrollY, b.right + scrollX, b.bottom + scrollY];
      if (!shown(m)) { return; }
      out = out ? [Math.min(out[0], box[0]), Math.min(out[1], box[1]), Math.max(out[2], box[2]),
                   Math.max(out[3], box[3])] : box;
    });
    return out;
  }
  function images() {
    return Array.prototype.map.call(document.querySelectorAll("#opened img"), function (img) {
      var figure = img.closest("figure"), bar = figure.querySelector(".bar");
      var note = figure.querySelector(".scale-note");
      return {src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0, inView: inView(img),
              caption: figure.querySelector("figcaption").textContent,
              legend: bar ? inView(bar) && getComputedStyle(bar).backgroundImage : null,
              note: note ? note.textContent : null};
    });
  }
  function record() {
    var out = {cells: {}, rows: {}, details: {}, groups: {}, sections: {}, failing: [], counts: {}, opened: "",
               firstOpen: null};
    document.querySelectorAll("a.cell-case").forEach(function (a) { out.cells[idOf(a)] = shown(a); });
    document.querySelectorAll("tr.case-row").forEach(function (tr) {
      out.rows[idOf(tr.querySelector("a.case-link"))] = shown(tr);
    });
    document.querySelectorAll("details.case").forEach(function (d) { out.details[d.id] = shown(d) && d.open; });
    document.querySelectorAll("details.group").forEach(function (g) {
      out.groups[g.getAttribute("data-group")] = [shown(g), g.querySelector(".n").textContent];
    });
    document.querySelectorAll("details.section").forEach(function (m) {
      out.sections[m.getAttribute("data-section")] = shown(m);
    });
    document.querySelectorAll("#failing tr.case-row").forEach(function (tr) {
      var reason = tr.querySelector(".reason-cell");
      out.failing.push([idOf(tr.querySelector("a")), inView(tr), inView(reason) ? reason.textContent : null]);
    });
    document.querySelectorAll("[data-set-status]").forEach(function (b) {
      out.counts[b.getAttribute("data-set-status")] = shown(b) ? b.textContent : null;
    });
    out.images = images();
    out.imageNotes = Array.prototype.filter.call(document.querySelectorAll("#opened .images + p"), shown)
      .map(function (p) { return p.textContent; });
    // Every picture in the document (the page draws them only when a case showing them is opened)
    out.pictures = Array.prototype.map.call(document.images, function (img) { return img.getAttribute("src"); });
    var opened = document.querySelector("#opened details.case[open]");
    if (opened) {  // in view and on top: not under the sticky filter bar
      var summary = opened.querySelector("summary"), box = summary.getBoundingClientRect();
      var top = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
      out.firstOpen = [opened.id, inView(summary) && summary.contains(top)];
    }
    out.opened = document.getElementById("opened").innerHTML;
    out.matrix = matrixBox();
    out.skipNotes = Array.prototype.map.call(document.querySelectorAll(".skip-note"), function (n) {
      return n.textContent;
    });
    out.counter = document.getElementById("shown-count").textContent;
    out.scripts = document.querySelectorAll("script").length;
    out.ready = document.documentElement.getAttribute("data-ready");
    if (window.__probe) { out.extra = window.__probe(); }
    var pre = document.createElement("pre");
    pre.id = "probe";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  // A setup of several timed steps sets window.__wait (ms) to be recorded after its last one
  setTimeout(function () { /*SETUP*/ setTimeout(record, window.__wait || 300); }, 0);
})();
