//! The replicated state: every broker group's replication metadata, changed only by applying
//! [`Command`]s in log order.

use super::command::{Command, GroupInfo, Member, Outcome, Refusal};
pub use super::limits::MetadataLimits;
use crate::{BrokerId, Epoch};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Every broker group's replication metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    groups: BTreeMap<String, GroupInfo>,
    limits: MetadataLimits,
}

impl Metadata {
    /// Empty metadata with `limits`.
    pub fn new(limits: MetadataLimits) -> Self {
        Self {
            groups: BTreeMap::new(),
            limits,
        }
    }

    /// One group's metadata.
    pub fn group(&self, name: &str) -> Option<&GroupInfo> {
        self.groups.get(name)
    }

    /// Every group, by name.
    pub fn groups(&self) -> &BTreeMap<String, GroupInfo> {
        &self.groups
    }

    /// The limits in force (the last [`Command::SetLimits`] applied, or the defaults).
    pub fn limits(&self) -> MetadataLimits {
        self.limits
    }

    /// Applies one committed command; deterministic.
    pub fn apply(&mut self, cmd: &Command) -> Outcome {
        match self.try_apply(cmd) {
            Ok(outcome) => outcome,
            Err(refusal) => Outcome::Refused(refusal),
        }
    }

    fn try_apply(&mut self, cmd: &Command) -> Result<Outcome, Refusal> {
        match cmd {
            Command::SetLimits { limits } => {
                // Lower limits refuse what comes next; nothing held is dropped.
                self.limits = *limits;
                Ok(Outcome::LimitsSet)
            }
            Command::ApplyBrokerId { group, addr, token } => {
                if [group, addr, token]
                    .iter()
                    .any(|t| t.len() > self.limits.max_text_len)
                {
                    return Err(Refusal::Limit("max_text_len".into()));
                }
                if !self.groups.contains_key(group) && self.groups.len() >= self.limits.max_groups {
                    return Err(Refusal::Limit("max_groups".into()));
                }
                let max_members = self.limits.max_members;
                let info = self.groups.entry(group.clone()).or_default();
                if let Some((id, _)) = info.members.iter().find(|(_, m)| m.token == *token) {
                    return Ok(Outcome::BrokerId(*id));
                }
                if info.members.len() >= max_members {
                    return Err(Refusal::Limit("max_members".into()));
                }
                let id = info.next_broker_id.max(1);
                info.next_broker_id = id + 1;
                info.members.insert(
                    id,
                    Member {
                        addr: addr.clone(),
                        token: token.clone(),
                    },
                );
                Ok(Outcome::BrokerId(id))
            }
            Command::RegisterBroker {
                group,
                broker_id,
                addr,
            } => {
                if addr.len() > self.limits.max_text_len {
                    return Err(Refusal::Limit("max_text_len".into()));
                }
                let info = self.group_mut(group)?;
                let slot = info
                    .members
                    .get_mut(broker_id)
                    .ok_or(Refusal::UnknownBroker(*broker_id))?;
                slot.addr.clone_from(addr);
                Ok(Outcome::Group(info.clone()))
            }
            Command::AlterInSyncSet {
                group,
                master,
                master_epoch,
                in_sync_epoch,
                in_sync,
            } => {
                let info = self.group_mut(group)?;
                check_master(info, *master, *master_epoch)?;
                if *in_sync_epoch != info.in_sync_epoch {
                    return Err(Refusal::StaleInSyncEpoch {
                        current: info.in_sync_epoch,
                    });
                }
                if !in_sync.contains(master)
                    || in_sync.iter().any(|b| !info.members.contains_key(b))
                {
                    return Err(Refusal::InvalidInSyncSet);
                }
                if *in_sync != info.in_sync {
                    info.in_sync.clone_from(in_sync);
                    info.in_sync_epoch += 1;
                }
                Ok(Outcome::Group(info.clone()))
            }
            Command::GrantLease {
                group,
                master,
                master_epoch,
            } => {
                let info = self.group_mut(group)?;
                check_master(info, *master, *master_epoch)?;
                if info.fenced_epoch >= *master_epoch {
                    return Err(Refusal::LeaseFenced(info.fenced_epoch));
                }
                info.lease_generation += 1;
                Ok(Outcome::LeaseGranted {
                    master_epoch: *master_epoch,
                    generation: info.lease_generation,
                })
            }
            Command::FenceLeases {
                group,
                master_epoch,
            } => {
                let info = self.group_mut(group)?;
                if *master_epoch != info.master_epoch {
                    return Err(Refusal::StaleMasterEpoch {
                        current: info.master_epoch,
                    });
                }
                info.fenced_epoch = info.fenced_epoch.max(*master_epoch);
                Ok(Outcome::Group(info.clone()))
            }
            Command::ElectMaster {
                group,
                master,
                expect_master_epoch,
            } => {
                let info = self.group_mut(group)?;
                if *expect_master_epoch != info.master_epoch {
                    return Err(Refusal::StaleMasterEpoch {
                        current: info.master_epoch,
                    });
                }
                if !info.members.contains_key(master) {
                    return Err(Refusal::UnknownBroker(*master));
                }
                let first = info.master.is_none() && info.in_sync.is_empty();
                if !first {
                    if info.fenced_epoch < info.master_epoch {
                        return Err(Refusal::NotFenced);
                    }
                    if !info.in_sync.contains(master) {
                        return Err(Refusal::NotInSync(*master));
                    }
                }
                // The rest of the in-sync set stays in it (it holds everything acknowledged,
                // as Kafka keeps the ISR on a leader change); the old master leaves it.
                if let Some(old) = info.master.filter(|old| old != master) {
                    info.in_sync.remove(&old);
                }
                info.in_sync.insert(*master);
                info.master = Some(*master);
                info.master_epoch += 1;
                info.in_sync_epoch += 1;
                Ok(Outcome::Group(info.clone()))
            }
        }
    }

