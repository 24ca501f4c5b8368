//! The master's tests.

use super::*;
use crate::replication::EpochEntry;

fn master(ack: AckMode, min_in_sync: usize, epochs: EpochCache, log_end: u64) -> Master {
    let cfg = MasterConfig {
        ack,
        min_in_sync,
        batch_max_bytes: 100,
        // Windows of many small batches.
        max_inflight_batches: 64,
        ..MasterConfig::default()
    };
    Master::new(
        cfg,
        "g".into(),
        1,
        3,
        epochs,
        log_end,
        BTreeSet::from([1, 2]),
        4,
        [1, 2, 3],
        0,
    )
    .expect("ordered epochs")
}

/// Grants the lease the master asks for at `now`.
fn grant(m: &mut Master, now: Millis) {
    while let Some(t) = m.poll_transmit(now) {
        if let MasterTransmit::Controller {
            call,
            req: Request::RenewLease { master_epoch, .. },
        } = t
        {
            m.handle_controller_response(
                now,
                call,
                Response::LeaseGranted {
                    master_epoch,
                    lease_ms: 3_000,
                },
            );
        }
    }
}

fn handshake(m: &mut Master, now: Millis, replica: BrokerId, end: u64, epochs: Vec<EpochEntry>) {
    m.handle_message(
        now,
        ToMaster::Handshake {
            replica,
            master_epoch: 3,
            end,
            epochs,
        },
    );
    m.handle_message(
        now,
        ToMaster::Ack {
            replica,
            master_epoch: 3,
            end,
        },
    );
}

#[test]
fn acknowledges_after_the_in_sync_set_and_only_under_lease() {
    let mut m = master(AckMode::InSyncSet, 2, EpochCache::default(), 0);
    assert_eq!(m.check_writable(0), Err(WriteRefusal::LeaseExpired));
    grant(&mut m, 0);
    assert_eq!(m.check_writable(10), Ok(()));
    handshake(&mut m, 10, 2, 0, vec![]);
    m.handle_appended(10, 7, 50);
    assert_eq!(m.poll_ack(), None, "replica 2 has not got it");
    // Replica 3 is not in the set: its ack does not count.
    handshake(&mut m, 11, 3, 0, vec![]);
    m.handle_message(
        12,
        ToMaster::Ack {
            replica: 3,
            master_epoch: 3,
            end: 50,
        },
    );
    assert_eq!(m.poll_ack(), None);
    m.handle_message(
        13,
        ToMaster::Ack {
            replica: 2,
            master_epoch: 3,
            end: 50,
        },
    );
    assert_eq!(
        m.poll_ack(),
        Some(Acked {
            ticket: 7,
            epoch: 3,
            result: Ok(())
        })
    );
    assert_eq!(m.confirmed(), 50);
    // After the lease, nothing is acknowledged, even when replicated.
    m.handle_appended(100, 8, 80);
    m.handle_message(
        3_001,
        ToMaster::Ack {
            replica: 2,
            master_epoch: 3,
            end: 80,
        },
    );
    assert_eq!(m.poll_ack(), None);
    assert_eq!(m.check_writable(3_001), Err(WriteRefusal::LeaseExpired));
    m.handle_timeout(5_200);
    assert_eq!(
        m.poll_ack().map(|a| a.result),
        Some(Err(WriteRefusal::Timeout))
    );
}

#[test]
fn refuses_below_min_in_sync_unless_acknowledged_by_the_master() {
    let mut m = master(AckMode::InSyncSet, 3, EpochCache::default(), 0);
    grant(&mut m, 0);
    assert_eq!(
        m.check_writable(1),
        Err(WriteRefusal::InSyncReplicasNotEnough { have: 2, need: 3 })
    );
    let mut m = master(AckMode::Master, 3, EpochCache::default(), 0);
    grant(&mut m, 0);
    assert_eq!(m.check_writable(1), Ok(()));
    m.handle_appended(1, 1, 10);
    assert_eq!(m.poll_ack().map(|a| a.result), Some(Ok(())));
    assert_eq!(
        m.confirmed(),
        0,
        "visibility still waits for the in-sync set"
    );
}

