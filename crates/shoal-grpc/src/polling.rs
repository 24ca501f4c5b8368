//! How long a ReceiveMessage call waits for messages (long polling), as RocketMQ's proxy
//! decides it: the request's `long_polling_timeout` when it names one; otherwise the call's
//! remaining time (the `grpc-timeout` header) less half the client's request timeout (from its
//! settings), which is how the Go client, whose receives name no polling time, is served. In
//! every case the answer comes [`POLL_RESERVE`] before the call's deadline, so a client never
//! sees its own call time out for want of messages.

use std::time::Duration;

/// Longest long polling of a receive (the broker's POP limit).
pub(crate) const MAX_LONG_POLLING: Duration = Duration::from_secs(60);
/// Long polling of a receive that names none and has no deadline.
pub(crate) const DEFAULT_LONG_POLLING: Duration = Duration::from_secs(20);
/// Receives are answered this much before the end of their polling time or deadline.
pub(crate) const POLL_RESERVE: Duration = Duration::from_millis(500);
/// A client's request timeout when its settings did not tell one (the clients' default).
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// The polling time of a receive: `requested` is its `long_polling_timeout`, `remaining` the
/// time left before its deadline, `request_timeout` the client's (from its settings).
pub(crate) fn polling_time(
    requested: Option<Duration>,
    remaining: Option<Duration>,
    request_timeout: Option<Duration>,
) -> Duration {
    let wanted = match (requested, remaining) {
        (Some(d), _) => d,
        (None, Some(left)) => {
            left.saturating_sub(request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT) / 2)
        }
        (None, None) => DEFAULT_LONG_POLLING,
    };
    let poll = wanted.min(MAX_LONG_POLLING).saturating_sub(POLL_RESERVE);
    match remaining {
        Some(left) => poll.min(left.saturating_sub(POLL_RESERVE)),
        None => poll,
    }
}

/// The `grpc-timeout` header's value (gRPC over HTTP/2: at most 8 digits and a unit of
/// H, M, S, m, u or n); `None` when it is missing or malformed.
pub(crate) fn grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_requested_polling_time_is_kept_within_the_deadline() {
        // The Java client: long_polling_timeout 2 s, deadline 2 s + its 10 s request timeout.
        assert_eq!(polling_time(Some(S(2)), Some(S(12)), Some(S(10))), MS(1500));
        // No deadline: the request's time less the reserve.
        assert_eq!(polling_time(Some(S(30)), None, None), MS(29_500));
        // Capped by the broker's limit.
        assert_eq!(
            polling_time(Some(S(600)), None, None),
            MAX_LONG_POLLING - POLL_RESERVE
        );
        // A deadline shorter than the requested time wins.
        assert_eq!(polling_time(Some(S(30)), Some(S(5)), None), MS(4500));
    }

    #[test]
    fn without_a_requested_time_the_deadline_decides() {
        // The Go client: await 2 s + request timeout 3 s as the deadline, no polling time.
        assert_eq!(polling_time(None, Some(S(5)), Some(S(3))), MS(3000));
        // Its settings unknown: the clients' default request timeout.
        assert_eq!(polling_time(None, Some(S(8)), None), MS(6000));
        // A deadline already (nearly) over: answered at once.
        assert_eq!(
            polling_time(None, Some(MS(300)), Some(S(3))),
            Duration::ZERO
        );
        // Neither: the default.
        assert_eq!(
            polling_time(None, None, None),
            DEFAULT_LONG_POLLING - POLL_RESERVE
        );
    }

    #[test]
    fn grpc_timeout_values() {
        assert_eq!(grpc_timeout("4999m"), Some(MS(4999)));
        assert_eq!(grpc_timeout("5S"), Some(S(5)));
        assert_eq!(grpc_timeout("2M"), Some(S(120)));
        assert_eq!(grpc_timeout("1H"), Some(S(3600)));
        assert_eq!(grpc_timeout("7000000u"), Some(S(7)));
        assert_eq!(
            grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "S", "5", "5s", "-5S", "123456789S", "5 S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
