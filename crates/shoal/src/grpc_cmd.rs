//! Starts the gRPC endpoint for RocketMQ 5 clients next to a broker (`shoal broker
//! --grpc-listen`, `grpc_listen_addr`, on in `shoal dev`), with the broker's listener TLS.

use anyhow::Context;
use shoal_broker::{Broker, BrokerConfig};
use shoal_grpc::{GrpcConfig, GrpcServer};

/// Serves `MessagingService` on `listen` for the broker.
pub(crate) async fn start_grpc(
    broker: &Broker,
    cfg: &BrokerConfig,
    listen: &str,
) -> anyhow::Result<GrpcServer> {
    let tls = cfg.tls.server_tls()?;
    GrpcServer::start(
        broker.api(),
        GrpcConfig {
            listen: listen.to_string(),
            advertised: None,
            tls,
            long_polling: std::time::Duration::from_millis(cfg.grpc_long_polling_ms),
        },
    )
    .await
    .with_context(|| format!("starting the gRPC endpoint on {listen}"))
}