#[test]
fn batches_never_span_two_epochs() {
    let epochs = EpochCache::from_entries(vec![
        EpochEntry { epoch: 1, start: 0 },
        EpochEntry {
            epoch: 2,
            start: 30,
        },
    ])
    .expect("ordered");
    let mut m = master(AckMode::InSyncSet, 1, epochs, 60);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    let mut batches = Vec::new();
    for now in 1..5 {
        while let Some(t) = m.poll_transmit(now) {
            if let MasterTransmit::Replica {
                msg: ToReplica::Batch(h),
                ..
            } = t
            {
                if h.start < h.end {
                    batches.push((h.batch_epoch, h.start, h.end));
                }
            }
        }
    }
    assert_eq!(batches, vec![(1, 0, 30), (2, 30, 60)]);
}

#[test]
fn a_replica_with_a_newer_epoch_makes_it_step_down() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    grant(&mut m, 0);
    m.handle_appended(1, 5, 10);
    m.handle_message(
        2,
        ToMaster::Ack {
            replica: 2,
            master_epoch: 4,
            end: 0,
        },
    );
    assert_eq!(m.stepped_down(), Some(4));
    assert_eq!(
        m.poll_ack().map(|a| a.result),
        Some(Err(WriteRefusal::NotMaster))
    );
    assert_eq!(m.check_writable(3), Err(WriteRefusal::NotMaster));
}

#[test]
fn a_lagging_replica_joins_only_at_the_confirmed_offset_and_the_start() {
    // The master begins with 40 bytes it may have acknowledged before a restart.
    let mut m = Master::new(
        MasterConfig::default(),
        "g".into(),
        1,
        3,
        EpochCache::default(),
        40,
        BTreeSet::from([1]),
        4,
        [1, 2],
        0,
    )
    .expect("ordered");
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 20, vec![EpochEntry { epoch: 3, start: 0 }]);
    assert!(proposals(&mut m, 2).is_empty(), "20 < 40: not yet");
    m.handle_message(
        3,
        ToMaster::Ack {
            replica: 2,
            master_epoch: 3,
            end: 40,
        },
    );
    assert_eq!(proposals(&mut m, 3), vec![BTreeSet::from([1, 2])]);
}

/// The non-empty batches polled at `now`, as `(replica, start, end)`.
fn shipped(m: &mut Master, now: Millis) -> Vec<(BrokerId, u64, u64)> {
    let mut out = Vec::new();
    while let Some(t) = m.poll_transmit(now) {
        if let MasterTransmit::Replica {
            to,
            msg: ToReplica::Batch(h),
        } = t
        {
            if h.start < h.end {
                out.push((to, h.start, h.end));
            }
        }
    }
    out
}

/// The in-sync sets proposed to the controller among what is polled at `now`.
fn proposals(m: &mut Master, now: Millis) -> Vec<BTreeSet<BrokerId>> {
    let mut p = Vec::new();
    while let Some(t) = m.poll_transmit(now) {
        if let MasterTransmit::Controller {
            req: Request::AlterInSyncSet { in_sync, .. },
            ..
        } = t
        {
            p.push(in_sync);
        }
    }
    p
}

fn ack(m: &mut Master, now: Millis, replica: BrokerId, end: u64) {
    m.handle_message(
        now,
        ToMaster::Ack {
            replica,
            master_epoch: 3,
            end,
        },
    );
}

/// Seed 2 of the simulator once ran out of memory: every ack below what was in flight
/// shipped the window again, and each batch of it brought one more such ack.
#[test]
fn reordered_acks_ship_the_window_again_once_per_point() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    m.handle_appended(2, 1, 500);
    let first: Vec<u64> = shipped(&mut m, 2).iter().map(|b| b.1).collect();
    assert_eq!(first, vec![0, 100, 200, 300, 400]);
    // In-order progress and an ack overtaken by a later one: nothing to ship again.
    ack(&mut m, 3, 2, 200);
    ack(&mut m, 4, 2, 100);
    assert_eq!(shipped(&mut m, 4), vec![]);
    // The same end again (batch 200..300 lost, later ones answered as a gap): ship
    // again from there, once.
    ack(&mut m, 5, 2, 200);
    let again: Vec<u64> = shipped(&mut m, 5).iter().map(|b| b.1).collect();
    assert_eq!(again, vec![200, 300, 400]);
    ack(&mut m, 6, 2, 200);
    ack(&mut m, 6, 2, 200);
    assert_eq!(shipped(&mut m, 6), vec![]);
    // Without progress for resend_ms, the rest is shipped again from the last ack.
    let later = 5 + MasterConfig::default().resend_ms;
    let resent: Vec<u64> = shipped(&mut m, later).iter().map(|b| b.1).collect();
    assert_eq!(resent, vec![200, 300, 400]);
    ack(&mut m, later + 1, 2, 500);
    assert_eq!(shipped(&mut m, later + 1), vec![]);
}

