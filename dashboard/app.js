/* app.js - the kolo dashboard: pages over the coordinator's REST API
 * (docs/api.md), polled while they are open.
 *   #/               the cluster: hosts and jobs
 *   #/jobs/ID        one job: epochs, step times and stragglers, membership,
 *                    commits, stalled ops, worker output
 *   #/studies        the hyperparameter studies (kolo tune)
 *   #/studies/NAME   one study: its trials, the best so far, every trial's
 *                    metric per epoch
 * Under kolo dashboard (cli/dashboard.c) the same pages show a kept run:
 * /runs/ lists the runs, and /runs/RUN/ is RUN's dashboard, whose REST API
 * is under that prefix (BASE).
 * Everything is built with DOM calls (no innerHTML with data), so worker
 * output and job names are shown as text, never as markup. */
'use strict';

const RUN = (location.pathname.match(/^\/runs\/(run-\d+-\d+)\//) || [])[1] || null;
const BASE = RUN ? '/runs/' + RUN : '';
const RUNS_PAGE = /^\/runs\/(index\.html)?$/.test(location.pathname);

const POLL_MS = 2000, POLL_IDLE_MS = 10000, FETCH_TIMEOUT_MS = 5000, OUTPUT_KEEP = 500;

/* ------------------------------------------------------------ helpers */

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) {
    const v = attrs[k];
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids.flat()) if (k !== null && k !== undefined && k !== false)
    e.append(k instanceof Node ? k : String(k));
  return e;
}

/* GET path of the coordinator's REST API (of the run shown, under kolo
 * dashboard), or of kolo dashboard itself when root is set. */
async function api(path, root) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
  try {
    const r = await fetch(root || path.startsWith('/runs/') ? path : BASE + path, {signal: ctl.signal, cache: 'no-store'});
    const body = await r.json().catch(() => ({}));
    if (!r.ok) {
      const e = new Error(`${path}: ${body.error || r.status}`);
      e.status = r.status; // the coordinator answered: not a connection problem
      throw e;
    }
    return body;
  } catch (e) {
    throw e.name === 'AbortError' ? new Error(`${path}: no answer in ${FETCH_TIMEOUT_MS / 1000} s`) : e;
  } finally {
    clearTimeout(timer);
  }
}

const fmt = {
  secs(s) {
    if (s === null || s === undefined) return '–';
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 0) + ' ms';
    if (s < 120) return s.toFixed(s < 10 ? 2 : 1) + ' s';
    if (s < 7200) return Math.floor(s / 60) + ' min ' + Math.round(s % 60) + ' s';
    return (s / 3600).toFixed(1) + ' h';
  },
  num(v, digits) {
    if (v === null || v === undefined) return '–';
    return v.toLocaleString(undefined, {maximumFractionDigits: digits === undefined ? 1 : digits});
  },
  bytes(b) {
    if (b === null || b === undefined) return '–';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(1) : b) + ' ' + u[i];
  },
  time(ms) { return ms ? new Date(ms).toLocaleTimeString() : '–'; },
  pct(v) { return v === null || v === undefined ? '–' : (v * 100).toFixed(0) + ' %'; },
};

/* A job or host state as a badge: a symbol and the word, so it reads
 * without colour. */
const STATE_MARK = {running: '▶', pending: '…', succeeded: '✓', failed: '✗', stopped: '■',
                    alive: '●', lost: '✗', drained: '↓', exited: '✓', assigned: '…',
                    complete: '✓', pruned: '✂', ended: '■'};
function badge(state) {
  return h('span', {class: 'badge s-' + state}, (STATE_MARK[state] || '•') + ' ' + state);
}

function section(title, id, ...body) {
  return h('section', {class: 'card', id}, h('h2', {}, title), ...body);
}

function table(cols, rows, empty) {
  if (!rows.length) return h('p', {class: 'muted'}, empty);
  return h('div', {class: 'scroll'}, h('table', {},
    h('thead', {}, h('tr', {}, cols.map(c => h('th', {scope: 'col', class: c.num ? 'num' : null}, c.title)))),
    h('tbody', {}, rows.map(r => h('tr', {class: r._class || null},
      cols.map(c => h('td', {class: c.num ? 'num' : null}, c.get(r))))))));
}

function showBanner(msg) {
  const b = document.getElementById('banner');
  b.hidden = !msg;
  b.textContent = msg || '';
}

/* ------------------------------------------------------------ polling */

let page = null; // {stop()} of the page on screen

