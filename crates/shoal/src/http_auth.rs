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

use crate::http_access::{same, Peer, RequestAdmin, CSRF_HEADER};
use crate::http_state::HttpState;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use shoal_client::AdminClient;
use shoal_proto::acl::SessionCredentials;
use std::sync::Arc;
use std::time::Duration;

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
pub(crate) async fn guard(
    State(state): State<HttpState>,
    mut req: Request,
    next: Next,
) -> Response {
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
pub(crate) async fn session(State(state): State<HttpState>, headers: HeaderMap) -> Response {
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
pub(crate) struct SignIn {
    access_key: Option<String>,
    secret_key: Option<String>,
    token: Option<String>,
}

/// `POST /api/session`: signs in with an ACL account's keys or the token.
pub(crate) async fn sign_in(
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
pub(crate) async fn sign_out(State(state): State<HttpState>, headers: HeaderMap) -> Response {
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
    use crate::http_access::{cookie, COOKIE};
    use axum::http::HeaderValue;

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
}
