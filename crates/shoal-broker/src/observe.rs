//! The owner of what the broker observes of classic groups: the last pull of every (group,
//! topic, queue) (consume stats, progress, owners) and the rebalance timeline built from
//! membership changes and changes of puller.

use crate::timeline::{ObservedRebalance, Timeline};
use parking_lot::Mutex;

/// Per (group, topic, queue): the last pull (offset and time) for consume stats.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PullMark {
    /// Offset the last pull asked for.
    pub offset: i64,
    /// Wall-clock time of the last pull, ms.
    pub at_ms: i64,
    /// Connection the last pull came on (its member owns the queue now).
    pub conn_id: u64,
}

/// The last pull of each (group, topic, queue).
pub(crate) type PullMarks = foldhash::HashMap<(String, String, i32), PullMark>;

#[derive(Debug, Default)]
struct State {
    marks: PullMarks,
    timeline: Timeline,
}

/// Pull marks and the rebalance timeline, behind one short lock.
#[derive(Debug, Default)]
pub(crate) struct Observer {
    state: Mutex<State>,
}

impl Observer {
    /// A pull of (group, topic, queue): its mark is kept, and a change of puller (a queue
    /// changing hands: rare) goes to the timeline at once.
    pub(crate) fn pulled(&self, group: &str, topic: &str, queue_id: i32, mark: PullMark) {
        let mut s = self.state.lock();
        let prev = s
            .marks
            .insert((group.to_string(), topic.to_string(), queue_id), mark);
        if prev.is_none_or(|p| p.conn_id != mark.conn_id) {
            s.timeline
                .puller_conn(group, topic, queue_id, mark.conn_id, mark.at_ms);
        }
    }

    /// A classic group's members changed (see [`Timeline::membership`]).
    pub(crate) fn membership(
        &self,
        group: &str,
        members: Vec<(u64, String)>,
        subscription_changed: bool,
        now_ms: i64,
    ) {
        self.state
            .lock()
            .timeline
            .membership(group, members, subscription_changed, now_ms);
    }

    /// Closes rebalances that converged or gave up; returns them (for metrics and logs).
    pub(crate) fn tick(&self, now_ms: i64) -> Vec<(String, ObservedRebalance)> {
        self.state.lock().timeline.tick(now_ms)
    }

    /// A group's observed rebalances, oldest first, the open one last.
    pub(crate) fn history(&self, group: &str) -> Vec<ObservedRebalance> {
        self.state.lock().timeline.history(group)
    }

    /// A copy of the pull marks.
    pub(crate) fn marks(&self) -> PullMarks {
        self.state.lock().marks.clone()
    }
}