function poller(refresh, interval) {
  let timer = null, stopped = false;
  async function tick() {
    let next = POLL_MS;
    try {
      next = (await refresh()) || POLL_MS;
      showBanner('');
      document.getElementById('live').textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (e) {
      showBanner(e.status ? `The coordinator answered ${e.status}: ${e.message}` :
                 `Cannot reach the coordinator: ${e.message} (retrying)`);
    }
    if (!stopped) timer = setTimeout(tick, interval ? interval : next);
  }
  tick();
  return {stop() { stopped = true; clearTimeout(timer); }};
}

/* ------------------------------------------------------------ cluster page */

function clusterPage(root) {
  const hostsBox = h('div'), jobsBox = h('div'), endedEpochs = new Map();
  root.replaceChildren(
    h('h1', {}, RUN ? `Run ${RUN}` : 'Cluster'),
    section('Hosts', 'hosts', hostsBox),
    section('Jobs', 'jobs', jobsBox));
  return poller(async () => {
    const [hosts, jobs, runs] = await Promise.all([api('/api/v1/hosts'), api('/api/v1/jobs'),
      RUN ? api('/api/v1/runs', true) : null]);
    // a run that ended: its hosts as they were then, with no lease ticking
    const over = runs && !runs.runs.some(r => r.name === RUN && r.running);
    if (over) hosts.hosts.forEach(x => { x.state = 'ended'; x.lease_age_ms = null; });
    hostsBox.replaceChildren(table([
      {title: 'Host', get: x => h('span', {title: x.id}, x.name)},
      {title: 'Address', get: x => x.hostname && x.hostname !== x.name ? `${x.hostname} (${x.addr})` : x.addr},
      {title: 'State', get: x => badge(x.state)},
      {title: 'Slots used', num: true, get: x => `${x.slots_used} / ${x.slots}`},
      {title: 'CPUs', num: true, get: x => x.cpus},
      {title: 'GPUs', num: true, get: x => x.gpus},
      {title: 'Lease age', num: true, get: x => x.lease_age_ms === null ? '–' : fmt.secs(x.lease_age_ms / 1000)},
      {title: 'Running ranks', get: x => (x.running_ranks || []).length ?
        x.running_ranks.map(r => h('a', {href: `#/jobs/${r.job}`, class: 'chip'}, `job ${r.job} · rank ${r.rank}`)) : '–'},
    ], hosts.hosts, 'No agent has registered. Start one with: kolo agent --coordinator tcp://…'));
    const list = jobs.jobs.slice().sort((a, b) => b.id - a.id);
    // the progress of the newest jobs (their epochs, one read each; an
    // ended job's once: it cannot change)
    const eps = await Promise.all(list.map((j, i) => i >= 10 || !j.started_ms ? null
      : ended(j) && endedEpochs.has(j.id) ? endedEpochs.get(j.id)
      : api(`/api/v1/jobs/${j.id}/epochs`).then(ep => {
        if (ended(j)) endedEpochs.set(j.id, ep);
        return ep;
      }, () => null)));
    jobsBox.replaceChildren(table([
      {title: 'Job', get: j => h('a', {href: `#/jobs/${j.id}`}, `${j.id} · ${j.name}`)},
      {title: 'State', get: j => badge(j.state)},
      {title: 'Workers', num: true, get: j => workersText(j, false)},
      {title: 'Progress', get: j => h('span', {class: 'progress'}, progressText(j, j._ep))},
      {title: 'Started', get: j => fmt.time(j.started_ms)},
      {title: 'Ran for', num: true, get: j => j.started_ms ? fmt.secs(((j.ended_ms || Date.now()) - j.started_ms) / 1000) : '–'},
      {title: 'Ended', get: j => ended(j) ? endText(j) : '–'},
      {title: 'Reason', get: j => j.reason || ''},
    ], list.map((j, i) => Object.assign({_ep: eps[i]}, j)), 'No jobs yet. Submit one with kolo run or POST /api/v1/jobs.'));
  });
}

/* ------------------------------------------------------------ job page */

function ended(j) { return ['succeeded', 'failed', 'stopped'].includes(j.state); }

/* A job's workers: how many are alive while it runs; what it was started
 * with once it ended (its ranks are all gone then, not "0 alive"). */
function workersText(j, long) {
  const es = j.elastic_state, range = es ? `${es.min_np}–${es.max_np}` : null;
  if (ended(j)) return es ? `${j.np} at the start (${long ? 'elastic, ' : ''}${range})` : `${j.np}`;
  if (es) return long ? `${j.ranks_alive} alive (min ${es.min_np}, max ${es.max_np})` : `${j.ranks_alive} (${range})`;
  return long ? `${j.ranks_alive} alive of ${j.np}` : `${j.ranks_alive} / ${j.np}`;
}

/* When an ended job ended and how: "12:01:05, succeeded" or "..., failed
 * (exit code 1)". */
function endText(j) {
  const how = j.state + (j.exit_code ? ` (exit code ${j.exit_code})` : '');
  return `${new Date(j.ended_ms).toLocaleString()}, ${how}`;
}

/* A running job's progress from its epochs: the last epoch every rank
 * reported, its metrics and the time per epoch. */
function progressText(j, ep) {
  if (!ep) return '–';
  const done = ep.epochs.filter(e => e.complete && e.wall_s !== null);
  if (!done.length) return ep.epochs.length ? `epoch ${ep.epochs[ep.epochs.length - 1].epoch} running` : 'no epoch yet';
  const last = done[done.length - 1];
  const m = last.metrics || {};
  const parts = [`epoch ${last.epoch}`];
  for (const k of metricKeys([last])) parts.push(`${k} ${fmt.num(m[k], 4)}`);
  const recent = done.slice(-5);
  parts.push(`${fmt.secs(recent.reduce((a, e) => a + e.wall_s, 0) / recent.length)}/epoch`);
  return parts.join(' · ');
}

/* A bucket width (s) that shows the job's run in about 60 columns. */
function bucketFor(seconds) {
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400];
  return steps.find(s => seconds / s <= 60) || 86400;
}

