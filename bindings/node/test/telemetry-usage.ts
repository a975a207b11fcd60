// Type-checked (never run): an OpenTelemetry Meter and Tracer of
// @opentelemetry/api fit `Locks.open`'s telemetry option, whose types
// leasehold declares without importing that optional package.
import { metrics, trace } from '@opentelemetry/api';
import { Locks } from 'leasehold';

export async function telemetryUsage(): Promise<void> {
  const withGlobal = await Locks.open('memory://', { telemetry: true });
  const withOwn = await Locks.open('memory://', {
    telemetry: { meter: metrics.getMeter('app'), tracer: trace.getTracer('app') },
  });
  const metricsOnly = await Locks.open('memory://', { telemetry: { meter: metrics.getMeter('app') } });
  await Promise.all([withGlobal.close(), withOwn.close(), metricsOnly.close()]);
}
