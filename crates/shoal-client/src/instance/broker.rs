//! An instance's requests to one broker: pulls, offsets, consumer lists, queue locks and
//! messages sent back.

use crate::error::{ClientError, Result};
use shoal_group::member::MemberStamp;
use shoal_proto::body::{
    GetConsumerListByGroupResponseBody, LockBatchRequestBody, LockBatchResponseBody,
    UnlockBatchRequestBody,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::*;
use shoal_proto::message::{decode_records, DecodeOptions, MessageExt};
use shoal_proto::{MessageQueue, RemotingCommand, SerializeType};
use std::time::Duration;
use tracing::warn;

use super::{ok_or, ClientInstance, LockGrant, PullArgs, PullResult, PullStatus};

impl ClientInstance {
    /// Sends a request to a broker address and waits for the answer.
    ///
    /// # Errors
    /// Transport errors.
    /// On an established connection the request is sent at once and the future only waits
    /// for the answer (see [`RemotingClient::invoke`](shoal_net::RemotingClient::invoke)).
    pub fn invoke(
        &self,
        addr: &str,
        request: RemotingCommand,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<RemotingCommand>> + Send + 'static {
        use futures::FutureExt;
        self.inner
            .net
            .invoke(addr, self.signed(request), timeout)
            .map(|r| Ok(r?))
    }

    /// [`ClientInstance::invoke`] for a caller that reads the answer's header with a reader
    /// that takes a kept binary area too
    /// ([`RemotingClient::invoke_keeping_answer_area`](shoal_net::RemotingClient::invoke_keeping_answer_area)).
    pub fn invoke_keeping_answer_area(
        &self,
        addr: &str,
        request: RemotingCommand,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<RemotingCommand>> + Send + 'static {
        use futures::FutureExt;
        self.inner
            .net
            .invoke_keeping_answer_area(addr, self.signed(request), timeout)
            .map(|r| Ok(r?))
    }

    /// Sends a oneway request to a broker address.
    ///
    /// # Errors
    /// Transport errors.
    pub async fn invoke_oneway(&self, addr: &str, request: RemotingCommand) -> Result<()> {
        Ok(self
            .inner
            .net
            .invoke_oneway(addr, self.signed(request))
            .await?)
    }

    /// Readies a request for the wire: its header encoding is the configured one
    /// ([`ClientConfig::serialize_type`](crate::ClientConfig::serialize_type)), and it is
    /// signed with the configured ACL credentials (unsigned without them).
    pub fn signed(&self, mut request: RemotingCommand) -> RemotingCommand {
        // A request its maker marked binary stays binary (sends to a Shoal broker).
        let chosen = match request.serialize_type {
            SerializeType::RocketMq => SerializeType::RocketMq,
            SerializeType::Json => self.inner.config.serialize_type,
        };
        request.serialize_type = chosen.for_request_code(request.code);
        if let Some(c) = &self.inner.config.credentials {
            shoal_proto::acl::sign_request(&mut request, c);
        }
        request
    }

    async fn call_broker(
        &self,
        what: &'static str,
        mq: &MessageQueue,
        request: RemotingCommand,
    ) -> Result<RemotingCommand> {
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        let r = self
            .invoke(&addr, request, self.inner.config.rpc_timeout)
            .await?;
        ok_or(what, r)
    }

    /// CHECK_CLIENT_CONFIG (46) with every master of `sub`'s topic: the broker says whether it
    /// can serve the subscription (SQL92 needs its property filter and a selector that
    /// compiles).
    ///
    /// # Errors
    /// [`ClientError::Server`] with the broker's answer when one refuses; route errors.
    pub async fn check_client_config(
        &self,
        group: &str,
        sub: &shoal_proto::body::SubscriptionData,
    ) -> Result<()> {
        let route = self.route(&sub.topic).await?;
        let body = shoal_proto::body::CheckClientRequestBody {
            client_id: self.client_id().to_owned(),
            group: group.to_owned(),
            subscription_data: Some(sub.clone()),
        };
        for bd in &route.broker_datas {
            let Some(addr) = bd.broker_addrs.get(&shoal_proto::constants::MASTER_ID) else {
                continue;
            };
            let req = RemotingCommand::request(rc::CHECK_CLIENT_CONFIG).with_json_body(&body)?;
            let r = self
                .invoke(addr, req, self.inner.config.rpc_timeout)
                .await?;
            ok_or("CHECK_CLIENT_CONFIG", r)?;
        }
        Ok(())
    }

    /// Pulls messages from a queue's master.
    ///
    /// # Errors
    /// Transport errors, and [`ClientError::Server`] for codes other than SUCCESS,
    /// PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY and PULL_OFFSET_MOVED.
    pub async fn pull(&self, args: PullArgs<'_>) -> Result<PullResult> {
        let mq = args.mq;
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        let header = PullMessageRequestHeader {
            consumer_group: args.group.to_owned(),
            topic: mq.topic.clone(),
            queue_id: mq.queue_id,
            queue_offset: args.offset,
            max_msg_nums: args.max_msgs,
            sys_flag: args.sys_flag,
            commit_offset: args.commit_offset,
            suspend_timeout_millis: args.suspend_ms,
            subscription: args.subscription.map(str::to_owned),
            sub_version: args.sub_version,
            expression_type: Some(args.expression_type.to_owned()),
            max_msg_bytes: Some(262_144),
            rpc: RpcFields::with_broker_name(&mq.broker_name),
            ..Default::default()
        };
        let mut req = RemotingCommand::request_with_header(args.code, &header);
        self.stamp(args.group, &mut req);
        let r = self.invoke(&addr, req, args.timeout).await?;
        let status = match r.code {
            resp::SUCCESS => PullStatus::Found,
            resp::PULL_NOT_FOUND => PullStatus::NoNewMsg,
            resp::PULL_RETRY_IMMEDIATELY => PullStatus::NoMatchedMsg,
            resp::PULL_OFFSET_MOVED => PullStatus::OffsetIllegal,
            _ => return Err(ClientError::server("PULL_MESSAGE", &r)),
        };
        let h: PullMessageResponseHeader = r.decode_command_header()?;
        let mut messages = Vec::new();
        if status == PullStatus::Found {
            let body = r.body.clone().unwrap_or_default();
            let run = decode_records(&body, &DecodeOptions::client());
            if let Some(e) = &run.error {
                warn!(%mq, error = %e, decoded = run.messages.len(), "pull body decoded partially");
            }
            messages = run.messages;
            if let Some(delta) = h.offset_delta {
                for m in &mut messages {
                    m.queue_offset += delta;
                }
            }
        }
        Ok(PullResult {
            status,
            next_begin_offset: h.next_begin_offset,
            min_offset: h.min_offset,
            max_offset: h.max_offset,
            messages,
        })
    }

    /// QUERY_CONSUMER_OFFSET with `setZeroIfNotFound=false`: `None` when the group has no
    /// offset for the queue.
    ///
    /// # Errors
    /// Transport errors and unexpected codes.
    pub async fn query_consumer_offset(
        &self,
        group: &str,
        mq: &MessageQueue,
    ) -> Result<Option<i64>> {
        let req = RemotingCommand::request_with_header(
            rc::QUERY_CONSUMER_OFFSET,
            &QueryConsumerOffsetRequestHeader {
                consumer_group: group.to_owned(),
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                set_zero_if_not_found: Some(false),
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        let r = self
            .invoke(&addr, req, self.inner.config.rpc_timeout)
            .await?;
        match r.code {
            resp::SUCCESS => {
                let h: QueryConsumerOffsetResponseHeader = r.decode_command_header()?;
                Ok(Some(h.offset))
            }
            resp::QUERY_NOT_FOUND => Ok(None),
            _ => Err(ClientError::server("QUERY_CONSUMER_OFFSET", &r)),
        }
    }

    fn update_offset_req(&self, group: &str, mq: &MessageQueue, offset: i64) -> RemotingCommand {
        let mut req = RemotingCommand::request_with_header(
            rc::UPDATE_CONSUMER_OFFSET,
            &UpdateConsumerOffsetRequestHeader {
                consumer_group: group.to_owned(),
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                commit_offset: offset,
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        self.stamp(group, &mut req);
        req
    }

    /// Coordinated mode: the member id and epoch to stamp on this group's pulls, commits and
    /// lock requests (`None`: classic, unstamped).
    pub fn set_member_stamp(&self, group: &str, stamp: Option<MemberStamp>) {
        let mut m = self.inner.stamps.lock();
        match stamp {
            Some(s) => {
                m.insert(group.to_string(), s);
            }
            None => {
                m.remove(group);
            }
        }
    }

    fn stamp(&self, group: &str, req: &mut RemotingCommand) {
        if let Some(s) = self.inner.stamps.lock().get(group) {
            match &s.coordinator {
                Some(c) => shoal_proto::coordinated::stamp_from(req, &s.member_id, s.epoch, c),
                None => shoal_proto::coordinated::stamp(req, &s.member_id, s.epoch),
            }
        }
    }

    /// UPDATE_CONSUMER_OFFSET, waiting for the answer.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn update_consumer_offset(
        &self,
        group: &str,
        mq: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        self.call_broker(
            "UPDATE_CONSUMER_OFFSET",
            mq,
            self.update_offset_req(group, mq, offset),
        )
        .await
        .map(|_| ())
    }

    /// UPDATE_CONSUMER_OFFSET, oneway (the 5 s persistence).
    ///
    /// # Errors
    /// Transport errors.
    pub async fn update_consumer_offset_oneway(
        &self,
        group: &str,
        mq: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        self.invoke_oneway(&addr, self.update_offset_req(group, mq, offset))
            .await
    }

    /// GET_MAX_OFFSET: the next offset to be written in a queue.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn max_offset(&self, mq: &MessageQueue) -> Result<i64> {
        let req = RemotingCommand::request_with_header(
            rc::GET_MAX_OFFSET,
            &GetMaxOffsetRequestHeader {
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                committed: true,
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        let r = self.call_broker("GET_MAX_OFFSET", mq, req).await?;
        Ok(r.decode_command_header::<GetMaxOffsetResponseHeader>()?
            .offset)
    }

    /// GET_MIN_OFFSET: the smallest offset still in a queue.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn min_offset(&self, mq: &MessageQueue) -> Result<i64> {
        let req = RemotingCommand::request_with_header(
            rc::GET_MIN_OFFSET,
            &GetMinOffsetRequestHeader {
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        let r = self.call_broker("GET_MIN_OFFSET", mq, req).await?;
        Ok(r.decode_command_header::<GetMinOffsetResponseHeader>()?
            .offset)
    }

    /// SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after `timestamp_ms`.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn search_offset(&self, mq: &MessageQueue, timestamp_ms: i64) -> Result<i64> {
        let req = RemotingCommand::request_with_header(
            rc::SEARCH_OFFSET_BY_TIMESTAMP,
            &SearchOffsetRequestHeader {
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                timestamp: timestamp_ms,
                boundary_type: None,
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        let r = self
            .call_broker("SEARCH_OFFSET_BY_TIMESTAMP", mq, req)
            .await?;
        Ok(r.decode_command_header::<SearchOffsetResponseHeader>()?
            .offset)
    }

    /// GET_CONSUMER_LIST_BY_GROUP sent to one broker of `topic` (a random one, spec 7.3).
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn consumer_ids(&self, group: &str, topic: &str) -> Result<Vec<String>> {
        let route = self.route(topic).await?;
        let addrs: Vec<String> = route
            .broker_datas
            .iter()
            .filter_map(|b| b.master_addr().map(str::to_owned))
            .collect();
        if addrs.is_empty() {
            return Err(ClientError::NoRoute(topic.to_owned()));
        }
        let addr = addrs
            .get(rand::random::<usize>() % addrs.len())
            .cloned()
            .unwrap_or_default();
        let req = RemotingCommand::request_with_header(
            rc::GET_CONSUMER_LIST_BY_GROUP,
            &GetConsumerListByGroupRequestHeader {
                consumer_group: group.to_owned(),
                ..Default::default()
            },
        );
        let r = ok_or(
            "GET_CONSUMER_LIST_BY_GROUP",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )?;
        let body: GetConsumerListByGroupResponseBody = r.decode_json_body()?;
        Ok(body.consumer_id_list)
    }

    /// LOCK_BATCH_MQ on one broker: returns the queues locked for this client.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn lock_batch(
        &self,
        group: &str,
        broker_name: &str,
        topic: &str,
        mqs: Vec<MessageQueue>,
    ) -> Result<Vec<MessageQueue>> {
        let addr = self.find_master_addr(broker_name, topic).await?;
        let body = LockBatchRequestBody {
            client_id: self.inner.client_id.clone(),
            consumer_group: group.to_owned(),
            mq_set: mqs,
            only_this_broker: false,
        };
        let mut req = RemotingCommand::request(rc::LOCK_BATCH_MQ)
            .with_ext_fields(Default::default())
            .with_json_body(&body)?;
        self.stamp(group, &mut req);
        let r = ok_or(
            "LOCK_BATCH_MQ",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )?;
        let body: LockBatchResponseBody = r.decode_json_body()?;
        Ok(body.lock_ok_mq_set)
    }

    /// LOCK_BATCH_MQ asking for Shoal session locks (the broker must be a Shoal broker with
    /// session locks; an Apache RocketMQ broker ignores the extra fields and answers as
    /// [`ClientInstance::lock_batch`]).
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn lock_batch_session(
        &self,
        group: &str,
        broker_name: &str,
        topic: &str,
        mqs: Vec<MessageQueue>,
        orderly: bool,
        want_offsets: bool,
    ) -> Result<LockGrant> {
        let addr = self.find_master_addr(broker_name, topic).await?;
        let body = LockBatchRequestBody {
            client_id: self.inner.client_id.clone(),
            consumer_group: group.to_owned(),
            mq_set: mqs,
            only_this_broker: false,
        };
        let mut ext = shoal_proto::command::ExtFields::new();
        ext.insert(shoal_proto::ext::field::LEASE, "true");
        ext.insert(shoal_proto::ext::field::ORDERLY, orderly.to_string());
        if want_offsets {
            ext.insert(shoal_proto::ext::field::WANT_OFFSETS, "true");
        }
        let mut req = RemotingCommand::request(rc::LOCK_BATCH_MQ)
            .with_ext_fields(ext)
            .with_json_body(&body)?;
        self.stamp(group, &mut req);
        let r = ok_or(
            "LOCK_BATCH_MQ",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )?;
        let session = r
            .ext(shoal_proto::ext::field::SESSION)
            .and_then(|s| s.parse().ok());
        let committed = r
            .ext(shoal_proto::ext::field::COMMITTED_OFFSETS)
            .map(shoal_proto::ext::decode_queue_offsets)
            .unwrap_or_default();
        let body: LockBatchResponseBody = r.decode_json_body()?;
        Ok(LockGrant {
            locked: body.lock_ok_mq_set,
            session,
            committed,
        })
    }

    /// UNLOCK_BATCH_MQ of one queue carrying its final commit (a Shoal broker with
    /// `commitOnUnlock`: it stores the offset, fenced as any commit, then frees the lock),
    /// waiting for the answer.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn unlock_with_commit(
        &self,
        group: &str,
        mq: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        let body = UnlockBatchRequestBody {
            client_id: self.inner.client_id.clone(),
            consumer_group: group.to_owned(),
            mq_set: vec![mq.clone()],
            only_this_broker: false,
        };
        let mut ext = shoal_proto::command::ExtFields::new();
        ext.insert(
            shoal_proto::ext::field::COMMIT,
            shoal_proto::ext::encode_queue_offsets([(mq.topic.as_str(), mq.queue_id, offset)]),
        );
        let mut req = RemotingCommand::request(rc::UNLOCK_BATCH_MQ)
            .with_ext_fields(ext)
            .with_json_body(&body)?;
        self.stamp(group, &mut req);
        ok_or(
            "UNLOCK_BATCH_MQ",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )
        .map(|_| ())
    }

    /// UPDATE_CONSUMER_OFFSET of an offset that may be below the stored one on purpose (a seek
    /// back or an offset reset by a Shoal member), waiting for the answer.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn rewind_consumer_offset(
        &self,
        group: &str,
        mq: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        let mut req = self.update_offset_req(group, mq, offset);
        req.ext_fields
            .get_or_insert_with(Default::default)
            .insert(shoal_proto::ext::field::REWIND, "true");
        self.call_broker("UPDATE_CONSUMER_OFFSET", mq, req)
            .await
            .map(|_| ())
    }

    /// UNLOCK_BATCH_MQ on one broker, waiting for the answer.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn unlock_batch(
        &self,
        group: &str,
        broker_name: &str,
        topic: &str,
        mqs: Vec<MessageQueue>,
    ) -> Result<()> {
        let addr = self.find_master_addr(broker_name, topic).await?;
        let body = UnlockBatchRequestBody {
            client_id: self.inner.client_id.clone(),
            consumer_group: group.to_owned(),
            mq_set: mqs,
            only_this_broker: false,
        };
        let req = RemotingCommand::request(rc::UNLOCK_BATCH_MQ)
            .with_ext_fields(Default::default())
            .with_json_body(&body)?;
        ok_or(
            "UNLOCK_BATCH_MQ",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )
        .map(|_| ())
    }

    /// CONSUMER_SEND_MSG_BACK for a message that came from `broker_name`.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn send_back(
        &self,
        broker_name: &str,
        group: &str,
        msg: &MessageExt,
        delay_level: i32,
        max_reconsume_times: i32,
    ) -> Result<()> {
        let addr = self.find_master_addr(broker_name, &msg.topic).await?;
        let req = RemotingCommand::request_with_header(
            rc::CONSUMER_SEND_MSG_BACK,
            &ConsumerSendMsgBackRequestHeader {
                offset: msg.commit_log_offset,
                group: group.to_owned(),
                delay_level,
                origin_msg_id: Some(msg.msg_id().into_owned()),
                origin_topic: Some(msg.topic.clone()),
                unit_mode: false,
                max_reconsume_times: Some(max_reconsume_times),
                rpc: RpcFields::with_broker_name(broker_name),
            },
        );
        ok_or(
            "CONSUMER_SEND_MSG_BACK",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )
        .map(|_| ())
    }
}
