//! `shoal namesrv`, `shoal broker` and `shoal dev`: the server processes.

use crate::http::{HttpServer, HttpState};
use crate::kafka_bridge::BrokerBridge;
use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use shoal_broker::{Broker, BrokerConfig, FlushMode};
use shoal_kafka::{KafkaConfig, KafkaFile, KafkaServer};
use shoal_namesrv::{NameServer, NamesrvConfig};
use std::path::PathBuf;
use std::sync::Arc;

/// TLS options of a server's remoting listener.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct TlsServerArgs {
    /// TLS on the remoting listener: disabled, permissive (TLS and plaintext clients) or
    /// enforcing (TLS only), as RocketMQ's `tls.server.mode`; needs --tls-cert and --tls-key.
    #[arg(long, value_name = "MODE")]
    pub tls_mode: Option<shoal_net::TlsMode>,
    /// PEM certificate chain of the listener (leaf first).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the listener (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl TlsServerArgs {
    /// The mode with its files, checked: a mode other than disabled needs both files, and
    /// files need such a mode. `None`: plaintext.
    pub(crate) fn settings(
        &self,
    ) -> anyhow::Result<Option<(shoal_net::TlsMode, PathBuf, PathBuf)>> {
        match (self.tls_mode, &self.tls_cert, &self.tls_key) {
            (None | Some(shoal_net::TlsMode::Disabled), None, None) => Ok(None),
            (None | Some(shoal_net::TlsMode::Disabled), _, _) => {
                bail!("--tls-cert and --tls-key need --tls-mode permissive or enforcing")
            }
            (Some(mode), Some(cert), Some(key)) => Ok(Some((mode, cert.clone(), key.clone()))),
            (Some(mode), _, _) => bail!("--tls-mode {mode} needs --tls-cert and --tls-key"),
        }
    }

    /// The listener's TLS settings (disabled when no mode was given).
    fn server_tls(&self) -> anyhow::Result<shoal_net::ServerTls> {
        Ok(match self.settings()? {
            None => shoal_net::ServerTls::disabled(),
            Some((mode, cert, key)) => shoal_net::ServerTls::from_pem_files(mode, &cert, &key)?,
        })
    }
}

/// Options of `shoal namesrv`.
#[derive(Debug, Args)]
pub(crate) struct NamesrvArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9876")]
    pub listen: String,
    /// HTTP address for Prometheus metrics (`/metrics`); off when absent.
    #[arg(long)]
    pub http_listen: Option<String>,
    /// ACL file (TOML, plain_acl keys; see docs/security.md): route and setting changes
    /// (broker registration included) must then be signed by an admin account.
    #[arg(long)]
    pub acl_file: Option<PathBuf>,
    /// TLS of the listener.
    #[command(flatten)]
    pub tls: TlsServerArgs,
    /// Configuration file (TOML) with a `[net]` table: the listener's transport limits, the
    /// broker's keys (docs/configuration.md); and with --controller a `[controller]` table
    /// (docs/ha.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A controller voter in this process.
    #[command(flatten)]
    pub controller: crate::controller::NamesrvControllerArgs,
}

/// Flush mode on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum FlushArg {
    /// Acknowledge after the write; fsync in the background.
    Async,
    /// Acknowledge after fsync (group commit).
    Sync,
}

/// When a replicated send is acknowledged, on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum AckArg {
    /// After every member of the in-sync set has it.
    InSyncSet,
    /// After the master has it.
    Master,
}

/// Commands about running brokers (`shoal broker status`).
#[derive(Debug, Subcommand)]
pub(crate) enum BrokerAction {
    /// A broker's runtime counters as GET_BROKER_RUNTIME_INFO reports them (messages in and
    /// out, held pulls, commit log offsets, ...), like `mqadmin brokerStatus`.
    Status {
        /// Only this broker (`host:port`); every master broker when absent.
        #[arg(long)]
        broker: Option<String>,
        /// Name server addresses, separated by `;` or `,`.
        #[arg(long, env = "SHOAL_NAMESRV", default_value = "127.0.0.1:9876")]
        namesrv: String,
    },
}

