//! The DMA engines: transfers that share a resource's bandwidth fairly (processor sharing:
//! `n` transfers in flight on HBM each move `rate / n` bytes per cycle), each starting
//! `latency` cycles after it is issued.

/// What a transfer occupies.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    /// HBM <-> on-chip memory.
    Hbm,
    /// On-chip memory to on-chip memory.
    Local,
}

#[derive(Clone, Debug)]
pub struct Transfer {
    pub resource: Resource,
    pub bytes: f64,
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

    fn rate(&self, r: Resource) -> f64 {
        match r {
            Resource::Hbm => self.hbm_rate,
            Resource::Local => self.local_rate,
        }
    }

    /// Issue a transfer at core time `at` (never before the engine's own time).
    pub fn issue(&mut self, at: f64, resource: Resource, bytes: f64) -> usize {
        self.advance_to(at);
        let id = self.transfers.len();
        self.transfers.push(Transfer { resource, bytes, remaining: bytes, issued: at, ready: at + self.latency, done: None });
        self.active.push(id);
        id
    }

    fn moving(&self, r: Resource) -> usize {
        self.active.iter().filter(|&&i| self.transfers[i].resource == r && self.transfers[i].ready <= self.t).count()
    }

    /// The next time something changes: a transfer becomes ready or one completes.
    fn next_event(&self) -> Option<f64> {
        let (hbm, local) = (self.moving(Resource::Hbm), self.moving(Resource::Local));
        self.active
            .iter()
            .map(|&i| {
                let x = &self.transfers[i];
                if x.ready > self.t {
                    x.ready
                } else {
                    let n = if x.resource == Resource::Hbm { hbm } else { local };
                    self.t + x.remaining * n as f64 / self.rate(x.resource)
                }
            })
            .min_by(f64::total_cmp)
    }

    /// Move every transfer on to time `to` (no event may lie strictly between).
    fn progress(&mut self, to: f64) {
        let dt = to - self.t;
        let (hbm, local) = (self.moving(Resource::Hbm), self.moving(Resource::Local));
        for &i in &self.active {
            let n = if self.transfers[i].resource == Resource::Hbm { hbm } else { local };
            let rate = self.rate(self.transfers[i].resource);
            let x = &mut self.transfers[i];
            if x.ready <= self.t && dt > 0.0 {
                x.remaining -= dt * rate / n as f64;
            }
            // Done when what is left would take no representable time at `to`.
            if x.ready <= self.t && (x.remaining <= EPS_BYTES * x.bytes.max(1.0) || x.remaining * n as f64 / rate <= 1e-12 * to.max(1.0)) {
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
            if let Some((&id, t)) = ids.iter().filter_map(|i| self.transfers[*i].done.map(|t| (i, t))).min_by(|a, b| a.1.total_cmp(&b.1)) {
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
}
