//! A blocking Kafka client at the wire level, for tests that send the listener exact requests
//! (one connection, requests answered in order).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    dead_code,
    reason = "test code: a failed unwrap is a failed test; not every test uses every helper"
)]

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One Kafka connection.
pub struct Client {
    /// The connection (a test may write raw bytes to it).
    pub stream: TcpStream,
    next: i32,
}

impl Client {
    pub fn connect(addr: &str) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client { stream, next: 1 }
    }

    /// Sends `req` as `key` at `version` and reads its answer.
    pub fn call<Q: Encodable + HeaderVersion, R: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Q,
    ) -> R {
        let id = self.next;
        self.next += 1;
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .with_client_id(Some(StrBytes::from_static_str("shoal-test")))
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        req.encode(&mut buf, version).unwrap();
        let len = (buf.len() - 4) as i32;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&buf).unwrap();

        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut body).unwrap();
        let mut b = Bytes::from(body);
        let h = ResponseHeader::decode(&mut b, key.response_header_version(version)).unwrap();
        assert_eq!(h.correlation_id, id);
        R::decode(&mut b, version).unwrap()
    }
}

/// A topic name.
pub fn topic_name(t: &str) -> TopicName {
    TopicName(StrBytes::from_string(t.to_string()))
}
