//! Fetch answers held across a member's rebalance callback.
//!
//! librdkafka pauses every partition it fetches while it hands a new assignment to the
//! application's rebalance callback, and resumes them when the callback returns; if a fetch
//! answer arrives in between, its fetcher sends no new fetch and, nothing waking it, sleeps
//! until its one-second serve cycle ends (the resume does not wake it). Partitions whose owner
//! did not change then stop for up to a second. So when the listener answers a member with a
//! new assignment (a consumer-protocol heartbeat, a classic SyncGroup), fetches of the
//! partitions the member held are answered only after the member's next group request shows
//! it is past its callbacks (the consumer protocol's acknowledging heartbeat; a classic
//! JoinGroup, SyncGroup or LeaveGroup — not its OffsetCommit of what it revoked, after which
//! librdkafka runs one more callback), or its OffsetFetch of partitions the answer newly gave
//! it (librdkafka asks for their committed offsets from the assign call that ends the
//! callback's pause, after resuming), or after `rebalance_fetch_hold_ms` (classic) or
//! `consumer_fetch_hold_ms` (consumer protocol, whose acknowledging heartbeat always comes).
//! The fetch then arrives after the resume and the fetcher carries on.
//!
//! [`FetchHolds`] is the decision, on an explicit clock; the fetch handler waits on it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// (group, member id).
pub(crate) type MemberKey = (String, String);

/// Partitions whose fetch answers wait, by (topic, partition).
#[derive(Debug, Default)]
pub(crate) struct FetchHolds {
    holds: HashMap<(String, i32), (MemberKey, Instant)>,
    /// Partitions newly given to a member whose fetches are held, by (group, topic,
    /// partition): the member's OffsetFetch of one of them ends its holds.
    given: HashMap<(String, String, i32), (String, Instant)>,
}

impl FetchHolds {
    /// `member` was just told of a new assignment that gives it `given`: fetches of
    /// `partitions` (what it held) wait until `until`, its next group request or its
    /// OffsetFetch of a partition of `given`. Expired holds are dropped here, so the tables
    /// hold at most the partitions of members answered in the last hold period.
    pub(crate) fn hold(
        &mut self,
        member: &MemberKey,
        partitions: impl IntoIterator<Item = (String, i32)>,
        given: impl IntoIterator<Item = (String, i32)>,
        now: Instant,
        until: Instant,
    ) {
        self.holds.retain(|_, (_, u)| *u > now);
        self.given.retain(|_, (_, u)| *u > now);
        let mut held = false;
        for p in partitions {
            self.holds.insert(p, (member.clone(), until));
            held = true;
        }
        if !held {
            return;
        }
        for (topic, partition) in given {
            self.given.insert(
                (member.0.clone(), topic, partition),
                (member.1.clone(), until),
            );
        }
    }

    /// `member`, past one callback, was told of another assignment in the same answer: its
    /// holds end and fetches of `partitions` wait again, in one step, so that no fetch slips
    /// out between the two (its answer would arrive while the next callback has the fetcher
    /// paused). Returns whether a hold of `member` ended.
    pub(crate) fn replace(
        &mut self,
        member: &MemberKey,
        partitions: impl IntoIterator<Item = (String, i32)>,
        given: impl IntoIterator<Item = (String, i32)>,
        now: Instant,
        until: Instant,
    ) -> bool {
        let released = self.release(member);
        self.hold(member, partitions, given, now, until);
        released
    }

    /// `member` sent a group request after its callback: its holds end.
    pub(crate) fn release(&mut self, member: &MemberKey) -> bool {
        let before = self.holds.len();
        self.holds.retain(|_, (m, _)| m != member);
        self.given
            .retain(|(g, _, _), (m, _)| g != &member.0 || m != &member.1);
        self.holds.len() != before
    }

    /// `group` asked for the committed offsets of `partitions`: the members to whom the
    /// answers that held their fetches newly gave one of them are past their assign call, and
    /// their holds end. Returns whether a hold ended.
    pub(crate) fn asked(
        &mut self,
        group: &str,
        partitions: &[(String, i32)],
        now: Instant,
    ) -> bool {
        if self.given.is_empty() {
            return false;
        }
        let mut members: Vec<MemberKey> = partitions
            .iter()
            .filter_map(|(t, p)| self.given.get(&(group.to_string(), t.clone(), *p)))
            .filter(|(_, until)| *until > now)
            .map(|(m, _)| (group.to_string(), m.clone()))
            .collect();
        members.sort_unstable();
        members.dedup();
        let mut released = false;
        for m in &members {
            released |= self.release(m);
        }
        released
    }

    /// How long a fetch of `partitions` must still wait at `now` (`None`: not at all).
    pub(crate) fn wait_for(&self, partitions: &[(String, i32)], now: Instant) -> Option<Duration> {
        if self.holds.is_empty() {
            return None;
        }
        partitions
            .iter()
            .filter_map(|p| self.holds.get(p))
            .map(|(_, until)| *until)
            .filter(|until| *until > now)
            .max()
            .map(|until| until - now)
    }

