//! Request dispatch: one [`BrokerProcessor`] routes each request code to its handler.

use crate::caller::Caller;
use crate::reply::worth_logging;
use crate::shared::Shared;
use futures::future::BoxFuture;
use shoal_net::{request_code_not_supported, Connection, ProcessResult, Processor, RequestContext};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::coordinated::request_code as crc;
use shoal_proto::RemotingCommand;
use std::sync::{Arc, OnceLock};

use crate::reply::{ok_json, Handled, Reject};

/// The ACL's answer to a request it refuses (NO_PERMISSION, as RocketMQ 5's broker), if ACL is
/// on and refuses it.
fn acl_refusal(b: &Shared, ctx: &RequestContext, req: &RemotingCommand) -> Option<RemotingCommand> {
    let acl = b.acl.as_ref()?;
    let access = shoal_proto::acl::AccessRequest::parse(req, ctx.peer_addr().ip());
    let denied = acl
        .check(&access, shoal_proto::acl::ADMIN_REQUEST_CODES)
        .err()?;
    let n = b
        .counters
        .acl_refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    if worth_logging(n) {
        tracing::warn!(peer = %ctx.peer_addr(), code = req.code, reason = %denied, refused = n, "request refused by the ACL");
    }
    Some(RemotingCommand::response(
        resp::NO_PERMISSION,
        Some(denied.0),
    ))
}

/// Whether a request changes the topic or subscription-group table or the POP request modes
/// (which a replica takes from its master's log only).
fn changes_tables(code: i32) -> bool {
    matches!(
        code,
        rc::UPDATE_AND_CREATE_TOPIC
            | rc::DELETE_TOPIC_IN_BROKER
            | rc::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
            | rc::DELETE_SUBSCRIPTIONGROUP
            | rc::SET_MESSAGE_REQUEST_MODE
    )
}

/// Whether a request needs the group's state a new master takes over from its log (the
/// coordinator, the transaction decisions, the queue locks it adopts): a replicated broker
/// answers it only as master, once it took over.
fn needs_master_state(code: i32) -> bool {
    matches!(
        code,
        rc::END_TRANSACTION
            | crc::GROUP_HEARTBEAT
            | crc::GROUP_LEAVE
            | rc::LOCK_BATCH_MQ
            | rc::UNLOCK_BATCH_MQ
    )
}

/// The broker's request processor.
#[derive(Debug)]
pub(crate) struct BrokerProcessor {
    inner: Arc<Shared>,
}

impl BrokerProcessor {
    /// A processor over the broker's shared state.
    pub(crate) fn new(inner: Arc<Shared>) -> Self {
        Self { inner }
    }

    /// Runs one request. Sends run inline; every other request runs boxed, so a send's
    /// future (allocated and moved once per request) is not as large as a pull's or the
    /// largest admin handler's.
    async fn dispatch(
        b: &Arc<Shared>,
        ctx: &RequestContext,
        req: &RemotingCommand,
    ) -> Option<Handled> {
        match req.code {
            rc::SEND_MESSAGE | rc::SEND_MESSAGE_V2 | rc::SEND_BATCH_MESSAGE => {
                Some(crate::send::send_message(b, &Caller::of(ctx), req).await)
            }
            // Boxed: a pull's future is twice a send's, and one pull answers up to 32 messages.
            rc::PULL_MESSAGE | rc::LITE_PULL_MESSAGE => {
                Some(Box::pin(crate::pull::pull_message(b, ctx, req)).await)
            }
            _ => {
                let answer = Box::pin(Self::dispatch_other(b, ctx, req)).await;
                match (b.replication.get(), &answer) {
                    (Some(r), Some(Ok(_))) if changes_tables(req.code) => {
                        Some(Self::tables_replicated(b, r, answer).await)
                    }
                    _ => answer,
                }
            }
        }
    }

    /// A change to the topic or subscription-group table of a replicated master is answered
    /// once a metadata round that carries it is acknowledged by the in-sync set (as a send
    /// is): a new master elected right after the answer has the topic.
    async fn tables_replicated(
        b: &Shared,
        r: &crate::replication::Replication,
        answer: Option<Handled>,
    ) -> Handled {
        let timeout = std::time::Duration::from_millis(b.config.replication.ack_timeout_ms);
        if r.metadata_replicated(timeout).await {
            return answer.unwrap_or(Ok(None));
        }
        Err(Reject::new(
            resp::FLUSH_SLAVE_TIMEOUT,
            "the change is made on the master; its in-sync set did not acknowledge it in time",
        ))
    }

