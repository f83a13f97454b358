// lib.mjs - what the browser tests share: checks with a step name,
// polling with a deadline, REST reads, screenshots, and the watch on a
// page's console errors, page errors and failed requests.
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';

export const problems = [];
export const state = {step: 'start', base: '', outDir: ''};

export function setup(base, outDir) {
  state.base = base;
  state.outDir = outDir;
  fs.mkdirSync(outDir, {recursive: true});
}

export function check(ok, what) {
  if (!ok) throw new Error(`${state.step}: ${what}`);
  console.log(`ok - ${state.step}: ${what}`);
}

export async function rest(p) {
  const r = await fetch(state.base + p, {signal: AbortSignal.timeout(5000)});
  if (!r.ok) throw new Error(`${p}: HTTP ${r.status}`);
  return r.json();
}

// Polls fn until it returns a truthy value; fails after `seconds`.
export async function until(seconds, what, fn) {
  const end = Date.now() + seconds * 1000;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e.message;
    }
    if (Date.now() > end) throw new Error(`${state.step}: ${what} (not within ${seconds} s; last: ${last})`);
    await new Promise(r => setTimeout(r, 250));
  }
}

export function watch(page, label) {
  page.on('console', m => { if (m.type() === 'error') problems.push(`${label} console: ${m.text()}`); });
  page.on('pageerror', e => problems.push(`${label} page error: ${e.message}`));
  page.on('requestfailed', r => problems.push(`${label} request failed: ${r.url()} ${r.failure() && r.failure().errorText}`));
  page.on('response', r => { if (r.status() >= 400) problems.push(`${label} HTTP ${r.status()}: ${r.url()}`); });
}

export async function shot(page, name) {
  const file = path.join(state.outDir, name + '.png');
  await page.screenshot({path: file, fullPage: true});
  console.log(`   screenshot ${file}`);
}

export async function noSidewaysScroll(page) {
  return page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1);
}

// Runs body(browser) in headless chromium; exits 1 with the step's message
// (and the pages' problems) when it throws or a page had a problem.
export async function run(body) {
  const browser = await chromium.launch({executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
                                         args: ['--no-sandbox', '--disable-gpu']});
  let failed = null;
  try {
    await body(browser);
    state.step = 'console';
    check(problems.length === 0, `no console error, page error or failed request${problems.length ? ':\n  ' + problems.join('\n  ') : ''}`);
  } catch (e) {
    failed = e;
  } finally {
    await browser.close();
  }
  if (failed) {
    console.error(`FAIL: ${failed.message}`);
    if (problems.length) console.error('browser problems:\n  ' + problems.join('\n  '));
    process.exit(1);
  }
}