/// A driver that ships whole records moves a batch's end; the next batch starts there.
#[test]
fn the_next_batch_starts_where_the_driver_ended_the_last() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    m.handle_appended(2, 1, 150);
    let first = loop {
        match m.poll_transmit(2) {
            Some(MasterTransmit::Replica {
                msg: ToReplica::Batch(h),
                ..
            }) if h.start < h.end => break (h.start, h.end),
            Some(_) => {}
            None => panic!("no batch shipped"),
        }
    };
    assert_eq!(first, (0, 100));
    // The record boundary was at 80.
    m.handle_shipped(2, 0, 80);
    let rest: Vec<(u64, u64)> = shipped(&mut m, 2).iter().map(|b| (b.1, b.2)).collect();
    assert_eq!(rest, vec![(80, 150)]);
}

#[test]
fn writes_arriving_while_batches_are_in_flight_go_together() {
    let cfg = MasterConfig {
        batch_max_bytes: 1_000,
        max_inflight_batches: 1,
        ..MasterConfig::default()
    };
    let mut m = Master::new(
        cfg,
        "g".into(),
        1,
        3,
        EpochCache::default(),
        0,
        BTreeSet::from([1, 2]),
        4,
        [1, 2],
        0,
    )
    .expect("ordered epochs");
    grant(&mut m, 0);
    handshake(&mut m, 0, 2, 0, vec![]);
    m.handle_appended(1, 1, 10);
    assert_eq!(shipped(&mut m, 1), vec![(2, 0, 10)]);
    // Three more sends while the first batch is in flight: nothing shipped yet.
    for (ticket, end) in [(2, 20), (3, 30), (4, 40)] {
        m.handle_appended(2, ticket, end);
        assert_eq!(shipped(&mut m, 2), vec![]);
    }
    // Its ack lets them go, in one batch.
    ack(&mut m, 3, 2, 10);
    assert_eq!(m.poll_ack().map(|a| a.ticket), Some(1));
    assert_eq!(shipped(&mut m, 3), vec![(2, 10, 40)]);
    ack(&mut m, 4, 2, 40);
    let acked: Vec<u64> = std::iter::from_fn(|| m.poll_ack())
        .map(|a| a.ticket)
        .collect();
    assert_eq!(acked, vec![2, 3, 4]);
    // A batch lost whole is shipped again after `resend_ms` without progress.
    m.handle_appended(5, 5, 50);
    assert_eq!(shipped(&mut m, 5), vec![(2, 40, 50)]);
    m.handle_appended(6, 6, 60);
    assert_eq!(shipped(&mut m, 6), vec![]);
    m.handle_timeout(5 + 1_000);
    assert_eq!(shipped(&mut m, 5 + 1_000), vec![(2, 40, 60)]);
}

#[test]
fn a_new_master_greets_every_member_at_once() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 70);
    let mut greeted = Vec::new();
    while let Some(t) = m.poll_transmit(5) {
        if let MasterTransmit::Replica {
            to,
            msg: ToReplica::Batch(h),
        } = t
        {
            assert_eq!((h.master_epoch, h.start, h.end), (3, 70, 70));
            greeted.push(to);
        }
    }
    assert_eq!(greeted, vec![2, 3]);
    // Then heartbeats at their interval only.
    assert!(shipped(&mut m, 6).is_empty());
    assert!(m.poll_transmit(6).is_none());
}

#[test]
fn an_unreachable_replica_that_writes_wait_for_leaves_the_in_sync_set_at_once() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    // Caught up, nothing waits: unreachable alone changes nothing.
    m.handle_unreachable(2, 2);
    assert!(proposals(&mut m, 2).is_empty());
    // A write waits for it: proposed out at once, well before max_lag_ms.
    m.handle_appended(3, 1, 50);
    m.handle_unreachable(3, 2);
    assert_eq!(proposals(&mut m, 3), vec![BTreeSet::from([1])]);
    assert_eq!(
        m.poll_ack(),
        None,
        "not acknowledged until the controller applies it"
    );
}

