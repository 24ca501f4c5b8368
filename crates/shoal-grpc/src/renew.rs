//! Receipts received with `auto_renew` (RocketMQ 5's push consumers): the endpoint keeps each
//! message's lease alive while its client is online and has not acked it, as RocketMQ's
//! proxy does. A renewal changes the receipt; the client still holds the one it was given, so
//! acks, invisibility changes and dead-lettering look up the latest receipt here
//! ([`Renewals::settle`]), under the same lock as the renewals: an ack never races a renewal
//! into a stale receipt.
//!
//! A lease is renewed [`RENEW_AHEAD`] before it ends, by [`RENEW_BY`], for at most
//! [`MAX_RENEW`] in all; when the client goes offline (Telemetry stream closed, terminated)
//! renewal stops and the lease lapses: the message is delivered again. At most
//! [`MAX_RENEWALS`] receipts are renewed at once; past that a receipt is not renewed (it
//! lapses at its own deadline) and [`Renewals::overflowed`] counts it.

use crate::session::Sessions;
use parking_lot::Mutex;
use shoal_broker::{BrokerApi, Refusal};
use shoal_proto::header::{PopExtraInfo, PopRetryFlag};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Lease of a message received with `auto_renew` (RocketMQ's `defaultInvisibleTimeMills`).
pub const AUTO_RENEW_INVISIBLE: Duration = Duration::from_secs(60);
/// Renew this long before the lease ends.
pub const RENEW_AHEAD: Duration = Duration::from_secs(10);
/// Each renewal's new lease.
pub const RENEW_BY: Duration = Duration::from_secs(60);
/// Renewals stop after this long (the message is then delivered again).
pub const MAX_RENEW: Duration = Duration::from_secs(3 * 3600);
/// Most receipts renewed at once.
pub const MAX_RENEWALS: usize = 100_000;

/// One message: (group, subscribed topic, retry flag, queue id, queue offset).
type Key = (String, String, u8, i32, i64);

fn key_of(group: &str, topic: &str, r: &PopExtraInfo) -> Key {
    let flag = match r.retry {
        PopRetryFlag::Normal => 0,
        PopRetryFlag::RetryV1 => 1,
        PopRetryFlag::RetryV2 => 2,
    };
    (
        group.to_string(),
        topic.to_string(),
        flag,
        r.queue_id,
        r.msg_queue_offset.unwrap_or(r.ck_queue_offset),
    )
}

#[derive(Debug)]
struct Renewal {
    client_id: String,
    /// The receipt time of the receipt the client was given (it names this delivery).
    given_pop_time: i64,
    receipt: PopExtraInfo,
    lease_end: Instant,
    since: Instant,
}

/// The receipts renewed. See the [module documentation](self).
#[derive(Debug, Default)]
pub struct Renewals {
    table: Mutex<HashMap<Key, Renewal>>,
    renewed: AtomicU64,
    overflowed: AtomicU64,
}

impl Renewals {
    /// Starts renewing a received message's lease for `client_id`.
    pub(crate) fn add(&self, client_id: &str, group: &str, topic: &str, receipt: &PopExtraInfo) {
        let mut t = self.table.lock();
        if t.len() >= MAX_RENEWALS {
            self.overflowed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let now = Instant::now();
        t.insert(
            key_of(group, topic, receipt),
            Renewal {
                client_id: client_id.to_string(),
                given_pop_time: receipt.pop_time,
                receipt: receipt.clone(),
                lease_end: now + Duration::from_millis(receipt.invisible_time.max(0) as u64),
                since: now,
            },
        );
    }

    /// Runs `f` with the message's latest receipt (the one given when it is not renewed
    /// here) and stops renewing it; under the renewals' lock, so no renewal runs meanwhile.
    pub(crate) fn settle<R>(
        &self,
        group: &str,
        topic: &str,
        given: &PopExtraInfo,
        f: impl FnOnce(&PopExtraInfo) -> R,
    ) -> R {
        let mut t = self.table.lock();
        let key = key_of(group, topic, given);
        match t.get(&key) {
            // The receipt the client was given for this delivery: the latest one counts.
            Some(r) if r.given_pop_time == given.pop_time => {
                let latest = r.receipt.clone();
                t.remove(&key);
                f(&latest)
            }
            // Another delivery's (an older one): as it is; this delivery stays renewed.
            _ => f(given),
        }
    }

    /// Receipts renewed so far.
    pub fn renewed(&self) -> u64 {
        self.renewed.load(Ordering::Relaxed)
    }

    /// Receipts not renewed because [`MAX_RENEWALS`] were.
    pub fn overflowed(&self) -> u64 {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// Receipts renewed now.
    pub fn len(&self) -> usize {
        self.table.lock().len()
    }

    /// True when none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One round: renews the leases ending within [`RENEW_AHEAD`] of online clients; forgets
    /// those of offline clients, those renewed for [`MAX_RENEW`], and those the broker
    /// refuses (acked or lapsed meanwhile).
    pub(crate) fn tick(&self, api: &BrokerApi, online: impl Fn(&str) -> bool) {
        let now = Instant::now();
        let mut t = self.table.lock();
        t.retain(|(group, topic, _, _, _), r| {
            if !online(&r.client_id) || now.duration_since(r.since) > MAX_RENEW {
                return false;
            }
            if r.lease_end.saturating_duration_since(now) > RENEW_AHEAD {
                return true;
            }
            let asked = Instant::now();
            match api.change_invisible(group, topic, &r.receipt, RENEW_BY.as_millis() as u64) {
                Ok(new) => {
                    r.lease_end = asked + Duration::from_millis(new.invisible_time.max(0) as u64);
                    r.receipt = new;
                    self.renewed.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(Refusal { remark, .. }) => {
                    tracing::debug!(%group, %topic, %remark, "lease not renewed");
                    false
                }
            }
        });
    }
}

/// Renews leases every second (and forgets clients gone offline).
pub(crate) fn start(
    api: BrokerApi,
    renewals: Arc<Renewals>,
    sessions: Arc<Sessions>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            renewals.tick(&api, |c| sessions.online(c));
            sessions.sweep();
        }
    })
}
