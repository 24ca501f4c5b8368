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
/// Among all assignments whose loads are `⌊n/m⌋` or `⌈n/m⌉` (any `n mod m` members may take
/// the larger share), it picks one of maximal total score: an optimal transport between
/// queues and member slots, solved with Bertsekas' auction algorithm with ε-scaling (ε from 1
/// down to 10⁻⁶; the result is within `n·ε` of the optimum). Each member offers `⌊n/m⌋`
/// slots plus one "extra" slot; `m − n mod m` placeholder bidders, which value only extra
/// slots, make the problem square so that exactly `n mod m` extra slots go to queues.
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
        Self { epsilon: 1e-6 }
    }
}

impl BalancedSticky {
    /// With final auction step `epsilon` (smaller: closer to the optimum, more bidding
    /// rounds). Must be in `[1e-9, 1]`.
    pub fn with_epsilon(epsilon: f64) -> Result<Self> {
        if !(1e-9..=1.0).contains(&epsilon) {
            return Err(GroupError::InvalidParameter(format!(
                "auction epsilon {epsilon} outside [1e-9, 1]"
            )));
        }
        Ok(Self { epsilon })
    }

    /// The rendezvous score of (`queue`, `member`): what the assignment maximises the sum of.
    pub fn score(queue: &MessageQueue, member: &str) -> f64 {
        let scores = Scores::new(std::slice::from_ref(queue), &[member.to_string()]);
        scores.score(scores.queues.first().copied().unwrap_or(0), 0)
    }

    /// The owner index of every queue.
    fn owners(&self, input: &AllocationInput<'_>) -> Vec<Option<usize>> {
        let queues = input.queues();
        let members = input.members();
        let (n, m) = (queues.len(), members.len());
        if m == 0 || n == 0 {
            return vec![None; n];
        }
        let mut scores = Scores::new(queues, members);
        let mut auction = Auction::new(&scores, n / m, m - n % m);
        let mut eps = 1.0;
        loop {
            auction.run(&mut scores, eps);
            if eps <= self.epsilon {
                break;
            }
            eps = (eps / 10.0).max(self.epsilon);
        }
        auction.owners(n)
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
        let mut scores = Self {
            candidates: Vec::with_capacity(queues.len()),
            bound: Vec::with_capacity(queues.len()),
            queues,
            members,
        };
        for qi in 0..scores.queues.len() {
            let (best, bound) = scores.top(qi, CANDIDATES);
            scores.candidates.push(best);
            scores.bound.push(bound);
        }
        scores
    }

    /// The `k` best-scoring members of queue `qi` (in member order) and the best score of
    /// the others (−∞ if none).
    fn top(&self, qi: usize, k: usize) -> (Vec<(usize, f64)>, f64) {
        let q = self.queues.get(qi).copied().unwrap_or(0);
        // Select on the raw pair hashes: the score is a non-decreasing function of them.
        let mut row: Vec<(usize, u64)> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, &hm)| (i, pair_bits(q, hm)))
            .collect();
        // Best first; ties by member order.
        let order = |a: &(usize, u64), b: &(usize, u64)| b.1.cmp(&a.1).then(a.0.cmp(&b.0));
        if k < row.len() {
            row.select_nth_unstable_by(k, order);
        }
        let bound = row.get(k).map_or(f64::NEG_INFINITY, |c| gumbel(c.1));
        row.truncate(k);
        row.sort_unstable_by_key(|c| c.0);
        (
            row.into_iter().map(|(i, b)| (i, gumbel(b))).collect(),
            bound,
        )
    }

    /// Doubles the candidate list of queue `qi` (when bids keep needing more members).
    fn grow(&mut self, qi: usize) {
        let k = self.candidates.get(qi).map_or(CANDIDATES, Vec::len) * 2;
        let (best, bound) = self.top(qi, k.max(CANDIDATES));
        if let (Some(c), Some(b)) = (self.candidates.get_mut(qi), self.bound.get_mut(qi)) {
            *c = best;
            *b = bound;
        }
    }

    fn score(&self, q: u64, member: usize) -> f64 {
        pair_score(q, self.members.get(member).copied().unwrap_or(0))
    }
}

/// The score of a (queue, member) pair from their 64-bit hashes: FNV-1a over both, then
/// SplitMix64, as a standard Gumbel variate.
fn pair_score(q: u64, hm: u64) -> f64 {
    gumbel(pair_bits(q, hm))
}

/// The 64-bit hash of a (queue, member) pair: FNV-1a over both hashes, then SplitMix64.
fn pair_bits(q: u64, hm: u64) -> u64 {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&q.to_le_bytes());
    key[8..].copy_from_slice(&hm.to_le_bytes());
    mix64(fnv1a64(&key))
}

