//! N virtual devices: the same program on every device of a mesh, each on its own thread
//! with its own memory, remote DMAs and semaphore signals delivered between them.
//!
//! The devices take turns (one runs at a time, round robin), handing over at every remote
//! DMA start or signal and at every wait that cannot finish yet, so a run is deterministic
//! and interleaves the communication as finely as the program allows. A remote copy's data
//! leaves at its start and lands in the receiver's buffer (the one at the same program
//! position: every device runs the same program) when the receiver next runs; the region
//! is then pending until the receiver waits on the receive semaphore, so a read or write
//! of it before that wait is a [`ErrorKind::DmaRace`], as on hardware where the bytes may
//! arrive at any moment. When every device that has not finished waits for something no
//! one can send any more, the run stops with a [`ErrorKind::Deadlock`] naming each
//! waiting device's op, kernel line and grid point: it never hangs.
//!
//! The devices run on threads of their own, not on the rayon pool: a device blocked in a
//! wait would hold a pool thread, and with more devices than threads the pool would stall.

use crate::error::{ErrorKind, InterpError, Result};
use crate::value::Data;
use crate::view::View;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// What one device sends another.
pub(crate) enum Delivery {
    /// A remote copy's data for `dst`, counted by semaphore `sem` (buffer, element).
    Dma { dst: View, data: Arc<Data>, sem: (usize, usize), bytes: i64, started: String },
    /// A remote `tpu.sem_signal`.
    Signal { sem: (usize, usize), amount: i64, from: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Status {
    Ready,
    /// Waiting, with what for (op, line, grid point and the semaphore's state).
    Blocked(String),
    /// Finished the kernel (or failed).
    Done,
}

struct State {
    turn: usize,
    status: Vec<Status>,
    inbox: Vec<Vec<Delivery>>,
    /// Deliveries that reached a device after it had finished.
    late: Vec<String>,
    /// Set when no device can make progress: the deadlock report.
    deadlock: Option<String>,
}

/// The devices' shared state: whose turn it is and what is in flight between them.
pub(crate) struct Fabric {
    pub devices: usize,
    state: Mutex<State>,
    turn_changed: Condvar,
}

impl Fabric {
    pub fn new(devices: usize) -> Fabric {
        let state = State {
            turn: 0,
            status: vec![Status::Ready; devices],
            inbox: (0..devices).map(|_| Vec::new()).collect(),
            late: Vec::new(),
            deadlock: None,
        };
        Fabric { devices, state: Mutex::new(state), turn_changed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking device thread poisons the lock; the state is still consistent (every
        // update is a single assignment), and the panic is reported by the join.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for device `me`'s turn; then its deliveries, to apply before it runs on.
    pub fn wait_turn(&self, me: usize) -> Result<Vec<Delivery>> {
        let mut st = self.lock();
        while st.turn != me && st.deadlock.is_none() {
            st = self.turn_changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(report) = &st.deadlock {
            return Err(InterpError::new(ErrorKind::Deadlock, report.clone()));
        }
        st.status[me] = Status::Ready;
        Ok(std::mem::take(&mut st.inbox[me]))
    }

    /// Send `delivery` from `me` to device `to` (checked to be in the mesh).
    pub fn deliver(&self, me: usize, to: i64, delivery: Delivery) -> Result<()> {
        if to < 0 || to as usize >= self.devices {
            return Err(InterpError::new(
                ErrorKind::OutOfBounds,
                format!(
                    "device {me} names device {to}, outside the mesh of {} devices",
                    self.devices
                ),
            ));
        }
        let mut st = self.lock();
        let to = to as usize;
        if st.status[to] == Status::Done {
            let what = match &delivery {
                Delivery::Dma { started, .. } => format!("a remote DMA ({started})"),
                Delivery::Signal { from, .. } => format!("a remote signal ({from})"),
            };
            st.late.push(format!("{what} reached device {to} after it had finished the kernel (its buffers were gone): the sender needs a barrier or a wait for an answer from device {to} before it ends"));
        }
        st.inbox[to].push(delivery);
        Ok(())
    }

    /// Hand the turn on: `me` is ready to go on (`None`), blocked (`Some(why)`), and
    /// (`done`) finished. Returns when it is `me`'s turn again (not when done), with the
    /// deliveries to apply; a deadlock is an error for every blocked device.
    pub fn hand_over(
        &self,
        me: usize,
        blocked: Option<String>,
        done: bool,
    ) -> Result<Vec<Delivery>> {
        {
            let mut st = self.lock();
            st.status[me] = match (done, blocked) {
                (true, _) => Status::Done,
                (false, Some(why)) => Status::Blocked(why),
                (false, None) => Status::Ready,
            };
            let n = self.devices;
            // The next device, round robin (`me` last): ready, or blocked with deliveries
            // that may unblock it.
            let next = (1..=n).map(|k| (me + k) % n).find(|&j| match &st.status[j] {
                Status::Ready => true,
                Status::Blocked(_) => !st.inbox[j].is_empty(),
                Status::Done => false,
            });
            match next {
                Some(j) => st.turn = j,
                None if st.status.iter().all(|s| *s == Status::Done) => {}
                // Already reported: devices leaving after it must not rewrite the report.
                None if st.deadlock.is_some() => {}
                None => {
                    let waits: Vec<String> = st
                        .status
                        .iter()
                        .enumerate()
                        .filter_map(|(d, s)| {
                            if let Status::Blocked(w) = s {
                                Some(format!("device {d} {w}"))
                            } else {
                                None
                            }
                        })
                        .collect();
                    st.deadlock = Some(format!(
                        "every device still running waits for something no device will send any more (on hardware this hangs): {}",
                        waits.join("; ")
                    ));
                }
            }
            self.turn_changed.notify_all();
        }
        if done {
            return Ok(Vec::new());
        }
        self.wait_turn(me)
    }

    /// After every device has finished: deliveries that arrived too late.
    pub fn late_deliveries(&self) -> Vec<String> {
        self.lock().late.clone()
    }
}

/// A device's view of the fabric: which device it is, and its barrier semaphore.
#[derive(Clone)]
pub(crate) struct Link {
    pub fabric: Arc<Fabric>,
    pub me: usize,
    /// The barrier semaphore's buffer (`tpu.sem_barrier`), allocated before the kernel runs.
    pub barrier: usize,
}