    fn group_mut(&mut self, name: &str) -> Result<&mut GroupInfo, Refusal> {
        self.groups.get_mut(name).ok_or(Refusal::UnknownGroup)
    }
}

fn check_master(info: &GroupInfo, master: BrokerId, master_epoch: Epoch) -> Result<(), Refusal> {
    if master_epoch != info.master_epoch {
        return Err(Refusal::StaleMasterEpoch {
            current: info.master_epoch,
        });
    }
    if info.master != Some(master) {
        return Err(Refusal::NotMaster);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const G: &str = "broker-a";

    fn group_of_three() -> Metadata {
        let mut m = Metadata::default();
        for i in 1..=3u64 {
            let out = m.apply(&Command::ApplyBrokerId {
                group: G.into(),
                addr: format!("127.0.0.1:{}", 10_000 + i),
                token: format!("t{i}"),
            });
            assert_eq!(out, Outcome::BrokerId(i));
        }
        m
    }

    fn elect(m: &mut Metadata, master: BrokerId, expect: Epoch) -> Outcome {
        m.apply(&Command::ElectMaster {
            group: G.into(),
            master,
            expect_master_epoch: expect,
        })
    }

    fn alter(m: &mut Metadata, master: BrokerId, me: Epoch, ie: Epoch, set: &[u64]) -> Outcome {
        m.apply(&Command::AlterInSyncSet {
            group: G.into(),
            master,
            master_epoch: me,
            in_sync_epoch: ie,
            in_sync: set.iter().copied().collect(),
        })
    }

    #[test]
    fn first_election_needs_no_fence_then_isr_and_fence_rule() {
        let mut m = group_of_three();
        let Outcome::Group(g) = elect(&mut m, 2, 0) else {
            panic!("first election refused")
        };
        assert_eq!((g.master, g.master_epoch, g.in_sync_epoch), (Some(2), 1, 1));
        assert_eq!(g.in_sync, BTreeSet::from([2]));
        // Grow the set; a stale in-sync epoch or a stale master is refused.
        assert!(matches!(
            alter(&mut m, 2, 1, 1, &[1, 2, 3]),
            Outcome::Group(_)
        ));
        assert_eq!(
            alter(&mut m, 2, 1, 1, &[2, 3]),
            Outcome::Refused(Refusal::StaleInSyncEpoch { current: 2 })
        );
        assert_eq!(
            alter(&mut m, 1, 1, 2, &[1, 3]),
            Outcome::Refused(Refusal::NotMaster)
        );
        assert_eq!(
            alter(&mut m, 2, 1, 2, &[1, 3]),
            Outcome::Refused(Refusal::InvalidInSyncSet)
        );
        // No second election before the leases are fenced.
        assert_eq!(elect(&mut m, 3, 1), Outcome::Refused(Refusal::NotFenced));
        let grant = Command::GrantLease {
            group: G.into(),
            master: 2,
            master_epoch: 1,
        };
        assert!(matches!(m.apply(&grant), Outcome::LeaseGranted { .. }));
        m.apply(&Command::FenceLeases {
            group: G.into(),
            master_epoch: 1,
        });
        assert_eq!(m.apply(&grant), Outcome::Refused(Refusal::LeaseFenced(1)));
        let Outcome::Group(g) = elect(&mut m, 3, 1) else {
            panic!("fenced election refused")
        };
        assert_eq!((g.master, g.master_epoch), (Some(3), 2));
        assert_eq!(
            g.in_sync,
            BTreeSet::from([1, 3]),
            "the old master leaves the set"
        );
        // The old master's proposals are now stale.
        assert_eq!(
            alter(&mut m, 2, 1, 2, &[1, 2]),
            Outcome::Refused(Refusal::StaleMasterEpoch { current: 2 })
        );
        // A decision taken at the old epoch is refused.
        assert_eq!(
            elect(&mut m, 1, 1),
            Outcome::Refused(Refusal::StaleMasterEpoch { current: 2 })
        );
    }

    #[test]
    fn only_an_in_sync_member_is_elected() {
        let mut m = group_of_three();
        elect(&mut m, 1, 0);
        alter(&mut m, 1, 1, 1, &[1, 2]);
        m.apply(&Command::FenceLeases {
            group: G.into(),
            master_epoch: 1,
        });
        assert_eq!(elect(&mut m, 3, 1), Outcome::Refused(Refusal::NotInSync(3)));
        assert!(matches!(elect(&mut m, 2, 1), Outcome::Group(_)));
    }

    #[test]
    fn limits_bound_groups_and_members() {
        let mut m = Metadata::new(MetadataLimits {
            max_groups: 1,
            max_members: 2,
            max_text_len: 8,
        });
        let apply = |m: &mut Metadata, g: &str| {
            m.apply(&Command::ApplyBrokerId {
                group: g.into(),
                addr: "a".into(),
                token: format!("{g}{}", m.groups().get(g).map_or(0, |i| i.members.len())),
            })
        };
        assert_eq!(apply(&mut m, "a"), Outcome::BrokerId(1));
        assert_eq!(apply(&mut m, "a"), Outcome::BrokerId(2));
        assert_eq!(
            apply(&mut m, "a"),
            Outcome::Refused(Refusal::Limit("max_members".into()))
        );
        assert_eq!(
            apply(&mut m, "b"),
            Outcome::Refused(Refusal::Limit("max_groups".into()))
        );
        // Asking again with a known token answers the same id.
        let again = m.apply(&Command::ApplyBrokerId {
            group: "a".into(),
            addr: "b".into(),
            token: "a1".into(),
        });
        assert_eq!(again, Outcome::BrokerId(2));
        let long = m.apply(&Command::ApplyBrokerId {
            group: "a".into(),
            addr: "x".repeat(9),
            token: "t".into(),
        });
        assert_eq!(
            long,
            Outcome::Refused(Refusal::Limit("max_text_len".into()))
        );
    }
}
