//! The HTTP port's access state: its settings, the signed-in sessions (random ids in a
//! cookie, bounded in number and time, each with its CSRF token and its admin client signing
//! as the account) and the port's own tokens. The handlers that use it are in `http_auth`.

use axum::http::{header, HeaderMap, HeaderValue};
use parking_lot::Mutex;
use rand::RngCore;
use shoal_client::AdminClient;
use shoal_metrics::prometheus_client::metrics::counter::Counter;
use shoal_metrics::prometheus_client::metrics::family::Family;
use shoal_proto::acl::AccessControl;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The session cookie.
pub(crate) const COOKIE: &str = "shoal_session";
/// The header every POST carries.
pub(crate) const CSRF_HEADER: &str = "x-shoal-csrf";

/// The HTTP port's access settings (`[http]` of the broker file, with the broker's ACL).
#[derive(Clone, Default)]
pub(crate) struct AccessSettings {
    /// The broker's ACL, when on.
    pub acl: Option<AccessControl>,
    /// Sign-in token.
    pub token: Option<String>,
    /// The account a token session acts as (with ACL on).
    pub token_account: Option<String>,
    /// Bearer token of `/metrics`.
    pub metrics_token: Option<String>,
    /// Session lifetime.
    pub session_timeout: Duration,
    /// Sessions held at once.
    pub max_sessions: usize,
}

impl std::fmt::Debug for AccessSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessSettings")
            .field("acl", &self.acl.is_some())
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("token_account", &self.token_account)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

impl AccessSettings {
    /// From the broker's configuration and its compiled ACL.
    pub(crate) fn from_broker(
        cfg: &shoal_broker::BrokerConfig,
        acl: Option<AccessControl>,
    ) -> anyhow::Result<Self> {
        let h = &cfg.http;
        if let (Some(acl), Some(account)) = (&acl, &h.token_account) {
            if acl.credentials(account).is_none() {
                anyhow::bail!(
                    "http.token_account {account:?} is not an account of the ACL file {}",
                    cfg.acl_file
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                );
            }
        }
        Ok(Self {
            acl,
            token: h.token.clone(),
            token_account: h.token_account.clone(),
            metrics_token: h.metrics_token.clone(),
            session_timeout: Duration::from_secs(h.session_timeout_secs),
            max_sessions: h.max_sessions,
        })
    }
}

/// One signed-in operator.
struct Session {
    account: String,
    csrf: String,
    /// Admin client signing as the account (`None` without ACL: the port's shared one).
    admin: Option<Arc<AdminClient>>,
    expires: Instant,
}

/// The admin client a request's handlers use: the session's (signed as its account) or the
/// port's shared one.
#[derive(Clone)]
pub(crate) struct RequestAdmin(pub Option<Arc<AdminClient>>);

/// The peer of a connection, and whether it came over TLS.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    /// Its address.
    pub addr: SocketAddr,
    /// HTTPS.
    pub tls: bool,
}

/// The access state of one HTTP port.
pub(crate) struct Access {
    pub(crate) settings: AccessSettings,
    /// The token of POSTs that have no session (sign-in; everything when no sign-in is
    /// required).
    pub(crate) port_csrf: String,
    sessions: Mutex<HashMap<String, Session>>,
    sign_ins: Family<Vec<(String, String)>, Counter>,
    refused: Family<Vec<(String, String)>, Counter>,
    registry: Arc<shoal_metrics::Metrics>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("settings", &self.settings)
            .field("sessions", &self.sessions.lock().len())
            .finish()
    }
}

fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Constant-time comparison of secrets.
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Default for Access {
    /// A port without sign-in.
    fn default() -> Self {
        Self::new(AccessSettings::default())
    }
}

