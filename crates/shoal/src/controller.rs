//! `shoal controller`: one voter of the HA controller as a process (also run inside a name
//! server by `shoal namesrv --controller`). The voter's decisions are `shoal_ha`'s
//! [`ControllerNode`]; this module only carries its inputs and outputs.
//!
//! - **One owner.** A single task owns the node. The listener's processor hands it requests
//!   through a bounded channel and waits for the answer on a oneshot; Raft messages from other
//!   voters come through the same channel. Nothing is shared behind a lock.
//! - **Voters** talk remoting too: a Raft message is a oneway `CONTROLLER_RAFT_MESSAGE` (9080)
//!   with the protobuf-encoded message as its body, sent by one task per peer from a bounded
//!   queue (a full queue drops the message: Raft sends again).
//! - **Brokers and operators** use RocketMQ's controller request codes where one exists
//!   (CONTROLLER_APPLY_BROKER_ID, CONTROLLER_REGISTER_BROKER, BROKER_HEARTBEAT,
//!   CONTROLLER_ALTER_SYNC_STATE_SET, CONTROLLER_ELECT_MASTER, CONTROLLER_GET_METADATA_INFO)
//!   and Shoal's `CONTROLLER_RENEW_LEASE` (9081) for the lease. Bodies are Shoal's JSON
//!   (`shoal_ha::controller::Request` and `Response`), not RocketMQ's headers.
//! - **Bounds** are [`ControllerLimits`] (config keys and flags): inputs queued, requests
//!   waiting for their entry to apply, proposals not applied, messages queued per peer, how
//!   long a request waits. Over one, a request is answered SYSTEM_BUSY and counted in
//!   `shoal_controller_requests_refused_busy_total{reason}`.
//!
//! The Raft log ([`ControllerStorage`]) is kept in `--data-dir` (see [`crate::controller_log`]),
//! written and synced before anything that depends on it is sent, and read back at start.
//! Without `--data-dir` it is kept in memory: a restarted voter comes back empty and catches
//! up from the leader.

use crate::controller_config::{ControllerLimitArgs, ControllerLimits, ControllerMetrics};
use crate::controller_log::LogFile;
use anyhow::{bail, Context};
use clap::Args;
use futures::future::BoxFuture;
use serde_json::json;
use shoal_ha::controller::{
    decode_raft_message, encode_raft_message, BrokerConnections, ConnectionId, ControllerConfig,
    ControllerNode, ControllerStorage, GroupNotice, GroupNotices, RaftMessage, Refusal, Request,
    Response,
};
use shoal_net::{
    Connection, NetConfig, NotSupportedProcessor, Processor, RemotingClient, RequestContext,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::ext::request_code as ext;
use shoal_proto::RemotingCommand;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, error, info};

/// Options of `shoal controller`.
#[derive(Debug, Args)]
pub(crate) struct ControllerArgs {
    /// Address to listen on (brokers, operators and the other voters).
    #[arg(long, default_value = "127.0.0.1:9878")]
    pub listen: String,
    /// This voter's id (1, 2, ...).
    #[arg(long, default_value_t = 1)]
    pub id: u64,
    /// Every voter as ID=ADDRESS, comma-separated (this one may be listed too). None: a
    /// single-voter controller, for development.
    #[arg(long, value_delimiter = ',', value_name = "ID=ADDRESS")]
    pub peers: Vec<String>,
    /// Directory for the voter's Raft log (`controller.log`: records appended and synced
    /// before anything that depends on them is sent). None: the log is kept in memory only.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Configuration file (TOML) with a `[controller]` table of limits (docs/ha.md); the
    /// flags below override its keys.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// HTTP address for Prometheus metrics (`/metrics`); off when absent.
    #[arg(long)]
    pub http_listen: Option<String>,
    /// The limits.
    #[command(flatten)]
    pub limits: ControllerLimitArgs,
}

