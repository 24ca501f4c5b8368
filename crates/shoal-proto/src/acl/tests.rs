use super::*;
use crate::code::request_code as rc;
use crate::header::PullMessageRequestHeader;
use std::net::IpAddr;

fn pull() -> RemotingCommand {
    RemotingCommand::request_with_header(
        rc::PULL_MESSAGE,
        &PullMessageRequestHeader {
            consumer_group: "group".into(),
            topic: "topic".into(),
            queue_id: 1,
            queue_offset: 2,
            max_msg_nums: 32,
            sys_flag: 0,
            commit_offset: 0,
            suspend_timeout_millis: 15000,
            sub_version: 0,
            ..Default::default()
        },
    )
}

#[test]
fn signature_matches_rocketmq_vectors() {
    // AclSignerTest in Apache RocketMQ.
    assert_eq!(
        calc_signature(b"RocketMQ", "12345678"),
        "IUc8rrO/0gDch8CjObLQsW2rsiA="
    );
    // A pull signed as AclClientRPCHook does, computed independently (Python hmac) from the
    // Java rule: values of the sorted extFields, then the body.
    let mut cmd = pull().with_body(&b"hello"[..]);
    let ext = cmd.ext_fields.as_mut().unwrap();
    // Only the fields the Java header sends (Shoal's header may send optional ones too).
    ext.retain(|k, _| {
        [
            "consumerGroup",
            "topic",
            "queueId",
            "queueOffset",
            "maxMsgNums",
            "sysFlag",
            "commitOffset",
            "suspendTimeoutMillis",
            "subVersion",
        ]
        .contains(&k)
    });
    sign_request(&mut cmd, &SessionCredentials::new("ak", "secretkey123"));
    let ext = cmd.ext_fields.as_ref().unwrap();
    assert_eq!(ext.get(ACCESS_KEY).unwrap(), "ak");
    assert_eq!(
        signed_content(Some(ext), None),
        b"ak0group32120150000topic".to_vec()
    );
    assert_eq!(ext.get(SIGNATURE).unwrap(), "PPIKplFFRQiQcE7f0K5OtbahHUE=");
}

#[test]
fn signature_covers_every_field_but_itself_and_the_unique_key_flag() {
    let creds = SessionCredentials {
        access_key: "rocketmq2".into(),
        secret_key: "12345678".into(),
        security_token: Some("tok".into()),
    };
    let mut a = pull();
    sign_request(&mut a, &creds);
    let sig = a.ext_fields.as_ref().unwrap()[SIGNATURE].to_owned();
    assert_eq!(&a.ext_fields.as_ref().unwrap()[SECURITY_TOKEN], "tok");
    // Re-signing is stable; the unique-key flag does not change it; any other field does.
    let mut b = a.clone();
    b.ext_fields
        .as_mut()
        .unwrap()
        .insert(UNIQUE_MSG_QUERY_FLAG, "true");
    sign_request(&mut b, &creds);
    assert_eq!(&b.ext_fields.as_ref().unwrap()[SIGNATURE], sig);
    let mut c = a.clone();
    c.ext_fields.as_mut().unwrap().insert("queueId", "2");
    sign_request(&mut c, &creds);
    assert_ne!(&c.ext_fields.as_ref().unwrap()[SIGNATURE], sig);
    let mut d = a.clone().with_body(&b"x"[..]);
    sign_request(&mut d, &creds);
    assert_ne!(&d.ext_fields.as_ref().unwrap()[SIGNATURE], sig);
    // Debug never shows the secret.
    assert!(!format!("{creds:?}").contains("12345678"));
}

