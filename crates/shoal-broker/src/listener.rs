//! What a protocol listener of this broker (the Kafka listener) tells the broker about its
//! groups beyond the broker's group state, so GROUP_DESCRIBE shows them, and where the
//! coordinator's notices to the listener's members go.

use std::sync::Arc;

/// A listener's view of its groups. Both functions are called without any broker lock held;
/// they must not block.
#[derive(Clone)]
pub struct ListenerGroups {
    /// Describes a classic group the listener serves (None when it does not hold it, or is
    /// gone).
    pub describe: Arc<DescribeListenerGroup>,
    /// The hosts of the listener's members of a coordinated group (member id, host as the
    /// listener saw it): the coordinator knows their client ids only.
    pub member_hosts: Arc<ListenerMemberHosts>,
    /// The coordinator asks a member that has no remoting connection (a Kafka
    /// consumer-protocol member) to heartbeat now: (group, member id).
    pub notify_member: Arc<ListenerNotifyMember>,
}

/// The function behind [`ListenerGroups::notify_member`].
pub(crate) type ListenerNotifyMember = dyn Fn(&str, &str) + Send + Sync;

/// The function behind [`ListenerGroups::describe`].
pub type DescribeListenerGroup =
    dyn Fn(&str) -> Option<shoal_group::classic_group::ClassicGroupDescription> + Send + Sync;

/// The function behind [`ListenerGroups::member_hosts`].
pub type ListenerMemberHosts = dyn Fn(&str) -> Vec<(String, String)> + Send + Sync;

impl std::fmt::Debug for ListenerGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListenerGroups")
    }
}
