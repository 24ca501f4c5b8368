//! Who may use the HTTP port: sign-in (an ACL account, or the configured token), sessions
//! held in a cookie, the dashboard's admin requests signed as the signed-in account,
//! cross-site request protection on every POST, and the `/metrics` token. docs/security.md
//! says what the port exposes in each mode.
//!
//! - Sign-in is required when ACL is on or `[http] token` is set. Then every `/api/*` request
//!   but `/api/session` needs a session; the pages themselves (HTML, JS, CSS) are served to
//!   anyone, since they hold no data and show the sign-in form.
//! - A session is a random 256-bit id in an `HttpOnly; SameSite=Strict` cookie (`Secure` over
//!   HTTPS), bounded in number (`max_sessions`, the oldest ends first) and time
//!   (`session_timeout_secs`). Its admin requests (cluster, topics, groups, messages, dead
//!   letters) are signed with the account's keys, so the brokers' ACL decides what it sees.
//! - Every POST carries `X-Shoal-Csrf` with the session's token (or, to sign in and when no
//!   sign-in is required, the port's own token from `GET /api/session`), which a page of
//!   another site cannot read; a POST whose `Origin` or `Sec-Fetch-Site` says another site
//!   is refused as well.

use crate::http::HttpState;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use parking_lot::Mutex;
use rand::RngCore;
use serde::Deserialize;
use serde_json::json;
use shoal_client::AdminClient;
use shoal_metrics::prometheus_client::metrics::counter::Counter;
use shoal_metrics::prometheus_client::metrics::family::Family;
use shoal_proto::acl::{AccessControl, SessionCredentials};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The session cookie.
const COOKIE: &str = "shoal_session";
/// The header every POST carries.
pub const CSRF_HEADER: &str = "x-shoal-csrf";

