// shoot.mjs URL OUT.png [WIDTHxHEIGHT] [WAIT_SELECTOR] [ELEMENT] [CLICK]: a
// screenshot of a dashboard page in Debian's chromium: the full page, or
// only ELEMENT (a CSS selector, e.g. "#steps"); CLICK, a button's text,
// is pressed first and given time to fill in (e.g. "Take stacks now").
// The README's screenshot and docs/observability.md's pictures are taken
// this way from demo runs (docs/dashboard.md).
import { chromium } from 'playwright-core';

const [url, out, size = '1280x800', wait = 'main', element = '', click = ''] = process.argv.slice(2);
if (!url || !out) {
  console.error('usage: node shoot.mjs URL OUT.png [WIDTHxHEIGHT] [WAIT_SELECTOR] [ELEMENT] [CLICK]');
  process.exit(2);
}
const [width, height] = size.split('x').map(Number);
const browser = await chromium.launch({executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
                                       args: ['--no-sandbox']});
try {
  const page = await browser.newPage({viewport: {width, height}});
  await page.goto(url);
  await page.waitForSelector(wait, {timeout: 20000});
  if (click) {
    await page.getByRole('button', {name: click}).click({timeout: 20000});
    await page.waitForTimeout(4000); // the answer, and one more poll
  }
  await page.waitForTimeout(2500); // one more poll, so the charts are drawn
  if (element)
    await page.locator(element).screenshot({path: out});
  else
    await page.screenshot({path: out, fullPage: true});
} finally {
  await browser.close();
}
