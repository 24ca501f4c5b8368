//! The `shoal` command.

use clap::{Parser, Subcommand};

/// Shoal: a RocketMQ-compatible message queue with consumer-group rebalancing you can trust.
#[derive(Debug, Parser)]
#[command(name = "shoal", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the protocol version Shoal speaks.
    Version,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
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
