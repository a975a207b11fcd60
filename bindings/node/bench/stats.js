'use strict';
// Latency summaries in microseconds, computed as the Rust bench does
// (nearest-rank percentiles over the sorted samples).

/** p50, p99 and mean of `samplesNs` (bigint nanoseconds), in µs. */
function summarize(samplesNs) {
  const us = samplesNs.map((ns) => Number(ns) / 1e3).sort((a, b) => a - b);
  const at = (q) => us[Math.min(us.length - 1, Math.max(0, Math.ceil(q * us.length) - 1))];
  const mean = us.reduce((sum, v) => sum + v, 0) / us.length;
  return { samples: us.length, p50_us: at(0.5), p99_us: at(0.99), mean_us: mean };
}

/** Runs `fn` (async) `rounds` times; returns the wall time of each call. */
async function timeRounds(rounds, fn) {
  const samples = [];
  for (let i = 0; i < rounds; i += 1) {
    const started = process.hrtime.bigint();
    await fn(i);
    samples.push(process.hrtime.bigint() - started);
  }
  return samples;
}

module.exports = { summarize, timeRounds };
