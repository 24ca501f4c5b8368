//! The voter's tests: three voters wired to each other in memory.

mod tests {
    use super::super::*;
    use crate::time::Millis;
    use crate::BrokerId;
    use std::collections::BTreeSet;

    const G: &str = "broker-a";

    /// Three voters wired to each other with no delay.
    struct Cluster {
        nodes: Vec<ControllerNode>,
        now: Millis,
        answers: Vec<(ClientToken, Response)>,
    }

    impl Cluster {
        fn new() -> Self {
            let voters = vec![1, 2, 3];
            let nodes = voters
                .iter()
                .map(|id| {
                    let cfg = ControllerConfig::new(*id, voters.clone());
                    ControllerNode::new(cfg, ControllerStorage::default(), 0).expect("voter")
                })
                .collect();
            let mut c = Self {
                nodes,
                now: 0,
                answers: Vec::new(),
            };
            c.run_for(3_000);
            c
        }

        fn pump(&mut self) {
            loop {
                let mut moved = false;
                for i in 0..self.nodes.len() {
                    while let Some(m) = self.nodes[i].poll_transmit() {
                        let to = m.to as usize - 1;
                        let now = self.now;
                        self.nodes[to].handle_message(now, m);
                        moved = true;
                    }
                    while let Some(a) = self.nodes[i].poll_response() {
                        self.answers.push(a);
                    }
                }
                if !moved {
                    return;
                }
            }
        }

        fn run_for(&mut self, ms: Millis) {
            let until = self.now + ms;
            while self.now < until {
                self.now += 10;
                for n in &mut self.nodes {
                    n.handle_timeout(self.now);
                }
                self.pump();
            }
        }

        fn leader(&self) -> usize {
            self.nodes
                .iter()
                .position(ControllerNode::is_leader)
                .expect("a leader")
        }

        fn ask(&mut self, token: ClientToken, req: Request) -> Response {
            let l = self.leader();
            let now = self.now;
            self.nodes[l].handle_request(now, token, req);
            self.pump();
            let i = self
                .answers
                .iter()
                .position(|(t, _)| *t == token)
                .expect("answered");
            self.answers.remove(i).1
        }

        fn heartbeat(&mut self, broker_id: BrokerId, end_offset: u64) -> Response {
            let req = Request::Heartbeat {
                group: G.into(),
                broker_id,
                last_epoch: 0,
                end_offset,
            };
            self.ask(1_000 + broker_id, req)
        }

        fn group(&self) -> GroupInfo {
            self.nodes[self.leader()]
                .metadata()
                .group(G)
                .cloned()
                .expect("group")
        }
    }

    #[test]
    fn the_leaders_limits_reach_every_voter_through_the_log() {
        let voters = vec![1, 2, 3];
        let nodes = voters
            .iter()
            .map(|id| {
                let mut cfg = ControllerConfig::new(*id, voters.clone());
                cfg.limits.max_groups = 1;
                ControllerNode::new(cfg, ControllerStorage::default(), 0).expect("voter")
            })
            .collect();
        let mut c = Cluster {
            nodes,
            now: 0,
            answers: Vec::new(),
        };
        c.run_for(3_000);
        for n in &c.nodes {
            assert_eq!(n.metadata().limits().max_groups, 1, "voter {}", n.id());
        }
        let apply = |g: &str| Request::ApplyBrokerId {
            group: g.into(),
            addr: "a".into(),
            token: "t".into(),
        };
        assert_eq!(c.ask(1, apply("g1")), Response::BrokerId(1));
        assert_eq!(
            c.ask(2, apply("g2")),
            Response::Refused(Refusal::Limit("max_groups".into()))
        );
    }

    #[test]
    fn a_follower_answers_not_leader() {
        let mut c = Cluster::new();
        let l = c.leader();
        let f = (l + 1) % 3;
        let now = c.now;
        c.nodes[f].handle_request(
            now,
            9,
            Request::ElectMaster {
                group: G.into(),
                target: None,
            },
        );
        let leader = Some(l as u64 + 1);
        assert_eq!(
            c.nodes[f].poll_response(),
            Some((9, Response::NotLeader { leader }))
        );
    }

