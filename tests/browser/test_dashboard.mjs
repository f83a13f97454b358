// test_dashboard.mjs - the dashboard in a real browser (Debian's chromium,
// headless, driven by playwright-core) against a coordinator that runs a
// real 4-worker elastic digits job (test_dashboard.sh starts them).
//
//   node test_dashboard.mjs HTTP_URL JOB_ID ARTIFACT_DIR
//
// Checks, each with a deadline:
//   - the cluster and job pages load with no console error and no failed
//     request, at 1280x800 and at a phone's 390x844 (no sideways scroll);
//   - the epoch charts have one point per epoch the REST API reports done;
//   - the worker slowed down on purpose (rank 2 at the start) is marked as
//     the straggler, with a mark that is not colour alone (text "▲");
//   - a worker killed with SIGKILL shows up as a new generation whose cause
//     says so, in the membership band and table, and the epoch it cut is
//     marked ✂;
//   - the metrics the job reports (loss, accuracy) are charted per epoch;
//   - worker output and events are shown, and the timeline is linked;
//   - "Take stacks now" shows every rank's Python stacks;
//   - (mode "ended", after `kolo stop`) the stacks kolo took before it
//     stopped the ranks are on the ended job's page, at 1280 and 390 px.
// Screenshots go to ARTIFACT_DIR.
import {setup, state, check, rest, until, watch, shot, noSidewaysScroll, run} from './lib.mjs';

const [base, job, outDir, mode] = process.argv.slice(2);
if (!base || !job || !outDir) {
  console.error('usage: node test_dashboard.mjs HTTP_URL JOB_ID ARTIFACT_DIR [ended]');
  process.exit(2);
}
setup(base, outDir);

// "ended": the job was stopped with kolo stop; the stacks kolo took before
// it stopped the ranks are on its page, for the owner, at 1280 and 390 px
if (mode === 'ended') {
  await run(async browser => {
    for (const [w, hgt] of [[1280, 800], [390, 844]]) {
      state.step = `ended job's stacks at ${w} px`;
      const ctx = await browser.newContext({viewport: {width: w, height: hgt}, isMobile: w < 500});
      const page = await ctx.newPage();
      watch(page, `ended-${w}`);
      await page.goto(`${base}/?key=${process.env.KOLO_VIEW_KEY}#/jobs/${job}`);
      const t = await until(20, 'the kept stacks are on the ended job\'s page', async () => {
        const s = await page.locator('#stacks').textContent().catch(() => '');
        return s.includes('Taken when stopped') && (await page.locator('#stacks details.stack').count()) >= 2 ? s : null;
      });
      check(/rank \d+ · \S+ · pid \d+/.test(t), 'every rank is listed with its host and pid');
      check(await page.locator('#stacks button').count() === 0, 'no "Take stacks now" on an ended job');
      await page.locator('#stacks details.stack summary').first().click();
      check((await page.locator('#stacks details.stack pre').first().textContent()).includes('most recent call first'),
        'a rank\'s Python stacks unfold');
      check(await noSidewaysScroll(page), `the ended job's page fits ${w} px`);
      await shot(page, `job-ended-stacks-${w}x${hgt}`);
      await ctx.close();
    }
  });
  console.log('all ended-job checks passed');
  process.exit(0);
}

