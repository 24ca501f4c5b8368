//! The lite pull consumer: the application polls when it wants messages and commits when it
//! has processed them (auto commit off here).
//!
//! ```text
//! cargo run -p shoal-client --example lite_pull -- 127.0.0.1:9876 DemoTopic
//! ```

use shoal_client::lite_pull::{LitePullConfig, LitePullConsumer};
use shoal_client::ConsumeFromWhere;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = args.next().unwrap_or_else(|| "DemoTopic".into());

    let mut config = LitePullConfig::new("DemoLitePullGroup");
    config.client = shoal_client::ClientConfig::new(&namesrv);
    config.consume_from_where = ConsumeFromWhere::ConsumeFromFirstOffset;
    config.auto_commit = false;
    let consumer = LitePullConsumer::start(config).await?;
    consumer.subscribe(&topic, "*").await?;
    println!("assigned: {:?}", consumer.assignment());

    let mut idle = 0;
    while idle < 5 {
        let batch = consumer.poll(Duration::from_secs(1)).await;
        if batch.is_empty() {
            idle += 1;
            continue;
        }
        idle = 0;
        for m in &batch {
            println!(
                "{}#{} offset {}: {}",
                m.topic,
                m.queue_id,
                m.queue_offset,
                String::from_utf8_lossy(&m.body)
            );
        }
        // Processed: make it durable.
        consumer.commit_sync().await;
    }
    consumer.shutdown().await;
    Ok(())
}
