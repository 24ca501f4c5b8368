//! `shoal cluster`: list the brokers, drain one before a planned stop (RocketMQ's
//! `wipeWritePerm` through the name servers, then wait until its queues are consumed), undo a
//! drain.

use crate::admin_cmd::Common;
use crate::table::Table;
use anyhow::bail;
use clap::Subcommand;
use serde_json::json;
use shoal_client::admin::{DrainStatus, PermChange};
use std::time::{Duration, Instant};

/// `shoal cluster ...`
#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCmd {
    /// List clusters, brokers and their addresses.
    List,
    /// Drain a broker before stopping it: the name servers serve its queues read-only
    /// (producers send to the other brokers at once: Shoal clients are told, official
    /// clients see it at their next route poll), then wait until every consumer group with
    /// members online has consumed its queues there (lag 0), and say so.
    Drain {
        /// Broker name (as `shoal cluster list` shows it).
        broker: String,
        /// Only stop writes; do not wait for the consumers.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting after this many seconds (exit status 1; the broker stays
        /// read-only).
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        timeout: u64,
    },
    /// The HA controller's view of the replicated broker groups: members, master, epochs,
    /// in-sync set (as the voter asked has applied them), and which voter leads.
    Status {
        /// A controller voter's address.
        #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:9878")]
        controller: String,
    },
    /// An operator's switch-over of a replicated group (CONTROLLER_ELECT_MASTER): the
    /// controller fences the master's lease, waits until it has certainly expired, then
    /// elects BROKER (or the best in-sync replica) and answers.
    Elect {
        /// The broker group.
        group: String,
        /// The broker id to make master; the best in-sync replica when absent.
        #[arg(long)]
        broker: Option<u64>,
        /// A controller voter's address (the leader is found from it).
        #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:9878")]
        controller: String,
        /// Give up waiting for the answer after this many seconds (exit status 1; the
        /// switch-over may still complete). Above the voters' `elect_timeout_ms` (30 s by
        /// default), which answers SYSTEM_BUSY when the election cannot be made.
        #[arg(long, value_name = "SECONDS", default_value_t = 35)]
        timeout: u64,
    },
    /// Undo a drain: producers may send to the broker again (RocketMQ's `addWritePerm`). A
    /// drained broker that restarts registers writable anyway.
    Undrain {
        /// Broker name.
        broker: String,
    },
}

/// `shoal cluster`.
pub(crate) async fn run(common: &Common, cmd: ClusterCmd) -> anyhow::Result<()> {
    match cmd {
        ClusterCmd::List => list(common).await,
        ClusterCmd::Drain {
            broker,
            no_wait,
            timeout,
        } => drain(common, &broker, !no_wait, Duration::from_secs(timeout)).await,
        ClusterCmd::Undrain { broker } => undrain(common, &broker).await,
        ClusterCmd::Elect {
            group,
            broker,
            controller,
            timeout,
        } => {
            crate::controller::elect_cmd(
                &controller,
                &group,
                broker,
                Duration::from_secs(timeout),
                common.json,
            )
            .await
        }
        ClusterCmd::Status { controller } => {
            crate::controller::status_cmd(&controller, common.json).await
        }
    }
}

async fn list(common: &Common) -> anyhow::Result<()> {
    let admin = common.admin()?;
    let info = admin.cluster_info().await?;
    if common.json {
        println!("{}", serde_json::to_string(&info)?);
    } else {
        let mut t = Table::new(&["CLUSTER", "BROKER", "ID", "ADDRESS"]);
        for (cluster, names) in &info.cluster_addr_table {
            for name in names {
                if let Some(b) = info.broker_addr_table.get(name) {
                    for (id, addr) in &b.broker_addrs {
                        t.row(vec![
                            cluster.clone(),
                            name.clone(),
                            id.to_string(),
                            addr.clone(),
                        ]);
                    }
                }
            }
        }
        t.print();
    }
    admin.shutdown();
    Ok(())
}

/// The name servers' answers: (JSON rows, topics changed at the first that answered, how many
/// answered). Failures are warned about; none answering is an error.
fn perm_changes(
    changes: Vec<PermChange>,
    json_out: bool,
) -> anyhow::Result<(Vec<serde_json::Value>, i32)> {
    let mut rows = Vec::new();
    let mut topics = None;
    let mut errors = Vec::new();
    for c in changes {
        match c.result {
            Ok(n) => {
                topics.get_or_insert(n);
                rows.push(json!({"namesrv": c.namesrv, "ok": true, "topics": n}));
            }
            Err(e) => {
                if !json_out {
                    eprintln!("warning: name server {}: {e}", c.namesrv);
                }
                rows.push(json!({"namesrv": c.namesrv, "ok": false, "error": e.to_string()}));
                errors.push(e.to_string());
            }
        }
    }
    match topics {
        Some(n) => Ok((rows, n)),
        None => bail!("no name server made the change: {}", errors.join("; ")),
    }
}

