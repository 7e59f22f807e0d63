//! Region-pair links shared by concurrent copies: a fair-share fluid model.
//!
//! Each ordered region pair (`from`, `to`) is one link of the pair's bandwidth. The copies in
//! flight on a link split it equally: with `n` copies each moves at `gbps / n`. Whenever a copy
//! starts, ends or is aborted, the link is first brought up to that moment at the old shares,
//! then the shares change, so every copy's finish time follows the load of its link. Copies on
//! different links (including the reverse direction of the same pair) do not interfere.
//!
//! Finish times are exact in fractional seconds; a copy *lands* (its job may use the data) at
//! the next whole second, and never in the second it started, so a copy is always an event of
//! its own. Every byte that crosses a link is counted once in [`Links::moved_gb`], whether its
//! copy landed or was aborted part-way.

use std::collections::{BTreeMap, HashMap};

/// Bytes below this many GB count as nothing left to move (float dust).
const DONE_GB: f64 = 1e-9;

/// Seconds of float slack when turning a fractional finish time into a whole second.
const SLACK_SECS: f64 = 1e-6;

/// One copy in flight.
#[derive(Debug, Clone)]
struct Flow {
    job: u32,
    cluster: usize,
    started: u64,
    left_gb: f64,
}

/// One directed link and the copies on it.
#[derive(Debug, Clone)]
struct Link {
    gb_per_sec: f64,
    /// Time up to which `flows` are accounted.
    at: f64,
    flows: Vec<Flow>,
}

/// Every link of the fleet and the copies in flight on them.
#[derive(Debug, Default)]
pub(super) struct Links {
    links: BTreeMap<(String, String), Link>,
    /// Which link each copy in flight (job, cluster) is on.
    on: HashMap<(u32, usize), (String, String)>,
    /// Copies that finished moving and land at the given whole second.
    landed: Vec<(u64, u32, usize)>,
    /// GB that crossed any link so far.
    pub(super) moved_gb: f64,
}

impl Links {
    /// Starts copying `gb` GB of job `job`'s data from region `from` to region `to` (where
    /// `cluster` is) over a link of `gbps` Gbit/s at `now`.
    pub(super) fn start(&mut self, job: u32, cluster: usize, (from, to): (&str, &str), gb: f64, gbps: f64, now: u64) {
        let key = (from.to_owned(), to.to_owned());
        let link = self.links.entry(key.clone()).or_insert_with(|| Link {
            gb_per_sec: gbps / 8.0,
            at: now as f64,
            flows: vec![],
        });
        advance(link, now as f64, &mut self.landed, &mut self.moved_gb);
        link.flows.push(Flow { job, cluster, started: now, left_gb: gb.max(0.0) });
        self.on.insert((job, cluster), key);
    }

    /// Whole seconds a new copy of `gb` GB on link `from -> to` of `gbps` would take if the
    /// copies on it now kept going: its fair share is the link over (copies + 1).
    pub(super) fn predict_secs(&self, (from, to): (&str, &str), gb: f64, gbps: f64) -> u64 {
        let sharing = self.links.get(&(from.to_owned(), to.to_owned())).map_or(0, |l| l.flows.len()) + 1;
        let secs = gb * 8.0 * sharing as f64 / gbps;
        if secs.is_finite() { (secs - SLACK_SECS).ceil().max(1.0) as u64 } else { u64::MAX / 4 }
    }

    /// The next whole second at which a copy lands, if any is in flight.
    pub(super) fn next_landing(&self) -> Option<u64> {
        let buffered = self.landed.iter().map(|(t, _, _)| *t).min();
        let flowing = self
            .links
            .values()
            .filter(|l| !l.flows.is_empty() && l.gb_per_sec > 0.0)
            .filter_map(|l| {
                let share = l.gb_per_sec / l.flows.len() as f64;
                l.flows.iter().map(|f| landing(l.at + f.left_gb / share, f.started)).min()
            })
            .min();
        buffered.into_iter().chain(flowing).min()
    }

