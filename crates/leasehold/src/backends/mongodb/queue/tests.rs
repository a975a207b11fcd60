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

/// The owners the update leaves queued (`None`: the queue is unset).
fn queued_after(update: &Document) -> Option<Vec<String>> {
    let q = update.get_document("$set").ok()?.get_document("q").ok()?;
    Some(q.keys().cloned().collect())
}

fn unsets_queue(update: &Document) -> bool {
    update
        .get_document("$unset")
        .is_ok_and(|u| u.contains_key("q") && u.contains_key("qn") && u.contains_key("qe"))
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
    let q = plan
        .update
        .get_document("$set")
        .unwrap()
        .get_document("q")
        .unwrap();
    let mine = q.get_document(me.owner().to_string()).unwrap();
    assert_eq!(mine.get_i64("s").unwrap(), 10, "after every place so far");
    assert_eq!(mine.get_i64("t").unwrap(), 4);
    assert_eq!(q.len(), 2);
    assert_eq!(
        plan.update
            .get_document("$inc")
            .unwrap()
            .get_i64("qseq")
            .unwrap(),
        1
    );
    // Renewed, it keeps its place.
    let d = document(
        Some((holder, NOW + 5000)),
        vec![(me.owner(), 2, NOW + 900), (first, 3, NOW + 900)],
    );
    let plan = Snapshot::read(&d, now()).unwrap().attempt(&me).unwrap();
    let q = plan
        .update
        .get_document("$set")
        .unwrap()
        .get_document("q")
        .unwrap();
    assert_eq!(
        q.get_document(me.owner().to_string())
            .unwrap()
            .get_i64("s")
            .unwrap(),
        2
    );
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
    let set = plan.update.get_document("$set").unwrap();
    assert_eq!(set.get_str("owner").unwrap(), head.to_string());
    assert_eq!(
        set.get_str("handoff").unwrap(),
        hand_off_message("k", head, grant)
    );
    assert_eq!(
        set.get_datetime("expiresAt").unwrap().timestamp_millis(),
        NOW + 2 + 2000
    );
    assert_eq!(
        plan.update
            .get_document("$inc")
            .unwrap()
            .get_i64("fence")
            .unwrap(),
        1
    );
    assert_eq!(
        queued_after(&plan.update),
        Some(vec![me.owner().to_string()]),
        "dead and head gone"
    );
    // A stranger's attempt hands over too, and does not queue.
    let plan = Snapshot::read(&d, now())
        .unwrap()
        .attempt(&stranger())
        .unwrap();
    assert!(matches!(plan.outcome, Outcome::HandedOver { .. }));
    assert!(unsets_queue(&plan.update));
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
    let set = plan.update.get_document("$set").unwrap();
    assert_eq!(set.get_str("owner").unwrap(), me.owner().to_string());
    assert_eq!(set.get_i64("ttlMs").unwrap(), 30_000);
    assert_eq!(queued_after(&plan.update), Some(vec![other.to_string()]));
    // Expired holder, dead entries only: the stranger's, and the queue goes.
    let d = document(Some((other, NOW)), vec![(OwnerId::random(), 1, NOW)]);
    let plan = Snapshot::read(&d, now())
        .unwrap()
        .attempt(&stranger())
        .unwrap();
    assert_eq!(plan.outcome, Outcome::Granted(106));
    assert!(unsets_queue(&plan.update));
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
    assert!(unsets_queue(&plan.update));
    let d = document(Some((holder, NOW + 5000)), vec![(head, 4, NOW - 1)]);
    let plan = Snapshot::read(&d, now())
        .unwrap()
        .release(holder, 105)
        .unwrap();
    assert_eq!(plan.outcome, Outcome::Freed, "nobody live queued");
    assert_eq!(
        plan.update.get_document("$set").unwrap().get("owner"),
        Some(&Bson::Null)
    );
    assert!(unsets_queue(&plan.update));
}

#[test]
fn leaving_takes_the_entry_and_gives_a_handed_over_grant_to_the_next() {
    let (holder, me, next) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    let queue = vec![(me, 1, NOW + 900), (next, 2, NOW + 900)];
    let d = document(Some((holder, NOW + 5000)), queue.clone());
    let snapshot = Snapshot::read(&d, now()).unwrap();
    assert!(snapshot.leave(OwnerId::random()).is_none(), "not queued");
    let plan = snapshot.leave(me).unwrap();
    assert_eq!(plan.outcome, Outcome::Left);
    assert_eq!(queued_after(&plan.update), Some(vec![next.to_string()]));
    assert!(
        !plan.update.contains_key("$inc")
            || !plan
                .update
                .get_document("$inc")
                .unwrap()
                .contains_key("fence")
    );
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
fn a_write_is_conditioned_on_the_document_as_read() {
    let d = document(None, vec![]);
    let filter = Snapshot::read(&d, now()).unwrap().unchanged();
    assert_eq!(
        filter,
        doc! { "_id": "k", "kind": { "$exists": false }, "owner": Bson::Null,
        "fence": 5_i64, "base": 100_i64, "qseq": 9_i64 }
    );
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
