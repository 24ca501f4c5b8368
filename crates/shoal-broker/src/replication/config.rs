//! The `[replication]` table of the broker's TOML file: whether the broker is one replica of a
//! replicated group, where its controller is, and when a send is acknowledged.

use crate::config::ConfigError;
use serde::{Deserialize, Serialize};

/// When a send to a replicated group is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AckSetting {
    /// After every member of the in-sync set has the message on disk (RocketMQ's
    /// `allAckInSyncStateSet = true`, Kafka's `acks=all`): no failover loses it.
    #[default]
    InSyncSet,
    /// After the master has it: a failover may lose messages acknowledged in the last moments
    /// before it, which the replica taking over had not received.
    Master,
}

/// Replication of the broker's group (`[replication]`). Off while `controller_addrs` is empty:
/// the broker is then a lone master, as without HA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicationSettings {
    /// The controller's voters (`host:port`); the broker asks them in turn until the leader
    /// answers. Empty: no replication.
    pub controller_addrs: Vec<String>,
    /// The `host:port` the other brokers of the group send replication messages to, as the
    /// broker registers it with the controller. None: the broker's announced address
    /// (`announce_addr`, else its listen address). Set it when the brokers reach each other
    /// at another address than clients do (a separate network, a proxy).
    pub advertised_addr: Option<String>,
    /// The ACL account (an admin `accessKey` of every broker's `acl_file`) this broker signs
    /// its replication messages to the group's other brokers with. Needed with `acl_enabled`,
    /// whose check refuses unsigned ones.
    pub access_key: Option<String>,
    /// That account's secret key.
    pub secret_key: Option<String>,
    /// When a send is acknowledged: `in_sync_set` (default) or `master`.
    pub ack: AckSetting,
    /// Sends are refused (IN_SYNC_REPLICAS_NOT_ENOUGH) while the in-sync set, the master
    /// included, is smaller (RocketMQ's `minInSyncReplicas`, 1).
    pub min_insync_replicas: usize,
    /// Heartbeat to the controller this often, ms (500: four per the controller's default 2 s
    /// session; at most 1000, half of it).
    pub heartbeat_ms: u64,
    /// A controller call without an answer for this long has failed, ms (3000).
    pub call_timeout_ms: u64,
    /// Bytes of one batch shipped to a replica at most (256 KiB).
    pub batch_max_bytes: u64,
    /// Bytes shipped to one replica and not acknowledged at most (4 MiB).
    pub max_inflight_bytes: u64,
    /// Batches shipped to one replica and not acknowledged at most (2): sends arriving while
    /// they are in flight go together in the next batch.
    pub max_inflight_batches: usize,
    /// An in-sync replica behind the master's log end for this long leaves the in-sync set,
    /// ms (RocketMQ's `haMaxTimeSlaveNotCatchup`, 15000).
    pub max_lag_ms: u64,
    /// A send not acknowledged by the in-sync set within this is answered
    /// FLUSH_SLAVE_TIMEOUT, ms (RocketMQ's `syncFlushTimeout`, 5000).
    pub ack_timeout_ms: u64,
    /// Sends waiting for their acknowledgement at most; beyond it SYSTEM_BUSY (65536).
    pub max_pending_acks: usize,
    /// Queues whose offsets, committed to this broker while a replica, wait to be forwarded
    /// to the master at most; a commit for one more is refused with SYSTEM_BUSY (65536).
    pub max_pending_commits: usize,
    /// Messages from the other brokers of the group and the controller's answers waiting for
    /// the replication task at most; beyond it they are dropped (the protocol sends again)
    /// (4096).
    pub inbox_capacity: usize,
}

impl Default for ReplicationSettings {
    fn default() -> Self {
        Self {
            controller_addrs: Vec::new(),
            advertised_addr: None,
            access_key: None,
            secret_key: None,
            ack: AckSetting::InSyncSet,
            min_insync_replicas: 1,
            heartbeat_ms: 500,
            call_timeout_ms: 3_000,
            batch_max_bytes: 256 * 1024,
            max_inflight_bytes: 4 * 1024 * 1024,
            max_inflight_batches: 2,
            max_lag_ms: 15_000,
            ack_timeout_ms: 5_000,
            max_pending_acks: 65_536,
            max_pending_commits: 65_536,
            inbox_capacity: 4_096,
        }
    }
}

impl ReplicationSettings {
    /// Whether the broker replicates (a controller is configured).
    pub fn enabled(&self) -> bool {
        !self.controller_addrs.is_empty()
    }

    /// The account replication messages are signed with, if set.
    pub(crate) fn credentials(&self) -> Option<shoal_proto::acl::SessionCredentials> {
        match (&self.access_key, &self.secret_key) {
            (Some(ak), Some(sk)) => Some(shoal_proto::acl::SessionCredentials::new(
                ak.clone(),
                sk.clone(),
            )),
            _ => None,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        if self.advertised_addr.as_deref().is_some_and(|a| {
            a.rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        }) {
            return Err(ConfigError(
                "replication.advertised_addr must be host:port".into(),
            ));
        }
        if self.access_key.is_some() != self.secret_key.is_some() {
            return Err(ConfigError(
                "replication.access_key and replication.secret_key go together".into(),
            ));
        }
        if self.min_insync_replicas == 0 {
            return Err(ConfigError(
                "replication.min_insync_replicas must be at least 1 (the master)".into(),
            ));
        }
        for (key, v) in [
            ("heartbeat_ms", self.heartbeat_ms),
            ("call_timeout_ms", self.call_timeout_ms),
            ("batch_max_bytes", self.batch_max_bytes),
            ("max_inflight_bytes", self.max_inflight_bytes),
            ("max_inflight_batches", self.max_inflight_batches as u64),
            ("max_lag_ms", self.max_lag_ms),
            ("ack_timeout_ms", self.ack_timeout_ms),
            ("max_pending_acks", self.max_pending_acks as u64),
            ("max_pending_commits", self.max_pending_commits as u64),
            ("inbox_capacity", self.inbox_capacity as u64),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("replication.{key} must be positive")));
            }
        }
        if self.max_inflight_bytes < self.batch_max_bytes {
            return Err(ConfigError(
                "replication.max_inflight_bytes must be at least replication.batch_max_bytes"
                    .into(),
            ));
        }
        if self.heartbeat_ms > 1_000 {
            return Err(ConfigError(
                "replication.heartbeat_ms must be at most 1000, half the controller's default \
                 2000 ms session"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertised_address_is_host_and_port() {
        let with = |addr: &str| ReplicationSettings {
            controller_addrs: vec!["127.0.0.1:9878".into()],
            advertised_addr: Some(addr.into()),
            ..ReplicationSettings::default()
        };
        assert!(with("10.0.0.1:10912").validate().is_ok());
        assert!(with("broker-a-1.internal:10912").validate().is_ok());
        for bad in ["10.0.0.1", ":10912", "10.0.0.1:port", ""] {
            assert!(with(bad).validate().is_err(), "{bad:?}");
        }
    }
}
