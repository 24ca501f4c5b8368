//! What a client instance answers to the requests brokers send it: consumers registered by
//! group ([`ConsumerHandle`]), producer groups' transaction checkers, and the processor that
//! dispatches each request to them.

use crate::transaction_check::{answer_check, CheckListener};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_net::{request_code_not_supported, Processor, RequestContext};
use shoal_proto::body::{
    ConsumeMessageDirectlyResult, ConsumerData, ConsumerRunningInfo, ResetOffsetBody,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::ext::ConsumerIdsNotice;
use shoal_proto::header::*;
use shoal_proto::message::{decode_records, DecodeOptions, MessageExt};
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use tracing::{debug, warn};

/// What a consumer registered in an instance answers to the broker's requests.
pub(crate) trait ConsumerHandle: Send + Sync + 'static {
    /// The consumer's data for heartbeats.
    fn consumer_data(&self) -> ConsumerData;
    /// Topics the consumer subscribes (including its retry topic).
    fn subscribed_topics(&self) -> Vec<String>;
    /// Rebalance now (a timer, a notice, a route change).
    fn rebalance_now(&self);
    /// A subscribed topic's route changed (its queues, its brokers): rebalance now; a
    /// coordinated member also heartbeats its coordinator at once, so that the coordinator
    /// allocates the new queues without waiting for the next heartbeat.
    fn route_changed(&self) {
        self.rebalance_now();
    }
    /// NOTIFY_CONSUMER_IDS_CHANGED: the group's members or the topic's queues changed.
    /// Rebalances now; consumers that cache routes also refresh them (a Shoal broker notifies
    /// when a subscribed topic's queue count changes).
    fn group_changed(&self) {
        self.rebalance_now();
    }
    /// NOTIFY_CONSUMER_IDS_CHANGED that carried the group's member list (a Shoal broker, a
    /// membership change without a subscription change), from the broker at `broker_addr`:
    /// rebalance on that list without asking for it.
    fn members_changed(&self, broker_addr: &str, notice: ConsumerIdsNotice) {
        let _ = (broker_addr, notice);
        self.group_changed();
    }
    /// NOTIFY_LOCK_FREED (Shoal brokers): locks this consumer asked for are free.
    fn lock_freed(&self, queues: Vec<MessageQueue>) {
        let _ = queues;
    }
    /// GET_CONSUMER_RUNNING_INFO.
    fn running_info(&self) -> ConsumerRunningInfo;
    /// True when the consumer speaks coordinated mode (its classic heartbeat says so, so the
    /// broker does not count it as a classic-only member).
    fn speaks_coordinated(&self) -> bool {
        false
    }
    /// GROUP_ASSIGNMENT_CHANGED: the coordinator has news for this member.
    fn assignment_changed(&self) {
        self.rebalance_now();
    }
    /// RESET_CONSUMER_CLIENT_OFFSET.
    fn reset_offset(&self, topic: &str, offsets: BTreeMap<MessageQueue, i64>);
    /// CONSUME_MESSAGE_DIRECTLY.
    fn consume_directly(&self, msg: MessageExt)
        -> BoxFuture<'static, ConsumeMessageDirectlyResult>;
}

/// What a producer registered in an instance hears of its routes.
pub(crate) trait ProducerHandle: Send + Sync + 'static {
    /// A broker appeared in a route (added, or back after it left): it registered with the
    /// name server, so it is up; forget what the fault tolerance remembers of it.
    fn broker_appeared(&self, broker: &str);
}

/// Consumers by group; weak so that a consumer dropped without shutdown does not live on.
#[derive(Default)]
pub(super) struct Registry {
    consumers: Mutex<HashMap<String, Weak<dyn ConsumerHandle>>>,
    /// Producers of this instance (weak, as consumers).
    producers: Mutex<Vec<Weak<dyn ProducerHandle>>>,
    /// Transaction check listeners by producer group.
    checkers: Mutex<HashMap<String, CheckListener>>,
}

