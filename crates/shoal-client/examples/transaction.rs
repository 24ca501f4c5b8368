//! Transactional messages: each order is sent as a half message, the "database" write runs as
//! the local transaction, and the message is committed (or rolled back) with it. An order whose
//! outcome is not known when the local transaction returns is left to the broker's check,
//! answered from the same "database".
//!
//! ```text
//! shoal dev                      # or a name server + broker (Shoal or Apache RocketMQ)
//! cargo run -p shoal-client --example transaction -- 127.0.0.1:9876 DemoTxTopic
//! shoal consume DemoTxTopic --group demo-tx --from first    # sees order-0, 1, 3, 4 (not 2)
//! ```

use parking_lot::Mutex;
use shoal_client::{LocalTransactionState, Message, MessageExt, Producer, TransactionProducer};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The application's own records: order id -> written (true) or failed (false).
type Orders = Arc<Mutex<HashMap<String, bool>>>;

fn order_of(keys: Option<&str>) -> String {
    keys.unwrap_or_default().to_string()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = args.next().unwrap_or_else(|| "DemoTxTopic".into());
    let orders: Orders = Arc::default();

    // The broker asks about transactions left undecided: look the order up.
    let db = orders.clone();
    let producer = TransactionProducer::start(
        Producer::builder("DemoTxProducerGroup").namesrv(&namesrv),
        move |msg: MessageExt| {
            let written = db.lock().get(&order_of(msg.keys())).copied();
            println!("broker asks about {:?}: written = {written:?}", msg.keys());
            async move {
                match written {
                    Some(true) => LocalTransactionState::CommitMessage,
                    Some(false) => LocalTransactionState::RollbackMessage,
                    None => LocalTransactionState::Unknown,
                }
            }
        },
    )
    .await?;

    for i in 0..5 {
        let id = format!("order-{i}");
        let mut msg = Message::new(topic.clone(), format!("{id} created"));
        msg.set_keys([id.clone()])?;
        let db = orders.clone();
        let r = producer
            .send_in_transaction(msg, |_msg, _sent| async move {
                // The local transaction: order-2 fails; order-4's outcome is only known later.
                match i {
                    2 => {
                        db.lock().insert(id, false);
                        LocalTransactionState::RollbackMessage
                    }
                    4 => {
                        let db = db.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            db.lock().insert(id, true);
                        });
                        LocalTransactionState::Unknown
                    }
                    _ => {
                        db.lock().insert(id, true);
                        LocalTransactionState::CommitMessage
                    }
                }
            })
            .await?;
        println!(
            "{} -> {:?} (half message {} at {} offset {})",
            r.send.msg_id, r.local_state, r.send.msg_id, r.send.message_queue, r.send.queue_offset
        );
    }
    // Stay up until the broker has checked order-4 (after its transaction timeout, 6 s by
    // default, at its next check round: up to 30 s later by default).
    println!("waiting 45 s for the broker's check of order-4 ...");
    tokio::time::sleep(Duration::from_secs(45)).await;
    producer.shutdown().await;
    Ok(())
}
