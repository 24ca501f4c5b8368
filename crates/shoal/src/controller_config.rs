//! The limits of a controller voter (what brokers and operators can make it hold) as
//! configuration: the `[controller]` keys of a TOML file (`shoal controller --config FILE`, or
//! the name server's `--config` with `--controller`), each overridden by a flag of
//! `shoal controller`; and the voter's Prometheus metrics.

use anyhow::{bail, Context};
use clap::Args;
use serde::{Deserialize, Serialize};
use shoal_ha::controller::{ControllerConfig, MetadataLimits};
use shoal_ha::LeaseTiming;
use shoal_metrics::prometheus_client::metrics::counter::Counter;
use shoal_metrics::prometheus_client::metrics::family::Family;
use shoal_metrics::prometheus_client::metrics::gauge::Gauge;
use shoal_metrics::Metrics;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Raft's heartbeat interval in ticks (the election timeout, `election_ticks`, must exceed it).
const HEARTBEAT_TICKS: usize = 2;

/// A voter's limits and timing. Every one bounds something a client can make the voter hold; over it a
/// request is answered SYSTEM_BUSY (or CONTROLLER_INVALID_REQUEST for the metadata limits) and
/// counted in `shoal_controller_requests_refused_busy_total` or refused by the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ControllerLimits {
    /// Inputs (requests, Raft messages from other voters) queued for the voter's task at most;
    /// a request over it is answered SYSTEM_BUSY, a Raft message dropped (Raft sends again).
    pub max_inbox: usize,
    /// Requests waiting for their answer (their log entry to apply) at most.
    pub max_waiting_requests: usize,
    /// Proposals in the log and not applied yet, at most (the voter's own bound).
    pub max_pending_proposals: usize,
    /// Raft messages queued for one peer at most (a full queue drops: Raft sends again).
    pub max_peer_queue: usize,
    /// A request not answered within this many milliseconds is answered SYSTEM_BUSY.
    pub answer_timeout_ms: u64,
    /// A switch-over (CONTROLLER_ELECT_MASTER) waits for the master's lease to expire: it is
    /// answered SYSTEM_BUSY after this many milliseconds.
    pub elect_timeout_ms: u64,
    /// Broker groups at most (proposed by the leader: the leader's value holds everywhere).
    pub max_groups: usize,
    /// Members of one group at most (the leader's value holds everywhere).
    pub max_members: usize,
    /// Bytes of a group name, an address or a token at most (the leader's value holds
    /// everywhere).
    pub max_text_len: usize,
    /// The log is compacted (a snapshot replaces the applied entries) every this many entries.
    pub compact_every: u64,
    /// A master may acknowledge writes for this long after it asked for its lease, ms (1000).
    pub lease_ms: u64,
    /// The leader elects another master only this long after it last saw a lease granted, ms
    /// (1200; must exceed the lease by the clock drift bound, see `LeaseTiming`).
    pub election_delay_ms: u64,
    /// A broker not heard from (heartbeat or lease renewal) for this long is dead, ms (2000).
    pub session_timeout_ms: u64,
    /// One Raft tick, ms (100).
    pub tick_ms: u64,
    /// Raft's election timeout in ticks (10; at least 3, above the heartbeat's 2 ticks).
    pub election_ticks: usize,
}

impl Default for ControllerLimits {
    fn default() -> Self {
        let m = MetadataLimits::default();
        Self {
            max_inbox: 4_096,
            max_waiting_requests: 4_096,
            max_pending_proposals: 1_024,
            max_peer_queue: 1_024,
            answer_timeout_ms: 5_000,
            elect_timeout_ms: 30_000,
            max_groups: m.max_groups,
            max_members: m.max_members,
            max_text_len: m.max_text_len,
            compact_every: 1_000,
            lease_ms: 1_000,
            election_delay_ms: 1_200,
            session_timeout_ms: 2_000,
            tick_ms: 100,
            election_ticks: 10,
        }
    }
}

/// A configuration file's controller keys: the `[controller]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ControllerFile {
    controller: ControllerLimits,
}

impl ControllerLimits {
    /// The `[controller]` table of a TOML document (the defaults without one); other tables
    /// and keys are left to their owner.
    pub(crate) fn from_toml(text: &str) -> anyhow::Result<Self> {
        let f: ControllerFile = toml::from_str(text).context("[controller]")?;
        f.controller.validate()?;
        Ok(f.controller)
    }

