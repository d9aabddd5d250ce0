/* Where the reviewer is, in index.html: the panel of opened cases beside the page, each case's way back to the
   element it was opened from (focus, the page's scroll and each matrix box's), and the URL that holds the filters
   (its query) and the case on top of the panel (its fragment), so Back, Forward and a shared link bring them back.
   report.js makes one with R.place(page): the filter form, the keys it filters on, its state and the matrix. */
(function () {
  "use strict";
  var R = window.HarnessReport;

  R.place = function (page) {
    var root = document.documentElement, form = page.form, pane = document.getElementById("details");
    var opened = document.getElementById("opened"), places = {};
    function show(on) {
      pane.hidden = !on;
      root.classList.toggle("pane-open", on);
      held();
    }
    // The filter bar's height, which a target the page scrolls to keeps clear of (report.css scroll-margin-top)
    function held() {
      root.style.setProperty("--bar", form.offsetHeight + "px");
      page.matrix.hold(form);
    }
    function keep(id, from) {
      places[id] = {el: from, x: window.scrollX, y: window.scrollY, boxes: Array.prototype.map.call(
        document.querySelectorAll(".scroll"), function (b) { return [b, b.scrollLeft, b.scrollTop]; })};
    }
    // A case closed: the panel goes with its last case, and the page returns to where the case was opened from
    function close(d) {
      var p = places[d.id];
      delete places[d.id];
      d.remove();
      if (!opened.hasChildNodes()) { show(false); }
      if (!p) { return; }
      p.boxes.forEach(function (b) { b[0].scrollLeft = b[1]; b[0].scrollTop = b[2]; });
      window.scrollTo(p.x, p.y);
      if (document.contains(p.el)) { p.el.focus({preventScroll: true}); }
    }
    // The URL of what is shown: the filters in the query, the case on top of the panel in the fragment.
    function urlOf(st) {
      var params = new URLSearchParams();
      page.keys.forEach(function (k) { if (st[k]) { params.set(k, st[k]); } });
      if (st.q) { params.set("q", form.elements.q.value.trim()); }
      if (st.failures) { params.set("failures", "1"); }
      if (st.skips) { params.set("skips", "1"); }
      var top = opened.querySelector("details.case:not([hidden])"), query = params.toString();
      return window.location.pathname + (query ? "?" + query : "") + (top ? "#" + top.id : "");
    }
    function remember(push) {
      var url = urlOf(page.state()), now = window.location.pathname + window.location.search + window.location.hash;
      if (url !== now) { window.history[push ? "pushState" : "replaceState"](null, "", url); }
    }
    return {show: show, held: held, keep: keep, close: close, remember: remember};
  };
})();