/// Options of `shoal broker`. Flags override the config file; the file overrides defaults.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BrokerArgs {
    /// `shoal broker status`: ask running brokers instead of running one.
    #[command(subcommand)]
    pub action: Option<BrokerAction>,
    /// TOML config file (keys as in docs/configuration.md).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:10911).
    #[arg(long)]
    pub listen: Option<String>,
    /// Name servers, separated by `;` or `,` (default 127.0.0.1:9876).
    #[arg(long, env = "SHOAL_NAMESRV")]
    pub namesrv: Option<String>,
    /// Data directory (default ./shoal-data/broker).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Stop as on SIGTERM once stdin reaches its end: `shoal dev --replicas` starts its
    /// replicas with a pipe as stdin, so they stop with dev even when dev is SIGKILLed.
    #[arg(long, hide = true)]
    pub exit_with_stdin: bool,
    /// Broker name (default broker-a).
    #[arg(long)]
    pub broker_name: Option<String>,
    /// Cluster name (default DefaultCluster).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Flush mode (default async).
    #[arg(long, value_enum)]
    pub flush: Option<FlushArg>,
    /// Retention of commit log segments in hours (default 72).
    #[arg(long)]
    pub retention_hours: Option<u64>,
    /// Largest message body accepted, bytes (default 4194304).
    #[arg(long)]
    pub max_message_bytes: Option<usize>,
    /// Create unknown topics on first send.
    #[arg(long)]
    pub auto_create_topic: bool,
    /// HTTP address for metrics (`/metrics`) and the dashboard, e.g. 127.0.0.1:8090 (config
    /// key `http_listen_addr`; off by default).
    #[arg(long)]
    pub http_listen: Option<String>,
    /// Turn ACL on with this file (TOML, plain_acl keys; see docs/security.md).
    #[arg(long)]
    pub acl_file: Option<PathBuf>,
    /// Also serve RocketMQ 5 clients (gRPC, `rocketmq-client-java` 5.x and the other
    /// `rocketmq-clients`) on this address, e.g. 0.0.0.0:8081 (config key `grpc_listen_addr`;
    /// off by default). TLS as the broker's listener.
    #[arg(long)]
    pub grpc_listen: Option<String>,
    /// Also serve Kafka clients on this address (e.g. 0.0.0.0:9092); off by default.
    #[arg(long)]
    pub kafka_listen: Option<String>,
    /// Replicate: this broker is one member of the broker group `--broker-name`, whose
    /// controller's voters are these, separated by `;` or `,` (config key
    /// `replication.controller_addrs`; see docs/ha.md). It registers as brokerId 0 while
    /// master and as the id the controller gives it while a replica.
    #[arg(long, value_name = "ADDRS")]
    pub controller: Option<String>,
    /// The `host:port` the other brokers of the group reach this one at for replication, if
    /// not its announced address (config key `replication.advertised_addr`).
    #[arg(long, value_name = "ADDR")]
    pub replication_addr: Option<String>,
    /// When a send to a replicated group is acknowledged: after the whole in-sync set has it
    /// (`in-sync-set`, the default) or after the master alone (`master`); config key
    /// `replication.ack`.
    #[arg(long, value_enum)]
    pub ack: Option<AckArg>,
    /// Refuse sends while the in-sync set (the master included) is smaller than this (config
    /// key `replication.min_insync_replicas`, default 1).
    #[arg(long)]
    pub min_insync_replicas: Option<usize>,
    /// `host:port` Kafka clients are told to connect to (default: the Kafka listen address).
    #[arg(long)]
    pub kafka_advertised: Option<String>,
    /// TLS of the listener (overrides `[tls]` mode, cert_path, key_path of the file). The
    /// client options --tls, --tls-ca, --tls-insecure, --tls-server-name set TLS to the name
    /// servers.
    #[command(flatten)]
    pub tls: TlsServerArgs,
}

/// Options of `shoal dev`.
#[derive(Debug, Args)]
pub(crate) struct DevArgs {
    /// Data directory.
    #[arg(long, default_value = "shoal-data")]
    pub data_dir: PathBuf,
    /// Name server port.
    #[arg(long, default_value_t = 9876)]
    pub namesrv_port: u16,
    /// Broker port.
    #[arg(long, default_value_t = 10911)]
    pub broker_port: u16,
    /// Flush mode (default `async`, or the config file's `flush_mode`).
    #[arg(long, value_enum)]
    pub flush: Option<FlushArg>,
    /// TOML file of broker keys (docs/configuration.md), e.g. `mmap_commit_log`; the flags
    /// above and dev's own settings (ports, data directory, auto-create) take precedence.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// HTTP port for metrics (`/metrics`) and the dashboard (0 picks a free port).
    #[arg(long, default_value_t = DEV_HTTP_PORT)]
    pub http_port: u16,
    /// Do not serve HTTP (no metrics endpoint, no dashboard).
    #[arg(long)]
    pub no_http: bool,
    /// Kafka listener port (Kafka clients use bootstrap.servers=127.0.0.1:PORT); default
    /// 9092, and when 9092 is taken dev runs without Kafka (a port given here must bind).
    #[arg(long)]
    pub kafka_port: Option<u16>,
    /// Do not start the Kafka listener.
    #[arg(long)]
    pub no_kafka: bool,
    /// gRPC port for RocketMQ 5 clients (endpoints 127.0.0.1:PORT); default 8081, and when
    /// 8081 is taken dev runs without gRPC (a port given here must bind).
    #[arg(long)]
    pub grpc_port: Option<u16>,
    /// Do not serve RocketMQ 5 clients (gRPC).
    #[arg(long)]
    pub no_grpc: bool,
    /// Run a replicated broker group of this many replicas instead of one broker: the name
    /// server and a one-voter controller in this process, each replica a `shoal broker` child
    /// process on --broker-port, +10, +20, ..., the controller on --namesrv-port + 2 (kill a
    /// replica to watch a failover; docs/ha.md).
    /// Without HTTP, Kafka and gRPC.
    #[arg(long, value_name = "N")]
    pub replicas: Option<usize>,
    /// `host:port` Kafka clients are told to connect to (default 127.0.0.1:<kafka port>).
    #[arg(long)]
    pub kafka_advertised: Option<String>,
    /// TLS of the name server's and the broker's listeners (the broker reaches its name
    /// server over TLS in enforcing mode, without verification: same process, loopback).
    #[command(flatten)]
    pub tls: TlsServerArgs,
}

