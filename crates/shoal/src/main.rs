//! The `shoal` command.

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc (see [`alloc`]).
#[global_allocator]
static GLOBAL: alloc::Mimalloc = alloc::Mimalloc;

mod alloc;

mod admin_cmd;
mod bench;
mod client_cmd;
mod cluster_cmd;
mod controller;
mod controller_config;
mod controller_log;
mod dashboard;
mod dev_replicas;
mod group_view;
mod grpc_cmd;
mod http;
mod http_access;
mod http_auth;
mod http_listener;
mod http_state;
mod kafka_bridge;
mod pop_cmd;
mod rebalance;
mod server;
mod table;

/// Shoal: a RocketMQ-compatible message queue with consumer-group rebalancing you can trust.
#[derive(Debug, Parser)]
#[command(name = "shoal", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    common: admin_cmd::Common,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a name server and a broker in one process, for development (auto-create on).
    Dev(server::DevArgs),
    /// Run a name server.
    Namesrv(server::NamesrvArgs),
    /// Run a voter of the HA controller (one voter for development; docs/ha.md).
    Controller(controller::ControllerArgs),
    /// Run a broker (`shoal broker status`: a running broker's counters).
    Broker(server::BrokerArgs),
    /// Send messages (from --body/--size, or one per line of standard input).
    Send(client_cmd::SendArgs),
    /// Consume and print messages until Ctrl-C (or --count).
    Consume(client_cmd::ConsumeArgs),
    /// Create, update, delete, list and inspect topics.
    #[command(subcommand)]
    Topic(admin_cmd::TopicCmd),
    /// Consumer groups: list, progress, connections, reset offsets.
    #[command(subcommand)]
    Group(admin_cmd::GroupCmd),
    /// Brokers and clusters: list, drain a broker before stopping it, undo a drain.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCmd),
    /// Look messages up.
    #[command(subcommand)]
    Message(admin_cmd::MessageCmd),
    /// Dead-letter queues: list and resend.
    #[command(subcommand)]
    Dlq(admin_cmd::DlqCmd),
    /// Rebalance tools: simulate allocation strategies over membership changes.
    #[command(subcommand)]
    Rebalance(rebalance::RebalanceCommand),
    /// Benchmarks: produce, consume, end-to-end latency, rebalance under load.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Print the protocol version Shoal speaks.
    Version,
}

/// The client options (`--namesrv`, `--json`, credentials) are global, but the server processes
/// `shoal namesrv` and `shoal dev` do not take them: there they are hidden from `--help` and
/// refused with a remark instead of being accepted and ignored.
fn without_client_options(cmd: clap::Command) -> clap::Command {
    use clap::{Arg, ArgAction};
    fn refuse(remark: &'static str) -> impl Fn(&str) -> Result<String, String> + Clone {
        move |_: &str| Err(remark.to_string())
    }
    let remark = match cmd.get_name() {
        "namesrv" => "the name server takes no client options (it listens with --listen)",
        "controller" => "the controller takes no client options (it listens with --listen)",
        _ => "shoal dev takes no client options (it runs its own name server: --namesrv-port)",
    };
    let mut cmd = cmd.arg(
        Arg::new("json")
            .long("json")
            .hide(true)
            .action(ArgAction::Set)
            .num_args(0)
            .default_missing_value("true")
            .value_parser(refuse(remark)),
    );
    for (id, long) in [("tls", "tls"), ("tls_insecure", "tls-insecure")] {
        cmd = cmd.arg(
            Arg::new(id)
                .long(long)
                .hide(true)
                .action(ArgAction::Set)
                .num_args(0)
                .default_missing_value("true")
                .value_parser(refuse(remark)),
        );
    }
    for (id, long) in [
        ("namesrv", "namesrv"),
        ("access_key", "access-key"),
        ("secret_key", "secret-key"),
        ("security_token", "security-token"),
        ("credentials_file", "credentials-file"),
        ("tls_ca", "tls-ca"),
        ("tls_server_name", "tls-server-name"),
    ] {
        cmd = cmd.arg(
            Arg::new(id)
                .long(long)
                .hide(true)
                .num_args(1)
                .value_parser(refuse(remark)),
        );
    }
    cmd
}

