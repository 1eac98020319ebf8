//! A ledger of device memory shared by the workers of one device, so that
//! jobs that share one budget hold its sum, not each its own: a directory
//! (under `/dev/shm`, or any the user names) with one slot file per live
//! worker, in which the worker publishes the device bytes it holds (or has
//! claimed) and whether it waits for memory.
//!
//! - A worker creates its slot under a hidden temporary name, takes an
//!   exclusive `flock` on it, writes its first record and only then renames
//!   it into place: a slot that is listed and whose lock can be taken
//!   belongs to a dead worker (the kernel drops a process's locks when it
//!   dies, SIGKILL included), and is ignored and removed. `flock` locks
//!   belong to an open file, not to a process, so workers that are threads
//!   of one process exclude each other too. The directory must be on a
//!   local file system (tmpfs is best): `flock` over NFS is not reliable.
//! - Records are written and read with positioned I/O (`pwrite`/`pread`),
//!   which the kernel does not make atomic against each other: a record is
//!   the value and the value XOR a constant, and a reader retries a record
//!   whose halves disagree (a torn read), then falls back on the last good
//!   value it read there; a file that does not start with the slot header is
//!   not a slot and is never trusted.
//! - A check costs a few `pread`s: the directory listing is cached and read
//!   again every [`REFRESH`], or at once when the `generation` file changed
//!   (every new slot writes a new value there after it is in place).
//! - Growth is claimed before it happens ([`Ledger::claim`]): the worker
//!   publishes the room it may grow into, then reads the others again and
//!   grows only into what is left beside what they published. Of two
//!   workers that claim at once, at least one reads the other's claim
//!   (each writes before it reads), so their sum holds whatever the timing.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the directory is listed again without a new slot announced:
/// what finds slots of workers that died (their bytes count until then,
/// which errs on the safe side) and forgets those that left.
pub const REFRESH: Duration = Duration::from_millis(50);

/// The first bytes of every slot file (format version 1).
const HEADER: [u8; 8] = *b"TNSLDG01";
/// Where the record starts, after the header.
const RECORD_AT: u64 = HEADER.len() as u64;
/// A record: the word, and the word XOR this (torn reads disagree).
const CHECK: u64 = 0x9E37_79B9_7F4A_7C15;
/// Bytes are the word's low 62 bits, the state its high 2.
const BYTES_MASK: u64 = (1 << 62) - 1;
/// The state of a slot whose worker has left (its file goes next).
const GONE: u64 = 3;
/// Reads of a record whose halves disagree before the last good value is
/// used: a torn read lasts as long as one 16-byte copy.
const READ_TRIES: usize = 16;
const SUFFIX: &str = ".slot";
const GENERATION: &str = "generation";

/// What a worker does, as the others see it (for breaking a wait of all
/// for all).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SlotState {
    /// It runs, or waits for its own copies: it will free memory by itself.
    #[default]
    Running,
    /// It waits for the others to free memory before it evicts its own.
    Waiting,
    /// It has evicted all it can and still has no room: only the others
    /// freeing memory lets it go on.
    Stuck,
}

impl SlotState {
    fn bits(self) -> u64 {
        match self {
            SlotState::Running => 0,
            SlotState::Waiting => 1,
            SlotState::Stuck => 2,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("memory ledger: cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LedgerError {
    let path = path.to_path_buf();
    move |source| LedgerError::Io { what, path, source }
}

/// The other live workers of the ledger, as read now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Others {
    /// The bytes they published: held, or claimed to grow into.
    pub bytes: u64,
    /// How many there are.
    pub live: usize,
    /// Of those, how many are running ([`SlotState::Running`]).
    pub running: usize,
    /// How many are stuck ([`SlotState::Stuck`]).
    pub stuck: usize,
    /// How many started after this worker.
    pub younger: usize,
    /// How many of those wait ([`SlotState::Waiting`]).
    pub younger_waiting: usize,
}

/// What [`Ledger::claim`] grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The most bytes this worker may hold until its next claim.
    pub room: u64,
    /// The others, as read after the claim was published.
    pub others: Others,
}

#[derive(Debug)]
struct OtherSlot {
    name: String,
    path: PathBuf,
    file: File,
    /// The last record read whole (the fallback for a torn one).
    last: Option<(u64, SlotState)>,
}

/// This worker's slot in a ledger directory, and its view of the others.
/// Dropping it publishes nothing held and removes the slot.
#[derive(Debug)]
pub struct Ledger {
    dir: PathBuf,
    name: String,
    path: PathBuf,
    file: File,
    generation: File,
    generation_path: PathBuf,
    /// The generation as read before the last listing.
    seen: [u8; 16],
    listed: Instant,
    others: Vec<OtherSlot>,
    published: (u64, SlotState),
}

fn encode_word(word: u64) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&word.to_le_bytes());
    r[8..].copy_from_slice(&(word ^ CHECK).to_le_bytes());
    r
}