/// Who bids in the auction: a queue (by index) or one of the placeholder bidders that fill
/// the extra slots no queue takes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Bidder {
    Queue(usize),
    Placeholder(usize),
}

/// Auction state over "slot classes": class `2i` is member `i`'s `base` ordinary slots,
/// class `2i + 1` its one extra slot. Prices persist across ε phases; holdings do not.
struct Auction {
    caps: Vec<usize>,
    prices: Vec<f64>,
    /// Held bids per class: min-heap of (bid bits, bidder). Bids are positive, so their bit
    /// patterns order as the values do.
    held: Vec<BinaryHeap<Reverse<(u64, Bidder)>>>,
    placeholders: usize,
}

impl Auction {
    fn new(scores: &Scores, base: usize, placeholders: usize) -> Self {
        let m = scores.members.len();
        let caps: Vec<usize> = (0..2 * m)
            .map(|c| if c % 2 == 0 { base } else { 1 })
            .collect();
        Self {
            prices: vec![0.0; caps.len()],
            held: vec![BinaryHeap::new(); caps.len()],
            caps,
            placeholders,
        }
    }

    /// One ε phase: every bidder starts unassigned and bids until all hold a slot.
    fn run(&mut self, scores: &mut Scores, epsilon: f64) {
        for h in &mut self.held {
            h.clear();
        }
        let n = scores.queues.len();
        let mut waiting: VecDeque<Bidder> = (0..n)
            .map(Bidder::Queue)
            .chain((0..self.placeholders).map(Bidder::Placeholder))
            .collect();
        while let Some(bidder) = waiting.pop_front() {
            let (best, b1, b2) = match bidder {
                Bidder::Queue(qi) => self.best_two_queue(scores, qi),
                Bidder::Placeholder(_) => self.best_two_placeholder(),
            };
            let Some(class) = best else {
                // Nowhere to go (cannot happen: slots = bidders); the bidder stays out.
                continue;
            };
            let b2 = if b2 == f64::NEG_INFINITY { b1 } else { b2 };
            let price = self.prices.get(class).copied().unwrap_or(0.0);
            let bid = price + (b1 - b2) + epsilon;
            let cap = self.caps.get(class).copied().unwrap_or(0);
            let Some(h) = self.held.get_mut(class) else {
                continue;
            };
            h.push(Reverse((bid.to_bits(), bidder)));
            if h.len() > cap {
                if let Some(Reverse((_, out))) = h.pop() {
                    waiting.push_back(out);
                }
            }
            if h.len() == cap {
                if let (Some(Reverse((low, _))), Some(p)) = (h.peek(), self.prices.get_mut(class)) {
                    *p = f64::from_bits(*low);
                }
            }
        }
    }

    /// Best class, best and second-best value (`score − price`) for queue `qi`: from its
    /// candidates when provably exact, else from all members.
    fn best_two_queue(&self, scores: &mut Scores, qi: usize) -> (Option<usize>, f64, f64) {
        let top2 = |it: &mut dyn Iterator<Item = (usize, f64)>| {
            let mut best = None;
            let mut b1 = f64::NEG_INFINITY;
            let mut b2 = f64::NEG_INFINITY;
            for (i, s) in it {
                for class in [2 * i, 2 * i + 1] {
                    if self.caps.get(class).copied().unwrap_or(0) == 0 {
                        continue;
                    }
                    let v = s - self.prices.get(class).copied().unwrap_or(0.0);
                    if v > b1 {
                        b2 = b1;
                        b1 = v;
                        best = Some(class);
                    } else if v > b2 {
                        b2 = v;
                    }
                }
            }
            (best, b1, b2)
        };
        let m = scores.members.len();
        while let Some((c, &bound)) = scores.candidates.get(qi).zip(scores.bound.get(qi)) {
            // Prices are never negative, so no other member's value exceeds `bound`.
            let (best, b1, b2) = top2(&mut c.iter().copied());
            if best.is_some() && b2 > bound {
                return (best, b1, b2);
            }
            if c.len() >= m {
                break;
            }
            scores.grow(qi);
        }
        let q = scores.queues.get(qi).copied().unwrap_or(0);
        top2(&mut (0..scores.members.len()).map(|i| (i, scores.score(q, i))))
    }

    /// Placeholders value every extra slot at 0.
    fn best_two_placeholder(&self) -> (Option<usize>, f64, f64) {
        let mut best = None;
        let mut b1 = f64::NEG_INFINITY;
        let mut b2 = f64::NEG_INFINITY;
        for (class, price) in self.prices.iter().enumerate().skip(1).step_by(2) {
            let v = -price;
            if v > b1 {
                b2 = b1;
                b1 = v;
                best = Some(class);
            } else if v > b2 {
                b2 = v;
            }
        }
        (best, b1, b2)
    }

