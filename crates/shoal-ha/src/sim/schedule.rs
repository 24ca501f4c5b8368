//! A run's settings and the faults a seed draws.

use crate::replication::AckMode;
use crate::time::Millis;
use rand::Rng;

/// A simulated run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed: the same seed gives the same run.
    pub seed: u64,
    /// Controller voters (1 or 3).
    pub controllers: usize,
    /// Brokers of the one group.
    pub brokers: usize,
    /// Faults happen in `[1 s, faults_until_ms)`; then everything heals.
    pub faults_until_ms: Millis,
    /// After healing, the group must accept and acknowledge a write within this.
    pub settle_ms: Millis,
    /// Acknowledgement mode of the masters.
    pub ack: AckMode,
    /// `min_in_sync` of the masters.
    pub min_in_sync: usize,
    /// Mean ms between two write attempts.
    pub write_every_ms: Millis,
    /// Retention every this many ms: each live broker deletes its log below what it knows
    /// confirmed (so replicas that fell behind, or lost their disk, must restart their logs
    /// at the master's first offset); `None`: logs are kept whole.
    pub retention_every_ms: Option<Millis>,
    /// Print every event and the brokers' roles to stderr (for replaying a seed).
    pub trace: bool,
}

impl SimConfig {
    /// Three voters, three brokers, acknowledgement by the whole in-sync set, at least two
    /// in sync, 8 s of faults.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            controllers: 3,
            brokers: 3,
            faults_until_ms: 8_000,
            settle_ms: 6_000,
            ack: AckMode::InSyncSet,
            min_in_sync: 2,
            write_every_ms: 10,
            retention_every_ms: None,
            trace: false,
        }
    }

    /// The variant a seed runs in the many-seeds test: voters, ack mode and `min_in_sync`
    /// vary with the seed.
    pub fn for_seed(seed: u64) -> Self {
        let mut cfg = Self::new(seed);
        if seed % 4 == 1 {
            cfg.controllers = 1;
        }
        if seed % 5 == 2 {
            cfg.min_in_sync = 1;
        }
        if seed % 10 == 9 {
            cfg.retention_every_ms = Some(1_500);
        }
        if seed % 7 == 3 {
            cfg.ack = AckMode::Master;
            cfg.min_in_sync = 1;
        }
        cfg
    }
}

/// A process of the simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    /// A controller voter, by index.
    Controller(usize),
    /// A broker, by index.
    Broker(usize),
    /// An operator's command-line tool.
    Operator,
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Kill a broker; it restarts after `down_ms` with its disk.
    CrashBroker {
        /// Which.
        broker: usize,
        /// For how long.
        down_ms: Millis,
    },
    /// Freeze a broker (a GC pause, SIGSTOP): it does nothing, its clock runs on.
    PauseBroker {
        /// Which.
        broker: usize,
        /// For how long.
        ms: Millis,
    },
    /// Kill a replica (not the master, not the last intact in-sync member) and wipe its disk;
    /// it restarts empty after `down_ms` and applies for a new broker id.
    LoseDisk {
        /// Which.
        broker: usize,
        /// For how long.
        down_ms: Millis,
    },
    /// A broker's disk is full for `ms`: it appends nothing (a replica cannot take batches,
    /// a master's writes fail), and keeps running.
    DiskFull {
        /// Which.
        broker: usize,
        /// For how long.
        ms: Millis,
    },
    /// Kill a controller voter; it restarts after `down_ms` with its log.
    CrashController {
        /// Which.
        controller: usize,
        /// For how long.
        down_ms: Millis,
    },
    /// Drop everything from `from` to `to` (and back, unless `one_way`) for `ms`.
    Partition {
        /// One side.
        from: Node,
        /// The other side.
        to: Node,
        /// Only that direction.
        one_way: bool,
        /// For how long.
        ms: Millis,
    },
    /// Drop each message with probability `percent`% for `ms`.
    Lossy {
        /// Percent of messages lost.
        percent: u32,
        /// For how long.
        ms: Millis,
    },
    /// An operator asks for a switch-over (to `target` or the best replica).
    ManualElect {
        /// The broker index to elect, if any.
        target: Option<usize>,
    },
}

/// The faults of a run, by start time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// `(at, fault)`, ordered by time.
    pub faults: Vec<(Millis, Fault)>,
}

impl Schedule {
    /// Draws 4 to 12 faults in `[1 s, cfg.faults_until_ms)`.
    pub fn random(cfg: &SimConfig, rng: &mut impl Rng) -> Self {
        let n = rng.gen_range(4..=12);
        let mut faults = Vec::with_capacity(n);
        let span = cfg.faults_until_ms.saturating_sub(1_000).max(1);
        for _ in 0..n {
            let at = 1_000 + rng.gen_range(0..span);
            let left = cfg.faults_until_ms.saturating_sub(at).max(1);
            let dur = |rng: &mut dyn rand::RngCore, max: Millis| rng.gen_range(1..=max.min(left));
            let broker = rng.gen_range(0..cfg.brokers);
            let node = |rng: &mut dyn rand::RngCore| {
                if rng.gen_bool(0.5) {
                    Node::Broker(rng.gen_range(0..cfg.brokers))
                } else {
                    Node::Controller(rng.gen_range(0..cfg.controllers))
                }
            };
            let fault = match rng.gen_range(0..100) {
                0..=17 => Fault::CrashBroker {
                    broker,
                    down_ms: dur(rng, 3_000),
                },
                18..=35 => Fault::PauseBroker {
                    broker,
                    // Half shorter than the lease, half longer than the election delay.
                    ms: if rng.gen_bool(0.5) {
                        dur(rng, 500)
                    } else {
                        dur(rng, 3_000)
                    },
                },
                36..=43 => Fault::LoseDisk {
                    broker,
                    down_ms: dur(rng, 2_000),
                },
                44..=55 => Fault::CrashController {
                    controller: rng.gen_range(0..cfg.controllers),
                    down_ms: dur(rng, 3_000),
                },
                56..=83 => {
                    let from = node(rng);
                    let mut to = node(rng);
                    if to == from {
                        to = Node::Broker((broker + 1) % cfg.brokers);
                    }
                    Fault::Partition {
                        from,
                        to,
                        one_way: rng.gen_bool(0.4),
                        ms: dur(rng, 3_000),
                    }
                }
                84..=93 => Fault::Lossy {
                    percent: rng.gen_range(5..=40),
                    ms: dur(rng, 2_000),
                },
                94..=96 => Fault::DiskFull {
                    broker,
                    ms: dur(rng, 3_000),
                },
                _ => Fault::ManualElect {
                    target: rng.gen_bool(0.5).then(|| rng.gen_range(0..cfg.brokers)),
                },
            };
            faults.push((at, fault));
        }
        faults.sort_by_key(|(at, _)| *at);
        Self { faults }
    }
}
