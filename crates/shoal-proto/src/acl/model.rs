//! The plain access model (RocketMQ's `PlainPermissionManager` / `PlainAccessValidator`).

use super::{
    calc_signature, signed_content, AddressPattern, AddressPatternError, ACCESS_KEY, SIGNATURE,
};
use crate::body::HeartbeatData;
use crate::code::request_code as rc;
use crate::command::RemotingCommand;
use crate::constants::retry_topic;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;

/// Permission bits (RocketMQ `Permission`).
pub mod perm {
    /// Denied.
    pub const DENY: u8 = 1;
    /// Either PUB or SUB suffices.
    pub const ANY: u8 = 1 << 1;
    /// Publish.
    pub const PUB: u8 = 1 << 2;
    /// Subscribe.
    pub const SUB: u8 = 1 << 3;

    /// Whether `owned` grants `needed` (DENY wins).
    pub fn check(needed: u8, owned: u8) -> bool {
        if owned & DENY != 0 {
            return false;
        }
        if needed & ANY != 0 {
            return owned & (PUB | SUB) != 0;
        }
        needed & owned != 0
    }
}

/// Parses `PUB`, `SUB`, `PUB|SUB`, `SUB|PUB` or `DENY`.
pub fn parse_perm(text: &str) -> Option<u8> {
    match text.trim() {
        "PUB" => Some(perm::PUB),
        "SUB" => Some(perm::SUB),
        "PUB|SUB" | "SUB|PUB" => Some(perm::PUB | perm::SUB),
        "DENY" => Some(perm::DENY),
        _ => None,
    }
}

/// Broker requests only admin accounts may make: RocketMQ's set (topic create/update and
/// delete, broker config, group create/update and delete) plus offset resets, and the
/// replication messages between the brokers of a group (Shoal's 9082 and 9083, which carry
/// the commit log).
pub const ADMIN_REQUEST_CODES: &[i32] = &[
    rc::UPDATE_AND_CREATE_TOPIC,
    rc::UPDATE_BROKER_CONFIG,
    rc::DELETE_TOPIC_IN_BROKER,
    rc::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    rc::DELETE_SUBSCRIPTIONGROUP,
    rc::INVOKE_BROKER_TO_RESET_OFFSET,
    rc::RESET_CONSUMER_OFFSET_IN_BROKER,
    crate::ext::request_code::HA_TO_REPLICA,
    crate::ext::request_code::HA_TO_MASTER,
];

/// One account of the ACL file (RocketMQ `PlainAccessConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccountConfig {
    /// Access key (longer than 6 characters).
    pub access_key: String,
    /// Secret key (longer than 6 characters).
    pub secret_key: String,
    /// Addresses this account may be used from (default: any).
    #[serde(default)]
    pub white_remote_address: Option<String>,
    /// May make admin requests.
    #[serde(default)]
    pub admin: bool,
    /// Permission on topics not listed in `topic_perms` (default DENY).
    #[serde(default)]
    pub default_topic_perm: Option<String>,
    /// Permission on groups not listed in `group_perms` (default DENY).
    #[serde(default)]
    pub default_group_perm: Option<String>,
    /// `topic=PERM` entries.
    #[serde(default)]
    pub topic_perms: Vec<String>,
    /// `group=PERM` entries.
    #[serde(default)]
    pub group_perms: Vec<String>,
}

/// The ACL file (RocketMQ's `plain_acl.yml` keys, written as TOML in Shoal).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlainAclConfig {
    /// Addresses allowed without any credentials.
    #[serde(default)]
    pub global_white_remote_addresses: Vec<String>,
    /// Accounts.
    #[serde(default)]
    pub accounts: Vec<AccountConfig>,
}

#[derive(Debug, Clone)]
struct Account {
    secret_key: String,
    white: Option<AddressPattern>,
    admin: bool,
    default_topic_perm: u8,
    default_group_perm: u8,
    /// Resource (topic, or `%RETRY%group`) -> permission.
    perms: HashMap<String, u8>,
}

/// A compiled ACL: who may do what.
#[derive(Debug, Clone)]
pub struct AccessControl {
    global_white: Vec<AddressPattern>,
    accounts: HashMap<String, Account>,
}

/// Why a request was refused (answered NO_PERMISSION with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AccessDenied(pub String);

/// What a request needs, parsed from it (RocketMQ `PlainAccessResource`).
#[derive(Debug, Clone)]
pub struct AccessRequest {
    /// Request code.
    pub code: i32,
    /// The peer's address.
    pub remote: IpAddr,
    /// `AccessKey`, if sent.
    pub access_key: Option<String>,
    /// `Signature`, if sent.
    pub signature: Option<String>,
    /// The signed content.
    pub content: Vec<u8>,
    /// (resource, needed permission); a resource `%RETRY%<group>` stands for the group.
    pub resources: Vec<(String, u8)>,
    /// The request's resources could not be read (bad header or body).
    pub parse_error: Option<String>,
}

fn field<'a>(cmd: &'a RemotingCommand, key: &str) -> Option<&'a str> {
    cmd.ext_fields.as_ref().and_then(|e| e.get(key))
}

