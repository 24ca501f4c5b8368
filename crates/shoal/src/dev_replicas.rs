//! `shoal dev --replicas N`: a replicated broker group to try on one machine. This process
//! runs the name server and a one-voter controller; each replica is a `shoal broker` child
//! process of the same binary (so that one can be killed, frozen or restarted to watch a
//! failover), with its data under the dev data directory. Ctrl-C stops them all, and so does
//! this process's death: each replica stops when its stdin, a pipe from this process, closes.

use crate::controller::{Voter, VoterOptions};
use crate::server::{shutdown_signal, DevArgs, DEFAULT_NAMESRV};
use anyhow::{bail, Context};
use shoal_namesrv::{NameServer, NamesrvConfig};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Replicas `shoal dev --replicas` starts at most.
pub(crate) const MAX_DEV_REPLICAS: usize = 5;

/// The broker group's name in a replicated dev cluster.
const GROUP: &str = "broker-a";

struct Replica {
    child: Child,
    addr: String,
}

/// Runs the replicated dev cluster until Ctrl-C.
pub(crate) async fn run(args: DevArgs, replicas: usize) -> anyhow::Result<()> {
    if !(1..=MAX_DEV_REPLICAS).contains(&replicas) {
        bail!("--replicas must be between 1 and {MAX_DEV_REPLICAS}");
    }
    if args.tls.settings()?.is_some() || args.config.is_some() {
        bail!("--replicas runs without --tls and --config; start `shoal broker --controller` yourself for those (docs/ha.md)");
    }
    let stop = shutdown_signal();
    let ns = NameServer::start(NamesrvConfig {
        listen_addr: format!("127.0.0.1:{}", args.namesrv_port),
        ..NamesrvConfig::default()
    })
    .await
    .context(
        "starting the name server (is another Shoal or RocketMQ running? try --namesrv-port)",
    )?;
    let namesrv = ns.local_addr().to_string();
    let voter = Voter::start(VoterOptions {
        // Beside the name server, as `shoal controller`'s default is beside 9876.
        listen: format!("127.0.0.1:{}", args.namesrv_port.saturating_add(2)),
        id: 1,
        peers: Vec::new(),
        data_dir: Some(args.data_dir.join("controller")),
        limits: Default::default(),
    })
    .await
    .context("starting the controller (its port is the name server's + 2)")?;
    let controller = voter.local_addr().to_string();
    let exe = std::env::current_exe().context("finding the shoal binary")?;
    let mut children: Vec<Replica> = Vec::new();
    for i in 0..replicas {
        let addr = format!("127.0.0.1:{}", args.broker_port as usize + 10 * i);
        let dir = args.data_dir.join(format!("replica-{}", i + 1));
        let flush = match args.flush {
            Some(crate::server::FlushArg::Async) => "async",
            _ => "sync",
        };
        let spawned = Command::new(&exe)
            .args(["broker", "--broker-name", GROUP, "--listen", &addr])
            .args(["--namesrv", &namesrv, "--controller", &controller])
            .args(["--flush", flush, "--auto-create-topic"])
            .arg("--data-dir")
            .arg(&dir)
            // Its stdin is a pipe this process holds: when this process is gone, even
            // SIGKILLed, the replica reads its end and stops.
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn();
        match spawned {
            Ok(child) => children.push(Replica { child, addr }),
            Err(e) => {
                stop_all(&mut children);
                voter.shutdown().await;
                ns.shutdown().await;
                return Err(anyhow::Error::new(e).context("starting a replica"));
            }
        }
    }
    println!("Shoal dev is running a replicated broker group (Ctrl-C to stop)");
    println!("  name server  {namesrv}");
    println!(
        "  controller   {controller} (one voter, log in {})",
        args.data_dir.join("controller").display()
    );
    for (i, r) in children.iter().enumerate() {
        println!(
            "  replica {}    {GROUP} at {}, pid {}, data in {}",
            i + 1,
            r.addr,
            r.child.id(),
            args.data_dir.join(format!("replica-{}", i + 1)).display()
        );
    }
    let ns_flag = if namesrv == DEFAULT_NAMESRV {
        String::new()
    } else {
        format!(" --namesrv {namesrv}")
    };
    println!("Try it:");
    println!("  shoal cluster status --controller {controller}");
    println!("  shoal topic create TopicTest --queues 4{ns_flag}");
    println!("  shoal send TopicTest --body 'hello {{i}}' --count 3{ns_flag}");
    println!("  kill -9 <the master's pid>      # a replica takes over");
    println!("  shoal consume TopicTest --group demo --from first --count 3{ns_flag}");
    let mut stop = std::pin::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                for (i, r) in children.iter_mut().enumerate() {
                    if let Ok(Some(status)) = r.child.try_wait() {
                        // Said once: a replica that exited stays down (restart it by hand
                        // with the same flags to watch it rejoin).
                        if r.addr.is_empty() {
                            continue;
                        }
                        println!("  replica {} exited ({status})", i + 1);
                        r.addr.clear();
                    }
                }
            }
        }
    }
    println!("stopping the replicas, the controller and the name server");
    stop_all(&mut children);
    voter.shutdown().await;
    ns.shutdown().await;
    println!("stopped");
    Ok(())
}

/// SIGTERM to every replica still running, SIGKILL to those not gone within 20 s.
fn stop_all(children: &mut [Replica]) {
    for r in children.iter() {
        #[cfg(unix)]
        {
            let _ = Command::new("kill")
                .args(["-TERM", &r.child.id().to_string()])
                .status();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for r in children.iter_mut() {
        while Instant::now() < deadline {
            if matches!(r.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = r.child.kill();
        let _ = r.child.wait();
    }
}