/// The example accounts of RocketMQ's plain_acl.yml (as JSON: proto has no TOML parser;
/// the broker's TOML uses the same keys).
fn acl() -> AccessControl {
    let cfg: PlainAclConfig = serde_json::from_value(serde_json::json!({
        "globalWhiteRemoteAddresses": ["10.10.103.*"],
        "accounts": [
            {"accessKey": "RocketMQ", "secretKey": "12345678", "whiteRemoteAddress": "192.168.0.*",
             "admin": false, "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB",
             "topicPerms": ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"],
             "groupPerms": ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"]},
            {"accessKey": "rocketmq2", "secretKey": "12345678", "admin": true}
        ]
    }))
    .unwrap();
    AccessControl::new(&cfg).unwrap()
}

fn send(topic: &str) -> RemotingCommand {
    let mut ext = ExtFields::new();
    ext.insert("a", "PG");
    ext.insert("b", topic);
    RemotingCommand::request(rc::SEND_MESSAGE_V2).with_ext_fields(ext)
}

fn decide(cmd: &RemotingCommand, from: &str) -> Result<(), AccessDenied> {
    let ip: IpAddr = from.parse().unwrap();
    acl().check(&AccessRequest::parse(cmd, ip), ADMIN_REQUEST_CODES)
}

fn signed(mut cmd: RemotingCommand, ak: &str, sk: &str) -> RemotingCommand {
    sign_request(&mut cmd, &SessionCredentials::new(ak, sk));
    cmd
}

#[test]
fn permissions_as_plain_acl() {
    let here = "192.168.0.5";
    // Unauthenticated and unknown keys are refused; the global allow-list needs nothing.
    assert!(decide(&send("topicB"), here)
        .unwrap_err()
        .0
        .contains("No accessKey"));
    assert!(
        decide(&signed(send("topicB"), "nobody12", "12345678"), here)
            .unwrap_err()
            .0
            .contains("No acl config")
    );
    decide(&send("topicB"), "10.10.103.7").unwrap();
    // Wrong secret, or a field changed after signing.
    let bad = signed(send("topicB"), "RocketMQ", "wrong-secret");
    assert!(decide(&bad, here).unwrap_err().0.contains("signature"));
    let mut tampered = signed(send("topicB"), "RocketMQ", "12345678");
    tampered.ext_fields.as_mut().unwrap().insert("b", "topicC");
    assert!(decide(&tampered, here).unwrap_err().0.contains("signature"));
    // Per-topic permissions and the default.
    decide(&signed(send("topicB"), "RocketMQ", "12345678"), here).unwrap();
    for t in ["topicA", "topicC", "other"] {
        let e = decide(&signed(send(t), "RocketMQ", "12345678"), here).unwrap_err();
        assert!(e.0.contains(&format!("topic {t}")), "{e}");
    }
    // The account may not be used from elsewhere.
    assert!(decide(
        &signed(send("topicB"), "RocketMQ", "12345678"),
        "192.168.1.5"
    )
    .unwrap_err()
    .0
    .contains("may not be used from"));
    // Pulls need SUB on the topic and the group.
    let mut p = pull();
    let ext = p.ext_fields.as_mut().unwrap();
    ext.insert("topic", "topicC");
    ext.insert("consumerGroup", "groupC");
    decide(&signed(p.clone(), "RocketMQ", "12345678"), here).unwrap();
    p.ext_fields
        .as_mut()
        .unwrap()
        .insert("consumerGroup", "groupA");
    assert!(decide(&signed(p.clone(), "RocketMQ", "12345678"), here)
        .unwrap_err()
        .0
        .contains("group groupA"));
    // Default group permission SUB.
    p.ext_fields
        .as_mut()
        .unwrap()
        .insert("consumerGroup", "anyGroup");
    decide(&signed(p, "RocketMQ", "12345678"), here).unwrap();
    // Admin requests need an admin account; an admin without listed permissions may do all.
    let create = RemotingCommand::request(rc::UPDATE_AND_CREATE_TOPIC);
    assert!(
        decide(&signed(create.clone(), "RocketMQ", "12345678"), here)
            .unwrap_err()
            .0
            .contains("admin")
    );
    decide(&signed(create, "rocketmq2", "12345678"), "8.8.8.8").unwrap();
    decide(
        &signed(send("anything"), "rocketmq2", "12345678"),
        "8.8.8.8",
    )
    .unwrap();
}

#[test]
fn bad_configs_are_refused() {
    let cfg = |v: serde_json::Value| serde_json::from_value::<PlainAclConfig>(v).unwrap();
    let short =
        cfg(serde_json::json!({"accounts": [{"accessKey": "abc", "secretKey": "12345678"}]}));
    assert!(AccessControl::new(&short).is_err());
    let perm = cfg(
        serde_json::json!({"accounts": [{"accessKey": "abcdefg", "secretKey": "12345678", "topicPerms": ["t=ALL"]}]}),
    );
    assert!(AccessControl::new(&perm).unwrap_err().contains("ALL"));
    let pattern = cfg(serde_json::json!({"globalWhiteRemoteAddresses": ["1.2"]}));
    assert!(AccessControl::new(&pattern).is_err());
    assert!(serde_json::from_value::<PlainAclConfig>(serde_json::json!({"acounts": []})).is_err());
}

#[test]
fn sign_in_checks_the_keys_and_the_address() {
    let a = acl();
    let here: IpAddr = "192.168.0.7".parse().unwrap();
    let c = a.sign_in("RocketMQ", "12345678", here).unwrap();
    assert_eq!(
        (c.access_key.as_str(), c.secret_key.as_str()),
        ("RocketMQ", "12345678")
    );
    // Its whiteRemoteAddress holds for a sign-in too.
    let e = a
        .sign_in("RocketMQ", "12345678", "127.0.0.1".parse().unwrap())
        .unwrap_err()
        .0;
    assert!(e.contains("may not be used from 127.0.0.1"), "{e}");
    // Wrong secret and unknown account: the same refusal, which does not say which.
    let wrong = a.sign_in("RocketMQ", "12345679", here).unwrap_err().0;
    let unknown = a.sign_in("nobody1", "12345678", here).unwrap_err().0;
    assert!(wrong.contains("sign-in refused") && unknown.contains("sign-in refused"));
    assert!(!wrong.contains("secret"));
    assert_eq!(a.credentials("RocketMQ").unwrap().secret_key, "12345678");
    assert!(a.credentials("nobody1").is_none());
}
