//! Shoal's `BALANCED_STICKY`: rendezvous hashing with exactly balanced loads, solved as an
//! assignment problem. See `docs/rebalance.md` for the algorithm, its bounds and an example.

use super::hash::{fnv1a64, gumbel, mix64};
use super::{AllocateStrategy, AllocationInput, Assignment};
use crate::error::{GroupError, Result};
use shoal_proto::mq::MessageQueue;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// `BALANCED_STICKY`: stateless, deterministic, loads differ by at most one, and close to
/// the fewest moves when membership changes.
///
/// Every (queue, member) pair has a score `s(q, c)`: a standard Gumbel variate drawn from a
/// 64-bit hash of both ids (rendezvous hashing; with no load limit, each queue would go to
/// its highest-scoring member, and a joining member would take only queues it wins).
/// Among all assignments whose loads are `⌊n/m⌋` or `⌈n/m⌉`, it picks one of (nearly)
/// maximal total score, computed with Bertsekas' auction algorithm (ε-optimal, ε = 10⁻³):
/// 1. a relaxed auction where every member may take `⌈n/m⌉` queues tells which members the
///    queues compete for most (highest final price, then most queues, then member order);
///    the `n mod m` first of them are allowed `⌈n/m⌉`, the others `⌊n/m⌋`;
/// 2. an auction with exactly those capacities gives the assignment.
///
/// Queues and members are processed in their sorted order and all arithmetic is IEEE basic
/// operations and integer hashing (no platform `libm`), so every client computes the same
/// assignment from the same (queues, members).
#[derive(Debug, Clone, Copy)]
pub struct BalancedSticky {
    epsilon: f64,
}

impl Default for BalancedSticky {
    fn default() -> Self {
        Self { epsilon: 1e-3 }
    }
}

impl BalancedSticky {
    /// With auction step `epsilon` (smaller: closer to the optimum, more bidding rounds).
    /// Must be finite and in `[1e-9, 1]`.
    pub fn with_epsilon(epsilon: f64) -> Result<Self> {
        if !(1e-9..=1.0).contains(&epsilon) {
            return Err(GroupError::InvalidParameter(format!(
                "auction epsilon {epsilon} outside [1e-9, 1]"
            )));
        }
        Ok(Self { epsilon })
    }

    /// The owner index of every queue.
    fn owners(&self, input: &AllocationInput<'_>) -> Vec<Option<usize>> {
        let queues = input.queues();
        let members = input.members();
        let (n, m) = (queues.len(), members.len());
        if m == 0 || n == 0 {
            return vec![None; n];
        }
        let scores = Scores::new(queues, members);
        let base = n / m;
        let r = n % m;
        let caps: Vec<usize> = if r == 0 {
            vec![base; m]
        } else {
            let relaxed = auction(&scores, &vec![base + 1; m], self.epsilon);
            let mut order: Vec<usize> = (0..m).collect();
            order.sort_by(|&a, &b| {
                let pa = relaxed.prices.get(a).copied().unwrap_or(0.0);
                let pb = relaxed.prices.get(b).copied().unwrap_or(0.0);
                pb.total_cmp(&pa)
                    .then_with(|| relaxed.loads.get(b).cmp(&relaxed.loads.get(a)))
                    .then_with(|| a.cmp(&b))
            });
            let mut caps = vec![base; m];
            for &i in order.iter().take(r) {
                if let Some(c) = caps.get_mut(i) {
                    *c = base + 1;
                }
            }
            caps
        };
        auction(&scores, &caps, self.epsilon).owner
    }
}

impl AllocateStrategy for BalancedSticky {
    fn name(&self) -> String {
        "BALANCED_STICKY".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        Ok(Assignment::from_owner_indices(
            input.queues(),
            input.members(),
            &self.owners(input),
        ))
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        let Some(index) = input.member_index(member) else {
            return Ok(Vec::new());
        };
        Ok(input
            .queues()
            .iter()
            .zip(self.owners(input))
            .filter(|(_, o)| *o == Some(index))
            .map(|(q, _)| q.clone())
            .collect())
    }
}

/// How many best-scoring members are remembered per queue.
const CANDIDATES: usize = 8;

/// Rendezvous scores: hashes of queues and members, combined per pair on demand, plus for
/// each queue its [`CANDIDATES`] best-scoring members (in member order) and the best score
/// of the others, so that most bids look at a few members instead of all.
struct Scores {
    queues: Vec<u64>,
    members: Vec<u64>,
    /// `CANDIDATES` (or all, when fewer members) `(member, score)` per queue.
    candidates: Vec<Vec<(usize, f64)>>,
    /// Best score among the members that are not candidates (−∞ if none).
    bound: Vec<f64>,
}

