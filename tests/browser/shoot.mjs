// shoot.mjs URL OUT.png [WIDTHxHEIGHT] [WAIT_SELECTOR]: a full-page
// screenshot of a dashboard page in Debian's chromium (the README's
// screenshot is taken this way from the demo run: see docs/dashboard.md).
import { chromium } from 'playwright-core';

const [url, out, size = '1280x800', wait = 'main'] = process.argv.slice(2);
if (!url || !out) {
  console.error('usage: node shoot.mjs URL OUT.png [WIDTHxHEIGHT] [WAIT_SELECTOR]');
  process.exit(2);
}
const [width, height] = size.split('x').map(Number);
const browser = await chromium.launch({executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
                                       args: ['--no-sandbox']});
try {
  const page = await browser.newPage({viewport: {width, height}});
  await page.goto(url);
  await page.waitForSelector(wait, {timeout: 20000});
  await page.waitForTimeout(2500); // one more poll, so the charts are drawn
  await page.screenshot({path: out, fullPage: true});
} finally {
  await browser.close();
}
