/* A section's matrix in index.html (one per model): rows and columns from the axes the data declares (D.matrix),
   one cell per case with its status and cell text, drawn when the section is first opened and filtered with the
   page. report.js makes one with R.matrix(page) and the page's records and filter. */
(function () {
  "use strict";
  var R = window.HarnessReport, esc = R.esc, SEP = "\u0000";
  // a case whose rank died of a native signal in an earlier attempt: its cell shows the rerun's result, marked
  var DIED = ' <span class="rank-died" title="a rank died in an earlier attempt; the case ran once more in a fresh ' +
    'group">\u2020</span>';

  R.matrix = function (page) {
    var D = page.D, built = {}, leftOut = {};
    // A section's table: rows and columns from D.matrix, one cell per combination. Unless SKIP cases are asked for,
    // the rows and columns that hold nothing but cases that did not run (SKIP, N/A) are not drawn at all (a full
    // plan's are most of them).
    function ran(c) { return c.status !== "SKIP" && c.status !== "N/A"; }
    function showsSkips(st) { return st.skips || !ran({status: st.status}); }
    function buildMatrix(section) {
      var value = section.getAttribute("data-section"), axis = D.matrix.section[0], skips = showsSkips(page.state());
      if (built["section:" + value] === skips) { return; }
      var mine = page.cases.filter(function (c) { return !axis || c[axis] === value; });
      var drawn = skips ? mine : mine.filter(ran);
      var cols = ordered(drawn, D.matrix.column), rows = ordered(drawn, D.matrix.row), grid = {};
      var rowAt = positions(rows), colAt = positions(cols), left = {};
      mine.forEach(function (c) {
        var r = rowAt[combo(c, D.matrix.row)], j = colAt[combo(c, D.matrix.column)];
        if (r === undefined) { (left[combo(c, D.matrix.row)] = left[combo(c, D.matrix.row)] || []).push(c); }
        if (r !== undefined && j !== undefined) { grid[r + ":" + j] = (grid[r + ":" + j] || "") + cellHTML(c); }
      });
      var body = rows.map(function (row, r) {
        var p = row.split(SEP), cells = cols.map(function (col, j) {
          var html = grid[r + ":" + j];
          return '<td data-col="' + j + '"' + (html ? "" : ' class="empty"') + ">" + (html || "") + "</td>";
        }).join("");
        return '<tr class="mrow"><th scope="row"' + (rowTitle(p) ? ' title="' + esc(rowTitle(p)) + '"' : "") + ">" +
          rowLabel(p) + "</th>" + cells + "</tr>";
      }).join("");
      leftOut[value] = Object.keys(left).map(function (k) { return left[k]; });
      section.querySelector(".section-body").innerHTML = '<div class="scroll"><table class="matrix"><thead><tr>' +
        '<th scope="col">' + esc(D.matrix.row.join(" ")) + "</th>" +
        matrixHead(drawn, cols) + "</tr></thead><tbody>" + body +
        '</tbody></table></div><p class="muted skip-note"></p>';
      built["section:" + value] = skips;
      page.applied(section);
    }
    function positions(list) { var at = {}; list.forEach(function (v, k) { at[v] = k; }); return at; }
    // A row's label: its axes' values, a value the id leaves out (no flow) left out here too; an axis after the
    // first two (a flow) as a row under its layout's ("\u21b3 lora_after"). Its title says what that value means.
    function omitted(name, v) {
      var axis = D.axes.filter(function (a) { return a.name === name; })[0] || {};
      return "omit" in axis && axis.omit === v;
    }
    function meaning(name, v) { return (D.help[name] || {})[v] || ""; }
    function rowLabel(p) {
      return p.map(function (v, k) {
        var name = D.matrix.row[k];
        if (omitted(name, v)) { return ""; }
        return k < 2 ? '<span class="' + (k ? "sub" : "main") + '">' + esc(v) + "</span>" :
          '<span class="under">\u21b3 ' + esc(v) + "</span>";
      }).join(" ");
    }
    function rowTitle(p) {
      return p.map(function (v, k) { return omitted(D.matrix.row[k], v) ? "" : meaning(D.matrix.row[k], v); })
        .filter(Boolean).join("\n");
    }
    function matrixHead(list, cols) {  // the innermost column axis always; the outer ones where they say something
      var names = D.matrix.column, last = names.length - 1;
      var shown = names.filter(function (name, k) {
        var values = unique(list.map(function (c) { return c[name]; }));
        var axis = D.axes.filter(function (a) { return a.name === name; })[0] || {};
        return k === last || values.length > 1 || ("omit" in axis && values[0] !== axis.omit);
      });
      return cols.map(function (col, j) {
        var p = col.split(SEP), top = p.filter(function (v, k) { return k < last && shown.indexOf(names[k]) >= 0; });
        var title = p.map(function (v, k) { return omitted(names[k], v) ? "" : meaning(names[k], v); })
          .filter(Boolean).join("\n");
        return '<th scope="col" data-col="' + j + '"' + (title ? ' title="' + esc(title) + '"' : "") +
          '><span class="outer">' + (top.map(esc).join(" \u00b7 ") || "&nbsp;") + '</span><span class="inner">' +
          esc(p[last]) + "</span></th>";
      }).join("");
    }
    function combo(c, keys) { return keys.map(function (k) { return c[k]; }).join(SEP); }
    // A cell: its title leads with the check that decided it (its share and its limit's derivation); against a
    // base run, a mark of what changed and what the case was there (harness/report/changes.py)
    function cellHTML(c) {
      var d = c.deciding, change = D.changes[c.i];
      var tip = (d && d.text ? "decided by " + d.text + "\n" : "") + c.case_id + ": " + c.status +
        (c.reason ? "\n" + c.reason : "") + (change ? "\nagainst the base run: " + R.changeText(change) : "");
      return '<a class="cell-case s-' + esc(c.status) + '" href="#' + esc(c.anchor) + '" data-i="' + c.i + '" title="' +
        esc(tip) + '"><b>' + esc(c.status) + (change ? R.changeMark(change) : "") + (c.rank_death ? DIED : "") +
        '</b><span class="num">' +
        (esc(c.cell) || "&nbsp;") + "</span></a>";
    }
    function unique(values) {
      var seen = {};
      return values.filter(function (v) {
        return Object.prototype.hasOwnProperty.call(seen, v) ? false : (seen[v] = true);
      });
    }
    // Distinct combinations of `keys`, by each key's order of first appearance; for the rows, a value the id leaves
    // out (no flow) first, so a layout's plain row comes before the rows of its flows
    function ordered(list, keys) {
      var orders = keys.map(function (key) {
        var values = unique(list.map(function (c) { return c[key]; }));
        var plain = keys === D.matrix.row ? values.filter(function (v) { return omitted(key, v); }) : [];
        return plain.concat(values.filter(function (v) { return plain.indexOf(v) < 0; }));
      });
      function rank(value) { return value.split(SEP).map(function (v, k) { return orders[k].indexOf(v); }); }
      return unique(list.map(function (c) { return combo(c, keys); })).sort(function (a, b) {
        var ra = rank(a), rb = rank(b);
        for (var k = 0; k < ra.length; k++) { if (ra[k] !== rb[k]) { return ra[k] - rb[k]; } }
        return 0;
      });
    }

    function filterMatrix(table, st) {
      var showSkips = showsSkips(st), cols = {};
      // The rows left out when drawn (all SKIP) that hold a case the filters show: the others say nothing here
      var hiddenRows = (leftOut[table.closest("details.section").getAttribute("data-section")] || []).filter(
        function (row) { return row.some(function (c) { return page.matches(c, st); }); }).length;
      table.querySelectorAll("tr.mrow").forEach(function (tr) {
        var any = false, real = false;
        tr.querySelectorAll("a.cell-case").forEach(function (a) {
          var c = page.caseOf(a), shown = page.matches(c, st);
          a.hidden = !shown;
          if (shown && (showSkips || ran(c))) {
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
          "is SKIP or N/A left out (tick \u201call-SKIP matrix rows\u201d above to show them)." : "";
      }
    }
    // The sections drawn for another choice of SKIP cases: again if open, else when next opened.
    function rebuild(st) {
      document.querySelectorAll("details.section").forEach(function (section) {
        var key = "section:" + section.getAttribute("data-section");
        if (built[key] === undefined || built[key] === showsSkips(st)) { return; }
        if (section.open) { buildMatrix(section); } else { delete built[key]; }
      });
    }
    // A matrix box is its header row's scroll container, so the row sticks to the box's top, which the page's own
    // scrolling takes under the sticky filter bar: each box shown there holds its header row that far lower.
    function hold(bar) {
      var bottom = bar.getBoundingClientRect().bottom;
      document.querySelectorAll("details.section[open] .scroll").forEach(function (box) {
        var rect = box.getBoundingClientRect(), under = Math.max(0, Math.min(bottom, rect.bottom) - rect.top);
        box.style.setProperty("--held", under.toFixed(1) + "px");
      });
    }
    // A section's summary counts what the filters show: "n of N" where that is fewer
    function countSection(m, tally) {
      var all = m.querySelector(".section-count");
      all.textContent = of(tally.all, Number(all.getAttribute("data-total"))) + " cases";
      m.querySelectorAll(".section-tally [data-status]").forEach(function (b) {
        var status = b.getAttribute("data-status"), n = tally[status] || 0;
        b.hidden = !n;
        b.textContent = of(n, Number(b.getAttribute("data-total"))) + " " + status;
      });
    }
    function of(n, total) { return n === total ? String(n) : n + " of " + total; }
    // Arrow keys move between the shown cells
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
    return {build: buildMatrix, filter: filterMatrix, rebuild: rebuild, hold: hold, count: countSection,
            move: moveFocus};
  };
})();