    /// Whether nothing is held (the fetch path's shortcut).
    pub(crate) fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(m: &str) -> MemberKey {
        ("G".to_string(), m.to_string())
    }

    fn parts(ps: &[i32]) -> Vec<(String, i32)> {
        ps.iter().map(|p| ("T".to_string(), *p)).collect()
    }

    #[test]
    fn a_hold_lasts_until_the_member_s_next_request_or_its_end() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut h = FetchHolds::default();
        assert_eq!(h.wait_for(&parts(&[0, 1]), t0), None);
        h.hold(&key("a"), parts(&[0, 1]), parts(&[]), t0, t0 + ms(100));
        h.hold(&key("b"), parts(&[2]), parts(&[]), t0, t0 + ms(50));
        // A fetch of a held partition waits for the latest hold among its partitions.
        assert_eq!(h.wait_for(&parts(&[1, 2]), t0 + ms(10)), Some(ms(90)));
        assert_eq!(h.wait_for(&parts(&[2, 3]), t0 + ms(10)), Some(ms(40)));
        assert_eq!(h.wait_for(&parts(&[3]), t0 + ms(10)), None);
        // a's next group request ends its holds; b's ends by time.
        assert!(h.release(&key("a")));
        assert!(!h.release(&key("a")));
        assert_eq!(h.wait_for(&parts(&[0, 1]), t0 + ms(10)), None);
        assert_eq!(h.wait_for(&parts(&[2]), t0 + ms(50)), None);
        // Expired holds are dropped on the next hold: the table stays small.
        h.hold(
            &key("c"),
            parts(&[5]),
            parts(&[]),
            t0 + ms(60),
            t0 + ms(160),
        );
        assert_eq!(h.holds.len(), 1);
        assert!(!h.is_empty());
    }

    #[test]
    fn a_new_assignment_in_the_answer_that_ends_a_hold_holds_again_in_one_step() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut h = FetchHolds::default();
        h.hold(
            &key("a"),
            parts(&[4, 6, 12, 14]),
            parts(&[]),
            t0,
            t0 + ms(100),
        );
        // Its acknowledging heartbeat is answered with another assignment (14 went, 12 goes
        // next): the fetch of 6 stays held, now until the new hold's end; 14 is free.
        assert!(h.replace(
            &key("a"),
            parts(&[4, 6, 12]),
            parts(&[]),
            t0 + ms(7),
            t0 + ms(107)
        ));
        assert_eq!(h.wait_for(&parts(&[6]), t0 + ms(7)), Some(ms(100)));
        assert_eq!(h.wait_for(&parts(&[14]), t0 + ms(7)), None);
        // Another member's holds are not touched.
        h.hold(&key("b"), parts(&[1]), parts(&[]), t0 + ms(8), t0 + ms(108));
        assert!(!h.replace(&key("c"), parts(&[2]), parts(&[]), t0 + ms(9), t0 + ms(109)));
        assert_eq!(h.wait_for(&parts(&[1]), t0 + ms(9)), Some(ms(99)));
    }

    #[test]
    fn an_offset_fetch_of_a_newly_given_partition_ends_the_member_s_holds() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut h = FetchHolds::default();
        // a kept 0 and 1 and was given 7; b kept 2 and was given 8.
        h.hold(&key("a"), parts(&[0, 1]), parts(&[7]), t0, t0 + ms(100));
        h.hold(&key("b"), parts(&[2]), parts(&[8]), t0, t0 + ms(100));
        // Another group's OffsetFetch, or one of partitions nobody was given, ends nothing.
        assert!(!h.asked("H", &parts(&[7]), t0 + ms(5)));
        assert!(!h.asked("G", &parts(&[0, 9]), t0 + ms(5)));
        // a asks for 7's committed offset: it is past its assign call; b still waits.
        assert!(h.asked("G", &parts(&[7]), t0 + ms(6)));
        assert_eq!(h.wait_for(&parts(&[0, 1]), t0 + ms(6)), None);
        assert_eq!(h.wait_for(&parts(&[2]), t0 + ms(6)), Some(ms(94)));
        // Asked again, nothing is left to end.
        assert!(!h.asked("G", &parts(&[7]), t0 + ms(7)));
        // After its hold's end, b's OffsetFetch ends nothing and the table is emptied.
        assert!(!h.asked("G", &parts(&[8]), t0 + ms(100)));
        h.hold(
            &key("c"),
            parts(&[3]),
            parts(&[]),
            t0 + ms(101),
            t0 + ms(201),
        );
        assert_eq!(h.given.len(), 0);
        // A member that held nothing here is not held, and what it was given is not kept.
        h.hold(
            &key("d"),
            parts(&[]),
            parts(&[9]),
            t0 + ms(102),
            t0 + ms(202),
        );
        assert_eq!(h.given.len(), 0);
    }
}