fn main() {
    let matches = <Cli as clap::CommandFactory>::command()
        .mut_subcommand("namesrv", without_client_options)
        .mut_subcommand("dev", without_client_options)
        .mut_subcommand("controller", without_client_options)
        .get_matches();
    let mut cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // `shoal broker` shares the id `namesrv` with the client commands' global option, whose
    // default would override `namesrv_addrs` of the broker's config file: only a value the
    // user gave (flag or SHOAL_NAMESRV) counts.
    if let Command::Broker(b) = &mut cli.command {
        let given = matches
            .subcommand_matches("broker")
            .and_then(|m| m.value_source("namesrv"))
            .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue);
        if !given {
            b.namesrv = None;
        }
    }
    let tls_options = cli.common.tls || cli.common.tls_ca.is_some() || cli.common.tls_insecure;
    let server = matches!(
        cli.command,
        Command::Namesrv(_) | Command::Dev(_) | Command::Controller(_)
    );
    let plaintext_client = !tls_options && !server;
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        if plaintext_client && closed_without_answer(&e) {
            eprintln!(
                "hint: the server closed the connection without answering; if it requires TLS \
                 (tls-mode enforcing), connect with --tls and --tls-ca FILE (or --tls-insecure)"
            );
        }
        std::process::exit(1);
    }
}

/// Whether a command failed because a server closed its connection (what a plaintext client
/// of a TLS-only server sees: it is closed before anything is read).
fn closed_without_answer(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<shoal_net::NetError>()
            .is_some_and(|n| matches!(n, shoal_net::NetError::ConnectionClosed { .. }))
    }) || format!("{e:#}").contains(" is closed")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let common = cli.common;
    match cli.command {
        Command::Send(a) => return client(client_cmd::send(&common, a)),
        Command::Consume(a) if a.pop => return client_mt("warn", pop_cmd::consume_pop(&common, a)),
        Command::Consume(a) => return client_mt("warn", client_cmd::consume(&common, a)),
        Command::Bench(c) => return client_mt("warn", bench::run(&common, c)),
        Command::Topic(c) => return admin(admin_cmd::topic(&common, c)),
        Command::Group(c) => return admin(admin_cmd::group(&common, c)),
        Command::Cluster(c) => return admin(cluster_cmd::run(&common, c)),
        Command::Message(c) => return admin(admin_cmd::message(&common, c)),
        Command::Dlq(c) => return admin(admin_cmd::dlq(&common, c)),
        Command::Dev(a) => {
            return match a.replicas {
                Some(n) => serve(dev_replicas::run(a, n)),
                None => serve(server::run_dev(a)),
            }
        }
        Command::Namesrv(a) => return serve(server::run_namesrv(a)),
        Command::Controller(a) => {
            return serve(async { controller::run(a, server::shutdown_signal()).await })
        }
        Command::Broker(server::BrokerArgs {
            action: Some(server::BrokerAction::Status { broker, namesrv }),
            ..
        }) => {
            let common = admin_cmd::Common { namesrv, ..common };
            return admin(admin_cmd::broker_status(&common, broker));
        }
        Command::Broker(a) => return serve(server::run_broker(a, common)),
        Command::Rebalance(c) => rebalance::run(c)?,
        Command::Version => {
            if common.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "version": env!("CARGO_PKG_VERSION"),
                        "remotingVersion": shoal_proto::command::CURRENT_VERSION,
                    })
                );
            } else {
                println!(
                    "shoal {} (RocketMQ remoting version {})",
                    env!("CARGO_PKG_VERSION"),
                    shoal_proto::command::CURRENT_VERSION
                );
            }
        }
    }
    Ok(())
}

/// Runs a server command on a multi-threaded runtime with `info` logging (RUST_LOG overrides).
fn serve(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(fut)
}

/// Runs a client command on a small runtime, without log output.
fn client(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(fut)
}

/// Runs a long-lived client command (a consumer) on a multi-threaded runtime, logging what
/// `filter` lets through (warnings; RUST_LOG overrides).
fn client_mt(
    filter: &str,
    fut: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(fut)
}

/// Runs an admin command: like [`client`], and a closed standard output (`| head`) ends the
/// process quietly, as it does for other Unix tools, instead of a panic.
fn admin(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    #[cfg(unix)]
    #[allow(unsafe_code)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread is started; no
    // handler is installed, so no signal-safety rules apply.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    client(fut)
}
