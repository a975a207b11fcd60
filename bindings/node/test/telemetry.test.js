'use strict';
// Locks.open(url, { telemetry }): OpenTelemetry metrics and spans through
// the app's own meter and tracer (the SDK's in-memory reader and exporter
// here), named as the Rust `metrics` feature names them.

const test = require('node:test');
const assert = require('node:assert/strict');
const { metrics, trace } = require('@opentelemetry/api');
const { MeterProvider, MetricReader } = require('@opentelemetry/sdk-metrics');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { Locks } = require('leasehold');

/** A reader whose collect() the test calls. */
class TestReader extends MetricReader {
  async onForceFlush() {}
  async onShutdown() {}
}

function telemetrySetup() {
  const reader = new TestReader();
  const meterProvider = new MeterProvider({ readers: [reader] });
  const exporter = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  return { reader, meterProvider, tracerProvider, exporter };
}

/** Every data point of metric `name` in one collection. */
async function points(reader, name) {
  const { resourceMetrics, errors } = await reader.collect();
  assert.deepEqual(errors, []);
  const found = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics).filter((m) => m.descriptor.name === name);
  return found.flatMap((m) => m.dataPoints);
}

function pointWith(list, attributes) {
  return list.filter((p) => Object.entries(attributes).every(([k, v]) => p.attributes[k] === v));
}

test('wait and use times, counts and spans reach the meter and tracer handed in', async () => {
  const { reader, meterProvider, tracerProvider, exporter } = telemetrySetup();
  const locks = await Locks.open('memory://', {
    telemetry: { meter: meterProvider.getMeter('app'), tracer: tracerProvider.getTracer('app') },
  });
  try {
    const lease = await locks.acquire('orders:1', { ttl: '30s' });
    assert.equal(await locks.tryAcquire('orders:1'), null);
    await assert.rejects(locks.acquire('orders:1', { wait: 30 }), { code: 'LEASEHOLD_TIMEOUT' });
    await lease.release();
    await lease.release(); // a second release is a no-op, not a second use_time sample
    const permit = await locks.semaphore('reports', 2).acquire();
    await permit.release();
    const both = await locks.acquireMany(['carts:1', 'carts:2']);
    await both.release();

    const waits = await points(reader, 'leasehold.lock.wait_time');
    const count = (attrs) => pointWith(waits, attrs).reduce((n, p) => n + p.value.count, 0);
    assert.equal(count({ primitive: 'mutex', lock_class: 'orders', outcome: 'granted', store: 'memory' }), 1);
    assert.equal(count({ primitive: 'mutex', outcome: 'busy' }), 1);
    assert.equal(count({ primitive: 'mutex', outcome: 'timeout' }), 1);
    assert.equal(count({ primitive: 'semaphore', lock_class: 'other', outcome: 'granted' }), 1);
    assert.equal(count({ primitive: 'multi', lock_class: 'carts', outcome: 'granted' }), 1);
    const timeout = pointWith(waits, { outcome: 'timeout' })[0];
    assert.ok(timeout.value.sum >= 0.03, `the timeout waited its 30 ms: ${timeout.value.sum} s`);

    const uses = await points(reader, 'leasehold.lock.use_time');
    assert.equal(uses.reduce((n, p) => n + p.value.count, 0), 3, 'one use_time sample per released grant');

    // The counts are the core's, observed at collection: they equal stats().
    const stats = locks.stats();
    const acquires = await points(reader, 'leasehold.lock.acquires');
    for (const [outcome, value] of [
      ['granted', stats.acquires.granted],
      ['busy', stats.acquires.busy],
      ['timeout', stats.acquires.timeout],
      ['error', stats.acquires.failed],
    ]) {
      assert.equal(pointWith(acquires, { outcome })[0].value, value, `acquires ${outcome}`);
    }
    assert.equal((await points(reader, 'leasehold.lock.held'))[0].value, 0);
    assert.equal((await points(reader, 'leasehold.lock.attempts'))[0].value, stats.attempts);

    const spans = exporter.getFinishedSpans();
    const acquireSpans = spans.filter((s) => s.name === 'leasehold.acquire');
    assert.deepEqual(
      acquireSpans.map((s) => s.attributes.outcome),
      ['granted', 'busy', 'timeout', 'granted', 'granted'],
    );
    assert.deepEqual(acquireSpans[0].attributes['leasehold.keys'], ['orders:1']);
    const releases = spans.filter((s) => s.name === 'leasehold.release');
    assert.equal(releases.length, 3);
    assert.ok(releases.every((s) => s.attributes.outcome === 'ok'));
  } finally {
    await locks.close();
  }
  // After close the handle's counts are no longer observed (stats() of a
  // closed handle is not called): a collection still has no errors.
  await points(reader, 'leasehold.lock.acquires');
});

