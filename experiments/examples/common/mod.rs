//! What the examples share: their exit and their positional arguments.

use std::process::ExitCode;

/// Runs `run`, printing its error as `NAME: error` and failing on it.
pub(crate) fn exit(name: &str, run: impl FnOnce() -> Result<(), String>) -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// An example's positional arguments and how to call it.
pub(crate) struct Positional<'a> {
    pub(crate) args: &'a [String],
    pub(crate) usage: &'a str,
}

impl Positional<'_> {
    /// Argument `i` as text (required).
    pub(crate) fn text(&self, i: usize, name: &str) -> Result<&str, String> {
        self.args
            .get(i)
            .map(String::as_str)
            .ok_or_else(|| format!("missing {name}; {}", self.usage))
    }

    /// Argument `i` parsed, `default` when it is absent (`None`: it is
    /// required).
    pub(crate) fn get<T: std::str::FromStr>(
        &self,
        i: usize,
        name: &str,
        default: Option<T>,
    ) -> Result<T, String> {
        match (self.args.get(i), default) {
            (Some(s), _) => s
                .parse()
                .map_err(|_| format!("{name} must be a number, got {s:?}")),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(format!("missing {name}; {}", self.usage)),
        }
    }
}
