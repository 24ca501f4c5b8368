//! `MessagingService` on the broker's services. See the [crate documentation](crate).

use crate::auth::{self, CLIENT_ID};
use crate::convert::{self, ok, refused, status, Delivery};
use crate::pb::messaging_service_server::MessagingService;
use crate::pb::{self, Code};
use crate::polling::{self, MAX_LONG_POLLING};
use crate::renew::{Renewals, AUTO_RENEW_INVISIBLE};
use crate::session::Sessions;
use crate::PeerAddr;
use shoal_broker::{BrokerApi, Filter, PopQuery, TransactionCheck, TransactionChecker};
use shoal_proto::code::request_code as rc;
use shoal_proto::constants::perm as topic_perm;
use shoal_proto::header::{EndTransactionRequestHeader, PopExtraInfo};
use shoal_proto::message::sys_flag;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// PGROUP of the half messages of gRPC producers (RocketMQ 5 producers have no group): the
/// broker's checks of such transactions go to a gRPC producer of the topic.
pub(crate) const GRPC_PRODUCER_GROUP: &str = "GRPC_PRODUCER";

/// The long polling consumers are told to use unless the broker says otherwise.
const DEFAULT_ADVERTISED_LONG_POLLING: Duration = Duration::from_secs(30);
/// Most messages a receive asks (RocketMQ's POP batch limit).
const MAX_BATCH: i32 = 32;

type BoxStream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The endpoint's service.
#[derive(Debug, Clone)]
pub(crate) struct Service {
    api: BrokerApi,
    sessions: Arc<Sessions>,
    renewals: Arc<Renewals>,
    /// `host:port` routes name when the client names no endpoint.
    advertised: String,
    /// The long polling consumers are told to use.
    long_polling: Duration,
}

fn peer<T>(r: &Request<T>) -> SocketAddr {
    r.extensions()
        .get::<PeerAddr>()
        .map_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)), |p| p.0)
}