    /// Every request but sends and pulls.
    async fn dispatch_other(
        b: &Arc<Shared>,
        ctx: &RequestContext,
        req: &RemotingCommand,
    ) -> Option<Handled> {
        if let (Some(r), true) = (b.replication.get(), changes_tables(req.code)) {
            if let Err(refusal) = r.refuse_table_change() {
                return Some(Err(refusal));
            }
        }
        if let (Some(r), true) = (b.replication.get(), needs_master_state(req.code)) {
            if let Err(refusal) = r.refuse_unless_serving() {
                return Some(Err(refusal));
            }
        }
        let caller = Caller::of(ctx);
        let caller = &caller;
        Some(match req.code {
            rc::END_TRANSACTION => crate::transaction::end::end_transaction(b, caller, req).await,
            rc::HEART_BEAT => {
                let answer = crate::client::heartbeat(&b.group_ctx(), caller, req);
                match answer {
                    // Groups and retry topics it auto-created are durable before the answer.
                    Ok(_) => match b.persist_tables().await {
                        Ok(()) => answer,
                        Err(e) => Err(e),
                    },
                    Err(_) => answer,
                }
            }
            rc::UNREGISTER_CLIENT => crate::client::unregister_client(&b.group_ctx(), caller, req),
            rc::GET_CONSUMER_LIST_BY_GROUP => crate::client::consumer_list(&b.group_ctx(), req),
            rc::LOCK_BATCH_MQ => crate::lease::lock_batch(&b.group_ctx(), caller, req),
            rc::UNLOCK_BATCH_MQ => crate::lease::unlock_batch(&b.group_ctx(), caller.conn_id, req),
            shoal_proto::ext::request_code::GET_BROKER_FEATURES => {
                crate::lease::features(&b.group_ctx())
            }
            rc::QUERY_CONSUMER_OFFSET => crate::offsets::query_consumer_offset(b, req),
            rc::UPDATE_CONSUMER_OFFSET => {
                crate::offsets::update_consumer_offset(b, caller, req).await
            }
            rc::GET_MAX_OFFSET => crate::offsets::get_max_offset(b, req),
            rc::GET_MIN_OFFSET => crate::offsets::get_min_offset(b, req),
            rc::SEARCH_OFFSET_BY_TIMESTAMP => crate::offsets::search_offset(b, req).await,
            rc::GET_EARLIEST_MSG_STORETIME => crate::offsets::earliest_store_time(b, req).await,
            rc::VIEW_MESSAGE_BY_ID => crate::offsets::view_message_by_id(b, req).await,
            rc::QUERY_MESSAGE => crate::offsets::query_message(b, req).await,
            rc::CONSUMER_SEND_MSG_BACK => crate::retry::consumer_send_msg_back(b, req).await,
            rc::CHECK_CLIENT_CONFIG => crate::filter::check_client_config(b, req),
            rc::UPDATE_AND_CREATE_TOPIC => crate::admin::create_topic(b, req).await,
            rc::DELETE_TOPIC_IN_BROKER => crate::admin::delete_topic(b, req).await,
            rc::GET_ALL_TOPIC_CONFIG => crate::admin::all_topic_config(b),
            rc::GET_TOPIC_CONFIG => crate::admin::topic_config(b, req),
            rc::GET_TOPIC_STATS_INFO => crate::admin::topic_stats(b, req).await,
            rc::GET_CONSUMER_CONNECTION_LIST => crate::admin::consumer_connections(b, req),
            rc::GET_CONSUME_STATS => crate::admin::consume_stats(b, req).await,
            rc::GET_CONSUMER_RUNNING_INFO => crate::admin::forward_to_client(b, req).await,
            rc::CONSUME_MESSAGE_DIRECTLY => crate::admin::consume_message_directly(b, req).await,
            rc::GET_BROKER_RUNTIME_INFO => crate::admin::runtime_info(b),
            rc::INVOKE_BROKER_TO_RESET_OFFSET => crate::admin::reset_offset(b, req).await,
            rc::QUERY_TOPIC_CONSUME_BY_WHO => crate::admin::topic_consumed_by(b, req),
            rc::GET_ALL_SUBSCRIPTIONGROUP_CONFIG => ok_json(&b.sub_groups.wrapper()),
            rc::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP => crate::admin::upsert_group(b, req),
            rc::DELETE_SUBSCRIPTIONGROUP => crate::admin::delete_group(b, req),
            rc::GET_ALL_CONSUMER_OFFSET => crate::admin::all_consumer_offsets(b),
            rc::POP_MESSAGE => crate::pop::remoting::pop_message(b, ctx, req).await,
            rc::ACK_MESSAGE => crate::pop::remoting::ack_message(b, req),
            rc::BATCH_ACK_MESSAGE => crate::pop::remoting::batch_ack_message(b, req),
            rc::PEEK_MESSAGE => crate::pop::remoting::peek_message(b, req),
            rc::CHANGE_MESSAGE_INVISIBLETIME => crate::pop::remoting::change_invisible_time(b, req),
            rc::NOTIFICATION => crate::pop::remoting::notification(b, ctx, req).await,
            rc::POLLING_INFO => crate::pop::remoting::polling_info(b),
            rc::QUERY_ASSIGNMENT => crate::pop::remoting::query_assignment(b, req),
            rc::SET_MESSAGE_REQUEST_MODE => crate::pop::remoting::set_message_request_mode(b, req),
            crc::GROUP_HEARTBEAT => {
                crate::coordinated::heartbeat(&b.group_ctx(), caller, req).await
            }
            crc::GROUP_LEAVE => crate::coordinated::leave(&b.group_ctx(), req),
            crc::GROUP_DESCRIBE => crate::coordinated::describe(
                &b.group_ctx(),
                |g| crate::pop::describe_group(b, g),
                req,
            ),
            crc::GROUP_HISTORY => crate::coordinated::history(&b.group_ctx(), req),
            code if crate::replication::is_peer_code(code) => match b.replication.get() {
                Some(r) => {
                    r.deliver(req);
                    Ok(None)
                }
                None => return None,
            },
            _ => return None,
        })
    }
}

