//! The listener: accepts Kafka connections, reads size-prefixed request frames, answers them
//! in order (one request at a time per connection, as Kafka brokers do), and stops cleanly.

use crate::api;
use crate::config::KafkaConfig;
use crate::host::BrokerHandle;
use crate::request::{ConnInfo, Reply};
use crate::state::State;
use crate::KafkaError;
use bytes::BytesMut;
use shoal_group::classic_group::ClassicGroupDescription;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn, Instrument};

/// A running Kafka listener.
#[derive(Debug)]
pub struct KafkaServer {
    local_addr: SocketAddr,
    state: Arc<State>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl KafkaServer {
    /// Binds `config.listen_addr` and serves Kafka clients on the broker's store.
    pub async fn start(
        config: KafkaConfig,
        host: Arc<dyn BrokerHandle>,
    ) -> Result<KafkaServer, KafkaError> {
        config.validate()?;
        let listener = TcpListener::bind(&config.listen_addr)
            .await
            .map_err(|source| KafkaError::Bind {
                addr: config.listen_addr.clone(),
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| KafkaError::Bind {
            addr: config.listen_addr.clone(),
            source,
        })?;
        let state = Arc::new(State::new(config, host, local_addr));
        let (stop, stop_rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(accept_loop(listener, state.clone(), stop_rx.clone())),
            tokio::spawn(crate::groups::timer_loop(state.clone(), stop_rx)),
        ];
        info!(addr = %local_addr, advertised = %format!("{}:{}", state.advertised_host, state.advertised_port), "kafka listener started");
        Ok(KafkaServer {
            local_addr,
            state,
            stop,
            tasks,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This listener's node id and the `host:port` clients are told to connect to (what the
    /// broker registers with the name servers).
    pub fn advertised(&self) -> (i32, String) {
        (
            self.state.node_id,
            format!(
                "{}:{}",
                self.state.advertised_host, self.state.advertised_port
            ),
        )
    }

    /// Describes this listener's classic (JoinGroup/SyncGroup) groups for the broker's
    /// GROUP_DESCRIBE, so `shoal group describe` shows them: `None` for a group the listener
    /// does not hold (or holds without members), and for every group once the listener is
    /// gone (it holds the listener weakly).
    pub fn classic_group_describer(
        &self,
    ) -> impl Fn(&str) -> Option<ClassicGroupDescription> + Send + Sync + 'static {
        let state = Arc::downgrade(&self.state);
        move |group| {
            let s = state.upgrade()?;
            s.groups.describe(group, s.host.as_ref())
        }
    }

    /// The hosts (`/ip`, as Kafka writes them) of this listener's members of a consumer
    /// (KIP-848) group, by member id, for the broker's GROUP_DESCRIBE (the coordinator knows
    /// their client ids only). Empty once the listener is gone (it holds the listener weakly).
    pub fn consumer_group_member_hosts(
        &self,
    ) -> impl Fn(&str) -> Vec<(String, String)> + Send + Sync + 'static {
        let state = Arc::downgrade(&self.state);
        move |group| {
            state
                .upgrade()
                .map(|s| s.consumer_groups.member_hosts(group))
                .unwrap_or_default()
        }
    }

    /// What the broker calls when its coordinator asks a member of a consumer (KIP-848)
    /// group to heartbeat now (`Effect::Notify` for a member without a remoting connection):
    /// the member's held heartbeat answer goes out at once. Does nothing once the listener
    /// is gone (it holds the listener weakly).
    pub fn consumer_group_notifier(&self) -> impl Fn(&str, &str) + Send + Sync + 'static {
        let state = Arc::downgrade(&self.state);
        move |group, member| {
            if let Some(s) = state.upgrade() {
                s.consumer_groups.notify_member(group, member);
            }
        }
    }

    /// Counters of the listener.
    pub fn counters(&self) -> &crate::Counters {
        &self.state.counters
    }

    /// A Prometheus collector of the listener's counters (`shoal_kafka_*`, read at scrape
    /// time), to register in the process's registry. It holds the listener weakly and
    /// reports nothing once the listener is gone.
    pub fn metrics_collector(&self) -> crate::KafkaCollector {
        crate::KafkaCollector::new(Arc::downgrade(&self.state))
    }

    /// Stops accepting, closes every connection and the group timers.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        // Connection tasks see the stop signal and end on their own.
        for _ in 0..50 {
            if self.state.counters.connections_open.load(Ordering::Relaxed) == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        info!("kafka listener stopped");
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let mut next_id: u64 = 0;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "kafka accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let open = state
            .counters
            .connections_open
            .fetch_add(1, Ordering::AcqRel);
        if open >= state.config.max_connections {
            state
                .counters
                .connections_open
                .fetch_sub(1, Ordering::AcqRel);
            state
                .counters
                .limit_max_connections
                .fetch_add(1, Ordering::Relaxed);
            warn!(peer = %peer, limit = state.config.max_connections, "kafka connection refused: max_connections reached");
            drop(stream);
            continue;
        }
        state
            .counters
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        next_id += 1;
        let span = tracing::debug_span!("kafka_conn", id = next_id, peer = %peer);
        let st = state.clone();
        let stop = stop.clone();
        tokio::spawn(
            async move {
                serve(st.clone(), stream, peer, stop).await;
                st.counters.connections_open.fetch_sub(1, Ordering::AcqRel);
            }
            .instrument(span),
        );
    }
}

/// A held heartbeat answer that later requests of the connection do not wait for.
type Parked<'a> = (
    std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send + 'a>>,
    Arc<Notify>,
);

/// Resolves with a parked answer once it is ready (never while none is parked).
async fn parked_reply(parked: &mut Option<Parked<'_>>) -> Reply {
    match parked {
        Some((fut, _)) => {
            let r = fut.await;
            *parked = None;
            r
        }
        None => std::future::pending().await,
    }
}

/// Writes an answer; `false` when the connection must end.
async fn write_reply(state: &State, wr: &mut OwnedWriteHalf, reply: Reply) -> bool {
    match reply {
        Reply::Frame(bytes) => {
            if let Err(e) = wr.write_all(&bytes).await {
                debug!(error = %e, "kafka response could not be written (client gone)");
                return false;
            }
            true
        }
        Reply::Nothing => true,
        Reply::Close(reason) => {
            state
                .counters
                .requests_refused
                .fetch_add(1, Ordering::Relaxed);
            warn!(reason = %reason, "closing kafka connection");
            let _ = wr.shutdown().await;
            false
        }
    }
}

/// Reads one request frame (`None`: the connection ends).
async fn read_frame(state: &State, rd: &mut BufReader<OwnedReadHalf>) -> Option<BytesMut> {
    let len = match rd.read_i32().await {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
        Err(e) => {
            debug!(error = %e, "kafka connection read failed");
            return None;
        }
    };
    if len < 8 || len as usize > state.config.max_request_bytes {
        state
            .counters
            .requests_refused
            .fetch_add(1, Ordering::Relaxed);
        if len > 0 && len as usize > state.config.max_request_bytes {
            state
                .counters
                .limit_max_request_bytes
                .fetch_add(1, Ordering::Relaxed);
        }
        warn!(
            size = len,
            limit = state.config.max_request_bytes,
            "closing kafka connection: request size outside 8..=max_request_bytes"
        );
        return None;
    }
    let mut buf = BytesMut::zeroed(len as usize);
    if let Err(e) = rd.read_exact(&mut buf).await {
        debug!(error = %e, "kafka connection closed mid-request");
        return None;
    }
    Some(buf)
}

async fn serve(
    state: Arc<State>,
    stream: TcpStream,
    peer: SocketAddr,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let conn = ConnInfo {
        peer,
        answers_by_correlation_id: std::sync::atomic::AtomicBool::new(false),
    };
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    // A group heartbeat's answer may be held (docs/kafka.md, "Heartbeats"). Answers go out in
    // request order, so a held answer is released as soon as the connection's next request
    // arrives; a client that matches answers by correlation id (librdkafka, from ApiVersions)
    // instead gets later answers first while the held one stays parked.
    let mut parked: Option<Parked<'_>> = None;
    loop {
        let frame = {
            let read = read_frame(&state, &mut rd);
            tokio::pin!(read);
            loop {
                tokio::select! {
                    f = &mut read => break f,
                    reply = parked_reply(&mut parked) => {
                        if !write_reply(&state, &mut wr, reply).await {
                            return;
                        }
                    }
                    _ = stop.changed() => return,
                }
            }
        };
        let Some(buf) = frame else {
            return;
        };
        state.counters.requests.fetch_add(1, Ordering::Relaxed);
        let holdable = api::holdable(&buf);
        let next_request = holdable.then(|| Arc::new(Notify::new()));
        if holdable {
            // One held answer per connection: a parked one is answered first.
            if let Some((_, n)) = &parked {
                n.notify_one();
                let reply = tokio::select! {
                    r = parked_reply(&mut parked) => r,
                    _ = stop.changed() => return,
                };
                if !write_reply(&state, &mut wr, reply).await {
                    return;
                }
            }
        }
        let dispatch = api::dispatch(&state, buf.freeze(), &conn, next_request.clone());
        if let Some(n) = next_request.clone() {
            if conn.answers_by_correlation_id.load(Ordering::Relaxed) {
                parked = Some((Box::pin(dispatch), n));
                continue;
            }
        }
        tokio::pin!(dispatch);
        let mut watching = next_request.is_some();
        let reply = loop {
            tokio::select! {
                r = &mut dispatch => break r,
                reply = parked_reply(&mut parked) => {
                    if !write_reply(&state, &mut wr, reply).await {
                        return;
                    }
                }
                _ = stop.changed() => return,
                _ = rd.fill_buf(), if watching => {
                    watching = false;
                    if let Some(n) = &next_request {
                        n.notify_one();
                    }
                }
            }
        };
        if !write_reply(&state, &mut wr, reply).await {
            return;
        }
    }
}
