//! A clustering push consumer with a concurrent listener: subscribes to a topic with a tag
//! expression and prints what it gets until Ctrl-C. Start several to watch the queues being
//! shared (`shoal group progress DemoConsumerGroup` shows the owner of each queue).
//!
//! ```text
//! cargo run -p shoal-client --example push_consumer -- 127.0.0.1:9876 DemoTopic "even || odd"
//! ```

use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{ConsumeFromWhere, PushConsumer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = args.next().unwrap_or_else(|| "DemoTopic".into());
    let expression = args.next().unwrap_or_else(|| "*".into());

    let consumer = PushConsumer::builder("DemoConsumerGroup")
        .namesrv(&namesrv)
        .subscribe(topic, expression)
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .consume_thread_max(8)
        .start(MessageListener::concurrently(|msgs, ctx| {
            for m in msgs {
                println!(
                    "{} {} tags={:?} keys={:?} reconsumed={} body={}",
                    ctx.message_queue,
                    m.msg_id(),
                    m.tags(),
                    m.keys(),
                    m.reconsume_times,
                    String::from_utf8_lossy(&m.body)
                );
            }
            // ReconsumeLater would send the messages back for a retry (then the DLQ).
            ConsumeConcurrentlyStatus::ConsumeSuccess
        }))
        .await?;
    println!("consumer {} started; Ctrl-C to stop", consumer.client_id());
    tokio::signal::ctrl_c().await?;
    // Commits offsets and hands the queues over to the rest of the group at once.
    consumer.shutdown().await;
    Ok(())
}