/// The name server address clients use when given none.
pub(crate) const DEFAULT_NAMESRV: &str = "127.0.0.1:9876";

/// Default HTTP port of `shoal dev`.
pub(crate) const DEV_HTTP_PORT: u16 = 8090;

fn split_addrs(s: &str) -> Vec<String> {
    s.split([';', ','])
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}

/// The broker keys of a TOML config file, or the defaults without one.
fn broker_file(path: Option<&std::path::Path>) -> anyhow::Result<BrokerConfig> {
    let Some(path) = path else {
        return Ok(BrokerConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    BrokerConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))
}

/// Builds the broker configuration from defaults, the file and the flags (`common`: the
/// client options, whose TLS settings apply to the connections to the name servers).
pub(crate) fn broker_config(
    args: &BrokerArgs,
    common: &crate::admin_cmd::Common,
) -> anyhow::Result<BrokerConfig> {
    let mut cfg = broker_file(args.config.as_deref())?;
    if let Some(v) = &args.listen {
        cfg.listen_addr = v.clone();
    }
    if let Some(v) = &args.namesrv {
        let addrs = split_addrs(v);
        if addrs.is_empty() {
            bail!("--namesrv is empty");
        }
        cfg.namesrv_addrs = addrs;
    }
    if let Some(v) = &args.data_dir {
        cfg.data_dir = v.clone();
    }
    if let Some(v) = &args.broker_name {
        cfg.broker_name = v.clone();
    }
    if let Some(v) = &args.cluster {
        cfg.cluster_name = v.clone();
    }
    if let Some(v) = args.flush {
        cfg.flush_mode = match v {
            FlushArg::Async => FlushMode::Async,
            FlushArg::Sync => FlushMode::Sync,
        };
    }
    if let Some(v) = args.retention_hours {
        cfg.retention_hours = v;
    }
    if let Some(v) = args.max_message_bytes {
        cfg.max_message_bytes = v;
    }
    if args.auto_create_topic {
        cfg.auto_create_topic = true;
    }
    if let Some(v) = &args.http_listen {
        cfg.http_listen_addr = Some(v.clone());
    }
    if let Some(v) = &args.grpc_listen {
        cfg.grpc_listen_addr = Some(v.clone());
    }
    if let Some(v) = &args.controller {
        let addrs = split_addrs(v);
        if addrs.is_empty() {
            bail!("--controller is empty");
        }
        cfg.replication.controller_addrs = addrs;
    }
    if let Some(v) = &args.replication_addr {
        cfg.replication.advertised_addr = Some(v.clone());
    }
    if let Some(v) = args.ack {
        cfg.replication.ack = match v {
            AckArg::InSyncSet => shoal_broker::AckSetting::InSyncSet,
            AckArg::Master => shoal_broker::AckSetting::Master,
        };
    }
    if let Some(v) = args.min_insync_replicas {
        cfg.replication.min_insync_replicas = v;
    }
    if let Some(p) = &args.acl_file {
        cfg.acl_enabled = true;
        cfg.acl_file = Some(p.clone());
    }
    if let Some((mode, cert, key)) = args.tls.settings()? {
        cfg.tls.mode = mode;
        cfg.tls.cert_path = Some(cert);
        cfg.tls.key_path = Some(key);
    } else if args.tls.tls_mode == Some(shoal_net::TlsMode::Disabled) {
        cfg.tls.mode = shoal_net::TlsMode::Disabled;
    }
    // Checked (both CA and insecure, a name without TLS) like any client's options.
    if common.client_tls()?.is_some() {
        cfg.tls.namesrv_tls = true;
        cfg.tls.trust_cert_path = common.tls_ca.clone();
        cfg.tls.insecure = common.tls_insecure;
        cfg.tls.server_name = common.tls_server_name.clone();
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Kafka's default port, where `shoal dev` listens unless told otherwise.
const DEFAULT_KAFKA_PORT: u16 = 9092;

/// The `[kafka]` table of a config file (empty without a file); its errors name the file,
/// the line and the key.
fn kafka_file(path: Option<&std::path::Path>) -> anyhow::Result<KafkaFile> {
    #[derive(serde::Deserialize)]
    struct Section {
        #[serde(default)]
        kafka: KafkaFile,
    }
    let Some(path) = path else {
        return Ok(KafkaFile::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let s: Section = toml::from_str(&text)
        .with_context(|| format!("in {}: the [kafka] table", path.display()))?;
    Ok(s.kafka)
}

/// The Kafka listener's settings: `base` (the defaults of the command), then the file's
/// `[kafka]` keys, then the flags `listen` and `advertised`.
fn kafka_config(
    mut base: KafkaConfig,
    file: &KafkaFile,
    path: Option<&std::path::Path>,
    listen: Option<String>,
    advertised: Option<&str>,
) -> anyhow::Result<KafkaConfig> {
    let in_file = || match path {
        Some(p) => format!("in {}: [kafka]", p.display()),
        None => "[kafka]".to_string(),
    };
    file.apply(&mut base).with_context(in_file)?;
    if let Some(l) = listen {
        base.listen_addr = l;
    }
    if let Some(a) = advertised {
        base.set_advertised(a)
            .with_context(|| format!("--kafka-advertised {a:?}"))?;
    }
    base.validate()?;
    Ok(base)
}

/// The Kafka listener of `shoal broker`: on when `--kafka-listen` or the file's
/// `[kafka] listen_addr` says where; Kafka's defaults where the file is silent.
fn broker_kafka_config(args: &BrokerArgs) -> anyhow::Result<Option<KafkaConfig>> {
    let file = kafka_file(args.config.as_deref())?;
    if args.kafka_listen.is_none() && file.listen_addr.is_none() {
        if file != KafkaFile::default() || args.kafka_advertised.is_some() {
            bail!(
                "the Kafka listener is off: give its address with --kafka-listen or [kafka] listen_addr"
            );
        }
        return Ok(None);
    }
    kafka_config(
        KafkaConfig::default(),
        &file,
        args.config.as_deref(),
        args.kafka_listen.clone(),
        args.kafka_advertised.as_deref(),
    )
    .map(Some)
}

/// The Kafka listener of `shoal dev` (none with `--no-kafka`): dev's defaults (127.0.0.1:9092,
/// no initial rebalance delay, 1 s consumer heartbeats) where the file's `[kafka]` table is
/// silent, and `--kafka-port` / `--kafka-advertised` over both. The second value says whether
/// the address was chosen (a flag or the file), so that a failure to bind is an error.
fn dev_kafka_config(args: &DevArgs) -> anyhow::Result<Option<(KafkaConfig, bool)>> {
    if args.no_kafka {
        return Ok(None);
    }
    let file = kafka_file(args.config.as_deref())?;
    let dev = KafkaConfig {
        listen_addr: format!("127.0.0.1:{DEFAULT_KAFKA_PORT}"),
        // Local development: a group's first rebalance does not wait for more members.
        group_initial_rebalance_delay_ms: 0,
        ..KafkaConfig::default()
    };
    let chosen = args.kafka_port.is_some() || file.listen_addr.is_some();
    let cfg = kafka_config(
        dev,
        &file,
        args.config.as_deref(),
        args.kafka_port.map(|p| format!("127.0.0.1:{p}")),
        args.kafka_advertised.as_deref(),
    )?;
    Ok(Some((cfg, chosen)))
}

/// Who may use the HTTP port and its TLS, from the broker's `[http]`, `[tls]` and ACL file.
fn http_access(
    cfg: &BrokerConfig,
) -> anyhow::Result<(crate::http_access::AccessSettings, shoal_net::ServerTls)> {
    let acl = match (&cfg.acl_enabled, &cfg.acl_file) {
        (true, Some(path)) => Some(shoal_broker::load_acl(path)?),
        _ => None,
    };
    let access = crate::http_access::AccessSettings::from_broker(cfg, acl)?;
    let mode = cfg.http.effective_tls_mode(cfg);
    let tls = match (&cfg.tls.cert_path, &cfg.tls.key_path) {
        (Some(cert), Some(key)) if mode != shoal_net::TlsMode::Disabled => {
            shoal_net::ServerTls::from_pem_files(mode, cert, key)
                .context("the HTTP port's TLS ([http] tls_mode, [tls] cert_path and key_path)")?
                .with_handshake_timeout(std::time::Duration::from_millis(
                    cfg.tls.handshake_timeout_ms,
                ))
        }
        _ => shoal_net::ServerTls::disabled(),
    };
    Ok((access, tls))
}

/// `https` when the HTTP port takes TLS connections.
fn http_scheme(tls: &shoal_net::ServerTls) -> &'static str {
    if tls.mode() == shoal_net::TlsMode::Disabled {
        "http"
    } else {
        "https"
    }
}

/// Starts the Kafka listener on a running broker.
async fn start_kafka(broker: &Broker, cfg: KafkaConfig) -> anyhow::Result<KafkaServer> {
    let api = broker.api();
    let bridge = Arc::new(BrokerBridge::new(api.clone()));
    let server = KafkaServer::start(cfg, bridge)
        .await
        .map_err(anyhow::Error::new)?;
    // Registered with the name servers, so every broker's listener can name this one as
    // the leader of this broker group's partitions.
    let (node_id, advertised) = server.advertised();
    api.set_kafka_listener(node_id, advertised);
    // `shoal group describe` shows the listener's classic groups, and the hosts of its
    // KIP-848 members (the coordinator knows their client ids only).
    // Its consumer-protocol members have no remoting connection: the coordinator's notices
    // to them go to the listener, which answers their held heartbeats.
    let groups = shoal_broker::ListenerGroups {
        describe: Arc::new(server.classic_group_describer()),
        member_hosts: Arc::new(server.consumer_group_member_hosts()),
        notify_member: Arc::new(server.consumer_group_notifier()),
    };
    if api.set_listener_groups(groups).is_err() {
        tracing::warn!("a listener's classic groups are already described by this broker");
    }
    // The listener's counters (`shoal_kafka_*`) are served at `/metrics` with the broker's
    // metrics, read at scrape time; only a process that runs the listener has them.
    api.metrics().collector(server.metrics_collector());
    Ok(server)
}

/// Listens for Ctrl-C or SIGTERM from now on (so a signal during start-up is not lost or
/// fatal); the returned future ends when one arrives.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Completes when stdin reaches its end (or cannot be read): the process that holds the other
/// end of its pipe is gone.
fn stdin_closed() -> impl std::future::Future<Output = ()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 256];
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        drop(tx);
    });
    async move {
        let _ = rx.await;
    }
}