/// The controller options of `shoal namesrv`: a voter in the name server's process, on its
/// own port (the name server's port already answers BROKER_HEARTBEAT for routes).
#[derive(Debug, Args, Default)]
pub(crate) struct NamesrvControllerArgs {
    /// Also run a controller voter in this process (docs/ha.md). Its limits are the
    /// `[controller]` table of `--config`.
    #[arg(long)]
    pub controller: bool,
    /// The voter's address (brokers, operators, other voters); needed with --controller.
    #[arg(long, value_name = "ADDR", requires = "controller")]
    pub controller_listen: Option<String>,
    /// The voter's id (1, 2, ...).
    #[arg(long, default_value_t = 1, value_name = "N", requires = "controller")]
    pub controller_id: u64,
    /// Every voter as ID=ADDRESS (their --controller-listen), comma-separated. None: a single
    /// voter, for development.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "ID=ADDRESS",
        requires = "controller"
    )]
    pub controller_peers: Vec<String>,
    /// Directory for the voter's Raft log; in memory without it.
    #[arg(long, value_name = "DIR", requires = "controller")]
    pub controller_data_dir: Option<PathBuf>,
    /// The master's lease, ms (over the `[controller]` key `lease_ms`; 1000).
    #[arg(long, value_name = "MS", requires = "controller")]
    pub controller_lease_ms: Option<u64>,
    /// Wait after the last lease grant seen before electing, ms (`election_delay_ms`; 1200).
    #[arg(long, value_name = "MS", requires = "controller")]
    pub controller_election_delay_ms: Option<u64>,
    /// A broker not heard from for this long is dead, ms (`session_timeout_ms`; 2000).
    #[arg(long, value_name = "MS", requires = "controller")]
    pub controller_session_timeout_ms: Option<u64>,
}

impl NamesrvControllerArgs {
    /// The voter to run, if `--controller` was given (`limits`: the `[controller]` table of
    /// the name server's file, if it has one).
    pub(crate) fn voter(
        &self,
        limits: Option<ControllerLimits>,
    ) -> anyhow::Result<Option<VoterOptions>> {
        if !self.controller {
            if limits.is_some() {
                bail!("the config file's [controller] table needs --controller");
            }
            return Ok(None);
        }
        let Some(listen) = &self.controller_listen else {
            bail!(
                "--controller needs --controller-listen ADDR: the voter has its own port (the \
                 name server's port answers BROKER_HEARTBEAT for routes)"
            );
        };
        let mut limits = limits.unwrap_or_default();
        let timing = [
            (&mut limits.lease_ms, self.controller_lease_ms),
            (
                &mut limits.election_delay_ms,
                self.controller_election_delay_ms,
            ),
            (
                &mut limits.session_timeout_ms,
                self.controller_session_timeout_ms,
            ),
        ];
        for (key, flag) in timing {
            if let Some(v) = flag {
                *key = v;
            }
        }
        limits.validate()?;
        Ok(Some(VoterOptions {
            listen: listen.clone(),
            id: self.controller_id,
            peers: self.controller_peers.clone(),
            data_dir: self.controller_data_dir.clone(),
            limits,
        }))
    }
}

enum Input {
    Raft(RaftMessage),
    Request {
        req: Request,
        /// The connection it came on (a broker uses one per voter for all of its requests).
        conn: ConnectionId,
        /// A handle on it, to tell its broker of changes (none in tests).
        handle: Option<Connection>,
        reply: oneshot::Sender<Response>,
    },
    /// A connection closed: the brokers whose requests last came on it are dead at once.
    Closed(ConnectionId),
    Status {
        reply: oneshot::Sender<serde_json::Value>,
    },
}

/// `ID=ADDRESS` pairs, without this voter's own.
fn parse_peers(id: u64, peers: &[String]) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut out = BTreeMap::new();
    for p in peers {
        let Some((i, addr)) = p.split_once('=') else {
            bail!("--peers: {p:?} is not ID=ADDRESS");
        };
        let i: u64 = i
            .trim()
            .parse()
            .with_context(|| format!("--peers: {i:?} is not a voter id"))?;
        if i == 0 {
            bail!("--peers: voter ids start at 1");
        }
        if i != id && out.insert(i, addr.trim().to_string()).is_some() {
            bail!("--peers: voter {i} is listed twice");
        }
    }
    Ok(out)
}

/// What a voter needs to run.
#[derive(Debug, Clone)]
pub(crate) struct VoterOptions {
    /// Its address.
    pub listen: String,
    /// Its id.
    pub id: u64,
    /// Every voter as `ID=ADDRESS`.
    pub peers: Vec<String>,
    /// Where its log is kept (in memory without).
    pub data_dir: Option<PathBuf>,
    /// Its limits.
    pub limits: ControllerLimits,
}

