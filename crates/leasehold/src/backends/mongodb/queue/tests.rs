//! The queue's decisions on documents written by hand, no server needed.

use super::*;
use crate::key::Key;

const NOW: i64 = 1_000_000;
const TTL: Duration = Duration::from_secs(30);

fn now() -> ServerNow {
    ServerNow {
        lower: NOW,
        upper: NOW + 2,
    }
}

/// A lock document: `holder` (owner, expiry ms) or free, at fence 5.
fn document(holder: Option<(OwnerId, i64)>, entries: Vec<(OwnerId, i64, i64)>) -> Document {
    let mut d = doc! { "_id": "k", "base": 100_i64, "fence": 5_i64, "qseq": 9_i64 };
    match holder {
        Some((owner, expires)) => {
            d.insert("owner", owner.to_string());
            d.insert("holder", "holder");
            d.insert("expiresAt", date(expires));
        }
        None => {
            d.insert("owner", Bson::Null);
            d.insert("expiresAt", date(NOW - 10));
        }
    }
    if !entries.is_empty() {
        let q: Document = entries
            .iter()
            .map(|(owner, place, expires)| {
                let entry = doc! { "s": *place, "h": format!("w{place}"), "c": 2000_i64,
                "t": *place, "e": date(*expires) };
                (owner.to_string(), Bson::Document(entry))
            })
            .collect();
        d.insert("qn", entries.len() as i64);
        d.insert("q", q);
    }
    d
}

fn waiter(ticket: u32) -> AcquireRequest {
    AcquireRequest::new(Key::new("k").unwrap(), TTL, "me")
        .unwrap()
        .with_queue_entry(Duration::from_secs(2), ticket)
}

fn stranger() -> AcquireRequest {
    AcquireRequest::new(Key::new("k").unwrap(), TTL, "stranger").unwrap()
}