/// `shoal namesrv`.
pub(crate) async fn run_namesrv(args: NamesrvArgs) -> anyhow::Result<()> {
    let stop = shutdown_signal();
    let acl = match &args.acl_file {
        Some(p) => Some(shoal_broker::read_acl_config(p)?),
        None => None,
    };
    // The `[controller]` table is the voter's; the rest is the name server's.
    let (file, controller_limits) = match &args.config {
        Some(p) => {
            let (rest, limits) = crate::controller_config::split_namesrv_file(p)?;
            let file = shoal_broker::NamesrvFile::from_toml(&rest).map_err(|e| {
                anyhow::anyhow!("name server configuration {}: {}", p.display(), e.0)
            })?;
            (file, limits)
        }
        None => (shoal_broker::NamesrvFile::default(), None),
    };
    let voter = args.controller.voter(controller_limits)?;
    let tls = args.tls.server_tls()?;
    let mode = tls.mode();
    let ns = NameServer::start(NamesrvConfig {
        listen_addr: args.listen.clone(),
        acl,
        tls,
        net: file.net.net_config(),
        max_route_watches: file.max_route_watches,
        max_route_watches_per_connection: file.max_route_watches_per_connection,
        ..NamesrvConfig::default()
    })
    .await?;
    println!(
        "shoal name server listening on {} (TLS {mode})",
        ns.local_addr()
    );
    let mut voter = match voter {
        Some(opts) => match crate::controller::Voter::start(opts).await {
            Ok(v) => Some(v),
            Err(e) => {
                ns.shutdown().await;
                return Err(e);
            }
        },
        None => None,
    };
    if let Some(v) = &voter {
        println!("{}", v.describe());
    }
    let http = match &args.http_listen {
        Some(addr) => {
            let mut state = HttpState::new(None, Some(ns.processor().clone()), Vec::new());
            if let Some(v) = &voter {
                state = state.with_registry(v.registry());
            }
            let h = HttpServer::start(addr, state).await?;
            println!("metrics at http://{}/metrics", h.local_addr());
            Some(h)
        }
        None => None,
    };
    // A voter that cannot keep its log stops the process (as `shoal controller` does).
    let failed = tokio::select! {
        () = stop => None,
        e = async {
            match &mut voter {
                Some(v) => v.failed().await,
                None => std::future::pending().await,
            }
        } => Some(e),
    };
    if let Some(h) = http {
        h.shutdown().await;
    }
    if let Some(v) = voter {
        v.shutdown().await;
    }
    ns.shutdown().await;
    if let Some(e) = failed {
        return Err(e);
    }
    println!("name server stopped");
    Ok(())
}

