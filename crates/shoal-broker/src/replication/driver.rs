//! The replication task: owns the broker's `Member` and carries out what it decides. It
//! appends and truncates the store's commit log, reads the batches it ships, keeps the member
//! file, sends to the other brokers of the group (one ordered link per broker) and to the
//! controller (the voters in turn until the leader answers), and answers the sends waiting
//! for their acknowledgement. It decides nothing itself.

use super::disk::MemberDisk;
use super::wire::{self, PeerFrame};
use super::{AckSetting, Input, Replication, ReplicationSettings, ReplicationView, RoleView};
use bytes::Bytes;
use futures::future::BoxFuture;
use shoal_ha::controller::GroupNotice;
use shoal_ha::controller::Response;
use shoal_ha::replication::{
    AckMode, BatchVerdict, DiskState, MasterConfig, Member, MemberConfig, PeerMessage,
    ReplicaAction, Role, ToReplica, Transmit, WriteRefusal,
};
use shoal_ha::{BrokerId, Millis};
use shoal_net::{NetConfig, Processor, RemotingClient, RequestContext};
use shoal_proto::RemotingCommand;
use shoal_store::MessageStore;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// Messages queued for one other broker at most (batches are bounded by the member's
/// in-flight window; this bounds heartbeats and acks to a broker that does not read).
const PEER_QUEUE: usize = 256;

