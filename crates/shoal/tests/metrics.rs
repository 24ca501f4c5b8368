//! `/metrics` scraped over HTTP from a live `shoal dev` under load: the values match what was
//! sent and consumed.

mod support;

use std::time::{Duration, Instant};
use support::{sample, Dev};

fn sum_matching(metrics: &str, prefix: &str, must_contain: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && must_contain.iter().all(|c| l.contains(c)))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

#[test]
fn metrics_match_what_was_sent_and_consumed() {
    let dev = Dev::start();
    let out = dev.cmd(&["topic", "create", "Load", "--queues", "4"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A consumer of 2000 messages and a producer of 2000 messages of 100 bytes, at once;
    // the endpoint is scraped while they run.
    let quiet = |args: &[&str]| support::Proc {
        child: std::process::Command::new(support::shoal())
            .args(args)
            .env("SHOAL_NAMESRV", &dev.namesrv)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    };
    let mut consumer = quiet(&[
        "consume", "Load", "--group", "loadg", "--from", "first", "--count", "2000", "--json",
    ]);
    let mut producer = quiet(&["send", "Load", "--size", "100", "--count", "2000"]);
    let start = Instant::now();
    let mut scrapes = 0;
    while !producer.wait_exit(Duration::from_millis(200)) {
        let (status, body) = dev.http_get("/metrics");
        assert_eq!(status, 200);
        assert!(body.contains("shoal_broker_request_seconds_bucket"));
        scrapes += 1;
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "producer did not finish"
        );
    }
    assert!(
        consumer.wait_exit(Duration::from_secs(60)),
        "consumer did not get 2000"
    );
    assert!(scrapes >= 1);

    let (_, m) = dev.http_get("/metrics");
    assert_eq!(
        sample(&m, "shoal_broker_topic_messages_in_total{topic=\"Load\"}"),
        Some(2000.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "shoal_broker_topic_bytes_in_total{topic=\"Load\"}"),
        Some(200_000.0)
    );
    let out = sample(&m, "shoal_broker_topic_messages_out_total{topic=\"Load\"}").unwrap_or(0.0);
    assert!(out >= 2000.0, "pulled {out} of 2000");
    assert_eq!(
        sample(
            &m,
            "shoal_broker_request_seconds_count{request=\"SEND_MESSAGE_V2\",code=\"310\",response=\"SUCCESS\"}"
        ),
        Some(2000.0)
    );
    // The consumer committed everything when it left: offsets add up, no lag.
    let committed = sum_matching(
        &m,
        "shoal_broker_group_committed_offset{",
        &["group=\"loadg\"", "topic=\"Load\""],
    );
    let broker = sum_matching(
        &m,
        "shoal_broker_queue_offset{",
        &["group=\"loadg\"", "topic=\"Load\""],
    );
    let lag = sum_matching(
        &m,
        "shoal_broker_group_lag{",
        &["group=\"loadg\"", "topic=\"Load\""],
    );
    assert_eq!(broker, 2000.0, "{m}");
    assert_eq!(committed, 2000.0, "{m}");
    assert_eq!(lag, 0.0);
    assert!(sample(&m, "shoal_broker_store_append_seconds_count").unwrap_or(0.0) >= 2000.0);
    assert!(sample(&m, "shoal_broker_disk_free_bytes{broker=\"broker-a\"}").unwrap_or(0.0) > 0.0);
    assert!(
        sample(&m, "shoal_broker_commit_log_bytes{broker=\"broker-a\"}").unwrap_or(0.0) > 200_000.0
    );
    // The name server's metrics are on the same port in shoal dev.
    assert_eq!(sample(&m, "shoal_namesrv_brokers"), Some(1.0), "{m}");
    assert!(m.contains("shoal_namesrv_request_seconds_count{request=\"GET_ROUTEINFO_BY_TOPIC\""));
}

#[test]
fn lag_and_owner_while_a_member_is_live() {
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", "Own", "--queues", "2"])
        .status
        .success());
    support::send(&dev, "Own", "own", 10);
    let mut g = support::Group::new("owng", "Own");
    g.join(&dev, "m1");
    g.wait_all(
        &(0..10).map(|i| format!("own-{i}")).collect::<Vec<_>>(),
        Duration::from_secs(30),
    );
    // The live member pulls both queues: it is their owner.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, m) = dev.http_get("/metrics");
        let owned = sum_matching(
            &m,
            "shoal_broker_group_queue_owner{",
            &["group=\"owng\"", "topic=\"Own\"", "@m1\""],
        );
        if owned == 2.0 {
            assert_eq!(
                sample(&m, "shoal_broker_group_members{group=\"owng\"}"),
                Some(1.0)
            );
            break;
        }
        assert!(Instant::now() < deadline, "no owner for both queues: {m}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // OpenMetrics on request.
    let (status, om) =
        support::http_request_accept(&dev.http, "/metrics", "application/openmetrics-text");
    assert_eq!(status, 200);
    assert!(om.trim_end().ends_with("# EOF"), "{om}");

    // Every family the broker and the name server export is in docs/operations.md, and every
    // metric the Grafana dashboard queries is one of the documented ones.
    let root = support::external::repo_root();
    let docs = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let (_, m) = dev.http_get("/metrics");
    let mut families = 0;
    for line in m.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let (Some(name), Some(kind)) = (it.next(), it.next()) else {
            continue;
        };
        let documented = if kind == "counter" && !name.ends_with("_total") {
            format!("`{name}_total`")
        } else {
            format!("`{name}`")
        };
        assert!(
            docs.contains(&documented),
            "{documented} ({kind}) is not documented in docs/operations.md"
        );
        families += 1;
    }
    assert!(families >= 30, "{m}");
    let grafana = std::fs::read_to_string(root.join("docs/grafana/shoal.json")).unwrap();
    let _: serde_json::Value = serde_json::from_str(&grafana).expect("the dashboard is JSON");
    for token in grafana.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if !token.starts_with("shoal_") {
            continue;
        }
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| token.strip_suffix(s))
            .unwrap_or(token);
        assert!(
            docs.contains(&format!("`{base}`")),
            "the Grafana dashboard queries {token}, which docs/operations.md does not list"
        );
    }
    g.leave("m1");
}
