/* The page script of index.html: it reads the embedded records (harness/report/embed.py) and draws, only when
   asked, a case's detail (detail.js), a group's rows and a model's matrix; it applies the filters and the search
   and opens the case a link or the URL's #case-<id> names, in a panel beside the page (place.js keeps the way back
   and the URL: ?status=FAIL&failures=1&model=flux&q=tp2#case-<id>). The axes it filters on, spells ids from and
   lays the matrix out by come with the data (D.axes, D.matrix). */
(function () {
  "use strict";
  var R = window.HarnessReport, esc = R.esc;
  var root = document.documentElement;
  root.classList.add("js");
  var dataEl = document.getElementById("report-data");
  var form = document.getElementById("filters");
  if (!dataEl || !form) { return; }
  var D = JSON.parse(dataEl.textContent);
  var TEXT = set(D.text), BAD = set(D.bad);
  var KEYS = ["status"].concat(D.axes.map(function (a) { return a.name; })).filter(function (k) {
    return form.elements[k];
  });
  var cases = D.c.map(decode);
  var built = {}, matrix = R.matrix({D: D, cases: cases, state: state, matches: matches, caseOf: caseOf,
                                     applied: function (scope) { applyTo(scope, state()); }});
  var pane = document.getElementById("details"), opened = document.getElementById("opened");
  var place = R.place({form: form, keys: KEYS, state: state, matrix: matrix});

  // -- records --------------------------------------------------------------------------------------------------
  function set(list) { var out = {}; list.forEach(function (k) { out[k] = true; }); return out; }
  // A text of `field`: a number is an index into the field's own string table (embed.py), a string the text.
  function txt(field, v) {
    return typeof v === "number" ? D.s[field][v] : (v === null || v === undefined ? "" : v);
  }
  // The fields every view needs, decoded up front; figures and failed checks when the case is opened (`full`).
  function decode(row, i) {
    var c = {i: i}, names = D.fields;
    for (var f = 0; f < names.length; f++) {
      var v = f < row.length ? row[f] : null;
      c[names[f]] = TEXT[names[f]] ? txt(names[f], v) : v;
    }
    c.case_id = c.case_id || spellId(c);
    c.anchor = D.anchor + c.case_id;
    return c;
  }
  function full(c) {
    if (c.decoded) { return c; }
    c.figures = (c.figures || []).map(function (f) {
      var spec = D.f[f[0]];
      return {name: spec[0], label: spec[1], key: !!spec[2], value: txt("figures", f[1]),
              limit: txt("figures", f[2]), ratio: txt("figures", f[3])};
    });
    c.evidence = (c.evidence || []).map(function (e) {
      return {check: txt("evidence", e[0]), subject: txt("evidence", e[1]), value: txt("evidence", e[2]),
              limit: txt("evidence", e[3]), known: txt("evidence", e[4]), band: txt("evidence", e[5]),
              more: e[6] || 0};
    });
    c.known = (c.known_issues || []).map(function (k) { return D.v[k]; });  // {key, title, link} (embed.py)
    c.decoded = true;
    return c;
  }
  function spellId(c) {  // harness.report.axes.spell: each axis after its separator, unless it is the omitted value
    return D.axes.map(function (a) {
      var value = c[a.name] === undefined ? a.omit : c[a.name];  // an axis declared after the record: its default
      return "omit" in a && value === a.omit ? "" : a.before + value;
    }).join("");
  }
  function unpack(v) {  // embed.py `_pack`: the members named in "$" are indices into D.v
    if (Array.isArray(v)) { return v.map(unpack); }
    if (v === null || typeof v !== "object") { return v; }
    var out = {}, refs = v.$ || [];
    Object.keys(v).forEach(function (k) {
      if (k !== "$") { out[k] = unpack(refs.indexOf(k) >= 0 ? D.v[v[k]] : v[k]); }
    });
    return out;
  }
  // A case's extra data; the keys the page left out (embed.py: other data of a case that needs no look) in c.left.
  R.extraOf = function (c) {
    if (c.x) { return c.x; }
    var out = {}, pairs = c.extra || [];
    for (var k = 0; k + 1 < pairs.length; k += 2) { out[txt("extra", pairs[k])] = unpack(D.v[pairs[k + 1]]); }
    c.left = pairs.length % 2 ? txt("extra", pairs[pairs.length - 1]) : "";
    c.x = out;
    return out;
  };
  // A fragment names a case by #case-<its id> (also percent-encoded), by its bare id, or by the slug earlier pages
  // used (#case-flux-ring2-native-fp32-tensor); looked up when asked, so loading builds no index of them.
  function slug(id) { return D.anchor + (id.replace(/[^A-Za-z0-9_.-]+/g, "-").replace(/^-+|-+$/g, "") || "unnamed"); }
  function named(fragment) {
    var name = fragment.replace(/^#/, ""), k;
    try { name = decodeURIComponent(name); } catch (e) { /* a stray "%": the fragment as it is */ }
    for (k = 0; k < cases.length; k++) {
      if (cases[k].anchor === name || cases[k].case_id === name) { return cases[k]; }
    }
    for (k = 0; name.indexOf(D.anchor) === 0 && k < cases.length; k++) {
      if (slug(cases[k].case_id) === name) { return cases[k]; }
    }
    return null;
  }

  // -- rows and groups ------------------------------------------------------------------------------------------
  function caseRow(c, note) {
    return '<tr class="case-row" data-i="' + c.i + '"><td>' + R.badge(c.status) + '</td><td><a class="case-link" ' +
      'href="#' + esc(c.anchor) + '"><code>' + esc(c.case_id) + '</code></a></td><td class="n">' + esc(c.cell) +
      '</td><td><div class="reason-cell">' + R.linked(note) + "</div></td></tr>";
  }
  function buildGroup(group) {
    var key = group.getAttribute("data-group");
    if (built[key]) { return; }
    // A row says what its group does not: the reason after the group's title (or its entries' cause, sections.py)
    var title = (group.querySelector(".cause") || group.querySelector(".why")).textContent;
    var changed = !!group.closest("#changed");  // a group of what changed against a base run: what it was there
    var rows = D.g[key].map(function (i) {
      var c = cases[i], note = c.reason;
      if (note.indexOf(title) === 0) { note = note.slice(title.length).replace(/^;\s*/, ""); }
      if (changed && D.changes[i]) { note = R.changeText(D.changes[i]) + (note ? "; now: " + note : ""); }
      return caseRow(c, note);
    }).join("");
    group.querySelector(".rows").innerHTML = '<table class="cases"><tbody>' + rows + "</tbody></table>";
    built[key] = true;
    applyTo(group, state());
  }
  // -- filters --------------------------------------------------------------------------------------------------
  function state() {
    var st = {failures: form.elements.failures.checked, skips: form.elements.skips.checked,
              q: form.elements.q.value.trim().toLowerCase()};
    KEYS.forEach(function (k) { st[k] = form.elements[k].value; });
    return st;
  }
  function matches(c, st, except) {
    for (var k = 0; k < KEYS.length; k++) {
      if (KEYS[k] !== except && st[KEYS[k]] && c[KEYS[k]] !== st[KEYS[k]]) { return false; }
    }
    return !(st.failures && !BAD[c.status]) && (!st.q || found(c, st.q));
  }
  // The search: a part of the case's id, of its reason (an error's words, "expected refusal", a known issue's
  // traced cause), or of the title, key or kind of finding of a known-issue entry it carries
  function found(c, q) {
    return c.case_id.toLowerCase().indexOf(q) >= 0 || c.reason.toLowerCase().indexOf(q) >= 0 ||
      (c.known_issues || []).some(function (k) {
        return (D.v[k].title + " " + D.v[k].key + " " + D.v[k].severity).toLowerCase().indexOf(q) >= 0;
      });
  }
  function caseOf(el) { return cases[Number(el.getAttribute("data-i"))]; }
  // The filters hide rows and cells; an opened case stays open, marked when the filters would hide it
  function applyTo(scope, st) {
    scope.querySelectorAll("tr.case-row").forEach(function (el) { el.hidden = !matches(caseOf(el), st); });
    scope.querySelectorAll("details.case").forEach(function (el) {
      el.classList.toggle("filtered-out", !matches(caseOf(el), st));
    });
    scope.querySelectorAll("table.matrix").forEach(function (table) { matrix.filter(table, st); });
  }
  // The counts follow the filters (all but the status filter, so each button still says what it would show).
  function applyCounts(st) {
    var tally = {};
    cases.forEach(function (c) { if (matches(c, st, "status")) { tally[c.status] = (tally[c.status] || 0) + 1; } });
    document.querySelectorAll("[data-set-status]").forEach(function (b) {
      var status = b.getAttribute("data-set-status"), all = Number(b.getAttribute("data-total"));
      var n = tally[status] || 0;
      b.querySelector("b").textContent = String(n);
      b.querySelector(".of").textContent = n === all ? "" : "of " + all;
    });
  }
  function apply() {
    var st = state(), shown = 0, sections = {}, axis = D.matrix.section[0];
    matrix.rebuild(st);
    cases.forEach(function (c) {
      if (!matches(c, st)) { return; }
      var tally = sections[axis ? c[axis] : ""] = sections[axis ? c[axis] : ""] || {all: 0};
      shown++; tally.all++; tally[c.status] = (tally[c.status] || 0) + 1;
    });
    applyTo(document, st);
    applyCounts(st);
    document.querySelectorAll("details.group").forEach(function (group) {
      var members = D.g[group.getAttribute("data-group")], n = 0;
      members.forEach(function (i) { if (matches(cases[i], st)) { n++; } });
      group.querySelector(".n").textContent = n === members.length ? String(n) : n + " of " + members.length;
      group.hidden = n === 0;
    });
    document.querySelectorAll("details.section").forEach(function (m) {
      var tally = sections[m.getAttribute("data-section")];
      m.hidden = !tally;
      if (tally) { matrix.count(m, tally); }
    });
    document.querySelectorAll(".issue-entry, .issue-unmatched").forEach(function (li) {  // the search finds entries
      li.hidden = !!st.q && li.textContent.toLowerCase().indexOf(st.q) < 0;
    });
    document.querySelectorAll("section").forEach(function (section) {
      var note = section.querySelector(":scope > .no-match");
      if (note) { note.hidden = !!section.querySelector("tr.case-row:not([hidden]), details.group:not([hidden])," +
        " details.section:not([hidden])"); }
    });
    place.show(!!opened.querySelector("details.case"));
    document.getElementById("shown-count").textContent = "Showing " + shown + " of " + cases.length + " cases";
  }
  function fromQuery() {
    var params = new URLSearchParams(window.location.search);
    KEYS.forEach(function (k) {
      var v = params.get(k), sel = form.elements[k];
      var known = Array.prototype.some.call(sel.options, function (o) { return o.value === v; });
      sel.value = v !== null && known ? v : "";
    });
    form.elements.q.value = params.get("q") || "";
    form.elements.failures.checked = ["1", "true", "yes"].indexOf(params.get("failures")) >= 0;
    form.elements.skips.checked = ["1", "true", "yes"].indexOf(params.get("skips")) >= 0;
  }

  function restore() {  // Back or Forward: the filters and the case of that URL
    fromQuery();
    apply();
    var c = window.location.hash ? named(window.location.hash) : null;
    if (c) { openCase(c, {}); } else { opened.querySelectorAll("details.case").forEach(place.close); }
  }

  // -- opening cases --------------------------------------------------------------------------------------------
  function fill(details) {
    var body = details.querySelector(".case-body");
    if (!body.hasChildNodes()) { body.innerHTML = R.detail(full(caseOf(details)), D); }
  }
  // A case on top of the panel; `how.from`: the link it was opened from (kept in view, focus returns to it on
  // closing), `how.focus`: focus the case, `how.push`: a new entry in the history.
  function openCase(c, how) {
    if (!c) { return null; }
    var d = document.getElementById(c.anchor);
    if (!d) {
      d = document.createElement("details");
      d.className = "case";
      d.id = c.anchor;
      d.setAttribute("data-i", String(c.i));
      d.innerHTML = "<summary>" + R.badge(c.status) + " <code>" + esc(c.case_id) + "</code>" +
        '<span class="hidden-note muted"> (the filters hide it in the lists)</span></summary>' +
        '<div class="case-body"></div>';
    }
    d.classList.toggle("filtered-out", !matches(c, state()));  // opened all the same: the filters stay as set
    if (how.from) { place.keep(d.id, how.from); }
    opened.insertBefore(d, opened.firstChild);
    place.show(true);
    d.open = true;
    fill(d);
    pane.scrollTop = 0;
    if (how.from) { how.from.scrollIntoView({block: "nearest", inline: "nearest"}); }  // beside the panel
    if (how.focus) { d.querySelector("summary").focus({preventScroll: true}); }
    if (how.push) { place.remember(true); }
    return d;
  }
  function onToggle(e) {
    var el = e.target;
    if (!el.open || !el.classList) { return; }
    if (el.classList.contains("case")) { fill(el); }
    else if (el.classList.contains("group")) { buildGroup(el); }
    else if (el.classList.contains("section")) { matrix.build(el); }
  }
  function firstFailing() {
    var rows = document.querySelectorAll("#failing tr.case-row:not([hidden])");
    for (var k = 0; k < rows.length; k++) {
      if (BAD[caseOf(rows[k]).status]) { return caseOf(rows[k]); }
    }
    return null;
  }
  function onClick(e) {
    var close = e.target.closest && e.target.closest("[data-close]");
    if (close) {
      place.close(close.closest("details.case"));
      place.remember(true);
      return;
    }
    var a = e.target.closest && e.target.closest('a[href^="#"]');
    var c = a ? named(a.getAttribute("href")) : null;
    if (c) {
      e.preventDefault();
      openCase(c, {from: a, focus: true, push: true});
    } else if (a) {
      goTo(a.getAttribute("href"), e);
    }
  }
  // A link to a place on the page (a known issue's listing, a section): scrolled to, its closed sections opened,
  // without touching the URL, whose fragment names the case on top of the panel (which stays open)
  function goTo(href, e) {
    var id = href.slice(1), target = null;
    try { target = document.getElementById(decodeURIComponent(id)); } catch (err) { target = null; }
    if (!target) { return; }
    e.preventDefault();
    for (var up = target.parentElement; up; up = up.parentElement) {
      if (up.tagName === "DETAILS" && !up.open) { up.open = true; }
    }
    target.scrollIntoView({block: "start"});
    target.classList.add("went-to");
    window.setTimeout(function () { target.classList.remove("went-to"); }, 2000);
  }
  function filtered(push) { apply(); place.remember(push); }

  form.addEventListener("change", function () { filtered(true); });
  form.addEventListener("input", function (e) { if (e.target.name === "q") { filtered(false); } });
  form.addEventListener("submit", function (e) { e.preventDefault(); filtered(true); });
  form.addEventListener("reset", function () { window.setTimeout(function () { filtered(true); }, 0); });
  document.querySelectorAll("[data-set-status]").forEach(function (b) {
    b.addEventListener("click", function () {
      form.elements.status.value = b.getAttribute("data-set-status");
      filtered(true);
    });
  });
  document.addEventListener("toggle", onToggle, true);
  document.addEventListener("click", onClick);
  document.addEventListener("keydown", function (e) {
    if (e.target.classList && e.target.classList.contains("cell-case") && /^Arrow/.test(e.key)) {
      e.preventDefault(); matrix.move(e.target, e.key);
    } else if (e.key === "Escape" && !pane.hidden && pane.contains(e.target)) {
      place.close(opened.querySelector("details.case"));
      place.remember(true);
    }
  });
  window.addEventListener("popstate", restore);
  window.addEventListener("hashchange", function () {
    var c = named(window.location.hash);
    if (c && opened.firstChild !== document.getElementById(c.anchor)) { openCase(c, {focus: true}); }
  });
  window.addEventListener("scroll", function () { matrix.hold(form); }, {passive: true});
  window.addEventListener("resize", place.held);
  var printed = [];
  window.addEventListener("beforeprint", function () {
    printed = cases.filter(function (c) { return BAD[c.status] && !document.getElementById(c.anchor); })
      .map(function (c) { return openCase(c, {}); });
  });
  window.addEventListener("afterprint", function () {
    printed.forEach(function (d) { d.remove(); });
    place.show(opened.hasChildNodes());
  });
  fromQuery();
  document.querySelectorAll("details.section[open]").forEach(matrix.build);
  apply();
  var asked = window.location.hash ? named(window.location.hash) : null;
  if (asked) { openCase(asked, {focus: true}); } else { openCase(firstFailing(), {}); }
  root.setAttribute("data-ready", "1");
  root.setAttribute("data-ready-ms", performance.now().toFixed(0));
})();
