//! Where the scheduler listens by default and how clients reach it: one
//! function both sides call, so that `tensile-scheduler` with no arguments
//! and `tensilectl status` with no `--server` meet.

use std::path::PathBuf;

/// The scheduler's default Unix socket: `$XDG_RUNTIME_DIR/tensile/scheduler.sock`
/// when `XDG_RUNTIME_DIR` is set (and absolute), else
/// `/tmp/tensile-$UID/scheduler.sock`.
pub fn default_socket_path() -> PathBuf {
    default_socket_dir().join("scheduler.sock")
}

/// The directory of [`default_socket_path`] (the scheduler creates it with
/// mode 0700).
pub fn default_socket_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join("tensile"),
        _ => PathBuf::from(format!("/tmp/tensile-{}", current_uid())),
    }
}

/// The real user id of this process, read without `unsafe` as the owner of
/// `/proc/self` (Linux); elsewhere `$USER` stands in.
fn current_uid() -> String {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata("/proc/self") {
            return m.uid().to_string();
        }
    }
    std::env::var("USER").unwrap_or_else(|_| "user".to_string())
}

/// A client's target: `unix:PATH` (or an absolute path) for a Unix socket,
/// `http://HOST:PORT` or `HOST:PORT` for TCP; empty means the default
/// socket. Returns the URI tonic's `Endpoint` takes.
pub fn client_uri(server: Option<&str>) -> String {
    match server.map(str::trim).filter(|s| !s.is_empty()) {
        None => format!("unix://{}", default_socket_path().display()),
        Some(s) if s.starts_with("unix:") => {
            let path = s.trim_start_matches("unix:").trim_start_matches("//");
            format!("unix://{path}")
        }
        Some(s) if s.starts_with('/') => format!("unix://{s}"),
        Some(s) if s.starts_with("http://") || s.starts_with("https://") => s.to_string(),
        Some(s) => format!("http://{s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::client_uri;

    #[test]
    fn client_targets_become_uris() {
        assert_eq!(client_uri(Some("unix:/tmp/x.sock")), "unix:///tmp/x.sock");
        assert_eq!(client_uri(Some("unix:///tmp/x.sock")), "unix:///tmp/x.sock");
        assert_eq!(client_uri(Some("/tmp/x.sock")), "unix:///tmp/x.sock");
        assert_eq!(client_uri(Some("127.0.0.1:5")), "http://127.0.0.1:5");
        assert_eq!(client_uri(Some("http://h:5")), "http://h:5");
        assert!(client_uri(None).starts_with("unix:///"));
        assert!(client_uri(None).ends_with("/scheduler.sock"));
    }
}
