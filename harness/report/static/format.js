/* Shared by the scripts of index.html: escaping, badges, and writing the numbers of data that has no format of its
   own (a table block's cells, "other data"). A figure's value is never formatted here: Python writes it with the
   figure's own format (harness/report/embed.py). */
(function () {
  "use strict";
  var R = window.HarnessReport = window.HarnessReport || {};
  var ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"};
  R.DASH = "\u2014";
  R.TIMES = "\u00d7";

  R.esc = function (s) { return String(s).replace(/[&<>"']/g, function (ch) { return ESC[ch]; }); };
  // Text as HTML with each http(s) address in it a link out of the page (harness.report.detail.linked).
  var ADDRESS = /https?:\/\/[^\s<>"']+?(?=[.,;:!?)\]]*(?:[\s<>"']|$))/g;
  R.linked = function (text) {
    var out = "", last = 0, found;
    text = String(text);
    ADDRESS.lastIndex = 0;
    while ((found = ADDRESS.exec(text)) !== null) {
      out += R.esc(text.slice(last, found.index)) + '<a class="out-link" href="' + R.esc(found[0]) +
        '" target="_blank" ' +
        'rel="noopener noreferrer">' + R.esc(found[0]) + "</a>";
      last = found.index + found[0].length;
    }
    return out + R.esc(text.slice(last));
  };
  // What changed against a base run (harness/report/changes.py: [kind, status there, cell there]): a mark for the
  // matrix cell and the words that say it
  var MARKS = {"new failure": "\u25b2", fixed: "\u2713", status: "\u2260", figure: "\u0394", "new case": "+"};
  R.changeText = function (change) {
    return change[0] + (change[1] ? " (was " + change[1] + (change[2] ? " " + change[2] : "") + ")" : "");
  };
  R.changeMark = function (change) {
    return ' <span class="chg chg-' + R.esc(change[0].replace(/ /g, "-")) + '" title="' + R.esc(R.changeText(change)) +
      '">' + (MARKS[change[0]] || "*") + "</span>";
  };
  R.badge = function (status) {
    return '<span class="badge s-' + R.esc(status) + '">' + R.esc(status) + "</span>";
  };
  // A JSON number, or one of the strings "nan", "inf", "-inf" that results.json writes for non-finite floats.
  R.num = function (v) {
    if (v === null || v === undefined || typeof v === "boolean") { return null; }
    if (typeof v === "number") { return v; }
    var text = String(v).trim().toLowerCase();
    if (text === "nan") { return NaN; }
    if (text === "inf" || text === "+inf") { return Infinity; }
    if (text === "-inf") { return -Infinity; }
    var x = text === "" ? NaN : Number(text);
    return isNaN(x) ? null : x;
  };
  function word(x) { return isNaN(x) ? "nan" : (x > 0 ? "inf" : "-inf"); }
  function trimZeros(text) { return text.indexOf(".") >= 0 ? text.replace(/\.?0+$/, "") : text; }
  R.exponent = function (x, digits) {  // Python's "{:.<digits>e}": 1.50e-07
    var parts = x.toExponential(digits).split("e"), e = parseInt(parts[1], 10);
    return parts[0] + "e" + (e < 0 ? "-" : "+") + (Math.abs(e) < 10 ? "0" : "") + Math.abs(e);
  };
  R.general = function (x, p) {  // Python's "{:.<p>g}"
    if (!isFinite(x)) { return word(x); }
    if (x === 0) { return "0"; }
    var e = parseInt(x.toExponential(p - 1).split("e")[1], 10);
    if (e < -4 || e >= p) {
      var parts = R.exponent(x, p - 1).split("e");
      return trimZeros(parts[0]) + "e" + parts[1];
    }
    return trimZeros(x.toFixed(Math.max(0, p - 1 - e)));
  };
  // Two axis labels written alike (the same notation and digits) and as few digits as keep them apart.
  R.axisLabels = function (low, high) {
    var big = Math.max(Math.abs(low), Math.abs(high)), span = high - low;
    var sci = big !== 0 && (big < 1e-3 || big >= 1e6);
    var d = sci ? 1 : (span > 0 ? Math.max(0, Math.ceil(-Math.log10(span)) + 1) : 3);
    function write(x) { return sci ? x.toExponential(d) : x.toFixed(d); }
    while (d < 12 && span > 0 && write(low) === write(high)) { d++; }
    return [write(low), write(high)];
  };
  // Any value of the data as text: whole numbers as they are, others with four significant digits, none as a dash.
  R.text = function (v) {
    if (v === null || v === undefined || v === "") { return R.DASH; }
    if (typeof v === "number") { return Number.isInteger(v) && Math.abs(v) < 1e15 ? String(v) : R.general(v, 4); }
    if (typeof v === "boolean") { return v ? "yes" : "no"; }
    return String(v);
  };
  // A value of the data as HTML, without JSON: objects as nested definition lists, lists of records as tables.
  R.valueHTML = function (v, depth) {
    depth = depth || 0;
    if (Array.isArray(v)) {
      if (v.length && v.every(isRecord) && depth < 3) { return recordsHTML(v, depth); }
      if (!v.length) { return R.DASH; }
      return R.esc(v.map(function (item) { return isRecord(item) || Array.isArray(item) ? JSON.stringify(item) :
        R.text(item); }).join(", "));
    }
    if (isRecord(v) && depth < 3) {
      var keys = Object.keys(v);
      if (!keys.length) { return R.DASH; }
      return '<dl class="other">' + keys.map(function (k) {
        return "<dt>" + R.esc(k) + "</dt><dd>" + R.valueHTML(v[k], depth + 1) + "</dd>";
      }).join("") + "</dl>";
    }
    if (isRecord(v)) { return "<code>" + R.esc(JSON.stringify(v)) + "</code>"; }
    var text = R.text(v);
    return text.indexOf("\n") >= 0 ? '<pre class="traceback">' + R.esc(text) + "</pre>" : R.esc(text);
  };
  function isRecord(v) { return v !== null && typeof v === "object" && !Array.isArray(v); }
  function recordsHTML(list, depth) {
    var keys = [];
    list.forEach(function (r) { Object.keys(r).forEach(function (k) { if (keys.indexOf(k) < 0) { keys.push(k); } }); });
    var head = keys.map(function (k) { return '<th scope="col">' + R.esc(k) + "</th>"; }).join("");
    var rows = list.map(function (r) {
      return "<tr>" + keys.map(function (k) { return "<td>" + R.valueHTML(r[k], depth + 1) + "</td>"; }).join("") +
        "</tr>";
    }).join("");
    return '<table class="grid"><thead><tr>' + head + "</tr></thead><tbody>" + rows + "</tbody></table>";
  }
})();
