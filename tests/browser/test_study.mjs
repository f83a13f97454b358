// test_study.mjs - a kolo tune study on the dashboard in a real browser
// (Debian's chromium, headless, playwright-core); test_study.sh runs the
// search on a real cluster.
//
//   node test_study.mjs HTTP_URL STUDY ARTIFACT_DIR DONE_FILE
//
// Checks, each with a deadline:
//   - the studies list links the study; its page opens while the search
//     runs and follows it live (more trials appear without a reload);
//   - once DONE_FILE exists (kolo tune ended): one table row per trial,
//     each linking its job; one line per trial that reported an epoch on
//     the per-epoch chart, pruned ones dashed (class t-pruned) as many as
//     REST counts, the best one marked; one best-so-far point per
//     improvement; the best trial named with its parameters;
//   - a trial's job page links back to its study;
//   - no console error or failed request, and no sideways scroll at 390 px.
// Screenshots go to ARTIFACT_DIR.
import fs from 'node:fs';
import {setup, state, check, rest, until, watch, shot, noSidewaysScroll, run} from './lib.mjs';

const [base, study, outDir, doneFile] = process.argv.slice(2);
if (!base || !study || !outDir || !doneFile) {
  console.error('usage: node test_study.mjs HTTP_URL STUDY ARTIFACT_DIR DONE_FILE');
  process.exit(2);
}
setup(base, outDir);
const enc = encodeURIComponent(study);
const studyRest = () => rest('/api/v1/studies/' + enc);

await run(async browser => {
  const ctx = await browser.newContext({viewport: {width: 1280, height: 800}});
  const page = await ctx.newPage();
  watch(page, 'desktop');

  state.step = 'studies list';
  // the link kolo prints carries the view key; the page keeps it as a cookie
  await page.goto(base + '/' + (process.env.KOLO_VIEW_KEY ? '?key=' + process.env.KOLO_VIEW_KEY : ''));
  await page.click('nav a[href="#/studies"]');
  const link = page.locator(`#studies a[href="#/studies/${enc}"]`);
  await until(15, 'the study is listed with a link', async () => (await link.count()) === 1);
  check((await link.textContent()) === study, `"${study}" listed`);

  state.step = 'study page, live';
  await link.click();
  await page.waitForSelector('#trials table', {timeout: 15000});
  const rowsNow = () => page.locator('#trials tbody tr').count();
  const first = await rowsNow();
  if (!fs.existsSync(doneFile)) {
    await until(60, 'more trials appear while the page is open', async () =>
      fs.existsSync(doneFile) || (await rowsNow()) > first);
    check(true, `the page followed the search (${first} row(s) at first)`);
  }
  await until(150, 'kolo tune finished', async () => fs.existsSync(doneFile));

  state.step = 'study page, finished';
  const s = await studyRest();
  await until(15, `one row per trial (${s.trial_count})`, async () => (await rowsNow()) === s.trial_count &&
    !(await page.locator('#trials').textContent()).includes('running'));
  for (const t of s.trials)
    check(await page.locator(`#trials a[href="#/jobs/${t.job}"]`).count() === 1, `trial ${t.number} links job ${t.job}`);
  const withEpochs = s.trials.filter(t => t.curve.length);
  const curves = page.locator('svg[data-chart="trial-curves"] path.series');
  await until(10, `one line per trial with epochs (${withEpochs.length})`, async () =>
    (await curves.count()) === withEpochs.length);
  const pts = await page.locator('svg[data-chart="trial-curves"] circle.pt').count();
  check(pts === withEpochs.reduce((a, t) => a + t.curve.length, 0), `${pts} points, one per reported epoch`);
  const pruned = withEpochs.filter(t => t.state === 'pruned').length;
  check(pruned >= 1 && pruned === s.states.pruned, `${pruned} pruned trial(s) in REST`);
  check(await page.locator('svg[data-chart="trial-curves"] path.series.t-pruned').count() === pruned,
        'every pruned trial is a dashed line (t-pruned)');
  check(await page.locator('svg[data-chart="trial-curves"] path.series.t-best').count() === 1,
        'the best trial is marked (t-best)');
  const best = s.trials.find(t => t.job === s.best_job);
  check(best && best.state === 'complete', `the best trial is ${best && best.number}, complete`);
  check(await page.locator(`svg[data-chart="trial-curves"] path.t-best[data-series="trial ${best.number} (complete)"]`).count() === 1,
        'the marked line is the best trial');
  check(await page.locator('svg[data-chart="best-so-far"] circle.pt').count() === s.best_so_far.length,
        `${s.best_so_far.length} best-so-far point(s)`);
  const head = await page.locator('dl.facts').textContent();
  check(head.includes(`trial ${best.number}`) && head.includes(`x=${best.params.x}`),
        `the header names the best trial and its parameters (${head.slice(0, 160)})`);
  const states = await page.locator('#trials tbody .badge').allTextContents();
  check(states.filter(x => x.includes('pruned')).length === s.states.pruned, 'pruned trials are badged "✂ pruned"');
  await shot(page, 'study-1280x800');

  state.step = 'trial job page';
  await page.click(`#trials a[href="#/jobs/${best.job}"]`);
  const back = page.locator(`.study-link a[href="#/studies/${enc}"]`);
  await until(15, 'the job page links its study', async () => (await back.count()) === 1);
  check((await page.locator('.study-link').textContent()).includes(`Trial ${best.number} of study`),
        `job ${best.job} says it is trial ${best.number} of the study`);
  await back.click();
  await page.waitForSelector('svg[data-chart="trial-curves"]', {timeout: 15000});
  check(true, 'the link leads back to the study');

  state.step = 'phone width';
  const phone = await browser.newContext({viewport: {width: 390, height: 844}, isMobile: true, hasTouch: true});
  const pp = await phone.newPage();
  watch(pp, 'phone');
  await pp.goto(`${base}/#/studies/${enc}`);
  await pp.waitForSelector('svg[data-chart="trial-curves"] circle.pt', {timeout: 15000});
  check(await noSidewaysScroll(pp), 'the study page fits 390 px');
  await shot(pp, 'study-390x844');
  await pp.goto(`${base}/#/studies`);
  await pp.waitForSelector('#studies table', {timeout: 15000});
  check(await noSidewaysScroll(pp), 'the studies list fits 390 px');
  await phone.close();
});
console.log('all study checks passed');
