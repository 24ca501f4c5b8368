//! The delay levels' delivery and how a broker resumes it.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use super::*;

/// A broker over a store in `dir` whose level 1 is due after 1 ms.
fn broker(dir: &std::path::Path, rt: &tokio::runtime::Runtime) -> Arc<Shared> {
    let config = crate::config::BrokerConfig {
        data_dir: dir.to_path_buf(),
        namesrv_addrs: Vec::new(),
        announce_addr: Some("127.0.0.1:1".into()),
        commit_log_segment_bytes: 16 * 1024 * 1024,
        delay_levels: "1ms 1h".into(),
        ..Default::default()
    };
    let (store, _) = rt.block_on(crate::broker::open_store(&config)).unwrap();
    let delay_levels_ms = crate::config::parse_delay_levels(&config.delay_levels).unwrap();
    crate::broker::assemble(crate::broker::Assembly {
        config,
        store,
        delay_levels_ms,
        net_stats: Arc::new(shoal_net::NetStats::default()),
        namesrv_tls: None,
        clock: crate::clock::BrokerClock::starting_at(wall_ms()),
        sink: None,
    })
    .unwrap()
}

/// A message for topic `T` queue 0 parked in level 1's schedule queue.
fn scheduled(b: &Shared, uniq: Option<&str>) -> MessageExtBrokerInner {
    let mut props = shoal_proto::message::Properties::default();
    props.insert(property::REAL_TOPIC.into(), "T".into());
    props.insert(property::REAL_QID.into(), "0".into());
    props.insert(property::DELAY.into(), "1".into());
    if let Some(u) = uniq {
        props.insert(property::UNIQ_KEY.into(), u.into());
    }
    MessageExtBrokerInner {
        topic: SCHEDULE_TOPIC.to_string(),
        queue_id: 0,
        flag: 0,
        sys_flag: 0,
        born_timestamp: wall_ms(),
        born_host: b.store_host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: bytes::Bytes::from_static(b"x"),
        properties: encode_properties(&props).unwrap(),
        known: None,
    }
}

/// Delivered copies carry their entry's origin; a broker that lost its progress (an older
/// master's, or a file written before a crash) skips what its log shows delivered, stops
/// at the first entry not delivered, and delivers nothing twice.
#[test]
fn a_lost_progress_resumes_past_what_the_log_shows_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let b = broker(dir.path(), &rt);
    rt.block_on(async {
        crate::send::put(
            &b,
            (0..3)
                .map(|i| scheduled(&b, Some(&format!("u{i}"))))
                .collect(),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        while let Step::Progress = deliver_due(&b, 1).await.unwrap() {}
        assert_eq!(b.store.schedule_offset(1), Some(3));
        assert_eq!(b.store.max_offset("T", 0), 3);
        let got = b
            .store
            .get_messages("T", 0, 0, 8, 1 << 20, &|_| true)
            .unwrap();
        let copies = decode_records(&got.messages, &DecodeOptions::default());
        let origins: Vec<_> = copies
            .messages
            .iter()
            .map(|m| m.property(SCHEDULE_ORIGIN).unwrap().to_string())
            .collect();
        assert_eq!(origins, ["1:0", "1:1", "1:2"]);

        // Two more entries: one without a unique key, one after it; neither delivered.
        crate::send::put(&b, vec![scheduled(&b, None), scheduled(&b, Some("u4"))])
            .await
            .unwrap();
        // The progress written out was older than the deliveries.
        b.store.set_schedule_offset(1, 1);
        assert_eq!(skip_delivered(&b, 1).await.unwrap(), 2);
        assert_eq!(b.store.schedule_offset(1), Some(3));
        // Nothing more to skip: the next entry was never delivered.
        assert_eq!(skip_delivered(&b, 1).await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(5)).await;
        while let Step::Progress = deliver_due(&b, 1).await.unwrap() {}
        // Each entry stored once in its topic.
        assert_eq!(b.store.max_offset("T", 0), 5);
        assert_eq!(b.store.schedule_offset(1), Some(5));
    });
}