    /// The `[controller]` table of a TOML file; the error names the file.
    pub(crate) fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::from_toml(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Every limit is at least 1.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        let values = [
            ("max_inbox", self.max_inbox as u64),
            ("max_waiting_requests", self.max_waiting_requests as u64),
            ("max_pending_proposals", self.max_pending_proposals as u64),
            ("max_peer_queue", self.max_peer_queue as u64),
            ("answer_timeout_ms", self.answer_timeout_ms),
            ("elect_timeout_ms", self.elect_timeout_ms),
            ("max_groups", self.max_groups as u64),
            ("max_members", self.max_members as u64),
            ("max_text_len", self.max_text_len as u64),
            ("compact_every", self.compact_every),
            ("session_timeout_ms", self.session_timeout_ms),
            ("tick_ms", self.tick_ms),
        ];
        for (key, v) in values {
            if v == 0 {
                bail!("controller key {key} must be at least 1");
            }
        }
        if self.election_ticks <= HEARTBEAT_TICKS {
            bail!(
                "controller key election_ticks must be above the Raft heartbeat's \
                 {HEARTBEAT_TICKS} ticks"
            );
        }
        self.lease()?;
        Ok(())
    }

    /// The lease and election delay, checked against the clock drift bound.
    fn lease(&self) -> anyhow::Result<LeaseTiming> {
        LeaseTiming::new(self.lease_ms, self.election_delay_ms)
            .context("controller keys lease_ms and election_delay_ms")
    }

    /// The voter's own configuration with these limits.
    pub(crate) fn apply_to(&self, cfg: &mut ControllerConfig) -> anyhow::Result<()> {
        cfg.lease = self.lease()?;
        cfg.session_timeout_ms = self.session_timeout_ms;
        cfg.tick_ms = self.tick_ms;
        cfg.election_ticks = self.election_ticks;
        cfg.heartbeat_ticks = HEARTBEAT_TICKS;
        cfg.max_pending = self.max_pending_proposals;
        cfg.compact_every = self.compact_every;
        cfg.limits = MetadataLimits {
            max_groups: self.max_groups,
            max_members: self.max_members,
            max_text_len: self.max_text_len,
        };
        Ok(())
    }

    /// How long a request waits for its answer.
    pub(crate) fn answer_timeout(&self) -> Duration {
        Duration::from_millis(self.answer_timeout_ms)
    }

    /// How long a switch-over waits for its answer.
    pub(crate) fn elect_timeout(&self) -> Duration {
        Duration::from_millis(self.elect_timeout_ms)
    }
}

/// A name server's configuration file split in two: the TOML of its own keys, and the
/// `[controller]` table (for `shoal namesrv --controller`), if it has one.
pub(crate) fn split_namesrv_file(
    path: &Path,
) -> anyhow::Result<(String, Option<ControllerLimits>)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))?;
    let limits = match table.remove("controller") {
        Some(v) => {
            let l: ControllerLimits = v
                .try_into()
                .with_context(|| format!("config file {}: [controller]", path.display()))?;
            l.validate()
                .with_context(|| format!("config file {}", path.display()))?;
            Some(l)
        }
        None => None,
    };
    Ok((toml::to_string(&table)?, limits))
}

/// The limits as flags of `shoal controller`; each overrides the `--config` file's key.
#[derive(Debug, Args, Default, Clone)]
pub(crate) struct ControllerLimitArgs {
    /// Inputs queued for the voter at most (config key `max_inbox`).
    #[arg(long)]
    pub max_inbox: Option<usize>,
    /// Requests waiting for their answer at most (`max_waiting_requests`).
    #[arg(long)]
    pub max_waiting_requests: Option<usize>,
    /// Proposals not applied yet at most (`max_pending_proposals`).
    #[arg(long)]
    pub max_pending_proposals: Option<usize>,
    /// Raft messages queued per peer at most (`max_peer_queue`).
    #[arg(long)]
    pub max_peer_queue: Option<usize>,
    /// Milliseconds a request waits for its answer (`answer_timeout_ms`).
    #[arg(long)]
    pub answer_timeout_ms: Option<u64>,
    /// Milliseconds a switch-over waits for its answer (`elect_timeout_ms`).
    #[arg(long)]
    pub elect_timeout_ms: Option<u64>,
    /// Broker groups at most (`max_groups`).
    #[arg(long)]
    pub max_groups: Option<usize>,
    /// Members of a group at most (`max_members`).
    #[arg(long)]
    pub max_members: Option<usize>,
    /// Bytes of a group name, address or token at most (`max_text_len`).
    #[arg(long)]
    pub max_text_len: Option<usize>,
    /// Compact the log every this many entries (`compact_every`).
    #[arg(long)]
    pub compact_every: Option<u64>,
    /// The master's lease, ms (`lease_ms`).
    #[arg(long)]
    pub lease_ms: Option<u64>,
    /// Wait after the last lease grant seen before electing, ms (`election_delay_ms`).
    #[arg(long)]
    pub election_delay_ms: Option<u64>,
    /// A broker not heard from for this long is dead, ms (`session_timeout_ms`).
    #[arg(long)]
    pub session_timeout_ms: Option<u64>,
    /// One Raft tick, ms (`tick_ms`).
    #[arg(long)]
    pub tick_ms: Option<u64>,
    /// Raft's election timeout in ticks (`election_ticks`).
    #[arg(long)]
    pub election_ticks: Option<usize>,
}

