// The e2e scripts' checks: each runs on its own, prints ok or FAIL, and the script's exit status
// says whether all passed.
let passed = 0;
let failed = 0;

export async function check(name, body) {
  try {
    await body();
    passed++;
    console.log(`ok   ${name}`);
  } catch (error) {
    failed++;
    console.log(`FAIL ${name}: ${error?.stack ?? error}`);
  }
}

export function report() {
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}
