//! `shoal topic`, `shoal group`, `shoal cluster`, `shoal message`, `shoal dlq`: administration
//! through the name server, with human tables by default and `--json` for scripts.

use crate::table::Table;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::json;
use shoal_client::admin::{AdminClient, GroupProgress, TopicSpec};
use shoal_proto::message::MessageExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Options every admin command takes.
#[derive(Debug, Args, Clone)]
pub(crate) struct Common {
    /// Name server addresses, separated by `;` or `,`.
    #[arg(
        long,
        env = "SHOAL_NAMESRV",
        default_value = "127.0.0.1:9876",
        global = true
    )]
    pub namesrv: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// ACL access key: every request is signed (with --secret-key).
    #[arg(long, env = "SHOAL_ACCESS_KEY", global = true)]
    pub access_key: Option<String>,
    /// ACL secret key.
    #[arg(long, env = "SHOAL_SECRET_KEY", global = true, hide_env_values = true)]
    pub secret_key: Option<String>,
    /// ACL security token (optional, sent and signed as SecurityToken).
    #[arg(
        long,
        env = "SHOAL_SECURITY_TOKEN",
        global = true,
        hide_env_values = true
    )]
    pub security_token: Option<String>,
    /// File with ACL credentials in RocketMQ's key-file format (`AccessKey=...`,
    /// `SecretKey=...`, optional `SecurityToken=...`, one per line); flags and environment win.
    #[arg(long, env = "SHOAL_CREDENTIALS_FILE", global = true)]
    pub credentials_file: Option<std::path::PathBuf>,
    /// Speak TLS to the name servers and brokers (with --tls-ca or --tls-insecure).
    #[arg(long, global = true)]
    pub tls: bool,
    /// PEM file with the CA certificates the servers' certificates must chain to (implies
    /// --tls).
    #[arg(long, env = "SHOAL_TLS_CA", global = true, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// TLS without verifying the servers' certificates: encrypted, not authenticated (implies
    /// --tls; for tests and trusted networks).
    #[arg(long, global = true)]
    pub tls_insecure: bool,
    /// Name the servers' certificates must carry (default: the host of each address).
    #[arg(
        long,
        env = "SHOAL_TLS_SERVER_NAME",
        global = true,
        value_name = "NAME"
    )]
    pub tls_server_name: Option<String>,
    /// How the client encodes request headers: `auto` (JSON, as RocketMQ's clients, except
    /// sends to a broker that said it is Shoal's, which go binary), `json` (always) or
    /// `rocketmq` (RocketMQ's binary headers for every request, decoded by Shoal's and Apache
    /// RocketMQ's servers; cheaper for both sides). Answers from a Shoal server come in the
    /// request's encoding.
    #[arg(
        long,
        env = "SHOAL_SERIALIZE_TYPE",
        global = true,
        value_name = "auto|json|rocketmq",
        default_value = "auto",
        ignore_case = true
    )]
    pub serialize_type: HeaderEncoding,
}

/// `--serialize-type`: the client's header encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum HeaderEncoding {
    /// JSON, but binary for sends to Shoal brokers.
    Auto,
    /// JSON for every request.
    Json,
    /// ROCKETMQ binary for every request (codes above 32767 still go as JSON).
    #[value(name = "rocketmq")]
    RocketMq,
}

impl HeaderEncoding {
    /// The encoding of requests other than sends to Shoal brokers.
    pub(crate) fn serialize_type(self) -> shoal_proto::SerializeType {
        match self {
            HeaderEncoding::RocketMq => shoal_proto::SerializeType::RocketMq,
            HeaderEncoding::Auto | HeaderEncoding::Json => shoal_proto::SerializeType::Json,
        }
    }

    /// [`shoal_client::ClientConfig::binary_sends_to_shoal`].
    pub(crate) fn binary_sends_to_shoal(self) -> bool {
        self != HeaderEncoding::Json
    }
}