/// The HTTP port's access settings (`[http]` of the broker file, with the broker's ACL).
#[derive(Clone, Default)]
pub struct AccessSettings {
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
    pub fn from_broker(
        cfg: &shoal_broker::config::BrokerConfig,
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
pub struct RequestAdmin(pub Option<Arc<AdminClient>>);

/// The peer of a connection, and whether it came over TLS.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// Its address.
    pub addr: SocketAddr,
    /// HTTPS.
    pub tls: bool,
}

/// The access state of one HTTP port.
pub struct Access {
    settings: AccessSettings,
    /// The token of POSTs that have no session (sign-in; everything when no sign-in is
    /// required).
    port_csrf: String,
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
fn same(a: &str, b: &str) -> bool {
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
    pub fn new(settings: AccessSettings) -> Self {
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
    pub fn sign_in_required(&self) -> bool {
        self.settings.acl.is_some() || self.settings.token.is_some()
    }

    /// The port's counters (served at `/metrics`).
    pub fn registry(&self) -> Arc<shoal_metrics::Metrics> {
        self.registry.clone()
    }

    fn count_refused(&self, reason: &str) {
        self.refused
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .inc();
    }

    fn count_sign_in(&self, result: &str, kind: &str) {
        self.sign_ins
            .get_or_create(&vec![
                ("result".to_string(), result.to_string()),
                ("kind".to_string(), kind.to_string()),
            ])
            .inc();
    }

    /// The live session of a request's cookie: (account, csrf token, admin client).
    fn session_of(
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
    fn start_session(&self, account: String, admin: Option<Arc<AdminClient>>) -> (String, String) {
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

    fn end_session(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE) {
            if let Some(a) = self.sessions.lock().remove(&id).and_then(|s| s.admin) {
                a.shutdown();
            }
        }
    }

    /// The session cookie; `Secure` when the sign-in came over HTTPS.
    fn session_cookie(&self, value: &str, max_age: u64, https: bool) -> HeaderValue {
        let secure = if https { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
        ))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

/// A cookie's value.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

fn refusal(code: StatusCode, text: &str, sign_in: bool) -> Response {
    (code, Json(json!({"error": text, "signIn": sign_in}))).into_response()
}

/// Whether a POST comes from a page of another site, by the headers browsers send.
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if !matches!(site, "same-origin" | "none") {
            return true;
        }
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => false,
        Some(origin) => {
            let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
            host.is_none_or(|h| !h.eq_ignore_ascii_case(origin_host))
        }
    }
}

/// The guard in front of every route: `/metrics`'s token, cross-site request protection on
/// POSTs, sessions for `/api/*`; it hands the handlers their admin client.
pub async fn guard(State(state): State<HttpState>, mut req: Request, next: Next) -> Response {
    let access = state.access.clone();
    let path = req.uri().path().to_string();
    let headers = req.headers().clone();
    if path == "/metrics" {
        if let Some(t) = &access.settings.metrics_token {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| same(g.trim(), t)) {
                access.count_refused("metrics_token");
                return refusal(
                    StatusCode::UNAUTHORIZED,
                    "/metrics needs Authorization: Bearer <[http] metrics_token>",
                    false,
                );
            }
        }
        return next.run(req).await;
    }
    let session = access.session_of(&headers);
    if req.method() == Method::POST {
        let expected = match &session {
            Some((_, csrf, _)) => csrf.clone(),
            None => access.port_csrf.clone(),
        };
        let given = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if cross_site(&headers) || !given.is_some_and(|g| same(g, &expected)) {
            access.count_refused("cross_site");
            return refusal(
                StatusCode::FORBIDDEN,
                "cross-site request refused: a POST needs the page's X-Shoal-Csrf token (reload the dashboard)",
                false,
            );
        }
    }
    if path.starts_with("/api/") && path != "/api/session" {
        let admin = if access.sign_in_required() {
            match session {
                Some((_, _, admin)) => admin.or_else(|| state.admin.clone()),
                None => {
                    access.count_refused("unauthenticated");
                    return refusal(
                        StatusCode::UNAUTHORIZED,
                        "sign in to use the dashboard (an ACL account, or the [http] token)",
                        true,
                    );
                }
            }
        } else {
            state.admin.clone()
        };
        req.extensions_mut().insert(RequestAdmin(admin));
    }
    next.run(req).await
}

/// `GET /api/session`: whether a sign-in is needed, who is signed in, and the token POSTs
/// carry.
pub async fn session(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    let access = &state.access;
    let (account, csrf) = match access.session_of(&headers) {
        Some((account, csrf, _)) => (Some(account), csrf),
        None => (None, access.port_csrf.clone()),
    };
    Json(json!({
        "required": access.sign_in_required(),
        "signedIn": account.is_some(),
        "account": account,
        "acl": access.settings.acl.is_some(),
        "token": access.settings.token.is_some(),
        "csrf": csrf,
    }))
    .into_response()
}

/// What a sign-in sends.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignIn {
    access_key: Option<String>,
    secret_key: Option<String>,
    token: Option<String>,
}

/// `POST /api/session`: signs in with an ACL account's keys or the token.
pub async fn sign_in(
    State(state): State<HttpState>,
    ConnectInfo(Peer { addr: peer, tls }): ConnectInfo<Peer>,
    Json(body): Json<SignIn>,
) -> Response {
    let access = &state.access;
    if !access.sign_in_required() {
        return refusal(
            StatusCode::BAD_REQUEST,
            "this port needs no sign-in (ACL is off and no [http] token is set)",
            false,
        );
    }
    let s = &access.settings;
    let (kind, outcome) = match (&body.token, &body.access_key, &body.secret_key) {
        (Some(t), _, _) => (
            "token",
            match &s.token {
                Some(expected) if same(t, expected) => {
                    let creds = match (&s.acl, &s.token_account) {
                        (Some(acl), Some(a)) => acl.credentials(a),
                        _ => None,
                    };
                    let account = s
                        .token_account
                        .clone()
                        .unwrap_or_else(|| "token".to_string());
                    Ok((account, creds))
                }
                _ => Err("sign-in refused: wrong token".to_string()),
            },
        ),
        (None, Some(ak), Some(sk)) => (
            "acl",
            match &s.acl {
                Some(acl) => acl
                    .sign_in(ak, sk, peer.ip())
                    .map(|c| (ak.clone(), Some(c)))
                    .map_err(|e| e.0),
                None => Err("sign-in refused: ACL is off; sign in with the [http] token".into()),
            },
        ),
        _ => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "give accessKey and secretKey (an ACL account), or token",
                true,
            )
        }
    };
    let (account, creds) = match outcome {
        Ok(x) => x,
        Err(e) => {
            access.count_sign_in("refused", kind);
            tracing::warn!(peer = %peer, kind, "dashboard sign-in refused");
            return refusal(StatusCode::UNAUTHORIZED, &e, true);
        }
    };
    access.count_sign_in("ok", kind);
    tracing::info!(peer = %peer, account = %account, kind, "dashboard sign-in");
    let admin = creds.map(|c| Arc::new(state.signed_admin(c)));
    let (id, csrf) = access.start_session(account.clone(), admin);
    let mut r = Json(json!({"account": account, "csrf": csrf})).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        access.session_cookie(&id, access.settings.session_timeout.as_secs(), tls),
    );
    r
}

/// `POST /api/session/end`: signs out.
pub async fn sign_out(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    state.access.end_session(&headers);
    let mut r = Json(json!({"signedIn": false})).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        state.access.session_cookie("", 0, false),
    );
    r
}

impl HttpState {
    /// An admin client over the name servers that signs its requests with `creds`.
    fn signed_admin(&self, creds: SessionCredentials) -> AdminClient {
        let mut a = AdminClient::new(self.namesrv_addrs.clone())
            .with_timeout(Duration::from_secs(5))
            .with_credentials(creds);
        if let Some(tls) = &self.namesrv_tls {
            a = a.with_tls(tls.clone());
        }
        a
    }
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
    fn cookies_and_cross_site_headers() {
        let h = headers(&[("cookie", "a=1; shoal_session=abc ; b=2")]);
        assert_eq!(cookie(&h, COOKIE).as_deref(), Some("abc"));
        assert!(!cross_site(&headers(&[("host", "127.0.0.1:8090")])));
        assert!(!cross_site(&headers(&[
            ("host", "127.0.0.1:8090"),
            ("origin", "http://127.0.0.1:8090"),
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(cross_site(&headers(&[
            ("host", "127.0.0.1:8090"),
            ("origin", "http://evil.example")
        ])));
        assert!(cross_site(&headers(&[
            ("host", "127.0.0.1:8090"),
            ("sec-fetch-site", "cross-site")
        ])));
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
