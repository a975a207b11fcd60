//! Criterion benchmarks for leasehold; see `benches/`.
