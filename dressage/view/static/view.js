// Dressage viewer: reward charts (uPlot) and the token view. Untrusted text is only ever set
// through textContent; no innerHTML, no eval. Data comes from data-json attributes (single-quoted,
// written by Jinja's tojson, which escapes < > & ' so the JSON cannot leave its attribute).
(function () {
  "use strict";

  function readJson(id) {
    var el = document.getElementById(id);
    return el && el.dataset.json ? JSON.parse(el.dataset.json) : null;
  }

  // --- reward curves ---------------------------------------------------------------------------
  function chart(el, series, xLabel) {
    if (!el || typeof uPlot === "undefined") return;
    el.textContent = "";
    var names = Object.keys(series);
    var points = names.filter(function (n) { return series[n].length; });
    if (!points.length) { el.textContent = "no points yet"; el.className += " empty"; return; }
    var xs = Array.from(new Set([].concat.apply([], points.map(function (n) {
      return series[n].map(function (p) { return p[0]; });
    })))).sort(function (a, b) { return a - b; });
    var data = [xs];
    var colours = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c"];
    var uSeries = [{ label: xLabel }];
    points.forEach(function (n, i) {
      var byX = {};
      series[n].forEach(function (p) { byX[p[0]] = p[1]; });
      data.push(xs.map(function (x) { return x in byX ? byX[x] : null; }));
      uSeries.push({ label: n, stroke: colours[i % colours.length], width: 2, spanGaps: true,
                     points: { show: true, size: 6 } });
    });
    new uPlot({ width: Math.min(520, el.clientWidth || 520), height: 220, series: uSeries,
                axes: [{ label: xLabel }, { label: "mean reward" }],
                scales: { x: { time: false, range: function (u, min, max) { return [min - 1, max + 1]; } } } },
               data, el);
  }

  function drawCharts() {
    var curves = readJson("curves");
    if (!curves) return;
    chart(document.getElementById("chart-version"), { "mean reward": curves.by_version }, "policy version");
    chart(document.getElementById("chart-step"), curves.by_step, "training step");
  }

  // --- token view --------------------------------------------------------------------------------
  function lpColour(lp) {
    var p = Math.min(1, Math.max(0, Math.exp(lp)));
    var r = Math.round(255 * Math.min(1, 2 * (1 - p))), g = Math.round(255 * Math.min(1, 2 * p));
    return "rgba(" + r + "," + g + ",0,0.35)";
  }
  // Colours are classes (ten probability buckets, eight version colours), so 30k spans need no
  // inline styles and switching the colouring is one class on the container.
  function lpBucket(lp) { return Math.min(9, Math.floor(Math.exp(lp) * 10)); }

  function renderTokens() {
    var box = document.getElementById("tokens");
    var data = readJson("tokens");
    if (!box || !data) return;
    var versionIndex = {};
    data.versions.forEach(function (v, i) { versionIndex[v] = i; });
    var frag = document.createDocumentFragment();
    var refs = [];
    data.segments.forEach(function (seg) {
      var head = document.createElement("div");
      head.className = "seg-head seg-" + (seg.index % 8);
      head.textContent = "segment " + seg.index;
      frag.appendChild(head);
      var line = document.createElement("div");
      line.className = "seg-tokens";
      seg.turns.forEach(function (turn) {
        var block = document.createElement("div");
        block.className = "turn-tokens";
        var mark = document.createElement("span");
        mark.className = "turn-mark";
        mark.textContent = "turn " + turn.turn;
        block.appendChild(mark);
        for (var i = 0; i < turn.t.length; i++) {
          var s = document.createElement("span");
          var kind = turn.k[i];
          s.className = kind === 0 ? "tok ctx"
            : "tok " + (kind === 2 ? "untrained" : "gen") + " lp" + lpBucket(turn.lp[i]) + " pv" + (versionIndex[turn.v[i]] % 8);
          s.textContent = turn.t[i];
          s._r = refs.length;
          refs.push([turn, i, seg.index]);
          block.appendChild(s);
        }
        line.appendChild(block);
      });
      frag.appendChild(line);
    });
    box.textContent = "";
    box.appendChild(frag);
    box.refs = refs;
    colourMode();
  }

  function colourMode() {
    var box = document.getElementById("tokens");
    var mode = (document.querySelector("input[name=colour]:checked") || {}).value || "logprob";
    if (box) box.classList.toggle("by-version", mode === "version");
  }

  function tipLines(turn, i) {
    var lines = [
      ["text", JSON.stringify(turn.t[i])],
      ["id", turn.id[i] === null ? "(redacted)" : String(turn.id[i]) + (turn.n[i] > 1 ? " (+" + (turn.n[i] - 1) + " ids)" : "")],
      ["position", String(turn.p[i])],
      ["turn", String(turn.turn)],
      ["kind", turn.k[i] === 0 ? "context (not trained)" : turn.k[i] === 1 ? "generated, trained" : "generated, loss mask 0"],
    ];
    if (turn.k[i] !== 0) {
      lines.push(["logprob", String(turn.lp[i]) + " (p=" + Math.exp(turn.lp[i]).toFixed(3) + ")"]);
      lines.push(["version", String(turn.v[i])]);
    }
    return lines;
  }

  function showTip(tip, lines) {
    tip.textContent = "";
    lines.forEach(function (kv) {
      var row = document.createElement("div");
      var k = document.createElement("b");
      k.textContent = kv[0] + " ";
      var v = document.createElement("span");
      v.textContent = kv[1];
      v.className = "tip-" + kv[0];
      row.appendChild(k);
      row.appendChild(v);
      tip.appendChild(row);
    });
  }

  var expertsCache = {};
  function onHover(ev) {
    var box = document.getElementById("tokens");
    var tip = document.getElementById("tok-tip");
    var t = ev.target;
    if (!box || !tip || !t.classList || !t.classList.contains("tok") || t._r === undefined) return;
    var ref = box.refs[t._r];
    var turn = ref[0], i = ref[1], seg = ref[2];
    var lines = tipLines(turn, i);
    var key = seg + ":" + turn.p[i];
    if (!turn.experts) lines.push(["experts", "not recorded"]);
    else if (box.dataset.experts !== "api") lines.push(["experts", "not in the static copy"]);
    else if (key in expertsCache) lines.push(["experts", expertsCache[key]]);
    else {
      lines.push(["experts", "loading…"]);
      var url = "/api/experts?" + new URLSearchParams({ session: box.dataset.session, segment: seg, position: turn.p[i] });
      fetch(url).then(function (r) { return r.json(); }).then(function (j) {
        expertsCache[key] = j.experts ? j.experts.map(function (l, n) { return "L" + n + ":[" + l.join(",") + "]"; }).join(" ") : "none for this position";
        if (tip.dataset.key === key) { lines[lines.length - 1][1] = expertsCache[key]; showTip(tip, lines); }
      });
    }
    tip.dataset.key = key;
    showTip(tip, lines);
    tip.hidden = false;
    var rect = t.getBoundingClientRect();
    tip.style.left = Math.min(window.innerWidth - 380, rect.left + window.scrollX) + "px";
    tip.style.top = (rect.bottom + window.scrollY + 4) + "px";
  }

  function legend() {
    document.querySelectorAll("[data-legend]").forEach(function (el) {
      el.style.background = lpColour(parseFloat(el.dataset.legend));
    });
  }

  function init() {
    performance.mark("view-init");
    drawCharts();
    renderTokens();
    legend();
    performance.measure("view.js init", "view-init");
  }

  document.addEventListener("DOMContentLoaded", init);
  document.addEventListener("change", function (ev) { if (ev.target.name === "colour") colourMode(); });
  document.addEventListener("mouseover", onHover);
  // After a live swap (outerHTML: the old element is gone, so listen for the new content's load).
  document.addEventListener("htmx:load", function (ev) {
    if (ev.target && ev.target.querySelector && ev.target.querySelector("#tokens")) { renderTokens(); legend(); }
  });
  document.addEventListener("htmx:sseOpen", function () {
    var dot = document.getElementById("live-dot"); if (dot) dot.classList.add("on");
  });
})();