impl ControllerLimitArgs {
    /// The file's limits (or the defaults) with the flags given over them, checked.
    pub(crate) fn limits(&self, file: Option<&Path>) -> anyhow::Result<ControllerLimits> {
        let mut l = match file {
            Some(p) => ControllerLimits::read(p)?,
            None => ControllerLimits::default(),
        };
        macro_rules! over {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { l.$f = v; } )* };
        }
        over!(
            max_inbox,
            max_waiting_requests,
            max_pending_proposals,
            max_peer_queue,
            answer_timeout_ms,
            elect_timeout_ms,
            max_groups,
            max_members,
            max_text_len,
            compact_every,
            lease_ms,
            election_delay_ms,
            session_timeout_ms,
            tick_ms,
            election_ticks
        );
        l.validate()?;
        Ok(l)
    }
}

/// Labels of `shoal_controller_requests_refused_busy_total`: which bound refused.
type Reason = Vec<(String, String)>;

/// A voter's metrics (served at `/metrics` of `--http-listen`, and of the name server's HTTP
/// port with `shoal namesrv --controller`).
#[derive(Debug)]
pub(crate) struct ControllerMetrics {
    /// The registry.
    pub registry: Arc<Metrics>,
    refused_busy: Family<Reason, Counter>,
    /// Inputs queued for the voter's task.
    pub inbox_depth: Gauge,
    /// Requests waiting for their answer.
    pub waiting: Gauge,
    /// Raft messages dropped because a peer's queue was full.
    pub peer_dropped: Counter,
    /// The voter's Raft term.
    pub term: Gauge,
    /// 1 while this voter leads.
    pub is_leader: Gauge,
    /// The index of the last log entry applied.
    pub applied_index: Gauge,
    /// Broker groups in the metadata.
    pub groups: Gauge,
    /// Times this voter became leader or stopped leading.
    pub leader_changes: Counter,
    /// Log records written and synced (appends and rewrites).
    pub log_syncs: Counter,
    /// Connections that carried a known broker's requests, open now.
    pub broker_connections: Gauge,
    /// Brokers seen dead because the connection their requests came on closed.
    pub broker_disconnects: Counter,
    /// Notices sent to brokers that their group changed (NOTIFY_BROKER_ROLE_CHANGED).
    pub notices_sent: Counter,
}