function jobHeader(j, hostNames) {
  const es = j.elastic_state;
  const facts = [
    ['State', badge(j.state)],
    ['Workers', workersText(j, true)],
    ['Generation', j.generation],
    ['Started', fmt.time(j.started_ms)],
    ['Ran for', j.started_ms ? fmt.secs(((j.ended_ms || Date.now()) - j.started_ms) / 1000) : '–'],
  ];
  if (ended(j)) facts.push(['Ended', endText(j)]);
  if (es) facts.push(['Resets', `${es.resets}${es.reset_limit ? ' of ' + es.reset_limit : ''}`]);
  if (es && es.spares_wanted && !ended(j)) {
    const ready = (es.spares || []).filter(s => s.state === 'waiting').length;
    facts.push(['Hot spares', `${ready} waiting of ${es.spares_wanted}` +
      ((es.spares || []).length ? ' (' + es.spares.map(s => `worker ${s.worker_id} on ${s.host}`).join(', ') + ')' : '')]);
  }
  if (j.exit_code !== null && j.exit_code !== undefined) facts.push(['Exit code', j.exit_code]);
  const kids = [h('dl', {class: 'facts'}, facts.map(([k, v]) => h('div', {}, h('dt', {}, k), h('dd', {}, v))))];
  const meta = j.metadata || {};
  if (meta['kolo.study'])
    kids.push(h('p', {class: 'study-link'}, `Trial ${meta['kolo.trial'] || '?'} of study `,
      h('a', {href: studyHref(meta['kolo.study'])}, meta['kolo.study']),
      meta['kolo.params'] ? h('span', {class: 'muted'}, ' · ', paramsText(meta['kolo.params'])) : ''));
  const other = Object.keys(meta).filter(k => !k.startsWith('kolo.'));
  if (other.length)
    kids.push(h('p', {class: 'meta'}, other.map(k => h('span', {class: 'chip'}, `${k}: ${meta[k]}`))));
  kids.push(j.argv ? h('p', {class: 'argv'}, h('code', {}, j.argv.join(' ')))
    : h('p', {class: 'muted'}, 'Command and output are shown to the job\'s owner only: open the dashboard from the link kolo printed (it carries the key).'));
  if (j.timeline)
    kids.push(h('p', {}, h('a', {href: `${BASE}/api/v1/jobs/${j.id}/timeline`, download: `kolo-job-${j.id}-timeline.json`},
      'Timeline (Chrome trace JSON)'), h('span', {class: 'muted'}, ' — open it in chrome://tracing or ui.perfetto.dev')));
  if (j.reason) kids.push(h('p', {class: 'reason'}, j.reason));
  if (es && es.excluded && es.excluded.length)
    kids.push(h('p', {class: 'reason'}, 'Excluded hosts: ' + es.excluded.map(x =>
      `${hostNames.get(x.host) || x.host.slice(0, 8)} (${x.remaining_ms === 'forever' ? 'for good' : fmt.secs(x.remaining_ms / 1000) + ' left'})`).join(', ')));
  return kids;
}

/* The numeric metrics the job reports with hvd.report_epoch (at most
 * four, in the order they first appear). */
function metricKeys(epochs) {
  const keys = [];
  for (const e of epochs) for (const k in e.metrics || {})
    if (typeof e.metrics[k] === 'number' && !keys.includes(k) && keys.length < 4) keys.push(k);
  return keys;
}

/* What became of an epoch a reset touched: cut and never finished (its
 * generation is gone), or cut and run again (REST resets: the generations
 * formed between the previous epoch's end and its end). */
function cutNote(e, job) {
  if (!e.complete && e.generation < job.generation) return `cut by a reset (generation ${e.generation} ended)`;
  if (e.resets) return `cut by ${e.resets} elastic reset${e.resets > 1 ? 's' : ''} and run again (its wall time counts from the last)`;
  return null;
}

function epochsView(ep, job, chartsBox, tableBox) {
  const done = ep.epochs.filter(e => e.wall_s !== null);
  const timeBox = h('div', {class: 'chart'}), rateBox = h('div', {class: 'chart'});
  const keys = metricKeys(ep.epochs);
  const metricBoxes = keys.map(() => h('div', {class: 'chart'}));
  chartsBox.replaceChildren(
    ...keys.map((k, i) => h('figure', {}, h('figcaption', {}, `${k} (reported by the job)`), metricBoxes[i])),
    h('figure', {}, h('figcaption', {}, 'Epoch wall time (s)'), timeBox),
    h('figure', {}, h('figcaption', {}, 'Samples per second'), rateBox));
  keys.forEach((k, i) => Charts.line(metricBoxes[i], ep.epochs.filter(e => e.metrics && typeof e.metrics[k] === 'number')
    .map(e => ({x: e.epoch, y: e.metrics[k], label: `epoch ${e.epoch}: ${k} ${fmt.num(e.metrics[k], 4)}` +
      (cutNote(e, job) ? ` (${cutNote(e, job)})` : '')})),
    {name: 'metric-' + k, xLabel: 'epoch', yLabel: k, fit: true}));
  Charts.line(timeBox, done.map(e => ({x: e.epoch, y: e.wall_s, label: `epoch ${e.epoch}: ${fmt.secs(e.wall_s)}`})),
              {name: 'epoch-time', xLabel: 'epoch', yLabel: 'seconds', unit: 's'});
  Charts.line(rateBox, done.map(e => ({x: e.epoch, y: e.samples_per_s, label: `epoch ${e.epoch}: ${fmt.num(e.samples_per_s, 0)} samples/s`})),
              {name: 'samples-per-s', xLabel: 'epoch', yLabel: 'samples/s', unit: 'samples/s'});
  const eff = ep.baseline_job ? `Scaling efficiency against job ${ep.baseline_job} ` +
    `(same command on one worker, ${fmt.num(ep.baseline_samples_per_s, 0)} samples/s).`
    : 'Scaling efficiency appears once the same command has run on one worker (kolo run -np 1).';
  const cols = [
    {title: 'Epoch', num: true, get: e => cutNote(e, job) ?
      h('span', {class: 'cut', title: cutNote(e, job)}, `${e.epoch} ✂`) : e.epoch},
    {title: 'Wall time', num: true, get: e => fmt.secs(e.wall_s)},
    {title: 'Samples/s', num: true, get: e => fmt.num(e.samples_per_s, 0)},
    {title: 'Scaling eff.', num: true, get: e => fmt.pct(e.scaling_efficiency)},
    {title: 'Ranks', num: true, get: e => `${e.ranks_reported}/${e.ranks_expected}${e.complete ? '' : ' …'}`},
    {title: 'Gen.', num: true, get: e => e.generation},
    ...keys.map(k => ({title: k, num: true, get: e => e.metrics && typeof e.metrics[k] === 'number' ? fmt.num(e.metrics[k], 4) : '–'})),
  ];
  const newest = ep.epochs.slice().reverse().map(e => Object.assign({_class: cutNote(e, job) ? 'cut' : null}, e));
  const kids = [h('p', {class: 'muted'}, eff),
    table(cols, newest.slice(0, 10), 'No epoch reported yet (hvd.report_epoch in the training loop).')];
  if (newest.some(e => e._class))
    kids.push(h('p', {class: 'muted legend'}, '✂ an elastic reset cut this epoch: hover it for what became of it.'));
  if (newest.length > 10) {
    const open = tableBox.querySelector('details') && tableBox.querySelector('details').open;
    kids.push(h('details', {open}, h('summary', {}, `${newest.length - 10} earlier epoch(s)`),
                table(cols, newest.slice(10), '')));
  }
  tableBox.replaceChildren(...kids);
}

