//! Replication messages on the remoting protocol: between the brokers of a group (Shoal's
//! codes 9082 and 9083, oneway, the message as JSON in a header field and a batch's bytes as
//! the body) and to the controller (RocketMQ's controller request codes with Shoal's JSON
//! bodies, as `shoal controller` serves them).

use bytes::Bytes;
use shoal_ha::controller::{Request, Response};
use shoal_ha::replication::{PeerMessage, ToMaster, ToReplica};
use shoal_ha::BrokerId;
use shoal_proto::ext::request_code as ext;
use shoal_proto::ext_fields::ExtFields;
use shoal_proto::RemotingCommand;

const GROUP: &str = "haGroup";
const FROM: &str = "haFrom";
const MESSAGE: &str = "haMessage";

/// A peer message decoded from a request.
#[derive(Debug)]
pub(crate) struct PeerFrame {
    pub(crate) group: String,
    pub(crate) from: BrokerId,
    pub(crate) msg: PeerMessage,
    /// A batch's bytes (empty otherwise).
    pub(crate) bytes: Bytes,
}

/// Whether `code` is one of the peer codes.
pub(crate) fn is_peer_code(code: i32) -> bool {
    code == ext::HA_TO_REPLICA || code == ext::HA_TO_MASTER
}

/// The oneway request carrying `msg` (and a batch's `bytes`) from broker `from` of `group`.
pub(crate) fn encode_peer(
    group: &str,
    from: BrokerId,
    msg: &PeerMessage,
    bytes: Bytes,
) -> Result<RemotingCommand, serde_json::Error> {
    let (code, json) = match msg {
        PeerMessage::ToReplica(m) => (ext::HA_TO_REPLICA, serde_json::to_string(m)?),
        PeerMessage::ToMaster(m) => (ext::HA_TO_MASTER, serde_json::to_string(m)?),
    };
    let mut fields = ExtFields::default();
    fields.insert(GROUP, group);
    fields.insert(FROM, from.to_string());
    fields.insert(MESSAGE, json);
    let mut cmd = RemotingCommand::request(code).with_ext_fields(fields);
    cmd.set_oneway();
    if !bytes.is_empty() {
        cmd = cmd.with_body(bytes);
    }
    Ok(cmd)
}

/// The peer message of a 9082/9083 request, or why it is not one.
pub(crate) fn decode_peer(cmd: &RemotingCommand) -> Result<PeerFrame, String> {
    let group = cmd.ext(GROUP).ok_or("no haGroup")?.to_string();
    let from: BrokerId = cmd
        .ext(FROM)
        .ok_or("no haFrom")?
        .parse()
        .map_err(|_| "haFrom is not a broker id")?;
    let json = cmd.ext(MESSAGE).ok_or("no haMessage")?;
    let msg = match cmd.code {
        ext::HA_TO_REPLICA => PeerMessage::ToReplica(
            serde_json::from_str::<ToReplica>(json).map_err(|e| format!("haMessage: {e}"))?,
        ),
        ext::HA_TO_MASTER => PeerMessage::ToMaster(
            serde_json::from_str::<ToMaster>(json).map_err(|e| format!("haMessage: {e}"))?,
        ),
        other => return Err(format!("code {other} is not a replication message")),
    };
    Ok(PeerFrame {
        group,
        from,
        msg,
        bytes: cmd.body.clone().unwrap_or_default(),
    })
}

/// The request for `req`.
pub(crate) fn encode_controller(req: &Request) -> Result<RemotingCommand, serde_json::Error> {
    Ok(RemotingCommand::request(req.request_code()).with_body(serde_json::to_vec(req)?))
}

/// The controller's answer in a response body (every answer, refusals included, carries one).
pub(crate) fn decode_controller(resp: &RemotingCommand) -> Option<Response> {
    serde_json::from_slice(resp.body.as_deref()?).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use shoal_ha::replication::BatchHeader;

    #[test]
    fn peer_messages_round_trip_with_their_bytes() {
        let msg = PeerMessage::ToReplica(ToReplica::Batch(BatchHeader {
            master_epoch: 3,
            batch_epoch: 2,
            start: 100,
            end: 164,
            confirmed: 90,
        }));
        let cmd = encode_peer("g", 1, &msg, Bytes::from(vec![7u8; 64])).unwrap();
        assert!(cmd.is_oneway());
        assert!(is_peer_code(cmd.code));
        // Through the wire's codec and back.
        let mut frame = bytes::BytesMut::new();
        cmd.encode(&mut frame).unwrap();
        let back = RemotingCommand::decode(frame.freeze().slice(4..)).unwrap();
        let f = decode_peer(&back).unwrap();
        assert_eq!((f.group.as_str(), f.from), ("g", 1));
        assert_eq!(f.msg, msg);
        assert_eq!(f.bytes.len(), 64);

        let ack = PeerMessage::ToMaster(ToMaster::Ack {
            replica: 2,
            master_epoch: 3,
            end: 164,
        });
        let cmd = encode_peer("g", 2, &ack, Bytes::new()).unwrap();
        let f = decode_peer(&cmd).unwrap();
        assert_eq!(f.msg, ack);
        assert!(f.bytes.is_empty());

        let mut bad = cmd.clone();
        bad.ext_fields.as_mut().unwrap().insert(MESSAGE, "{");
        assert!(decode_peer(&bad).is_err());
    }
}
