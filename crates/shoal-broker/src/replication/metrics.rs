//! The replication metrics (`shoal_replication_*`), read from the member's last published
//! view and the task's counters at scrape time.

use super::{Replication, RoleView};
use prometheus_client::encoding::DescriptorEncoder;
use shoal_metrics::{encode_counters, encode_gauges, prometheus_client};
use std::sync::atomic::Ordering;

impl Replication {
    /// Writes the replication metrics of broker `broker`.
    pub(crate) fn encode_metrics(
        &self,
        e: &mut DescriptorEncoder<'_>,
        broker: &str,
    ) -> Result<(), std::fmt::Error> {
        let v = self.view();
        let label = || [("broker", broker.to_string())];
        let (is_master, epoch) = match v.role {
            RoleView::Master { epoch } => (1, epoch),
            RoleView::Replica { epoch, .. } => (0, epoch),
            RoleView::Joining => (0, 0),
        };
        let gauges: [(&str, &str, i64); 8] = [
            (
                "shoal_replication_is_master",
                "1 while this broker is the master of its group (holding a lease or not).",
                is_master,
            ),
            (
                "shoal_replication_master_epoch",
                "The newest master epoch this broker knows.",
                i64::from(epoch),
            ),
            (
                "shoal_replication_in_sync_replicas",
                "Members of the in-sync set, master included (on the master; 0 elsewhere).",
                v.in_sync.len() as i64,
            ),
            (
                "shoal_replication_log_end_offset",
                "Where this broker's commit log ends, as replication knows it.",
                v.log_end as i64,
            ),
            (
                "shoal_replication_confirmed_offset",
                "Every in-sync member has the log up to here; consumers see nothing above it.",
                v.confirmed as i64,
            ),
            (
                "shoal_replication_pending_acks",
                "Sends waiting for the in-sync set's acknowledgement.",
                v.pending_acks as i64,
            ),
            (
                "shoal_replication_coordinator_groups",
                "Coordinated groups of the master's replicated coordinator state this broker \
                 holds (at most [coordinator] max_groups).",
                self.counters.coordinator_groups.load(Ordering::Relaxed) as i64,
            ),
            (
                "shoal_replication_commits_waiting",
                "Queues whose offsets, committed to this broker while a replica, wait for the \
                 master (at most replication.max_pending_commits).",
                self.commits.len() as i64,
            ),
        ];
        for (name, help, value) in gauges {
            encode_gauges(e, name, help, [(label(), value)])?;
        }
        encode_gauges(
            e,
            "shoal_replication_replica_lag_bytes",
            "On the master: bytes of its log each replica has not acknowledged (-1: the replica \
             has not handshaken in this epoch).",
            v.replicas.iter().map(|(id, acked)| {
                (
                    [("broker", broker.to_string()), ("replica", id.to_string())],
                    acked.map_or(-1, |a| v.log_end.saturating_sub(a) as i64),
                )
            }),
        )?;
        let c = &self.counters;
        let counters = [
            (
                "shoal_replication_bytes_shipped",
                "Commit-log bytes shipped to replicas.",
                &c.bytes_shipped,
            ),
            (
                "shoal_replication_bytes_received",
                "Commit-log bytes received from a master and appended.",
                &c.bytes_received,
            ),
            (
                "shoal_replication_batches_shipped",
                "Non-empty batches of commit-log bytes shipped to replicas (bytes shipped over \
                 batches shipped: the mean batch).",
                &c.batches_shipped,
            ),
            (
                "shoal_replication_batches_received",
                "Non-empty batches received from a master and appended.",
                &c.batches_received,
            ),
            (
                "shoal_replication_append_failures",
                "Batches received from a master that this replica could not append (a full \
                 disk, an I/O error); it leaves the in-sync set and tries again after a pause.",
                &c.append_failures,
            ),
            (
                "shoal_replication_truncations",
                "Truncations of this broker's log at a divergence point.",
                &c.truncations,
            ),
            (
                "shoal_replication_log_restarts",
                "Restarts of this broker's log at its master's first offset (the master's \
                 retention had deleted what this replica lacked).",
                &c.log_restarts,
            ),
            (
                "shoal_replication_elections_won",
                "Times this broker became master.",
                &c.became_master,
            ),
            (
                "shoal_replication_writes_refused",
                "Sends refused or failed by replication: not master, lease expired, in-sync set \
                 too small, not acknowledged in time.",
                &c.writes_refused,
            ),
            (
                "shoal_replication_inbox_dropped",
                "Replication messages and controller answers dropped: the member's inbox was full.",
                &c.inbox_dropped,
            ),
            (
                "shoal_replication_coordinator_groups_left_out",
                "Coordinated groups of the master's replicated state not kept: this broker held \
                 [coordinator] max_groups already.",
                &c.coordinator_groups_left_out,
            ),
        ];
        let commits = [
            (
                "shoal_replication_commits_forwarded",
                "Offsets committed to this broker while a replica that its master took.",
                &self.commits.forwarded,
            ),
            (
                "shoal_replication_commits_refused_full",
                "Commits to this replica refused (SYSTEM_BUSY): replication.max_pending_commits \
                 queues waited for the master already.",
                &self.commits.refused_full,
            ),
        ];
        for (name, help, v) in counters.into_iter().chain(commits) {
            encode_counters(e, name, help, [(label(), v.load(Ordering::Relaxed))])?;
        }
        Ok(())
    }
}