/* Step time per host and time bucket, as a grid of shaded cells with the
 * value in each cell's title; a straggler host's row is labelled
 * "▲ straggler" and hatched. */
function heatmapView(steps, ranks, box) {
  const hosts = steps.hosts;
  if (!hosts.length) {
    box.replaceChildren(h('p', {class: 'muted'}, 'No step times yet (DistributedOptimizer.step reports them).'));
    return;
  }
  const all = new Set();
  for (const x of hosts) for (const b of x.buckets) all.add(b.ts_ms);
  const cols = [...all].sort((a, b) => a - b).slice(-60);
  // a cell's shade: its mean step time against twice the median cell's,
  // so a typical cell is mid-tone and one twice as slow is darkest
  const vals = [];
  for (const x of hosts) for (const b of x.buckets) if (cols.includes(b.ts_ms)) vals.push(b.mean_s);
  vals.sort((a, b) => a - b);
  const median = vals.length ? vals[Math.floor(vals.length / 2)] : 0;
  const grid = h('div', {class: 'heatmap', role: 'table', 'aria-label': 'step time per host',
                         style: `grid-template-columns: minmax(7em, max-content) repeat(${cols.length}, minmax(10px, 1fr)) max-content`});
  grid.append(h('div', {class: 'hm-head', role: 'columnheader'}, 'host'));
  cols.forEach(t => grid.append(h('div', {class: 'hm-head', role: 'columnheader', title: fmt.time(t)})));
  grid.append(h('div', {class: 'hm-head hm-lag', role: 'columnheader'}, 'others wait'));
  for (const x of hosts) {
    const slow = x.straggler;
    const row = h('div', {class: 'hm-row' + (slow ? ' straggler' : ''), role: 'row', 'data-host': x.host});
    row.append(h('div', {class: 'hm-host', role: 'rowheader'}, x.host,
      slow ? h('span', {class: 'straggler-mark', title: 'the other ranks wait for this host'},
               ` ▲ straggler (rank ${x.straggler_ranks.join(', ')})`) : ''));
    const by = new Map(x.buckets.map(b => [b.ts_ms, b]));
    for (const t of cols) {
      const b = by.get(t);
      const level = b && median > 0 ? Math.min(1, b.mean_s / (2 * median)) : 0;
      row.append(h('div', {class: 'hm-cell' + (b ? '' : ' hm-none'), role: 'cell',
        style: b ? `--level:${level.toFixed(3)}` : null,
        title: b ? `${x.host} at ${fmt.time(t)}: mean ${fmt.secs(b.mean_s)}, p50 ${fmt.secs(b.p50_s)}, ` +
                   `slowest ${fmt.secs(b.max_s)}, ${b.steps} steps` : `${x.host}: no steps`}));
    }
    row.append(h('div', {class: 'hm-lag num', role: 'cell'}, x.lag_s === null ? '–' : fmt.secs(x.lag_s)));
    grid.append(row);
  }
  const legend = h('p', {class: 'muted legend'},
    `${fmt.time(cols[0])} to ${fmt.time(cols[cols.length - 1])}, ${fmt.secs(steps.bucket_s)} per column; `,
    h('span', {class: 'hm-cell hm-swatch', style: '--level:0.5'}), ` the median step (${fmt.secs(median)}), `,
    h('span', {class: 'hm-cell hm-swatch', style: '--level:1'}), ' twice as long or more. ',
    '"Others wait" is how long after the first rank a host\'s slowest rank asks for each tensor; ',
    'a straggler is marked ▲ and hatched.');
  const rankTable = table([
    {title: 'Rank', num: true, get: r => r.rank},
    {title: 'Host', get: r => r.host},
    {title: 'State', get: r => badge(r.state)},
    {title: 'Last step', num: true, get: r => fmt.secs(r.last_step_s)},
    {title: 'Others wait', num: true, get: r => r.lag_s === null ? '–' : fmt.secs(r.lag_s)},
    {title: 'Straggler', get: r => r.straggler ? h('span', {class: 'straggler-mark'}, '▲ yes') : 'no'},
    {title: 'Compute · wait · data', get: r => timeSplit(r.time)},
    {title: 'Last epoch', num: true, get: r => r.last_epoch === null ? '–' : r.last_epoch},
  ], ranks.ranks.map(r => Object.assign({_class: r.straggler ? 'straggler' : null}, r)), 'No ranks.');
  box.replaceChildren(h('div', {class: 'scroll'}, grid), legend, rankTable);
}