impl Scores {
    fn new(queues: &[MessageQueue], members: &[String]) -> Self {
        let queues: Vec<u64> = queues
            .iter()
            .map(|q| {
                let mut key = Vec::with_capacity(q.topic.len() + q.broker_name.len() + 20);
                key.extend_from_slice(&(q.topic.len() as u64).to_le_bytes());
                key.extend_from_slice(q.topic.as_bytes());
                key.extend_from_slice(&(q.broker_name.len() as u64).to_le_bytes());
                key.extend_from_slice(q.broker_name.as_bytes());
                key.extend_from_slice(&q.queue_id.to_le_bytes());
                mix64(fnv1a64(&key))
            })
            .collect();
        let members: Vec<u64> = members
            .iter()
            .map(|m| mix64(fnv1a64(m.as_bytes()) ^ 0x5348_4f41_4c00_0001))
            .collect();
        let mut candidates = Vec::with_capacity(queues.len());
        let mut bound = Vec::with_capacity(queues.len());
        let mut row: Vec<(usize, f64)> = Vec::with_capacity(members.len());
        for &q in &queues {
            row.clear();
            row.extend(
                members
                    .iter()
                    .enumerate()
                    .map(|(i, &hm)| (i, pair_score(q, hm))),
            );
            // Best first; ties by member order.
            row.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut best: Vec<(usize, f64)> = row.iter().take(CANDIDATES).copied().collect();
            best.sort_unstable_by_key(|c| c.0);
            candidates.push(best);
            bound.push(row.get(CANDIDATES).map_or(f64::NEG_INFINITY, |c| c.1));
        }
        Self {
            queues,
            members,
            candidates,
            bound,
        }
    }

    fn score(&self, q: u64, member: usize) -> f64 {
        pair_score(q, self.members.get(member).copied().unwrap_or(0))
    }
}

/// The score of a (queue, member) pair from their 64-bit hashes: FNV-1a over both, then
/// SplitMix64, as a standard Gumbel variate.
fn pair_score(q: u64, hm: u64) -> f64 {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&q.to_le_bytes());
    key[8..].copy_from_slice(&hm.to_le_bytes());
    gumbel(mix64(fnv1a64(&key)))
}

/// Best and second-best value `score − price` of queue `qi` over members with capacity, and
/// the best member; from the candidates when that is provably exact, else from all members.
fn best_two(
    scores: &Scores,
    qi: usize,
    caps: &[usize],
    prices: &[f64],
) -> (Option<usize>, f64, f64) {
    let top2 = |it: &mut dyn Iterator<Item = (usize, f64)>| {
        let mut best = None;
        let mut b1 = f64::NEG_INFINITY;
        let mut b2 = f64::NEG_INFINITY;
        for (i, s) in it {
            if caps.get(i).copied().unwrap_or(0) == 0 {
                continue;
            }
            let v = s - prices.get(i).copied().unwrap_or(0.0);
            if v > b1 {
                b2 = b1;
                b1 = v;
                best = Some(i);
            } else if v > b2 {
                b2 = v;
            }
        }
        (best, b1, b2)
    };
    if let (Some(c), Some(&bound)) = (scores.candidates.get(qi), scores.bound.get(qi)) {
        // Prices are never negative, so no other member's value exceeds `bound`.
        let (best, b1, b2) = top2(&mut c.iter().copied());
        if best.is_some() && b2 > bound {
            return (best, b1, b2);
        }
    }
    let q = scores.queues.get(qi).copied().unwrap_or(0);
    top2(&mut (0..caps.len()).map(|i| (i, scores.score(q, i))))
}

/// Outcome of one auction.
struct Auction {
    owner: Vec<Option<usize>>,
    prices: Vec<f64>,
    loads: Vec<usize>,
}