impl Common {
    /// The ACL credentials from the flags, the environment or the credentials file.
    pub(crate) fn credentials(
        &self,
    ) -> anyhow::Result<Option<shoal_proto::acl::SessionCredentials>> {
        let mut ak = self.access_key.clone();
        let mut sk = self.secret_key.clone();
        let mut token = self.security_token.clone();
        if let Some(path) = &self.credentials_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!("cannot read credentials file {}: {e}", path.display())
            })?;
            for line in text.lines() {
                let line = line.trim();
                if line.starts_with('#') {
                    continue;
                }
                let Some((k, v)) = line.split_once('=') else {
                    continue;
                };
                let v = v.trim().to_string();
                match k.trim() {
                    "AccessKey" => ak = ak.or(Some(v)),
                    "SecretKey" => sk = sk.or(Some(v)),
                    "SecurityToken" => token = token.or(Some(v)),
                    _ => {}
                }
            }
        }
        match (ak, sk) {
            (None, None) => Ok(None),
            (Some(access_key), Some(secret_key)) => {
                Ok(Some(shoal_proto::acl::SessionCredentials {
                    access_key,
                    secret_key,
                    security_token: token,
                }))
            }
            _ => anyhow::bail!(
                "give both an access key and a secret key (--access-key, --secret-key)"
            ),
        }
    }

    /// TLS from `--tls`, `--tls-ca`, `--tls-insecure`, `--tls-server-name` (`None`:
    /// plaintext).
    pub(crate) fn client_tls(&self) -> anyhow::Result<Option<shoal_net::ClientTls>> {
        let on = self.tls || self.tls_ca.is_some() || self.tls_insecure;
        if !on {
            if self.tls_server_name.is_some() {
                anyhow::bail!("--tls-server-name needs --tls (with --tls-ca or --tls-insecure)");
            }
            return Ok(None);
        }
        let roots = match (&self.tls_ca, self.tls_insecure) {
            (Some(_), true) => anyhow::bail!("give either --tls-ca or --tls-insecure, not both"),
            (Some(ca), false) => shoal_net::TrustRoots::PemFile(ca.clone()),
            (None, true) => shoal_net::TrustRoots::Insecure,
            (None, false) => anyhow::bail!(
                "--tls needs --tls-ca FILE (the CA that signed the servers' certificates) or \
                 --tls-insecure"
            ),
        };
        Ok(Some(shoal_net::ClientTls::new(
            roots,
            self.tls_server_name.as_deref(),
        )?))
    }

    /// Client settings: name servers, credentials and TLS.
    pub(crate) fn client_config(&self) -> anyhow::Result<shoal_client::ClientConfig> {
        Ok(shoal_client::ClientConfig {
            credentials: self.credentials()?,
            tls: self.client_tls()?,
            serialize_type: self.serialize_type.serialize_type(),
            binary_sends_to_shoal: self.serialize_type.binary_sends_to_shoal(),
            ..shoal_client::ClientConfig::new(&self.namesrv)
        })
    }

    /// An admin client for these name servers, signing with the credentials if any.
    pub(crate) fn admin(&self) -> anyhow::Result<AdminClient> {
        let admin = AdminClient::new(
            self.namesrv
                .split([';', ','])
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        )
        .with_timeout(Duration::from_secs(5))
        .with_serialize_type(self.serialize_type.serialize_type());
        let admin = match self.client_tls()? {
            Some(tls) => admin.with_tls(tls),
            None => admin,
        };
        Ok(match self.credentials()? {
            Some(c) => admin.with_credentials(c),
            None => admin,
        })
    }
}

/// `shoal topic ...`
#[derive(Debug, Subcommand)]
pub(crate) enum TopicCmd {
    /// Create a topic on every broker (of a cluster with --cluster, or on chosen brokers with
    /// --brokers).
    Create(TopicCreate),
    /// Change a topic's queue counts or permission (same options as create).
    Update(TopicCreate),
    /// Delete a topic from its brokers and the name servers.
    Delete {
        /// Topic.
        topic: String,
    },
    /// List topics (system topics: retry, dead-letter, scheduling, ... only with --system).
    List {
        /// Also list system topics (`%RETRY%...`, `%DLQ%...`, `SCHEDULE_TOPIC_XXXX`, ...).
        #[arg(long)]
        system: bool,
    },
    /// Show where a topic's queues are.
    Route {
        /// Topic.
        topic: String,
    },
    /// Per queue min/max offsets and last store time.
    Status {
        /// Topic.
        topic: String,
    },
}

/// Options of `topic create` / `topic update`.
#[derive(Debug, Args)]
pub(crate) struct TopicCreate {
    /// Topic.
    pub topic: String,
    /// Queues per broker (read and write).
    #[arg(long, default_value_t = 8)]
    pub queues: i32,
    /// Only on the brokers of this cluster.
    #[arg(long, conflicts_with = "brokers")]
    pub cluster: Option<String>,
    /// Only on these brokers: names as `shoal cluster list` shows them, or `host:port`,
    /// separated by commas (RocketMQ's `updateTopic -b`). `topic update --brokers` changes
    /// the topic on those brokers only, and adds it to those that lack it.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub brokers: Vec<String>,
    /// Permission: 6 = read+write, 4 = read only, 2 = write only.
    #[arg(long, default_value_t = 6)]
    pub perm: i32,
    /// Mark the topic ordered.
    #[arg(long)]
    pub order: bool,
    /// RocketMQ 5's message type: NORMAL, FIFO, DELAY, TRANSACTION or MIXED. A typed topic
    /// refuses messages of another type (RocketMQ 5 clients check it before sending); a topic
    /// without a type takes every type.
    #[arg(long, value_name = "TYPE")]
    pub message_type: Option<String>,
    /// `topic create` only: change the topic if it exists already (as `topic update` does)
    /// instead of refusing.
    #[arg(long)]
    pub update: bool,
}