/// `shoal broker`.
pub(crate) async fn run_broker(
    args: BrokerArgs,
    common: crate::admin_cmd::Common,
) -> anyhow::Result<()> {
    let signal = shutdown_signal();
    let stdin = args.exit_with_stdin.then(stdin_closed);
    let stop = async move {
        match stdin {
            Some(closed) => tokio::select! {
                () = signal => {}
                () = closed => {}
            },
            None => signal.await,
        }
    };
    let cfg = broker_config(&args, &common)?;
    let kafka_cfg = broker_kafka_config(&args)?;
    let broker = Broker::start(cfg.clone()).await?;
    println!(
        "shoal broker {} listening on {} (TLS {}; data in {}, name servers {}{})",
        cfg.broker_name,
        broker.local_addr(),
        cfg.tls.mode,
        cfg.data_dir.display(),
        cfg.namesrv_addrs.join(";"),
        if cfg.tls.namesrv_tls { " over TLS" } else { "" }
    );
    let http = match &cfg.http_listen_addr {
        Some(addr) => {
            let (access, tls) = http_access(&cfg)?;
            let scheme = http_scheme(&tls);
            let state = HttpState::new(Some(broker.api()), None, cfg.namesrv_addrs.clone())
                .with_namesrv_tls(cfg.tls.namesrv_client_tls()?)
                .with_access(access);
            match HttpServer::start_with_tls(addr, state, tls).await {
                Ok(h) => {
                    println!("metrics and dashboard at {scheme}://{}/", h.local_addr());
                    Some(h)
                }
                Err(e) => {
                    broker.shutdown().await;
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let kafka = match kafka_cfg {
        Some(k) => match start_kafka(&broker, k).await {
            Ok(s) => {
                println!("kafka listener on {}", s.local_addr());
                Some(s)
            }
            Err(e) => {
                if let Some(h) = http {
                    h.shutdown().await;
                }
                broker.shutdown().await;
                return Err(e.context("starting the Kafka listener (try another --kafka-listen)"));
            }
        },
        None => None,
    };
    let grpc = match &cfg.grpc_listen_addr {
        Some(addr) => match crate::grpc_cmd::start_grpc(&broker, &cfg, addr).await {
            Ok(g) => {
                println!("RocketMQ 5 clients (gRPC) on {}", g.local_addr());
                Some(g)
            }
            Err(e) => {
                if let Some(k) = kafka {
                    k.shutdown().await;
                }
                if let Some(h) = http {
                    h.shutdown().await;
                }
                broker.shutdown().await;
                return Err(e);
            }
        },
        None => None,
    };
    stop.await;
    if let Some(g) = grpc {
        g.shutdown().await;
    }
    if let Some(k) = kafka {
        k.shutdown().await;
    }
    if let Some(h) = http {
        h.shutdown().await;
    }
    broker.shutdown().await;
    println!("broker stopped");
    Ok(())
}

/// `shoal dev`: a name server and a broker in one process, auto-create on.
/// The broker configuration of `shoal dev`: the `--config` file's keys (or the defaults), then
/// dev's own settings (its ports, data directory, name server, auto-create, flush and TLS flags).
fn dev_broker_config(
    args: &DevArgs,
    namesrv: &str,
    tls: Option<&(shoal_net::TlsMode, PathBuf, PathBuf)>,
) -> anyhow::Result<BrokerConfig> {
    let mut cfg = broker_file(args.config.as_deref())?;
    cfg.listen_addr = format!("127.0.0.1:{}", args.broker_port);
    cfg.namesrv_addrs = vec![namesrv.to_string()];
    cfg.data_dir = args.data_dir.join("broker");
    cfg.auto_create_topic = true;
    cfg.enable_property_filter = true;
    if let Some(flush) = args.flush {
        cfg.flush_mode = match flush {
            FlushArg::Async => FlushMode::Async,
            FlushArg::Sync => FlushMode::Sync,
        };
    }
    if let Some((mode, cert, key)) = tls {
        let enforcing = *mode == shoal_net::TlsMode::Enforcing;
        cfg.tls = shoal_broker::TlsSettings {
            mode: *mode,
            cert_path: Some(cert.clone()),
            key_path: Some(key.clone()),
            // The name server is in this process, on loopback.
            namesrv_tls: enforcing,
            insecure: enforcing,
            ..shoal_broker::TlsSettings::default()
        };
    }
    cfg.validate()?;
    Ok(cfg)
}

pub(crate) async fn run_dev(args: DevArgs) -> anyhow::Result<()> {
    let stop = shutdown_signal();
    let tls = args.tls.settings()?;
    // Checked before anything starts: a mistake in the file is said at once.
    let kafka_cfg = dev_kafka_config(&args)?;
    let ns = NameServer::start(NamesrvConfig {
        listen_addr: format!("127.0.0.1:{}", args.namesrv_port),
        tls: args.tls.server_tls()?,
        ..NamesrvConfig::default()
    })
    .await
    .context(
        "starting the name server (is another Shoal or RocketMQ running? try --namesrv-port)",
    )?;
    let namesrv = ns.local_addr().to_string();
    let cfg = dev_broker_config(&args, &namesrv, tls.as_ref())?;
    let broker = match Broker::start(cfg.clone()).await {
        Ok(b) => b,
        Err(e) => {
            ns.shutdown().await;
            let hint = match &e {
                shoal_broker::BrokerError::Bind { .. } => {
                    "starting the broker (is another broker on that port? try --broker-port)"
                }
                _ => "starting the broker",
            };
            return Err(anyhow::Error::new(e).context(hint));
        }
    };
    let kafka = match kafka_cfg {
        None => None,
        Some((k, chosen)) => match start_kafka(&broker, k).await {
            Ok(s) => Some(s),
            Err(e) if !chosen => {
                eprintln!("warning: Kafka listener not started ({e:#}); pass --kafka-port to choose a free port, or --no-kafka");
                None
            }
            Err(e) => {
                broker.shutdown().await;
                ns.shutdown().await;
                return Err(e.context(
                    "starting the Kafka listener (try --kafka-port, [kafka] listen_addr or --no-kafka)",
                ));
            }
        },
    };
    let grpc = if args.no_grpc {
        None
    } else {
        let port = args.grpc_port.unwrap_or(shoal_grpc::DEFAULT_PORT);
        match crate::grpc_cmd::start_grpc(&broker, &cfg, &format!("127.0.0.1:{port}")).await {
            Ok(g) => Some(g),
            Err(e) if args.grpc_port.is_none() => {
                eprintln!("warning: gRPC endpoint not started ({e:#}); pass --grpc-port to choose a free port, or --no-grpc");
                None
            }
            Err(e) => {
                if let Some(k) = kafka {
                    k.shutdown().await;
                }
                broker.shutdown().await;
                ns.shutdown().await;
                return Err(e);
            }
        }
    };
    println!("Shoal dev is running (Ctrl-C to stop)");
    println!("  name server  {namesrv}");
    println!(
        "  broker       {} at {}, data in {}",
        cfg.broker_name,
        broker.local_addr(),
        cfg.data_dir.display()
    );
    let http = if args.no_http {
        None
    } else {
        let (access, tls) = http_access(&cfg)?;
        let scheme = http_scheme(&tls);
        let state = HttpState::new(
            Some(broker.api()),
            Some(ns.processor().clone()),
            vec![namesrv.clone()],
        )
        .with_namesrv_tls(cfg.tls.namesrv_client_tls()?)
        .with_access(access);
        match HttpServer::start_with_tls(&format!("127.0.0.1:{}", args.http_port), state, tls).await
        {
            Ok(h) => {
                println!(
                    "  dashboard    {scheme}://{}/ (metrics at /metrics)",
                    h.local_addr()
                );
                Some(h)
            }
            Err(e) => {
                println!("  dashboard    not started: {e:#} (choose another with --http-port)");
                None
            }
        }
    };
    if let Some(k) = &kafka {
        println!("  kafka        {} (bootstrap.servers)", k.local_addr());
    }
    if let Some(g) = &grpc {
        println!(
            "  gRPC         {} (RocketMQ 5 clients' endpoints)",
            g.local_addr()
        );
    }
    if let Some((mode, cert, _)) = &tls {
        println!(
            "  TLS          {mode} (certificate {}); clients: --tls-ca <the CA that signed it>, \
             or --tls-insecure to try it locally",
            cert.display()
        );
    }
    println!("  topics are created on first send");
    // The hints work as printed: with a body (no waiting on standard input), from the first
    // message (a new group starts at the end otherwise), and with --namesrv when the name
    // server is not on the default port.
    let mut ns_flag = if namesrv == DEFAULT_NAMESRV {
        String::new()
    } else {
        format!(" --namesrv {namesrv}")
    };
    if matches!(tls, Some((shoal_net::TlsMode::Enforcing, _, _))) {
        ns_flag.push_str(" --tls-insecure");
    }
    println!("Try it:");
    println!("  shoal send TopicTest --body 'hello {{i}}' --count 3{ns_flag}");
    println!("  shoal consume TopicTest --group demo --from first --count 3{ns_flag}");
    stop.await;
    println!("stopping: flushing offsets and topics, unregistering from the name server");
    if let Some(g) = grpc {
        g.shutdown().await;
    }
    if let Some(k) = kafka {
        k.shutdown().await;
    }
    if let Some(h) = http {
        h.shutdown().await;
    }
    broker.shutdown().await;
    ns.shutdown().await;
    println!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Dev {
        #[command(flatten)]
        args: DevArgs,
    }

    fn dev(args: &[&str]) -> DevArgs {
        Dev::try_parse_from(std::iter::once("dev").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn dev_takes_broker_keys_from_its_config_file_and_keeps_its_own_settings() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("broker.toml");
        std::fs::write(
            &file,
            "mmap_commit_log = true\nflush_mode = \"sync\"\nlisten_addr = \"127.0.0.1:1\"\n\
             auto_create_topic = false\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let cfg = dev_broker_config(
            &dev(&["--config", path, "--broker-port", "4242"]),
            "127.0.0.1:9",
            None,
        )
        .unwrap();
        assert!(cfg.mmap_commit_log);
        assert_eq!(cfg.flush_mode, FlushMode::Sync);
        // dev's own settings win over the file's.
        assert_eq!(cfg.listen_addr, "127.0.0.1:4242");
        assert_eq!(cfg.namesrv_addrs, vec!["127.0.0.1:9".to_string()]);
        assert_eq!(cfg.data_dir, PathBuf::from("shoal-data").join("broker"));
        assert!(cfg.auto_create_topic);
        // A flag beats the file.
        let cfg = dev_broker_config(&dev(&["-c", path, "--flush", "async"]), "n:1", None).unwrap();
        assert_eq!(cfg.flush_mode, FlushMode::Async);
        // Without a file: the broker's defaults, async flush.
        let cfg = dev_broker_config(&dev(&[]), "n:1", None).unwrap();
        assert_eq!(cfg.flush_mode, FlushMode::Async);
        assert_eq!(cfg.mmap_commit_log, BrokerConfig::default().mmap_commit_log);
        // A bad key is an error that names the file.
        std::fs::write(&file, "no_such_key = 1\n").unwrap();
        let err = dev_broker_config(&dev(&["--config", path]), "n:1", None).unwrap_err();
        assert!(format!("{err:#}").contains(path), "{err:#}");
    }

    #[derive(Parser)]
    struct Broker {
        #[command(flatten)]
        args: BrokerArgs,
    }

    fn broker(args: &[&str]) -> BrokerArgs {
        Broker::try_parse_from(std::iter::once("broker").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    /// `[kafka]` of the broker file: read by dev (its defaults only where the file is silent,
    /// its flags over the file) and by broker (Kafka's defaults; the table's listen_addr turns
    /// the listener on), with mistakes named.
    #[test]
    fn the_kafka_table_is_read_by_dev_and_broker() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("broker.toml");
        let path = file.to_str().unwrap();
        // Silent file: dev's defaults.
        std::fs::write(&file, "mmap_commit_log = true\n").unwrap();
        let (k, chosen) = dev_kafka_config(&dev(&["-c", path])).unwrap().unwrap();
        assert_eq!(k.listen_addr, "127.0.0.1:9092");
        assert_eq!(k.group_initial_rebalance_delay_ms, 0);
        assert_eq!(k.consumer_heartbeat_interval_ms, 5_000);
        assert!(!chosen);
        assert!(broker_kafka_config(&broker(&["-c", path]))
            .unwrap()
            .is_none());
        // The file's keys win over dev's defaults; dev's flags over the file.
        std::fs::write(
            &file,
            "[kafka]\nlisten_addr = \"127.0.0.1:19092\"\ngroup_initial_rebalance_delay_ms = 2500\n\
             max_connections = 3\n",
        )
        .unwrap();
        let (k, chosen) = dev_kafka_config(&dev(&["-c", path])).unwrap().unwrap();
        assert_eq!(
            (
                k.listen_addr.as_str(),
                k.group_initial_rebalance_delay_ms,
                k.consumer_heartbeat_interval_ms,
                k.max_connections,
                chosen
            ),
            ("127.0.0.1:19092", 2500, 5_000, 3, true)
        );
        let (k, _) = dev_kafka_config(&dev(&[
            "-c",
            path,
            "--kafka-port",
            "7",
            "--kafka-advertised",
            "h:8",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(k.listen_addr, "127.0.0.1:7");
        assert_eq!(
            (k.advertised_host.as_deref(), k.advertised_port),
            (Some("h"), Some(8))
        );
        assert!(dev_kafka_config(&dev(&["-c", path, "--no-kafka"]))
            .unwrap()
            .is_none());
        // shoal broker: on from the table, Kafka's defaults where it is silent.
        let k = broker_kafka_config(&broker(&["-c", path]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                k.listen_addr.as_str(),
                k.group_initial_rebalance_delay_ms,
                k.consumer_heartbeat_interval_ms
            ),
            ("127.0.0.1:19092", 2500, 5_000)
        );
        let k = broker_kafka_config(&broker(&["-c", path, "--kafka-listen", "127.0.0.1:5"]))
            .unwrap()
            .unwrap();
        assert_eq!(k.listen_addr, "127.0.0.1:5");
        // The broker's own keys still read from the same file.
        broker_file(Some(&file)).unwrap();
        // Settings without an address under shoal broker: said, not ignored.
        std::fs::write(&file, "[kafka]\nmax_connections = 3\n").unwrap();
        let e = broker_kafka_config(&broker(&["-c", path])).unwrap_err();
        assert!(
            format!("{e:#}").contains("the Kafka listener is off"),
            "{e:#}"
        );
        // Mistakes: named with the file, the line and the key.
        for (text, says) in [
            (
                "[kafka]\nmax_conections = 3\n",
                "unknown field `max_conections`",
            ),
            (
                "[kafka]\nmax_connections = 0\n",
                "max_connections must be at least 1",
            ),
            ("[kafka]\nadvertised_addr = \"x\"\n", "advertised_addr"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = format!("{:#}", dev_kafka_config(&dev(&["-c", path])).unwrap_err());
            assert!(e.contains(path) && e.contains(says), "{text}: {e}");
        }
    }
}