fn encode(bytes: u64, state: SlotState) -> [u8; 16] {
    encode_word(bytes.min(BYTES_MASK) | state.bits() << 62)
}

/// What a slot file holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    Record(u64, SlotState),
    /// Its worker has left.
    Gone,
    /// Its record stayed torn over [`READ_TRIES`] reads.
    Torn,
    /// No slot header, or too short: not a slot.
    NotASlot,
}

/// A record, or `None` when its halves disagree (torn, or garbage).
fn decode(r: &[u8; 16]) -> Option<Read> {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&r[..8]);
    b.copy_from_slice(&r[8..]);
    let (word, check) = (u64::from_le_bytes(a), u64::from_le_bytes(b));
    if word ^ CHECK != check {
        return None;
    }
    let bytes = word & BYTES_MASK;
    Some(match word >> 62 {
        0 => Read::Record(bytes, SlotState::Running),
        1 => Read::Record(bytes, SlotState::Waiting),
        2 => Read::Record(bytes, SlotState::Stuck),
        _ => Read::Gone,
    })
}

fn read_slot(file: &File) -> Read {
    let mut buf = [0u8; 24];
    for _ in 0..READ_TRIES {
        if file.read_exact_at(&mut buf, 0).is_err() || buf[..8] != HEADER {
            return Read::NotASlot;
        }
        let mut r = [0u8; 16];
        r.copy_from_slice(&buf[8..]);
        if let Some(read) = decode(&r) {
            return read;
        }
        std::hint::spin_loop();
    }
    Read::Torn
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Ledger {
    /// Joins the ledger in `dir` (created if missing) with a slot holding
    /// nothing. Errors name the path that could not be created, listed or
    /// written.
    pub fn open(dir: &Path) -> Result<Ledger, LedgerError> {
        static OPENED: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(dir).map_err(io_error("create the directory", dir))?;
        let generation_path = dir.join(GENERATION);
        let generation = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&generation_path)
            .map_err(io_error("open", &generation_path))?;
        // Names sort by start: the youngest worker has the greatest.
        let n = OPENED.fetch_add(1, Ordering::Relaxed);
        let stamp = unix_ns();
        let name = format!("{stamp:020}-{}-{n}{SUFFIX}", std::process::id());
        let path = dir.join(&name);
        let temp = dir.join(format!(".{name}.tmp"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(io_error("create the slot", &temp))?;
        let locked = match file.try_lock() {
            Ok(()) => Ok(()),
            Err(TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "a fresh slot is locked by someone else",
            )),
            Err(TryLockError::Error(e)) => Err(e),
        };
        let mut first = [0u8; 24];
        first[..8].copy_from_slice(&HEADER);
        first[8..].copy_from_slice(&encode(0, SlotState::Running));
        let written = locked
            .and_then(|()| file.write_all_at(&first, 0))
            .map_err(io_error("lock and write the slot", &temp))
            .and_then(|()| fs::rename(&temp, &path).map_err(io_error("rename the slot to", &path)));
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
        let mut ledger = Ledger {
            dir: dir.to_path_buf(),
            name,
            path,
            file,
            generation,
            generation_path,
            seen: [0; 16],
            listed: Instant::now(),
            others: Vec::new(),
            published: (0, SlotState::Running),
        };
        // Announce the slot: the others list the directory again at once.
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&stamp.to_le_bytes());
        g[8..].copy_from_slice(&(u64::from(std::process::id()) << 32 | n).to_le_bytes());
        ledger
            .generation
            .write_all_at(&g, 0)
            .map_err(io_error("write", &ledger.generation_path))?;
        ledger.list()?;
        Ok(ledger)
    }

    /// This worker's slot file.
    pub fn slot_path(&self) -> &Path {
        &self.path
    }

    /// Publishes the bytes this worker holds and its state. Only a value
    /// at or under one granted by [`Ledger::claim`] keeps the sum within
    /// the budget; lower values are always safe.
    pub fn publish(&mut self, bytes: u64, state: SlotState) -> Result<(), LedgerError> {
        if self.published == (bytes, state) {
            return Ok(());
        }
        self.file
            .write_all_at(&encode(bytes, state), RECORD_AT)
            .map_err(io_error("write the slot", &self.path))?;
        self.published = (bytes, state);
        Ok(())
    }

    /// Room for this worker under `budget`, which all the ledger's workers
    /// share: what the others leave. To grow, it first publishes the room
    /// it means to take, then reads the others again and keeps only what
    /// their newest values leave, so that two workers claiming at once
    /// never both take the same bytes; the claim stands (the others see it)
    /// until the next [`Ledger::publish`], which should say what the worker
    /// then holds.
    pub fn claim(&mut self, budget: u64, state: SlotState) -> Result<Claim, LedgerError> {
        let before = self.others()?;
        let want = budget.saturating_sub(before.bytes);
        if want <= self.published.0 {
            // No more than what stands published already: the others
            // have read it, or will before they grow.
            return Ok(Claim {
                room: want,
                others: before,
            });
        }
        self.publish(want, state)?;
        // The write above before the reads below, as seen from any CPU.
        fence(Ordering::SeqCst);
        let after = self.others()?;
        Ok(Claim {
            room: want.min(budget.saturating_sub(after.bytes)),
            others: after,
        })
    }

    /// The other live workers now: a few `pread`s, and a listing of the
    /// directory when a slot was announced or [`REFRESH`] has passed.
    pub fn others(&mut self) -> Result<Others, LedgerError> {
        let mut g = [0u8; 16];
        let n = self
            .generation
            .read_at(&mut g, 0)
            .map_err(io_error("read", &self.generation_path))?;
        if n < g.len() {
            // Never written whole yet (a torn read shows as a change).
            g[n..].fill(0);
        }
        if g != self.seen || self.listed.elapsed() >= REFRESH {
            self.seen = g;
            self.list()?;
        }
        let mut o = Others::default();
        for s in &mut self.others {
            let (bytes, state) = match read_slot(&s.file) {
                Read::Record(bytes, state) => {
                    s.last = Some((bytes, state));
                    (bytes, state)
                }
                // Torn every time: the last good value, if any.
                Read::Torn => match s.last {
                    Some(v) => v,
                    None => continue,
                },
                // Left, or not a slot: never trusted.
                Read::Gone | Read::NotASlot => continue,
            };
            let younger = s.name > self.name;
            o.bytes = o.bytes.saturating_add(bytes);
            o.live += 1;
            o.younger += usize::from(younger);
            match state {
                SlotState::Running => o.running += 1,
                SlotState::Waiting => o.younger_waiting += usize::from(younger),
                SlotState::Stuck => o.stuck += 1,
            }
        }
        Ok(o)
    }

    /// Lists the directory: opens new slots, forgets those gone, and
    /// removes those whose worker died (their lock is free).
    fn list(&mut self) -> Result<(), LedgerError> {
        self.listed = Instant::now();
        let entries = fs::read_dir(&self.dir).map_err(io_error("list", &self.dir))?;
        let mut old = std::mem::take(&mut self.others);
        for entry in entries {
            let entry = entry.map_err(io_error("list", &self.dir))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !name.ends_with(SUFFIX) || name.starts_with('.') || name == self.name {
                continue;
            }
            let slot = match old.iter().position(|s| s.name == name) {
                Some(i) => old.swap_remove(i),
                None => {
                    let path = entry.path();
                    let file = match File::open(&path) {
                        Ok(f) => f,
                        // Removed since the listing.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io_error("open the slot", &path)(e)),
                    };
                    OtherSlot {
                        name,
                        path,
                        file,
                        last: None,
                    }
                }
            };
            match slot.file.try_lock_shared() {
                // Its worker is gone: its memory with it. A file that is
                // not a slot is left alone.
                Ok(()) => {
                    let _ = slot.file.unlock();
                    if read_slot(&slot.file) != Read::NotASlot {
                        let _ = fs::remove_file(&slot.path);
                    }
                }
                Err(TryLockError::WouldBlock) => self.others.push(slot),
                Err(TryLockError::Error(e)) => {
                    return Err(io_error("lock the slot", &slot.path)(e));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // Gone (nothing held, not live) for those that read the file
        // before it goes; then the slot goes, and its lock with the file.
        let _ = self.file.write_all_at(&encode_word(GONE << 62), RECORD_AT);
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_ones_are_refused() {
        for (bytes, state) in [
            (0, SlotState::Running),
            (123_456_789, SlotState::Waiting),
            (BYTES_MASK, SlotState::Stuck),
        ] {
            assert_eq!(
                decode(&encode(bytes, state)),
                Some(Read::Record(bytes, state))
            );
        }
        assert_eq!(decode(&encode_word(GONE << 62)), Some(Read::Gone));
        let (old, new) = (
            encode(1 << 20, SlotState::Running),
            encode(5, SlotState::Waiting),
        );
        // A read torn at any byte: old bytes then new ones, or the reverse.
        for cut in 1..16 {
            for (a, b) in [(old, new), (new, old)] {
                let mut torn = a;
                torn[cut..].copy_from_slice(&b[cut..]);
                if let Some(v) = decode(&torn) {
                    assert!(Some(v) == decode(&a) || Some(v) == decode(&b));
                }
            }
        }
        assert_eq!(decode(&[0xAB; 16]), None);
        // Bytes past what a record holds are capped, not wrapped.
        assert_eq!(
            decode(&encode(u64::MAX, SlotState::Running)),
            Some(Read::Record(BYTES_MASK, SlotState::Running))
        );
    }
}