/// `shoal group ...`
#[derive(Debug, Subcommand)]
pub(crate) enum GroupCmd {
    /// Every consumer group known to the brokers with its members, mode, total lag and state
    /// (STABLE, REBALANCING, EMPTY), like `kafka-consumer-groups --describe --all-groups`.
    List,
    /// Delete a consumer group (subscription config and committed offsets) from every
    /// broker; refused while members are online.
    Delete {
        /// Consumer group.
        group: String,
        /// Keep the group's committed offsets (a group of that name created again resumes
        /// from them).
        #[arg(long)]
        keep_offsets: bool,
    },
    /// Per queue: broker offset, committed offset, the owner's consumed position, lag, owner
    /// and the store time of the last committed message.
    Progress {
        /// Consumer group.
        group: String,
        /// Only the queues of this topic.
        #[arg(long)]
        topic: Option<String>,
        /// Print again every this many seconds until Ctrl-C.
        #[arg(long, value_name = "SECONDS")]
        watch: Option<u64>,
    },
    /// The group's live connections and subscriptions.
    Connections {
        /// Consumer group.
        group: String,
    },
    /// Coordinated mode: mode, group epoch, assignor and members (member id, instance id,
    /// client id, member epoch, state, owned vs target queues, lag).
    Describe {
        /// Consumer group.
        group: String,
    },
    /// Coordinated mode: the group's last rebalances (time, cause, queues moved from/to, time
    /// until reconciled).
    History {
        /// Consumer group.
        group: String,
    },
    /// Move the group's offsets of a topic to a time, or to the earliest or latest message.
    ResetOffset {
        /// Consumer group.
        group: String,
        /// Topic.
        #[arg(long)]
        topic: String,
        /// `earliest`, `latest`, epoch milliseconds, RFC 3339 time, or a duration ago (`10m`).
        #[arg(long)]
        to: String,
        /// Show the plan without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `shoal message ...`
#[derive(Debug, Subcommand)]
pub(crate) enum MessageCmd {
    /// Messages of a topic with a key (the KEYS property), from the brokers' index.
    Query {
        /// Topic.
        #[arg(long)]
        topic: String,
        /// Message key.
        #[arg(long)]
        key: String,
        /// At most this many.
        #[arg(long, default_value_t = 64)]
        max: usize,
    },
    /// Show one message by its offset message id (or by message id with --topic).
    Get {
        /// Offset message id (32/56 hex chars) or, with --topic, the message id (UNIQ_KEY).
        id: String,
        /// Topic, to look up by message id.
        #[arg(long)]
        topic: Option<String>,
    },
}

/// `shoal dlq ...`
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCmd {
    /// List the messages of a group's dead-letter queue.
    List {
        /// Consumer group.
        #[arg(long)]
        group: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
    /// Send dead-letter messages back to the topic they came from.
    Resend {
        /// Consumer group.
        #[arg(long)]
        group: String,
        /// Only this message id (UNIQ_KEY); all of them when absent.
        #[arg(long)]
        id: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        max: usize,
    },
}

fn fmt_time(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let t = UNIX_EPOCH + Duration::from_millis(ms as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Parses `earliest`, `latest`, epoch ms, RFC 3339, or a duration ago (`10m`, `2h 30m`) into
/// the timestamp the broker expects (`-1` = latest, `0` = earliest).
pub(crate) fn parse_time(s: &str) -> anyhow::Result<i64> {
    let s = s.trim();
    match s {
        "earliest" | "first" => return Ok(0),
        "latest" | "last" => return Ok(-1),
        _ => {}
    }
    if let Ok(ms) = s.parse::<i64>() {
        if ms < 0 {
            bail!("time {s:?} is negative");
        }
        return Ok(ms);
    }
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0));
    }
    if let Ok(d) = humantime::parse_duration(s.trim_end_matches(" ago")) {
        return Ok((now_ms() - d.as_millis() as i64).max(0));
    }
    bail!("cannot read time {s:?}: use earliest, latest, epoch milliseconds, an RFC 3339 time or a duration ago such as 10m")
}

fn message_json(m: &MessageExt) -> serde_json::Value {
    json!({
        "msgId": m.msg_id(),
        "offsetMsgId": m.offset_msg_id(),
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "tags": m.tags(),
        "keys": m.keys(),
        "reconsumeTimes": m.reconsume_times,
        "bornTimestamp": m.born_timestamp,
        "storeTimestamp": m.store_timestamp,
        "bornHost": m.born_host.to_string(),
        "storeHost": m.store_host.to_string(),
        "properties": m.properties,
        "body": String::from_utf8_lossy(&m.body),
    })
}

/// `shoal topic`.
pub(crate) async fn topic(common: &Common, cmd: TopicCmd) -> anyhow::Result<()> {
    let admin = common.admin()?;
    // `topic update` is `topic create --update`.
    let cmd = match cmd {
        TopicCmd::Update(c) => TopicCmd::Update(TopicCreate { update: true, ..c }),
        other => other,
    };
    match cmd {
        TopicCmd::Create(c) | TopicCmd::Update(c) => {
            if c.queues <= 0 {
                bail!("--queues must be at least 1");
            }
            match admin.topic_route(&c.topic).await {
                Ok(route) => {
                    let now: Vec<String> = route
                        .queue_datas
                        .iter()
                        .map(|q| format!("{} queues on {}", q.write_queue_nums, q.broker_name))
                        .collect();
                    if !c.update {
                        bail!(
                            "topic {} exists already ({}); use `shoal topic update` (or --update) to change it",
                            c.topic,
                            now.join(", ")
                        );
                    }
                    for q in &route.queue_datas {
                        if !c.brokers.is_empty() && !c.brokers.contains(&q.broker_name) {
                            continue;
                        }
                        let had = q.write_queue_nums.max(q.read_queue_nums);
                        if c.queues < had {
                            eprintln!(
                                "warning: topic {} shrinks from {had} to {} queues on {}: messages in queues {}..{} are no longer served to consumers (they come back if the count grows again)",
                                c.topic, c.queues, q.broker_name, c.queues, had - 1
                            );
                        }
                    }
                }
                Err(shoal_client::admin::AdminError::TopicNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            let message_type = match c.message_type.as_deref() {
                None => None,
                Some(t) => Some(shoal_proto::body::TopicMessageType::parse(t).ok_or_else(
                    || {
                        anyhow::anyhow!(
                            "--message-type {t:?}: use NORMAL, FIFO, DELAY, TRANSACTION or MIXED"
                        )
                    },
                )?),
            };
            let spec = TopicSpec {
                perm: c.perm,
                order: c.order,
                message_type,
                ..TopicSpec::new(&c.topic, c.queues)
            };
            let brokers = if c.brokers.is_empty() {
                admin.create_topic(&spec, c.cluster.as_deref()).await?
            } else {
                admin.create_topic_on(&spec, &c.brokers).await?
            };
            if common.json {
                println!(
                    "{}",
                    json!({"topic": c.topic, "queues": c.queues, "brokers": brokers,
                        "messageType": message_type.map(|t| t.name())})
                );
            } else {
                println!(
                    "topic {} with {} queues on {}{}",
                    c.topic,
                    c.queues,
                    brokers.join(", "),
                    message_type.map_or(String::new(), |t| format!(" (message type {t})"))
                );
            }
        }
        TopicCmd::Delete { topic } => {
            admin.delete_topic(&topic).await?;
            if common.json {
                println!("{}", json!({"deleted": topic}));
            } else {
                println!("topic {topic} deleted");
            }
        }
        TopicCmd::List { system } => {
            let topics: Vec<String> = admin
                .topic_list()
                .await?
                .into_iter()
                .filter(|t| system || !crate::dashboard::is_system_topic(t))
                .collect();
            if common.json {
                println!("{}", json!(topics));
            } else {
                for t in topics {
                    println!("{t}");
                }
            }
        }
        TopicCmd::Route { topic } => {
            let route = admin.topic_route(&topic).await?;
            if common.json {
                println!("{}", serde_json::to_string(&route)?);
            } else {
                let mut t = Table::new(&["BROKER", "ADDRESS", "READ", "WRITE", "PERM"]);
                for q in &route.queue_datas {
                    let addr = route
                        .broker_datas
                        .iter()
                        .find(|b| b.broker_name == q.broker_name)
                        .and_then(|b| b.master_addr())
                        .unwrap_or("-");
                    t.row(vec![
                        q.broker_name.clone(),
                        addr.to_string(),
                        q.read_queue_nums.to_string(),
                        q.write_queue_nums.to_string(),
                        shoal_proto::constants::perm::to_display_string(q.perm),
                    ]);
                }
                t.print();
            }
        }
        TopicCmd::Status { topic } => {
            let stats = admin.topic_status(&topic).await?;
            if common.json {
                let rows: Vec<_> = stats
                    .offset_table
                    .iter()
                    .map(|(mq, o)| json!({"broker": mq.broker_name, "queue": mq.queue_id, "minOffset": o.min_offset, "maxOffset": o.max_offset, "lastStoreTime": o.last_update_timestamp}))
                    .collect();
                println!("{}", json!(rows));
            } else {
                let mut t = Table::new(&["BROKER", "QUEUE", "MIN", "MAX", "LAST STORE TIME"]);
                for (mq, o) in &stats.offset_table {
                    t.row(vec![
                        mq.broker_name.clone(),
                        mq.queue_id.to_string(),
                        o.min_offset.to_string(),
                        o.max_offset.to_string(),
                        fmt_time(o.last_update_timestamp),
                    ]);
                }
                t.print();
                let total: i64 = stats
                    .offset_table
                    .values()
                    .map(|o| o.max_offset - o.min_offset)
                    .sum();
                println!(
                    "{} queues, {} messages stored",
                    stats.offset_table.len(),
                    total
                );
            }
        }
    }
    admin.shutdown();
    Ok(())
}

/// `shoal group`.
pub(crate) async fn group(common: &Common, cmd: GroupCmd) -> anyhow::Result<()> {
    let admin = common.admin()?;
    match cmd {
        GroupCmd::List => {
            let mut rows = Vec::new();
            for g in admin.group_list().await? {
                rows.push(group_summary(&admin, &g).await);
            }
            if common.json {
                println!("{}", json!(rows));
            } else {
                let mut t = Table::new(&["GROUP", "MEMBERS", "MODE", "LAG", "STATE"]);
                for r in &rows {
                    t.row(vec![
                        r["group"].as_str().unwrap_or("-").to_string(),
                        r["members"].to_string(),
                        r["mode"].as_str().unwrap_or("-").to_string(),
                        r["lag"].as_i64().map_or("-".into(), |l| l.to_string()),
                        r["state"].as_str().unwrap_or("-").to_string(),
                    ]);
                }
                t.print();
            }
        }
        GroupCmd::Delete {
            group,
            keep_offsets,
        } => {
            let brokers = admin.delete_group(&group, !keep_offsets).await?;
            if common.json {
                println!(
                    "{}",
                    json!({"deleted": group, "brokers": brokers, "offsetsDeleted": !keep_offsets})
                );
            } else {
                println!(
                    "group {group} deleted on {}{}",
                    brokers.join(", "),
                    if keep_offsets {
                        " (offsets kept)"
                    } else {
                        ", with its offsets"
                    }
                );
            }
        }
        GroupCmd::Progress {
            group,
            topic,
            watch,
        } => loop {
            let mut p = admin.group_progress(&group).await?;
            if let Some(t) = &topic {
                p.queues.retain(|q| &q.mq.topic == t);
                if p.queues.is_empty() {
                    bail!("consumer group {group} has no queue of topic {t}");
                }
            }
            print_progress(common.json, &group, &p);
            let Some(secs) = watch else { break };
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(secs.max(1))) => {}
                _ = tokio::signal::ctrl_c() => break,
            }
            if !common.json {
                println!();
            }
        },
        GroupCmd::Describe { group } => {
            let (broker, v) = admin.group_describe(&group).await?;
            if common.json {
                println!("{v}");
            } else {
                crate::group_view::print_describe(&broker, &v);
            }
        }
        GroupCmd::History { group } => {
            let (broker, v) = admin.group_history(&group).await?;
            if common.json {
                println!("{v}");
            } else {
                crate::group_view::print_history(&broker, &v);
            }
        }
        GroupCmd::Connections { group } => {
            let (conns, raw) = admin.consumer_connections(&group).await?;
            if common.json {
                println!("{raw}");
            } else {
                let mut t = Table::new(&["CLIENT ID", "ADDRESS", "LANGUAGE", "VERSION"]);
                for c in &conns.connection_set {
                    t.row(vec![
                        c.client_id.clone(),
                        c.client_addr.clone(),
                        c.language.name().to_string(),
                        c.version.to_string(),
                    ]);
                }
                t.print();
                println!(
                    "model {}, consume type {}",
                    conns.message_model.map(|m| m.name()).unwrap_or("-"),
                    conns.consume_type.map(|m| m.name()).unwrap_or("-")
                );
                for (topic, s) in &conns.subscription_table {
                    println!("subscription {topic}: {}", s.sub_string);
                }
                let mut dups: Vec<&str> = Vec::new();
                for (i, c) in conns.connection_set.iter().enumerate() {
                    if conns.connection_set[..i]
                        .iter()
                        .any(|o| o.client_id == c.client_id)
                        && !dups.contains(&c.client_id.as_str())
                    {
                        dups.push(&c.client_id);
                    }
                }
                let health = admin.group_progress(&group).await.ok();
                for id in health.iter().flat_map(|p| p.duplicate_client_ids.iter()) {
                    if !dups.contains(&id.as_str()) {
                        dups.push(id);
                    }
                }
                if !dups.is_empty() {
                    println!(
                        "WARNING: client ids used by more than one connection: {} (give each process its own instance name)",
                        dups.join(", ")
                    );
                }
                let inconsistent: Vec<&str> = health
                    .iter()
                    .flat_map(|p| p.inconsistent_topics.iter().map(String::as_str))
                    .collect();
                if !inconsistent.is_empty() {
                    println!(
                        "WARNING: members subscribe differently to: {} (every member of a group needs the same subscriptions)",
                        inconsistent.join(", ")
                    );
                }
            }
        }
        GroupCmd::ResetOffset {
            group,
            topic,
            to,
            dry_run,
        } => {
            let ts = parse_time(&to)?;
            let plan = admin.reset_offset(&group, &topic, ts, dry_run).await?;
            if common.json {
                let rows: Vec<_> = plan
                    .iter()
                    .map(|r| json!({"broker": r.mq.broker_name, "queue": r.mq.queue_id, "from": r.from, "to": r.to}))
                    .collect();
                println!("{}", json!({"dryRun": dry_run, "offsets": rows}));
            } else {
                let mut t = Table::new(&["BROKER", "QUEUE", "FROM", "TO"]);
                for r in &plan {
                    t.row(vec![
                        r.mq.broker_name.clone(),
                        r.mq.queue_id.to_string(),
                        r.from.to_string(),
                        r.to.to_string(),
                    ]);
                }
                t.print();
                println!(
                    "{}",
                    if dry_run {
                        "dry run: nothing changed"
                    } else {
                        "offsets reset; online members were told"
                    }
                );
            }
        }
    }
    admin.shutdown();
    Ok(())
}

/// Prints `group progress` (a table, or one JSON object).
fn print_progress(json_out: bool, group: &str, p: &shoal_client::GroupProgress) {
    if json_out {
        let rows: Vec<_> = p
            .queues
            .iter()
            .map(|q| {
                json!({
                    "topic": q.mq.topic, "broker": q.mq.broker_name, "queue": q.mq.queue_id,
                    "brokerOffset": q.broker_offset, "consumerOffset": q.consumer_offset,
                    "consumedOffset": q.consumed_offset, "lag": q.lag, "owner": q.owner,
                    "lastConsumeTime": q.last_consume_timestamp,
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "group": group, "queues": rows, "totalLag": p.total_lag(),
                "duplicateClientIds": p.duplicate_client_ids,
                "inconsistentSubscriptionTopics": p.inconsistent_topics,
                "unreachableMembers": p.unreachable_members,
            })
        );
        return;
    }
    let mut t = Table::new(&[
        "TOPIC",
        "BROKER",
        "QUEUE",
        "BROKER OFFSET",
        "COMMITTED",
        "CONSUMED",
        "LAG",
        "OWNER",
        "LAST COMMITTED MESSAGE STORED AT",
    ]);
    for q in &p.queues {
        t.row(vec![
            q.mq.topic.clone(),
            q.mq.broker_name.clone(),
            q.mq.queue_id.to_string(),
            q.broker_offset.to_string(),
            q.consumer_offset.to_string(),
            q.consumed_offset.map_or("-".into(), |c| c.to_string()),
            q.lag.to_string(),
            q.owner.clone().unwrap_or_else(|| "-".into()),
            fmt_time(q.last_consume_timestamp),
        ]);
    }
    t.print();
    println!(
        "total lag {} (COMMITTED: offsets the group committed, every 5 s; CONSUMED: the owner's position now)",
        p.total_lag()
    );
    if !p.duplicate_client_ids.is_empty() {
        println!(
            "WARNING: client ids used by more than one connection: {:?}",
            p.duplicate_client_ids
        );
    }
    if !p.inconsistent_topics.is_empty() {
        println!(
            "WARNING: members subscribe differently to: {:?}",
            p.inconsistent_topics
        );
    }
    if !p.unreachable_members.is_empty() {
        println!(
            "note: members that did not report their queues: {:?}",
            p.unreachable_members
        );
    }
}

/// One row of `group list`: members, mode, total lag and state of a group.
async fn group_summary(admin: &AdminClient, group: &str) -> serde_json::Value {
    let connected = admin
        .consumer_connections(group)
        .await
        .map(|(c, _)| c.connection_set.len())
        .unwrap_or(0);
    let progress = admin.group_progress(group).await.ok();
    // GROUP_DESCRIBE knows members that hold no RocketMQ connection: Kafka classic groups
    // (the Kafka listener's) and the coordinator's members (Kafka `group.protocol=consumer`
    // members among them).
    let described = admin.group_describe(group).await.ok().map(|(_, v)| v);
    let mode = described
        .as_ref()
        .and_then(|v| v["mode"].as_str())
        .map(str::to_string);
    let described_members = described
        .as_ref()
        .and_then(|v| v["members"].as_array())
        .map_or(0, Vec::len);
    let (members, state) = match (mode.as_deref(), &described) {
        (Some("kafkaClassic"), Some(d)) => (
            described_members,
            match d["state"].as_str() {
                Some("Stable") => "STABLE",
                Some("PreparingRebalance" | "CompletingRebalance") => "REBALANCING",
                Some("Empty") | None => "EMPTY",
                Some(_) => "UNKNOWN",
            },
        ),
        (Some("coordinated"), Some(d)) => {
            let n = described_members.max(connected);
            let state = if n == 0 {
                "EMPTY"
            } else if d["reconciled"].as_bool() == Some(true) {
                "STABLE"
            } else {
                "REBALANCING"
            };
            (n, state)
        }
        _ => (connected, rocketmq_state(connected, progress.as_ref())),
    };
    let mode = match mode {
        _ if members == 0 => "-".to_string(),
        Some(m) if m != "empty" => m,
        _ => "classic".to_string(),
    };
    json!({
        "group": group,
        "members": members,
        "mode": mode,
        "lag": progress.as_ref().map(|p| p.total_lag()),
        "state": state,
    })
}

/// The state of a group of RocketMQ members from its queues' ownership.
fn rocketmq_state(members: usize, progress: Option<&GroupProgress>) -> &'static str {
    match progress {
        _ if members == 0 => "EMPTY",
        Some(p) => {
            let (shared, unowned) = p.ownership_problems();
            let unowned_real = unowned
                .iter()
                .any(|mq| !shoal_proto::constants::is_retry_topic(&mq.topic));
            if !shared.is_empty() || unowned_real {
                "REBALANCING"
            } else {
                "STABLE"
            }
        }
        None => "UNKNOWN",
    }
}

/// `shoal broker status`.
pub(crate) async fn broker_status(common: &Common, broker: Option<String>) -> anyhow::Result<()> {
    let admin = common.admin()?;
    let addrs = match broker {
        Some(b) => vec![b],
        None => admin.master_addrs(None).await?,
    };
    let mut all = serde_json::Map::new();
    for addr in &addrs {
        let table = admin.broker_runtime_info(addr).await?;
        if common.json {
            all.insert(addr.clone(), json!(table));
        } else {
            println!("broker {addr}");
            let mut t = Table::new(&["KEY", "VALUE"]);
            for (k, v) in &table {
                t.row(vec![k.clone(), v.clone()]);
            }
            t.print();
        }
    }
    if common.json {
        println!("{}", serde_json::Value::Object(all));
    }
    admin.shutdown();
    Ok(())
}

/// `shoal message get`.
pub(crate) async fn message(common: &Common, cmd: MessageCmd) -> anyhow::Result<()> {
    let admin = common.admin()?;
    let (id, topic) = match cmd {
        MessageCmd::Get { id, topic } => (id, topic),
        MessageCmd::Query { topic, key, max } => {
            let found = admin.query_by_key(&topic, &key, max).await?;
            if common.json {
                for m in &found {
                    println!("{}", message_json(m));
                }
            } else {
                let mut t = Table::new(&["MSG ID", "QUEUE", "OFFSET", "STORED", "TAGS", "BODY"]);
                for m in &found {
                    let body: String = String::from_utf8_lossy(&m.body).chars().take(40).collect();
                    t.row(vec![
                        m.msg_id().into_owned(),
                        m.queue_id.to_string(),
                        m.queue_offset.to_string(),
                        fmt_time(m.store_timestamp),
                        m.tags().unwrap_or("-").to_string(),
                        body,
                    ]);
                }
                t.print();
                println!("{} messages of {topic} with key {key}", found.len());
            }
            admin.shutdown();
            return Ok(());
        }
    };
    let m = admin.view_message(&id, topic.as_deref()).await?;
    if common.json {
        println!("{}", message_json(&m));
    } else {
        println!("msgId:        {}", m.msg_id());
        println!("offsetMsgId:  {}", m.offset_msg_id());
        println!(
            "topic:        {} (queue {}, offset {})",
            m.topic, m.queue_id, m.queue_offset
        );
        println!("tags:         {}", m.tags().unwrap_or("-"));
        println!("keys:         {}", m.keys().unwrap_or("-"));
        println!(
            "born:         {} from {}",
            fmt_time(m.born_timestamp),
            m.born_host
        );
        println!(
            "stored:       {} on {}",
            fmt_time(m.store_timestamp),
            m.store_host
        );
        println!("reconsumed:   {}", m.reconsume_times);
        for (k, v) in &m.properties {
            println!("property:     {k}={v}");
        }
        println!(
            "body ({} bytes): {}",
            m.body.len(),
            String::from_utf8_lossy(&m.body)
        );
    }
    admin.shutdown();
    Ok(())
}

/// `shoal dlq`.
pub(crate) async fn dlq(common: &Common, cmd: DlqCmd) -> anyhow::Result<()> {
    let admin = common.admin()?;
    match cmd {
        DlqCmd::List { group, max } => {
            let msgs = admin.dlq_messages(&group, max).await?;
            if common.json {
                for m in &msgs {
                    println!("{}", message_json(m));
                }
            } else {
                let mut t = Table::new(&["MSG ID", "ORIGINAL TOPIC", "ATTEMPTS", "STORED", "BODY"]);
                for m in &msgs {
                    let body = String::from_utf8_lossy(&m.body);
                    let body: String = body.chars().take(40).collect();
                    t.row(vec![
                        m.msg_id().into_owned(),
                        m.property(shoal_proto::message::property::RETRY_TOPIC)
                            .unwrap_or("-")
                            .to_string(),
                        m.reconsume_times.to_string(),
                        fmt_time(m.store_timestamp),
                        body,
                    ]);
                }
                t.print();
                println!(
                    "{} messages in the dead-letter queue of {group}",
                    msgs.len()
                );
            }
        }
        DlqCmd::Resend { group, id, max } => {
            let msgs = admin.dlq_messages(&group, max).await?;
            let chosen: Vec<&MessageExt> = msgs
                .iter()
                .filter(|m| id.as_deref().is_none_or(|i| m.msg_id() == i))
                .collect();
            if chosen.is_empty() {
                bail!("no matching message in the dead-letter queue of {group}");
            }
            for m in chosen {
                let (topic, new_id) = admin
                    .resend_dlq_message(m)
                    .await
                    .with_context(|| format!("resending {}", m.msg_id()))?;
                if common.json {
                    println!(
                        "{}",
                        json!({"msgId": m.msg_id(), "topic": topic, "newOffsetMsgId": new_id})
                    );
                } else {
                    println!("{} -> {topic} ({new_id})", m.msg_id());
                }
            }
        }
    }
    admin.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("earliest").unwrap(), 0);
        assert_eq!(parse_time("latest").unwrap(), -1);
        assert_eq!(parse_time("1700000000000").unwrap(), 1_700_000_000_000);
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000
        );
        let ago = parse_time("10m").unwrap();
        assert!((now_ms() - ago - 600_000).abs() < 5_000);
        assert!(parse_time("yesterday-ish").is_err());
        assert!(parse_time("-5").is_err());
    }

    #[test]
    fn header_encodings() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            common: Common,
        }
        use clap::Parser;
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("shoal").chain(args.iter().copied()))
                .map(|c| c.common.serialize_type)
        };
        if std::env::var_os("SHOAL_SERIALIZE_TYPE").is_none() {
            assert_eq!(parse(&[]).unwrap(), HeaderEncoding::Auto);
        }
        // Any case, as RocketMQ's `rocketmq.serialize.type` values.
        assert_eq!(
            parse(&["--serialize-type", "ROCKETMQ"]).unwrap(),
            HeaderEncoding::RocketMq
        );
        assert_eq!(
            parse(&["--serialize-type", "json"]).unwrap(),
            HeaderEncoding::Json
        );
        assert!(parse(&["--serialize-type", "xml"]).is_err());
        let settings = |e: HeaderEncoding| (e.serialize_type(), e.binary_sends_to_shoal());
        use shoal_proto::SerializeType::{Json, RocketMq};
        assert_eq!(settings(HeaderEncoding::Auto), (Json, true));
        assert_eq!(settings(HeaderEncoding::Json), (Json, false));
        assert_eq!(settings(HeaderEncoding::RocketMq), (RocketMq, true));
    }
}