/// Forward auction for the transportation problem: queues bid for members (member `i` holds
/// at most `caps[i]` queues, `Σ caps ≥ n`); a member's price is its lowest held bid once full.
/// Terminates with every queue assigned to a member whose value `s − price` is within ε of
/// its best (ε-complementary slackness), hence within `n·ε` of the optimal total score.
fn auction(scores: &Scores, caps: &[usize], epsilon: f64) -> Auction {
    let n = scores.queues.len();
    let m = caps.len();
    let mut owner: Vec<Option<usize>> = vec![None; n];
    let mut prices = vec![0.0f64; m];
    // Held bids per member: min-heap of (bid bits, queue). Bids are positive, so their bit
    // patterns order as the values do.
    let mut held: Vec<BinaryHeap<Reverse<(u64, usize)>>> = vec![BinaryHeap::new(); m];
    let mut waiting: VecDeque<usize> = (0..n).collect();
    while let Some(qi) = waiting.pop_front() {
        let (best, b1, mut b2) = best_two(scores, qi, caps, &prices);
        let Some(i) = best else {
            // No member can take anything (all capacities zero): the queue stays unowned.
            continue;
        };
        if b2 == f64::NEG_INFINITY {
            b2 = b1;
        }
        let price = prices.get(i).copied().unwrap_or(0.0);
        let bid = price + (b1 - b2) + epsilon;
        let (Some(h), Some(&cap)) = (held.get_mut(i), caps.get(i)) else {
            continue;
        };
        h.push(Reverse((bid.to_bits(), qi)));
        if let Some(o) = owner.get_mut(qi) {
            *o = Some(i);
        }
        if h.len() > cap {
            if let Some(Reverse((_, out))) = h.pop() {
                if let Some(o) = owner.get_mut(out) {
                    *o = None;
                }
                waiting.push_back(out);
            }
        }
        if h.len() == cap {
            if let (Some(Reverse((low, _))), Some(p)) = (h.peek(), prices.get_mut(i)) {
                *p = f64::from_bits(*low);
            }
        }
    }
    let loads = held.iter().map(BinaryHeap::len).collect();
    Auction {
        owner,
        prices,
        loads,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{minimum_moves, moved_queues};
    use super::*;

    fn queues(n: i32) -> Vec<MessageQueue> {
        (0..n)
            .map(|i| MessageQueue::new("T", "broker-a", i))
            .collect()
    }

    fn members(k: usize) -> Vec<String> {
        (1..=k).map(|i| format!("c{i}")).collect()
    }

    #[test]
    fn balanced_exclusive_complete() {
        for (n, k) in [(64, 5), (8, 3), (3, 8), (0, 4), (10, 1), (100, 7)] {
            let input = AllocationInput::new("g", queues(n), members(k));
            let a = BalancedSticky::default().allocate_all(&input).unwrap();
            assert!(a.coverage(input.queues()).is_exclusive_and_complete());
            let (lo, hi) = a.load_range();
            assert!(hi - lo <= 1, "{n}/{k}: {lo}..{hi}");
            for m in input.members() {
                assert_eq!(
                    a.queues_of(m),
                    BalancedSticky::default()
                        .allocate(&input, m)
                        .unwrap()
                        .as_slice()
                );
            }
        }
        let none = AllocationInput::new("g", queues(5), Vec::<String>::new());
        let a = BalancedSticky::default().allocate_all(&none).unwrap();
        assert_eq!(a.member_count(), 0);
    }

    /// The movement table of `docs/rebalance.md` for this strategy: 64 queues, 1..=16
    /// members, one join then one leave of a middle member at each size.
    fn table(s: &BalancedSticky) -> (usize, usize) {
        let q = queues(64);
        let mut moved = 0;
        let mut minimum = 0;
        for k in 1..=16 {
            let before = s
                .allocate_all(&AllocationInput::new("g", q.clone(), members(k)))
                .unwrap();
            let joined = members(k + 1);
            let input = AllocationInput::new("g", q.clone(), joined.clone());
            let after = s.allocate_all(&input).unwrap();
            moved += moved_queues(&before, &after);
            minimum += minimum_moves(&before, &q, &joined);
            let sorted = input.members().to_vec();
            let middle = sorted.get(sorted.len() / 2).cloned().unwrap();
            let left: Vec<String> = sorted.into_iter().filter(|m| *m != middle).collect();
            let last = s
                .allocate_all(&AllocationInput::new("g", q.clone(), left.clone()))
                .unwrap();
            moved += moved_queues(&after, &last);
            minimum += minimum_moves(&after, &q, &left);
        }
        (moved, minimum)
    }

    #[test]
    fn movement_table_within_1_4_of_minimum() {
        let (moved, minimum) = table(&BalancedSticky::default());
        eprintln!("balanced-sticky: moved {moved}, minimum {minimum}");
        assert!(
            moved as f64 <= 1.4 * minimum as f64,
            "moved {moved}, minimum {minimum}"
        );
    }

    #[test]
    fn epsilon_is_checked() {
        assert!(BalancedSticky::with_epsilon(0.0).is_err());
        assert!(BalancedSticky::with_epsilon(f64::NAN).is_err());
        assert!(BalancedSticky::with_epsilon(1e-4).is_ok());
    }
}