impl Processor for BrokerProcessor {
    fn process(
        &self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult> {
        let b = Arc::clone(&self.inner);
        Box::pin(async move {
            if let Some(refusal) = acl_refusal(&b, &ctx, &request) {
                return Ok(Some(refusal));
            }
            let start = std::time::Instant::now();
            let response = match Self::dispatch(&b, &ctx, &request).await {
                None => Some(request_code_not_supported(&request)),
                Some(Ok(r)) => r,
                Some(Err(reject)) => {
                    Some(RemotingCommand::response(reject.code, Some(reject.remark)))
                }
            };
            let code = response
                .as_ref()
                .map_or(shoal_metrics::request::DEFERRED, |r| r.code);
            b.metrics
                .requests
                .observe(request.code, code, start.elapsed());
            Ok(response)
        })
    }

    fn end_of_batch(&self) {
        // Sends of this batch (and of other connections) waiting for the appender: one write.
        self.inner.store.drain_appends();
    }

    fn batch_waiting(&self) -> bool {
        self.inner.store.appends_queued()
    }

    /// Sends read their header from a kept binary area (`SendHeaderRef::of_request`): no map
    /// per send. Not with an ACL, which reads the request's signature fields from the map.
    fn keeps_binary_area(&self, code: i32) -> bool {
        matches!(
            code,
            rc::SEND_MESSAGE | rc::SEND_MESSAGE_V2 | rc::SEND_BATCH_MESSAGE
        ) && self.inner.acl.is_none()
    }

    fn on_connection_open(&self, _conn: &Connection) {
        self.inner.metrics.connections.inc();
        self.inner.metrics.connections_opened.inc();
    }

    fn on_connection_close(&self, conn: &Connection) {
        self.inner.metrics.connections.dec();
        self.inner.connection_closed(conn.id());
    }
}

/// A processor attached after the server is bound (the broker's state needs the bound
/// address). Until then every request is answered SYSTEM_BUSY, which clients retry.
#[derive(Default)]
pub(crate) struct LateProcessor {
    target: OnceLock<Arc<dyn Processor>>,
}

impl std::fmt::Debug for LateProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateProcessor")
            .field("attached", &self.target.get().is_some())
            .finish()
    }
}

impl LateProcessor {
    /// Attaches the real processor (once).
    pub(crate) fn set(&self, p: Arc<dyn Processor>) {
        let _ = self.target.set(p);
    }
}

impl Processor for LateProcessor {
    fn process(
        &self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult> {
        match self.target.get() {
            Some(p) => p.process(ctx, request),
            None => Box::pin(async move {
                Ok(Some(RemotingCommand::response(
                    resp::SYSTEM_BUSY,
                    Some("[REJECTREQUEST]broker is starting, try again later".into()),
                )))
            }),
        }
    }

    fn end_of_batch(&self) {
        if let Some(p) = self.target.get() {
            p.end_of_batch();
        }
    }

    fn batch_waiting(&self) -> bool {
        self.target.get().is_some_and(|p| p.batch_waiting())
    }

    fn keeps_binary_area(&self, code: i32) -> bool {
        self.target.get().is_some_and(|p| p.keeps_binary_area(code))
    }

    fn on_connection_open(&self, conn: &Connection) {
        if let Some(p) = self.target.get() {
            p.on_connection_open(conn);
        }
    }

    fn on_connection_close(&self, conn: &Connection) {
        if let Some(p) = self.target.get() {
            p.on_connection_close(conn);
        }
    }
}
