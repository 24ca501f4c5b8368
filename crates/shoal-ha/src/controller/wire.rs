//! The voters' messages on the wire: raft-rs's `eraftpb::Message` in its protobuf encoding, as
//! the body of a frame of whatever transport carries it (Shoal's controller process sends it
//! as a oneway remoting request).

use protobuf::Message as _;
use raft::eraftpb::Message;

/// A voter's message or log that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// protobuf refused it.
    #[error("raft message: {0}")]
    Protobuf(#[from] protobuf::ProtobufError),
    /// Bytes that are not what was expected.
    #[error("{0}")]
    Format(&'static str),
}

/// The protobuf bytes of `msg`.
///
/// # Errors
/// When protobuf refuses the message (a field out of its range).
pub fn encode_raft_message(msg: &Message) -> Result<Vec<u8>, WireError> {
    Ok(msg.write_to_bytes()?)
}

/// The message in `bytes`.
///
/// # Errors
/// When `bytes` is not a protobuf-encoded `eraftpb::Message`.
pub fn decode_raft_message(bytes: &[u8]) -> Result<Message, WireError> {
    Ok(Message::parse_from_bytes(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{Entry, MessageType};

    #[test]
    fn a_message_with_entries_round_trips_and_garbage_is_refused() {
        let mut msg = Message::default();
        msg.set_msg_type(MessageType::MsgAppend);
        msg.from = 1;
        msg.to = 3;
        msg.term = 7;
        let entry = Entry {
            index: 12,
            term: 7,
            data: b"{\"GrantLease\":{}}".to_vec().into(),
            ..Default::default()
        };
        msg.mut_entries().push(entry);
        let bytes = encode_raft_message(&msg).unwrap();
        assert_eq!(decode_raft_message(&bytes).unwrap(), msg);
        assert!(decode_raft_message(&[0xff, 0xff, 0xff]).is_err());
    }
}