fn is_retry(resource: &str) -> bool {
    resource.starts_with(crate::constants::RETRY_GROUP_TOPIC_PREFIX)
}

impl AccessRequest {
    /// Reads what `cmd` needs: the resources per request code as RocketMQ does (sends need PUB
    /// on the topic, or SUB on the group for a retry topic; pulls, heartbeats, offsets and
    /// unregistration need SUB on the topic and the group), plus credentials and content.
    pub fn parse(cmd: &RemotingCommand, remote: IpAddr) -> AccessRequest {
        let mut req = AccessRequest {
            code: cmd.code,
            remote,
            access_key: field(cmd, ACCESS_KEY).map(str::to_string),
            signature: field(cmd, SIGNATURE).map(str::to_string),
            content: signed_content(cmd.ext_fields.as_ref(), cmd.body.as_deref()),
            resources: Vec::new(),
            parse_error: None,
        };
        let mut add = |r: Option<&str>, p: u8| {
            if let Some(r) = r {
                req.resources.push((r.to_string(), p));
            }
        };
        let group_res = |g: Option<&str>| g.map(retry_topic);
        match cmd.code {
            rc::SEND_MESSAGE | rc::SEND_MESSAGE_V2 | rc::SEND_BATCH_MESSAGE => {
                // V2 headers use short names ("b" = topic).
                let topic = field(cmd, "b").or_else(|| field(cmd, "topic"));
                match topic {
                    // A send back to a retry topic needs SUB on its group.
                    Some(t) if is_retry(t) => add(Some(t), perm::SUB),
                    t => add(t, perm::PUB),
                }
            }
            rc::CONSUMER_SEND_MSG_BACK => add(group_res(field(cmd, "group")).as_deref(), perm::SUB),
            rc::PULL_MESSAGE | rc::LITE_PULL_MESSAGE => {
                add(field(cmd, "topic"), perm::SUB);
                add(group_res(field(cmd, "consumerGroup")).as_deref(), perm::SUB);
            }
            rc::QUERY_MESSAGE => add(field(cmd, "topic"), perm::SUB),
            rc::POP_MESSAGE
            | rc::PEEK_MESSAGE
            | rc::NOTIFICATION
            | rc::ACK_MESSAGE
            | rc::CHANGE_MESSAGE_INVISIBLETIME => {
                add(field(cmd, "topic"), perm::SUB);
                add(group_res(field(cmd, "consumerGroup")).as_deref(), perm::SUB);
            }
            rc::HEART_BEAT => match cmd.decode_json_body::<HeartbeatData>() {
                Ok(hb) => {
                    for c in &hb.consumer_data_set {
                        add(Some(&retry_topic(&c.group_name)), perm::SUB);
                        for s in &c.subscription_data_set {
                            add(Some(&s.topic), perm::SUB);
                        }
                    }
                }
                Err(e) => req.parse_error = Some(format!("heartbeat body: {e}")),
            },
            rc::UNREGISTER_CLIENT | rc::GET_CONSUMER_LIST_BY_GROUP => {
                add(group_res(field(cmd, "consumerGroup")).as_deref(), perm::SUB)
            }
            rc::UPDATE_CONSUMER_OFFSET | rc::QUERY_CONSUMER_OFFSET => {
                add(group_res(field(cmd, "consumerGroup")).as_deref(), perm::SUB);
                add(field(cmd, "topic"), perm::SUB);
            }
            _ => {}
        }
        req
    }
}