/// A running voter: its listener, the task that owns the node, its metrics.
pub(crate) struct Voter {
    server: shoal_net::Server,
    client: RemotingClient,
    task: JoinHandle<anyhow::Result<()>>,
    metrics: Arc<ControllerMetrics>,
    id: u64,
    voters: Vec<u64>,
    log: String,
}

impl Voter {
    /// Binds the voter's address, reads its log and starts its task.
    pub(crate) async fn start(opts: VoterOptions) -> anyhow::Result<Self> {
        if opts.id == 0 {
            bail!("voter ids start at 1");
        }
        opts.limits.validate()?;
        let peers = parse_peers(opts.id, &opts.peers)?;
        let mut voters: Vec<u64> = peers.keys().copied().collect();
        voters.push(opts.id);
        voters.sort_unstable();
        let metrics = Arc::new(ControllerMetrics::new());
        let (tx, rx) = mpsc::channel(opts.limits.max_inbox);
        let processor = ControllerProcessor {
            inbox: tx,
            answer_timeout: opts.limits.answer_timeout(),
            elect_timeout: opts.limits.elect_timeout(),
            metrics: metrics.clone(),
        };
        let server = shoal_net::Server::bind(opts.listen.as_str(), Arc::new(processor)).await?;
        let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
        let mut senders = BTreeMap::new();
        for (peer, addr) in &peers {
            let (ptx, prx) = mpsc::channel(opts.limits.max_peer_queue);
            tokio::spawn(send_to_peer(client.clone(), addr.clone(), prx));
            senders.insert(*peer, ptx);
        }
        let mut cfg = ControllerConfig::new(opts.id, voters.clone());
        opts.limits.apply_to(&mut cfg)?;
        let (storage, disk, log) = match &opts.data_dir {
            Some(dir) => {
                let (file, storage) = tokio::task::block_in_place(|| LogFile::open(dir, &voters))?;
                let log = file.path().display().to_string();
                (storage, Some(file), log)
            }
            None => (
                ControllerStorage::new(voters.clone()),
                None,
                "in memory".to_string(),
            ),
        };
        let start = Instant::now();
        let node = ControllerNode::new(cfg, storage, 0)?;
        let mut addrs = peers.clone();
        addrs.insert(opts.id, server.local_addr().to_string());
        let driver = Driver {
            start,
            peers: senders,
            addrs,
            disk,
            max_waiting: opts.limits.max_waiting_requests,
            metrics: metrics.clone(),
        };
        let task = tokio::spawn(driver.run(node, rx));
        Ok(Self {
            server,
            client,
            task,
            metrics,
            id: opts.id,
            voters,
            log,
        })
    }

    /// The address it listens on.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Its metrics' registry.
    pub(crate) fn registry(&self) -> Arc<shoal_metrics::Metrics> {
        self.metrics.registry.clone()
    }

    /// One line about it, for the process's start-up output.
    pub(crate) fn describe(&self) -> String {
        format!(
            "controller voter {} listening on {} (voters {:?}, log {})",
            self.id,
            self.local_addr(),
            self.voters,
            self.log
        )
    }

    /// Waits until the voter's task stops by itself (it cannot keep its log): why.
    pub(crate) async fn failed(&mut self) -> anyhow::Error {
        match (&mut self.task).await {
            Ok(Err(e)) => e.context("the controller voter stopped"),
            Ok(Ok(())) => anyhow::anyhow!("the controller voter stopped"),
            Err(e) => anyhow::anyhow!("the controller voter stopped: {e}"),
        }
    }

    /// Stops the voter.
    pub(crate) async fn shutdown(self) {
        self.task.abort();
        self.server.shutdown().await;
        self.client.shutdown();
    }
}