test('telemetry: true uses the global meter and tracer of @opentelemetry/api', async (t) => {
  const { reader, meterProvider, tracerProvider, exporter } = telemetrySetup();
  assert.ok(metrics.setGlobalMeterProvider(meterProvider));
  assert.ok(trace.setGlobalTracerProvider(tracerProvider));
  t.after(() => {
    metrics.disable();
    trace.disable();
  });
  const locks = await Locks.open('memory://', { telemetry: true });
  try {
    await locks.withLock('jobs:nightly', async () => {});
    const waits = await points(reader, 'leasehold.lock.wait_time');
    assert.equal(pointWith(waits, { lock_class: 'jobs', outcome: 'granted' }).length, 1);
    assert.deepEqual(
      exporter.getFinishedSpans().map((s) => [s.name, s.instrumentationScope.name]),
      [
        ['leasehold.acquire', 'leasehold'],
        ['leasehold.release', 'leasehold'],
      ],
    );
  } finally {
    await locks.close();
  }
});

test('a bad telemetry option is refused before any I/O', async () => {
  // Port 1 refuses connections: an I/O attempt would fail as unavailable.
  const unreachable = 'redis://127.0.0.1:1';
  for (const [telemetry, message] of [
    [5, /invalid telemetry: expected true, false or \{ meter, tracer \}, got number/],
    [null, /got null/],
    [{ metre: {} }, /unknown field "metre"/],
    [{ meter: {} }, /invalid telemetry.meter/],
    [{ tracer: 'x' }, /invalid telemetry.tracer/],
  ]) {
    await assert.rejects(Locks.open(unreachable, { telemetry }), { code: 'LEASEHOLD_INVALID_INPUT', message });
  }
  await assert.rejects(Locks.open(unreachable, { telemtry: true }), {
    code: 'LEASEHOLD_INVALID_INPUT',
    message: /unknown option "telemtry" for Locks.open/,
  });
  await assert.rejects(Locks.open(unreachable, 'x'), { code: 'LEASEHOLD_INVALID_INPUT' });
});

test('without telemetry nothing is recorded anywhere', async () => {
  const { reader, meterProvider } = telemetrySetup();
  assert.ok(metrics.setGlobalMeterProvider(meterProvider));
  try {
    const locks = await Locks.open('memory://');
    await locks.withLock('orders:2', async () => {});
    await locks.close();
    assert.deepEqual(await points(reader, 'leasehold.lock.wait_time'), []);
  } finally {
    metrics.disable();
  }
});

test("the README's prom-client gauges read locks.stats() at each scrape", async (t) => {
  const client = require('prom-client');
  const register = new client.Registry();
  const locks = await Locks.open('memory://');
  t.after(() => locks.close());
  new client.Gauge({
    name: 'leasehold_locks_held',
    help: 'Leases this process holds now',
    registers: [register],
    collect() {
      this.set(locks.stats().held);
    },
  });
  new client.Gauge({
    name: 'leasehold_lock_wait_p99_seconds',
    help: 'p99 of acquisition wait times since start',
    registers: [register],
    collect() {
      this.set(locks.stats().wait.p99Ms / 1000);
    },
  });
  const lease = await locks.acquire('orders:3');
  assert.match(await register.metrics(), /^leasehold_locks_held 1$/m);
  await lease.release();
  const text = await register.metrics();
  assert.match(text, /^leasehold_locks_held 0$/m);
  const p99 = Number(/^leasehold_lock_wait_p99_seconds (\S+)$/m.exec(text)[1]);
  assert.ok(p99 > 0 && p99 < 5, `a wait p99 in seconds: ${p99}`);
});
