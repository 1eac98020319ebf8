//! What the executor knows of one storage: where its bytes are, and which
//! copies of it are in flight. One enum per side instead of sentinel times,
//! so that "allocated, copy not started" and "copy in flight, end unknown"
//! are states, not magic numbers.

use tensile_swap_executor::CopyId;

/// A copy in flight, with its end once the engine knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub(crate) id: CopyId,
    pub(crate) end: Option<u64>,
}

impl InFlight {
    /// Whether the copy has ended by `now`.
    pub(crate) fn done(&self, now: u64) -> bool {
        self.end.is_some_and(|e| e <= now)
    }
}

/// The device side of a storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Device {
    /// No device buffer.
    Absent,
    /// A buffer allocated for a prefetch whose copy waits for its delay in
    /// the Execution Queue.
    Awaiting,
    /// A buffer whose data is arriving.
    Arriving(InFlight),
    /// The data is on the device, since this time.
    Ready { since: u64 },
    /// The prefetch into this buffer failed: its bytes are not the data. It
    /// stays only while a copy still reads it, then goes; an op that needs
    /// the data fetches it again.
    Invalid,
}

/// The host side of a storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    /// No usable host copy.
    None,
    /// A host copy of the current data.
    Valid,
    /// A swap-out in flight. `keep`: a prefetch came while it was in flight,
    /// so the device buffer stays when it ends.
    Writing { copy: InFlight, keep: bool },
    /// A host op is rewriting it (the storage is the host's): current once
    /// that run ends.
    Updating(InFlight),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) device: Device,
    pub(crate) host: Host,
    /// Released by the plan while a copy was in flight: freed once none is.
    pub(crate) release_pending: bool,
    /// Its last swap-out failed: the device buffer holds the only copy of
    /// the data, so a planned release (other than the one after its last
    /// use) leaves it in place.
    pub(crate) out_failed: bool,
}

impl Slot {
    pub(crate) const GONE: Slot = Slot {
        device: Device::Absent,
        host: Host::None,
        release_pending: false,
        out_failed: false,
    };

    /// A device buffer exists (whether or not its data has arrived).
    pub(crate) fn on_device(&self) -> bool {
        self.device != Device::Absent
    }

    /// The data is on the device by `now`.
    pub(crate) fn ready(&self, now: u64) -> bool {
        match self.device {
            Device::Ready { .. } => true,
            Device::Arriving(c) => c.done(now),
            Device::Absent | Device::Awaiting | Device::Invalid => false,
        }
    }

    /// The swap-out in flight, if any.
    pub(crate) fn writing(&self) -> Option<InFlight> {
        match self.host {
            Host::Writing { copy, .. } => Some(copy),
            _ => None,
        }
    }

    pub(crate) fn host_valid(&self) -> bool {
        self.host == Host::Valid
    }

    /// When the device data is (or was) there: `None` while a prefetch
    /// waits for its delay or when there is no buffer.
    pub(crate) fn ready_at(&self) -> Option<Wake> {
        match self.device {
            Device::Ready { since } => Some(Wake::At(since)),
            Device::Arriving(c) => Some(Wake::of(c)),
            Device::Absent | Device::Awaiting | Device::Invalid => None,
        }
    }
}

/// When the executor should look again: at a known time, or when a copy
/// whose end is not known yet completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Wake {
    At(u64),
    /// Sorts after every known time.
    Unknown,
}

impl Wake {
    pub(crate) fn of(copy: InFlight) -> Wake {
        copy.end.map_or(Wake::Unknown, Wake::At)
    }
}