/// `shoal controller`, until `stop` (the process's shutdown signal).
pub(crate) async fn run(
    args: ControllerArgs,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let limits = args.limits.limits(args.config.as_deref())?;
    let mut voter = Voter::start(VoterOptions {
        listen: args.listen.clone(),
        id: args.id,
        peers: args.peers.clone(),
        data_dir: args.data_dir.clone(),
        limits,
    })
    .await?;
    println!("shoal {}", voter.describe());
    let http = match &args.http_listen {
        Some(addr) => {
            let state = crate::http::HttpState::default().with_registry(voter.registry());
            let h = crate::http::HttpServer::start(addr, state).await?;
            println!("metrics at http://{}/metrics", h.local_addr());
            Some(h)
        }
        None => None,
    };
    let failed = tokio::select! {
        () = stop => None,
        e = voter.failed() => Some(e),
    };
    if let Some(h) = http {
        h.shutdown().await;
    }
    voter.shutdown().await;
    match failed {
        Some(e) => Err(e),
        None => {
            println!("controller stopped");
            Ok(())
        }
    }
}

async fn send_to_peer(
    client: RemotingClient,
    addr: String,
    mut queue: mpsc::Receiver<RaftMessage>,
) {
    while let Some(msg) = queue.recv().await {
        let body = match encode_raft_message(&msg) {
            Ok(b) => b,
            Err(e) => {
                debug!(error = %e, "raft message not encoded");
                continue;
            }
        };
        let mut cmd = RemotingCommand::request(ext::CONTROLLER_RAFT_MESSAGE).with_body(body);
        cmd.set_oneway();
        if let Err(e) = client.invoke_oneway(&addr, cmd).await {
            debug!(peer = %addr, error = %e, "raft message not sent");
        }
    }
}

/// Brokers tracked per connection at most (a broker process is one broker of one group).
const MAX_BROKERS_PER_CONNECTION: usize = 16;

/// What the voter's task holds besides the node.
struct Driver {
    start: Instant,
    peers: BTreeMap<u64, mpsc::Sender<RaftMessage>>,
    addrs: BTreeMap<u64, String>,
    disk: Option<LogFile>,
    max_waiting: usize,
    metrics: Arc<ControllerMetrics>,
}

impl Driver {
    /// Tells the members of `notice`'s group that it changed, on the connections their
    /// requests came on (members not connected to this voter find out at their next
    /// heartbeat, as they would without a notice).
    fn notify(
        &self,
        notice: &GroupNotice,
        conns: &BrokerConnections,
        handles: &HashMap<ConnectionId, Connection>,
    ) {
        let cmd = notice.to_command();
        for (broker, _) in &notice.to {
            let Some(conn) = conns
                .connection_of(&notice.group, *broker)
                .and_then(|c| handles.get(&c))
            else {
                continue;
            };
            self.metrics.notices_sent.inc();
            let (conn, cmd) = (conn.clone(), cmd.clone());
            tokio::spawn(async move {
                if let Err(e) = conn.oneway(cmd).await {
                    debug!(error = %e, "group change notice not sent");
                }
            });
        }
    }