/// Constant-time comparison (the signature must not leak by timing).
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl AccessControl {
    /// Compiles an ACL file; errors name the account or pattern.
    pub fn new(config: &PlainAclConfig) -> Result<Self, String> {
        let global_white = config
            .global_white_remote_addresses
            .iter()
            .map(|p| AddressPattern::parse(p))
            .collect::<Result<Vec<_>, AddressPatternError>>()
            .map_err(|e| e.to_string())?;
        let mut accounts = HashMap::new();
        for a in &config.accounts {
            if a.access_key.chars().count() <= 6 || a.secret_key.chars().count() <= 6 {
                return Err(format!(
                    "account {:?}: accessKey and secretKey must be longer than 6 characters",
                    a.access_key
                ));
            }
            let white = match a.white_remote_address.as_deref().map(str::trim) {
                None | Some("") => None,
                Some(p) => Some(
                    AddressPattern::parse(p)
                        .map_err(|e| format!("account {:?}: {e}", a.access_key))?,
                ),
            };
            let perm_of = |what: &str, text: Option<&str>| match text {
                None => Ok(perm::DENY),
                Some(t) => parse_perm(t).ok_or_else(|| {
                    format!(
                        "account {:?}: {what} {t:?} is not PUB, SUB, PUB|SUB or DENY",
                        a.access_key
                    )
                }),
            };
            let mut perms = HashMap::new();
            for (entries, is_topic) in [(&a.topic_perms, true), (&a.group_perms, false)] {
                for entry in entries {
                    let (name, p) = entry.split_once('=').ok_or_else(|| {
                        format!(
                            "account {:?}: {entry:?} is not resource=PERM (for example topicA=SUB)",
                            a.access_key
                        )
                    })?;
                    let p = perm_of("permission", Some(p))?;
                    let key = if is_topic {
                        name.trim().to_string()
                    } else {
                        retry_topic(name.trim())
                    };
                    perms.insert(key, p);
                }
            }
            let account = Account {
                secret_key: a.secret_key.clone(),
                white,
                admin: a.admin,
                default_topic_perm: perm_of("defaultTopicPerm", a.default_topic_perm.as_deref())?,
                default_group_perm: perm_of("defaultGroupPerm", a.default_group_perm.as_deref())?,
                perms,
            };
            if accounts.insert(a.access_key.clone(), account).is_some() {
                return Err(format!("account {:?} is listed twice", a.access_key));
            }
        }
        Ok(Self {
            global_white,
            accounts,
        })
    }

    /// Number of accounts.
    pub fn account_count(&self) -> usize {
        self.accounts.len()
    }

    /// Checks an account's keys as given by a person signing in (the HTTP dashboard): the
    /// account exists, the secret key is its own (compared in constant time), and `remote` is
    /// an address the account may be used from. The refusal does not say which part failed.
    pub fn sign_in(
        &self,
        access_key: &str,
        secret_key: &str,
        remote: IpAddr,
    ) -> Result<super::SessionCredentials, AccessDenied> {
        let refused = || AccessDenied(format!("sign-in refused for accessKey={access_key}"));
        let account = self.accounts.get(access_key).ok_or_else(refused)?;
        if !same(secret_key, &account.secret_key) {
            return Err(refused());
        }
        if account.white.as_ref().is_some_and(|w| !w.matches(remote)) {
            return Err(AccessDenied(format!(
                "accessKey={access_key} may not be used from {remote}"
            )));
        }
        Ok(super::SessionCredentials::new(access_key, secret_key))
    }

    /// The keys of an account, to sign requests made on its behalf (the dashboard's token
    /// sign-in acts as a configured account).
    pub fn credentials(&self, access_key: &str) -> Option<super::SessionCredentials> {
        self.accounts
            .get(access_key)
            .map(|a| super::SessionCredentials::new(access_key, a.secret_key.clone()))
    }

    /// Decides a request. `admin_codes` are the request codes only admin accounts may make.
    ///
    /// Order: a globally allowed address passes; otherwise the access key must name an
    /// account, the address must match the account's `whiteRemoteAddress` if it has one, the
    /// signature must match, admin codes need an admin account, and every resource needs its
    /// permission (listed, or the account's default for topics / groups; an admin account
    /// without listed permissions may do everything). Unlike RocketMQ 4.x, an account's
    /// `whiteRemoteAddress` restricts where the account may be used and never replaces the
    /// signature.
    pub fn check(&self, req: &AccessRequest, admin_codes: &[i32]) -> Result<(), AccessDenied> {
        if self.global_white.iter().any(|p| p.matches(req.remote)) {
            return Ok(());
        }
        let deny = |s: String| Err(AccessDenied(s));
        let Some(ak) = req.access_key.as_deref().filter(|a| !a.is_empty()) else {
            return deny(format!(
                "No accessKey is configured (request code {} from {})",
                req.code, req.remote
            ));
        };
        let Some(account) = self.accounts.get(ak) else {
            return deny(format!("No acl config for {ak}"));
        };
        if let Some(w) = &account.white {
            if !w.matches(req.remote) {
                return deny(format!(
                    "accessKey={ak} may not be used from {} (whiteRemoteAddress {})",
                    req.remote,
                    w.as_str()
                ));
            }
        }
        let expected = calc_signature(&req.content, &account.secret_key);
        if !req.signature.as_deref().is_some_and(|s| same(s, &expected)) {
            return deny(format!("Check signature failed for accessKey={ak}"));
        }
        if let Some(e) = &req.parse_error {
            return deny(format!("cannot check the permissions of the request: {e}"));
        }
        if admin_codes.contains(&req.code) && !account.admin {
            return deny(format!(
                "Need admin permission for request code={}, but accessKey={ak} is not",
                req.code
            ));
        }
        // RocketMQ lets message traces through.
        if req
            .resources
            .iter()
            .any(|(r, p)| r == "RMQ_SYS_TRACE_TOPIC" && *p == perm::PUB)
        {
            return Ok(());
        }
        if account.admin && account.perms.is_empty() {
            return Ok(());
        }
        for (resource, needed) in &req.resources {
            let group = is_retry(resource);
            let owned = account.perms.get(resource).copied().unwrap_or(if group {
                account.default_group_perm
            } else {
                account.default_topic_perm
            });
            if !perm::check(*needed, owned) {
                let what = if group {
                    format!(
                        "group {}",
                        &resource[crate::constants::RETRY_GROUP_TOPIC_PREFIX.len()..]
                    )
                } else {
                    format!("topic {resource}")
                };
                return deny(format!("No permission for {what} (accessKey={ak})"));
            }
        }
        Ok(())
    }
}
