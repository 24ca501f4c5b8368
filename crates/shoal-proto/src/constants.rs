//! Well-known names and bits: system topics and groups, retry/DLQ topic names, permission
//! bits, pull sysFlag bits, the default delay levels (spec sections 2.5, 5.1, 6, 7.6).
//!
//! Message property keys (`KEYS`, `TAGS`, `UNIQ_KEY`, …) live in `crate::message::property`.

/// Prefix of a consumer group's retry topic: `%RETRY%<group>`.
pub const RETRY_GROUP_TOPIC_PREFIX: &str = "%RETRY%";
/// Prefix of a consumer group's dead-letter topic: `%DLQ%<group>`.
pub const DLQ_GROUP_TOPIC_PREFIX: &str = "%DLQ%";
/// Topic where delayed messages wait (queue id = delay level − 1).
pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";
/// Auto-create template topic that producers fall back to for unknown topics.
pub const AUTO_CREATE_TOPIC_KEY_TOPIC: &str = "TBW102";
/// Topic holding transactional half messages.
pub const TRANS_HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";
/// Topic holding transactional operation records.
pub const TRANS_OP_HALF_TOPIC: &str = "RMQ_SYS_TRANS_OP_HALF_TOPIC";
/// Topic used by the 5.x timer (arbitrary-time delay) service.
pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";
/// Producer group every Java client instance registers for its internal producer.
pub const CLIENT_INNER_PRODUCER_GROUP: &str = "CLIENT_INNER_PRODUCER";
/// Default producer group name of Java clients.
pub const DEFAULT_PRODUCER_GROUP: &str = "DEFAULT_PRODUCER";
/// Default consumer group name of Java clients.
pub const DEFAULT_CONSUMER_GROUP: &str = "DEFAULT_CONSUMER";
/// Group used by admin tools.
pub const TOOLS_CONSUMER_GROUP: &str = "TOOLS_CONSUMER";
/// Default broker cluster name.
pub const DEFAULT_CLUSTER: &str = "DefaultCluster";
/// Default region id a broker reports (`MSG_REGION`).
pub const DEFAULT_REGION: &str = "DefaultRegion";
/// Broker id of a master (`MixAll.MASTER_ID`); slaves have ids ≥ 1.
pub const MASTER_ID: i64 = 0;
/// Extra extFields key of QUERY_MESSAGE: `"true"` to look up by UNIQ_KEY.
pub const UNIQUE_MSG_QUERY_FLAG: &str = "_UNIQUE_KEY_QUERY";
/// Extra extFields key of REGISTER_BROKER carrying the broker's zone.
pub const ZONE_NAME: &str = "__ZONE_NAME";
/// Default name server port.
pub const DEFAULT_NAMESRV_PORT: u16 = 9876;
/// Default broker port.
pub const DEFAULT_BROKER_PORT: u16 = 10911;
/// Default number of queues of an auto-created topic (`defaultTopicQueueNums`).
pub const DEFAULT_TOPIC_QUEUE_NUMS: i32 = 4;

/// The broker's default `messageDelayLevel`: level n (1-based) is the n-th entry.
pub const DEFAULT_DELAY_LEVELS: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";

/// The retry topic of a consumer group: `%RETRY%<group>`.
pub fn retry_topic(group: &str) -> String {
    format!("{RETRY_GROUP_TOPIC_PREFIX}{group}")
}

/// The dead-letter topic of a consumer group: `%DLQ%<group>`.
pub fn dlq_topic(group: &str) -> String {
    format!("{DLQ_GROUP_TOPIC_PREFIX}{group}")
}

/// True for a `%RETRY%…` topic.
pub fn is_retry_topic(topic: &str) -> bool {
    topic.starts_with(RETRY_GROUP_TOPIC_PREFIX)
}

/// True for a `%DLQ%…` topic.
pub fn is_dlq_topic(topic: &str) -> bool {
    topic.starts_with(DLQ_GROUP_TOPIC_PREFIX)
}

/// The group of a `%RETRY%<group>` topic, `None` for other topics.
pub fn group_of_retry_topic(topic: &str) -> Option<&str> {
    topic.strip_prefix(RETRY_GROUP_TOPIC_PREFIX)
}

/// The group of a `%DLQ%<group>` topic, `None` for other topics.
pub fn group_of_dlq_topic(topic: &str) -> Option<&str> {
    topic.strip_prefix(DLQ_GROUP_TOPIC_PREFIX)
}

/// Parses a delay-level string such as [`DEFAULT_DELAY_LEVELS`] into milliseconds, level 1
/// first. Units: `ms` (a Shoal addition, handy in tests), `s`, `m`, `h`, `d`. A malformed entry
/// is an error naming it.
pub fn parse_delay_levels(levels: &str) -> crate::Result<Vec<u64>> {
    levels
        .split_whitespace()
        .map(|entry| {
            let invalid = || crate::ProtoError::Invalid(format!("bad delay level {entry:?}"));
            let digits = entry
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(entry.len());
            let (num, unit) = entry.split_at(digits);
            let factor: u64 = match unit {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return Err(invalid()),
            };
            let n: u64 = num.parse().map_err(|_| invalid())?;
            n.checked_mul(factor).ok_or_else(invalid)
        })
        .collect()
}

/// Topic permission bits (`PermName`, spec 2.5).
pub mod perm {
    /// Priority flag.
    pub const PERM_PRIORITY: i32 = 0x8;
    /// Readable (consumers may pull).
    pub const PERM_READ: i32 = 0x4;
    /// Writable (producers may send).
    pub const PERM_WRITE: i32 = 0x2;
    /// Inheritable: the topic may serve as an auto-create template.
    pub const PERM_INHERIT: i32 = 0x1;
    /// The permission of an ordinary topic: read | write.
    pub const PERM_READ_WRITE: i32 = PERM_READ | PERM_WRITE;

