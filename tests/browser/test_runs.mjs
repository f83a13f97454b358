// test_runs.mjs - kolo dashboard (test_runs.sh starts it on a finished
// local run's database) in a real browser:
//   - /runs/ lists the run, newest first, with its job, ended;
//   - the run's page (the cluster page of its embedded coordinator) shows
//     its host as ended (not alive) and the job by its script's name,
//     ended: its end time and outcome, not "0 alive", and its progress
//     (last epoch, loss, time per epoch);
//   - the job page charts the metrics the job reported (loss, accuracy),
//     one point per epoch, next to epoch time and samples/s, and shows the
//     worker output (the printed link's key opens it);
//   - both fit 1280 and 390 px with no console error or failed request.
//
//   node test_runs.mjs URL RUN KEY ARTIFACT_DIR
import {setup, state, check, rest, until, watch, shot, noSidewaysScroll, run} from './lib.mjs';

const [base, runName, key, outDir] = process.argv.slice(2);
if (!base || !runName || !key || !outDir) {
  console.error('usage: node test_runs.mjs URL RUN KEY ARTIFACT_DIR');
  process.exit(2);
}
setup(base, outDir);

await run(async browser => {
  for (const [w, hgt] of [[1280, 800], [390, 844]]) {
    const size = `${w}x${hgt}`;
    const ctx = await browser.newContext({viewport: {width: w, height: hgt}, isMobile: w < 600});
    const page = await ctx.newPage();
    watch(page, size);

    state.step = `runs page ${size}`;
    await page.goto(`${base}/?key=${key}`); // redirected to /runs/
    await page.waitForSelector('#runs table', {timeout: 15000});
    const runs = (await rest('/api/v1/runs')).runs;
    check(runs.length === 1 && runs[0].name === runName && !runs[0].running, `/api/v1/runs lists ${runName}, ended`);
    const link = page.locator('a.run-link', {hasText: runName});
    check(await link.count() === 1, 'the run is listed');
    await until(10, 'the run\'s job is listed with its state', async () =>
      (await page.locator('#runs').textContent()).includes('train_job.py') &&
      (await page.locator('#runs').textContent()).includes('succeeded'));
    check(await noSidewaysScroll(page), `the runs page fits ${w} px`);
    await shot(page, `runs-${size}`);

    state.step = `run page ${size}`;
    await link.click();
    await page.waitForSelector('#jobs table', {timeout: 15000});
    check(new URL(page.url()).pathname === `/runs/${runName}/`, `the run's page is /runs/${runName}/`);
    const jobs = await page.locator('#jobs').textContent();
    check(jobs.includes('1 · train_job.py'), 'the job is named by its script, not its interpreter');
    check(!/0 alive|0 \/ 2/.test(jobs), 'the ended job does not read "0 alive"');
    await until(10, 'the ended run\'s host reads "ended", not "alive"', async () => {
      const t = await page.locator('#hosts').textContent();
      return t.includes('ended') && !t.includes('alive');
    });
    check(true, 'the ended run\'s host reads "ended", with no lease age ticking');
    await until(10, 'the job shows its progress and outcome', async () => {
      const t = await page.locator('#jobs').textContent();
      return /epoch 3 · loss [0-9.]+ · accuracy [0-9.]+ · [0-9.]+ (ms|s)\/epoch/.test(t) && t.includes('succeeded');
    });
    check(true, 'progress "epoch 3 · loss … · accuracy … · …/epoch" and the end with its outcome');
    check(await noSidewaysScroll(page), `the run's page fits ${w} px`);
    await shot(page, `run-${size}`);

    state.step = `job page ${size}`;
    await page.click('#jobs a[href="#/jobs/1"]');
    await page.waitForSelector('svg[data-chart="metric-loss"]', {timeout: 15000});
    const ep = (await rest(`/runs/${runName}/api/v1/jobs/1/epochs`)).epochs;
    for (const chart of ['metric-loss', 'metric-accuracy', 'epoch-time', 'samples-per-s']) {
      const n = await page.locator(`svg[data-chart="${chart}"] circle.pt`).count();
      check(n === ep.length && n === 3, `chart ${chart} has a point per epoch (${n})`);
    }
    const facts = await page.locator('dl.facts').textContent();
    check(facts.includes('Ended') && facts.includes('succeeded') && !facts.includes('alive'),
          'the header gives the end and outcome, no live worker count');
    await until(10, 'the worker output is shown (the key opened it)', async () =>
      (await page.locator('pre.output').textContent()).includes('epoch 3 done'));
    check(await page.locator('#events li', {hasText: 'job.succeeded'}).count() === 1, 'the events end with job.succeeded');
    check(await noSidewaysScroll(page), `the job page fits ${w} px`);
    await shot(page, `job-${size}`);
    await ctx.close();
  }
});
console.log('all kolo dashboard checks passed');