fn client_id<T>(r: &Request<T>) -> String {
    r.metadata()
        .get(CLIENT_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn name(r: &Option<pb::Resource>) -> &str {
    r.as_ref().map_or("", |r| r.name.as_str())
}

/// The receipt a handle holds (RocketMQ's `POP_CK` extra info).
fn receipt(handle: &str) -> Result<PopExtraInfo, pb::Status> {
    PopExtraInfo::parse(handle).map_err(|e| {
        status(
            Code::InvalidReceiptHandle,
            format!("receipt handle {handle:?}: {e}"),
        )
    })
}

/// The transaction id of a half message: its commit-log and queue offsets.
fn transaction_id(commit_log_offset: i64, queue_offset: i64) -> String {
    format!("{commit_log_offset:016X}{queue_offset:016X}")
}

fn parse_transaction_id(id: &str) -> Option<(i64, i64)> {
    if id.len() != 32 {
        return None;
    }
    let clo = i64::from_str_radix(id.get(..16)?, 16).ok()?;
    let qo = i64::from_str_radix(id.get(16..)?, 16).ok()?;
    Some((clo, qo))
}

fn now_ms() -> i64 {
    BrokerApi::wall_ms()
}

impl Service {
    pub(crate) fn new(
        api: BrokerApi,
        sessions: Arc<Sessions>,
        renewals: Arc<Renewals>,
        advertised: String,
    ) -> Self {
        Self {
            api,
            sessions,
            renewals,
            advertised,
            long_polling: DEFAULT_ADVERTISED_LONG_POLLING,
        }
    }

    /// The long polling consumers are told to use (within 1 s..=[`MAX_LONG_POLLING`]).
    pub(crate) fn with_long_polling(mut self, d: Duration) -> Self {
        self.long_polling = d.clamp(Duration::from_secs(1), MAX_LONG_POLLING);
        self
    }

    /// Sends the broker's checks of gRPC producers' transactions over their Telemetry
    /// streams.
    pub(crate) fn install_transaction_checker(&self) {
        let sessions = self.sessions.clone();
        let checker = TransactionChecker::new(move |check: TransactionCheck| {
            let Some(push) = sessions.producer_for(&check.message.topic) else {
                return false;
            };
            let id = transaction_id(check.commit_log_offset, check.queue_offset);
            let message = convert::to_pb(
                &check.message,
                Delivery {
                    topic: &check.message.topic,
                    receipt_handle: None,
                    invisible: None,
                    attempt: None,
                },
            );
            let cmd = pb::TelemetryCommand {
                status: Some(ok()),
                command: Some(
                    pb::telemetry_command::Command::RecoverOrphanedTransactionCommand(
                        pb::RecoverOrphanedTransactionCommand {
                            message: Some(message),
                            transaction_id: id,
                        },
                    ),
                ),
            };
            push.try_send(Ok(cmd)).is_ok()
        });
        if !self.api.set_transaction_checker(checker) {
            tracing::warn!("a transaction checker was set already: gRPC producers are not asked about their transactions");
        }
    }

    fn auth<T>(&self, r: &Request<T>, code: i32, needs: auth::Needs) -> Result<(), Status> {
        self.sessions.seen(&client_id(r));
        auth::check(&self.api, r.metadata(), peer(r).ip(), code, needs)
    }

    /// The endpoints routes name: the ones the client used, else the advertised address.
    fn endpoints(&self, asked: Option<&pb::Endpoints>) -> pb::Endpoints {
        if let Some(e) = asked.filter(|e| !e.addresses.is_empty()) {
            return e.clone();
        }
        let (host, port) = self
            .advertised
            .rsplit_once(':')
            .map_or((self.advertised.as_str(), 0), |(h, p)| {
                (h, p.parse().unwrap_or(0))
            });
        let scheme = if host.parse::<std::net::Ipv4Addr>().is_ok() {
            pb::AddressScheme::IPv4
        } else if host.parse::<std::net::Ipv6Addr>().is_ok() {
            pb::AddressScheme::IPv6
        } else {
            pb::AddressScheme::DomainName
        };
        pb::Endpoints {
            scheme: scheme as i32,
            addresses: vec![pb::Address {
                host: host.to_string(),
                port,
            }],
        }
    }

    fn broker(&self, endpoints: pb::Endpoints) -> pb::Broker {
        pb::Broker {
            name: self.api.config().broker_name.clone(),
            id: 0,
            endpoints: Some(endpoints),
        }
    }

    /// The group's retry policy as the consumers apply it (push consumers back off by it
    /// after a failed message): the group's `retryMaxTimes` + 1 attempts, the broker's delay
    /// levels as the backoff.
    fn consumer_backoff(&self, group: &str) -> pb::RetryPolicy {
        let retries = self.api.group_retry_max_times(group).unwrap_or(16);
        pb::RetryPolicy {
            max_attempts: retries.saturating_add(1).max(1),
            strategy: Some(pb::retry_policy::Strategy::CustomizedBackoff(
                pb::CustomizedBackoff {
                    next: self
                        .api
                        .delay_levels_ms()
                        .iter()
                        .map(|ms| convert::duration(Duration::from_millis(*ms)))
                        .collect(),
                },
            )),
        }
    }

    /// The server's settings for a client's: what its producer or consumer must use.
    fn settings(&self, client: &pb::Settings) -> pb::Settings {
        let mut out = client.clone();
        match &client.pub_sub {
            Some(pb::settings::PubSub::Publishing(p)) => {
                out.backoff_policy = Some(pb::RetryPolicy {
                    max_attempts: 3,
                    strategy: Some(pb::retry_policy::Strategy::ExponentialBackoff(
                        pb::ExponentialBackoff {
                            initial: Some(convert::duration(Duration::from_millis(10))),
                            max: Some(convert::duration(Duration::from_secs(1))),
                            multiplier: 2.0,
                        },
                    )),
                });
                out.pub_sub = Some(pb::settings::PubSub::Publishing(pb::Publishing {
                    topics: p.topics.clone(),
                    max_body_size: self.api.config().max_message_bytes.min(i32::MAX as usize)
                        as i32,
                    validate_message_type: true,
                }));
            }
            Some(pb::settings::PubSub::Subscription(s)) => {
                let group = name(&s.group).to_string();
                out.backoff_policy = Some(self.consumer_backoff(&group));
                out.pub_sub = Some(pb::settings::PubSub::Subscription(pb::Subscription {
                    group: s.group.clone(),
                    subscriptions: s.subscriptions.clone(),
                    fifo: Some(self.api.group_is_fifo(&group)),
                    receive_batch_size: Some(MAX_BATCH),
                    long_polling_timeout: Some(convert::duration(self.long_polling)),
                    lite_subscription_quota: None,
                    max_lite_topic_size: None,
                }));
            }
            None => {}
        }
        out.metric = Some(pb::Metric {
            on: false,
            endpoints: None,
        });
        out
    }

    /// One message of a send: checked against the topic's type, sent through the broker.
    async fn send_one(&self, from: SocketAddr, m: pb::Message) -> pb::SendResultEntry {
        let entry = |s: pb::Status, id: &str| pb::SendResultEntry {
            status: Some(s),
            message_id: id.to_string(),
            ..Default::default()
        };
        let id = m
            .system_properties
            .as_ref()
            .map_or(String::new(), |s| s.message_id.clone());
        let topic = name(&m.topic).to_string();
        let Some(config) = self.api.topic_or_auto_create(&topic) else {
            return entry(
                status(Code::TopicNotFound, format!("topic {topic} does not exist")),
                &id,
            );
        };
        let declared = convert::declared_type(&m);
        let topic_type = config.message_type();
        if !topic_type.accepts(declared) {
            return entry(
                status(
                    Code::MessagePropertyConflictWithType,
                    format!("topic {topic} takes {topic_type} messages, not {declared}"),
                ),
                &id,
            );
        }
        let group = m
            .system_properties
            .as_ref()
            .and_then(|s| s.message_group.clone());
        let mut out = match convert::from_pb(m, GRPC_PRODUCER_GROUP, now_ms()) {
            Ok(o) => o,
            Err(s) => return entry(s, &id),
        };
        // A message group goes to one queue (by the Java hash of its name), so it stays in
        // order.
        if let Some(g) = group.filter(|g| !g.is_empty()) {
            let n = config.write_queue_nums.max(1);
            out.queue_id =
                Some((shoal_proto::hash::java_string_hash(&g).unsigned_abs() % n as u32) as i32);
        }
        let transactional = out.transactional;
        match self.api.send(from, out).await {
            Ok(r) => pb::SendResultEntry {
                status: Some(ok()),
                message_id: id,
                transaction_id: if transactional {
                    transaction_id(r.commit_log_offset, r.queue_offset)
                } else {
                    String::new()
                },
                offset: r.queue_offset,
                recall_handle: String::new(),
            },
            Err(r) => entry(refused(&r), &id),
        }
    }

    /// The queues of a topic on this broker, as routes and assignments show them.
    fn queues(&self, topic: &str, endpoints: pb::Endpoints) -> Option<Vec<pb::MessageQueue>> {
        let c = self.api.topic_or_auto_create(topic)?;
        let accept: Vec<i32> = c
            .message_type()
            .accepted()
            .into_iter()
            .map(|t| convert::pb_type(t) as i32)
            .collect();
        let broker = self.broker(endpoints);
        let n = c.read_queue_nums.max(c.write_queue_nums);
        Some(
            (0..n)
                .map(|id| {
                    let read = id < c.read_queue_nums && topic_perm::is_readable(c.perm);
                    let write = id < c.write_queue_nums && topic_perm::is_writeable(c.perm);
                    let permission = match (read, write) {
                        (true, true) => pb::Permission::ReadWrite,
                        (true, false) => pb::Permission::Read,
                        (false, true) => pb::Permission::Write,
                        (false, false) => pb::Permission::None,
                    };
                    pb::MessageQueue {
                        topic: Some(convert::named(topic)),
                        id,
                        permission: permission as i32,
                        broker: Some(broker.clone()),
                        accept_message_types: accept.clone(),
                    }
                })
                .collect(),
        )
    }
}

#[tonic::async_trait]
impl MessagingService for Service {
    async fn query_route(
        &self,
        request: Request<pb::QueryRouteRequest>,
    ) -> Result<Response<pb::QueryRouteResponse>, Status> {
        let topic = name(&request.get_ref().topic).to_string();
        self.auth(&request, rc::GET_ROUTEINFO_BY_TOPIC, auth::any(&topic))?;
        let endpoints = self.endpoints(request.get_ref().endpoints.as_ref());
        let answer = match self.queues(&topic, endpoints) {
            Some(q) => pb::QueryRouteResponse {
                status: Some(ok()),
                message_queues: q,
            },
            None => pb::QueryRouteResponse {
                status: Some(status(
                    Code::TopicNotFound,
                    format!("topic {topic} does not exist"),
                )),
                message_queues: Vec::new(),
            },
        };
        Ok(Response::new(answer))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let group = name(&request.get_ref().group).to_string();
        let needs = if group.is_empty() {
            Vec::new()
        } else {
            auth::subscribe("", &group)
        };
        self.auth(&request, rc::HEART_BEAT, needs)?;
        Ok(Response::new(pb::HeartbeatResponse { status: Some(ok()) }))
    }

    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        let from = peer(&request);
        let mut topics: Vec<String> = request
            .get_ref()
            .messages
            .iter()
            .map(|m| name(&m.topic).to_string())
            .collect();
        topics.dedup();
        let needs = topics.iter().flat_map(|t| auth::publish(t)).collect();
        self.auth(&request, rc::SEND_MESSAGE_V2, needs)?;
        let messages = request.into_inner().messages;
        if messages.is_empty() {
            return Ok(Response::new(pb::SendMessageResponse {
                status: Some(status(Code::BadRequest, "no message to send")),
                entries: Vec::new(),
            }));
        }
        let mut entries = Vec::with_capacity(messages.len());
        for m in messages {
            entries.push(self.send_one(from, m).await);
        }
        let failed: Vec<&pb::Status> = entries
            .iter()
            .filter_map(|e| e.status.as_ref())
            .filter(|s| s.code != Code::Ok as i32)
            .collect();
        let overall = match failed.as_slice() {
            [] => ok(),
            [one] if entries.len() == 1 => (*one).clone(),
            _ => status(
                Code::MultipleResults,
                format!("{} of {} messages not sent", failed.len(), entries.len()),
            ),
        };
        Ok(Response::new(pb::SendMessageResponse {
            status: Some(overall),
            entries,
        }))
    }

    async fn query_assignment(
        &self,
        request: Request<pb::QueryAssignmentRequest>,
    ) -> Result<Response<pb::QueryAssignmentResponse>, Status> {
        let r = request.get_ref();
        let topic = name(&r.topic).to_string();
        let group = name(&r.group).to_string();
        self.auth(
            &request,
            rc::QUERY_ASSIGNMENT,
            auth::subscribe(&topic, &group),
        )?;
        let endpoints = self.endpoints(r.endpoints.as_ref());
        // The whole topic, queue −1: the broker chooses the queue of each receive.
        let answer = match self.queues(&topic, endpoints) {
            Some(q) => {
                let first = q.into_iter().next().map(|mut mq| {
                    mq.id = -1;
                    mq.permission = pb::Permission::ReadWrite as i32;
                    mq
                });
                pb::QueryAssignmentResponse {
                    status: Some(ok()),
                    assignments: first
                        .into_iter()
                        .map(|mq| pb::Assignment {
                            message_queue: Some(mq),
                        })
                        .collect(),
                }
            }
            None => pb::QueryAssignmentResponse {
                status: Some(status(
                    Code::TopicNotFound,
                    format!("topic {topic} does not exist"),
                )),
                assignments: Vec::new(),
            },
        };
        Ok(Response::new(answer))
    }

    type ReceiveMessageStream = BoxStream<pb::ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        request: Request<pb::ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, Status> {
        let client = client_id(&request);
        let r = request.get_ref();
        let group = name(&r.group).to_string();
        let mq = r.message_queue.clone().unwrap_or_default();
        let topic = name(&mq.topic).to_string();
        self.auth(&request, rc::POP_MESSAGE, auth::subscribe(&topic, &group))?;
        let (tx, rx) =
            mpsc::channel::<Result<pb::ReceiveMessageResponse, Status>>(MAX_BATCH as usize + 2);
        let stream: Self::ReceiveMessageStream = Box::pin(ReceiverStream::new(rx));
        let answer = |s: pb::Status| pb::ReceiveMessageResponse {
            content: Some(pb::receive_message_response::Content::Status(s)),
        };
        if client.is_empty() {
            let _ = tx
                .send(Ok(answer(status(
                    Code::ClientIdRequired,
                    "the x-mq-client-id header is missing",
                ))))
                .await;
            return Ok(Response::new(stream));
        }
        let filter = match r.filter_expression.as_ref() {
            Some(f) if f.r#type == pb::FilterType::Sql as i32 => Filter::Sql(f.expression.clone()),
            Some(f) if !f.expression.is_empty() => Filter::Tag(f.expression.clone()),
            _ => Filter::Tag("*".into()),
        };
        let auto_renew = r.auto_renew;
        let invisible = match (&r.invisible_duration, auto_renew) {
            (Some(d), _) => Duration::from_millis(convert::millis_of(d)),
            (None, true) => AUTO_RENEW_INVISIBLE,
            (None, false) => {
                let _ = tx
                    .send(Ok(answer(status(
                        Code::IllegalInvisibleTime,
                        "a receive without auto_renew needs an invisible duration",
                    ))))
                    .await;
                return Ok(Response::new(stream));
            }
        };
        if invisible < Duration::from_secs(1) || invisible > Duration::from_secs(12 * 3600) {
            let _ = tx
                .send(Ok(answer(status(
                    Code::IllegalInvisibleTime,
                    format!("invisible duration {invisible:?} is not within 1 s..12 h"),
                ))))
                .await;
            return Ok(Response::new(stream));
        }
        let remaining = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(polling::grpc_timeout);
        let poll = polling::polling_time(
            r.long_polling_timeout
                .as_ref()
                .map(|d| Duration::from_millis(convert::millis_of(d))),
            remaining,
            self.sessions.request_timeout(&client),
        );
        let query = PopQuery {
            group: group.clone(),
            topic: topic.clone(),
            // The broker picks the queue of every receive, whatever queue the request names,
            // as RocketMQ's proxy does (it pops the named broker's acting queue, id -1): the
            // clients name a queue of the route in turn, and a receive held on one drained
            // queue while the others have messages would wait out its long polling.
            queue_id: None,
            max: r.batch_size.clamp(1, MAX_BATCH) as usize,
            invisible_ms: invisible.as_millis() as u64,
            fifo: self.api.group_is_fifo(&group),
            filter,
            consumer: client.clone(),
        };
        let api = self.api.clone();
        let renewals = self.renewals.clone();
        let sessions = self.sessions.clone();
        tokio::spawn(async move {
            // The receiver left (stream dropped) or said it terminates: stop holding.
            let closed = tx.clone();
            let who = client.clone();
            let gone = move || closed.is_closed() || sessions.is_terminated(&who);
            let got = api.pop(query, poll, gone).await;
            let batch = match got {
                Ok(Some(b)) => b,
                Ok(None) => {
                    let _ = tx
                        .send(Ok(answer(status(
                            Code::TooManyRequests,
                            "too many receives are waiting (pop_max_polling)",
                        ))))
                        .await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Ok(answer(refused(&e)))).await;
                    return;
                }
            };
            if batch.messages.is_empty() {
                let _ = tx
                    .send(Ok(answer(status(Code::MessageNotFound, "no new message"))))
                    .await;
                return;
            }
            let mut delivered = tx.send(Ok(answer(ok()))).await.is_ok();
            for m in &batch.messages {
                if !delivered {
                    break;
                }
                let handle = m.receipt.to_extra_info();
                let msg = convert::to_pb(
                    &m.message,
                    Delivery {
                        topic: &topic,
                        receipt_handle: Some(handle),
                        invisible: Some(Duration::from_millis(batch.invisible_ms)),
                        attempt: Some(m.attempt),
                    },
                );
                delivered = tx
                    .send(Ok(pb::ReceiveMessageResponse {
                        content: Some(pb::receive_message_response::Content::Message(msg)),
                    }))
                    .await
                    .is_ok();
            }
            if !delivered {
                // The receiver left: its messages come back after the shortest lease.
                api.release(&batch);
                return;
            }
            if auto_renew {
                for m in &batch.messages {
                    renewals.add(&client, &group, &topic, &m.receipt);
                }
            }
            let _ = tx
                .send(Ok(pb::ReceiveMessageResponse {
                    content: Some(pb::receive_message_response::Content::DeliveryTimestamp(
                        convert::timestamp(batch.pop_time as i64),
                    )),
                }))
                .await;
        });
        Ok(Response::new(stream))
    }

    async fn ack_message(
        &self,
        request: Request<pb::AckMessageRequest>,
    ) -> Result<Response<pb::AckMessageResponse>, Status> {
        let r = request.get_ref();
        let group = name(&r.group).to_string();
        let topic = name(&r.topic).to_string();
        self.auth(&request, rc::ACK_MESSAGE, auth::subscribe(&topic, &group))?;
        let mut entries = Vec::with_capacity(r.entries.len());
        for e in &r.entries {
            let s = match receipt(&e.receipt_handle) {
                Err(s) => s,
                Ok(given) => self.renewals.settle(&group, &topic, &given, |latest| {
                    match self.api.ack(&group, &topic, latest) {
                        Ok(()) => ok(),
                        Err(why) => refused(&why),
                    }
                }),
            };
            entries.push(pb::AckMessageResultEntry {
                message_id: e.message_id.clone(),
                receipt_handle: e.receipt_handle.clone(),
                status: Some(s),
            });
        }
        let failed: Vec<&pb::Status> = entries
            .iter()
            .filter_map(|e| e.status.as_ref())
            .filter(|s| s.code != Code::Ok as i32)
            .collect();
        let overall = match failed.as_slice() {
            [] => ok(),
            [one] if entries.len() == 1 => (*one).clone(),
            _ => status(
                Code::MultipleResults,
                format!("{} of {} acks refused", failed.len(), entries.len()),
            ),
        };
        Ok(Response::new(pb::AckMessageResponse {
            status: Some(overall),
            entries,
        }))
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        request: Request<pb::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<pb::ForwardMessageToDeadLetterQueueResponse>, Status> {
        let r = request.get_ref();
        let group = name(&r.group).to_string();
        let topic = name(&r.topic).to_string();
        self.auth(
            &request,
            rc::CONSUMER_SEND_MSG_BACK,
            auth::subscribe(&topic, &group),
        )?;
        let s = match receipt(&r.receipt_handle) {
            Err(s) => s,
            Ok(given) => {
                let latest = self
                    .renewals
                    .settle(&group, &topic, &given, |latest| latest.clone());
                match self.api.dead_letter(&group, &topic, &latest).await {
                    Ok(()) => ok(),
                    Err(why) => refused(&why),
                }
            }
        };
        Ok(Response::new(pb::ForwardMessageToDeadLetterQueueResponse {
            status: Some(s),
        }))
    }

    type PullMessageStream = BoxStream<pb::PullMessageResponse>;

    async fn pull_message(
        &self,
        _request: Request<pb::PullMessageRequest>,
    ) -> Result<Response<Self::PullMessageStream>, Status> {
        let answer = pb::PullMessageResponse {
            content: Some(pb::pull_message_response::Content::Status(status(
                Code::Unsupported,
                "PullMessage is not supported by Shoal's gRPC endpoint: use a SimpleConsumer or PushConsumer (POP), or the remoting pull consumers",
            ))),
        };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(answer)]))))
    }

    async fn update_offset(
        &self,
        request: Request<pb::UpdateOffsetRequest>,
    ) -> Result<Response<pb::UpdateOffsetResponse>, Status> {
        let r = request.get_ref();
        let group = name(&r.group).to_string();
        let mq = r.message_queue.clone().unwrap_or_default();
        let topic = name(&mq.topic).to_string();
        self.auth(
            &request,
            rc::UPDATE_CONSUMER_OFFSET,
            auth::subscribe(&topic, &group),
        )?;
        let s = if self.api.topic(&topic).is_none() {
            status(Code::TopicNotFound, format!("topic {topic} does not exist"))
        } else if r.offset < 0 {
            status(Code::IllegalOffset, "an offset is 0 or more")
        } else {
            self.api
                .commit_consumer_offset(&group, &topic, mq.id, r.offset);
            ok()
        };
        Ok(Response::new(pb::UpdateOffsetResponse { status: Some(s) }))
    }

    async fn get_offset(
        &self,
        request: Request<pb::GetOffsetRequest>,
    ) -> Result<Response<pb::GetOffsetResponse>, Status> {
        let r = request.get_ref();
        let group = name(&r.group).to_string();
        let mq = r.message_queue.clone().unwrap_or_default();
        let topic = name(&mq.topic).to_string();
        self.auth(
            &request,
            rc::QUERY_CONSUMER_OFFSET,
            auth::subscribe(&topic, &group),
        )?;
        let answer = match self.api.consumer_offset(&group, &topic, mq.id) {
            Some(o) => pb::GetOffsetResponse {
                status: Some(ok()),
                offset: o,
            },
            None => pb::GetOffsetResponse {
                status: Some(status(
                    Code::OffsetNotFound,
                    format!("group {group} has no offset of {topic}#{}", mq.id),
                )),
                offset: 0,
            },
        };
        Ok(Response::new(answer))
    }

    async fn query_offset(
        &self,
        request: Request<pb::QueryOffsetRequest>,
    ) -> Result<Response<pb::QueryOffsetResponse>, Status> {
        let r = request.get_ref();
        let mq = r.message_queue.clone().unwrap_or_default();
        let topic = name(&mq.topic).to_string();
        self.auth(&request, rc::GET_MAX_OFFSET, auth::any(&topic))?;
        if self.api.topic(&topic).is_none() {
            return Ok(Response::new(pb::QueryOffsetResponse {
                status: Some(status(
                    Code::TopicNotFound,
                    format!("topic {topic} does not exist"),
                )),
                offset: 0,
            }));
        }
        let (min, max) = self.api.queue_bounds(&topic, mq.id);
        let offset = match pb::QueryOffsetPolicy::try_from(r.query_offset_policy) {
            Ok(pb::QueryOffsetPolicy::Beginning) => min as i64,
            Ok(pb::QueryOffsetPolicy::End) => max as i64,
            Ok(pb::QueryOffsetPolicy::Timestamp) => {
                let at = r.timestamp.as_ref().map_or(0, convert::millis_of_timestamp);
                self.api.offset_at_time(&topic, mq.id, at)
            }
            Err(_) => {
                return Ok(Response::new(pb::QueryOffsetResponse {
                    status: Some(status(Code::BadRequest, "unknown query offset policy")),
                    offset: 0,
                }))
            }
        };
        Ok(Response::new(pb::QueryOffsetResponse {
            status: Some(ok()),
            offset,
        }))
    }

    async fn end_transaction(
        &self,
        request: Request<pb::EndTransactionRequest>,
    ) -> Result<Response<pb::EndTransactionResponse>, Status> {
        let from = peer(&request);
        let r = request.get_ref();
        let topic = name(&r.topic).to_string();
        self.auth(&request, rc::END_TRANSACTION, auth::publish(&topic))?;
        let Some((clo, qo)) = parse_transaction_id(&r.transaction_id) else {
            return Ok(Response::new(pb::EndTransactionResponse {
                status: Some(status(
                    Code::InvalidTransactionId,
                    format!(
                        "transaction id {:?} is not one this broker gave",
                        r.transaction_id
                    ),
                )),
            }));
        };
        let commit_or_rollback = match pb::TransactionResolution::try_from(r.resolution) {
            Ok(pb::TransactionResolution::Commit) => sys_flag::TRANSACTION_COMMIT_TYPE,
            Ok(pb::TransactionResolution::Rollback) => sys_flag::TRANSACTION_ROLLBACK_TYPE,
            _ => sys_flag::TRANSACTION_NOT_TYPE,
        };
        let header = EndTransactionRequestHeader {
            topic: Some(topic),
            producer_group: GRPC_PRODUCER_GROUP.into(),
            tran_state_table_offset: qo,
            commit_log_offset: clo,
            commit_or_rollback,
            from_transaction_check: r.source == pb::TransactionSource::SourceServerCheck as i32,
            msg_id: r.message_id.clone(),
            transaction_id: Some(r.transaction_id.clone()),
            ..Default::default()
        };
        let s = match self.api.end_transaction(from, header).await {
            Ok(()) => ok(),
            Err(why) => refused(&why),
        };
        Ok(Response::new(pb::EndTransactionResponse {
            status: Some(s),
        }))
    }

    type TelemetryStream = BoxStream<pb::TelemetryCommand>;

    async fn telemetry(
        &self,
        request: Request<Streaming<pb::TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, Status> {
        self.auth(&request, rc::HEART_BEAT, Vec::new())?;
        let client = client_id(&request);
        if client.is_empty() {
            return Err(Status::invalid_argument(
                "the x-mq-client-id header is missing",
            ));
        }
        let (tx, rx) = mpsc::channel(64);
        let Some(stream_id) = self.sessions.open(&client, tx.clone()) else {
            return Err(Status::resource_exhausted(
                "too many Telemetry streams are open",
            ));
        };
        let mut inbound = request.into_inner();
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let cmd = tokio::select! {
                    c = inbound.message() => c,
                    _ = tx.closed() => break,
                };
                let cmd = match cmd {
                    Ok(Some(c)) => c,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(%client, error = %e, "Telemetry stream ended");
                        break;
                    }
                };
                me.sessions.seen(&client);
                // Answers to commands the endpoint does not send, and stack traces: nothing
                // to do.
                if let Some(pb::telemetry_command::Command::Settings(s)) = cmd.command {
                    me.sessions.settings(&client, stream_id, &s);
                    let answer = pb::TelemetryCommand {
                        status: Some(ok()),
                        command: Some(pb::telemetry_command::Command::Settings(me.settings(&s))),
                    };
                    if tx.send(Ok(answer)).await.is_err() {
                        break;
                    }
                }
            }
            me.sessions.close(&client, stream_id);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn notify_client_termination(
        &self,
        request: Request<pb::NotifyClientTerminationRequest>,
    ) -> Result<Response<pb::NotifyClientTerminationResponse>, Status> {
        self.auth(&request, rc::UNREGISTER_CLIENT, Vec::new())?;
        // Its auto-renewed receipts stop being renewed: their messages come back when their
        // leases end.
        self.sessions.terminated(&client_id(&request));
        Ok(Response::new(pb::NotifyClientTerminationResponse {
            status: Some(ok()),
        }))
    }

    async fn change_invisible_duration(
        &self,
        request: Request<pb::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<pb::ChangeInvisibleDurationResponse>, Status> {
        let r = request.get_ref();
        let group = name(&r.group).to_string();
        let topic = name(&r.topic).to_string();
        self.auth(
            &request,
            rc::CHANGE_MESSAGE_INVISIBLETIME,
            auth::subscribe(&topic, &group),
        )?;
        let invisible = r.invisible_duration.as_ref().map_or(0, convert::millis_of);
        let answer = match receipt(&r.receipt_handle) {
            Err(s) => pb::ChangeInvisibleDurationResponse {
                status: Some(s),
                receipt_handle: String::new(),
            },
            Ok(given) => self.renewals.settle(&group, &topic, &given, |latest| {
                match self.api.change_invisible(&group, &topic, latest, invisible) {
                    Ok(new) => pb::ChangeInvisibleDurationResponse {
                        status: Some(ok()),
                        receipt_handle: new.to_extra_info(),
                    },
                    Err(why) => pb::ChangeInvisibleDurationResponse {
                        status: Some(refused(&why)),
                        receipt_handle: String::new(),
                    },
                }
            }),
        };
        Ok(Response::new(answer))
    }

    async fn recall_message(
        &self,
        _request: Request<pb::RecallMessageRequest>,
    ) -> Result<Response<pb::RecallMessageResponse>, Status> {
        Ok(Response::new(pb::RecallMessageResponse {
            status: Some(status(
                Code::Unsupported,
                "RecallMessage is not supported by Shoal: a delayed message cannot be recalled",
            )),
            message_id: String::new(),
        }))
    }

    async fn sync_lite_subscription(
        &self,
        _request: Request<pb::SyncLiteSubscriptionRequest>,
    ) -> Result<Response<pb::SyncLiteSubscriptionResponse>, Status> {
        Ok(Response::new(pb::SyncLiteSubscriptionResponse {
            status: Some(status(
                Code::Unsupported,
                "lite topics are not supported by Shoal",
            )),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_ids_round_trip() {
        let id = transaction_id(123_456_789, 42);
        assert_eq!(id.len(), 32);
        assert_eq!(parse_transaction_id(&id), Some((123_456_789, 42)));
        assert_eq!(parse_transaction_id("nope"), None);
        assert_eq!(parse_transaction_id(&"G".repeat(32)), None);
    }
}
