//! What handlers return: [`Handled`], [`Reject`] and the small helpers around them. A leaf
//! module, so handlers do not import back from the dispatcher ([`crate::processor`]).

use shoal_proto::code::response_code as resp;
use shoal_proto::RemotingCommand;

/// A refusal: response code and remark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Response code.
    pub code: i32,
    /// Remark naming the problem.
    pub remark: String,
}

impl Reject {
    /// A refusal with `code` and `remark`.
    pub fn new(code: i32, remark: impl Into<String>) -> Self {
        Self {
            code,
            remark: remark.into(),
        }
    }

    /// SYSTEM_ERROR with the error's text (bad header, bad body, store failure).
    pub fn system(e: impl std::fmt::Display) -> Self {
        Self::new(resp::SYSTEM_ERROR, e.to_string())
    }
}

impl From<shoal_proto::ProtoError> for Reject {
    fn from(e: shoal_proto::ProtoError) -> Self {
        Reject::system(e)
    }
}

/// What a handler returns: a response now, nothing now (oneway, or answered later), or a
/// refusal.
pub(crate) type Handled = Result<Option<RemotingCommand>, Reject>;

/// Success with no header fields and no body.
pub(crate) fn ok() -> Handled {
    Ok(Some(RemotingCommand::response(resp::SUCCESS, None)))
}

/// Success with a JSON body.
pub(crate) fn ok_json<T: serde::Serialize>(value: &T) -> Handled {
    let body = shoal_proto::body::to_json_bytes(value)?;
    Ok(Some(
        RemotingCommand::response(resp::SUCCESS, None).with_body(body),
    ))
}

/// Runs blocking store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Reject> + Send + 'static,
) -> Result<T, Reject> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Reject::system(format!("store task failed: {e}")))?
}

/// Whether a counter just reached a value worth a log line (1, 2, 4, 8, ...), so a flood of
/// refusals logs a few lines, not one per request.
pub(crate) fn worth_logging(count: u64) -> bool {
    count.is_power_of_two()
}