/// The entries an update removes.
fn removed(update: &Document) -> Vec<String> {
    update
        .get_document("$unset")
        .map(|u| {
            u.keys()
                .map(|k| k.trim_start_matches("q.").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn inc(update: &Document, field: &str) -> Option<i64> {
    update.get_document("$inc").ok()?.get_i64(field).ok()
}

fn set<'a>(update: &'a Document, field: &str) -> Option<&'a Bson> {
    update.get_document("$set").ok()?.get(field)
}

#[test]
fn a_busy_key_takes_a_waiters_entry_at_the_back_and_nothing_of_a_stranger() {
    let (holder, first) = (OwnerId::random(), OwnerId::random());
    let d = document(Some((holder, NOW + 5000)), vec![(first, 3, NOW + 900)]);
    let snapshot = Snapshot::read(&d, now()).unwrap();
    assert!(snapshot.attempt(&stranger()).is_none(), "busy, no write");
    let me = waiter(4);
    let plan = snapshot.attempt(&me).unwrap();
    assert_eq!(plan.outcome, Outcome::Queued);
    let path = format!("q.{}", me.owner());
    let Some(Bson::Document(mine)) = set(&plan.update, &path) else {
        panic!("{:?}", plan.update);
    };
    assert_eq!(mine.get_i64("s").unwrap(), 10, "after every place so far");
    assert_eq!(mine.get_i64("t").unwrap(), 4);
    assert_eq!(
        (inc(&plan.update, "qn"), inc(&plan.update, "qseq")),
        (Some(1), Some(1))
    );
    assert_eq!(
        plan.filter.get_document(&path).unwrap(),
        &doc! { "$exists": false }
    );
    assert!(
        plan.filter.contains_key("owner"),
        "a newcomer needs the lease as read"
    );
    // Renewed, it keeps its place, and needs only its entry as read.
    let d = document(
        Some((holder, NOW + 5000)),
        vec![(me.owner(), 2, NOW + 900), (first, 3, NOW + 900)],
    );
    let plan = Snapshot::read(&d, now()).unwrap().attempt(&me).unwrap();
    assert_eq!(plan.filter.get_i64(format!("{path}.s")).unwrap(), 2);
    assert!(!plan.filter.contains_key("owner"));
    assert_eq!(
        set(&plan.update, &format!("{path}.t")),
        Some(&Bson::Int64(4))
    );
    assert_eq!(inc(&plan.update, "qn"), None);
}

#[test]
fn a_free_key_goes_to_the_live_head_and_the_requester_queues_behind() {
    let (dead, head) = (OwnerId::random(), OwnerId::random());
    let d = document(None, vec![(dead, 1, NOW - 1), (head, 2, NOW + 900)]);
    let me = waiter(0);
    let plan = Snapshot::read(&d, now()).unwrap().attempt(&me).unwrap();
    let Outcome::HandedOver {
        head: to,
        label,
        claim,
        grant,
    } = plan.outcome
    else {
        panic!("{:?}", plan.outcome);
    };
    assert_eq!(
        (to, label.as_str(), claim),
        (head, "w2", Duration::from_secs(2))
    );
    assert_eq!(
        grant,
        HandOff {
            token: 106,
            ticket: 2
        },
        "the next token, the entry's ticket"
    );
    assert_eq!(
        set(&plan.update, "owner"),
        Some(&Bson::String(head.to_string()))
    );
    assert_eq!(
        set(&plan.update, "handoff"),
        Some(&Bson::String(hand_off_message("k", head, grant)))
    );
    assert_eq!(
        set(&plan.update, "expiresAt"),
        Some(&Bson::DateTime(date(NOW + 2 + 2000)))
    );
    assert_eq!(inc(&plan.update, "fence"), Some(1));
    let mut gone = removed(&plan.update);
    gone.sort();
    let mut expected = vec![dead.to_string(), head.to_string()];
    expected.sort();
    assert_eq!(gone, expected, "the dead entry and the head's go");
    assert_eq!(
        inc(&plan.update, "qn"),
        Some(-1),
        "two go, the requester enters"
    );
    assert_eq!(plan.filter.get_i64(format!("q.{head}.s")).unwrap(), 2);
    assert_eq!(
        plan.filter.get_datetime(format!("q.{dead}.e")).unwrap(),
        &date(NOW - 1),
        "a dead entry goes unless renewed since"
    );
    assert_eq!(
        plan.filter.get_i64("fence").unwrap(),
        5,
        "the lease as read"
    );
    // A stranger's attempt hands over too, and does not queue.
    let plan = Snapshot::read(&d, now())
        .unwrap()
        .attempt(&stranger())
        .unwrap();
    assert!(matches!(plan.outcome, Outcome::HandedOver { .. }));
    assert_eq!(inc(&plan.update, "qn"), Some(-2));
}

#[test]
fn a_free_key_goes_to_the_requester_at_the_head_or_with_nobody_live_queued() {
    let (me, other) = (waiter(3), OwnerId::random());
    let d = document(
        None,
        vec![(me.owner(), 1, NOW + 900), (other, 2, NOW + 900)],
    );
    let plan = Snapshot::read(&d, now()).unwrap().attempt(&me).unwrap();
    assert_eq!(plan.outcome, Outcome::Granted(106));
    assert_eq!(
        set(&plan.update, "owner"),
        Some(&Bson::String(me.owner().to_string()))
    );
    assert_eq!(set(&plan.update, "ttlMs"), Some(&Bson::Int64(30_000)));
    assert_eq!(removed(&plan.update), [me.owner().to_string()]);
    // Expired holder, dead entries only: the stranger's, and they go.
    let d = document(Some((other, NOW)), vec![(OwnerId::random(), 1, NOW)]);
    let plan = Snapshot::read(&d, now())
        .unwrap()
        .attempt(&stranger())
        .unwrap();
    assert_eq!(plan.outcome, Outcome::Granted(106));
    assert_eq!(inc(&plan.update, "qn"), Some(-1));
}

#[test]
fn a_release_hands_over_or_frees_and_only_the_holders_does() {
    let (holder, head) = (OwnerId::random(), OwnerId::random());
    let d = document(Some((holder, NOW + 5000)), vec![(head, 4, NOW + 900)]);
    let snapshot = Snapshot::read(&d, now()).unwrap();
    assert!(snapshot.release(holder, 104).is_none(), "an older token");
    assert!(snapshot.release(head, 105).is_none(), "not the holder");
    let plan = snapshot.release(holder, 105).unwrap();
    assert!(matches!(plan.outcome, Outcome::HandedOver { head: h, .. } if h == head));
    assert_eq!(removed(&plan.update), [head.to_string()]);
    assert_eq!(plan.filter.get_str("owner").unwrap(), holder.to_string());
    let d = document(Some((holder, NOW + 5000)), vec![(head, 4, NOW - 1)]);
    let plan = Snapshot::read(&d, now())
        .unwrap()
        .release(holder, 105)
        .unwrap();
    assert_eq!(plan.outcome, Outcome::Freed, "nobody live queued");
    assert_eq!(set(&plan.update, "owner"), Some(&Bson::Null));
    assert_eq!(inc(&plan.update, "qn"), Some(-1), "the dead entry goes");
}

#[test]
fn leaving_takes_the_entry_and_gives_a_handed_over_grant_to_the_next() {
    let (holder, me, next) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    let queue = vec![(me, 1, NOW + 900), (next, 2, NOW + 900)];
    let d = document(Some((holder, NOW + 5000)), queue);
    let snapshot = Snapshot::read(&d, now()).unwrap();
    assert!(snapshot.leave(OwnerId::random()).is_none(), "not queued");
    let plan = snapshot.leave(me).unwrap();
    assert_eq!(plan.outcome, Outcome::Left);
    assert_eq!(removed(&plan.update), [me.to_string()]);
    assert_eq!(inc(&plan.update, "fence"), None);
    // Handed over to `me`, who leaves: the next head's.
    let d = document(Some((me, NOW + 2000)), vec![(next, 2, NOW + 900)]);
    let plan = Snapshot::read(&d, now()).unwrap().leave(me).unwrap();
    assert!(matches!(plan.outcome, Outcome::HandedOver { head, .. } if head == next));
    // With nobody behind, freed.
    let d = document(Some((me, NOW + 2000)), vec![]);
    let plan = Snapshot::read(&d, now()).unwrap().leave(me).unwrap();
    assert_eq!(plan.outcome, Outcome::Freed);
}

#[test]
fn a_damaged_queue_is_a_corrupt_record_naming_the_key() {
    let owner = OwnerId::random().to_string();
    let entry = |e: Document| {
        let mut d = document(None, vec![]);
        d.insert("q", doc! { owner.as_str(): e });
        d
    };
    let good = doc! { "s": 1_i64, "h": "w", "c": 2000_i64, "t": 0_i64, "e": date(NOW) };
    let mut cases = vec![];
    for (field, value) in [
        ("s", Bson::String("x".into())),
        ("c", Bson::Int64(0)),
        ("t", Bson::Int64(-1)),
        ("t", Bson::Int64(1 << 40)),
        ("e", Bson::Int64(5)),
        ("h", Bson::Int32(1)),
    ] {
        let mut bad = good.clone();
        bad.insert(field, value);
        cases.push(entry(bad));
    }
    let mut not_owner = document(None, vec![]);
    not_owner.insert("q", doc! { "nothex": good.clone() });
    cases.push(not_owner);
    let mut not_map = document(None, vec![]);
    not_map.insert("q", "x");
    cases.push(not_map);
    let mut bad_seq = document(None, vec![]);
    bad_seq.insert("qseq", "x");
    cases.push(bad_seq);
    for d in &cases {
        let e = Snapshot::read(d, now()).unwrap_err();
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("corrupt lease record \"k\""), "{e}");
    }
    assert!(Snapshot::read(&entry(good), now()).is_ok());
}

#[test]
fn a_renewal_without_a_read_matches_only_a_key_held_by_another_with_the_entry_in() {
    let me = waiter(7);
    let (filter, update) = renewal_while_held(&me, now()).unwrap();
    let path = format!("q.{}", me.owner());
    assert_eq!(
        filter.get_document(&path).unwrap(),
        &doc! { "$exists": true }
    );
    assert_eq!(
        filter.get_document("owner").unwrap(),
        &doc! { "$type": "string", "$ne": me.owner().to_string() }
    );
    assert_eq!(
        filter.get_document("expiresAt").unwrap(),
        &doc! { "$gt": date(NOW) }
    );
    assert_eq!(set(&update, &format!("{path}.t")), Some(&Bson::Int64(7)));
    assert_eq!(
        set(&update, &format!("{path}.e")),
        Some(&Bson::DateTime(date(NOW + 2 + 2000)))
    );
    assert!(renewal_while_held(&stranger(), now()).is_none());
}
