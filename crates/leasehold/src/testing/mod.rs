//! Test decorators (feature `testing`): wrappers of a real backend that
//! misbehave on purpose, to drive the core's failure paths in tests. One
//! file per decorator, each built on
//! [`Decorator`](crate::backends::decorator::Decorator).

mod faulty;

pub use faulty::{Fault, Faulty, Op};
