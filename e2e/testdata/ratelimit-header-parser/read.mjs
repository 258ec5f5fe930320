// Reads Floodgate's rate-limit fields as a JavaScript client does: fetches
// each URL given, in order, and prints what npm's ratelimit-header-parser
// reads from each response, one JSON object a line. e2e/header_families_test.go
// runs it from the directory the parser is installed in.
//
//   node read.mjs <url>...
//
// A value the parser could not read (NaN, an invalid Date) prints as null.
import { parseRateLimit } from 'ratelimit-header-parser';

for (const url of process.argv.slice(2)) {
  const res = await fetch(url);
  await res.arrayBuffer();
  const got = parseRateLimit(res);
  const now = Date.now();
  const reset = got?.reset;
  const number = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
  console.log(JSON.stringify({
    status: res.status,
    found: got !== undefined,
    limit: number(got?.limit),
    remaining: number(got?.remaining),
    used: number(got?.used),
    // Seconds from now to the reset the parser read.
    resetIn: reset instanceof Date && !Number.isNaN(reset.getTime()) ? (reset.getTime() - now) / 1000 : null,
    headers: Object.fromEntries(res.headers),
  }));
}
