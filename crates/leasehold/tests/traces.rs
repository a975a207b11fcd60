//! Traces: the `acquire`, `renew` and `release` spans carry the labels the
//! metrics carry (store, primitive, lock_class) and the outcome; a lost
//! lease is an event on the lease's span.
//!
//! One global subscriber for the binary keeps every closed span and every
//! event; each test reads only those of its own lock class.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use leasehold::{AcquireOptions, LeaseGuard, Locks};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = HashMap<String, String>;

#[derive(Debug, Clone)]
struct Seen {
    /// The span's name, or for an event the name of the span it is on.
    name: String,
    fields: Fields,
    /// For an event: its span's fields.
    span_fields: Fields,
}

#[derive(Default)]
struct Kept {
    spans: Vec<Seen>,
    events: Vec<Seen>,
}

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

struct Keep(&'static Mutex<Kept>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Keep {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut ext = span.extensions_mut();
        values.record(&mut Visitor(ext.get_mut::<Fields>().unwrap()));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span.extensions().get::<Fields>().cloned().unwrap();
        self.0.lock().unwrap().spans.push(Seen {
            name: span.name().to_owned(),
            fields,
            span_fields: Fields::new(),
        });
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        let (name, span_fields) = match ctx.event_span(event) {
            Some(span) => (
                span.name().to_owned(),
                span.extensions().get::<Fields>().cloned().unwrap(),
            ),
            None => (String::new(), Fields::new()),
        };
        self.0.lock().unwrap().events.push(Seen {
            name,
            fields,
            span_fields,
        });
    }
}

fn kept() -> &'static Mutex<Kept> {
    static KEPT: OnceLock<&'static Mutex<Kept>> = OnceLock::new();
    KEPT.get_or_init(|| {
        let kept: &'static Mutex<Kept> = Box::leak(Box::default());
        let subscriber = tracing_subscriber::registry().with(Keep(kept));
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        kept
    })
}

/// The closed spans named `name` of lock class `class`.
fn spans(name: &str, class: &str) -> Vec<Fields> {
    kept()
        .lock()
        .unwrap()
        .spans
        .iter()
        .filter(|s| s.name == name && s.fields.get("lock_class").map(String::as_str) == Some(class))
        .map(|s| s.fields.clone())
        .collect()
}

fn labelled(fields: &Fields, class: &str, outcome: &str) -> bool {
    fields.get("store").map(String::as_str) == Some("memory")
        && fields.get("primitive").map(String::as_str) == Some("mutex")
        && fields.get("lock_class").map(String::as_str) == Some(class)
        && fields.get("outcome").map(String::as_str) == Some(outcome)
}

/// Spans kept from here on; a memory store, and `key` held on it with a
/// 300 ms lease (renewed at ttl/3).
async fn held_on_memory(key: &str) -> (Locks, LeaseGuard) {
    kept();
    let locks = Locks::open("memory://").await.unwrap();
    let options = AcquireOptions::new().with_ttl(Duration::from_millis(300));
    let guard = locks.acquire_with(key, &options).await.unwrap();
    (locks, guard)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_and_release_spans_carry_the_labels_and_the_outcome() {
    let (locks, guard) = held_on_memory("traced:1").await;
    assert!(locks.try_acquire("traced:1").await.is_err());
    tokio::time::sleep(Duration::from_millis(250)).await; // renewals at ttl/3
    guard.release().await.unwrap();
    // A span closes when its last handle goes: the granted acquisition's
    // only after its child, the lease's span, which the renewal task holds
    // until it has seen the release.
    for _ in 0..100 {
        if spans("acquire", "traced").len() == 2 && spans("lease", "traced").len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let acquires = spans("acquire", "traced");
    assert!(
        acquires.iter().any(|f| labelled(f, "traced", "granted")),
        "{acquires:?}"
    );
    assert!(
        acquires.iter().any(|f| labelled(f, "traced", "busy")),
        "{acquires:?}"
    );
    assert!(acquires
        .iter()
        .all(|f| !f.contains_key("lock_class") || f["key"] == "traced:1"));
    let renewals = spans("renew", "traced");
    assert!(
        renewals.iter().any(|f| labelled(f, "traced", "ok")),
        "{renewals:?}"
    );
    let releases = spans("release", "traced");
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert!(labelled(&releases[0], "traced", "ok"), "{releases:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_an_event_on_the_lease_span() {
    let (locks, guard) = held_on_memory("broken:1").await;
    let token = guard.token();
    assert!(locks.force_release("broken:1").await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost after the break");

    let kept = kept().lock().unwrap();
    let lost: Vec<&Seen> = kept
        .events
        .iter()
        .filter(|e| e.fields.get("message").map(String::as_str) == Some("lease lost"))
        .filter(|e| e.span_fields.get("lock_class").map(String::as_str) == Some("broken"))
        .collect();
    assert_eq!(lost.len(), 1, "{:?}", kept.events);
    assert_eq!(lost[0].name, "lease");
    assert_eq!(lost[0].fields["reason"], "gone");
    assert_eq!(lost[0].span_fields["token"], token.to_string());
    assert_eq!(lost[0].span_fields["store"], "memory");
}
