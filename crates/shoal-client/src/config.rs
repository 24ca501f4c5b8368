//! [`ClientConfig`]: what every producer, consumer and admin client shares: name servers,
//! identity, timers (spec section 7.2; defaults are RocketMQ's, all shortenable for tests).

use crate::error::{ClientError, Result};
use std::time::Duration;

/// Settings of a client instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Name server addresses (`"host:port"`).
    pub namesrv_addrs: Vec<String>,
    /// Instance name; `None` gives RocketMQ's `<pid>#<nanos>` at start, unique per client.
    pub instance_name: Option<String>,
    /// IP put in the client id; `None` finds the local address used to reach the name server.
    pub client_ip: Option<String>,
    /// Route refresh period (`pollNameServerInterval`, 30 s).
    pub poll_namesrv_interval: Duration,
    /// Heartbeat period (`heartbeatBrokerInterval`, 30 s).
    pub heartbeat_interval: Duration,
    /// Consumer offset persistence period (`persistConsumerOffsetInterval`, 5 s).
    pub persist_offset_interval: Duration,
    /// Timeout of control requests: routes, heartbeats, offsets (`mqClientApiTimeout`, 3 s).
    pub rpc_timeout: Duration,
    /// ACL credentials: every request is signed with them (RocketMQ `AclClientRPCHook`).
    pub credentials: Option<shoal_proto::acl::SessionCredentials>,
    /// TLS to the name servers and brokers (RocketMQ `tls.enable`); `None`: plaintext.
    pub tls: Option<shoal_net::ClientTls>,
    /// How request headers are encoded (RocketMQ `rocketmq.serialize.type`): JSON (the
    /// default, as Java's) or ROCKETMQ binary, which Shoal's and Apache RocketMQ's brokers and
    /// name servers decode too and which costs both sides less per request. Codes above 32767
    /// are always sent as JSON (the binary header has no room for them).
    pub serialize_type: shoal_proto::SerializeType,
    /// Sends (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE) to a broker that said it is Shoal's
    /// (GET_BROKER_FEATURES, asked once per broker in the background) carry ROCKETMQ binary headers
    /// whatever [`Self::serialize_type`] says: a Shoal broker reads them with fewer instructions
    /// than JSON (docs/benchmarks.md, "Settings that were measured"). Until a broker's kind is
    /// known, and to any other broker, sends use [`Self::serialize_type`]. On by default.
    pub binary_sends_to_shoal: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            namesrv_addrs: vec![format!(
                "127.0.0.1:{}",
                shoal_proto::constants::DEFAULT_NAMESRV_PORT
            )],
            instance_name: None,
            client_ip: None,
            poll_namesrv_interval: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(30),
            persist_offset_interval: Duration::from_secs(5),
            rpc_timeout: Duration::from_secs(3),
            credentials: None,
            tls: None,
            serialize_type: shoal_proto::SerializeType::Json,
            binary_sends_to_shoal: true,
        }
    }
}

impl ClientConfig {
    /// Settings with the given name server list (`"host:port;host:port"`, as RocketMQ's
    /// `namesrvAddr`; commas accepted too) and RocketMQ's defaults otherwise.
    pub fn new(namesrv_addr: &str) -> Self {
        Self {
            namesrv_addrs: parse_namesrv_addrs(namesrv_addr),
            ..Self::default()
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] naming the bad setting.
    pub fn validate(&self) -> Result<()> {
        if self.namesrv_addrs.is_empty() {
            return Err(ClientError::InvalidArgument(
                "no name server address".to_owned(),
            ));
        }
        for (name, d) in [
            ("poll_namesrv_interval", self.poll_namesrv_interval),
            ("heartbeat_interval", self.heartbeat_interval),
            ("persist_offset_interval", self.persist_offset_interval),
            ("rpc_timeout", self.rpc_timeout),
        ] {
            if d.is_zero() {
                return Err(ClientError::InvalidArgument(format!("{name} is zero")));
            }
        }
        if let Some(n) = &self.instance_name {
            if n.is_empty() || n.contains('@') {
                return Err(ClientError::InvalidArgument(format!(
                    "instance name {n:?} is empty or contains '@'"
                )));
            }
        }
        Ok(())
    }
}

/// Splits a RocketMQ name server list (`;` or `,` separated, blanks ignored).
pub fn parse_namesrv_addrs(list: &str) -> Vec<String> {
    list.split([';', ','])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// RocketMQ's default instance name once a client starts: `<pid>#<nanos>`.
pub fn default_instance_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    // Several clients of one process may start in the same nanosecond on coarse clocks: a
    // process-wide sequence keeps the names apart.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}#{}", std::process::id(), nanos + u128::from(seq))
}

/// The IP a client puts in its id: the local address of a route to `peer` (no packet is sent),
/// else 127.0.0.1.
pub fn local_ip_towards(peer: &str) -> String {
    let found = (|| {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
        sock.connect(peer).ok()?;
        Some(sock.local_addr().ok()?.ip().to_string())
    })();
    found
        .filter(|ip| ip != "0.0.0.0")
        .unwrap_or_else(|| "127.0.0.1".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namesrv_list_and_validation() {
        assert_eq!(
            parse_namesrv_addrs(" a:1; b:2,,c:3 "),
            vec!["a:1", "b:2", "c:3"]
        );
        let c = ClientConfig::new("127.0.0.1:9876");
        assert!(c.validate().is_ok());
        let bad = ClientConfig::new("");
        assert!(bad.validate().is_err());
        let bad = ClientConfig {
            instance_name: Some("a@b".into()),
            ..c.clone()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("instance"));
        let bad = ClientConfig {
            rpc_timeout: Duration::ZERO,
            ..c
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("rpc_timeout"));
    }

    #[test]
    fn instance_names_are_unique_and_ip_is_found() {
        let a = default_instance_name();
        let b = default_instance_name();
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("{}#", std::process::id())));
        assert_eq!(local_ip_towards("127.0.0.1:9876"), "127.0.0.1");
    }
}