/// Errors starting replication.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// The member file could not be read or written.
    #[error(transparent)]
    Disk(#[from] crate::persist::PersistError),
    /// The store refused a replication call.
    #[error("store: {0}")]
    Store(#[from] shoal_store::StoreError),
}

/// Starts the replication task of a broker of `group` announcing `addr`, over `store` (a
/// replicated store) and the member file under `data_dir`. `durable`: a replica fsyncs what it
/// receives before acknowledging it (the broker's sync flush); otherwise it acknowledges what
/// it has written, and its flusher syncs it as it does puts.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    settings: &ReplicationSettings,
    group: &str,
    addr: &str,
    data_dir: &Path,
    store: Arc<MessageStore>,
    tls: Option<shoal_net::ClientTls>,
    durable: bool,
) -> Result<(Arc<Replication>, JoinHandle<()>), StartError> {
    let disk = MemberDisk::open(data_dir, group)?;
    // Nothing is appended but through the member: puts wait until it is master.
    store.set_puts_allowed(false);
    let log_end = store.commit_log_max_offset();
    let epochs = disk.epochs_for(log_end);
    let cfg = MemberConfig {
        group: group.to_string(),
        addr: addr.to_string(),
        token: disk.file().token.clone(),
        heartbeat_ms: settings.heartbeat_ms,
        call_timeout_ms: settings.call_timeout_ms,
        resend_ms: 1_000,
        master: MasterConfig {
            ack: match settings.ack {
                AckSetting::InSyncSet => AckMode::InSyncSet,
                AckSetting::Master => AckMode::Master,
            },
            min_in_sync: settings.min_insync_replicas,
            batch_max_bytes: settings.batch_max_bytes,
            max_inflight_bytes: settings.max_inflight_bytes,
            max_inflight_batches: settings.max_inflight_batches,
            max_lag_ms: settings.max_lag_ms,
            ack_timeout_ms: settings.ack_timeout_ms,
            max_pending: settings.max_pending_acks,
            ..MasterConfig::default()
        },
    };
    let (tx, rx) = mpsc::channel(settings.inbox_capacity);
    let handle = Arc::new(Replication::new(
        group.to_string(),
        tx.clone(),
        settings.max_pending_commits,
    ));
    let clock = Instant::now();
    let member = Member::new(
        cfg.clone(),
        DiskState {
            broker_id: disk.file().broker_id,
            epochs,
            log_end,
        },
        0,
    );
    info!(group, broker_id = ?disk.file().broker_id, log_end, controllers = ?settings.controller_addrs,
        "replication starting");
    let driver = Driver {
        member,
        cfg,
        store,
        disk,
        handle: handle.clone(),
        inbox: rx,
        tx: tx.clone(),
        client: RemotingClient::with_tls(
            NetConfig::default(),
            Arc::new(NoticeProcessor {
                group: group.to_string(),
                inbox: tx,
            }),
            tls,
        ),
        controllers: Arc::new(settings.controller_addrs.clone()),
        leader_hint: Arc::new(AtomicUsize::new(0)),
        call_timeout: Duration::from_millis(settings.call_timeout_ms),
        credentials: settings.credentials(),
        addrs: BTreeMap::new(),
        links: HashMap::new(),
        waiting: HashMap::new(),
        next_ticket: 0,
        clock,
        puts_allowed: false,
        role_key: RoleKey::Joining,
        durable,
        append_failures: 0,
    };
    Ok((handle, tokio::spawn(driver.run())))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoleKey {
    Joining,
    Master(u32),
    Replica,
}

struct PeerLink {
    addr: String,
    queue: mpsc::Sender<RemotingCommand>,
    task: JoinHandle<()>,
}

impl Drop for PeerLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Driver {
    member: Member,
    cfg: MemberConfig,
    store: Arc<MessageStore>,
    disk: MemberDisk,
    handle: Arc<Replication>,
    inbox: mpsc::Receiver<Input>,
    tx: mpsc::Sender<Input>,
    client: RemotingClient,
    controllers: Arc<Vec<String>>,
    /// The voter asked first: the last one that answered as leader.
    leader_hint: Arc<AtomicUsize>,
    call_timeout: Duration,
    /// The ACL account peer messages are signed with (`replication.access_key`).
    credentials: Option<shoal_proto::acl::SessionCredentials>,
    /// The group's brokers' addresses, as the controller last told.
    addrs: BTreeMap<BrokerId, String>,
    links: HashMap<BrokerId, PeerLink>,
    waiting: HashMap<u64, oneshot::Sender<Result<(), WriteRefusal>>>,
    next_ticket: u64,
    clock: Instant,
    puts_allowed: bool,
    role_key: RoleKey,
    durable: bool,
    /// Batches that could not be appended in a row (logged at the first, and when appends
    /// work again).
    append_failures: u64,
}

impl Driver {
    fn now(&self) -> Millis {
        self.clock.elapsed().as_millis() as Millis
    }

    async fn run(mut self) {
        self.member.handle_timeout(self.now());
        if let Err(e) = self.pump().await {
            warn!(error = %e, "replication stopped: the store refused a replication write");
            return;
        }
        loop {
            let wake = self.clock + Duration::from_millis(self.member.poll_timeout());
            tokio::select! {
                input = self.inbox.recv() => {
                    let Some(input) = input else { return };
                    self.handle(input).await;
                    // Whatever else is queued, before acting on it all.
                    for _ in 0..64 {
                        match self.inbox.try_recv() {
                            Ok(input) => self.handle(input).await,
                            Err(_) => break,
                        }
                    }
                }
                _ = tokio::time::sleep_until(wake.into()) => {
                    self.member.handle_timeout(self.now());
                }
            }
            if let Err(e) = self.pump().await {
                warn!(error = %e, "replication stopped: the store refused a replication write");
                self.fail_waiting();
                self.allow_puts(false);
                return;
            }
        }
    }

    async fn handle(&mut self, input: Input) {
        let now = self.now();
        match input {
            Input::Appended { end, reply } => {
                self.next_ticket += 1;
                self.waiting.insert(self.next_ticket, reply);
                self.member.handle_appended(now, self.next_ticket, end);
            }
            Input::Answer { call, response } => match response {
                Some(response) => {
                    if let Response::Group(info) = &response {
                        self.addrs = info
                            .members
                            .iter()
                            .map(|(id, m)| (*id, m.addr.clone()))
                            .collect();
                    }
                    self.member.handle_controller_response(now, call, response);
                }
                None => self.member.handle_controller_timeout(now, call),
            },
            Input::Peer(frame) => self.peer(now, frame).await,
            Input::Notice => self.member.handle_notice(now),
            Input::Unreachable(to) => self.member.handle_peer_unreachable(now, to),
        }
    }

    async fn peer(&mut self, now: Millis, frame: PeerFrame) {
        let PeerFrame {
            from, msg, bytes, ..
        } = frame;
        if let PeerMessage::ToReplica(ToReplica::Batch(h)) = &msg {
            if h.end.checked_sub(h.start) != Some(bytes.len() as u64) {
                // Not what the header says: as good as lost (the master ships again).
                return;
            }
        }
        let BatchVerdict::Append { start, end } = self.member.handle_peer(now, from, msg) else {
            return;
        };
        let appended = if self.durable {
            // An fsync: on the blocking pool.
            let store = self.store.clone();
            tokio::task::spawn_blocking(move || store.append_replicated_with(start, &bytes, true))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        } else {
            // A write to the page cache (one batch at most): no thread hop.
            self.store
                .append_replicated_with(start, &bytes, false)
                .map_err(|e| e.to_string())
        };
        match appended {
            Ok(_) => {
                if self.append_failures > 0 {
                    info!(
                        failed_batches = self.append_failures,
                        "batches from the master are appended again"
                    );
                    self.append_failures = 0;
                }
                self.handle
                    .counters
                    .bytes_received
                    .fetch_add(end - start, Ordering::Relaxed);
                self.handle
                    .counters
                    .batches_received
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                // The member counts the bytes as appended; they are not. It withdraws its
                // acknowledgement, tells the master (writes stop waiting for this replica),
                // and handshakes again from the store's end after a pause.
                self.append_failures += 1;
                self.handle
                    .counters
                    .append_failures
                    .fetch_add(1, Ordering::Relaxed);
                if self.append_failures == 1 {
                    warn!(error = %e, start, end, "a batch from the master could not be appended; out of the in-sync set until it can");
                } else {
                    debug!(error = %e, start, end, failed_batches = self.append_failures, "a batch from the master could not be appended");
                }
                let log_end = self.store.commit_log_max_offset();
                self.member.handle_append_failed(now, log_end);
            }
        }
    }

    fn fail_waiting(&mut self) {
        for (_, reply) in self.waiting.drain() {
            let _ = reply.send(Err(WriteRefusal::NotMaster));
        }
    }

    /// Carries out what the member decided: truncations and the member file first, then the
    /// messages, then the answers to sends; publishes the view.
    async fn pump(&mut self) -> Result<(), shoal_store::StoreError> {
        let now = self.now();
        // Retention may have deleted segments: a replica that needs them restarts its log.
        self.member
            .handle_log_start(self.store.commit_log_min_offset());
        loop {
            match self.member.poll_action() {
                Some(ReplicaAction::Truncate(to)) => {
                    let store = self.store.clone();
                    if to < store.commit_log_min_offset() {
                        // Below what this log still holds (it restarted later than the point
                        // where it and its master's agree): nothing of it stays.
                        run_blocking(move || store.restart_log_at(to)).await?;
                    } else {
                        run_blocking(move || store.truncate_log(to)).await?;
                    }
                    self.handle
                        .counters
                        .truncations
                        .fetch_add(1, Ordering::Relaxed);
                    info!(to, "log truncated at the divergence point");
                    continue;
                }
                Some(ReplicaAction::RestartAt(at)) => {
                    let store = self.store.clone();
                    run_blocking(move || store.restart_log_at(at)).await?;
                    self.handle
                        .counters
                        .log_restarts
                        .fetch_add(1, Ordering::Relaxed);
                    info!(
                        at,
                        "log restarted at the master's first offset (it no longer has what this replica lacked)"
                    );
                    continue;
                }
                None => {}
            }
            self.persist_member().await;
            match self.member.poll_transmit(now) {
                Some(t) => self.transmit(t),
                None => break,
            }
        }
        while let Some(a) = self.member.poll_ack() {
            if let Some(reply) = self.waiting.remove(&a.ticket) {
                let _ = reply.send(a.result);
            }
        }
        // Raising the confirmed offset dispatches what it makes visible on this thread: a
        // large step (a catch-up) goes to the blocking pool.
        let confirmed = self.member.confirmed();
        if confirmed > self.store.dispatched_offset().saturating_add(1 << 20) {
            let store = self.store.clone();
            let _ = tokio::task::spawn_blocking(move || store.set_confirmed(confirmed)).await;
        } else {
            self.store.set_confirmed(confirmed);
        }
        self.settle_role().await?;
        self.publish(now);
        Ok(())
    }

    /// The broker id and epoch entries on disk before anything depending on them is sent.
    async fn persist_member(&mut self) {
        let id = self.member.broker_id();
        let epochs = self.member.epochs().clone();
        if self.disk.file().broker_id == id && self.disk.file().epochs == epochs.entries() {
            return;
        }
        if let Err(e) = self.disk.update(id, &epochs) {
            // Sending on without the entries on disk could let a restart misjudge where its
            // log diverges: stop appending until it can be written.
            warn!(error = %e, "member file not written");
        }
    }

    /// Puts only while master; a step-down cuts what was appended and never reported.
    async fn settle_role(&mut self) -> Result<(), shoal_store::StoreError> {
        let key = match self.member.role() {
            Role::Master(m) if m.stepped_down().is_none() => RoleKey::Master(m.epoch()),
            Role::Master(_) | Role::Replica(_) => RoleKey::Replica,
            Role::Joining => RoleKey::Joining,
        };
        if key == self.role_key {
            return Ok(());
        }
        info!(from = ?self.role_key, to = ?key, broker_id = ?self.member.broker_id(), "replication role changed");
        if let RoleKey::Master(_) = key {
            self.handle
                .counters
                .became_master
                .fetch_add(1, Ordering::Relaxed);
        }
        let was_master = matches!(self.role_key, RoleKey::Master(_));
        self.role_key = key;
        self.allow_puts(matches!(key, RoleKey::Master(_)));
        if was_master {
            // Sends appended after the last one reported are not the group's: cut them (their
            // senders are answered NOT_MASTER when their report arrives).
            let keep = self.member.log_end();
            let store = self.store.clone();
            if store.commit_log_max_offset() > keep {
                run_blocking(move || store.truncate_log(keep)).await?;
            }
        }
        Ok(())
    }

    fn allow_puts(&mut self, allowed: bool) {
        if self.puts_allowed != allowed {
            self.store.set_puts_allowed(allowed);
            self.puts_allowed = allowed;
        }
    }

    fn publish(&self, now: Millis) {
        let mut view = ReplicationView {
            group: self.cfg.group.clone(),
            broker_id: self.member.broker_id(),
            writable: self.member.check_writable(now).err().map(|e| e.to_string()),
            log_end: self.member.log_end(),
            confirmed: self.member.confirmed(),
            pending_acks: self.waiting.len(),
            epochs: self
                .member
                .epochs()
                .entries()
                .iter()
                .map(|e| (e.epoch, e.start))
                .collect(),
            ..Default::default()
        };
        match self.member.role() {
            Role::Master(m) if m.stepped_down().is_none() => {
                view.role = RoleView::Master { epoch: m.epoch() };
                view.lease_held = m.holds_lease(now);
                let (set, epoch) = m.in_sync();
                view.in_sync = set.iter().copied().collect();
                view.in_sync_epoch = epoch;
                view.replicas = m.replica_offsets().collect();
            }
            Role::Master(m) => {
                view.role = RoleView::Replica {
                    master: None,
                    epoch: m.stepped_down().unwrap_or_default(),
                }
            }
            Role::Replica(r) => {
                view.role = RoleView::Replica {
                    master: r.master(),
                    epoch: r.epoch(),
                };
                view.master_addr = r.master().and_then(|m| self.addrs.get(&m).cloned());
            }
            Role::Joining => {}
        }
        self.handle.publish(view);
    }

    fn transmit(&mut self, t: Transmit) {
        match t {
            Transmit::Controller { call, req } => self.call_controller(call, req),
            Transmit::Peer { to, msg } => self.send_peer(to, msg),
        }
    }

    fn send_peer(&mut self, to: BrokerId, mut msg: PeerMessage) {
        let Some(me) = self.member.broker_id() else {
            return;
        };
        let Some(addr) = self.addrs.get(&to).cloned() else {
            return;
        };
        let mut bytes = Bytes::new();
        if let PeerMessage::ToReplica(ToReplica::Batch(h)) = &mut msg {
            if h.end > h.start {
                let want = (h.end - h.start) as usize;
                match self.store.read_log(h.start, want) {
                    Ok(b) if !b.is_empty() => {
                        let end = h.start + b.len() as u64;
                        if end != h.end {
                            self.member.handle_shipped(to, h.start, end);
                            h.end = end;
                        }
                        bytes = b;
                    }
                    Ok(_) => return,
                    Err(e) => {
                        warn!(error = %e, replica = to, start = h.start, "cannot read the commit log to ship");
                        return;
                    }
                }
                self.handle
                    .counters
                    .bytes_shipped
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                self.handle
                    .counters
                    .batches_shipped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut cmd = match wire::encode_peer(&self.cfg.group, me, &msg, bytes) {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "replication message not encoded");
                return;
            }
        };
        if let Some(c) = &self.credentials {
            shoal_proto::acl::sign_request(&mut cmd, c);
        }
        let link = self.link(to, &addr);
        // A full queue drops it: the member sends again.
        let _ = link.queue.try_send(cmd);
    }

    fn link(&mut self, to: BrokerId, addr: &str) -> &PeerLink {
        if self.links.get(&to).is_none_or(|l| l.addr != addr) {
            let (queue, rx) = mpsc::channel::<RemotingCommand>(PEER_QUEUE);
            let task = tokio::spawn(super::link::run(
                self.client.clone(),
                addr.to_string(),
                to,
                rx,
                self.tx.clone(),
            ));
            self.links.insert(
                to,
                PeerLink {
                    addr: addr.to_string(),
                    queue,
                    task,
                },
            );
        }
        &self.links[&to]
    }

    fn call_controller(&self, call: u64, req: shoal_ha::controller::Request) {
        let cmd = match wire::encode_controller(&req) {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "controller request not encoded");
                return;
            }
        };
        let client = self.client.clone();
        let controllers = self.controllers.clone();
        let hint = self.leader_hint.clone();
        let timeout = self.call_timeout;
        let tx = self.tx.clone();
        let inbox_dropped = self.handle.clone();
        tokio::spawn(async move {
            let response = ask_voters(&client, &controllers, &hint, cmd, timeout).await;
            if tx.try_send(Input::Answer { call, response }).is_err() {
                inbox_dropped
                    .counters
                    .inbox_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

/// A voter that has not answered a call within this is asked to be hedged: the next voter is
/// asked too (a frozen or partitioned leader would hold every call for its whole timeout,
/// longer than the master's lease). Liveness only: a voter that is not the leader answers
/// NOT_LEADER, and the controller fences stale commands whoever carries them.
const HEDGE_AFTER: Duration = Duration::from_millis(200);

/// Asks the voters, from the last one that answered as leader, until one answers as leader;
/// the next voter is asked as well whenever the ones asked have been silent for
/// [`HEDGE_AFTER`] (the first leader's answer wins). `None`: none did within `timeout` each.
async fn ask_voters(
    client: &RemotingClient,
    controllers: &[String],
    hint: &AtomicUsize,
    cmd: RemotingCommand,
    timeout: Duration,
) -> Option<Response> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let n = controllers.len();
    let first = hint.load(Ordering::Relaxed);
    let mut asked = 0;
    let mut pending = FuturesUnordered::new();
    let ask = |i: usize| {
        let at = (first + i) % n;
        let cmd = cmd.clone();
        async move { (at, client.invoke(&controllers[at], cmd, timeout).await) }
    };
    loop {
        if pending.is_empty() {
            if asked == n {
                return None;
            }
            pending.push(ask(asked));
            asked += 1;
        }
        let next = tokio::select! {
            next = pending.next() => next,
            () = tokio::time::sleep(HEDGE_AFTER), if asked < n => {
                pending.push(ask(asked));
                asked += 1;
                continue;
            }
        };
        let Some((at, answer)) = next else { continue };
        match answer {
            Ok(r) => match wire::decode_controller(&r) {
                Some(Response::NotLeader { .. }) | Some(Response::Busy) | None => {}
                Some(r) => {
                    hint.store(at, Ordering::Relaxed);
                    return Some(r);
                }
            },
            Err(e) => {
                tracing::debug!(controller = %controllers[at], error = %e, "controller call failed");
            }
        }
    }
}

/// What the controller sends on the connections the broker opened to it: a notice that the
/// group changed (NOTIFY_BROKER_ROLE_CHANGED) becomes [`Input::Notice`]; anything else is
/// answered REQUEST_CODE_NOT_SUPPORTED.
struct NoticeProcessor {
    group: String,
    inbox: mpsc::Sender<Input>,
}

impl Processor for NoticeProcessor {
    fn process(
        &self,
        _ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, shoal_net::ProcessResult> {
        let answer = match GroupNotice::group_of(&request) {
            Some(group) => {
                if group == self.group {
                    // A full inbox drops it: the next heartbeat brings the same news.
                    let _ = self.inbox.try_send(Input::Notice);
                }
                None
            }
            None => Some(shoal_net::request_code_not_supported(&request)),
        };
        Box::pin(std::future::ready(Ok(answer)))
    }
}

async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, shoal_store::StoreError> + Send + 'static,
) -> Result<T, shoal_store::StoreError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(shoal_store::StoreError::Io {
            op: "a replication write (its task failed)",
            path: std::path::PathBuf::new(),
            source: std::io::Error::other(e.to_string()),
        }),
    }
}
