/* A case's detail, drawn when it is opened: where it ran, its reason, its failed checks, its figures against their
   limits, its detail blocks by type, its pictures, where it breaks, what it communicated, how it ran, its traceback
   and any other data. Nothing here knows a kind: each part is drawn from what the case holds. */
(function () {
  "use strict";
  var R = window.HarnessReport, esc = R.esc;
  var BLOCKS = {histogram: R.histogram, series: R.series, table: tableBlock, images: imagesBlock};
  var DECIDED = ' <span class="decided-mark" title="the check that decided this case">\u25c0 decided</span>';
  // Each column's header says what it holds (its title), for the columns whose word alone does not.
  var FIGURE_HEADS = [["figure", "what the case's kind measured"], ["value", "the measured value"],
    ["limit", "what the check allows (none: the figure is there to read)"],
    ["share of its allowance", "how much of its allowance the check used: 0 at the ideal, 1\u00d7 at the limit"]];
  var EVIDENCE_HEADS = [["check", "the check that failed"], ["subject", "what it failed on: a parameter, a " +
    "module and its collective, a rank (\u2014: the case as a whole)"], ["figure", "the measured value"],
    ["limit", "what the check allows (0: must be exact)"], ["known band", "the band the known issue measured " +
    "for this figure: outside it, it is not that issue"], ["excused by", "the known issue or expected refusal " +
    "that excuses this check (empty: nothing does)"]];

  R.detail = function (c, D) {
    var x = R.extraOf(c);
    return '<button type="button" class="close" data-close title="remove this case from the opened cases">close' +
      "</button>" + whereHTML(c, D) + changeHTML(D.changes[c.i]) + decidedHTML(c) + reasonHTML(c) + deathHTML(c) +
      knownHTML(c) +
      reproHTML(x) +
      evidenceHTML(c) + figuresHTML(c) +
      blocksHTML(x) +
      (x.images ? imagesBlock({title: "Images", images: x.images}) : "") + localizationHTML(c, x) + driftHTML(x) +
      repeatHTML(x) + commsHTML(x) +
      factsHTML(c, x) + (x.traceback ? '<h4>Traceback</h4><pre class="traceback">' + esc(x.traceback) + "</pre>" : "") +
      otherHTML(x, c.left, D.drawn);
  };
  function whereHTML(c, D) {
    var parts = D.axes.map(function (a) { return a.name + " " + c[a.name]; });
    return '<p class="where muted">' + esc(parts.join(" \u00b7 ") + " \u00b7 world size " + c.world_size) + "</p>";
  }
  function changeHTML(change) {  // against a base run: what changed, and what the case was there
    return change ? '<p class="changed">Against the base run:' + R.changeMark(change) + " " +
      esc(R.changeText(change)) + "</p>" : "";
  }
  // The check that decided the case (harness.core.figures.deciding), first: which check, its value against its
  // limit, the share of its allowance it used and how the limit was derived, all in its text.
  function decidedHTML(c) {
    var d = c.deciding;
    if (!d || !d.text) { return ""; }
    return '<p class="decided"><b>Decided by</b> ' + esc(d.text) + "</p>";
  }
  R.decidedRow = function (c, name, subject) {  // whether a figure or failed-check row is the deciding check's
    var d = c.deciding;
    return !!d && d.name === name && (!subject || !d.subject || d.subject === subject);
  };
  function reasonHTML(c) {
    return c.reason ? '<h4>Reason</h4><pre class="reason">' + R.linked(c.reason) + "</pre>" : "";
  }
  // A rank died of a native signal in an earlier attempt (harness.run.launch): the case ran once more in a fresh
  // group, and everything else shown is that run's; the death is kept, with the dead rank's own stack.
  function deathHTML(c) {
    var d = c.rank_death;
    return d ? '<h4>A rank died in an earlier attempt</h4><p class="rank-death">' + esc(d.error) + "</p>" +
      '<pre class="traceback">' + esc(d.traceback || "") + "</pre>" : "";
  }
  // A link out of the page to a known issue's traced cause (embed.py keeps only http(s) ones; checked again here).
  R.causeLink = function (url, text) {
    return /^https?:\/\//.test(url || "") ? '<a class="cause-link" href="' + esc(url) + '" target="_blank" ' +
      'rel="noopener noreferrer">' + esc(text || "traced cause") + " \u2197</a>" : "";
  };
  // An entry's key ("known_issues.toml #12") as a link to the page's listing of the entries (sections.py)
  function keyLink(k) {
    return k.anchor ? '<a class="entry-key muted" href="#' + esc(k.anchor) + '">' + esc(k.key) + "</a>" :
      '<span class="muted">' + esc(k.key) + "</span>";
  }
  function entryOf(c, key) {
    return c.known.filter(function (k) { return k.key === key; })[0] || null;
  }
  function knownHTML(c) {  // the known_issues.toml entries that excused the case (or list it, for an XPASS)
    if (!c.known.length) { return ""; }
    var items = c.known.map(function (k) {
      return '<li class="known-entry">' + (k.severity ? '<span class="severity sev-' +
        esc(k.severity.replace(/ /g, "-")) + '">' + esc(k.severity) + "</span> " : "") +
        '<span class="known-title">' + esc(k.title || k.key) + "</span> " +
        R.causeLink(k.link) + " " + R.causeLink(k.upstream, "upstream") + " " + keyLink(k) + "</li>";
    });
    return "<h4>Known issue" + (items.length > 1 ? "s" : "") + '</h4><ul class="known">' + items.join("") + "</ul>";
  }
  function excusedHTML(c, e) {  // who excused a failed check: its entry's title (its key where the case has none)
    if (!e.known) { return ""; }
    var entry = entryOf(c, e.known);
    return '<span class="known-title" title="' + esc(e.known) + '">' + esc(entry && entry.title || e.known) +
      "</span>";
  }
  function reproHTML(x) {  // a FAIL a standalone script reproduces: the command that writes it (verdict.note_repro)
    return typeof x.repro === "string" ? '<p class="repro">Reproduce it alone, for an upstream report: <code>' +
      esc(x.repro) + "</code> writes a script with torch and diffusers only</p>" : "";
  }
  function table(cls, heads, rows) {  // a head is its word, or [word, what its column holds]
    return '<table class="grid ' + cls + '"><thead><tr>' + heads.map(function (h) {
      return Array.isArray(h) ? '<th scope="col" title="' + esc(h[1]) + '">' + esc(h[0]) + "</th>" :
        '<th scope="col">' + esc(h) + "</th>";
    }).join("") + "</tr></thead><tbody>" + rows.join("") + "</tbody></table>";
  }
  function evidenceHTML(c) {
    if (!c.evidence.length) { return ""; }
    var marked = c.figures.some(function (f) { return R.decidedRow(c, f.name); });
    var rows = c.evidence.map(function (e) {
      if (e.more) {
        return '<tr class="more"><td><code>' + esc(e.check) + '</code></td><td colspan="5" class="muted">and ' +
          e.more + " more (every one in results.json)</td></tr>";
      }
      var decided = !marked && R.decidedRow(c, e.check, e.subject);
      marked = marked || decided;
      return '<tr data-check="' + esc(e.check) + '"' + (decided ? ' class="deciding"' : "") + "><td><code>" +
        esc(e.check) + "</code>" + (decided ? DECIDED : "") + "</td><td>" +
        (e.subject ? "<code>" + esc(e.subject) + "</code>" : R.DASH) + '</td><td class="n">' + esc(e.value || R.DASH) +
        '</td><td class="n">' + esc(e.limit || R.DASH) + '</td><td class="n band">' + esc(e.band || "") +
        "</td><td>" + excusedHTML(c, e) + "</td></tr>";
    });
    var total = c.evidence.reduce(function (n, e) { return n + (e.more || 1); }, 0);
    return "<h4>Failed checks (" + total + ")</h4>" + table("evidence", EVIDENCE_HEADS, rows) +
      '<p class="muted table-note">Every check that failed, worst first within a check; a known issue excuses a ' +
      "check only on the subjects it names and with its figure inside the band it measured.</p>";
  }
  function figuresHTML(c) {
    if (!c.figures.length) { return ""; }
    var decided = c.figures.some(function (f) { return R.decidedRow(c, f.name); });
    var rows = c.figures.map(function (f) {
      var mark = decided ? R.decidedRow(c, f.name) : f.key;  // bold: the deciding check, else the cell's figure
      return '<tr data-figure="' + esc(f.name) + '"' + (mark ? ' class="key' + (decided ? " deciding" : "") + '"' :
        "") + "><td>" + esc(f.label) + (decided && mark ? DECIDED : "") + "</td><td" +
        (R.num(f.value) === null ? "" : ' class="n"') + ">" + esc(f.value || R.DASH) +
        '</td><td class="n">' + esc(f.limit || "") + '</td><td class="n">' + esc(f.ratio || "") + "</td></tr>";
    });
    return "<h4>Figures</h4>" + table("figures", FIGURE_HEADS, rows) + '<p class="muted table-note">' +
      "share of its allowance: 0 at the ideal value (0 for an error; 1 for SSIM and for a ratio to one device's own " +
      "error, so a ratio of 1.10 against a limit of 1.25 has used 0.40\u00d7), 1\u00d7 at the limit, above 1\u00d7 " +
      "past it; PSNR by the errors its decibels stand for. A figure without a limit is there to read, not a check." +
      "</p>";
  }
  function blocksHTML(x) {
    return (Array.isArray(x.blocks) ? x.blocks : []).map(function (block) {
      var draw = block && BLOCKS[block.type];
      return draw ? draw(block) : "<h4>" + esc((block && block.title) || "Data") + "</h4>" + R.valueHTML(block);
    }).join("");
  }
  function tableBlock(block) {
    var code = block.code || [], rows = (block.rows || []).map(function (row) {
      return "<tr>" + row.map(function (v, j) {
        if (code.indexOf(j) >= 0) { return "<td><code>" + esc(R.text(v)) + "</code></td>"; }
        var numeric = typeof v === "number" || R.num(v) !== null;
        return "<td" + (numeric ? ' class="n"' : "") + ">" + esc(R.text(v)) + "</td>";
      }).join("") + "</tr>";
    });
    return "<h4>" + esc(block.title || "Table") + "</h4>" + table("block", block.columns || [], rows);
  }
  // Pictures by role; a role's caption and colour scale come with the block where the kind gives them.
  function imagesBlock(block) {
    var images = block.images || {}, captions = block.captions || {}, scales = block.scales || {};
    var figures = Object.keys(images).map(function (role) {
      var caption = captions[role] || role.replace(/_/g, " ");
      return '<figure class="img-' + esc(role) + '"><img src="' + esc(images[role]) + '" alt="' + esc(caption) + '">' +
        "<figcaption>" + esc(caption) + "</figcaption>" + scaleHTML(scales[role]) + "</figure>";
    }).join("");
    var note = block.note || ("thumbnail" in images && Object.keys(images).length === 1 ? "Only a thumbnail is kept " +
      "of a case that did not fail (--images all keeps every picture)." : "");
    return "<h4>" + esc(block.title || "Images") + '</h4><div class="images">' + figures + "</div>" +
      (note ? '<p class="muted">' + esc(note) + "</p>" : "");
  }
  function scaleHTML(scale) {  // {ticks: [low, middle, high], note}: a black-to-white bar with its ticks
    if (!scale || !Array.isArray(scale.ticks)) { return ""; }
    var ticks = scale.ticks.map(function (t) { return "<span>" + esc(t) + "</span>"; }).join("");
    return '<div class="scale"><span class="bar" role="img" aria-label="colour scale from ' +
      esc(scale.ticks[0]) + " (black) to " + esc(scale.ticks[scale.ticks.length - 1]) + ' (white)"></span>' +
      '<span class="ticks">' + ticks + '</span></div><p class="scale-note">' + esc(scale.note || "") + "</p>";
  }
  function localizationHTML(c, x) {
    var loc = x.localization;
    if (!loc || !Array.isArray(loc.modules)) {
      return x.localization_error ? "<h4>Where it breaks</h4><p>not localized: " + esc(x.localization_error) +
        "</p>" : "";
    }
    var rows = loc.modules, first = loc.first, none = first === null || first === undefined;
    var head = '<h4>Where it breaks</h4><p class="first-divergence">' + (none ? "no module above its limit" :
      "first divergence: <code>" + esc(c.first_divergence || rows[first].module) + "</code>") + "</p>";
    var lines = rows.map(function (r, i) {
      return "<tr" + (i === first ? ' class="diverged"' : "") + '><td class="n">' + (i + 1) + "</td><td><code>" +
        esc(r.module) + '</code></td><td class="n">' + esc(R.text(R.num(r.error))) + '</td><td class="n">' +
        esc(R.text(R.num(r.limit))) + "</td><td>" + esc(r.how || "") + "</td></tr>";
    });
    return head + R.modules(rows, first) + '<details class="modules"><summary>every module (' + rows.length +
      ")</summary>" + table("modules", ["#", "module", "rel err", "limit", "how"], lines) + "</details>";
  }
  // One device against the module fingerprints its stored reference holds (harness.engine.drift): where it first
  // left them, each part's modules plotted in execution order against their limit, and the module tree behind it.
  function driftHTML(x) {
    var d = x.drift, title = "<h4>One device against its stored reference</h4>";
    if (!d) { return ""; }
    if (!d.forward) { return title + '<p class="muted drift-line">' + esc(d.absent || d.error || "") + "</p>"; }
    var moved = !/^(none|not localized)/.test(d.line || "");
    var parts = ["forward", "backward"].filter(function (p) { return d[p] && Array.isArray(d[p].modules); });
    return title + '<p class="drift-line' + (moved ? " moved" : "") + '">' + (moved ? "first moved: <code>" +
      esc(d.line) + "</code>" : esc(d.line)) + "</p>" + (d.ops ? '<p class="drift-ops">inside it: <code>' +
      esc(d.ops) + "</code></p>" : "") + '<p class="muted">limit: ' + esc(d.derived || "") + "</p>" +
      parts.map(function (p) {
        var t = d[p];
        return (parts.length > 1 ? "<h5>" + p + "</h5>" : "") + R.modules(t.modules, t.first) + treeHTML(t.modules);
      }).join("");
  }
  // The case run twice in one launch (harness.engine.repeat): bit for bit on every rank, or each rank's difference
  // and the first module that differed.
  function repeatHTML(x) {
    var r = x.repeat;
    if (!r || !Array.isArray(r.ranks)) { return ""; }
    var same = r.ranks.every(function (v) { return v === 0; });
    return '<h4>Run twice in one launch</h4><p class="repeat' + (same ? "" : " moved") + '">' + (same ?
      "bit for bit alike on every rank" : "per rank, the largest difference to the first run: " +
      esc(r.ranks.map(function (v, i) { return "rank " + i + " " + R.text(v); }).join(", ")) +
      (r.module ? "; first at <code>" + esc(r.module) + "</code>" : "")) + "</p>";
  }
  // The modules as a tree (a module, then what it holds, siblings in the order they ran), each with its drift.
  function treeHTML(rows) {
    var start = rows.map(function (r) {  // where a module's subtree first finished: the order siblings started in
      return rows.reduce(function (low, o, j) { return inside(o.module, r.module) ? Math.min(low, j) : low; }, 1e9);
    });
    function path(i) {  // the rows of the modules around row i, the outermost first, and row i itself
      return rows.map(function (o, j) { return j; })
        .filter(function (j) { return inside(rows[i].module, rows[j].module); })
        .sort(function (a, b) { return rows[a].module.length - rows[b].module.length; });
    }
    function key(i) { return path(i).map(function (j) { return start[j]; }).concat([i]); }
    var order = rows.map(function (r, i) { return {i: i, key: key(i)}; }).sort(function (a, b) {
      for (var k = 0; k < Math.min(a.key.length, b.key.length); k++) {
        if (a.key[k] !== b.key[k]) { return a.key[k] - b.key[k]; }
      }
      return a.key.length - b.key.length;
    });
    var lines = order.map(function (o) {
      var r = rows[o.i], over = R.num(r.error) !== null && R.num(r.error) > R.num(r.limit);
      return "<tr" + (over ? ' class="diverged"' : "") + '><td style="padding-left:' + (path(o.i).length - 1) +
        'em"><code>' + esc(r.module) + '</code></td><td class="n">' + esc(R.text(R.num(r.error))) +
        '</td><td class="n">' + esc(R.text(R.num(r.limit))) + "</td><td>" + esc(r.how || "") + "</td></tr>";
    });
    return '<details class="modules"><summary>the module tree (' + rows.length + ")</summary>" +
      table("modules", ["module", "rel err", "limit", "how"], lines) + "</details>";
  }
  function inside(name, outer) { return name === outer || name.indexOf(outer + ".") === 0; }
  function commsHTML(x) {  // harness.rank.comms_check.by_pattern: what ran per module pattern, and the minimum
    if (!Array.isArray(x.comms) || !x.comms.length) { return ""; }
    function counts(map, sized) {
      return Object.keys(map || {}).sort().map(function (k) {
        var v = map[k];
        return sized ? k + ":" + v[0] + " (" + R.text(v[1]) + " B)" : k + " \u2265 " + v;
      }).join(", ") || R.DASH;
    }
    var rows = x.comms.map(function (r) {
      return "<tr><td><code>" + esc(r.modules) + "</code>" + (r.count > 1 ? " " + R.TIMES + esc(r.count) : "") +
        "</td><td>" + esc(counts(r.recorded, true)) + "</td><td>" + esc(counts(r.expected, false)) + "</td></tr>";
    });
    return "<h4>Communication</h4>" + table("comms", ["modules", "recorded (count, bytes this rank put in)",
      "predicted minimum"], rows);
  }
  function factsHTML(c, x) {
    var ranks = x.peak_mem_mb_per_rank, memory = esc(R.plain(c.peak_mem_mb, 1));
    if (Array.isArray(ranks) && ranks.length) {
      memory += ' <span class="muted">(per rank: ' + esc(ranks.map(function (v) { return R.plain(v, 1); })
        .join(", ")) + ")</span>";
    }
    var rows = [["dispatched", "<code>" + esc(c.dispatched || R.DASH) + "</code>"],
      ["kernels", c.kernels ? '<code class="kernels">' + esc(c.kernels) + "</code>" : "<code>" + R.DASH +
        '</code> <span class="muted">(none recorded)</span>'],
      ["comms", "<code>" + esc(c.comms || R.DASH) + "</code>"],
      ["seconds", esc(R.num(c.seconds) === null ? R.DASH : R.general(R.num(c.seconds), 3))],
      ["peak memory (MB)", memory]];
    return '<h4>Run</h4><table class="metrics">' + rows.map(function (r) {
      return '<tr><th scope="row">' + r[0] + "</th><td>" + r[1] + "</td></tr>";
    }).join("") + "</table>";
  }
  function otherHTML(x, left, drawn) {  // the keys of `extra` no part above draws (embed.py DRAWN)
    var keys = Object.keys(x).filter(function (k) { return drawn.indexOf(k) < 0; });
    if (!keys.length && !left) { return ""; }
    var rest = {};
    keys.forEach(function (k) { rest[k] = x[k]; });
    return '<h4>Other data</h4><div class="other-data">' + (keys.length ? R.valueHTML(rest) : "") + "</div>" +
      (left ? '<p class="muted left-out">' + esc(left) + ": in results.json (the page carries the " +
        "other data of the cases that need a look only)</p>" : "");
  }
  R.plain = function (v, digits) {
    var x = R.num(v);
    if (x === null) { return R.DASH; }
    return isFinite(x) ? x.toFixed(digits) : String(v);
  };
})();
