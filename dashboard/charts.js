/* charts.js - the dashboard's charts, drawn as SVG with no library:
 * line charts with points, one series (epoch time, samples/s) or many (a
 * study's trials). Every point has a
 * <title>, so a value can be read without relying on position alone. */
'use strict';

const Charts = (() => {
  const NS = 'http://www.w3.org/2000/svg';

  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  /* About n round tick values covering [lo, hi]. */
  function ticks(lo, hi, n) {
    if (!(hi > lo)) hi = lo + 1;
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
      out.push(+v.toPrecision(12));
    return out;
  }

  function short(v) {
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toPrecision(3) + 'M';
    if (a >= 1e4) return (v / 1e3).toPrecision(3) + 'k';
    if (a >= 100 || v === 0) return String(Math.round(v));
    return String(+v.toPrecision(3));
  }

  /* A line chart of series [{name, points: [{x, y, label}], cls}] into
   * `box` (an element whose content it replaces). opts: {name, xLabel,
   * yLabel, unit, fit, step, until, empty}: fit spans the y axis over the
   * data instead of from 0; step draws each value as held until the next
   * (a best-so-far curve), to x = until when given. The SVG carries data-chart=name; each series is a
   * path.series with data-series=name and a <title>, each point a
   * circle.pt with data-series and data-x; a series' cls is added to both. */
  function lines(box, series, opts) {
    const W = 560, H = 220, L = 52, R = 14, T = 14, B = 40;
    const svg = svgEl('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', 'data-chart': opts.name,
                              'aria-label': `${opts.yLabel} by ${opts.xLabel}`});
    box.replaceChildren(svg);
    const ok = p => p.y !== null && p.y !== undefined && isFinite(p.y);
    const sets = series.map(s => Object.assign({}, s, {points: s.points.filter(ok)}));
    const pts = sets.flatMap(s => s.points);
    if (!pts.length) {
      svg.append(svgEl('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty'},
                       opts.empty || 'no epochs reported yet'));
      return;
    }
    let x0 = Math.min(...pts.map(p => p.x)), x1 = Math.max(...pts.map(p => p.x), opts.until ?? -Infinity);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    let y0 = 0, ymax = Math.max(...pts.map(p => p.y)) * 1.1 || 1;
    if (opts.fit) {
      const lo = Math.min(...pts.map(p => p.y)), hi = Math.max(...pts.map(p => p.y));
      const pad = (hi - lo) * 0.1 || Math.abs(hi) * 0.1 || 1;
      y0 = lo - pad;
      ymax = hi + pad;
    }
    const yt = ticks(y0, ymax, 4).filter(v => v >= y0 - 1e-12);
    const ybot = opts.fit ? Math.min(y0, yt[0]) : 0, ytop = Math.max(ymax, yt[yt.length - 1]);
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = y => H - B - (y - ybot) / (ytop - ybot) * (H - T - B);
    for (const v of yt) {
      svg.append(svgEl('line', {x1: L, x2: W - R, y1: sy(v), y2: sy(v), class: 'grid'}));
      svg.append(svgEl('text', {x: L - 6, y: sy(v) + 4, 'text-anchor': 'end', class: 'tick'}, short(v)));
    }
    const xt = ticks(x0, x1, Math.min(8, Math.max(...sets.map(s => s.points.length)))).filter(v => Number.isInteger(v));
    for (const v of xt)
      svg.append(svgEl('text', {x: sx(v), y: H - B + 16, 'text-anchor': 'middle', class: 'tick'}, short(v)));
    svg.append(svgEl('line', {x1: L, x2: W - R, y1: H - B, y2: H - B, class: 'axis'}));
    svg.append(svgEl('line', {x1: L, x2: L, y1: T, y2: H - B, class: 'axis'}));
    svg.append(svgEl('text', {x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle', class: 'label'}, opts.xLabel));
    svg.append(svgEl('text', {x: 12, y: (T + H - B) / 2, 'text-anchor': 'middle', class: 'label',
                              transform: `rotate(-90 12 ${(T + H - B) / 2})`}, opts.yLabel));
    for (const s of sets) {
      if (!s.points.length) continue;
      const cls = s.cls ? ' ' + s.cls : '';
      let d = s.points.map((p, i) => !i ? `M${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}` : opts.step ?
        `H${sx(p.x).toFixed(1)}V${sy(p.y).toFixed(1)}` : `L${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join('');
      if (opts.step && opts.until !== undefined) d += `H${sx(opts.until).toFixed(1)}`;
      const path = svgEl('path', {d, class: 'series' + cls, 'data-series': s.name || ''});
      if (s.name) path.append(svgEl('title', {}, s.name));
      svg.append(path);
      for (const p of s.points) {
        const c = svgEl('circle', {cx: sx(p.x), cy: sy(p.y), r: 4, class: 'pt' + cls, 'data-x': p.x,
                                   'data-series': s.name || ''});
        c.append(svgEl('title', {}, p.label || `${opts.xLabel} ${p.x}: ${short(p.y)} ${opts.unit || ''}`));
        svg.append(c);
      }
    }
  }

  /* One series: points [{x, y, label}]. */
  function line(box, points, opts) {
    lines(box, [{points}], opts);
  }

  return {line, lines, ticks};
})();