impl ControllerMetrics {
    /// A fresh registry with the voter's metrics.
    pub(crate) fn new() -> Self {
        let registry = Arc::new(Metrics::new());
        Self {
            refused_busy: registry.counter_family(
                "shoal_controller_requests_refused_busy",
                "Requests answered SYSTEM_BUSY, by the bound that refused them (inbox, waiting, pending, timeout).",
            ),
            inbox_depth: registry.gauge(
                "shoal_controller_inbox_depth",
                "Inputs (requests, Raft messages) queued for the voter now.",
            ),
            waiting: registry.gauge(
                "shoal_controller_waiting_requests",
                "Requests waiting for their answer now.",
            ),
            peer_dropped: registry.counter(
                "shoal_controller_peer_messages_dropped",
                "Raft messages dropped because a peer's queue was full (Raft sends again).",
            ),
            term: registry.gauge("shoal_controller_term", "The voter's Raft term."),
            is_leader: registry.gauge("shoal_controller_is_leader", "1 while this voter leads."),
            applied_index: registry.gauge(
                "shoal_controller_applied_index",
                "The index of the last log entry the voter applied.",
            ),
            groups: registry.gauge(
                "shoal_controller_groups",
                "Broker groups in the voter's metadata.",
            ),
            leader_changes: registry.counter(
                "shoal_controller_leader_changes",
                "Times this voter became leader or stopped leading.",
            ),
            log_syncs: registry.counter(
                "shoal_controller_log_syncs",
                "Writes of the voter's log synced to disk (appends and rewrites).",
            ),
            broker_connections: registry.gauge(
                "shoal_controller_broker_connections",
                "Open connections that carried a known broker's requests (tracked to see a closed one as the broker's death).",
            ),
            broker_disconnects: registry.counter(
                "shoal_controller_broker_disconnects",
                "Brokers seen dead at once because the connection their requests came on closed.",
            ),
            notices_sent: registry.counter(
                "shoal_controller_notices_sent",
                "Notices sent to brokers that their group changed (an election, a new in-sync set), so that they ask at once rather than at their next heartbeat.",
            ),
            registry,
        }
    }

    /// One request answered SYSTEM_BUSY by `reason`.
    pub(crate) fn refused_busy(&self, reason: &str) {
        self.refused_busy
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_the_controller_table_and_flags_override_them() {
        let l = ControllerLimits::from_toml("[net]\nx = 1\n[controller]\nmax_inbox = 8\n").unwrap();
        assert_eq!(l.max_inbox, 8);
        assert_eq!(l.max_groups, ControllerLimits::default().max_groups);
        assert!(ControllerLimits::from_toml("[controller]\nmax_inboxx = 8\n").is_err());
        assert!(ControllerLimits::from_toml("[controller]\nmax_groups = 0\n").is_err());
        assert_eq!(
            ControllerLimits::from_toml("").unwrap(),
            ControllerLimits::default()
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[controller]\nmax_members = 3\nmax_inbox = 8\n").unwrap();
        let args = ControllerLimitArgs {
            max_inbox: Some(2),
            ..Default::default()
        };
        let l = args.limits(Some(&path)).unwrap();
        assert_eq!((l.max_inbox, l.max_members), (2, 3));
        let mut cfg = ControllerConfig::new(1, vec![1]);
        l.apply_to(&mut cfg).unwrap();
        assert_eq!(cfg.limits.max_members, 3);
        assert_eq!(cfg.lease.election_delay_ms(), l.election_delay_ms);
        assert_eq!(cfg.compact_every, l.compact_every);
    }

    #[test]
    fn an_unsafe_lease_is_refused_with_the_drift_bound() {
        let e = ControllerLimits::from_toml("[controller]\nlease_ms = 2000\n").unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("lease_ms") && text.contains("1%"), "{text}");
        assert!(text.contains("at least 2041 ms"), "{text}");
        let l = ControllerLimits::from_toml(
            "[controller]\nlease_ms = 2000\nelection_delay_ms = 2500\nsession_timeout_ms = 5000\n",
        )
        .unwrap();
        let mut cfg = ControllerConfig::new(1, vec![1]);
        l.apply_to(&mut cfg).unwrap();
        assert_eq!(
            (cfg.lease.lease_ms(), cfg.session_timeout_ms),
            (2_000, 5_000)
        );
        assert!(ControllerLimits::from_toml("[controller]\nelection_ticks = 2\n").is_err());
        let args = ControllerLimitArgs {
            election_delay_ms: Some(900),
            ..Default::default()
        };
        assert!(args.limits(None).is_err());
    }

    #[test]
    fn a_name_servers_file_gives_its_controller_table_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.toml");
        std::fs::write(
            &path,
            "max_route_watches = 5\n[net]\nmax_connections_per_ip = 2\n[controller]\nmax_groups = 7\n",
        )
        .unwrap();
        let (rest, limits) = split_namesrv_file(&path).unwrap();
        assert_eq!(limits.map(|l| l.max_groups), Some(7));
        assert!(!rest.contains("controller") && rest.contains("max_connections_per_ip"));
        std::fs::write(&path, "[controller]\nmax_groupz = 7\n").unwrap();
        assert!(split_namesrv_file(&path).is_err());
        std::fs::write(&path, "max_route_watches = 5\n").unwrap();
        assert!(split_namesrv_file(&path).unwrap().1.is_none());
    }
}