    #[test]
    fn elects_the_best_replica_then_fails_over_only_after_the_lease() {
        let mut c = Cluster::new();
        // Broker 2 has the most data: the first election picks it once a session passed; the
        // master grows the set and holds a lease.
        let renew = with_master_2(&mut c);
        assert!(matches!(
            c.ask(51, renew.clone()),
            Response::LeaseGranted { .. }
        ));
        let last_grant = c.now;
        // The master goes silent; the others keep beating (broker 3 has more).
        let mut elected_at = None;
        for _ in 0..100 {
            c.heartbeat(1, 100);
            c.heartbeat(3, 120);
            c.run_for(100);
            if elected_at.is_none() && c.group().master_epoch == 2 {
                elected_at = Some(c.now);
            }
        }
        let g = c.group();
        assert_eq!(g.master, Some(3));
        assert_eq!(g.in_sync, BTreeSet::from([1, 3]));
        let cfg = ControllerConfig::new(1, vec![1]);
        let at = elected_at.expect("elected");
        assert!(
            at >= last_grant + cfg.lease.election_delay_ms(),
            "elected at {at}, lease granted at {last_grant}"
        );
        // The old master's lease and proposals are refused now.
        assert_eq!(
            c.ask(52, renew),
            Response::Refused(Refusal::StaleMasterEpoch { current: 2 })
        );
    }

    /// Three brokers applied and heartbeating until broker 2 (most data) is master with all
    /// three in sync and a lease; returns the renewal request.
    fn with_master_2(c: &mut Cluster) -> Request {
        for b in 1..=3u64 {
            let req = Request::ApplyBrokerId {
                group: G.into(),
                addr: format!("a{b}"),
                token: format!("t{b}"),
            };
            assert_eq!(c.ask(b, req), Response::BrokerId(b));
        }
        for _ in 0..20 {
            for b in 1..=3 {
                c.heartbeat(b, if b == 2 { 100 } else { 0 });
            }
            c.run_for(200);
        }
        let g = c.group();
        assert_eq!((g.master, g.master_epoch), (Some(2), 1));
        let alter = Request::AlterInSyncSet {
            group: G.into(),
            master: 2,
            master_epoch: 1,
            in_sync_epoch: g.in_sync_epoch,
            in_sync: BTreeSet::from([1, 2, 3]),
        };
        assert!(matches!(c.ask(50, alter), Response::Group(_)));
        Request::RenewLease {
            group: G.into(),
            broker_id: 2,
            master_epoch: 1,
        }
    }

