//! An idempotent consumer: delivery is at least once (a rebalance or a retry can deliver a
//! message twice), so the listener remembers the business keys (`KEYS`) it has processed and
//! skips repeats. The memory here is a bounded in-process window; a real service would keep
//! it next to its data (a unique index, an upsert, a processed-keys table).
//!
//! ```text
//! cargo run -p shoal-client --example idempotent_consumer -- 127.0.0.1:9876 DemoTopic
//! ```

use parking_lot::Mutex;
use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{ConsumeFromWhere, PushConsumer};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// The last `capacity` keys seen, oldest forgotten first.
struct SeenKeys {
    set: HashSet<String>,
    order: VecDeque<String>,
    capacity: usize,
}

impl SeenKeys {
    fn new(capacity: usize) -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// True the first time `key` is seen.
    fn first_time(&mut self, key: &str) -> bool {
        if self.set.contains(key) {
            return false;
        }
        self.set.insert(key.to_owned());
        self.order.push_back(key.to_owned());
        if self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = args.next().unwrap_or_else(|| "DemoTopic".into());

    let seen = Arc::new(Mutex::new(SeenKeys::new(100_000)));
    let consumer = PushConsumer::builder("IdempotentConsumerGroup")
        .namesrv(&namesrv)
        .subscribe(topic, "*")
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .start(MessageListener::concurrently(move |msgs, _| {
            for m in msgs {
                // The business key, else the message id (UNIQ_KEY).
                let key = m
                    .key_list()
                    .next()
                    .map(str::to_owned)
                    .unwrap_or_else(|| m.msg_id().into_owned());
                if !seen.lock().first_time(&key) {
                    println!("duplicate {key} skipped");
                    continue;
                }
                println!("processing {key}: {}", String::from_utf8_lossy(&m.body));
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        }))
        .await?;
    println!("consumer {} started; Ctrl-C to stop", consumer.client_id());
    tokio::signal::ctrl_c().await?;
    consumer.shutdown().await;
    Ok(())
}