/* Where a rank's time goes (REST /ranks time): a bar in three parts and
 * the shares as text; the title says what each part means. */
function timeSplit(t) {
  if (!t) return '–';
  const pct = x => `${Math.round(x * 100)} %`;
  const part = (cls, x) => h('span', {class: cls, style: `width:${(x * 100).toFixed(1)}%`});
  return h('span', {class: 'tsplit',
                    title: `computing ${pct(t.compute)} (data moved behind it ${pct(t.overlap)}), ` +
                           `waiting for the other ranks ${pct(t.wait)}, moving data ${pct(t.data)}`},
    h('span', {class: 'tsbar', 'aria-hidden': 'true'},
      part('ts-compute', t.compute), part('ts-wait', t.wait), part('ts-data', t.data)),
    ` ${pct(t.compute)} · ${pct(t.wait)} · ${pct(t.data)}`);
}

/* The generations as bands along the job's time, each as wide as it
 * lasted, labelled g<N>·<workers>; the cause is in the band's title and in
 * the table below. */
function generationBands(box, gens, endMs) {
  if (!gens.length) { box.replaceChildren(); return; }
  const t0 = gens[0].ts_ms, t1 = Math.max(endMs, gens[gens.length - 1].ts_ms + 1);
  const bar = h('div', {class: 'genbar', role: 'list', 'aria-label': 'generations over time'});
  gens.forEach((g, i) => {
    const end = i + 1 < gens.length ? gens[i + 1].ts_ms : t1;
    bar.append(h('div', {class: 'gen gen' + (i % 2), role: 'listitem', 'data-generation': g.generation,
                         style: `flex-grow:${Math.max(end - g.ts_ms, 1)}`,
                         title: `generation ${g.generation}, ${g.size} worker(s), from ${fmt.time(g.ts_ms)}: ${g.cause}`},
                 `g${g.generation}·${g.size}`));
  });
  box.replaceChildren(bar, h('div', {class: 'genaxis muted'}, h('span', {}, fmt.time(t0)), h('span', {}, fmt.time(t1))));
}

/* Where a recovery's time went (REST generations[].recovery, from the
 * job.recovered event): the failure detected -> survivors told -> this
 * generation formed -> state restored -> first step done. */
function recoveryText(g) {
  const r = g.recovery;
  if (!r) return '–';
  return `${fmt.secs(r.total_s)}: told ${fmt.secs(r.told_s)} · formed ${fmt.secs(r.formed_s)} · ` +
    `restored ${fmt.secs(r.restored_s)} · first step ${fmt.secs(r.first_step_s)}`;
}

function membershipView(gens, job, chartBox, listBox) {
  const list = gens.generations.slice().sort((a, b) => a.generation - b.generation);
  generationBands(chartBox, list, job.ended_ms || Date.now());
  listBox.replaceChildren(table([
    {title: 'Gen.', num: true, get: g => g.generation},
    {title: 'Began', get: g => fmt.time(g.ts_ms)},
    {title: 'Workers', num: true, get: g => g.size},
    {title: 'Why it began', get: g => g.cause},
    {title: 'Recovery', get: recoveryText},
  ], list.slice().reverse().map(g => Object.assign({_class: g.generation === gens.current ? 'current' : null}, g)),
  'No generation yet.'));
}

function commitsView(snaps, box) {
  const rows = snaps.snapshots;
  const kids = [];
  if (rows.length) {
    const iv = rows.map(s => s.interval_ms).filter(v => typeof v === 'number');
    kids.push(h('p', {class: 'muted'}, `Latest ${rows.length} kept (retention ${snaps.keep})` +
      (iv.length ? `, about every ${fmt.secs(iv.reduce((a, b) => a + b, 0) / iv.length / 1000)}.` : '.')));
  }
  kids.push(table([
    {title: 'Id', num: true, get: s => s.id},
    {title: 'Committed', get: s => fmt.time(s.created_ms)},
    {title: 'Gen.', num: true, get: s => s.generation},
    {title: 'Size', num: true, get: s => fmt.bytes(s.bytes)},
    {title: 'Took', num: true, get: s => typeof s.duration_ms === 'number' ? fmt.secs(s.duration_ms / 1000) : '–'},
    {title: 'Since previous', num: true, get: s => typeof s.interval_ms === 'number' ? fmt.secs(s.interval_ms / 1000) : '–'},
    {title: 'State', get: s => Object.entries(s.meta || {}).filter(([, v]) => typeof v !== 'object')
      .map(([k, v]) => `${k} ${v}`).join(', ')},
  ], rows, 'No commit yet (elastic jobs commit with state.commit()).'));
  if (snaps.uploads && snaps.uploads.length)
    kids.push(h('p', {}, 'Uploading: ' + snaps.uploads.map(u =>
      `${fmt.bytes(u.bytes_received)} of ${fmt.bytes(u.bytes)} from rank ${u.rank}`).join('; ')));
  box.replaceChildren(...kids);
}