impl Access {
    /// The access state for `settings`.
    pub(crate) fn new(settings: AccessSettings) -> Self {
        let registry = Arc::new(shoal_metrics::Metrics::new());
        let sign_ins = registry.counter_family(
            "shoal_http_sign_ins",
            "Dashboard sign-ins, by result (ok, refused) and kind (acl, token).",
        );
        let refused = registry.counter_family(
            "shoal_http_requests_refused",
            "HTTP requests refused, by reason: unauthenticated (no or an expired session), cross_site (a POST without the page's token or from another site), metrics_token (/metrics without its token).",
        );
        Self {
            settings,
            port_csrf: random_token(),
            sessions: Mutex::new(HashMap::new()),
            sign_ins,
            refused,
            registry,
        }
    }

    /// Whether `/api/*` needs a session.
    pub(crate) fn sign_in_required(&self) -> bool {
        self.settings.acl.is_some() || self.settings.token.is_some()
    }

    /// The port's counters (served at `/metrics`).
    pub(crate) fn registry(&self) -> Arc<shoal_metrics::Metrics> {
        self.registry.clone()
    }

    pub(crate) fn count_refused(&self, reason: &str) {
        self.refused
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .inc();
    }

    pub(crate) fn count_sign_in(&self, result: &str, kind: &str) {
        self.sign_ins
            .get_or_create(&vec![
                ("result".to_string(), result.to_string()),
                ("kind".to_string(), kind.to_string()),
            ])
            .inc();
    }

    /// The live session of a request's cookie: (account, csrf token, admin client).
    pub(crate) fn session_of(
        &self,
        headers: &HeaderMap,
    ) -> Option<(String, String, Option<Arc<AdminClient>>)> {
        let id = cookie(headers, COOKIE)?;
        let mut sessions = self.sessions.lock();
        let now = Instant::now();
        let live = sessions.get(&id).is_some_and(|s| s.expires > now);
        if !live {
            if let Some(s) = sessions.remove(&id) {
                if let Some(a) = s.admin {
                    a.shutdown();
                }
            }
            return None;
        }
        sessions
            .get(&id)
            .map(|s| (s.account.clone(), s.csrf.clone(), s.admin.clone()))
    }

    /// Starts a session; ends the oldest one when `max_sessions` are held.
    pub(crate) fn start_session(
        &self,
        account: String,
        admin: Option<Arc<AdminClient>>,
    ) -> (String, String) {
        let id = random_token();
        let csrf = random_token();
        let mut sessions = self.sessions.lock();
        let now = Instant::now();
        sessions.retain(|_, s| {
            let live = s.expires > now;
            if !live {
                if let Some(a) = &s.admin {
                    a.shutdown();
                }
            }
            live
        });
        while sessions.len() >= self.settings.max_sessions {
            let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(a) = sessions.remove(&oldest).and_then(|s| s.admin) {
                a.shutdown();
            }
        }
        sessions.insert(
            id.clone(),
            Session {
                account,
                csrf: csrf.clone(),
                admin,
                expires: now + self.settings.session_timeout,
            },
        );
        (id, csrf)
    }

    pub(crate) fn end_session(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE) {
            if let Some(a) = self.sessions.lock().remove(&id).and_then(|s| s.admin) {
                a.shutdown();
            }
        }
    }

    /// The session cookie; `Secure` when the sign-in came over HTTPS.
    pub(crate) fn session_cookie(&self, value: &str, max_age: u64, https: bool) -> HeaderValue {
        let secure = if https { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
        ))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

/// A cookie's value.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn sessions_are_bounded_and_expire() {
        let a = Access::new(AccessSettings {
            token: Some("t".repeat(16)),
            session_timeout: Duration::from_secs(60),
            max_sessions: 2,
            ..AccessSettings::default()
        });
        let (first, _) = a.start_session("x".into(), None);
        let (second, csrf) = a.start_session("y".into(), None);
        let (third, _) = a.start_session("z".into(), None);
        let with = |id: &str| headers(&[("cookie", &format!("{COOKIE}={id}"))]);
        assert!(a.session_of(&with(&first)).is_none(), "the oldest ended");
        assert_eq!(a.session_of(&with(&second)).unwrap().1, csrf);
        assert!(a.session_of(&with(&third)).is_some());
        a.end_session(&with(&third));
        assert!(a.session_of(&with(&third)).is_none());
    }
}
