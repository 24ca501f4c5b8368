//! An instance's heartbeats to every broker, and what kind of broker each one is.

use crate::error::Result;
use shoal_proto::body::{HeartbeatData, ProducerData};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::*;
use shoal_proto::RemotingCommand;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, warn};

use super::{ok_or, BrokerKind, ClientInstance, COORDINATED_GROUPS_EXT};

impl ClientInstance {
    fn heartbeat_data(&self) -> HeartbeatData {
        HeartbeatData {
            client_id: self.inner.client_id.clone(),
            consumer_data_set: self
                .inner
                .registry
                .all()
                .iter()
                .map(|c| c.consumer_data())
                .collect(),
            producer_data_set: self
                .inner
                .producer_groups
                .lock()
                .iter()
                .map(|g| ProducerData {
                    group_name: g.clone(),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Makes the instance's heartbeats announce a Shoal session of this timeout (a Shoal
    /// broker then expires the client after that long without heartbeat, and its session
    /// locks last as long).
    pub fn set_session_timeout(&self, timeout: Option<Duration>) {
        *self.inner.session_timeout_ms.lock() = timeout.map(|d| d.as_millis() as u64);
    }

    fn heartbeat_request(&self) -> Option<RemotingCommand> {
        let data = self.heartbeat_data();
        if data.consumer_data_set.is_empty() && data.producer_data_set.is_empty() {
            return None;
        }
        let coordinated: Vec<String> = self
            .inner
            .registry
            .all()
            .iter()
            .filter(|c| c.speaks_coordinated())
            .map(|c| c.consumer_data().group_name)
            .collect();
        let mut ext = shoal_proto::command::ExtFields::new();
        if !coordinated.is_empty() {
            // Shoal brokers: these groups' members speak coordinated mode (Apache RocketMQ
            // ignores extFields it does not know).
            ext.insert(COORDINATED_GROUPS_EXT, coordinated.join(","));
        }
        if let Some(ms) = *self.inner.session_timeout_ms.lock() {
            ext.insert(shoal_proto::ext::field::SESSION_TIMEOUT_MS, ms.to_string());
        }
        RemotingCommand::request(rc::HEART_BEAT)
            .with_ext_fields(ext)
            .with_json_body(&data)
            .ok()
    }

    /// One HEART_BEAT to one broker; returns the Shoal sessions its answer names (group →
    /// session id; empty from an Apache RocketMQ broker).
    ///
    /// # Errors
    /// Transport errors and a refused heartbeat.
    pub async fn heartbeat_to(&self, addr: &str) -> Result<HashMap<String, u64>> {
        let Some(req) = self.heartbeat_request() else {
            return Ok(HashMap::new());
        };
        let r = ok_or(
            "HEART_BEAT",
            self.inner
                .net
                .invoke(addr, req, self.inner.config.rpc_timeout)
                .await?,
        )?;
        Ok(r.ext(shoal_proto::ext::field::SESSIONS)
            .map(shoal_proto::ext::decode_sessions)
            .unwrap_or_default()
            .into_iter()
            .collect())
    }

    /// What kind of broker `addr` is (asked once with GET_BROKER_FEATURES, then cached).
    ///
    /// # Errors
    /// Transport errors (nothing is cached then).
    pub async fn broker_kind(&self, addr: &str) -> Result<BrokerKind> {
        if let Some(k) = self.inner.kinds.lock().get(addr) {
            return Ok(k.clone());
        }
        let req = RemotingCommand::request(shoal_proto::ext::request_code::GET_BROKER_FEATURES)
            .with_ext_fields(Default::default());
        let r = self
            .inner
            .net
            .invoke(addr, req, self.inner.config.rpc_timeout)
            .await?;
        let kind = match r.code {
            resp::SUCCESS => BrokerKind::Shoal(r.decode_json_body()?),
            _ => BrokerKind::RocketMq,
        };
        self.inner
            .kinds
            .lock()
            .insert(addr.to_owned(), kind.clone());
        Ok(kind)
    }

    /// True when sends to `broker_name`'s master go with binary headers
    /// ([`ClientConfig::binary_sends_to_shoal`]): the master is known to be a Shoal broker. A
    /// master whose kind is not known yet is asked about in the background (once), and sends
    /// use the configured encoding meanwhile.
    pub(crate) fn binary_sends_to(&self, broker_name: &str) -> bool {
        self.send_target(broker_name).1
    }

    /// A send's target: `broker_name`'s master address, if known, and whether sends to it
    /// go with binary headers (as [`ClientInstance::binary_sends_to`]), found with one
    /// lookup of each table.
    pub(crate) fn send_target(&self, broker_name: &str) -> (Option<Arc<str>>, bool) {
        let Some(addr) = self.master_addr_shared(broker_name) else {
            return (None, false);
        };
        let binary = self.inner.config.binary_sends_to_shoal && self.is_shoal_broker(&addr);
        (Some(addr), binary)
    }

    /// Whether `addr` is known to be a Shoal broker; when its kind is not known, it is asked
    /// about in the background (once at a time) and this says no meanwhile.
    fn is_shoal_broker(&self, addr: &Arc<str>) -> bool {
        if let Some(k) = self.inner.kinds.lock().get(&**addr) {
            return matches!(k, BrokerKind::Shoal(_));
        }
        if self.inner.kinds_asked.lock().insert(Arc::clone(addr)) {
            let (this, addr) = (self.clone(), Arc::clone(addr));
            tokio::spawn(async move {
                if let Err(e) = this.broker_kind(&addr).await {
                    debug!(addr = %addr, error = %e, "broker kind not known; asked again later");
                }
                this.inner.kinds_asked.lock().remove(&addr);
            });
        }
        false
    }

    /// Every known broker master as (broker name, address), sorted.
    pub fn masters(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .inner
            .brokers
            .lock()
            .iter()
            .filter_map(|(name, ids)| {
                ids.get(&shoal_proto::constants::MASTER_ID)
                    .map(|a| (name.clone(), a.to_string()))
            })
            .collect();
        v.sort();
        v
    }

    /// Sends HEART_BEAT to every known master; returns how many answered SUCCESS.
    pub async fn heartbeat_all(&self) -> usize {
        let Some(req) = self.heartbeat_request() else {
            return 0;
        };
        let calls = self.master_addrs().into_iter().map(|addr| {
            let req = req.clone();
            async move {
                match self
                    .inner
                    .net
                    .invoke(&addr, self.signed(req), self.inner.config.rpc_timeout)
                    .await
                {
                    Ok(r) if r.code == resp::SUCCESS => true,
                    Ok(r) => {
                        warn!(broker = %addr, code = r.code, remark = ?r.remark, "heartbeat refused");
                        false
                    }
                    Err(e) => {
                        debug!(broker = %addr, error = %e, "heartbeat failed");
                        false
                    }
                }
            }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    /// Sends UNREGISTER_CLIENT for a producer or consumer group to every known master.
    pub async fn unregister_client(
        &self,
        producer_group: Option<&str>,
        consumer_group: Option<&str>,
    ) {
        let req = RemotingCommand::request_with_header(
            rc::UNREGISTER_CLIENT,
            &UnregisterClientRequestHeader {
                client_id: self.inner.client_id.clone(),
                producer_group: producer_group.map(str::to_owned),
                consumer_group: consumer_group.map(str::to_owned),
                ..Default::default()
            },
        );
        let calls = self.master_addrs().into_iter().map(|addr| {
            let req = req.clone();
            async move {
                if let Err(e) = self
                    .inner
                    .net
                    .invoke(&addr, self.signed(req), self.inner.config.rpc_timeout)
                    .await
                {
                    debug!(broker = %addr, error = %e, "unregister failed");
                }
            }
        });
        futures::future::join_all(calls).await;
    }
}