/* The stacks kolo kept with the job (before a stop, at a stall, for a
 * frozen rank, or taken here): the newest set, its verdict, every rank's
 * Python stacks folded. A running job's owner can take them now. */
function stacksView(st, job, box, take) {
  const kids = [];
  if (st.hidden) {
    box.replaceChildren(h('p', {class: 'muted'}, 'A job\'s stacks show its code: they are for its owner (open the dashboard from the link kolo printed).'));
    return;
  }
  if (job.state === 'running')
    kids.push(h('p', {}, h('button', {type: 'button', onclick: take, disabled: st.taking}, st.taking ? 'Taking…' : 'Take stacks now'),
      h('span', {class: 'muted'}, ' every rank\'s Python stacks and what it waits for, in a few seconds')));
  const s = (st.stacks || [])[0];
  if (!s) {
    kids.push(h('p', {class: 'muted'}, 'No stacks kept: kolo takes them at a stall, before it stops the job, and when a rank froze.'));
    box.replaceChildren(...kids);
    return;
  }
  kids.push(h('p', {}, h('strong', {}, `Taken ${s.reason}`), ' · ', fmt.time(s.taken_ms)));
  if (s.verdict) kids.push(h('p', {class: 'verdict'}, s.verdict));
  for (const r of s.ranks)
    kids.push(h('details', {class: 'stack'},
      h('summary', {}, `rank ${r.rank} · ${r.host} · pid ${r.pid} · ${r.state}${r.wchan ? ' in ' + r.wchan : ''}` +
        (r.pending ? ' · ' + r.pending : '')),
      h('pre', {class: 'output'}, r.answered ? r.stacks : '(no Python stacks: the process did not answer)')));
  box.replaceChildren(...kids);
}

function stallsView(st, box) {
  box.replaceChildren(table([
    {title: 'Tensor', get: s => h('code', {}, s.name)},
    {title: 'Waiting', num: true, get: s => fmt.secs(s.waiting_ms / 1000)},
    {title: 'Submitted by', num: true, get: s => s.submitted},
    {title: 'Missing ranks', get: s => s.missing_ranks.join(', ')},
  ], st.stalls, 'No op has been waiting for more than a second.'));
}

/* The newest 15 events, newest first; a run of snapshot.committed events
 * (one per commit) is folded into its newest, with a count. The job's
 * other events (milestones: starts, resets, drains, failures) come apart
 * from its newest 200, so that thousands of commits cannot hide them. */
function eventsView(job, box) {
  const byId = new Map();
  for (const e of (job.milestones || []).concat(job.events || [])) byId.set(e.id, e);
  const all = [...byId.values()].sort((a, b) => a.id - b.id);
  const folded = [];
  for (const e of all.reverse()) {
    const last = folded[folded.length - 1];
    if (last && last.kind === 'snapshot.committed' && e.kind === last.kind) last.more++;
    else folded.push(Object.assign({more: 0}, e));
  }
  const ev = folded.slice(0, 15);
  box.replaceChildren(ev.length ? h('ul', {class: 'events'}, ev.map(e =>
    h('li', {}, h('time', {}, fmt.time(e.ts_ms)), ' ', h('span', {class: 'kind'}, e.kind), ' ', e.message,
      e.more ? h('span', {class: 'muted'}, ` (and ${e.more} earlier commit(s))`) : '')))
    : h('p', {class: 'muted'}, 'No events.'));
}

function jobPage(root, id) {
  const head = h('div'), chartsBox = h('div', {class: 'charts'}), epochTable = h('div'),
        heat = h('div'), genChart = h('div'), genList = h('div'),
        commits = h('div'), stalls = h('div'), events = h('div'), stacks = h('div'),
        out = h('pre', {class: 'output', tabindex: '0', 'aria-label': 'worker output'});
  const title = h('h1', {}, `Job ${id}`);
  root.replaceChildren(
    h('p', {class: 'crumbs'}, h('a', {href: '#/'}, '← Cluster')),
    title, head,
    section('Epochs', 'epochs', chartsBox, epochTable),
    section('Step time per host', 'steps', heat),
    section('Membership', 'membership', genChart, genList),
    h('div', {class: 'two'},
      section('Commits', 'commits', commits),
      section('Stalled ops', 'stalls', stalls)),
    section('Worker output', 'output', out),
    section('Stacks', 'stacks', stacks),
    section('Events', 'events', events));
  let after = 0, lines = [], taking = false;
  const take = async () => {
    taking = true;
    try {
      const r = await fetch(BASE + `/api/v1/jobs/${id}/stacks`, {method: 'POST', cache: 'no-store'});
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        stacks.prepend(h('p', {class: 'error'}, `Cannot take stacks: ${body.error || r.status}`));
      }
    } finally {
      setTimeout(() => { taking = false; }, 3000);
    }
  };
  return poller(async () => {
    const job = await api(`/api/v1/jobs/${id}`);
    const span = job.started_ms ? ((job.ended_ms || Date.now()) - job.started_ms) / 1000 : 1;
    const q = p => api(`/api/v1/jobs/${id}/${p}`);
    const [ep, st, rk, gens, snaps, stl, stk, o, hosts] = await Promise.all([
      q('epochs'), q(`steps?downsample=${bucketFor(span)}`), q('ranks'), q('generations'),
      q('snapshots'), q('stalls?min_age_ms=1000'),
      job.redacted ? {hidden: true} : q('stacks?limit=1').catch(e => {
        if (e.status === 401) return {hidden: true};
        throw e;
      }),
      // a job's output is its owner's: a reader without the key is told so
      // (job.redacted), not sent to be refused
      job.redacted ? {lines: [], next: after, hidden: true}
        : q(`output?after=${after}&limit=2000`).catch(e => {
          if (e.status === 401) return {lines: [], next: after, hidden: true};
          throw e;
        }), api('/api/v1/hosts')]);
    document.title = `kolo · job ${id} (${job.state})`;
    title.replaceChildren(`Job ${id} · ${job.name}`);
    head.replaceChildren(...jobHeader(job, new Map(hosts.hosts.map(x => [x.id, x.name]))));
    epochsView(ep, job, chartsBox, epochTable);
    heatmapView(st, rk, heat);
    membershipView(gens, job, genChart, genList);
    commitsView(snaps, commits);
    stallsView(stl, stalls);
    if (taking) stk.taking = true;
    stacksView(stk, job, stacks, take);
    eventsView(job, events);
    if (o.lines.length) {
      const stick = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      lines = lines.concat(o.lines.map(l => `[${l.rank}]${l.stream === 'stderr' ? '!' : ' '} ${l.text}`)).slice(-OUTPUT_KEEP);
      out.textContent = lines.join('\n');
      if (stick) out.scrollTop = out.scrollHeight;
      after = o.next;
    } else if (!lines.length) {
      out.textContent = o.hidden ? '(hidden: a job\'s output is for its owner: open the dashboard from the link kolo printed)'
                                 : '(no output yet)';
    }
    return job.state === 'running' || job.state === 'pending' ? POLL_MS : POLL_IDLE_MS;
  });
}