fn groups_json(s: &DrainStatus) -> serde_json::Value {
    json!(s
        .groups
        .iter()
        .map(|g| json!({"group": g.group, "members": g.members, "lag": g.lag, "queues": g.queues}))
        .collect::<Vec<_>>())
}

async fn drain(common: &Common, broker: &str, wait: bool, limit: Duration) -> anyhow::Result<()> {
    let admin = common.admin()?;
    let addr = admin.broker_master_addr(broker).await?;
    let (namesrvs, wiped) =
        perm_changes(admin.set_broker_writable(broker, false).await, common.json)?;
    if !common.json {
        println!(
            "{broker} ({addr}): read-only on the name servers ({wiped} topic(s) lost the write permission); producers send to the other brokers now"
        );
    }
    if !wait {
        if common.json {
            println!(
                "{}",
                json!({"broker": broker, "addr": addr, "wipedTopics": wiped, "namesrvs": namesrvs, "waited": false})
            );
        }
        admin.shutdown();
        return Ok(());
    }
    let start = Instant::now();
    // Drained: no lag for the groups with members online, and nothing written to the broker
    // between two looks (a producer with an old route may still send for a while).
    let mut last_written: Option<i64> = None;
    let mut last_lag: Option<i64> = None;
    let status = loop {
        let s = admin.drain_status(broker).await?;
        let lag = s.online_lag();
        if lag == 0 && last_written == Some(s.written) {
            break s;
        }
        if !common.json && last_lag != Some(lag) {
            let waiting: Vec<String> = s
                .groups
                .iter()
                .filter(|g| g.members > 0 && g.lag > 0)
                .map(|g| format!("{} {}", g.group, g.lag))
                .collect();
            println!(
                "waiting: {lag} message(s) left to consume on {broker}{}",
                if waiting.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", waiting.join(", "))
                }
            );
        }
        if start.elapsed() >= limit {
            if common.json {
                println!(
                    "{}",
                    json!({"broker": broker, "addr": addr, "wipedTopics": wiped, "namesrvs": namesrvs,
                           "waited": true, "drained": false, "waitedMs": start.elapsed().as_millis() as u64,
                           "lag": lag, "groups": groups_json(&s)})
                );
            }
            admin.shutdown();
            bail!(
                "{broker} not drained within {}s: {lag} message(s) left for the groups with members online; it stays read-only (shoal cluster undrain {broker} to undo)",
                limit.as_secs()
            );
        }
        last_written = Some(s.written);
        last_lag = Some(lag);
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let waited = start.elapsed();
    if common.json {
        println!(
            "{}",
            json!({"broker": broker, "addr": addr, "wipedTopics": wiped, "namesrvs": namesrvs,
                   "waited": true, "drained": true, "waitedMs": waited.as_millis() as u64,
                   "lag": 0, "groups": groups_json(&status)})
        );
    } else {
        for g in status.groups.iter().filter(|g| g.members == 0 && g.lag > 0) {
            println!(
                "note: group {} has no member online and {} message(s) left on {broker} (not waited for)",
                g.group, g.lag
            );
        }
        println!(
            "{broker} drained in {:.1} s: every group with members online consumed its queues there (lag 0) and nothing new arrives; stop it now (SIGTERM: it unregisters and leaves the routes)",
            waited.as_secs_f64()
        );
    }
    admin.shutdown();
    Ok(())
}

async fn undrain(common: &Common, broker: &str) -> anyhow::Result<()> {
    let admin = common.admin()?;
    let addr = admin.broker_master_addr(broker).await?;
    let (namesrvs, n) = perm_changes(admin.set_broker_writable(broker, true).await, common.json)?;
    if common.json {
        println!(
            "{}",
            json!({"broker": broker, "addr": addr, "restoredTopics": n, "namesrvs": namesrvs})
        );
    } else {
        println!("{broker} ({addr}): writable again ({n} topic(s) got the write permission back)");
    }
    admin.shutdown();
    Ok(())
}
