"""The page script of index.html: it reads the embedded records (embed.py) and draws, only when asked, a case's
detail, a group's rows and a model's matrix; it applies the filters (also from the URL: ?status=FAIL, ?failures=1,
?model=flux) and opens the case a link or the URL's #case-... names.

Kept in Python so it ships with the package without package-data setup. Detail formatting follows data.py (short,
full, plain) so numbers read the same as in the server-rendered rows.
"""

import json

from harness.report.data import BAD
from harness.report.embed import FIELDS, SPELLED, STRINGS

_SCRIPT = r"""
(function () {
  "use strict";
  var root = document.documentElement;
  root.classList.add("js");
  var dataEl = document.getElementById("report-data");
  var form = document.getElementById("filters");
  if (!dataEl || !form) { return; }
  var FIELDS = __FIELDS__, STRINGS = __STRINGS__, SPELLED = __SPELLED__;
  var KEYS = ["status", "model", "layout", "backend", "dtype"];
  var BAD = __BAD__;
  var DASH = "\u2014", TIMES = "\u00d7";
  var SHOWN_EXTRA = {images: 1, abs_err_hist: 1, traceback: 1, ssim: 1, psnr: 1, peak_mem_mb_per_rank: 1, train: 1,
                     localization: 1, comms: 1};
  var IMAGE_ORDER = ["reference", "candidate", "thumbnail", "diff", "ssim_map"];
  var D = JSON.parse(dataEl.textContent);
  var cases = D.c.map(decode);
  var bySlug = assignSlugs(cases), built = {};
  var pane = document.getElementById("details"), opened = document.getElementById("opened");

  // -- records --------------------------------------------------------------------------------------------------
  function decode(row, i) {
    var c = {i: i};
    FIELDS.forEach(function (name, f) {
      var v = f < row.length ? row[f] : null;
      if (name === "case_id") { c.case_id = v === SPELLED ? null : D.s[v]; }
      else if (STRINGS.indexOf(name) >= 0) { c[name] = D.s[v]; }
      else { c[name] = v; }
    });
    if (c.case_id === null) { c.case_id = spelledId(c); }
    c.shown = c.status;
    return c;
  }
  function spelledId(c) {
    var model = c.shape === "default" ? c.model : c.model + "@" + c.shape;
    return [model, c.layout, c.backend, c.dtype, c.kind].join("/");
  }
  function extraOf(c) {
    if (c.x) { return c.x; }
    var out = {}, pairs = c.extra || [];
    for (var k = 0; k < pairs.length; k += 2) {
      var key = D.s[pairs[k]], value = D.v[pairs[k + 1]];
      if (key === "abs_err_hist" && value && typeof value.edges === "number") {
        value = {edges: D.v[value.edges], counts: value.counts};
      }
      out[key] = value;
    }
    c.x = out;
    return out;
  }
  function baseSlug(id) {
    return "case-" + (id.replace(/[^A-Za-z0-9_.-]+/g, "-").replace(/^-+|-+$/g, "") || "unnamed");
  }
  function assignSlugs(list) {
    var seen = {}, map = {};
    list.forEach(function (c) {
      var slug = baseSlug(c.case_id);
      seen[slug] = (seen[slug] || 0) + 1;
      c.slug = seen[slug] === 1 ? slug : slug + "-" + seen[slug];
      map[c.slug] = c.i;
    });
    return map;
  }

  // -- numbers, as data.py writes them --------------------------------------------------------------------------
  function num(v) {
    if (v === null || v === undefined || typeof v === "boolean") { return null; }
    if (typeof v === "number") { return v; }
    var text = String(v).trim().toLowerCase().replace(/^\+/, "");
    if (text === "nan" || text === "-nan") { return NaN; }
    if (text === "inf" || text === "infinity") { return Infinity; }
    if (text === "-inf" || text === "-infinity") { return -Infinity; }
    var x = text === "" ? NaN : Number(text);
    return isNaN(x) ? null : x;
  }
  function word(x) { return isNaN(x) ? "nan" : (x > 0 ? "inf" : "-inf"); }
  function exponent(x, digits) {
    var parts = x.toExponential(digits).split("e"), e = parseInt(parts[1], 10);
    return parts[0] + "e" + (e < 0 ? "-" : "+") + (Math.abs(e) < 10 ? "0" : "") + Math.abs(e);
  }
  function trimZeros(text) { return text.indexOf(".") >= 0 ? text.replace(/\.?0+$/, "") : text; }
  function general(x, p) {
    if (x === 0) { return "0"; }
    var e = parseInt(x.toExponential(p - 1).split("e")[1], 10);
    if (e < -4 || e >= p) {
      var parts = exponent(x, p - 1).split("e");
      return trimZeros(parts[0]) + "e" + parts[1];
    }
    return trimZeros(x.toFixed(Math.max(0, p - 1 - e)));
  }
  function short(v) {
    var x = num(v);
    if (x === null) { return ""; }
    if (!isFinite(x)) { return word(x); }
    if (x === 0) { return "0"; }
    var parts = x.toExponential(1).split("e");
    return parts[0] + "e" + parseInt(parts[1], 10);
  }
  function full(v) {
    if (v === null || v === undefined || v === "") { return DASH; }
    var x = num(v);
    if (x === null) { return String(v); }
    return isFinite(x) ? exponent(x, 3) : word(x);
  }
  function count(v) { var x = num(v); return x === null ? DASH : (isFinite(x) ? String(x) : word(x)); }
  function plain(v, spec) {
    var x = num(v);
    if (x === null) { return DASH; }
    if (!isFinite(x)) { return word(x); }
    var digits = parseInt(spec.slice(1), 10);
    return spec.slice(-1) === "g" ? general(x, digits) : x.toFixed(digits);
  }
  function keyNumber(c) {
    var ssim = num(c.ssim !== null && c.ssim !== undefined ? c.ssim : (c.extra ? extraOf(c).ssim : null));
    if (ssim !== null) { return "SSIM " + ssim.toFixed(4); }
    return short(c.max_abs_err);
  }
  var ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"};
  function esc(s) { return String(s).replace(/[&<>"']/g, function (ch) { return ESC[ch]; }); }
  function badge(status) { return '<span class="badge s-' + esc(status) + '">' + esc(status) + "</span>"; }

  // -- a case's detail ------------------------------------------------------------------------------------------
  function detailHTML(c) {
    var x = extraOf(c);
    return closeButton() + reasonHTML(c, x) + localizationHTML(c, x) + imagesHTML(c, x) + trainingHTML(c, x) +
      metricsHTML(c, x) + commsHTML(x) + histogramHTML(c, x) + otherHTML(x);
  }
  function closeButton() {
    return '<button type="button" class="close" data-close title="remove this case from the opened cases">' +
      "close</button>";
  }
  function reasonHTML(c, x) {
    var out = c.reason ? '<h4>Reason</h4><pre class="reason">' + esc(c.reason) + "</pre>" : "";
    if (x.traceback) { out += '<h4>Traceback</h4><pre class="traceback">' + esc(x.traceback) + "</pre>"; }
    return out;
  }
  function verdict(value, limit) {
    var x = num(value), tol = num(limit);
    if (x === null || tol === null || tol <= 0 || !isFinite(x)) { return ""; }
    return ' <span class="muted">(' + general(x / tol, 2) + TIMES + " tolerance)</span>";
  }
  function metricsHTML(c, x) {
    var where = [c.model, "shape " + c.shape, c.kind, c.layout + " (world size " + count(c.world_size) + ")",
                 c.backend, c.dtype].join(" \u00b7 ");
    var rows = [["case", esc(where)], ["max abs err", esc(full(c.max_abs_err)) + verdict(c.max_abs_err, c.tolerance)],
      ["tolerance", esc(full(c.tolerance))], ["mean abs err", esc(full(c.mean_abs_err))],
      ["max rel err", esc(full(c.max_rel_err))], ["non-finite values", esc(count(c.nonfinite))],
      ["baseline err", esc(full(c.baseline_err))], ["err ratio (vs baseline)", esc(plain(c.err_ratio, ".3g"))]];
    var ssim = c.ssim !== null && c.ssim !== undefined ? c.ssim : x.ssim;
    var psnr = c.psnr !== null && c.psnr !== undefined ? c.psnr : x.psnr;
    if (c.kind === "train") {
      rows.splice(1, 1, ["loss rel err", esc(full(c.loss_err))], ["gradient rel L2 err", esc(full(c.grad_err))],
                  ["worst gradient", "<code>" + esc(c.worst_param || DASH) + "</code>"],
                  ["weights max abs err", esc(full(c.max_abs_err))]);
    }
    if (num(ssim) !== null || num(psnr) !== null) {
      rows.push(["SSIM / PSNR", esc(plain(ssim, ".4f")) + " / " + esc(plain(psnr, ".2f")) + " dB"]);
    }
    rows.push(["dispatched", "<code>" + esc(c.dispatched || DASH) + "</code>"], ["kernels", kernelsHTML(c.kernels)],
              ["comms", "<code>" + esc(c.comms || DASH) + "</code>"],
              ["seconds", esc(plain(c.seconds, ".3g"))], ["peak memory (MB)", memoryHTML(c, x)]);
    return '<table class="metrics">' + rows.map(function (r) {
      return '<tr><th scope="row">' + r[0] + "</th><td>" + r[1] + "</td></tr>";
    }).join("") + "</table>";
  }
  function kernelsHTML(kernels) {
    if (!kernels) { return "<code>" + DASH + '</code> <span class="muted">(none recorded)</span>'; }
    return '<code class="kernels">' + esc(kernels) + "</code>";
  }
  function commsHTML(x) {  // harness.rank.comms_check.by_pattern: what ran per module pattern, and the minimum
    if (!Array.isArray(x.comms) || !x.comms.length) { return ""; }
    function counts(map, sized) {
      return Object.keys(map || {}).sort().map(function (k) {
        var v = map[k];
        return sized ? k + ":" + v[0] + " (" + count(v[1]) + " B)" : k + " \u2265 " + v;
      }).join(", ") || DASH;
    }
    var rows = x.comms.map(function (r) {
      return "<tr><td><code>" + esc(r.modules) + "</code>" + (r.count > 1 ? " " + TIMES + esc(r.count) : "") +
        "</td><td>" + esc(counts(r.recorded, true)) + "</td><td>" + esc(counts(r.expected, false)) + "</td></tr>";
    }).join("");
    return '<h4>Communication</h4><table class="cases comms"><thead><tr><th>modules</th><th>recorded ' +
      "(count, bytes this rank put in)</th><th>predicted minimum</th></tr></thead><tbody>" + rows + "</tbody></table>";
  }
  function memoryHTML(c, x) {
    var out = esc(plain(c.peak_mem_mb, ".1f")), ranks = x.peak_mem_mb_per_rank;
    if (Array.isArray(ranks) && ranks.length) {
      out += ' <span class="muted">(per rank: ' + esc(ranks.map(function (v) { return plain(v, ".1f"); })
        .join(", ")) + ")</span>";
    }
    return out;
  }
  var CAPTIONS = {reference: "reference (fp32, single device)", candidate: "candidate",
                  thumbnail: "candidate (thumbnail)", diff: "difference " + TIMES + "10", ssim_map: "SSIM map"};
  var LEGENDS = {
    diff: ["diff", ["0", "0.05", "\u2265 0.1"], "|candidate \u2212 reference| per colour channel, " + TIMES +
           "10, clipped to [0, 1]: black = equal, full brightness = off by 0.1 or more (pixels in [0, 1]); the " +
           "colour tells which channel differs"],
    ssim_map: ["ssim", ["\u2264 0", "0.5", "1"], "local SSIM per colour channel (7" + TIMES + "7 windows, " +
               "smaller for tiny pictures), clipped to [0, 1]: white = same structure (1), black = none (0 or " +
               "below); for a video, its worst frame"]
  };
  function legendHTML(name) {
    var legend = LEGENDS[name];
    if (!legend) { return ""; }
    var ticks = legend[1].map(function (t) { return "<span>" + esc(t) + "</span>"; }).join("");
    return '<div class="scale"><span class="bar ' + legend[0] + '" role="img" aria-label="colour scale from ' +
      esc(legend[1][0]) + " (black) to " + esc(legend[1][2]) + ' (white)"></span><span class="ticks">' + ticks +
      '</span></div><p class="scale-note">' + esc(legend[2]) + "</p>";
  }
  function imagesHTML(c, x) {
    var images = x.images;
    if (!images || typeof images !== "object") { return ""; }
    var names = IMAGE_ORDER.filter(function (n) { return n in images; })
      .concat(Object.keys(images).filter(function (n) { return IMAGE_ORDER.indexOf(n) < 0; }));
    var figures = names.map(function (name) {
      var label = CAPTIONS[name] || name.replace(/_/g, " ");
      return '<figure class="img-' + esc(name) + '"><img src="' + esc(images[name]) + '" alt="' + esc(label) +
        " image of " + esc(c.case_id) + '"><figcaption>' + esc(label) + "</figcaption>" + legendHTML(name) +
        "</figure>";
    }).join("");
    var note = "thumbnail" in images && !("diff" in images) ? '<p class="muted">Reference, difference and SSIM ' +
      "map are kept for failing cases only (<code>--images all</code> keeps all four).</p>" : "";
    return '<h4>Images</h4><div class="images">' + figures + "</div>" + note;
  }
  // A localized case: each module's error (log scale) in execution order against its limit, the first divergence
  // marked, and the table behind it.
  function localizationHTML(c, x) {
    var loc = x.localization;
    if (!loc || !Array.isArray(loc.modules)) {
      return x.localization_error ? "<h4>Where it breaks</h4><p>not localized: " + esc(x.localization_error) +
        "</p>" : "";
    }
    var rows = loc.modules, first = loc.first;
    var head = '<h4>Where it breaks</h4><p class="first-divergence">' +
      (first === null || first === undefined ? "no module above its limit" : "first divergence: <code>" +
       esc(c.first_divergence || rows[first].module) + "</code>") + "</p>";
    var table = rows.map(function (r, i) {
      var mark = i === first ? ' class="diverged"' : "";
      return "<tr" + mark + "><td>" + (i + 1) + "</td><td><code>" + esc(r.module) + "</code></td><td>" +
        esc(full(r.error)) + "</td><td>" + esc(full(r.limit)) + "</td><td>" + esc(r.how || "") + "</td></tr>";
    }).join("");
    return head + moduleSVG(rows, first) + '<details class="modules"><summary>every module (' + rows.length +
      ')</summary><table class="metrics"><tr><th>#</th><th>module</th><th>rel err</th><th>limit</th><th>how</th>' +
      "</tr>" + table + "</table></details>";
  }
  function moduleSVG(rows, first) {
    var width = 560, height = 170, pad = 34, n = rows.length;
    function lg(v) { return Math.log10(Math.min(Math.max(v, 1e-9), 10)); }
    function px(i) { return pad + (n > 1 ? i * (width - 2 * pad) / (n - 1) : 0); }
    function py(v) { return height - pad - (lg(v) + 9) / 10 * (height - 2 * pad); }
    var points = [], limits = [];
    rows.forEach(function (r, i) {
      if (num(r.error) !== null) { points.push(px(i).toFixed(1) + "," + py(num(r.error)).toFixed(1)); }
      if (num(r.limit) !== null) { limits.push(px(i).toFixed(1) + "," + py(num(r.limit)).toFixed(1)); }
    });
    var marker = "";
    if (first !== null && first !== undefined && num(rows[first].error) !== null) {
      var fx = px(first), fy = py(num(rows[first].error));
      marker = '<circle class="first" cx="' + fx.toFixed(1) + '" cy="' + fy.toFixed(1) + '" r="5"><title>' +
        esc(rows[first].module) + "</title></circle>";
    }
    var axis = '<line class="axis" x1="' + pad + '" y1="' + (height - pad) + '" x2="' + (width - pad) + '" y2="' +
      (height - pad) + '"/><text x="2" y="' + (pad + 4) + '">10</text><text x="2" y="' + (height - pad) +
      '">1e-9</text><text x="' + pad + '" y="' + (height - 12) + '">first module to finish</text><text x="' +
      (width - pad) + '" y="' + (height - 12) + '" text-anchor="end">last</text><text class="err" x="' + pad +
      '" y="14">\u25cf rel err per module</text><text class="lim" x="' + (pad + 150) + '" y="14">- - limit</text>';
    return '<svg class="modules" viewBox="0 0 ' + width + " " + height + '" width="' + width + '" height="' + height +
      '" role="img" aria-label="error per module in execution order">' + axis + '<polyline class="lim" points="' +
      limits.join(" ") + '"/><polyline class="err" points="' + points.join(" ") + '"/>' + marker + "</svg>";
  }
  // A train case: the loss of every step (reference, this layout, the single-device run of its dtype) and the ten
  // parameters whose step-1 gradient is furthest from the reference's.
  function trainingHTML(c, x) {
    var t = x.train;
    if (!t || !Array.isArray(t.losses)) { return ""; }
    var lines = [["reference (fp32, one device)", t.reference_losses, "ref"], ["this layout", t.losses, "run"]];
    if (Array.isArray(t.baseline_losses) && c.dtype !== "fp32") {
      lines.push(["one device, " + c.dtype, t.baseline_losses, "base"]);
    }
    var rows = (t.worst_gradients || []).map(function (g) {
      return "<tr><td><code>" + esc(g.param) + "</code></td><td>" + esc(full(g.rel_l2)) + "</td><td>" +
        esc(full(g.max_abs)) + "</td><td>" + esc(full(g.baseline_rel_l2)) + "</td><td>" +
        esc(full(g.noise_rel_l2)) + "</td><td>" + esc(full(g.limit)) + "</td></tr>";
    }).join("");
    var engine = t.engine ? '<p class="muted">data parallel by ' + esc(t.engine) + "</p>" : "";
    return "<h4>Loss per step</h4>" + lossSVG(lines) + engine +
      '<h4>Step-1 gradients furthest from the reference</h4><table class="metrics grads"><tr><th>parameter</th>' +
      "<th>rel L2 err</th><th>max abs err</th><th>one device, same dtype</th><th>largest noise draw</th>" +
      "<th>limit</th></tr>" + rows + "</table>";
  }
  function lossSVG(lines) {
    var width = 560, height = 160, pad = 34, all = [];
    lines.forEach(function (l) { (l[1] || []).forEach(function (v) { if (num(v) !== null) { all.push(num(v)); } }); });
    if (!all.length) { return ""; }
    var low = Math.min.apply(null, all), high = Math.max.apply(null, all), span = high - low || Math.abs(high) || 1;
    var steps = Math.max.apply(null, lines.map(function (l) { return (l[1] || []).length; }));
    function px(i) { return pad + (steps > 1 ? i * (width - 2 * pad) / (steps - 1) : (width - 2 * pad) / 2); }
    function py(v) { return height - pad - (v - low) / span * (height - 2 * pad); }
    var paths = lines.map(function (l) {
      var points = (l[1] || []).map(function (v, i) { return px(i).toFixed(1) + "," + py(num(v)).toFixed(1); });
      var dots = points.map(function (p) {
        var xy = p.split(",");
        return '<circle cx="' + xy[0] + '" cy="' + xy[1] + '" r="3"/>';
      }).join("");
      return '<g class="' + l[2] + '"><polyline points="' + points.join(" ") + '"/>' + dots + "<title>" +
        esc(l[0] + ": " + (l[1] || []).map(function (v) { return general(num(v), 8); }).join(", ")) + "</title></g>";
    }).join("");
    var at = pad, legend = lines.map(function (l) {
      var text = '<text class="' + l[2] + '" x="' + at + '" y="14">\u25cf ' + esc(l[0]) + "</text>";
      at += 6 * (l[0].length + 2) + 12;  // 10px text is about 6px a character
      return text;
    }).join("");
    var axis = '<line class="axis" x1="' + pad + '" y1="' + (height - pad) + '" x2="' + (width - pad) + '" y2="' +
      (height - pad) + '"/><text x="' + pad + '" y="' + (height - 12) + '">step 1</text><text x="' +
      (width - pad) + '" y="' + (height - 12) + '" text-anchor="end">step ' + steps + "</text>" +
      '<text x="2" y="' + (pad + 4) + '">' + esc(general(high, 4)) + '</text><text x="2" y="' + (height - pad) +
      '">' + esc(general(low, 4)) + "</text>";
    return '<svg class="loss" viewBox="0 0 ' + width + " " + height + '" width="' + width + '" height="' + height +
      '" role="img" aria-label="loss per step">' + axis + paths + legend + "</svg>";
  }
  function histogramHTML(c, x) {
    var hist = x.abs_err_hist;
    if (!hist || typeof hist !== "object") { return ""; }
    var edges = (hist.edges || []).map(num), counts = (hist.counts || []).map(num);
    if (!counts.length || edges.length !== counts.length + 1 || edges.concat(counts).indexOf(null) >= 0) {
      return "";
    }
    return "<h4>Absolute error histogram</h4>" + histogramSVG(edges, counts, num(c.tolerance));
  }
  function histogramSVG(edges, counts, tolerance) {
    var width = 420, height = 140, pad = 22, barW = (width - 2 * pad) / counts.length;
    var top = Math.log10(1 + Math.max(Math.max.apply(null, counts), 1)), bars = "";
    counts.forEach(function (n, i) {
      var h = (height - 2 * pad) * Math.log10(1 + Math.max(n, 0)) / top, x = pad + i * barW, y = height - pad - h;
      var tip = "[" + exponent(edges[i], 2) + ", " + exponent(edges[i + 1], 2) + "): " + n;
      bars += '<rect x="' + x.toFixed(1) + '" y="' + y.toFixed(1) + '" width="' + Math.max(barW - 1, 0.5).toFixed(1) +
        '" height="' + h.toFixed(1) + '"><title>' + esc(tip) + "</title></rect>";
    });
    var axis = '<line class="axis" x1="' + pad + '" y1="' + (height - pad) + '" x2="' + (width - pad) + '" y2="' +
      (height - pad) + '"/><text x="' + pad + '" y="' + (height - 6) + '">' + exponent(edges[0], 1) + "</text>" +
      '<text x="' + (width - pad) + '" y="' + (height - 6) + '" text-anchor="end">' +
      exponent(edges[edges.length - 1], 1) + '</text><text x="' + pad + '" y="14">count (log scale), max ' +
      Math.max.apply(null, counts) + "</text>";
    return '<svg class="hist" viewBox="0 0 ' + width + " " + height + '" width="' + width + '" height="' + height +
      '" role="img" aria-label="histogram of absolute error">' + bars + axis +
      toleranceMarker(edges, tolerance, pad, barW, height) + "</svg>";
  }
  function toleranceMarker(edges, tolerance, pad, barW, height) {
    if (tolerance === null || !(edges[0] <= tolerance && tolerance <= edges[edges.length - 1])) { return ""; }
    for (var i = 0; i < edges.length - 1; i++) {
      if (edges[i] <= tolerance && tolerance <= edges[i + 1]) {
        var frac = edges[i + 1] > edges[i] ? (tolerance - edges[i]) / (edges[i + 1] - edges[i]) : 0;
        var x = (pad + (i + frac) * barW).toFixed(1);
        return '<line class="tol" x1="' + x + '" y1="' + pad + '" x2="' + x + '" y2="' + (height - pad) + '"/>' +
          '<text class="tol" x="' + (Number(x) + 3).toFixed(1) + '" y="' + (pad + 10) + '">tolerance</text>';
      }
    }
    return "";
  }
  function otherHTML(x) {
    var keys = Object.keys(x).filter(function (k) { return !SHOWN_EXTRA[k]; });
    if (!keys.length) { return ""; }
    return '<h4>Other data</h4><table class="metrics">' + keys.map(function (k) {
      return '<tr><th scope="row">' + esc(k) + "</th><td><code>" + esc(asText(x[k])) + "</code></td></tr>";
    }).join("") + "</table>";
  }
  function asText(value) {
    if (typeof value === "string") { return value; }
    var text = JSON.stringify(value);
    return text.length <= 2000 ? text : text.slice(0, 2000) + " \u2026";
  }

  // -- rows, groups and the matrix ------------------------------------------------------------------------------
  function caseRow(c, note) {
    return '<tr class="case-row" data-i="' + c.i + '"><td>' + badge(c.shown) + '</td><td><a class="case-link" ' +
      'href="#' + esc(c.slug) + '"><code>' + esc(c.case_id) + '</code></a></td><td class="n">' +
      esc(keyNumber(c)) + '</td><td><div class="reason-cell">' + esc(note) + "</div></td></tr>";
  }
  function buildGroup(group) {
    var key = group.getAttribute("data-group");
    if (built[key]) { return; }
    var title = group.querySelector(".why").textContent;
    var rows = D.g[key].map(function (i) {
      var c = cases[i], note = c.reason;
      if (note.indexOf(title) === 0) { note = note.slice(title.length).replace(/^;\s*/, ""); }
      return caseRow(c, note);
    }).join("");
    group.querySelector(".rows").innerHTML = '<table class="cases"><tbody>' + rows + "</tbody></table>";
    built[key] = true;
    applyTo(group, state());
  }
  function label(parts) { return parts.filter(Boolean).map(esc).join(" \u00b7 "); }
  function buildMatrix(section) {
    var model = section.getAttribute("data-model");
    if (built["model:" + model]) { return; }
    var mine = cases.filter(function (c) { return c.model === model; });
    var shapes = unique(mine.map(function (c) { return c.shape; })), kinds = unique(mine.map(function (c) {
      return c.kind; }));
    var cols = ordered(mine, ["shape", "kind", "dtype"]), rows = ordered(mine, ["layout", "backend"]);
    var grid = {};
    mine.forEach(function (c) {
      var key = rows.indexOf(c.layout + "\u0000" + c.backend) + ":" + cols.indexOf(c.shape + "\u0000" + c.kind +
        "\u0000" + c.dtype);
      grid[key] = (grid[key] || "") + cellHTML(c);
    });
    var head = cols.map(function (col, j) {
      var p = col.split("\u0000");
      var top = label([shapes.length > 1 || p[0] !== "default" ? p[0] : "", kinds.length > 1 ? p[1] : ""]);
      return '<th scope="col" data-col="' + j + '"><span class="shape">' + (top || "&nbsp;") + "</span>" +
        '<span class="dtype">' + esc(p[2]) + "</span></th>";
    }).join("");
    var body = rows.map(function (row, r) {
      var p = row.split("\u0000"), cells = cols.map(function (col, j) {
        var html = grid[r + ":" + j];
        return '<td data-col="' + j + '"' + (html ? "" : ' class="empty"') + ">" + (html || "") + "</td>";
      }).join("");
      return '<tr class="mrow"><th scope="row"><span class="layout">' + esc(p[0]) + '</span> <span class="backend">' +
        esc(p[1]) + "</span></th>" + cells + "</tr>";
    }).join("");
    section.querySelector(".model-body").innerHTML = '<div class="scroll"><table class="matrix"><thead><tr>' +
      '<th scope="col">layout backend</th>' + head + "</tr></thead><tbody>" + body + "</tbody></table></div>" +
      '<p class="muted skip-note"></p>';
    built["model:" + model] = true;
    applyTo(section, state());
  }
  function cellHTML(c) {
    var tip = c.reason || c.case_id + ": " + c.shown, number = c.status === "SKIP" ? "" : keyNumber(c);
    return '<a class="cell-case s-' + esc(c.shown) + '" href="#' + esc(c.slug) + '" data-i="' + c.i + '" title="' +
      esc(tip) + '"><b>' + esc(c.shown) + '</b><span class="num">' + (esc(number) || "&nbsp;") + "</span></a>";
  }
  function unique(values) {
    var seen = {};
    return values.filter(function (v) { return seen.hasOwnProperty(v) ? false : (seen[v] = true); });
  }
  function ordered(list, keys) {
    // Distinct combinations of `keys` ("\u0000"-joined), sorted by each key's order of first appearance (plan order).
    var orders = keys.map(function (key) { return unique(list.map(function (c) { return c[key]; })); });
    var combos = unique(list.map(function (c) {
      return keys.map(function (key) { return c[key]; }).join("\u0000");
    }));
    function rank(combo) { return combo.split("\u0000").map(function (v, k) { return orders[k].indexOf(v); }); }
    return combos.sort(function (a, b) {
      var ra = rank(a), rb = rank(b);
      for (var k = 0; k < ra.length; k++) { if (ra[k] !== rb[k]) { return ra[k] - rb[k]; } }
      return 0;
    });
  }

  // -- filters --------------------------------------------------------------------------------------------------
  function state() {
    var st = {failures: form.elements.failures.checked, skips: form.elements.skips.checked};
    KEYS.forEach(function (k) { st[k] = form.elements[k].value; });
    return st;
  }
  function matches(c, st) {
    for (var k = 0; k < KEYS.length; k++) {
      if (st[KEYS[k]] && c[KEYS[k]] !== st[KEYS[k]]) { return false; }
    }
    return !(st.failures && !BAD[c.status]);
  }
  function caseOf(el) { return cases[Number(el.getAttribute("data-i"))]; }
  function applyTo(scope, st) {
    scope.querySelectorAll("tr.case-row, details.case").forEach(function (el) {
      el.hidden = !matches(caseOf(el), st);
    });
    scope.querySelectorAll("table.matrix").forEach(function (table) { filterMatrix(table, st); });
  }
  function filterMatrix(table, st) {
    var showSkips = st.skips || st.status === "SKIP", cols = {}, hiddenRows = 0;
    table.querySelectorAll("tr.mrow").forEach(function (tr) {
      var any = false, real = false;
      tr.querySelectorAll("a.cell-case").forEach(function (a) {
        var c = caseOf(a), shown = matches(c, st);
        a.hidden = !shown;
        if (shown && (showSkips || c.status !== "SKIP")) {
          real = true;
          cols[a.parentElement.getAttribute("data-col")] = true;
        }
        any = any || shown;
      });
      tr.hidden = !real;
      if (any && !real) { hiddenRows++; }
    });
    table.querySelectorAll("[data-col]").forEach(function (cell) {
      cell.hidden = !cols[cell.getAttribute("data-col")];
    });
    var note = table.parentElement.parentElement.querySelector(".skip-note");
    if (note) {
      note.textContent = hiddenRows ? hiddenRows + " row" + (hiddenRows > 1 ? "s" : "") + " in which every case " +
        "is SKIP left out (tick \u201call-SKIP matrix rows\u201d above to show them)." : "";
    }
  }
  function apply() {
    var st = state(), shown = 0, models = {};
    cases.forEach(function (c) { if (matches(c, st)) { shown++; models[c.model] = true; } });
    applyTo(document, st);
    document.querySelectorAll("details.group").forEach(function (group) {
      var members = D.g[group.getAttribute("data-group")], n = 0;
      members.forEach(function (i) { if (matches(cases[i], st)) { n++; } });
      var label = group.querySelector(".n");
      label.textContent = n === members.length ? String(n) : n + " of " + members.length;
      group.hidden = n === 0;
    });
    document.querySelectorAll("details.model").forEach(function (m) {
      m.hidden = !models[m.getAttribute("data-model")];
    });
    document.querySelectorAll("section").forEach(function (section) {
      var note = section.querySelector(":scope > .no-match");
      if (note) { note.hidden = !!section.querySelector("tr.case-row:not([hidden]), details.group:not([hidden])," +
        " details.model:not([hidden])"); }
    });
    pane.hidden = !opened.querySelector("details.case:not([hidden])");
    document.getElementById("shown-count").textContent = "Showing " + shown + " of " + cases.length + " cases";
  }
  function fromQuery() {
    var params = new URLSearchParams(window.location.search);
    KEYS.forEach(function (k) {
      var v = params.get(k), sel = form.elements[k];
      var known = Array.prototype.some.call(sel.options, function (o) { return o.value === v; });
      if (v !== null && known) { sel.value = v; }
    });
    form.elements.failures.checked = ["1", "true", "yes"].indexOf(params.get("failures")) >= 0;
    form.elements.skips.checked = ["1", "true", "yes"].indexOf(params.get("skips")) >= 0;
  }

  // -- opening cases --------------------------------------------------------------------------------------------
  function fill(details) {
    var body = details.querySelector(".case-body");
    if (!body.hasChildNodes()) { body.innerHTML = detailHTML(caseOf(details)); }
  }
  function openCase(slug, scroll) {
    var i = bySlug[slug];
    if (i === undefined) { return null; }
    var c = cases[i];
    if (!matches(c, state())) { form.reset(); apply(); }
    var d = document.getElementById(slug);
    if (!d) {
      d = document.createElement("details");
      d.className = "case";
      d.id = c.slug;
      d.setAttribute("data-i", String(i));
      d.innerHTML = "<summary>" + badge(c.shown) + " <code>" + esc(c.case_id) + "</code></summary>" +
        '<div class="case-body"></div>';
      opened.insertBefore(d, opened.firstChild);
    }
    pane.hidden = false;
    d.open = true;
    fill(d);
    if (scroll) {
      d.style.scrollMarginTop = form.offsetHeight + 12 + "px";  // clear of the sticky filter bar
      d.scrollIntoView({block: "start"});
      d.querySelector("summary").focus({preventScroll: true});
    }
    return d;
  }
  function moveFocus(link, key) {
    var td = link.closest("td"), tr = td.parentElement;
    var dr = {ArrowUp: -1, ArrowDown: 1}[key] || 0, dc = {ArrowLeft: -1, ArrowRight: 1}[key] || 0;
    var rows = Array.prototype.filter.call(tr.parentElement.rows, function (r) { return !r.hidden; });
    var r = rows.indexOf(tr), col = td.cellIndex;
    for (;;) {
      r += dr; col += dc;
      if (r < 0 || r >= rows.length || col < 1 || col >= rows[r].cells.length) { return; }
      var cell = rows[r].cells[col];
      var next = cell.hidden ? null : cell.querySelector(".cell-case:not([hidden])");
      if (next) { next.focus(); return; }
    }
  }
  function onToggle(e) {
    var el = e.target;
    if (!el.open || !el.classList) { return; }
    if (el.classList.contains("case")) { fill(el); }
    else if (el.classList.contains("group")) { buildGroup(el); }
    else if (el.classList.contains("model")) { buildMatrix(el); }
  }
  function firstFailing() {
    var rows = document.querySelectorAll("#failing tr.case-row:not([hidden])");
    for (var k = 0; k < rows.length; k++) {
      if (BAD[caseOf(rows[k]).status]) { return caseOf(rows[k]); }
    }
    return null;
  }

  form.addEventListener("change", apply);
  form.addEventListener("submit", function (e) { e.preventDefault(); apply(); });
  form.addEventListener("reset", function () { window.setTimeout(apply, 0); });
  document.querySelectorAll("[data-set-status]").forEach(function (b) {
    b.addEventListener("click", function () {
      form.elements.status.value = b.getAttribute("data-set-status");
      apply();
    });
  });
  document.addEventListener("toggle", onToggle, true);
  document.addEventListener("click", function (e) {
    var close = e.target.closest && e.target.closest("[data-close]");
    if (close) {
      close.closest("details.case").remove();
      pane.hidden = !opened.hasChildNodes();
      return;
    }
    var a = e.target.closest && e.target.closest('a[href^="#case-"]');
    if (a) { openCase(a.getAttribute("href").slice(1), true); }
  });
  document.addEventListener("keydown", function (e) {
    if (e.target.classList && e.target.classList.contains("cell-case") && /^Arrow/.test(e.key)) {
      e.preventDefault(); moveFocus(e.target, e.key);
    }
  });
  window.addEventListener("hashchange", function () { openCase(window.location.hash.slice(1), true); });
  var printed = [];
  window.addEventListener("beforeprint", function () {
    printed = cases.filter(function (c) { return BAD[c.status] && !document.getElementById(c.slug); })
      .map(function (c) { return openCase(c.slug, false); });
  });
  window.addEventListener("afterprint", function () {
    printed.forEach(function (d) { d.remove(); });
    pane.hidden = !opened.hasChildNodes();
  });
  fromQuery();
  document.querySelectorAll("details.model[open]").forEach(buildMatrix);
  apply();
  var first = window.location.hash ? null : firstFailing();
  if (window.location.hash) { openCase(window.location.hash.slice(1), true); }
  else if (first) { openCase(first.slug, false); }
  root.setAttribute("data-ready", "1");
  root.setAttribute("data-ready-ms", performance.now().toFixed(0));
})();
"""

JS = (_SCRIPT.replace("__FIELDS__", json.dumps(list(FIELDS)))
      .replace("__STRINGS__", json.dumps(sorted(STRINGS)))
      .replace("__SPELLED__", str(SPELLED))
      .replace("__BAD__", json.dumps(dict.fromkeys(sorted(BAD), True))))

# compare.html: draws a group's rows (status changes of one transition, or the cases in one run only) when it is
# first opened, from the lists embedded by compare_page.py.
COMPARE_JS = r"""
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
    var slug = "case-" + (id.replace(/[^A-Za-z0-9_.-]+/g, "-").replace(/^-+|-+$/g, "") || "unnamed");
    return '<a href="' + esc(D.index) + "#" + esc(slug) + '">' + code + "</a>";
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
"""
