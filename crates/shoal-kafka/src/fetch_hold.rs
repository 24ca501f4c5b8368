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
//! librdkafka runs one more callback), or after `rebalance_fetch_hold_ms`.
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
}

impl FetchHolds {
    /// `member` was just told of a new assignment: fetches of `partitions` (what it held)
    /// wait until `until` or its next group request. Expired holds are dropped here, so the
    /// table holds at most the partitions of members answered in the last hold period.
    pub(crate) fn hold(
        &mut self,
        member: &MemberKey,
        partitions: impl IntoIterator<Item = (String, i32)>,
        now: Instant,
        until: Instant,
    ) {
        self.holds.retain(|_, (_, u)| *u > now);
        for p in partitions {
            self.holds.insert(p, (member.clone(), until));
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
        now: Instant,
        until: Instant,
    ) -> bool {
        let released = self.release(member);
        self.hold(member, partitions, now, until);
        released
    }

    /// `member` sent a group request after its callback: its holds end.
    pub(crate) fn release(&mut self, member: &MemberKey) -> bool {
        let before = self.holds.len();
        self.holds.retain(|_, (m, _)| m != member);
        self.holds.len() != before
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
        h.hold(&key("a"), parts(&[0, 1]), t0, t0 + ms(100));
        h.hold(&key("b"), parts(&[2]), t0, t0 + ms(50));
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
        h.hold(&key("c"), parts(&[5]), t0 + ms(60), t0 + ms(160));
        assert_eq!(h.holds.len(), 1);
        assert!(!h.is_empty());
    }

    #[test]
    fn a_new_assignment_in_the_answer_that_ends_a_hold_holds_again_in_one_step() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut h = FetchHolds::default();
        h.hold(&key("a"), parts(&[4, 6, 12, 14]), t0, t0 + ms(100));
        // Its acknowledging heartbeat is answered with another assignment (14 went, 12 goes
        // next): the fetch of 6 stays held, now until the new hold's end; 14 is free.
        assert!(h.replace(&key("a"), parts(&[4, 6, 12]), t0 + ms(7), t0 + ms(107)));
        assert_eq!(h.wait_for(&parts(&[6]), t0 + ms(7)), Some(ms(100)));
        assert_eq!(h.wait_for(&parts(&[14]), t0 + ms(7)), None);
        // Another member's holds are not touched.
        h.hold(&key("b"), parts(&[1]), t0 + ms(8), t0 + ms(108));
        assert!(!h.replace(&key("c"), parts(&[2]), t0 + ms(9), t0 + ms(109)));
        assert_eq!(h.wait_for(&parts(&[1]), t0 + ms(9)), Some(ms(99)));
    }
}