/// A replica SIGKILLed with the last batch in flight to it, as a broker traced it: the write
/// that batch carries waits for the replica, and no other write comes (the producer waits for
/// each answer), so nothing more is shipped and no send fails before the heartbeat is due.
/// The driver reports the link's closed connection instead; that hint alone proposes it out,
/// with no time passing. A hint that comes while nothing waits still counts when a write then
/// waits for it.
#[test]
fn a_replica_that_dies_with_a_batch_in_flight_leaves_on_the_hint_alone() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    m.handle_appended(2, 1, 50);
    assert_eq!(shipped(&mut m, 2), vec![(2, 0, 50)]);
    assert!(m.poll_transmit(2).is_none(), "nothing more to send");
    assert!(
        m.poll_timeout() > 2,
        "nothing due before a heartbeat or a renewal"
    );
    m.handle_unreachable(3, 2);
    assert_eq!(proposals(&mut m, 3), vec![BTreeSet::from([1])]);
    assert_eq!(m.poll_ack(), None, "not before the controller applies it");

    // The hint first, while nothing waits; then a write.
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    m.handle_unreachable(2, 2);
    assert!(proposals(&mut m, 2).is_empty(), "caught up: no change");
    m.handle_appended(3, 1, 50);
    assert_eq!(proposals(&mut m, 3), vec![BTreeSet::from([1])]);
}

/// A replica whose disk refused a batch says so: the write that waits for it is proposed out
/// of the in-sync set at once, nothing more is shipped to it, and it is proposed in again only
/// after a handshake and acknowledgements up to the confirmed offset.
#[test]
fn a_replica_that_cannot_append_leaves_the_in_sync_set_at_once() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    m.handle_appended(2, 1, 50);
    assert_eq!(shipped(&mut m, 2), vec![(2, 0, 50)]);
    m.handle_message(
        3,
        ToMaster::CannotAppend {
            replica: 2,
            master_epoch: 3,
            end: 0,
        },
    );
    assert_eq!(proposals(&mut m, 3), vec![BTreeSet::from([1])]);
    m.handle_appended(4, 2, 80);
    assert!(
        shipped(&mut m, 4).is_empty(),
        "nothing shipped before it handshakes again"
    );
}

#[test]
fn a_replica_heard_again_is_no_longer_unreachable() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    m.handle_unreachable(2, 2);
    ack(&mut m, 3, 2, 0);
    m.handle_appended(4, 1, 50);
    assert!(proposals(&mut m, 4).is_empty(), "its ack cleared the hint");
}

/// The `RestartAt` messages among what is polled at `now`: (to, at, for_end).
fn restarts(m: &mut Master, now: Millis) -> Vec<(BrokerId, u64, u64)> {
    let mut out = Vec::new();
    while let Some(t) = m.poll_transmit(now) {
        if let MasterTransmit::Replica {
            to,
            msg: ToReplica::RestartAt { at, for_end, .. },
        } = t
        {
            out.push((to, at, for_end));
        }
    }
    out
}

/// A replica whose log ends (or agrees with ours) only below what retention left us is told
/// to restart its log at our first offset, in answer to its handshake; then shipped from there.
#[test]
fn a_replica_below_the_log_start_is_told_to_restart_its_log_there() {
    let epochs =
        EpochCache::from_entries(vec![EpochEntry { epoch: 2, start: 0 }]).expect("ordered");
    let mut m = master(AckMode::InSyncSet, 1, epochs, 5_000);
    grant(&mut m, 0);
    m.handle_log_start(4_096);
    m.handle_message(
        1,
        ToMaster::Handshake {
            replica: 2,
            master_epoch: 3,
            end: 1_000,
            epochs: vec![],
        },
    );
    assert_eq!(restarts(&mut m, 1), vec![(2, 4_096, 1_000)]);
    // It restarted and acknowledges from there: shipped from our first offset.
    ack(&mut m, 2, 2, 4_096);
    let from: Vec<u64> = shipped(&mut m, 2).iter().map(|b| b.1).collect();
    assert_eq!(from.first(), Some(&4_096));
    // A replica whose log reaches past the start is truncated as before.
    m.handle_message(
        3,
        ToMaster::Handshake {
            replica: 3,
            master_epoch: 3,
            end: 4_500,
            epochs: vec![EpochEntry { epoch: 2, start: 0 }],
        },
    );
    assert_eq!(restarts(&mut m, 3), vec![]);
}

