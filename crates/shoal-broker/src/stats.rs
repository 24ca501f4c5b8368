//! The figures RocketMQ's broker reports in GET_BROKER_RUNTIME_INFO that `mqadmin clusterList`,
//! `brokerStatus` and dashboards read: message totals at the start of today and of yesterday
//! (`msgPutTotalTodayMorning`, ...) and throughput over the last 10 s, 1 min and 10 min
//! (`putTps`, `getTransferredTps`, formatted as RocketMQ does: three figures separated by
//! spaces). A plain state machine fed once a second with the broker's counters and the time.

use parking_lot::Mutex;
use std::collections::VecDeque;

const DAY_MS: i64 = 24 * 3600 * 1000;
/// Samples kept: one a second for the longest window (10 min), plus one.
const SAMPLES: usize = 601;

/// Message totals and throughput windows.
#[derive(Debug, Default)]
pub(crate) struct BrokerStats {
    /// UTC day (days since the epoch) of the last sample.
    day: Option<i64>,
    put_today_morning: u64,
    put_yesterday_morning: u64,
    got_today_morning: u64,
    got_yesterday_morning: u64,
    /// (monotonic ms, messages put, messages got), oldest first.
    samples: VecDeque<(u64, u64, u64)>,
}

/// One snapshot of the figures, as RocketMQ names them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatsSnapshot {
    /// Messages put before the start of today (UTC) since the broker started.
    pub put_today_morning: u64,
    /// Messages put before the start of yesterday (UTC) since the broker started.
    pub put_yesterday_morning: u64,
    /// Messages got (pulled) before the start of today.
    pub got_today_morning: u64,
    /// Messages got before the start of yesterday.
    pub got_yesterday_morning: u64,
    /// Put messages per second over the last 10 s, 60 s and 600 s.
    pub put_tps: [f64; 3],
    /// Got messages per second over the last 10 s, 60 s and 600 s.
    pub got_tps: [f64; 3],
}

impl BrokerStats {
    /// Records the counters at wall time `wall_ms` (for day boundaries) and monotonic time
    /// `mono_ms` (for rates).
    pub(crate) fn sample(&mut self, wall_ms: i64, mono_ms: u64, put: u64, got: u64) {
        let day = wall_ms.div_euclid(DAY_MS);
        match self.day {
            None => {}
            Some(d) if day > d => {
                // Totals at the start of the new day: the last values seen before it.
                let (_, last_put, last_got) = self.samples.back().copied().unwrap_or((0, 0, 0));
                if day == d + 1 {
                    self.put_yesterday_morning = self.put_today_morning;
                    self.got_yesterday_morning = self.got_today_morning;
                } else {
                    self.put_yesterday_morning = last_put;
                    self.got_yesterday_morning = last_got;
                }
                self.put_today_morning = last_put;
                self.got_today_morning = last_got;
            }
            Some(_) => {}
        }
        self.day = Some(day);
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((mono_ms, put, got));
    }

    /// The figures now.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let rate = |window_ms: u64, pick: fn(&(u64, u64, u64)) -> u64| -> f64 {
            let Some(last) = self.samples.back() else {
                return 0.0;
            };
            let since = last.0.saturating_sub(window_ms);
            let first = self.samples.iter().find(|s| s.0 >= since).unwrap_or(last);
            let dt = last.0.saturating_sub(first.0);
            if dt == 0 {
                return 0.0;
            }
            pick(last).saturating_sub(pick(first)) as f64 * 1000.0 / dt as f64
        };
        let windows = [10_000, 60_000, 600_000];
        StatsSnapshot {
            put_today_morning: self.put_today_morning,
            put_yesterday_morning: self.put_yesterday_morning,
            got_today_morning: self.got_today_morning,
            got_yesterday_morning: self.got_yesterday_morning,
            put_tps: windows.map(|w| rate(w, |s| s.1)),
            got_tps: windows.map(|w| rate(w, |s| s.2)),
        }
    }
}

/// The broker's [`BrokerStats`], sampled by the housekeeping loop and read by runtime info.
#[derive(Debug, Default)]
pub(crate) struct Stats(Mutex<BrokerStats>);

impl Stats {
    /// See [`BrokerStats::sample`].
    pub(crate) fn sample(&self, wall_ms: i64, mono_ms: u64, put: u64, got: u64) {
        self.0.lock().sample(wall_ms, mono_ms, put, got);
    }

    /// See [`BrokerStats::snapshot`].
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        self.0.lock().snapshot()
    }
}

/// RocketMQ's format of a tps triple: `"12.50 10.00 3.20"`.
pub(crate) fn format_tps(t: &[f64; 3]) -> String {
    format!("{:.2} {:.2} {:.2}", t[0], t[1], t[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_over_windows() {
        let mut s = BrokerStats::default();
        let t0 = 1_000 * DAY_MS + 1000;
        for i in 0..=20u64 {
            // 100 puts a second, 10 gets a second.
            s.sample(t0 + i as i64 * 1000, i * 1000, i * 100, i * 10);
        }
        let snap = s.snapshot();
        assert_eq!(snap.put_tps[0], 100.0);
        assert_eq!(snap.put_tps[1], 100.0);
        assert_eq!(snap.got_tps[2], 10.0);
        assert_eq!(format_tps(&snap.put_tps), "100.00 100.00 100.00");
        assert_eq!(BrokerStats::default().snapshot().put_tps, [0.0; 3]);
    }

    #[test]
    fn day_boundaries_move_the_morning_totals() {
        let mut s = BrokerStats::default();
        let day = 1_000 * DAY_MS;
        s.sample(day + DAY_MS - 2000, 0, 5, 1);
        s.sample(day + DAY_MS - 1000, 1000, 7, 2);
        assert_eq!(
            s.snapshot().put_today_morning,
            0,
            "started today: nothing before it"
        );
        s.sample(day + DAY_MS + 10, 2000, 9, 3);
        let snap = s.snapshot();
        assert_eq!((snap.put_today_morning, snap.got_today_morning), (7, 2));
        assert_eq!(snap.put_yesterday_morning, 0);
        s.sample(day + 2 * DAY_MS + 10, 3000, 20, 4);
        let snap = s.snapshot();
        assert_eq!(snap.put_today_morning, 9);
        assert_eq!(snap.put_yesterday_morning, 7);
        // A gap of several days: both mornings are the last value seen.
        s.sample(day + 5 * DAY_MS, 4000, 30, 5);
        let snap = s.snapshot();
        assert_eq!(
            (snap.put_today_morning, snap.put_yesterday_morning),
            (20, 20)
        );
    }

    #[test]
    fn samples_are_bounded() {
        let mut s = BrokerStats::default();
        for i in 0..2000u64 {
            s.sample(i as i64 * 1000, i * 1000, i, i);
        }
        assert_eq!(s.samples.len(), SAMPLES);
    }
}
