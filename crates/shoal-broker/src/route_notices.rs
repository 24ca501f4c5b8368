//! Route changes the name servers push to this broker: another broker's queues of a topic the
//! coordinator allocates changed (a broker added, drained, gone; a topic grown there). The
//! queues are fetched again and the group state hears of it at once (the coordinator
//! allocates the new set, classic members are told to rebalance), instead of at the next
//! heartbeat after the route cache expires.

use crate::shared::Shared;
use std::sync::Arc;
use tracing::debug;

/// Runs until the broker stops (its task is aborted).
pub(crate) async fn route_notice_loop(b: Arc<Shared>) {
    loop {
        for topic in b.namesrv.changed_topics().await {
            if b.namesrv.refresh_other_queues(&topic).await {
                debug!(
                    topic,
                    "another broker's queues changed: the groups consuming it rebalance"
                );
                b.topic_changed(&topic);
            }
        }
    }
}
