//! Where the session's messages go: the driver's sink (the worker prints
//! them, the Python binding hands them to the `tensile.hook` logger), so
//! the session itself never prints.

use std::fmt;
use std::sync::Arc;

/// How much a message matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The retries of an outage already reported, reports not taken.
    Debug,
    /// Registrations, plans received, the job leaving.
    Info,
    /// What the user should know: the scheduler unreachable or gone, the
    /// job queued or given up, a plan or a report refused.
    Warning,
}

/// What a [`LogSink`] calls with each message.
type Say = dyn Fn(Level, &str) + Send + Sync;

/// A destination for the session's messages; cheap to clone.
#[derive(Clone)]
pub struct LogSink(Arc<Say>);

impl LogSink {
    /// Messages go to `f`, called from whichever thread says them.
    pub fn new(f: impl Fn(Level, &str) + Send + Sync + 'static) -> LogSink {
        LogSink(Arc::new(f))
    }

    /// Says `message` at `level`.
    pub fn say(&self, level: Level, message: &str) {
        (self.0)(level, message);
    }
}

impl fmt::Debug for LogSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LogSink(..)")
    }
}
