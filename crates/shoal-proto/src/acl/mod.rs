//! RocketMQ ACL 1.0 as official clients speak it: request signing (`AclClientRPCHook`) and the
//! plain access model (`plain_acl.yml`: accounts, permissions, address allow-lists). No I/O:
//! the broker and name server decide with [`AccessControl::check`], clients sign with
//! [`sign_request`].
//!
//! The signature: every `extFields` entry except `Signature` (and `_UNIQUE_KEY_QUERY`, which
//! the Java broker leaves out) sorted by key (Java `TreeMap<String,String>` order), the values
//! concatenated without separators (keys are not included), as UTF-8, followed by the body
//! bytes; HMAC-SHA1 of that with the secret key (UTF-8), Base64 (standard alphabet, padded).
//! `AccessKey` and `SecurityToken` (when set) are added to `extFields` before signing, so they
//! are signed too.

mod address;
mod model;

pub use address::{AddressPattern, AddressPatternError};
pub use model::{
    parse_perm, perm, AccessControl, AccessDenied, AccessRequest, AccountConfig, PlainAclConfig,
    ADMIN_REQUEST_CODES,
};

use crate::command::{ExtFields, RemotingCommand};
use base64::Engine;
use hmac::{Hmac, Mac};

/// `extFields` key of the access key.
pub const ACCESS_KEY: &str = "AccessKey";
/// `extFields` key of the signature.
pub const SIGNATURE: &str = "Signature";
/// `extFields` key of the optional security token.
pub const SECURITY_TOKEN: &str = "SecurityToken";
/// `extFields` key the Java broker leaves out of the signed content.
pub const UNIQUE_MSG_QUERY_FLAG: &str = "_UNIQUE_KEY_QUERY";

/// A client's credentials (RocketMQ `SessionCredentials`).
#[derive(Clone, PartialEq, Eq)]
pub struct SessionCredentials {
    /// Access key (the account name).
    pub access_key: String,
    /// Secret key (never sent).
    pub secret_key: String,
    /// Optional security token, sent and signed as `SecurityToken`.
    pub security_token: Option<String>,
}

impl std::fmt::Debug for SessionCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCredentials")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field(
                "security_token",
                &self.security_token.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

impl SessionCredentials {
    /// Credentials without a security token.
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        Self {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            security_token: None,
        }
    }
}

/// Java `String.compareTo`: UTF-16 code unit order (equal to byte order for ASCII keys).
fn java_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// The bytes a request's signature covers: the `extFields` values (without `Signature` and
/// `_UNIQUE_KEY_QUERY`) in key order, concatenated, then the body.
pub fn signed_content(ext: Option<&ExtFields>, body: Option<&[u8]>) -> Vec<u8> {
    let mut fields: Vec<(&str, &str)> = ext
        .map(|e| {
            e.iter()
                .filter(|(k, _)| *k != SIGNATURE && *k != UNIQUE_MSG_QUERY_FLAG)
                .collect()
        })
        .unwrap_or_default();
    fields.sort_by(|a, b| java_order(a.0, b.0));
    let mut out = Vec::with_capacity(
        fields.iter().map(|(_, v)| v.len()).sum::<usize>() + body.map_or(0, <[u8]>::len),
    );
    for (_, v) in fields {
        out.extend_from_slice(v.as_bytes());
    }
    if let Some(b) = body {
        out.extend_from_slice(b);
    }
    out
}

/// HMAC-SHA1 of `data` keyed with `secret_key` (UTF-8), Base64-encoded (RocketMQ `AclSigner`).
pub fn calc_signature(data: &[u8], secret_key: &str) -> String {
    // HMAC accepts keys of any length.
    let mut mac = match Hmac::<sha1::Sha1>::new_from_slice(secret_key.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(data);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// Signs a request as `AclClientRPCHook` does: adds `AccessKey` (and `SecurityToken`), then
/// `Signature` over the content. Call it last, after every header field is set.
pub fn sign_request(cmd: &mut RemotingCommand, creds: &SessionCredentials) {
    let ext = cmd.ext_fields.get_or_insert_with(ExtFields::new);
    ext.insert(ACCESS_KEY, creds.access_key.clone());
    if let Some(t) = &creds.security_token {
        ext.insert(SECURITY_TOKEN, t.clone());
    }
    ext.remove(SIGNATURE);
    let content = signed_content(cmd.ext_fields.as_ref(), cmd.body.as_deref());
    let sig = calc_signature(&content, &creds.secret_key);
    cmd.ext_fields
        .get_or_insert_with(ExtFields::new)
        .insert(SIGNATURE, sig);
}

#[cfg(test)]
mod tests;
