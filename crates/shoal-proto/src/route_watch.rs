//! Shoal's extension for route changes pushed by the name servers, in the range
//! `docs/protocol-extensions.md` reserves for them (requests 9070–9079).
//!
//! A Shoal client opts in when it asks for a route: GET_ROUTEINFO_BY_TOPIC with the extField
//! [`field::WATCH`]` = true`. A Shoal name server then remembers that this connection watches
//! the topic and, whenever the topic's route really changes (a broker serving it registered,
//! unregistered or expired; its queues or permissions changed on a broker), sends
//! [`request_code::NOTIFY_ROUTE_CHANGED`] (oneway, [`RouteChangedNotice`]) over the same
//! connection; the client asks for the routes it names again. The answer to the route request
//! says whether the watch was taken ([`field::WATCHED`]): a name server at its watch limit
//! answers the route without watching it. An Apache RocketMQ name server ignores the field and
//! never pushes; official clients never send it.

use crate::RemotingCommand;
use serde::{Deserialize, Serialize};

/// Request codes of pushed routes.
pub mod request_code {
    /// Name server → client, oneway: the routes of these topics changed, ask again
    /// ([`RouteChangedNotice`](super::RouteChangedNotice)).
    pub const NOTIFY_ROUTE_CHANGED: i32 = 9070;
}

/// extFields of pushed routes.
pub mod field {
    /// GET_ROUTEINFO_BY_TOPIC request: `true` asks the name server to push changes of this
    /// topic's route over this connection.
    pub const WATCH: &str = "shoalWatchRoute";
    /// GET_ROUTEINFO_BY_TOPIC answer (Shoal name servers, to a request with [`WATCH`]):
    /// `true` when the connection watches the topic now, `false` when a watch limit refused
    /// it (the route is answered all the same).
    pub const WATCHED: &str = "shoalRouteWatched";
}

/// The body of NOTIFY_ROUTE_CHANGED.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteChangedNotice {
    /// The watched topics whose route changed (sorted, each once).
    pub topics: Vec<String>,
}

/// Marks a GET_ROUTEINFO_BY_TOPIC request as a watch ([`field::WATCH`]).
pub fn watch(cmd: &mut RemotingCommand) {
    cmd.ext_fields
        .get_or_insert_with(Default::default)
        .insert(field::WATCH, "true");
}

/// True when a request asks for a watch.
pub fn wants_watch(cmd: &RemotingCommand) -> bool {
    cmd.ext(field::WATCH) == Some("true")
}

/// The notice for `topics`, as a oneway request.
///
/// # Errors
/// When the body cannot be encoded (never, for strings).
pub fn notice(topics: Vec<String>) -> crate::Result<RemotingCommand> {
    let mut cmd = RemotingCommand::request(request_code::NOTIFY_ROUTE_CHANGED)
        .with_json_body(&RouteChangedNotice { topics })?;
    cmd.set_oneway();
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code::request_code as rc;

    #[test]
    fn watch_field_round_trips_and_notice_is_oneway_json() {
        let mut req = RemotingCommand::request(rc::GET_ROUTEINFO_BY_TOPIC);
        assert!(!wants_watch(&req));
        watch(&mut req);
        assert!(wants_watch(&req));
        let n = notice(vec!["A".into(), "B".into()]).unwrap();
        assert!(n.is_oneway());
        assert_eq!(n.code, request_code::NOTIFY_ROUTE_CHANGED);
        let body: RouteChangedNotice = n.decode_json_body().unwrap();
        assert_eq!(body.topics, ["A", "B"]);
        assert_eq!(
            std::str::from_utf8(n.body.as_deref().unwrap()).unwrap(),
            r#"{"topics":["A","B"]}"#
        );
    }
}