    /// The voter's task: the only owner of the node.
    async fn run(
        mut self,
        mut node: ControllerNode,
        mut inbox: mpsc::Receiver<Input>,
    ) -> anyhow::Result<()> {
        let start = self.start;
        let now = || u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut waiting: HashMap<u64, oneshot::Sender<Response>> = HashMap::new();
        let mut next_token = 0u64;
        let mut was_leader = false;
        // Brokers by the connection their latest request came on (only members the metadata
        // knows, so bounded by its limits; connections by the listener's).
        let mut conns = BrokerConnections::new(MAX_BROKERS_PER_CONNECTION);
        // The connections `conns` tracks, to tell their brokers of a change.
        let mut handles: HashMap<ConnectionId, Connection> = HashMap::new();
        let mut notices = GroupNotices::new();
        loop {
            let wake = start + Duration::from_millis(node.poll_timeout());
            tokio::select! {
                () = tokio::time::sleep_until(wake.into()) => {
                    node.handle_timeout(now());
                    // Answers nobody waits for any more (timed out at the listener).
                    waiting.retain(|_, tx| !tx.is_closed());
                }
                input = inbox.recv() => match input {
                    None => return Ok(()),
                    Some(Input::Raft(msg)) => node.handle_message(now(), msg),
                    Some(Input::Closed(conn)) => {
                        handles.remove(&conn);
                        for (group, broker) in conns.closed(conn) {
                            debug!(%group, broker, "broker's controller connection closed");
                            self.metrics.broker_disconnects.inc();
                            node.handle_broker_disconnected(now(), &group, broker);
                        }
                    }
                    Some(Input::Request { req, conn, handle, reply }) => {
                        if let Some((group, broker)) = req.broker() {
                            let known = node
                                .metadata()
                                .group(group)
                                .is_some_and(|g| g.members.contains_key(&broker));
                            if known {
                                conns.seen(conn, group, broker);
                                if let Some(h) = handle.filter(|h| !h.is_closed()) {
                                    handles.entry(conn).or_insert(h);
                                }
                            }
                        }
                        if waiting.len() >= self.max_waiting {
                            waiting.retain(|_, tx| !tx.is_closed());
                        }
                        if waiting.len() >= self.max_waiting {
                            self.metrics.refused_busy("waiting");
                            let _ = reply.send(Response::Busy);
                        } else {
                            next_token += 1;
                            waiting.insert(next_token, reply);
                            node.handle_request(now(), next_token, req);
                        }
                    }
                    Some(Input::Status { reply }) => {
                        let _ = reply.send(status(&node, &self.addrs));
                    }
                }
            }
            // What the voter decided is on disk before anyone hears of it (raft-rs's contract).
            if let Some(d) = &mut self.disk {
                match tokio::task::block_in_place(|| d.sync()) {
                    Ok(true) => {
                        self.metrics.log_syncs.inc();
                    }
                    Ok(false) => {}
                    Err(e) => {
                        error!(error = %format!("{e:#}"), "the voter cannot keep its log; stopping");
                        return Err(e);
                    }
                }
            }
            while let Some(msg) = node.poll_transmit() {
                if let Some(q) = self.peers.get(&msg.to) {
                    // A full queue drops it: Raft sends again.
                    if q.try_send(msg).is_err() {
                        self.metrics.peer_dropped.inc();
                    }
                }
            }
            while let Some((token, answer)) = node.poll_response() {
                if answer == Response::Busy {
                    self.metrics.refused_busy("pending");
                }
                if let Some(reply) = waiting.remove(&token) {
                    let _ = reply.send(answer);
                }
            }
            for notice in notices.poll(&node) {
                self.notify(&notice, &conns, &handles);
            }
            if node.is_leader() != was_leader {
                was_leader = node.is_leader();
                self.metrics.leader_changes.inc();
                info!(
                    voter = node.id(),
                    term = node.term(),
                    leader = was_leader,
                    "controller leadership changed"
                );
            }
            let m = &self.metrics;
            m.inbox_depth.set(inbox.len() as i64);
            m.waiting.set(waiting.len() as i64);
            m.term.set(node.term() as i64);
            m.is_leader.set(i64::from(was_leader));
            m.applied_index.set(node.applied_index() as i64);
            m.groups.set(node.metadata().groups().len() as i64);
            m.broker_connections.set(conns.connections() as i64);
        }
    }
}

/// What CONTROLLER_GET_METADATA_INFO answers: this voter's view (registration tokens left out;
/// `alive` only on the leader, which alone hears heartbeats).
fn status(node: &ControllerNode, addrs: &BTreeMap<u64, String>) -> serde_json::Value {
    let leader = node.leader();
    let groups: serde_json::Map<String, serde_json::Value> = node
        .metadata()
        .groups()
        .iter()
        .map(|(name, g)| {
            let members: BTreeMap<String, &str> = g
                .members
                .iter()
                .map(|(id, m)| (id.to_string(), m.addr.as_str()))
                .collect();
            // What the leader last heard from each member (empty elsewhere): its log end, how
            // far behind the master's log end it is, how long ago.
            let heard = node.heard(name);
            let master_end = g
                .master
                .and_then(|m| heard.iter().find(|h| h.broker_id == m))
                .map(|h| h.end_offset);
            let heard: BTreeMap<String, serde_json::Value> = heard
                .iter()
                .map(|h| {
                    let lag = master_end.map(|end| end.saturating_sub(h.end_offset));
                    (
                        h.broker_id.to_string(),
                        json!({
                            "endOffset": h.end_offset,
                            "lastEpoch": h.last_epoch,
                            "lagBytes": lag,
                            "heardMsAgo": h.ago_ms,
                            "disconnected": h.disconnected,
                        }),
                    )
                })
                .collect();
            (
                name.clone(),
                json!({
                    "members": members,
                    // Heard from within the session, as the leader sees it (empty elsewhere).
                    "alive": node.alive(name),
                    "heard": heard,
                    // The last lease grant seen lasts this long yet, by the leader's clock.
                    "leaseMsLeft": node.lease_left_ms(name),
                    "master": g.master,
                    "masterEpoch": g.master_epoch,
                    "inSync": g.in_sync,
                    "inSyncEpoch": g.in_sync_epoch,
                    "leaseGeneration": g.lease_generation,
                    "fencedEpoch": g.fenced_epoch,
                }),
            )
        })
        .collect();
    json!({
        "id": node.id(),
        "isLeader": node.is_leader(),
        "leaderId": leader,
        "leaderAddr": leader.and_then(|l| addrs.get(&l)),
        "term": node.term(),
        "appliedIndex": node.applied_index(),
        "voters": addrs,
        "groups": groups,
    })
}

