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
  // The y range, the ticks and their labels are computed here, not by uPlot: its automatic range
  // fails on a near-constant series (is_ratio_mean within 1e-7 of 1: RangeError: Invalid array
  // length) and its labels round tiny values (a loss of 1e-9, a KL of 1e-13) to "0".
  function yRange(values) {
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    var mag = Math.max(Math.abs(lo), Math.abs(hi)), span = hi - lo;
    // near-constant: a band of +-0.1% around it (+-1 around 0); else 5% of the span either side
    var pad = span <= mag * 1e-6 ? (mag > 0 ? mag * 1e-3 : 1) : span * 0.05;
    var min = lo - pad, max = hi + pad;
    if (lo >= 0 && min < 0) min = 0;  // counts and shares never read below 0
    return [min, max];
  }

  function tidy(v) { return Number(v.toPrecision(12)); }

  // About five ticks at a round step (1, 2, 2.5 or 5 times a power of ten) inside [min, max].
  function ticks(min, max) {
    var raw = (max - min) / 5, exp = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 2.5, 5, 10].map(function (m) { return m * exp; })
      .filter(function (x) { return x >= raw; })[0];
    var out = [];
    for (var k = Math.ceil(tidy(min / step)); k * step <= max + step * 1e-9 && out.length < 50; k++) {
      out.push(tidy(k * step));
    }
    return out;
  }

  // Labels with as many significant digits as it takes to tell the ticks apart; scientific
  // notation for very small or very large values (1e-9 reads "1e-9", not "0").
  function tickLabels(values) {
    var big = Math.max.apply(null, values.map(Math.abs).concat([0]));
    var sci = big > 0 && (big < 1e-3 || big >= 1e6);
    function one(v, digits) {
      if (v === 0) return "0";
      if (sci) return v.toExponential(digits - 1).replace(/\.?0+e/, "e").replace("e+", "e");
      return String(Number(v.toPrecision(digits)));
    }
    for (var digits = 1; digits <= 15; digits++) {
      var labels = values.map(function (v) { return one(v, digits); });
      if (new Set(labels).size === labels.length) return labels;
    }
    return labels;
  }

  function axis(el, which, label, extra) {
    var spec = {
      label: label,
      values: function (u, splits) {
        var labels = tickLabels(splits);
        el.dataset[which + "Ticks"] = JSON.stringify(labels);  // what the axis shows (tests read it)
        return labels;
      },
    };
    Object.keys(extra).forEach(function (k) { spec[k] = extra[k]; });
    return spec;
  }

  function chart(el, series, xLabel, yLabel) {
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
    var ys = [];
    points.forEach(function (n, i) {
      var byX = {};
      series[n].forEach(function (p) { byX[p[0]] = p[1]; if (p[1] !== null) ys.push(p[1]); });
      data.push(xs.map(function (x) { return x in byX ? byX[x] : null; }));
      uSeries.push({ label: n, stroke: colours[i % colours.length], width: 2, spanGaps: true,
                     points: { show: true, size: 6 },
                     // the legend's value on hover: 6 significant digits (1.2e-9, not "0")
                     value: function (u, v) { return v === null || v === undefined ? "--" : String(Number(v.toPrecision(6))); } });
    });
    // x: half a step beyond the points (uPlot's automatic range spans 0-100 around a single point
    // at 0), never below 0 for versions and steps; whole-number ticks
    var x0 = xs[0] - 0.5, x1 = xs[xs.length - 1] + 0.5;
    if (xs[0] >= 0 && x0 < 0) x0 = 0;
    var y = ys.length ? yRange(ys) : [0, 1];
    new uPlot({ width: Math.min(520, el.clientWidth || 520), height: 220, series: uSeries,
                axes: [
                  axis(el, "x", xLabel, { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }),
                  axis(el, "y", yLabel || "mean reward", {
                    splits: function () { return ticks(y[0], y[1]); },
                    // as wide as the longest label (about 7 px a character at uPlot's 12px font, and room)
                    size: function (u, values) {
                      var n = Math.max.apply(null, (values || []).map(function (v) { return String(v).length; }).concat([3]));
                      return Math.max(50, 8 * n + 24);
                    },
                  }),
                ],
                scales: { x: { time: false, auto: false, min: x0, max: x1 },
                          y: { auto: false, min: y[0], max: y[1], range: function () { return y; } } } },
               data, el);
  }

  function drawMetricCharts() {
    var plots = readJson("metric-curves");
    if (plots) {
      document.querySelectorAll("[data-metric]").forEach(function (el) {
        var name = el.dataset.metric;
        chart(el.querySelector(".chart"), plots[name] || {}, "training step", name);
      });
    }
    var rewards = readJson("reward-curves");
    if (rewards) chart(document.getElementById("chart-rewards"), rewards, "policy version");
  }

  function drawCharts() {
    drawMetricCharts();
    var curves = readJson("curves");
    if (!curves) return;
    var versions = Array.isArray(curves.by_version)
      ? { "training": curves.by_version, "eval": curves.eval_by_version || [] } : curves.by_version;
    chart(document.getElementById("chart-version"), versions, "policy version");
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

  // Each turn's pieces travel in its own block's data-json; a block is drawn (one span per piece)
  // when it comes within a screen of the viewport, or all at once with the "draw all" button. A
  // 30k-token session is 30k spans: drawn at load they would cost most of a second.
  // A trained segment's pieces carry their mask reason (m) and importance weight (w): by mask
  // reason a piece gets class mr<code>; by advantage a trained piece gets av0..av4 (strongly
  // negative .. strongly positive, relative to the session's largest |advantage|).
  function advantageBucket(a, max) {
    if (a === 0 || !max) return 2;
    return a < 0 ? (a <= -max / 2 ? 0 : 1) : (a >= max / 2 ? 4 : 3);
  }
  function decisionClasses(turn, i, advantage) {
    if (!turn.m || turn.m[i] === null || turn.m[i] === undefined) return "";
    var out = " mr" + turn.m[i];
    if (turn.m[i] === 0 && advantage !== null) out += " av" + advantage;
    return out;
  }

  function drawBlock(block, versionIndex) {
    if (!block.classList.contains("pending")) return;
    var turn = JSON.parse(block.dataset.json);
    var seg = block.parentNode, box = document.getElementById("tokens");
    // a tree's turn carries its node's advantage (a); any other trained turn its segment's
    var raw = turn.a !== undefined ? turn.a : (seg && seg.dataset.advantage !== undefined ? parseFloat(seg.dataset.advantage) : null);
    var advantage = raw === null ? null : advantageBucket(raw, parseFloat(box.dataset.maxAdvantage));
    var pos = new Array(turn.t.length);
    var frag = document.createDocumentFragment();
    var mark = document.createElement("span");
    mark.className = "turn-mark";
    mark.textContent = "turn " + turn.turn;
    frag.appendChild(mark);
    for (var i = 0, p = turn.p0; i < turn.t.length; i++) {
      var s = document.createElement("span");
      var kind = turn.k[i];
      s.className = (kind === 0 ? "tok ctx"
        : "tok " + (kind === 2 ? "untrained" : "gen") + " lp" + lpBucket(turn.lp[i]) + " pv" + (versionIndex[turn.v[i]] % 8))
        + decisionClasses(turn, i, advantage);
      s.textContent = turn.t[i];
      s._i = i;
      pos[i] = p;
      p += turn.n[i];
      frag.appendChild(s);
    }
    turn.p = pos;
    block._turn = turn;
    block.textContent = "";
    block.appendChild(frag);
    block.style.minHeight = "";
    block.classList.remove("pending");
    block.removeAttribute("data-json");
  }

  function versionsOf(box) {
    if (!box._versionIndex) {
      box._versionIndex = {};
      JSON.parse(box.dataset.versions || "[]").forEach(function (v, i) { box._versionIndex[v] = i; });
    }
    return box._versionIndex;
  }

  var observer = null;
  function renderTokens() {
    var box = document.getElementById("tokens");
    if (!box) return;
    var versionIndex = versionsOf(box);
    var blocks = box.querySelectorAll(".turn-tokens.pending");
    if (observer) observer.disconnect();
    // Until drawn, a block holds its height (estimated from its characters and line breaks) so
    // the page does not jump as blocks are drawn.
    var cols = Math.max(20, Math.floor((box.clientWidth - 16) / 7.6)), lineH = 21.25;
    blocks.forEach(function (b) {
      var lines = +b.dataset.lines + +b.dataset.chars / cols + 1;
      b.style.minHeight = Math.ceil(lines * lineH) + "px";
    });
    if (typeof IntersectionObserver === "undefined") { drawAll(); return; }
    observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { observer.unobserve(e.target); drawBlock(e.target, versionIndex); }
      });
    }, { rootMargin: "100% 0px" });
    blocks.forEach(function (b) { observer.observe(b); });
    colourMode();
  }

  function drawAll() {
    var box = document.getElementById("tokens");
    if (!box) return;
    box.querySelectorAll(".turn-tokens.pending").forEach(function (b) {
      if (observer) observer.unobserve(b);
      drawBlock(b, versionsOf(box));
    });
  }

  function colourMode() {
    var box = document.getElementById("tokens");
    var mode = (document.querySelector("input[name=colour]:checked") || {}).value || "logprob";
    if (!box) return;
    box.classList.toggle("by-version", mode === "version");
    box.classList.toggle("by-advantage", mode === "advantage");
    box.classList.toggle("by-mask", mode === "mask");
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
    if (turn.m && turn.m[i] !== null && turn.m[i] !== undefined) {
      var box = document.getElementById("tokens");
      var reasons = JSON.parse(box.dataset.reasons || "[]");
      lines.push(["mask", reasons[turn.m[i]] || String(turn.m[i])]);
      var seg = document.querySelector('.seg-tokens[data-segment="' + turn.segment + '"]');
      if (turn.a !== undefined) lines.push(["advantage", String(turn.a) + " (its tree node's)"]);
      else if (seg && seg.dataset.advantage !== undefined) lines.push(["advantage", seg.dataset.advantage]);
      if (turn.w[i] !== null) lines.push(["weight", String(turn.w[i])]);
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
    if (!box || !tip || !t.classList || !t.classList.contains("tok") || t._i === undefined) return;
    var turn = t.parentNode._turn, i = t._i, seg = turn.segment;
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
    // "view-ready": the first frame painted after the page's scripts ran (what bench/view_session.py
    // reports as usable).
    requestAnimationFrame(function () { setTimeout(function () { performance.mark("view-ready"); }, 0); });
  }

  document.addEventListener("DOMContentLoaded", init);
  document.addEventListener("change", function (ev) { if (ev.target.name === "colour") colourMode(); });
  document.addEventListener("click", function (ev) { if (ev.target.id === "tokens-all") drawAll(); });
  document.addEventListener("mouseover", onHover);
  // After a live swap (outerHTML: the old element is gone, so listen for the new content's load).
  document.addEventListener("htmx:load", function (ev) {
    if (ev.target && ev.target.querySelector && ev.target.querySelector("#tokens")) { renderTokens(); legend(); }
  });
  document.addEventListener("htmx:sseOpen", function () {
    var dot = document.getElementById("live-dot"); if (dot) dot.classList.add("on");
  });
})();
