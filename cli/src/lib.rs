//! What every TENSILE binary (`tensilectl`, `tensile-latency`,
//! `tensile-scheduler`, `tensile-worker`) shares at its edge with a person.
//!
//! * [`outln!`] and [`out!`]: `println!`/`print!` that end the process
//!   quietly, with status 0, when stdout's reader has gone away
//!   (`tensilectl zoo | head -1`), where `println!` panics with "failed
//!   printing to stdout: Broken pipe". Rust ignores SIGPIPE, and these
//!   binaries keep it ignored: they write to Unix sockets (gRPC), where a
//!   default SIGPIPE would kill a server whose client went away. So the
//!   broken pipe is handled where stdout is written, as ripgrep does.
//! * [`parse_mb`]: a memory size in MB (10^6 bytes) as a person types it,
//!   `300` or `1.5`, for every `--*-mb` flag.
//! * [`tls::ClientTlsArgs`]: `--tls-ca`, `--tls-cert`, `--tls-key` (and
//!   their `TENSILE_TLS_*` variables) for every client of a TCP scheduler.

use std::fmt;
use std::io::{self, Write};

pub mod tls;

/// Writes `args` to stdout (locked, so one call's output is not
/// interleaved with another thread's). On a broken pipe the process exits
/// with status 0, as `cat` does when `head` has what it wanted; on any
/// other error it names the error on stderr and exits with status 1.
///
/// What [`outln!`] and [`out!`] call; not meant to be called directly.
#[doc(hidden)]
pub fn write_stdout(args: fmt::Arguments<'_>, newline: bool) {
    let mut out = io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    if let Err(e) = written {
        stdout_failed(&e);
    }
}

/// Flushes stdout, with the same handling of a closed reader as
/// [`outln!`]. For a command that prints a partial line with [`out!`].
pub fn flush_stdout() {
    if let Err(e) = io::stdout().lock().flush() {
        stdout_failed(&e);
    }
}

fn stdout_failed(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        // The reader has gone: nothing more to say, and nothing wrong.
        std::process::exit(0);
    }
    eprintln!("error: writing to stdout: {e}");
    std::process::exit(1);
}

/// Writing stdout failed, for a command that must clean up (stop its
/// children) before it exits: see [`try_out`].
#[derive(Debug)]
pub enum StdoutError {
    /// The reader has gone away (a broken pipe): exit quietly, status 0.
    ReaderGone,
    /// Any other failure to write.
    Io(io::Error),
}

impl StdoutError {
    /// Whether stdout's reader went away, which is no failure.
    pub fn reader_gone(&self) -> bool {
        matches!(self, StdoutError::ReaderGone)
    }
}

impl fmt::Display for StdoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StdoutError::ReaderGone => f.write_str("stdout's reader has gone away"),
            StdoutError::Io(e) => write!(f, "writing to stdout: {e}"),
        }
    }
}

impl std::error::Error for StdoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StdoutError::ReaderGone => None,
            StdoutError::Io(e) => Some(e),
        }
    }
}

/// Writes `text` to stdout and flushes it, returning the failure instead
/// of exiting, for a command that must clean up before it exits: its
/// `main` ends with status 0, quietly, on [`StdoutError::reader_gone`].
pub fn try_out(text: &str) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| {
            if e.kind() == io::ErrorKind::BrokenPipe {
                StdoutError::ReaderGone
            } else {
                StdoutError::Io(e)
            }
        })
}

/// `println!` that exits quietly (status 0) when stdout's reader has gone
/// away; see the crate's documentation.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::write_stdout(::std::format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(::std::format_args!($($arg)*), true)
    };
}

/// `print!` that exits quietly (status 0) when stdout's reader has gone
/// away; see the crate's documentation.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_stdout(::std::format_args!($($arg)*), false)
    };
}

/// Bytes in one MB, the unit of every `--*-mb` flag and of the memory that
/// `tensilectl status` prints.
pub const MB: u64 = 1_000_000;

/// Parses a memory size in MB (10^6 bytes) into bytes: a whole or decimal
/// number, `300`, `1.5`, `0.25`, rounded to the nearest byte. Meant as a
/// clap `value_parser`, which puts the flag's name before the message.
///
/// Rejects, saying why: an empty string, a sign, anything that is not a
/// plain decimal number (`1e3`, `0x10`, `inf`, `300MB`), and sizes past
/// what a `u64` of bytes holds. Zero is accepted here; a flag for which
/// zero means nothing says so itself.
pub fn parse_mb(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("expected a size in MB (e.g. 300 or 1.5), got nothing".into());
    }
    if t.starts_with('-') {
        return Err(format!("{t:?} is negative: a size in MB is 0 or more"));
    }
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
        return Err(format!(
            "{t:?} is not a size in MB: expected a number such as 300 or 1.5 (MB = 10^6 bytes, no unit suffix)"
        ));
    }
    let too_large = || format!("{t:?} MB is more bytes than this program can count");
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    // Six fractional digits are whole bytes; the seventh rounds.
    let mut micro: u64 = 0;
    for (i, b) in frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(7)
        .enumerate()
    {
        let d = u64::from(b - b'0');
        if i < 6 {
            micro = micro * 10 + d;
        } else if d >= 5 {
            micro += 1;
        }
    }
    whole
        .checked_mul(MB)
        .and_then(|b| b.checked_add(micro))
        .ok_or_else(too_large)
}