    /// Brings every link up to `now` and returns the copies that have landed by then, as
    /// (job, cluster), in landing order.
    pub(super) fn land_due(&mut self, now: u64) -> Vec<(u32, usize)> {
        for link in self.links.values_mut() {
            advance(link, now as f64, &mut self.landed, &mut self.moved_gb);
        }
        let mut due: Vec<(u64, u32, usize)> = Vec::new();
        self.landed.retain(|&entry| {
            let keep = entry.0 > now;
            if !keep {
                due.push(entry);
            }
            keep
        });
        due.sort_unstable();
        for (_, job, cluster) in &due {
            self.on.remove(&(*job, *cluster));
        }
        due.into_iter().map(|(_, job, cluster)| (job, cluster)).collect()
    }

    /// Whether the copy of `job` to `cluster` is still moving.
    pub(super) fn in_flight(&self, job: u32, cluster: usize) -> bool {
        self.on.contains_key(&(job, cluster)) && !self.landed.iter().any(|&(_, j, c)| (j, c) == (job, cluster))
    }

    /// Stops the copy of `job` to `cluster` at `now`; returns the GB it had moved and the total
    /// it was to move, or `None` when no such copy is in flight.
    pub(super) fn abort(&mut self, job: u32, cluster: usize, now: u64, size_gb: f64) -> Option<f64> {
        let key = self.on.get(&(job, cluster))?.clone();
        let link = self.links.get_mut(&key)?;
        advance(link, now as f64, &mut self.landed, &mut self.moved_gb);
        if let Some(i) = self.landed.iter().position(|&(_, j, c)| (j, c) == (job, cluster)) {
            // It finished moving but has not landed yet: nothing to stop, all bytes moved.
            self.landed.swap_remove(i);
            self.on.remove(&(job, cluster));
            return Some(size_gb);
        }
        let i = link.flows.iter().position(|f| (f.job, f.cluster) == (job, cluster))?;
        let flow = link.flows.swap_remove(i);
        self.on.remove(&(job, cluster));
        Some((size_gb - flow.left_gb).max(0.0))
    }
}

/// The whole second a copy finishing at `finish` lands: rounded up, and after its start.
fn landing(finish: f64, started: u64) -> u64 {
    let secs = if finish.is_finite() { (finish - SLACK_SECS).ceil().max(0.0) as u64 } else { u64::MAX / 4 };
    secs.max(started + 1)
}