/// The request code each request travels with.
pub(crate) fn request_code_of(req: &Request) -> i32 {
    req.request_code()
}

/// The response code an answer travels with (the body says the rest).
fn response_code_of(answer: &Response) -> i32 {
    match answer {
        Response::BrokerId(_) | Response::Group(_) | Response::LeaseGranted { .. } => resp::SUCCESS,
        Response::NotLeader { .. } => resp::CONTROLLER_NOT_LEADER,
        Response::Busy => resp::SYSTEM_BUSY,
        Response::Refused(r) => match r {
            Refusal::UnknownGroup | Refusal::UnknownBroker(_) => {
                resp::CONTROLLER_BROKER_METADATA_NOT_EXIST
            }
            Refusal::StaleMasterEpoch { .. } | Refusal::LeaseFenced(_) => {
                resp::CONTROLLER_FENCED_MASTER_EPOCH
            }
            Refusal::StaleInSyncEpoch { .. } => resp::CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
            Refusal::NotMaster => resp::CONTROLLER_INVALID_MASTER,
            Refusal::InvalidInSyncSet => resp::CONTROLLER_INVALID_REPLICAS,
            Refusal::NotInSync(_) => resp::CONTROLLER_ELECT_MASTER_FAILED,
            Refusal::NotFenced => resp::CONTROLLER_MASTER_STILL_EXIST,
            Refusal::Limit(_) => resp::CONTROLLER_INVALID_REQUEST,
        },
    }
}

struct ControllerProcessor {
    inbox: mpsc::Sender<Input>,
    answer_timeout: Duration,
    elect_timeout: Duration,
    metrics: Arc<ControllerMetrics>,
}

fn answer(request: &RemotingCommand, code: i32, remark: String) -> RemotingCommand {
    RemotingCommand::response_to(request, code, Some(remark))
}

impl Processor for ControllerProcessor {
    fn on_connection_close(&self, conn: &Connection) {
        // Behind the requests that came on it, so the voter sees them first. A full inbox
        // waits (never dropped: the broker would otherwise be seen dead only a session later).
        if let Err(mpsc::error::TrySendError::Full(input)) =
            self.inbox.try_send(Input::Closed(conn.id()))
        {
            let inbox = self.inbox.clone();
            tokio::spawn(async move {
                let _ = inbox.send(input).await;
            });
        }
    }