/// [`parse_mb`] for a flag where zero means nothing (a budget, a base):
/// says so, naming the value.
pub fn parse_positive_mb(s: &str) -> Result<Mb, String> {
    match parse_mb(s)? {
        0 => Err(format!("{:?} is no memory: a size in MB above 0", s.trim())),
        b => Ok(Mb(b)),
    }
}

/// A memory size given in MB (10^6 bytes), held in bytes: the type of
/// every `--*-mb` flag. Parses as [`parse_mb`] does, so clap names the flag
/// and says what is wrong (`--budget-mb 1.5x`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mb(u64);

impl Mb {
    /// Whole MB, saturating at what a `u64` of bytes holds.
    pub const fn whole(mb: u64) -> Mb {
        Mb(mb.saturating_mul(MB))
    }

    /// Exactly `bytes`.
    pub const fn from_bytes(bytes: u64) -> Mb {
        Mb(bytes)
    }

    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl std::str::FromStr for Mb {
    type Err = String;

    fn from_str(s: &str) -> Result<Mb, String> {
        parse_mb(s).map(Mb)
    }
}

impl fmt::Display for Mb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_mb(self.0))
    }
}

/// Bytes as a person reads them next to `--*-mb` flags: MB (10^6 bytes),
/// with as many decimals as the size needs, at most two: `300 MB`,
/// `1.5 MB`, `0.25 MB`.
pub fn format_mb(bytes: u64) -> String {
    let hundredths = (u128::from(bytes) * 100 + u128::from(MB) / 2) / u128::from(MB);
    let (whole, frac) = (hundredths / 100, hundredths % 100);
    match frac {
        0 => format!("{whole} MB"),
        f if f % 10 == 0 => format!("{whole}.{} MB", f / 10),
        f => format!("{whole}.{f:02} MB"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_and_decimal_sizes() {
        assert_eq!(parse_mb("300"), Ok(300_000_000));
        assert_eq!(parse_mb("1.5"), Ok(1_500_000));
        assert_eq!(parse_mb(" 0.25 "), Ok(250_000));
        assert_eq!(parse_mb(".5"), Ok(500_000));
        assert_eq!(parse_mb("2."), Ok(2_000_000));
        assert_eq!(parse_mb("0"), Ok(0));
        // Past a byte: rounded to the nearest.
        assert_eq!(parse_mb("0.0000004"), Ok(0));
        assert_eq!(parse_mb("0.0000005"), Ok(1));
        assert_eq!(parse_mb("1.1234567"), Ok(1_123_457));
    }

    #[test]
    fn what_is_not_a_size_says_why() {
        for (input, says) in [
            ("", "got nothing"),
            ("-1", "is negative"),
            ("-0.5", "is negative"),
            ("abc", "is not a size in MB"),
            ("1.5.2", "is not a size in MB"),
            ("1e3", "is not a size in MB"),
            ("300MB", "no unit suffix"),
            (".", "is not a size in MB"),
            ("+3", "is not a size in MB"),
            ("inf", "is not a size in MB"),
            ("99999999999999999999", "more bytes than"),
            ("18446744073710", "more bytes than"),
        ] {
            let err = parse_mb(input).expect_err(input);
            assert!(err.contains(says), "{input:?}: {err}");
        }
    }

    #[test]
    fn a_flag_of_mb_holds_bytes() {
        assert_eq!("1.5".parse::<Mb>().map(Mb::bytes), Ok(1_500_000));
        assert_eq!(Mb::whole(300).bytes(), 300_000_000);
        assert_eq!(Mb::whole(u64::MAX).bytes(), u64::MAX);
        assert_eq!(Mb::whole(300).to_string(), "300 MB");
    }

    #[test]
    fn sizes_read_back_in_mb() {
        assert_eq!(format_mb(300_000_000), "300 MB");
        assert_eq!(format_mb(1_500_000), "1.5 MB");
        assert_eq!(format_mb(250_000), "0.25 MB");
        assert_eq!(format_mb(1_234_567), "1.23 MB");
        assert_eq!(format_mb(0), "0 MB");
        assert_eq!(format_mb(3_000_000_000), "3000 MB");
        assert_eq!(format_mb(u64::MAX), "18446744073709.55 MB");
    }
}
