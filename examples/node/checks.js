'use strict';
// The examples' self-checks, shared by express-users/demo.js and
// mongo-lock/run.js: each failed check is remembered, and the run ends by
// listing them with exit code 1, or with "all checks passed".

const failures = [];

/** Records `what` as a failure unless `ok`. */
function check(ok, what) {
  if (!ok) failures.push(what);
}

/** Prints every failure (exit code 1) or "all checks passed". */
function report() {
  if (failures.length > 0) {
    for (const failure of failures) console.error(`FAILED: ${failure}`);
    process.exitCode = 1;
  } else {
    console.log('all checks passed');
  }
}

/** Runs `main`, then reports the checks; an error thrown is printed (exit code 1). */
function runChecked(main) {
  main()
    .then(report)
    .catch((error) => {
      console.error(error);
      process.exitCode = 1;
    });
}

module.exports = { check, runChecked };
