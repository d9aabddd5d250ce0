/* The pictures of a case's detail, drawn as inline SVG from its data: a histogram block, a series block (lines over
   a shared x, with their differences to the first line), and the error per module of a localized case. */
(function () {
  "use strict";
  var R = window.HarnessReport;
  var MARKS = ["circle", "square", "triangle", "diamond"];  // one marker per line, so coinciding lines stay apart

  function svg(cls, width, height, label, inner) {
    return '<svg class="' + cls + '" viewBox="0 0 ' + width + " " + height + '" width="' + width + '" height="' +
      height + '" role="img" aria-label="' + R.esc(label) + '">' + inner + "</svg>";
  }
  function line(cls, x1, y1, x2, y2) {
    return '<line class="' + cls + '" x1="' + x1.toFixed(1) + '" y1="' + y1.toFixed(1) + '" x2="' + x2.toFixed(1) +
      '" y2="' + y2.toFixed(1) + '"/>';
  }
  function text(x, y, words, attrs) {
    return '<text x="' + x.toFixed(1) + '" y="' + y.toFixed(1) + '"' + (attrs || "") + ">" + R.esc(words) + "</text>";
  }
  function mark(k, x, y) {
    var shape = MARKS[k % MARKS.length], r = k === 0 ? 5 : 3.5, at = x.toFixed(1) + "," + y.toFixed(1);
    if (shape === "circle") { return '<circle class="mark" cx="' + x.toFixed(1) + '" cy="' + y.toFixed(1) + '" r="' +
      r + '"/>'; }
    if (shape === "square") { return '<rect class="mark" x="' + (x - r).toFixed(1) + '" y="' + (y - r).toFixed(1) +
      '" width="' + 2 * r + '" height="' + 2 * r + '"/>'; }
    var points = shape === "triangle" ? [[0, -r - 1], [r + 1, r], [-r - 1, r]] : [[0, -r - 1], [r + 1, 0], [0, r + 1],
      [-r - 1, 0]];
    return '<polygon class="mark" data-at="' + at + '" points="' + points.map(function (p) {
      return (x + p[0]).toFixed(1) + "," + (y + p[1]).toFixed(1);
    }).join(" ") + '"/>';
  }
  R.markKey = function (k) {  // the legend's picture of line k's marker
    return '<svg class="series key" width="14" height="14" viewBox="0 0 14 14" aria-hidden="true"><g class="s' + k +
      '">' + mark(k, 7, 7) + "</g></svg>";
  };

  // -- histogram: counts per bin (log scale), edges below, the limit (`marker`) as a dashed line ------------------
  R.histogram = function (block) {
    var edges = (block.edges || []).map(R.num), counts = (block.counts || []).map(R.num);
    if (!counts.length || edges.length !== counts.length + 1 || edges.concat(counts).indexOf(null) >= 0) { return ""; }
    var width = 420, height = 140, pad = 22, barW = (width - 2 * pad) / counts.length;
    var top = Math.log10(1 + Math.max(Math.max.apply(null, counts), 1)), bars = "";
    counts.forEach(function (n, i) {
      var h = (height - 2 * pad) * Math.log10(1 + Math.max(n, 0)) / top, x = pad + i * barW, y = height - pad - h;
      var tip = "[" + R.exponent(edges[i], 2) + ", " + R.exponent(edges[i + 1], 2) + "): " + n;
      bars += '<rect x="' + x.toFixed(1) + '" y="' + y.toFixed(1) + '" width="' + Math.max(barW - 1, 0.5).toFixed(1) +
        '" height="' + h.toFixed(1) + '"><title>' + R.esc(tip) + "</title></rect>";
    });
    var axis = line("axis", pad, height - pad, width - pad, height - pad) +
      text(pad, height - 6, R.exponent(edges[0], 1)) +
      text(width - pad, height - 6, R.exponent(edges[edges.length - 1], 1), ' text-anchor="end"') +
      text(pad, 14, "count (log scale), max " + Math.max.apply(null, counts));
    return "<h4>" + R.esc(block.title || "Histogram") + "</h4>" + svg("hist", width, height, block.title ||
      "histogram", bars + axis + limitLine(edges, R.num(block.marker), pad, barW, height));
  };
  function limitLine(edges, limit, pad, barW, height) {
    for (var i = 0; limit !== null && i < edges.length - 1; i++) {
      if (edges[i] <= limit && limit <= edges[i + 1]) {
        var frac = edges[i + 1] > edges[i] ? (limit - edges[i]) / (edges[i + 1] - edges[i]) : 0;
        var x = pad + (i + frac) * barW;
        return line("limit", x, pad, x, height - pad) + text(x + 3, pad + 10, "limit", ' class="limit"');
      }
    }
    return "";
  }

  // -- series: every line with its own colour, dash and marker; lines equal to an earlier one say so, and a second
  // chart draws each line's difference to the first, which the first chart cannot show when they lie on top --------
  R.series = function (block) {
    var lines = (block.lines || []).map(function (l, k) {
      return {label: String(l.label), k: k, values: (l.values || []).map(R.num)};
    }).filter(function (l) { return l.values.some(isNum); });
    if (!lines.length) { return ""; }
    var same = lines.map(function (l, j) {
      for (var i = 0; i < j; i++) { if (equal(lines[i].values, l.values)) { return lines[i].label; } }
      return null;
    });
    var out = "<h4>" + R.esc(block.title || "Series") + "</h4>" + (block.note ? '<p class="series-note">' +
      R.esc(block.note) + "</p>" : "") + chart(lines, block.x || "x", block.title || "series") + legend(lines, same);
    if (lines.length > 1) {
      var base = lines[0], diffs = lines.slice(1).map(function (l) {
        return {label: l.label, k: l.k, values: l.values.map(function (v, i) {
          return isNum(v) && isNum(base.values[i]) ? v - base.values[i] : null;
        })};
      });
      out += '<p class="series-note">each line minus ' + R.esc(base.label) + ":</p>" +
        chart(diffs, block.x || "x", "difference to " + base.label, true);
    }
    return out;
  };
  function isNum(v) { return v !== null && isFinite(v); }
  function equal(a, b) {
    return a.length === b.length && a.every(function (v, i) { return v === b[i] || (isNaN(v) && isNaN(b[i])); });
  }
  function legend(lines, same) {
    return '<ul class="series-legend">' + lines.map(function (l, j) {
      return '<li class="s' + l.k + '">' + R.markKey(l.k) + " " + R.esc(l.label) +
        (same[j] ? ' <span class="muted">(identical to ' + R.esc(same[j]) + ")</span>" : "") + "</li>";
    }).join("") + "</ul>";
  }
  function chart(lines, xLabel, label, zero) {
    var width = 560, height = 170, left = 64, right = 16, top = 12, bottom = 30, all = [];
    lines.forEach(function (l) { l.values.forEach(function (v) { if (isNum(v)) { all.push(v); } }); });
    if (zero) { all.push(0); }
    var low = Math.min.apply(null, all), high = Math.max.apply(null, all);
    if (low === high) { low -= Math.abs(low) * 0.01 || 1; high += Math.abs(high) * 0.01 || 1; }
    var steps = Math.max.apply(null, lines.map(function (l) { return l.values.length; }));
    var inner = width - left - right;
    function px(i) { return left + (steps > 1 ? i * inner / (steps - 1) : inner / 2); }
    function py(v) { return top + (high - v) / (high - low) * (height - top - bottom); }
    var paths = lines.map(function (l) {
      var points = [], marks = "";
      l.values.forEach(function (v, i) {
        if (!isNum(v)) { return; }
        points.push(px(i).toFixed(1) + "," + py(v).toFixed(1));
        marks += mark(l.k, px(i), py(v));
      });
      return '<g class="s' + l.k + '"><polyline points="' + points.join(" ") + '"/>' + marks + "<title>" +
        R.esc(l.label + ": " + l.values.map(function (v) { return v === null ? R.DASH : R.general(v, 8); })
          .join(", ")) + "</title></g>";
    }).reverse().join("");  // the first line on top: its hollow marker rings whatever lies under it
    var labels = R.axisLabels(low, high);
    var axes = line("axis", left, height - bottom, width - right, height - bottom) +
      (zero && low < 0 && high > 0 ? line("zero", left, py(0), width - right, py(0)) : "") +
      text(left - 4, top + 4, labels[1], ' text-anchor="end" class="y-label"') +
      text(left - 4, height - bottom, labels[0], ' text-anchor="end" class="y-label"') +
      text(left, height - 10, xLabel + " 1") + text(width - right, height - 10, xLabel + " " + steps,
        ' text-anchor="end"');
    return svg("series", width, height, label, axes + paths);
  }

  // -- where a localized case breaks: each module's error (log scale) against its limit, the first one ringed ----
  R.modules = function (rows, first) {
    var width = 560, height = 170, pad = 34, n = rows.length, low = -9;
    rows.forEach(function (r) {  // the scale reaches down to the smallest limit (bit for bit: the fingerprint's own)
      var v = R.num(r.limit);
      if (v !== null && v > 0) { low = Math.min(low, Math.floor(Math.log10(v)) - 1); }
    });
    function lg(v) { return Math.log10(Math.min(Math.max(v, Math.pow(10, low)), 10)); }
    function px(i) { return pad + (n > 1 ? i * (width - 2 * pad) / (n - 1) : 0); }
    function py(v) { return height - pad - (lg(v) - low) / (1 - low) * (height - 2 * pad); }
    var errors = [], limits = [], ring = "";
    rows.forEach(function (r, i) {
      if (R.num(r.error) !== null) { errors.push(px(i).toFixed(1) + "," + py(R.num(r.error)).toFixed(1)); }
      if (R.num(r.limit) !== null) { limits.push(px(i).toFixed(1) + "," + py(R.num(r.limit)).toFixed(1)); }
    });
    if (first !== null && first !== undefined && R.num(rows[first].error) !== null) {
      ring = '<circle class="first" cx="' + px(first).toFixed(1) + '" cy="' + py(R.num(rows[first].error)).toFixed(1) +
        '" r="5"><title>' + R.esc(rows[first].module) + "</title></circle>";
    }
    var axis = line("axis", pad, height - pad, width - pad, height - pad) + text(2, pad + 4, "10") +
      text(2, height - pad, "1e" + low) + text(pad, height - 12, "first module to finish") +
      text(width - pad, height - 12, "last", ' text-anchor="end"') +
      text(pad, 14, "\u25cf rel err per module", ' class="err"') + text(pad + 150, 14, "- - limit", ' class="lim"');
    return svg("modules", width, height, "error per module in execution order", axis + '<polyline class="lim" ' +
      'points="' + limits.join(" ") + '"/><polyline class="err" points="' + errors.join(" ") + '"/>' + ring);
  };
})();
