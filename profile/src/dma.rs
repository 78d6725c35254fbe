//! The DMA engines: transfers that share a resource's bandwidth fairly (processor sharing:
//! `n` transfers in flight on HBM each move `rate / n` bytes per cycle), each starting
//! `latency` cycles after it is issued. A transfer carries its own rate and latency: on
//! HBM and between on-chip memories they are the resource's, on an ICI link they depend on
//! the message (the measured sibling-core figures grow with its size), so `n` transfers on
//! one link each move their own rate `/ n`.

/// What a transfer occupies.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    /// HBM <-> on-chip memory.
    Hbm,
    /// On-chip memory to on-chip memory.
    Local,
    /// One direction of an ICI link out of this device (a port): remote copies and signals.
    Link(u32),
}

#[derive(Clone, Debug)]
pub struct Transfer {
    pub resource: Resource,
    pub bytes: f64,
    /// Bytes per cycle when alone on its resource.
    rate: f64,
    remaining: f64,
    pub issued: f64,
    pub ready: f64,
    pub done: Option<f64>,
}

/// Transfers by id (issue order) and the time they have been simulated up to.
#[derive(Debug)]
pub struct Engine {
    hbm_rate: f64,
    local_rate: f64,
    /// The DMA latency of HBM and on-chip transfers.
    latency: f64,
    t: f64,
    pub transfers: Vec<Transfer>,
    active: Vec<usize>,
}

const EPS_BYTES: f64 = 1e-6;

impl Engine {
    pub fn new(hbm_rate: f64, local_rate: f64, latency: f64) -> Engine {
        Engine { hbm_rate, local_rate, latency, t: 0.0, transfers: Vec::new(), active: Vec::new() }
    }

    /// Issue an HBM or on-chip transfer at core time `at` (never before the engine's own
    /// time), at the resource's rate and the DMA latency.
    pub fn issue(&mut self, at: f64, resource: Resource, bytes: f64) -> usize {
        let rate = match resource {
            Resource::Hbm => self.hbm_rate,
            Resource::Local | Resource::Link(_) => self.local_rate,
        };
        self.issue_at_rate(at, resource, bytes, rate, self.latency)
    }

    /// Issue a transfer moving `rate` bytes per cycle when alone on `resource`, its first
    /// byte `latency` cycles after `at`.
    pub fn issue_at_rate(
        &mut self,
        at: f64,
        resource: Resource,
        bytes: f64,
        rate: f64,
        latency: f64,
    ) -> usize {
        self.advance_to(at);
        let id = self.transfers.len();
        self.transfers.push(Transfer {
            resource,
            bytes,
            rate,
            remaining: bytes,
            issued: at,
            ready: at + latency,
            done: None,
        });
        self.active.push(id);
        id
    }

    /// Transfers issued on `r` and not yet done.
    pub fn in_flight(&self, r: Resource) -> usize {
        self.active.iter().filter(|&&i| self.transfers[i].resource == r).count()
    }

    fn moving(&self, r: Resource) -> usize {
        self.active
            .iter()
            .filter(|&&i| self.transfers[i].resource == r && self.transfers[i].ready <= self.t)
            .count()
    }

    /// The next time something changes: a transfer becomes ready or one completes.
    fn next_event(&self) -> Option<f64> {
        self.active
            .iter()
            .map(|&i| {
                let x = &self.transfers[i];
                if x.ready > self.t {
                    x.ready
                } else {
                    self.t + x.remaining * self.moving(x.resource) as f64 / x.rate
                }
            })
            .min_by(f64::total_cmp)
    }