/// Moves `link`'s copies forward to `now` at fair shares, recomputed each time one finishes;
/// finished copies go to `landed`, and every GB moved is added to `moved`.
///
/// A copy is finished once its landing time ([`landing`], the time [`Links::next_landing`]
/// gives) is at or before `now`, whatever crumb of it floating point leaves: otherwise a copy due
/// a fraction of a microsecond after a whole second would be the next event at that same second
/// for ever.
fn advance(link: &mut Link, now: f64, landed: &mut Vec<(u64, u32, usize)>, moved: &mut f64) {
    while !link.flows.is_empty() && link.gb_per_sec > 0.0 {
        let share = link.gb_per_sec / link.flows.len() as f64;
        let least = link.flows.iter().map(|f| f.left_gb).fold(f64::INFINITY, f64::min);
        let finish = link.at + least / share;
        if finish - SLACK_SECS > now {
            // Nothing lands by `now`: every copy moves on at its share.
            if link.at < now {
                let each = share * (now - link.at);
                for flow in &mut link.flows {
                    let step = each.min(flow.left_gb);
                    flow.left_gb -= step;
                    *moved += step;
                }
                link.at = now;
            }
            break;
        }
        let until = finish.max(link.at);
        let each = share * (until - link.at);
        for flow in &mut link.flows {
            let step = each.min(flow.left_gb);
            flow.left_gb -= step;
            *moved += step;
        }
        link.at = until;
        // The smallest copies are done: what is left of them is rounding.
        let crumb = DONE_GB.max(share * 2.0 * SLACK_SECS);
        link.flows.retain(|f| {
            let done = f.left_gb <= crumb;
            if done {
                *moved += f.left_gb;
                landed.push((landing(finish, f.started), f.job, f.cluster));
            }
            !done
        });
    }
    link.at = link.at.max(now);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LINK: (&str, &str) = ("us-east", "eu-west");

    #[test]
    fn a_copy_due_a_hair_after_a_whole_second_lands_then_and_time_moves_on() {
        // 1 GB/s; 100 GB plus 0.5 µs worth: due at 100 s, as `next_landing` rounds it.
        let mut links = Links::default();
        links.start(0, 1, LINK, 100.000_000_5, 8.0, 0);
        assert_eq!(links.next_landing(), Some(100));
        assert_eq!(links.land_due(100), [(0, 1)], "the copy lands at the time it was announced for");
        assert_eq!(links.next_landing(), None, "no event is left at 100 s");
        // Two copies sharing the link, the first finishing a hair past a second.
        links.start(2, 1, LINK, 50.000_000_2, 8.0, 100);
        links.start(3, 1, LINK, 80.0, 8.0, 100);
        let first = links.next_landing().unwrap();
        assert_eq!(links.land_due(first), [(2, 1)]);
        let second = links.next_landing().unwrap();
        assert!(second > first, "{second} > {first}");
        assert_eq!(links.land_due(second), [(3, 1)]);
        assert_eq!(links.next_landing(), None);
    }

    #[test]
    fn one_copy_moves_at_the_full_link_and_two_split_it() {
        // 100 GB at 8 Gbit/s = 1 GB/s: 100 s alone.
        let mut links = Links::default();
        links.start(0, 1, LINK, 100.0, 8.0, 0);
        assert_eq!(links.next_landing(), Some(100));
        assert_eq!(links.land_due(100), [(0, 1)]);
        assert!((links.moved_gb - 100.0).abs() < 1e-9);

        // Two equal copies started together each take twice as long.
        let mut links = Links::default();
        links.start(0, 1, LINK, 100.0, 8.0, 0);
        links.start(1, 1, LINK, 100.0, 8.0, 0);
        assert_eq!(links.next_landing(), Some(200));
        assert!(links.land_due(199).is_empty());
        assert_eq!(links.land_due(200), [(0, 1), (1, 1)]);
        assert!((links.moved_gb - 200.0).abs() < 1e-9);
    }

    #[test]
    fn a_copy_that_joins_late_slows_the_first_only_while_both_move() {
        // A: 100 GB from 0; B: 50 GB from 50. At 50 A has 50 left; both at 0.5 GB/s: B ends at
        // 150, A at 150 too. A third on the reverse link is not affected.
        let mut links = Links::default();
        links.start(0, 1, LINK, 100.0, 8.0, 0);
        links.start(2, 0, ("eu-west", "us-east"), 10.0, 8.0, 0);
        assert_eq!(links.land_due(10), [(2, 0)]);
        links.start(1, 1, LINK, 50.0, 8.0, 50);
        assert_eq!(links.next_landing(), Some(150));
        assert_eq!(links.land_due(150), [(0, 1), (1, 1)]);
    }

    #[test]
    fn an_aborted_copy_counts_the_bytes_it_moved_and_frees_its_share() {
        let mut links = Links::default();
        links.start(0, 1, LINK, 100.0, 8.0, 0);
        links.start(1, 2, LINK, 100.0, 8.0, 0);
        // At 40 each moved 20 GB; aborting job 1 leaves job 0 alone with 80 GB: lands at 120.
        assert_eq!(links.abort(1, 2, 40, 100.0), Some(20.0));
        assert!(!links.in_flight(1, 2) && links.in_flight(0, 1));
        assert_eq!(links.next_landing(), Some(120));
        assert_eq!(links.land_due(120), [(0, 1)]);
        assert!((links.moved_gb - 120.0).abs() < 1e-9);
        assert_eq!(links.abort(0, 1, 130, 100.0), None);
    }
}