    fn process(
        &self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, shoal_net::ProcessResult> {
        let handle = ctx.connection().clone();
        let inbox = self.inbox.clone();
        let (answer_timeout, elect_timeout) = (self.answer_timeout, self.elect_timeout);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let code = request.code;
            if code == ext::CONTROLLER_RAFT_MESSAGE {
                let body = request.body.as_deref().unwrap_or_default();
                match decode_raft_message(body) {
                    // A full inbox drops it: Raft sends again.
                    Ok(msg) => {
                        let _ = inbox.try_send(Input::Raft(msg));
                    }
                    Err(e) => debug!(error = %e, "raft message dropped"),
                }
                return Ok(None);
            }
            if code == rc::CONTROLLER_GET_METADATA_INFO {
                let (reply, rx) = oneshot::channel();
                if inbox.try_send(Input::Status { reply }).is_err() {
                    return Ok(Some(answer(&request, resp::SYSTEM_BUSY, "busy".into())));
                }
                return Ok(Some(match tokio::time::timeout(answer_timeout, rx).await {
                    Ok(Ok(v)) => RemotingCommand::response_to(&request, resp::SUCCESS, None)
                        .with_body(serde_json::to_vec(&v)?),
                    _ => answer(&request, resp::SYSTEM_BUSY, "no answer".into()),
                }));
            }
            let known = [
                rc::CONTROLLER_APPLY_BROKER_ID,
                rc::CONTROLLER_REGISTER_BROKER,
                rc::BROKER_HEARTBEAT,
                ext::CONTROLLER_RENEW_LEASE,
                rc::CONTROLLER_ALTER_SYNC_STATE_SET,
                rc::CONTROLLER_ELECT_MASTER,
            ];
            if !known.contains(&code) {
                return Ok(Some(shoal_net::request_code_not_supported(&request)));
            }
            let body = request.body.as_deref().unwrap_or_default();
            let req: Request = match serde_json::from_slice(body) {
                Ok(r) => r,
                Err(e) => {
                    return Ok(Some(answer(
                        &request,
                        resp::CONTROLLER_INVALID_REQUEST,
                        format!("body: {e}"),
                    )))
                }
            };
            if request_code_of(&req) != code {
                return Ok(Some(answer(
                    &request,
                    resp::CONTROLLER_INVALID_REQUEST,
                    format!("the body is not a request of code {code}"),
                )));
            }
            let (reply, rx) = oneshot::channel();
            let input = Input::Request {
                req,
                conn: handle.id(),
                handle: Some(handle),
                reply,
            };
            if inbox.try_send(input).is_err() {
                metrics.refused_busy("inbox");
                return Ok(Some(answer(&request, resp::SYSTEM_BUSY, "busy".into())));
            }
            let limit = if code == rc::CONTROLLER_ELECT_MASTER {
                elect_timeout
            } else {
                answer_timeout
            };
            let response = match tokio::time::timeout(limit, rx).await {
                Ok(Ok(r)) => r,
                _ => {
                    metrics.refused_busy("timeout");
                    Response::Busy
                }
            };
            let remark = match &response {
                Response::Refused(r) => Some(r.to_string()),
                Response::NotLeader { leader } => Some(match leader {
                    Some(l) => format!("not the leader; voter {l} leads"),
                    None => "not the leader; no leader known".into(),
                }),
                Response::Busy => Some("busy".into()),
                _ => None,
            };
            Ok(Some(
                RemotingCommand::response_to(&request, response_code_of(&response), remark)
                    .with_body(serde_json::to_vec(&response)?),
            ))
        })
    }
}

/// `shoal cluster elect --controller ADDR GROUP [--broker ID]`: an operator's switch-over, sent
/// to the leader (the voter asked names it).
pub(crate) async fn elect_cmd(
    controller: &str,
    group: &str,
    broker: Option<u64>,
    timeout: Duration,
    json_out: bool,
) -> anyhow::Result<()> {
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    let req = Request::ElectMaster {
        group: group.to_string(),
        target: broker,
    };
    let mut addr = controller.to_string();
    let mut answer = None;
    for _ in 0..2 {
        let cmd = RemotingCommand::request(rc::CONTROLLER_ELECT_MASTER)
            .with_body(serde_json::to_vec(&req)?);
        let reply = client
            .invoke(&addr, cmd, timeout)
            .await
            .with_context(|| format!("controller {addr}"))?;
        let response: Response = serde_json::from_slice(reply.body.as_deref().unwrap_or_default())
            .with_context(|| format!("controller {addr}: {:?}", reply.remark))?;
        if let Response::NotLeader { leader: Some(_) } = response {
            let status = metadata(&client, &addr).await?;
            if let Some(leader) = status["leaderAddr"].as_str() {
                addr = leader.to_string();
                continue;
            }
        }
        answer = Some(response);
        break;
    }
    client.shutdown();
    match answer {
        Some(Response::Group(g)) => {
            if json_out {
                println!(
                    "{}",
                    json!({"group": group, "master": g.master, "masterEpoch": g.master_epoch, "inSync": g.in_sync, "inSyncEpoch": g.in_sync_epoch})
                );
            } else {
                println!(
                    "{group}: master {} at epoch {}, in-sync set {:?}",
                    g.master.map_or("none".to_string(), |m| m.to_string()),
                    g.master_epoch,
                    g.in_sync
                );
            }
            Ok(())
        }
        Some(Response::Refused(r)) => bail!("{group}: refused: {r}"),
        Some(other) => bail!("{group}: {other:?}"),
        None => bail!("{group}: the leader moved while asking; try again"),
    }
}