/* ------------------------------------------------------------ studies */

function studyHref(name) { return '#/studies/' + encodeURIComponent(name); }

/* A trial's parameters as "lr=0.01, batch=32" (numbers to 4 digits). */
function paramsText(p) {
  if (typeof p === 'string') { try { p = JSON.parse(p); } catch (e) { return p; } }
  if (!p || typeof p !== 'object') return '–';
  return Object.entries(p).map(([k, v]) =>
    `${k}=${typeof v === 'number' && !Number.isInteger(v) ? +v.toPrecision(4) : v}`).join(', ');
}

function statesText(st) {
  return ['running', 'pending', 'complete', 'pruned', 'failed', 'stopped']
    .filter(k => st[k]).map(k => `${st[k]} ${k}`).join(', ') || '–';
}

function studiesPage(root) {
  const box = h('div');
  root.replaceChildren(h('h1', {}, 'Studies'), section('Hyperparameter studies', 'studies', box));
  return poller(async () => {
    const body = await api('/api/v1/studies');
    box.replaceChildren(table([
      {title: 'Study', get: s => h('a', {href: studyHref(s.name)}, s.name)},
      {title: 'Trials', num: true, get: s => s.trial_count},
      {title: 'States', get: s => statesText(s.states)},
      {title: 'Best', num: true, get: s => s.best_value === null ? '–' :
        `${s.metric} ${fmt.num(s.best_value, 4)} (${s.mode})`},
      {title: 'Best trial', get: s => s.best_job ? h('a', {href: `#/jobs/${s.best_job}`}, `trial ${s.best_trial}`) : '–'},
      {title: 'Started', get: s => fmt.time(s.first_ms)},
      {title: 'Ran for', num: true, get: s => fmt.secs(((s.last_ms || Date.now()) - s.first_ms) / 1000)},
    ], body.studies, 'No study yet. kolo tune runs one: each trial is a job labelled with its study.'));
    return body.studies.some(s => !s.last_ms) ? POLL_MS : POLL_IDLE_MS;
  });
}