    /// True when `perm` has the read bit.
    pub fn is_readable(perm: i32) -> bool {
        perm & PERM_READ == PERM_READ
    }

    /// True when `perm` has the write bit.
    pub fn is_writeable(perm: i32) -> bool {
        perm & PERM_WRITE == PERM_WRITE
    }

    /// True when `perm` has the inherit bit.
    pub fn is_inherited(perm: i32) -> bool {
        perm & PERM_INHERIT == PERM_INHERIT
    }

    /// Java's `PermName.perm2String`: `"RWX"` with `-` for missing bits (X = inherit).
    pub fn to_display_string(perm: i32) -> String {
        let r = if is_readable(perm) { 'R' } else { '-' };
        let w = if is_writeable(perm) { 'W' } else { '-' };
        let x = if is_inherited(perm) { 'X' } else { '-' };
        format!("{r}{w}{x}")
    }
}

/// PULL_MESSAGE `sysFlag` bits (`PullSysFlag`, spec 5.1).
pub mod pull_sys_flag {
    /// `commitOffset` is valid; the broker stores it.
    pub const COMMIT_OFFSET: i32 = 0x1;
    /// The broker may hold the request (long polling).
    pub const SUSPEND: i32 = 0x2;
    /// `subscription`/`expressionType` in the header are authoritative.
    pub const SUBSCRIPTION: i32 = 0x4;
    /// Legacy filter-server class filter.
    pub const CLASS_FILTER: i32 = 0x8;
    /// Lite pull consumer (LITE_PULL_MESSAGE).
    pub const LITE_PULL: i32 = 0x10;

    /// Builds a sysFlag from its parts (`PullSysFlag.buildSysFlag`).
    pub fn build(
        commit_offset: bool,
        suspend: bool,
        subscription: bool,
        class_filter: bool,
    ) -> i32 {
        let mut flag = 0;
        if commit_offset {
            flag |= COMMIT_OFFSET;
        }
        if suspend {
            flag |= SUSPEND;
        }
        if subscription {
            flag |= SUBSCRIPTION;
        }
        if class_filter {
            flag |= CLASS_FILTER;
        }
        flag
    }

    /// True when the COMMIT_OFFSET bit is set.
    pub fn has_commit_offset(flag: i32) -> bool {
        flag & COMMIT_OFFSET != 0
    }

    /// True when the SUSPEND bit is set.
    pub fn has_suspend(flag: i32) -> bool {
        flag & SUSPEND != 0
    }

    /// True when the SUBSCRIPTION bit is set.
    pub fn has_subscription(flag: i32) -> bool {
        flag & SUBSCRIPTION != 0
    }

    /// True when the CLASS_FILTER bit is set.
    pub fn has_class_filter(flag: i32) -> bool {
        flag & CLASS_FILTER != 0
    }

    /// True when the LITE_PULL bit is set.
    pub fn has_lite_pull(flag: i32) -> bool {
        flag & LITE_PULL != 0
    }

    /// The flag with COMMIT_OFFSET cleared (what a client does when pulling from a slave).
    pub fn clear_commit_offset(flag: i32) -> i32 {
        flag & !COMMIT_OFFSET
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_and_dlq_names() {
        assert_eq!(retry_topic("CG"), "%RETRY%CG");
        assert_eq!(dlq_topic("CG"), "%DLQ%CG");
        assert!(is_retry_topic("%RETRY%CG"));
        assert!(!is_retry_topic("T"));
        assert!(is_dlq_topic("%DLQ%CG"));
        assert_eq!(group_of_retry_topic("%RETRY%CG"), Some("CG"));
        assert_eq!(group_of_dlq_topic("%DLQ%CG"), Some("CG"));
        assert_eq!(group_of_retry_topic("T"), None);
    }

    #[test]
    fn default_delay_levels_parse() {
        let levels = parse_delay_levels(DEFAULT_DELAY_LEVELS).unwrap();
        assert_eq!(levels.len(), 18);
        assert_eq!(levels[0], 1_000);
        assert_eq!(levels[2], 10_000);
        assert_eq!(levels[4], 60_000);
        assert_eq!(levels[17], 7_200_000);
        assert_eq!(parse_delay_levels("1d").unwrap(), vec![86_400_000]);
        assert_eq!(parse_delay_levels("20ms 1s").unwrap(), vec![20, 1_000]);
    }

    #[test]
    fn bad_delay_levels_are_errors() {
        for bad in ["1x", "s", "xs", "-1s", "99999999999999999999h", "1é"] {
            assert!(parse_delay_levels(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn perm_bits() {
        assert_eq!(perm::PERM_READ_WRITE, 6);
        assert!(perm::is_readable(6) && perm::is_writeable(6) && !perm::is_inherited(6));
        assert!(perm::is_inherited(7));
        assert_eq!(perm::to_display_string(7), "RWX");
        assert_eq!(perm::to_display_string(4), "R--");
    }

    #[test]
    fn pull_sys_flag_bits() {
        use pull_sys_flag::*;
        assert_eq!(build(true, true, false, false), 3);
        assert_eq!(build(false, true, true, false) | LITE_PULL, 22);
        assert!(has_commit_offset(3) && has_suspend(3) && !has_subscription(3));
        assert!(has_lite_pull(22) && has_subscription(22) && !has_class_filter(22));
        assert_eq!(clear_commit_offset(3), 2);
    }
}