/// A voter's CONTROLLER_GET_METADATA_INFO answer.
async fn metadata(client: &RemotingClient, controller: &str) -> anyhow::Result<serde_json::Value> {
    let reply = client
        .invoke(
            controller,
            RemotingCommand::request(rc::CONTROLLER_GET_METADATA_INFO),
            Duration::from_secs(5),
        )
        .await
        .with_context(|| format!("controller {controller}"))?;
    if reply.code != resp::SUCCESS {
        bail!(
            "controller {controller}: {} {}",
            shoal_proto::code::response_code::describe(reply.code),
            reply.remark.unwrap_or_default()
        );
    }
    serde_json::from_slice(reply.body.as_deref().unwrap_or_default())
        .context("the controller's answer")
}

/// `shoal cluster status --controller ADDR`: one voter's view of the groups.
pub(crate) async fn status_cmd(controller: &str, json_out: bool) -> anyhow::Result<()> {
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    let v = metadata(&client, controller).await;
    client.shutdown();
    let v = v?;
    if json_out {
        println!("{v}");
        return Ok(());
    }
    let leader = match (v["leaderId"].as_u64(), v["leaderAddr"].as_str()) {
        (Some(id), Some(addr)) => format!("voter {id} at {addr}"),
        (Some(id), None) => format!("voter {id}"),
        _ => "none known".into(),
    };
    println!(
        "controller voter {} (term {}, applied {}); leader: {leader}",
        v["id"], v["term"], v["appliedIndex"]
    );
    let mut t = crate::table::Table::new(&[
        "GROUP",
        "ID",
        "ADDRESS",
        "ROLE",
        "IN-SYNC",
        "ALIVE",
        "END-OFFSET",
        "LAG",
        "HEARD",
        "MASTER-EPOCH",
        "IN-SYNC-EPOCH",
    ]);
    let mut leases = Vec::new();
    if let Some(groups) = v["groups"].as_object() {
        for (name, g) in groups {
            let ids = |key: &str| -> Vec<u64> {
                g[key]
                    .as_array()
                    .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
                    .unwrap_or_default()
            };
            let (in_sync, alive) = (ids("inSync"), ids("alive"));
            if let Some(left) = g["leaseMsLeft"].as_u64() {
                leases.push(format!("{name}: lease {left} ms left"));
            }
            if let Some(members) = g["members"].as_object() {
                for (id, addr) in members {
                    let idn: u64 = id.parse().unwrap_or_default();
                    let role = if g["master"].as_u64() == Some(idn) {
                        "master"
                    } else {
                        "replica"
                    };
                    t.row(vec![
                        name.clone(),
                        id.clone(),
                        addr.as_str().unwrap_or_default().to_string(),
                        role.to_string(),
                        if in_sync.contains(&idn) { "yes" } else { "no" }.to_string(),
                        match (v["isLeader"].as_bool(), alive.contains(&idn)) {
                            (Some(true), true) => "yes",
                            (Some(true), false) => "no",
                            _ => "-",
                        }
                        .to_string(),
                        heard_cell(&g["heard"][id.as_str()]["endOffset"], ""),
                        heard_cell(&g["heard"][id.as_str()]["lagBytes"], ""),
                        heard_cell(&g["heard"][id.as_str()]["heardMsAgo"], " ms ago"),
                        g["masterEpoch"].to_string(),
                        g["inSyncEpoch"].to_string(),
                    ]);
                }
            }
        }
    }
    t.print();
    for l in leases {
        println!("{l}");
    }
    Ok(())
}

/// A number the leader heard with its unit, or `-` (a follower, or nothing heard yet).
fn heard_cell(v: &serde_json::Value, unit: &str) -> String {
    v.as_u64().map_or("-".to_string(), |n| format!("{n}{unit}"))
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
