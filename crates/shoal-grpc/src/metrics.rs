//! The endpoint's metrics, read at scrape time from its tables (registered in the broker's
//! registry by [`GrpcServer::start`](crate::GrpcServer::start); nothing is reported once the
//! endpoint is gone). Calls are counted by the broker's own handlers (sends, POP, acks).

use crate::renew::Renewals;
use crate::session::Sessions;
use shoal_metrics::prometheus_client::collector::Collector;
use shoal_metrics::prometheus_client::encoding::DescriptorEncoder;
use shoal_metrics::{encode_counters, encode_gauges};
use std::sync::Weak;

/// Reads the endpoint's tables at each scrape.
#[derive(Debug)]
pub(crate) struct GrpcCollector {
    pub(crate) sessions: Weak<Sessions>,
    pub(crate) renewals: Weak<Renewals>,
    pub(crate) stats: Weak<shoal_net::NetStats>,
}

impl Collector for GrpcCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some(s) = self.sessions.upgrade() {
            encode_gauges(
                &mut e,
                "shoal_grpc_telemetry_streams",
                "RocketMQ 5 clients' Telemetry streams open now (bounded by 10,000).",
                [(Vec::<(String, String)>::new(), s.streams() as i64)],
            )?;
        }
        if let Some(r) = self.renewals.upgrade() {
            encode_gauges(
                &mut e,
                "shoal_grpc_auto_renew_receipts",
                "Receipts of push consumers whose leases the endpoint renews now (bounded by 100,000).",
                [(Vec::<(String, String)>::new(), r.len() as i64)],
            )?;
            encode_counters(
                &mut e,
                "shoal_grpc_lease_renewals",
                "Leases renewed for push consumers (auto_renew).",
                [(Vec::<(String, String)>::new(), r.renewed())],
            )?;
            encode_counters(
                &mut e,
                "shoal_grpc_auto_renew_refused",
                "Receipts not renewed because 100,000 were (their leases lapse and the messages come again).",
                [(Vec::<(String, String)>::new(), r.overflowed())],
            )?;
        }
        if let Some(n) = self.stats.upgrade() {
            let s = n.snapshot();
            encode_counters(
                &mut e,
                "shoal_grpc_tls_connections",
                "Connections of the gRPC listener by how they were taken: TLS handshakes done or failed or timed out, plaintext accepted (permissive) or refused (enforcing).",
                [
                    (vec![("outcome".to_string(), "tls".to_string())], s.tls_handshakes),
                    (
                        vec![("outcome".to_string(), "handshake_failed".to_string())],
                        s.tls_handshake_failures,
                    ),
                    (
                        vec![("outcome".to_string(), "handshake_timeout".to_string())],
                        s.tls_handshake_timeouts,
                    ),
                    (
                        vec![("outcome".to_string(), "plaintext".to_string())],
                        s.plaintext_accepted,
                    ),
                    (
                        vec![("outcome".to_string(), "plaintext_refused".to_string())],
                        s.plaintext_refused,
                    ),
                ],
            )?;
        }
        Ok(())
    }
}