    #[test]
    fn the_leader_tells_a_groups_members_once_per_change() {
        let mut c = Cluster::new();
        let renew = with_master_2(&mut c);
        let l = c.leader();
        let mut notices = GroupNotices::new();
        let mut follower = GroupNotices::new();
        // Just leading: every group once.
        let first = notices.poll(&c.nodes[l]);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].master, first[0].master_epoch), (Some(2), 1));
        let to: Vec<BrokerId> = first[0].to.iter().map(|(id, _)| *id).collect();
        assert_eq!(to, vec![1, 2, 3]);
        assert_eq!(first[0].to[0].1, "a1");
        let cmd = first[0].to_command();
        assert!(cmd.is_oneway());
        assert_eq!(GroupNotice::group_of(&cmd), Some(G));
        assert_eq!(cmd.ext("masterAddress"), Some("a2"));
        assert_eq!(cmd.ext("masterEpoch"), Some("1"));
        assert!(
            follower.poll(&c.nodes[(l + 1) % 3]).is_empty(),
            "followers never tell"
        );
        // Heartbeats and leases change nothing a member must hear of.
        c.heartbeat(1, 100);
        assert!(matches!(c.ask(52, renew), Response::LeaseGranted { .. }));
        assert!(notices.poll(&c.nodes[l]).is_empty());
        // The master's connection closes; once elected, the new master is told of.
        let now = c.now;
        c.nodes[l].handle_broker_disconnected(now, G, 2);
        let mut told = Vec::new();
        for _ in 0..100 {
            c.heartbeat(1, 100);
            c.heartbeat(3, 120);
            c.run_for(50);
            told.extend(notices.poll(&c.nodes[c.leader()]));
            if c.group().master_epoch == 2 {
                break;
            }
        }
        let elected: Vec<&GroupNotice> = told.iter().filter(|n| n.master_epoch == 2).collect();
        assert_eq!(elected.len(), 1, "{told:?}");
        assert_eq!(elected[0].master, Some(3));
        assert_eq!(elected[0].to.len(), 3);
        assert!(notices.poll(&c.nodes[c.leader()]).is_empty());
    }

    #[test]
    fn a_masters_closed_connection_elects_once_the_lease_allows_not_a_session_later() {
        let mut c = Cluster::new();
        let renew = with_master_2(&mut c);
        let cfg = ControllerConfig::new(1, vec![1]);
        // The master beats and renews, then its connection closes right after a grant.
        c.heartbeat(2, 100);
        assert!(matches!(c.ask(51, renew), Response::LeaseGranted { .. }));
        let last_grant = c.now;
        let l = c.leader();
        let left = c.nodes[l].lease_left_ms(G).expect("leader");
        assert!(left > 0 && left <= cfg.lease.lease_ms(), "{left}");
        // A follower ignores the event, as it ignores heartbeats.
        let f = (l + 1) % 3;
        let now = c.now;
        c.nodes[f].handle_broker_disconnected(now, G, 2);
        assert!(c.nodes[f].alive(G).is_empty());
        c.nodes[l].handle_broker_disconnected(now, G, 2);
        c.pump();
        assert!(!c.nodes[l].alive(G).contains(&2));
        let heard = c.nodes[l].heard(G);
        let two = heard.iter().find(|h| h.broker_id == 2).expect("heard");
        assert!(two.disconnected && !two.alive && two.end_offset == 100);
        let mut elected_at = None;
        while elected_at.is_none() && c.now < last_grant + 10 * cfg.session_timeout_ms {
            c.heartbeat(1, 100);
            c.heartbeat(3, 120);
            c.run_for(50);
            if c.group().master_epoch == 2 {
                elected_at = Some(c.now);
            }
        }
        let at = elected_at.expect("elected");
        assert_eq!(c.group().master, Some(3));
        // Never before the old lease has certainly expired; well before the session would
        // have declared the master dead.
        assert!(
            at >= last_grant + cfg.lease.election_delay_ms(),
            "{at} {last_grant}"
        );
        assert!(
            at < last_grant + cfg.session_timeout_ms,
            "{at} {last_grant}"
        );
    }

    #[test]
    fn a_broker_heard_again_after_its_connection_closed_is_alive() {
        let mut c = Cluster::new();
        let _ = with_master_2(&mut c);
        let l = c.leader();
        let now = c.now;
        c.nodes[l].handle_broker_disconnected(now, G, 1);
        assert!(!c.nodes[l].alive(G).contains(&1));
        c.heartbeat(1, 100);
        assert!(c.nodes[c.leader()].alive(G).contains(&1));
    }

    #[test]
    fn a_manual_switch_over_waits_for_the_lease_and_answers() {
        let mut c = Cluster::new();
        for b in 1..=2u64 {
            let req = Request::ApplyBrokerId {
                group: G.into(),
                addr: format!("a{b}"),
                token: format!("t{b}"),
            };
            c.ask(b, req);
        }
        for _ in 0..20 {
            c.heartbeat(1, 10);
            c.heartbeat(2, 0);
            c.run_for(200);
        }
        assert_eq!(c.group().master, Some(1));
        let e = c.group().in_sync_epoch;
        let alter = Request::AlterInSyncSet {
            group: G.into(),
            master: 1,
            master_epoch: 1,
            in_sync_epoch: e,
            in_sync: BTreeSet::from([1, 2]),
        };
        c.ask(60, alter);
        let l = c.leader();
        let now = c.now;
        c.nodes[l].handle_request(
            now,
            61,
            Request::ElectMaster {
                group: G.into(),
                target: Some(2),
            },
        );
        c.pump();
        let mut answer = None;
        for _ in 0..100 {
            // The master keeps renewing: refused once the fence is applied.
            let renew = Request::RenewLease {
                group: G.into(),
                broker_id: 1,
                master_epoch: 1,
            };
            c.ask(62, renew);
            c.heartbeat(1, 10);
            c.heartbeat(2, 10);
            c.run_for(100);
            if let Some(i) = c.answers.iter().position(|(t, _)| *t == 61) {
                answer = Some(c.answers.remove(i).1);
                break;
            }
        }
        let Some(Response::Group(g)) = answer else {
            panic!("switch-over answered {answer:?}")
        };
        assert_eq!((g.master, g.master_epoch), (Some(2), 2));
    }
}