impl Registry {
    pub(super) fn add_consumer(&self, group: &str, handle: Weak<dyn ConsumerHandle>) {
        self.consumers.lock().insert(group.to_owned(), handle);
    }
    pub(super) fn remove_consumer(&self, group: &str) {
        self.consumers.lock().remove(group);
    }
    pub(super) fn add_checker(&self, group: &str, listener: CheckListener) {
        self.checkers.lock().insert(group.to_string(), listener);
    }
    pub(super) fn remove_checker(&self, group: &str) {
        self.checkers.lock().remove(group);
    }
    pub(super) fn add_producer(&self, handle: Weak<dyn ProducerHandle>) {
        let mut producers = self.producers.lock();
        producers.retain(|p| p.strong_count() > 0);
        producers.push(handle);
    }
    pub(super) fn broker_appeared(&self, broker: &str) {
        let producers: Vec<_> = self
            .producers
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for p in producers {
            p.broker_appeared(broker);
        }
    }
    fn checker(&self, group: &str) -> Option<CheckListener> {
        self.checkers.lock().get(group).cloned()
    }
    fn get(&self, group: &str) -> Option<Arc<dyn ConsumerHandle>> {
        self.consumers.lock().get(group).and_then(Weak::upgrade)
    }
    pub(super) fn all(&self) -> Vec<Arc<dyn ConsumerHandle>> {
        self.consumers
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// Handles NOTIFY_CONSUMER_IDS_CHANGED (40), RESET_CONSUMER_CLIENT_OFFSET (220),
/// GET_CONSUMER_RUNNING_INFO (307), CONSUME_MESSAGE_DIRECTLY (309), CHECK_TRANSACTION_STATE
/// and Shoal's notices (lock freed, assignment changed, and the name servers' route changes);
/// anything else is answered REQUEST_CODE_NOT_SUPPORTED.
pub(super) struct ClientProcessor {
    pub(super) registry: Arc<Registry>,
    pub(super) pending_routes: Arc<super::routes::PendingRoutes>,
}

impl Processor for ClientProcessor {
    fn process(
        &self,
        _ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, shoal_net::ProcessResult> {
        let registry = Arc::clone(&self.registry);
        let pending_routes = Arc::clone(&self.pending_routes);
        Box::pin(async move {
            match request.code {
                shoal_proto::route_watch::request_code::NOTIFY_ROUTE_CHANGED => {
                    let n: shoal_proto::route_watch::RouteChangedNotice =
                        request.decode_json_body()?;
                    pending_routes.add(n.topics);
                    Ok(None)
                }
                shoal_proto::coordinated::request_code::GROUP_ASSIGNMENT_CHANGED => {
                    let n: shoal_proto::coordinated::AssignmentChangedNotice =
                        request.decode_json_body()?;
                    if let Some(c) = registry.get(&n.group) {
                        c.assignment_changed();
                    }
                    Ok(None)
                }
                rc::NOTIFY_CONSUMER_IDS_CHANGED => {
                    let h: NotifyConsumerIdsChangedRequestHeader =
                        request.decode_command_header()?;
                    // A Shoal broker's notice to a Shoal member carries the member list; anything
                    // else (no body, or one we do not understand) means "ask".
                    let list = request
                        .body
                        .as_ref()
                        .and_then(|_| request.decode_json_body::<ConsumerIdsNotice>().ok());
                    debug!(group = %h.consumer_group, members = ?list.as_ref().map(|n| n.consumer_id_list.len()), "consumer ids changed");
                    if let Some(c) = registry.get(&h.consumer_group) {
                        match list {
                            Some(n) => {
                                c.members_changed(&_ctx.connection().peer_addr().to_string(), n)
                            }
                            None => c.group_changed(),
                        }
                    }
                    Ok(None)
                }
                shoal_proto::ext::request_code::NOTIFY_LOCK_FREED => {
                    let body: shoal_proto::ext::LockFreedBody = request.decode_json_body()?;
                    if let Some(c) = registry.get(&body.consumer_group) {
                        c.lock_freed(body.mq_set);
                    }
                    Ok(None)
                }
                rc::RESET_CONSUMER_CLIENT_OFFSET => {
                    let h: ResetOffsetRequestHeader = request.decode_command_header()?;
                    let body: ResetOffsetBody = match request.body {
                        Some(_) => request.decode_json_body()?,
                        None => ResetOffsetBody::default(),
                    };
                    if let Some(c) = registry.get(&h.group) {
                        c.reset_offset(&h.topic, body.offset_table);
                    }
                    Ok(None)
                }
                rc::GET_CONSUMER_RUNNING_INFO => {
                    let h: GetConsumerRunningInfoRequestHeader = request.decode_command_header()?;
                    Ok(Some(match registry.get(&h.consumer_group) {
                        Some(c) => RemotingCommand::response(resp::SUCCESS, None)
                            .with_json_body(&c.running_info())?,
                        None => RemotingCommand::response(
                            resp::SYSTEM_ERROR,
                            Some(format!(
                                "The Consumer Group <{}> not exist in this consumer",
                                h.consumer_group
                            )),
                        ),
                    }))
                }
                rc::CONSUME_MESSAGE_DIRECTLY => {
                    let h: ConsumeMessageDirectlyRequestHeader = request.decode_command_header()?;
                    let Some(c) = registry.get(&h.consumer_group) else {
                        return Ok(Some(RemotingCommand::response(
                            resp::SYSTEM_ERROR,
                            Some(format!(
                                "The Consumer Group <{}> not exist in this consumer",
                                h.consumer_group
                            )),
                        )));
                    };
                    let body = request.body.clone().unwrap_or_default();
                    let run = decode_records(&body, &DecodeOptions::client());
                    let Some(msg) = run.messages.into_iter().next() else {
                        return Ok(Some(RemotingCommand::response(
                            resp::SYSTEM_ERROR,
                            Some(format!(
                                "no message in the request body: {}",
                                run.error.map(|e| e.to_string()).unwrap_or_default()
                            )),
                        )));
                    };
                    let result = c.consume_directly(msg).await;
                    Ok(Some(
                        RemotingCommand::response(resp::SUCCESS, None).with_json_body(&result)?,
                    ))
                }
                rc::CHECK_TRANSACTION_STATE => {
                    // Answered with END_TRANSACTION on the same connection, off this task (the
                    // listener may take its time).
                    let conn = _ctx.connection().clone();
                    tokio::spawn(async move {
                        match answer_check(&request, |g| registry.checker(g)).await {
                            Ok(Some(end)) => {
                                if let Err(e) = conn.oneway(end).await {
                                    warn!(error = %e, "could not answer a transaction check");
                                }
                            }
                            Ok(None) => {}
                            Err(e) => warn!(error = %e, "bad CHECK_TRANSACTION_STATE"),
                        }
                    });
                    Ok(None)
                }
                _ => Ok(Some(request_code_not_supported(&request))),
            }
        })
    }
}
