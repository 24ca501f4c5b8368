//! HEART_BEAT body (spec 3.3): HeartbeatData, ConsumerData, ProducerData, SubscriptionData.

use super::enums::{ConsumeFromWhere, ConsumeType, ExpressionType, MessageModel};
use super::lenient;
use crate::hash::java_string_hash;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// HEART_BEAT body: a client's producer and consumer groups.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HeartbeatData {
    /// Client id (`clientIP@instanceName`; never parse it).
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// Consumer groups of this client.
    pub consumer_data_set: Vec<ConsumerData>,
    /// 5.x heartbeat-v2 fingerprint (0 otherwise).
    pub heartbeat_fingerprint: i32,
    /// Producer groups of this client (Java always includes `CLIENT_INNER_PRODUCER`).
    pub producer_data_set: Vec<ProducerData>,
    /// True when subscriptions were deliberately omitted (keep the previous ones).
    pub without_sub: bool,
}

/// One consumer group of a client.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumerData {
    /// Where a new group starts.
    pub consume_from_where: ConsumeFromWhere,
    /// Push, pull or pop.
    pub consume_type: ConsumeType,
    /// Group name.
    pub group_name: String,
    /// Clustering or broadcasting.
    pub message_model: MessageModel,
    /// Subscriptions (push consumers in clustering mode include `%RETRY%<group>`).
    pub subscription_data_set: Vec<SubscriptionData>,
    /// Unit mode.
    pub unit_mode: bool,
}

/// One producer group of a client.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProducerData {
    /// Group name.
    pub group_name: String,
}

/// A subscription of a consumer group to a topic.
///
/// Reading accepts what the C++ client sends (spec 10): `subVersion` as a string, and missing
/// `classFilterMode`, `expressionType` (TAG), `tagsSet` (derived from `subString`) and `codeSet`
/// (hashes of the tags); and what the Go client sends: `codeSet` as strings of digits
/// (`["2598919"]`), `subVersion` in nanoseconds. Apache RocketMQ's broker (fastjson) reads the
/// same shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "SubscriptionDataWire")]
pub struct SubscriptionData {
    /// Legacy class filter mode.
    pub class_filter_mode: bool,
    /// Java `String.hashCode` of each tag.
    pub code_set: BTreeSet<i32>,
    /// TAG or SQL92.
    pub expression_type: ExpressionType,
    /// The expression as given (`"*"` = everything).
    pub sub_string: String,
    /// Subscription time, ms; the broker rejects pulls with a newer version.
    pub sub_version: i64,
    /// Trimmed tags.
    pub tags_set: BTreeSet<String>,
    /// Topic.
    pub topic: String,
}

/// The expression meaning "every message".
pub const SUB_ALL: &str = "*";

impl SubscriptionData {
    /// Builds a TAG subscription from an expression as Java's `FilterAPI` does: `""` or `"*"`
    /// give `subString` `"*"` and empty sets; otherwise the expression is split on `||`, each
    /// tag trimmed, empty ones dropped, and `codeSet` holds their Java hash codes.
    pub fn from_tag_expression(
        topic: impl Into<String>,
        expression: &str,
        sub_version: i64,
    ) -> Self {
        let (sub_string, tags_set) = if expression.is_empty() || expression == SUB_ALL {
            (SUB_ALL.to_owned(), BTreeSet::new())
        } else {
            (expression.to_owned(), parse_tags(expression))
        };
        let code_set = tags_set.iter().map(|t| java_string_hash(t)).collect();
        Self {
            class_filter_mode: false,
            code_set,
            expression_type: ExpressionType::Tag,
            sub_string,
            sub_version,
            tags_set,
            topic: topic.into(),
        }
    }

    /// Builds an SQL92 subscription (evaluated by the broker; no tags).
    pub fn sql92(topic: impl Into<String>, expression: &str, sub_version: i64) -> Self {
        Self {
            class_filter_mode: false,
            code_set: BTreeSet::new(),
            expression_type: ExpressionType::Sql92,
            sub_string: expression.to_owned(),
            sub_version,
            tags_set: BTreeSet::new(),
            topic: topic.into(),
        }
    }

    /// True when this subscription takes every message (`"*"`).
    pub fn is_sub_all(&self) -> bool {
        self.sub_string == SUB_ALL || self.sub_string.is_empty()
    }

    /// Broker-side TAG match on a consume-queue tag code (spec 5.3): everything matches for
    /// `"*"` or class-filter mode, otherwise `codeSet` must contain the (truncated) code.
    pub fn matches_tags_code(&self, tags_code: i64) -> bool {
        if self.class_filter_mode || self.is_sub_all() {
            return true;
        }
        self.code_set.contains(&(tags_code as i32))
    }

    /// Client-side TAG match (hash collisions resolved): with a non-empty `tagsSet` the
    /// message's exact `TAGS` must be in it.
    pub fn matches_tags(&self, tags: Option<&str>) -> bool {
        if self.tags_set.is_empty() {
            return true;
        }
        tags.is_some_and(|t| self.tags_set.contains(t))
    }
}

fn parse_tags(expression: &str) -> BTreeSet<String> {
    expression
        .split("||")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// What may arrive on the wire; normalised into [`SubscriptionData`].
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct SubscriptionDataWire {
    class_filter_mode: bool,
    #[serde(deserialize_with = "lenient::opt_i32_set")]
    code_set: Option<BTreeSet<i32>>,
    expression_type: Option<ExpressionType>,
    sub_string: String,
    #[serde(deserialize_with = "lenient::i64_or_string")]
    sub_version: i64,
    tags_set: Option<BTreeSet<String>>,
    topic: String,
}

impl Default for SubscriptionDataWire {
    fn default() -> Self {
        Self {
            class_filter_mode: false,
            code_set: None,
            expression_type: None,
            sub_string: SUB_ALL.to_owned(),
            sub_version: 0,
            tags_set: None,
            topic: String::new(),
        }
    }
}

impl From<SubscriptionDataWire> for SubscriptionData {
    fn from(w: SubscriptionDataWire) -> Self {
        let expression_type = w.expression_type.unwrap_or_default();
        let tags_set = match w.tags_set {
            Some(tags) => tags,
            None if expression_type == ExpressionType::Tag
                && !(w.sub_string.is_empty() || w.sub_string == SUB_ALL) =>
            {
                parse_tags(&w.sub_string)
            }
            None => BTreeSet::new(),
        };
        let code_set = match w.code_set {
            Some(codes) => codes,
            None => tags_set.iter().map(|t| java_string_hash(t)).collect(),
        };
        Self {
            class_filter_mode: w.class_filter_mode,
            code_set,
            expression_type,
            sub_string: w.sub_string,
            sub_version: w.sub_version,
            tags_set,
            topic: w.topic,
        }
    }
}

impl Default for SubscriptionData {
    fn default() -> Self {
        Self::from_tag_expression("", SUB_ALL, 0)
    }
}

/// CHECK_CLIENT_CONFIG (46) body (`CheckClientRequestBody`): a consumer checks at start that the
/// broker can serve its subscription (SQL92 needs the broker's property filter).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CheckClientRequestBody {
    /// Client id.
    pub client_id: String,
    /// Consumer group.
    pub group: String,
    /// The subscription to check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscription_data: Option<SubscriptionData>,
}