/// Retention deletes what a lagging replica (following, acknowledged) still needs: it is told
/// to restart instead of being shipped bytes that are gone; a lost `RestartAt` is said again
/// after `resend_ms`.
#[test]
fn a_lagging_replica_overtaken_by_retention_restarts_and_a_lost_restart_is_resent() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 300);
    grant(&mut m, 0);
    handshake(&mut m, 1, 2, 0, vec![]);
    let _ = shipped(&mut m, 1);
    ack(&mut m, 2, 2, 100);
    m.handle_log_start(200);
    // What was shipped to it is still in flight: nothing yet.
    m.handle_appended(3, 1, 400);
    assert_eq!(restarts(&mut m, 3), vec![]);
    // No progress for resend_ms: it would be shipped again from 100, which is gone.
    let resend = MasterConfig::default().resend_ms;
    assert_eq!(restarts(&mut m, 3 + resend), vec![(2, 200, 100)]);
    // Lost: the replica answers the heartbeats with its old end, and is told again.
    ack(&mut m, 4 + resend, 2, 100);
    assert_eq!(restarts(&mut m, 4 + 2 * resend), vec![(2, 200, 100)]);
    // It restarted: shipped from 200.
    ack(&mut m, 5 + 2 * resend, 2, 200);
    let from: Vec<u64> = shipped(&mut m, 5 + 2 * resend)
        .iter()
        .map(|b| b.1)
        .collect();
    assert_eq!(from.first(), Some(&200));
}

/// The first renewal was scheduled before the first grant said how long leases last: with a
/// lease no longer than `renew_ms` it would go out only as the lease ends, and the master would
/// lose its lease (and its brokerId 0 in the routes) for the renewal's round trip, a second
/// after every election. The grant moves it to a third of the lease.
#[test]
fn the_lease_is_renewed_within_a_third_of_the_first_grant() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    let mut renewals = Vec::new();
    let mut now = 0;
    while now <= 3_000 {
        if now >= m.poll_timeout() {
            m.handle_timeout(now);
        }
        while let Some(t) = m.poll_transmit(now) {
            if let MasterTransmit::Controller {
                call,
                req: Request::RenewLease { master_epoch, .. },
            } = t
            {
                renewals.push(now);
                // The controller answers 5 ms later.
                m.handle_controller_response(
                    now + 5,
                    call,
                    Response::LeaseGranted {
                        master_epoch,
                        lease_ms: 1_000,
                    },
                );
            }
        }
        if now >= 5 {
            assert!(
                m.holds_lease(now),
                "the lease lapsed at {now}: {renewals:?}"
            );
        }
        now += 1;
    }
    assert!(
        renewals.windows(2).all(|w| w[1] - w[0] <= 334),
        "{renewals:?}"
    );
}

/// The controller's leader dies: no voter grants a renewal until the others have elected a
/// new leader (a Raft election timeout, 1 to 2 s by default, longer than the lease). A renewal
/// that got no grant is asked again `renew_retry_ms` later rather than at the next renewal
/// (a third of the lease later), so the lease lapses for at most that long after a leader is
/// there again.
#[test]
fn a_renewal_no_voter_granted_is_asked_again_soon() {
    let mut m = master(AckMode::InSyncSet, 1, EpochCache::default(), 0);
    let leader_back_at = 1_500;
    let mut renewals = Vec::new();
    let mut now = 0;
    while now <= 3_000 {
        if now >= m.poll_timeout() {
            m.handle_timeout(now);
        }
        while let Some(t) = m.poll_transmit(now) {
            if let MasterTransmit::Controller {
                call,
                req: Request::RenewLease { master_epoch, .. },
            } = t
            {
                renewals.push(now);
                // No leader from 200 ms on: the voters answer NotLeader, the driver reports
                // no answer 5 ms later.
                if (200..leader_back_at).contains(&now) {
                    m.handle_controller_timeout(now + 5, call);
                } else {
                    m.handle_controller_response(
                        now + 5,
                        call,
                        Response::LeaseGranted {
                            master_epoch,
                            lease_ms: 1_000,
                        },
                    );
                }
            }
        }
        now += 1;
    }
    let first_after = renewals.iter().find(|at| **at >= leader_back_at).copied();
    let retry = MasterConfig::default().renew_retry_ms;
    assert!(
        first_after.is_some_and(|at| at <= leader_back_at + retry + 5),
        "{renewals:?}"
    );
    assert!(m.holds_lease(first_after.unwrap_or_default() + 5));
    // While no leader answered, one renewal per retry interval, no more.
    assert!(
        renewals.windows(2).all(|w| w[1] - w[0] >= retry.min(334)),
        "{renewals:?}"
    );
}
