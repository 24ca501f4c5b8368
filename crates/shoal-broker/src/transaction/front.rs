//! Transaction checks routed to a protocol front end's producers (the gRPC endpoint's
//! Telemetry streams) when no remoting producer of the group is connected.

use shoal_proto::message::MessageExt;
use std::sync::Arc;

/// A transaction check due for a producer of a front end: the half message (with its real
/// topic and queue) and the ids an END_TRANSACTION names it by.
#[derive(Debug, Clone)]
pub struct TransactionCheck {
    /// Producer group of the half message.
    pub producer_group: String,
    /// The half message as its producer sent it (real topic and queue).
    pub message: MessageExt,
    /// Commit-log offset of the copy to decide.
    pub commit_log_offset: i64,
    /// Queue offset of the copy in the half topic.
    pub queue_offset: i64,
}

/// Routes a transaction check to a front end's producer; answers `true` when one was asked.
#[derive(Clone)]
pub struct TransactionChecker(Arc<dyn Fn(TransactionCheck) -> bool + Send + Sync>);

impl TransactionChecker {
    /// A checker calling `f`.
    pub fn new(f: impl Fn(TransactionCheck) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    pub(crate) fn ask(&self, check: TransactionCheck) -> bool {
        (self.0)(check)
    }
}

impl std::fmt::Debug for TransactionChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransactionChecker")
    }
}