mod snapshot_tests {
    use super::super::*;
    use crate::time::Millis;

    #[test]
    fn a_voter_behind_the_compaction_point_catches_up_from_a_snapshot() {
        let voters = vec![1, 2, 3];
        let storages: Vec<ControllerStorage> =
            (0..3).map(|_| ControllerStorage::default()).collect();
        let mut nodes: Vec<Option<ControllerNode>> = (0..3)
            .map(|i| {
                let mut cfg = ControllerConfig::new(i as u64 + 1, voters.clone());
                cfg.compact_every = 8;
                ControllerNode::new(cfg, storages[i].clone(), 0).ok()
            })
            .collect();
        let mut now = 0;
        let mut answers = Vec::new();
        let step = |nodes: &mut Vec<Option<ControllerNode>>, now: Millis, answers: &mut Vec<_>| {
            for n in nodes.iter_mut().flatten() {
                n.handle_timeout(now);
            }
            loop {
                let mut moved = false;
                for i in 0..nodes.len() {
                    let mut out = Vec::new();
                    if let Some(n) = &mut nodes[i] {
                        while let Some(m) = n.poll_transmit() {
                            out.push(m);
                        }
                        while let Some(a) = n.poll_response() {
                            answers.push(a);
                        }
                    }
                    for m in out {
                        let to = m.to as usize - 1;
                        if let Some(t) = &mut nodes[to] {
                            t.handle_message(now, m);
                            moved = true;
                        }
                    }
                }
                if !moved {
                    break;
                }
            }
        };
        for _ in 0..300 {
            now += 10;
            step(&mut nodes, now, &mut answers);
        }
        // Voter 3 goes down; the others apply many entries and compact.
        nodes[2] = None;
        for b in 0..40u64 {
            now += 10;
            if let Some(l) = nodes.iter_mut().flatten().find(|n| n.is_leader()) {
                let req = Request::ApplyBrokerId {
                    group: "g".into(),
                    addr: format!("a{b}"),
                    token: format!("t{b}"),
                };
                l.handle_request(now, b, req);
            }
            step(&mut nodes, now, &mut answers);
        }
        assert!(
            storages[0].latest_snapshot().get_metadata().index > 8,
            "compacted"
        );
        let mut cfg = ControllerConfig::new(3, voters.clone());
        cfg.compact_every = 8;
        nodes[2] = ControllerNode::new(cfg, storages[2].clone(), now).ok();
        for _ in 0..300 {
            now += 10;
            step(&mut nodes, now, &mut answers);
        }
        let caught_up = nodes[2].as_ref().expect("voter 3");
        assert!(caught_up.snapshots_installed() >= 1);
        let leader = nodes
            .iter()
            .flatten()
            .find(|n| n.is_leader())
            .expect("leader");
        assert_eq!(caught_up.metadata(), leader.metadata());
        assert_eq!(
            caught_up.metadata().group("g").map(|g| g.members.len()),
            Some(16),
            "max_members of the default limits"
        );
        // A restart from its own snapshot and log gives the same metadata.
        let mut cfg = ControllerConfig::new(3, voters);
        cfg.compact_every = 8;
        let restarted = ControllerNode::new(cfg, storages[2].clone(), now).expect("restart");
        assert_eq!(
            restarted.metadata().group("g").map(|g| g.members.len()),
            Some(16)
        );
    }
}
