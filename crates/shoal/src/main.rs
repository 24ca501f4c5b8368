//! The `shoal` command.

use clap::{Parser, Subcommand};

mod rebalance;
mod server;

/// Shoal: a RocketMQ-compatible message queue with consumer-group rebalancing you can trust.
#[derive(Debug, Parser)]
#[command(name = "shoal", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a name server and a broker in one process, for development (auto-create on).
    Dev(server::DevArgs),
    /// Run a name server.
    Namesrv(server::NamesrvArgs),
    /// Run a broker.
    Broker(server::BrokerArgs),
    /// Rebalance tools: simulate allocation strategies over membership changes.
    #[command(subcommand)]
    Rebalance(rebalance::RebalanceCommand),
    /// Print the protocol version Shoal speaks.
    Version,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Dev(a) => return serve(server::run_dev(a)),
        Command::Namesrv(a) => return serve(server::run_namesrv(a)),
        Command::Broker(a) => return serve(server::run_broker(a)),
        Command::Rebalance(c) => rebalance::run(c)?,
        Command::Version => {
            println!(
                "shoal {} (RocketMQ remoting version {})",
                env!("CARGO_PKG_VERSION"),
                shoal_proto::command::CURRENT_VERSION
            );
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