await run(async browser => {
  const ctx = await browser.newContext({viewport: {width: 1280, height: 800}});
  const page = await ctx.newPage();
  watch(page, 'desktop');

  state.step = 'cluster page';
  // the link kolo prints carries the view key; the page keeps it as a cookie
  await page.goto(base + '/' + (process.env.KOLO_VIEW_KEY ? '?key=' + process.env.KOLO_VIEW_KEY : ''));
  await page.waitForSelector('#hosts table', {timeout: 15000});
  const hosts = (await rest('/api/v1/hosts')).hosts;
  const rows = await page.locator('#hosts tbody tr').count();
  check(rows === hosts.length && rows === 4, `${rows} host rows for ${hosts.length} registered hosts`);
  for (const x of hosts)
    check(await page.locator('#hosts').getByText(x.name, {exact: true}).count() === 1, `host ${x.name} listed`);
  await until(10, 'the job is listed as running', async () =>
    (await page.locator(`#jobs a[href="#/jobs/${job}"]`).count()) === 1 &&
    (await page.locator('#jobs').textContent()).includes('running'));
  check(true, 'job listed, running');
  await shot(page, 'cluster-1280x800');

  state.step = 'job page';
  await page.click(`#jobs a[href="#/jobs/${job}"]`);
  await page.waitForSelector('svg[data-chart="epoch-time"]', {timeout: 15000});
  // one point per completed epoch: compare with REST once the page caught up
  const points = await until(30, 'the epoch chart has one point per completed epoch (at least 3)', async () => {
    const done = (await rest(`/api/v1/jobs/${job}/epochs`)).epochs.filter(e => e.wall_s !== null).length;
    const n = await page.locator('svg[data-chart="epoch-time"] circle.pt').count();
    const m = await page.locator('svg[data-chart="samples-per-s"] circle.pt').count();
    return n >= 3 && n === done && m === done ? n : null;
  });
  check(true, `epoch charts have ${points} points, as many as epochs reported`);
  // the metrics the job reports (hvd.report_epoch(..., metrics=...)) charted too
  for (const m of ['loss', 'accuracy'])
    check(await page.locator(`svg[data-chart="metric-${m}"] circle.pt`).count() >= points,
          `the ${m} the job reports is charted per epoch`);

  state.step = 'straggler';
  const ranks = (await rest(`/api/v1/jobs/${job}/ranks`)).ranks;
  const slowHost = ranks.find(r => r.rank === 2).host;
  const row = page.locator(`.hm-row[data-host="${slowHost}"]`);
  await until(40, `host ${slowHost} (rank 2, slowed down) is marked as the straggler`, async () =>
    (await row.count()) === 1 && (await row.getAttribute('class')).includes('straggler') &&
    (await row.textContent()).includes('▲ straggler'));
  const marked = await page.locator('.hm-row.straggler').count();
  check(marked === 1, `exactly one host marked (${marked}), ${slowHost}, with a "▲ straggler" text mark`);
  const rankRow = page.locator('#steps tbody tr', {hasText: '▲ yes'});
  check(await rankRow.count() === 1 && (await rankRow.locator('td').first().textContent()).trim() === '2',
        'the ranks table marks rank 2 "▲ yes"');
  state.step = 'timeline link';
  const link = page.locator('a', {hasText: 'Timeline (Chrome trace JSON)'});
  check(await link.count() === 1, 'the job page links its timeline');
  const trace = await rest(await link.getAttribute('href'));
  check(Array.isArray(trace) && trace.some(e => e.name === 'NEGOTIATE_ALLREDUCE'),
        `the linked timeline is a trace array with NEGOTIATE_ALLREDUCE (${trace.length} events)`);
  await shot(page, 'job-1280x800');

  state.step = 'phone width';
  const phone = await browser.newContext({viewport: {width: 390, height: 844}, isMobile: true, hasTouch: true});
  const pp = await phone.newPage();
  watch(pp, 'phone');
  await pp.goto(`${base}/#/jobs/${job}`);
  await pp.waitForSelector('svg[data-chart="epoch-time"] circle.pt', {timeout: 15000});
  await pp.waitForSelector('.hm-row', {timeout: 15000});
  check(await noSidewaysScroll(pp), 'the job page fits 390 px (wide tables scroll inside their box)');
  // this browser never opened the link with the key: another reader, who
  // sees the job but not what it runs or prints (issue 28)
  await pp.waitForFunction(() => (document.querySelector('pre.output') || {}).textContent?.includes('hidden'),
                           null, {timeout: 15000});
  check(!(await pp.locator('pre.output').textContent()).includes('epoch'), 'without the key the output is hidden');
  check(await pp.locator('p.argv').count() === 0, 'without the key the command is hidden');
  await shot(pp, 'job-390x844');
  await pp.goto(`${base}/#/`);
  await pp.waitForSelector('#hosts table', {timeout: 15000});
  check(await noSidewaysScroll(pp), 'the cluster page fits 390 px');
  await phone.close();

  state.step = 'killed worker';
  const before = (await rest(`/api/v1/jobs/${job}/generations`)).current;
  const victim = (await rest(`/api/v1/jobs/${job}`)).ranks.find(r => r.rank === 1);
  check(victim && victim.pid > 0, `rank 1 runs as pid ${victim && victim.pid} on ${victim && victim.host_name}`);
  process.kill(victim.pid, 'SIGKILL');
  // the generation whose cause names the kill (a survivor that saw the
  // dead peer first may have asked for a reset of its own before it)
  let gens = [];
  const killed = await until(30, 'a new generation whose cause names the kill', async () => {
    gens = (await rest(`/api/v1/jobs/${job}/generations`)).generations;
    const g = gens.find(x => x.generation > before && x.cause.includes('killed by signal 9'));
    return g ? g.generation : null;
  }).catch(e => { throw new Error(`${e.message}; generations: ${JSON.stringify(gens)}`); });
  const band = page.locator(`.genbar [data-generation="${killed}"]`);
  const cause = await until(10, `generation ${killed} is on the page with its cause`, async () => {
    const t = await page.locator('#membership tbody tr', {hasText: 'killed by signal 9'}).count();
    return t >= 1 && (await band.count()) === 1 &&
      (await band.getAttribute('title')).includes('killed by signal 9') ? t : null;
  });
  check(cause >= 1, `generation ${killed} shown with cause "… killed by signal 9" (band title and table)`);
  // where the recovery's time went, on the generation's row (issue 32)
  const rec = await until(30, `generation ${killed}'s recovery on its row`, async () => {
    const row = page.locator('#membership tbody tr', {hasText: 'killed by signal 9'}).first();
    const t = await row.textContent();
    return /told [0-9.]+ ?m?s · formed [0-9.]+ ?m?s · restored [0-9.]+ ?m?s · first step/.test(t) ? t : null;
  });
  const restGen = (await rest(`/api/v1/jobs/${job}/generations`)).generations.find(x => x.generation === killed);
  check(restGen.recovery && restGen.recovery.total_s >= 0 &&
        Math.abs(restGen.recovery.total_s - (restGen.recovery.told_s + restGen.recovery.formed_s +
          restGen.recovery.restored_s + restGen.recovery.first_step_s)) < 0.005,
        `REST: generation ${killed}'s recovery adds up: ${JSON.stringify(restGen.recovery)}`);
  check(rec.includes('told'), `the membership table says where the recovery went: ${rec.replace(/\s+/g, ' ').trim()}`);
  await until(30, 'the job trains on: a new epoch point after the reset', async () =>
    (await page.locator('svg[data-chart="epoch-time"] circle.pt').count()) > points);
  check(true, 'epochs keep coming after the reset');
  // the epoch the kill cut is marked, not silently re-run
  const cutRow = await until(20, 'the epoch the reset cut is marked ✂', async () => {
    const n = await page.locator('#epochs tr.cut').count();
    return n >= 1 ? (await page.locator('#epochs tr.cut td').first().textContent()) : null;
  });
  check(cutRow.includes('✂'), `epoch ${cutRow.trim()} is marked as cut by the reset`);

  state.step = 'output and events';
  check((await page.locator('pre.output').textContent()).includes('epoch'), 'worker output is shown');
  check(await page.locator('#events li').count() > 0, 'events are listed');
  await shot(page, 'job-after-kill-1280x800');

  state.step = 'stacks';
  // the owner takes every rank's stacks from the page (issue 31)
  await page.click('#stacks button');
  const taken = await until(20, 'the stacks taken from the page are shown', async () => {
    const t = await page.locator('#stacks').textContent();
    return t.includes('Taken on request (REST)') && (await page.locator('#stacks details.stack').count()) >= 2 ? t : null;
  });
  check(/rank 0 · \S+ · pid \d+/.test(taken), 'each rank is listed with its host and pid');
  await page.locator('#stacks details.stack summary').first().click();
  check((await page.locator('#stacks details.stack pre').first().textContent()).includes('most recent call first'),
    'a rank\'s Python stacks unfold');
  await shot(page, 'job-stacks-1280x800');
});
console.log('all dashboard checks passed');