function studyPage(root, name) {
  const head = h('div'), charts = h('div', {class: 'charts'}), trials = h('div');
  const bestBox = h('div', {class: 'chart'}), curveBox = h('div', {class: 'chart'});
  const curveCap = h('figcaption', {}, 'Every trial per epoch');
  charts.replaceChildren(
    h('figure', {}, h('figcaption', {}, 'Best so far'), bestBox),
    h('figure', {}, curveCap, curveBox,
      h('p', {class: 'muted legend'}, h('span', {class: 'legend-line'}), 'trial',
        h('span', {class: 'legend-line t-best'}), 'best trial',
        h('span', {class: 'legend-line t-pruned'}), 'pruned (dashed)',
        h('span', {class: 'legend-line t-failed'}), 'failed or stopped (dotted)')));
  root.replaceChildren(
    h('p', {class: 'crumbs'}, h('a', {href: '#/studies'}, '← Studies')),
    h('h1', {}, `Study ${name}`), head,
    section('Progress', 'progress', charts),
    section('Trials', 'trials', trials));
  return poller(async () => {
    const s = await api('/api/v1/studies/' + encodeURIComponent(name));
    document.title = `kolo · study ${name}`;
    const best = s.trials.find(t => t.job === s.best_job);
    const facts = [
      ['Objective', `${s.mode === 'max' ? 'maximise' : 'minimise'} ${s.metric}`],
      ['Trials', `${s.trial_count}: ${statesText(s.states)}`],
      ['Best', best ? h('span', {}, `${fmt.num(s.best_value, 4)} by `,
        h('a', {href: `#/jobs/${best.job}`}, `trial ${best.number}`)) : '–'],
      ['Best parameters', best ? paramsText(best.params) : '–'],
      ['Started', fmt.time(s.first_ms)],
      ['Ran for', fmt.secs(((s.last_ms || Date.now()) - s.first_ms) / 1000)],
    ];
    head.replaceChildren(h('dl', {class: 'facts'},
      facts.map(([k, v]) => h('div', {}, h('dt', {}, k), h('dd', {}, v)))));
    Charts.line(bestBox, s.best_so_far.map(b => ({x: (b.ts_ms - s.first_ms) / 1000, y: b.value,
      label: `${fmt.secs((b.ts_ms - s.first_ms) / 1000)}: trial ${b.trial}, ${s.metric} ${fmt.num(b.value, 4)}`})),
      {name: 'best-so-far', xLabel: 'seconds since the study began', yLabel: s.metric, fit: true,
       step: true, until: ((s.last_ms || Date.now()) - s.first_ms) / 1000, empty: 'no trial completed yet'});
    curveCap.textContent = `${s.metric} per epoch, every trial`;
    Charts.lines(curveBox, s.trials.map(t => ({
      name: `trial ${t.number} (${t.state})`,
      cls: 'trial t-' + t.state + (t.job === s.best_job ? ' t-best' : ''),
      points: t.curve.map(c => ({x: c.epoch, y: c.value,
        label: `trial ${t.number} (${t.state}), epoch ${c.epoch}: ${s.metric} ${fmt.num(c.value, 4)}`}))})),
      {name: 'trial-curves', xLabel: 'epoch', yLabel: s.metric, fit: true});
    const rows = s.trials.slice().sort((a, b) => (b.number ?? -1) - (a.number ?? -1))
      .map(t => Object.assign({_class: t.job === s.best_job ? 'current' : null}, t));
    trials.replaceChildren(table([
      {title: 'Trial', get: t => h('a', {href: `#/jobs/${t.job}`}, t.number === null ? `job ${t.job}` : `${t.number}`)},
      {title: 'State', get: t => badge(t.state)},
      {title: s.metric, num: true, get: t => fmt.num(t.value, 4)},
      {title: 'Best epoch', num: true, get: t => fmt.num(t.best, 4)},
      {title: 'Epochs', num: true, get: t => t.epochs},
      {title: 'Workers', num: true, get: t => t.state === 'running' ? `${t.workers} / ${t.np}` : t.np},
      {title: 'Duration', num: true, get: t => t.started_ms ? fmt.secs(((t.ended_ms || Date.now()) - t.started_ms) / 1000) : '–'},
      {title: 'Parameters', get: t => paramsText(t.params)},
    ], rows, 'No trial yet.'));
    return s.last_ms ? POLL_IDLE_MS : POLL_MS;
  });
}

/* ------------------------------------------------------------ runs (kolo dashboard) */

function runsPage(root) {
  const box = h('div');
  root.replaceChildren(h('h1', {}, 'Runs'),
    section('Local runs, newest first', 'runs', box));
  return poller(async () => {
    const body = await api('/api/v1/runs');
    // each run's jobs from its own API (a run that cannot be read says why)
    const jobs = await Promise.all(body.runs.map(r => api(`/runs/${r.name}/api/v1/jobs`)
      .then(x => x.jobs, e => e.message)));
    const link = (r, hash) => `/runs/${r.name}/${location.search}${hash || ''}`;
    box.replaceChildren(h('p', {class: 'muted'}, `kolo run keeps its newest runs in ${body.dir}.`),
      table([
        {title: 'Run', get: r => h('a', {href: link(r), class: 'run-link'}, r.name)},
        {title: 'Started', get: r => new Date(r.started_ms).toLocaleString()},
        {title: 'State', get: r => r.running ? badge('running') : h('span', {}, 'ended ' + fmt.time(r.modified_ms))},
        {title: 'Jobs', get: r => typeof r.jobs === 'string' ? h('span', {class: 'reason'}, r.jobs) :
          r.jobs.length ? r.jobs.map(j => h('a', {href: link(r, `#/jobs/${j.id}`), class: 'chip'},
            `job ${j.id} · ${j.name} · `, badge(j.state))) : '–'},
        {title: 'Size', num: true, get: r => fmt.bytes(r.bytes)},
      ], body.runs.map((r, i) => Object.assign({jobs: jobs[i]}, r)),
      'No run kept yet: kolo run keeps each local run\'s database here.'));
    return body.runs.some(r => r.running) ? POLL_MS : POLL_IDLE_MS;
  });
}

/* ------------------------------------------------------------ router */

function route() {
  if (page) page.stop();
  showBanner('');
  const root = document.getElementById('app');
  const m = location.hash.match(/^#\/jobs\/(\d+)$/), st = location.hash.match(/^#\/studies\/(.+)$/);
  let name = null;
  try { name = st && decodeURIComponent(st[1]); } catch (e) { name = st && st[1]; } // a stray '%'
  if (RUNS_PAGE) page = runsPage(root);
  else if (m) page = jobPage(root, m[1]);
  else if (st) page = studyPage(root, name);
  else if (location.hash === '#/studies') page = studiesPage(root);
  else page = clusterPage(root);
  window.scrollTo(0, 0);
}

/* Under kolo dashboard the header's links lead into the run, and back to
 * the list of runs. */
if (RUN || RUNS_PAGE) {
  for (const a of document.querySelectorAll('nav a[href^="/"]')) a.setAttribute('href', BASE + a.getAttribute('href'));
  document.querySelector('nav').prepend(h('a', {href: '/runs/'}, 'Runs'), ' ');
  if (RUN) document.querySelector('.brand').after(h('span', {class: 'run-name'}, RUN));
}
window.addEventListener('hashchange', route);
route();