    /// Move every transfer on to time `to` (no event may lie strictly between).
    fn progress(&mut self, to: f64) {
        let dt = to - self.t;
        let sharing: Vec<usize> =
            self.active.iter().map(|&i| self.moving(self.transfers[i].resource)).collect();
        for (&i, &n) in self.active.iter().zip(&sharing) {
            let rate = self.transfers[i].rate;
            let x = &mut self.transfers[i];
            if x.ready <= self.t && dt > 0.0 {
                x.remaining -= dt * rate / n as f64;
            }
            // Done when what is left would take no representable time at `to`.
            if x.ready <= self.t
                && (x.remaining <= EPS_BYTES * x.bytes.max(1.0)
                    || x.remaining * n as f64 / rate <= 1e-12 * to.max(1.0))
            {
                x.done = Some(to);
            }
        }
        let transfers = &self.transfers;
        self.active.retain(|&i| transfers[i].done.is_none());
        self.t = to;
    }

    /// Simulate up to time `to`.
    pub fn advance_to(&mut self, to: f64) {
        while let Some(next) = self.next_event() {
            if next > to {
                break;
            }
            self.progress(next);
        }
        if to > self.t {
            self.progress(to);
        }
    }

    /// Simulate until one of `ids` is done (at once if one is); which, and when.
    pub fn until_any(&mut self, ids: &[usize]) -> Option<(usize, f64)> {
        loop {
            if let Some((&id, t)) = ids
                .iter()
                .filter_map(|i| self.transfers[*i].done.map(|t| (i, t)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
            {
                return Some((id, t));
            }
            let next = self.next_event()?;
            self.progress(next);
        }
    }

    /// Run every transfer to completion; the time the last one ends.
    pub fn drain(&mut self) -> f64 {
        while let Some(next) = self.next_event() {
            self.progress(next);
        }
        self.t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_transfers_share_the_bandwidth() {
        let mut e = Engine::new(100.0, 1000.0, 0.0);
        let a = e.issue(0.0, Resource::Hbm, 1000.0);
        let b = e.issue(0.0, Resource::Hbm, 500.0);
        // Both at 50 B/cycle until b ends at 10; then a alone at 100 B/cycle: 500 more bytes.
        assert_eq!(e.until_any(&[b]), Some((b, 10.0)));
        assert_eq!(e.until_any(&[a]), Some((a, 15.0)));
    }

    #[test]
    fn latency_delays_the_first_byte_and_local_copies_do_not_share_hbm() {
        let mut e = Engine::new(100.0, 10.0, 5.0);
        let a = e.issue(0.0, Resource::Hbm, 1000.0);
        let l = e.issue(0.0, Resource::Local, 100.0);
        assert_eq!(e.until_any(&[a]), Some((a, 15.0)));
        assert_eq!(e.until_any(&[l]), Some((l, 15.0)));
        let late = e.issue(20.0, Resource::Hbm, 100.0);
        assert_eq!(e.drain(), 26.0);
        assert_eq!(e.transfers[late].done, Some(26.0));
    }

    #[test]
    fn transfers_on_one_link_share_it_at_their_own_rates_and_other_links_do_not_interfere() {
        let mut e = Engine::new(100.0, 10.0, 0.0);
        // Two on port 0 at 4 and 8 B/cycle alone: each at half its rate while both move.
        let a = e.issue_at_rate(0.0, Resource::Link(0), 20.0, 4.0, 1.0);
        let b = e.issue_at_rate(0.0, Resource::Link(0), 20.0, 8.0, 1.0);
        let c = e.issue_at_rate(0.0, Resource::Link(1), 20.0, 4.0, 1.0);
        let h = e.issue(0.0, Resource::Hbm, 1000.0);
        // b: 20 bytes at 4 B/cycle from cycle 1 -> 6; a moved 10 by then, 10 more alone at 4 -> 8.5.
        assert_eq!(e.until_any(&[b]), Some((b, 6.0)));
        assert_eq!(e.until_any(&[a]), Some((a, 8.5)));
        assert_eq!(e.until_any(&[c]), Some((c, 6.0)));
        assert_eq!(e.until_any(&[h]), Some((h, 10.0)));
    }
}