    /// The member holding each queue.
    fn owners(&self, n: usize) -> Vec<Option<usize>> {
        let mut owner = vec![None; n];
        for (class, h) in self.held.iter().enumerate() {
            for Reverse((_, bidder)) in h.iter() {
                if let Bidder::Queue(qi) = bidder {
                    if let Some(o) = owner.get_mut(*qi) {
                        *o = Some(class / 2);
                    }
                }
            }
        }
        owner
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
    fn table(s: &BalancedSticky, topic: &str) -> (usize, usize) {
        let q: Vec<MessageQueue> = (0..64)
            .map(|i| MessageQueue::new(topic, "broker-a", i))
            .collect();
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
        for topic in ["TopicTest", "T", "orders", "A", "B", "payments"] {
            let (moved, minimum) = table(&BalancedSticky::default(), topic);
            eprintln!("balanced-sticky {topic}: moved {moved}, minimum {minimum}");
            assert!(
                moved as f64 <= 1.4 * minimum as f64,
                "{topic}: moved {moved}, minimum {minimum}"
            );
        }
    }

    /// The worked example of `docs/rebalance.md`: 6 queues, c1 and c2, then c3 joins.
    #[test]
    fn worked_example() {
        let q: Vec<MessageQueue> = (0..6)
            .map(|i| MessageQueue::new("T", "broker-a", i))
            .collect();
        for m in ["c1", "c2", "c3"] {
            let row: Vec<String> = q
                .iter()
                .map(|x| format!("{:6.2}", BalancedSticky::score(x, m)))
                .collect();
            eprintln!("{m}: {}", row.join(" "));
        }
        let s = BalancedSticky::default();
        let two = s
            .allocate_all(&AllocationInput::new("g", q.clone(), ["c1", "c2"]))
            .unwrap();
        let three = s
            .allocate_all(&AllocationInput::new("g", q.clone(), ["c1", "c2", "c3"]))
            .unwrap();
        for (label, a) in [("two", &two), ("three", &three)] {
            for (m, qs) in a.iter() {
                let ids: Vec<i32> = qs.iter().map(|x| x.queue_id).collect();
                eprintln!("{label} {m}: {ids:?}");
            }
        }
        let members: Vec<String> = ["c1", "c2", "c3"].iter().map(|s| s.to_string()).collect();
        eprintln!(
            "moved {} minimum {}",
            moved_queues(&two, &three),
            minimum_moves(&two, &q, &members)
        );
        assert_eq!(three.load_range(), (2, 2));
        assert_eq!(two.load_range(), (3, 3));
    }

    /// The auction finds the balanced assignment of maximal total score (checked against
    /// every balanced assignment of small groups).
    #[test]
    fn assignment_is_optimal_on_small_groups() {
        for n in 0..=7usize {
            for k in 1..=3usize {
                for topic in ["T", "U"] {
                    let q: Vec<MessageQueue> = (0..n as i32)
                        .map(|i| MessageQueue::new(topic, "b", i))
                        .collect();
                    let input = AllocationInput::new("g", q.clone(), members(k));
                    let a = BalancedSticky::default().allocate_all(&input).unwrap();
                    let total = |owner: &[usize]| -> f64 {
                        owner
                            .iter()
                            .zip(input.queues())
                            .map(|(&o, x)| BalancedSticky::score(x, &input.members()[o]))
                            .sum()
                    };
                    let got: Vec<usize> = input
                        .queues()
                        .iter()
                        .map(|x| {
                            input
                                .members()
                                .iter()
                                .position(|m| a.queues_of(m).contains(x))
                                .unwrap()
                        })
                        .collect();
                    // Enumerate all k^n owner vectors with balanced loads.
                    let mut best = f64::NEG_INFINITY;
                    let mut owner = vec![0usize; n];
                    loop {
                        let mut loads = vec![0usize; k];
                        for &o in &owner {
                            loads[o] += 1;
                        }
                        let (lo, hi) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
                        if hi - lo <= 1 {
                            best = best.max(total(&owner));
                        }
                        // Next vector in base k.
                        let mut i = 0;
                        while i < n && owner[i] == k - 1 {
                            owner[i] = 0;
                            i += 1;
                        }
                        if i == n {
                            break;
                        }
                        owner[i] += 1;
                    }
                    if n > 0 {
                        assert!(
                            total(&got) >= best - 1e-6 * n as f64,
                            "{n} queues, {k} members: {} < {best}",
                            total(&got)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn epsilon_is_checked() {
        assert!(BalancedSticky::with_epsilon(0.0).is_err());
        assert!(BalancedSticky::with_epsilon(f64::NAN).is_err());
        assert!(BalancedSticky::with_epsilon(1e-4).is_ok());
    }
}
