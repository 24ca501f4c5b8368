//! Sends messages with tags, keys and a user property: synchronously, asynchronously, oneway,
//! as a batch, and with a delay level.
//!
//! ```text
//! shoal dev                      # or a name server + broker of your own
//! shoal topic create DemoTopic   # (or let the broker auto-create it)
//! cargo run -p shoal-client --example producer -- 127.0.0.1:9876 DemoTopic
//! ```

use shoal_client::{Message, Producer};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = args.next().unwrap_or_else(|| "DemoTopic".into());

    let producer = Producer::builder("DemoProducerGroup")
        .namesrv(&namesrv)
        .send_timeout(Duration::from_secs(3))
        .retries(2)
        .start()
        .await?;

    for i in 0..10 {
        let mut msg = Message::new(topic.clone(), format!("hello {i}"));
        msg.set_tags(if i % 2 == 0 { "even" } else { "odd" })?;
        msg.set_keys([format!("order-{i}")])?;
        msg.put_property("source", "example")?;
        let r = producer.send(msg).await?;
        println!(
            "sent {} to {} at offset {}",
            r.msg_id, r.message_queue, r.queue_offset
        );
    }

    // Asynchronous: the send runs in the background; await the result when you need it.
    let pending = producer.send_async(Message::new(topic.clone(), "async hello"));
    println!("async send result: {:?}", pending.await?.status);

    // Oneway: no answer at all.
    producer
        .send_oneway(Message::new(topic.clone(), "fire and forget"))
        .await?;

    // A batch (one topic, no delay).
    let batch: Vec<Message> = (0..5)
        .map(|i| Message::new(topic.clone(), format!("batch {i}")))
        .collect();
    let r = producer.send_batch(batch).await?;
    println!("batch ids: {}", r.msg_id);

    // Delay level 2 (5 s with the broker's default levels).
    let mut delayed = Message::new(topic.clone(), "see you in 5 s");
    delayed.set_delay_level(2)?;
    producer.send(delayed).await?;

    producer.shutdown().await;
    Ok(())
}
