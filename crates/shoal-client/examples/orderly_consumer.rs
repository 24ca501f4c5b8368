//! Ordered messages: a producer sends the steps of each order to the queue its order id hashes
//! to, and an orderly consumer gets every order's steps in sequence (one batch at a time per
//! queue, under the broker's queue lock), also while consumers join and leave.
//!
//! ```text
//! cargo run -p shoal-client --example orderly_consumer -- 127.0.0.1:9876 OrderTopic
//! ```

use shoal_client::consumer::{ConsumeOrderlyStatus, MessageListener};
use shoal_client::{ConsumeFromWhere, Message, Producer, PushConsumer};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = args.next().unwrap_or_else(|| "OrderTopic".into());

    let consumer = PushConsumer::builder("OrderConsumerGroup")
        .namesrv(&namesrv)
        .subscribe(topic.clone(), "*")
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .suspend_current_queue_time(Duration::from_millis(500))
        .start(MessageListener::orderly(|msgs, ctx| {
            for m in msgs {
                println!(
                    "{} order={} step={}",
                    ctx.message_queue,
                    m.keys().unwrap_or_default(),
                    String::from_utf8_lossy(&m.body)
                );
            }
            // SuspendCurrentQueueAMoment retries the same messages after a pause, keeping order.
            ConsumeOrderlyStatus::Success
        }))
        .await?;

    let producer = Producer::builder("OrderProducerGroup")
        .namesrv(&namesrv)
        .start()
        .await?;
    for step in ["created", "paid", "shipped", "delivered"] {
        for order in 0..5 {
            let order_id = format!("order-{order}");
            let mut m = Message::new(topic.clone(), step);
            m.set_keys([order_id.as_str()])?;
            producer.send_ordered(m, &order_id).await?;
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    producer.shutdown().await;
    consumer.shutdown().await;
    Ok(())
}
