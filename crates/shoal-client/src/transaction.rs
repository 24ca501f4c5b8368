//! Transactional messages (RocketMQ's `TransactionMQProducer`): a half message is sent, the
//! local transaction runs, and the producer commits or rolls back with END_TRANSACTION; a
//! broker that gets no decision in time asks a producer of the group with
//! CHECK_TRANSACTION_STATE, answered by the producer's [`CheckListener`].
//!
//! ```no_run
//! use shoal_client::transaction::{LocalTransactionState, TransactionProducer};
//! use shoal_client::{Message, Producer};
//! # async fn demo() -> shoal_client::error::Result<()> {
//! let builder = Producer::builder("orders-tx").namesrv("127.0.0.1:9876");
//! let producer = TransactionProducer::start(builder, |_msg| async {
//!     // Look the order up in the database: it was written, so commit.
//!     LocalTransactionState::CommitMessage
//! })
//! .await?;
//! let r = producer
//!     .send_in_transaction(Message::new("Orders", "order-42"), |_msg, _sent| async {
//!         // Write the order in the same database transaction as the outbox row...
//!         LocalTransactionState::CommitMessage
//!     })
//!     .await?;
//! println!("{:?} {:?}", r.send.status, r.local_state);
//! producer.shutdown().await;
//! # Ok(()) }
//! ```

use crate::error::{ClientError, Result};
use crate::producer::{Producer, ProducerBuilder, SendResult, SendStatus};
pub use crate::transaction_check::{CheckListener, LocalTransactionState};
use shoal_proto::code::request_code as rc;
use shoal_proto::header::EndTransactionRequestHeader;
use shoal_proto::message::{property, Message, MessageExt, OffsetMsgId};
use shoal_proto::RemotingCommand;
use std::future::Future;
use std::sync::Arc;

/// What [`TransactionProducer::send_in_transaction`] did.
#[derive(Debug, Clone)]
pub struct TransactionSendResult {
    /// The half message's send result.
    pub send: SendResult,
    /// The local transaction's outcome (rollback when the half message was not stored).
    pub local_state: LocalTransactionState,
    /// Whether END_TRANSACTION could be sent (if not, the broker's check decides).
    pub end_sent: bool,
}

/// A producer of transactional messages.
#[derive(Debug)]
pub struct TransactionProducer {
    producer: Producer,
    /// Brokers this producer has heartbeated to since it first sent there: a broker asks
    /// only producers it knows from heartbeats about undecided transactions.
    announced: parking_lot::Mutex<std::collections::BTreeSet<String>>,
}

impl TransactionProducer {
    /// Starts a producer (configured by `builder`) whose group answers the broker's
    /// transaction checks with `check`.
    pub async fn start<F, Fut>(builder: ProducerBuilder, check: F) -> Result<Self>
    where
        F: Fn(MessageExt) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = LocalTransactionState> + Send + 'static,
    {
        let producer = builder.start().await?;
        let listener: CheckListener = Arc::new(move |m| Box::pin(check(m)));
        producer
            .instance()
            .register_transaction_checker(&producer.config().group, listener);
        Ok(Self {
            producer,
            announced: Default::default(),
        })
    }

    /// The underlying producer (for plain sends of the same group).
    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    /// Sends `msg` as a half message, runs `execute` (the local transaction), then commits or
    /// rolls back. A half message the broker did not store is rolled back without running
    /// `execute`. [`LocalTransactionState::Unknown`] leaves the decision to the broker's check.
    ///
    /// # Errors
    /// Those of [`Producer::send`] for the half message; delayed messages are refused
    /// ([`ClientError::InvalidArgument`]), as RocketMQ does.
    pub async fn send_in_transaction<F, Fut>(
        &self,
        mut msg: Message,
        execute: F,
    ) -> Result<TransactionSendResult>
    where
        F: FnOnce(Message, SendResult) -> Fut,
        Fut: Future<Output = LocalTransactionState>,
    {
        if msg
            .properties
            .get(property::DELAY)
            .is_some_and(|d| d.trim() != "0")
        {
            return Err(ClientError::InvalidArgument(
                "delayed messages cannot be transactional".into(),
            ));
        }
        let group = self.producer.config().group.clone();
        msg.properties
            .insert(property::TRAN_MSG.into(), "true".into());
        msg.properties
            .insert(property::PGROUP.into(), group.clone());
        let send = self.producer.send(msg.clone()).await?;
        self.announce(&send).await;
        let local_state = if send.status == SendStatus::SendOk {
            execute(msg, send.clone()).await
        } else {
            LocalTransactionState::RollbackMessage
        };
        let end_sent = match self.end_transaction(&group, &send, local_state).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(msg_id = %send.msg_id, error = %e, "END_TRANSACTION not sent; the broker's check will decide");
                false
            }
        };
        Ok(TransactionSendResult {
            send,
            local_state,
            end_sent,
        })
    }

    /// Heartbeats at once after the first send to a broker, so that it can ask this producer
    /// about the transaction without waiting for the periodic heartbeat.
    async fn announce(&self, send: &SendResult) {
        let first = self
            .announced
            .lock()
            .insert(send.message_queue.broker_name.clone());
        if first {
            self.producer.instance().heartbeat_all().await;
        }
    }

    async fn end_transaction(
        &self,
        group: &str,
        send: &SendResult,
        state: LocalTransactionState,
    ) -> Result<()> {
        let id = OffsetMsgId::parse(&send.offset_msg_id)?;
        let header = EndTransactionRequestHeader {
            topic: Some(send.message_queue.topic.clone()),
            producer_group: group.to_string(),
            tran_state_table_offset: send.queue_offset,
            commit_log_offset: id.commit_log_offset,
            commit_or_rollback: state.wire_value(),
            from_transaction_check: false,
            msg_id: send.msg_id.clone(),
            transaction_id: Some(send.msg_id.clone()),
            ..Default::default()
        };
        let inst = self.producer.instance();
        let addr = inst
            .find_master_addr(&send.message_queue.broker_name, &send.message_queue.topic)
            .await?;
        let mut req = RemotingCommand::request_with_header(rc::END_TRANSACTION, &header);
        req.set_oneway();
        inst.invoke_oneway(&addr, req).await
    }

    /// Stops the producer (its group no longer answers checks from this process).
    pub async fn shutdown(&self) {
        self.producer
            .instance()
            .unregister_transaction_checker(&self.producer.config().group);
        self.producer.shutdown().await;
    }
}
